//! Does a rule's match accept this packet? Evaluated three-valued: matches
//! kdrop cannot evaluate from the packet's headers and interface (ipsets,
//! rate limits, conntrack details, ...) answer `Maybe`, never a guess.
use std::net::IpAddr;

use crate::model::netfilter::{CtState, Dir, Match, Snapshot, PROTO_TCP};

/// The dropped packet, as far as rule matching needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    /// TCP flags byte (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10, ...).
    pub tcp_flags: u8,
    pub mark: u32,
    /// The interface it came in on (or left by, for locally sent packets
    /// past routing); `None` when the kernel gave none.
    pub iif: Option<String>,
    /// The bridge `iif` is a port of: with br_netfilter, iptables sees the
    /// bridge as the input device (`brnf_get_logical_dev()` in
    /// br_nf_forward_ip(), net/bridge/br_netfilter_hooks.c, Linux 6.18).
    pub iif_master: Option<String>,
    /// The interface it leaves by, when known (locally sent, past routing).
    pub oif: Option<String>,
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;

/// Three-valued truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tri {
    Yes,
    No,
    Maybe,
}

impl Tri {
    pub fn from_bool(b: bool) -> Self {
        if b {
            Tri::Yes
        } else {
            Tri::No
        }
    }

    pub fn and(self, o: Tri) -> Tri {
        match (self, o) {
            (Tri::No, _) | (_, Tri::No) => Tri::No,
            (Tri::Yes, Tri::Yes) => Tri::Yes,
            _ => Tri::Maybe,
        }
    }

    pub fn negate_if(self, neg: bool) -> Tri {
        match (self, neg) {
            (t, false) | (t @ Tri::Maybe, true) => t,
            (Tri::Yes, true) => Tri::No,
            (Tri::No, true) => Tri::Yes,
        }
    }
}

impl Match {
    pub fn eval(&self, p: &Packet) -> Tri {
        match self {
            Match::Proto { neg, proto } => Tri::from_bool(*proto == PROTO_TCP).negate_if(*neg),
            Match::L3 { v6 } => Tri::from_bool(p.src.is_ipv6() == *v6),
            Match::Addr { dir, neg, net, len } => {
                addr_eval(*dir, *neg, p, |a| in_prefix(a, *net, *len))
            }
            Match::AddrRange { dir, neg, lo, hi } => {
                addr_eval(*dir, *neg, p, |a| in_range(a, *lo, *hi))
            }
            Match::AddrSet { dir, neg, nets } => addr_eval(*dir, *neg, p, |a| {
                let fits: Vec<bool> = nets
                    .iter()
                    .filter_map(|(n, l)| in_prefix(a, *n, *l))
                    .collect();
                (!fits.is_empty() || nets.is_empty()).then(|| fits.contains(&true))
            }),
            Match::Port {
                dir,
                neg,
                proto,
                ranges,
            } => port_eval(p, *dir, *neg, *proto, ranges),
            Match::Iface { input, neg, name } => iface_eval(p, *input, *neg, name),
            Match::TcpFlags {
                neg,
                mask,
                value,
                any,
            } => {
                let f = p.tcp_flags & mask;
                let r = if *any { f != 0 } else { f == *value };
                Tri::from_bool(r).negate_if(*neg)
            }
            Match::CtState { neg, states } => ct_eval(p.tcp_flags, states).negate_if(*neg),
            Match::Mark { neg, value, mask } => {
                Tri::from_bool(p.mark & mask == *value).negate_if(*neg)
            }
            Match::Unknown(_) => Tri::Maybe,
        }
    }
}

/// A TCP port match. One of another protocol fails whatever `!` says:
/// iptables and nftables both require the protocol first.
fn port_eval(p: &Packet, dir: Dir, neg: bool, proto: u8, ranges: &[(u16, u16)]) -> Tri {
    if proto != PROTO_TCP {
        return Tri::No;
    }
    let hit = |port: u16| ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&port));
    let r = match dir {
        Dir::Src => hit(p.sport),
        Dir::Dst => hit(p.dport),
        Dir::Either => hit(p.sport) || hit(p.dport),
    };
    Tri::from_bool(r).negate_if(neg)
}

/// An interface match: the input one also fits the bridge `iif` is a port
/// of; where a forwarded packet leaves is not known here.
fn iface_eval(p: &Packet, input: bool, neg: bool, name: &str) -> Tri {
    if !input {
        return match &p.oif {
            None => Tri::Maybe,
            Some(oif) => Tri::from_bool(iface_matches(name, oif)).negate_if(neg),
        };
    }
    match &p.iif {
        None => Tri::Maybe,
        Some(iif) => {
            let hit = iface_matches(name, iif)
                || p.iif_master
                    .as_deref()
                    .is_some_and(|m| iface_matches(name, m));
            Tri::from_bool(hit).negate_if(neg)
        }
    }
}

/// All of `matches`.
pub fn eval_all(matches: &[Match], p: &Packet) -> Tri {
    matches.iter().fold(Tri::Yes, |acc, m| acc.and(m.eval(p)))
}

fn addr_eval(dir: Dir, neg: bool, p: &Packet, f: impl Fn(IpAddr) -> Option<bool>) -> Tri {
    let a = match dir {
        Dir::Src => p.src,
        Dir::Dst => p.dst,
        Dir::Either => return Tri::Maybe,
    };
    match f(a) {
        Some(b) => Tri::from_bool(b).negate_if(neg),
        // An IPv4 match never sees an IPv6 packet and vice versa, negated
        // or not (nftables: `ip saddr != x` implies `meta nfproto ipv4`).
        None => Tri::No,
    }
}

/// `None` when the families differ.
pub fn in_prefix(a: IpAddr, net: IpAddr, len: u8) -> Option<bool> {
    match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let len = u32::from(len.min(32));
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            Some(u32::from(a) & mask == u32::from(n) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let len = u32::from(len.min(128));
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            Some(u128::from(a) & mask == u128::from(n) & mask)
        }
        _ => None,
    }
}

fn in_range(a: IpAddr, lo: IpAddr, hi: IpAddr) -> Option<bool> {
    match (a, lo, hi) {
        (IpAddr::V4(a), IpAddr::V4(l), IpAddr::V4(h)) => Some(l <= a && a <= h),
        (IpAddr::V6(a), IpAddr::V6(l), IpAddr::V6(h)) => Some(l <= a && a <= h),
        _ => None,
    }
}

/// `eth+` (iptables) and `eth*` (nftables) match every name starting `eth`.
pub fn iface_matches(pattern: &str, name: &str) -> bool {
    match pattern
        .strip_suffix('+')
        .or_else(|| pattern.strip_suffix('*'))
    {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Conntrack states a handshake packet can be in, from its flags alone. A
/// SYN opens a connection: NEW (or INVALID, or UNTRACKED after NOTRACK), never
/// ESTABLISHED or RELATED: the kernel keeps a connection NEW until it has
/// seen a reply (`IPS_SEEN_REPLY`, nf_conntrack_core.c, Linux 6.18). A
/// SYN-ACK is the reply: ESTABLISHED, or INVALID without a SYN before it
/// (tcp_new() refuses to open a connection on one, nf_conntrack_proto_tcp.c,
/// Linux 6.18).
fn possible_states(flags: u8) -> Option<&'static [CtState]> {
    use CtState::*;
    match flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) {
        TCP_SYN => Some(&[New, Invalid, Untracked]),
        f if f == TCP_SYN | TCP_ACK => Some(&[Established, Invalid, Untracked]),
        _ => None,
    }
}

fn ct_eval(flags: u8, states: &[CtState]) -> Tri {
    if states.contains(&CtState::Nat) {
        return Tri::Maybe;
    }
    let Some(possible) = possible_states(flags) else {
        return Tri::Maybe;
    };
    let hits = possible.iter().filter(|s| states.contains(s)).count();
    match hits {
        0 => Tri::No,
        n if n == possible.len() => Tri::Yes,
        _ => Tri::Maybe,
    }
}

/// Whether any rule of `s` looks at a packet's source port (`--sport`,
/// multiport `--ports`, `tcp sport`): if none does, packets that differ
/// only in it are attributed alike (see `matching`, where `Dir::Src` and
/// `Dir::Either` are the only readers of `sport`).
pub fn reads_source_port(s: &Snapshot) -> bool {
    s.tables
        .iter()
        .flat_map(|t| &t.chains)
        .flat_map(|c| &c.rules)
        .flat_map(|r| &r.matches)
        .any(|m| {
            matches!(
                m,
                Match::Port {
                    dir: Dir::Src | Dir::Either,
                    ..
                }
            )
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn syn(src: &str, sport: u16, dst: &str, dport: u16) -> Packet {
        Packet {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sport,
            dport,
            tcp_flags: TCP_SYN,
            mark: 0,
            iif: Some("eth0".into()),
            iif_master: None,
            oif: None,
        }
    }

    fn port(dir: Dir, neg: bool, ranges: &[(u16, u16)]) -> Match {
        Match::Port {
            dir,
            neg,
            proto: PROTO_TCP,
            ranges: ranges.to_vec(),
        }
    }

    /// A port match of UDP fails even negated; an input interface match
    /// fits the bridge the packet came in through; an output one is not
    /// known for a forwarded packet.
    #[test]
    fn ports_and_interfaces_in_their_own_steps() {
        let mut p = syn("10.0.0.1", 40000, "10.0.0.2", 80);
        assert_eq!(port_eval(&p, Dir::Dst, true, 17, &[(1, 2)]), Tri::No);
        assert_eq!(
            port_eval(&p, Dir::Either, false, PROTO_TCP, &[(80, 80)]),
            Tri::Yes
        );
        p.iif_master = Some("br0".into());
        assert_eq!(iface_eval(&p, true, false, "br0"), Tri::Yes);
        assert_eq!(iface_eval(&p, false, false, "br0"), Tri::Maybe);
    }

    #[test]
    fn tri_logic() {
        use Tri::*;
        assert_eq!(Yes.and(Yes), Yes);
        assert_eq!(Yes.and(Maybe), Maybe);
        assert_eq!(Maybe.and(No), No);
        assert_eq!(Yes.negate_if(true), No);
        assert_eq!(No.negate_if(true), Yes);
        assert_eq!(Maybe.negate_if(true), Maybe);
        assert_eq!(Yes.negate_if(false), Yes);
    }

    #[test]
    fn ports_and_protocols() {
        let p = syn("10.0.0.1", 40000, "10.0.0.2", 80);
        assert_eq!(port(Dir::Dst, false, &[(80, 80)]).eval(&p), Tri::Yes);
        assert_eq!(port(Dir::Dst, true, &[(80, 80)]).eval(&p), Tri::No);
        assert_eq!(port(Dir::Dst, false, &[(81, 90)]).eval(&p), Tri::No);
        assert_eq!(port(Dir::Src, false, &[(1024, 65535)]).eval(&p), Tri::Yes);
        assert_eq!(
            port(Dir::Either, false, &[(22, 22), (80, 80)]).eval(&p),
            Tri::Yes
        );
        let udp = Match::Port {
            dir: Dir::Dst,
            neg: true,
            proto: 17,
            ranges: vec![(53, 53)],
        };
        assert_eq!(udp.eval(&p), Tri::No);
        assert_eq!(
            Match::Proto {
                neg: false,
                proto: 6
            }
            .eval(&p),
            Tri::Yes
        );
        assert_eq!(
            Match::Proto {
                neg: true,
                proto: 17
            }
            .eval(&p),
            Tri::Yes
        );
        assert_eq!(
            Match::Proto {
                neg: false,
                proto: 17
            }
            .eval(&p),
            Tri::No
        );
    }

    #[test]
    fn addresses() {
        let p = syn("10.1.2.3", 1, "fd00::1", 2);
        let p4 = syn("10.1.2.3", 1, "10.9.9.9", 2);
        let a = |dir, neg, net: &str, len| Match::Addr {
            dir,
            neg,
            net: net.parse().unwrap(),
            len,
        };
        assert_eq!(a(Dir::Src, false, "10.0.0.0", 8).eval(&p4), Tri::Yes);
        assert_eq!(a(Dir::Src, true, "10.0.0.0", 8).eval(&p4), Tri::No);
        assert_eq!(a(Dir::Src, false, "10.1.2.4", 32).eval(&p4), Tri::No);
        assert_eq!(a(Dir::Dst, false, "0.0.0.0", 0).eval(&p4), Tri::Yes);
        // Family mismatch never matches, negated or not.
        assert_eq!(a(Dir::Dst, false, "10.0.0.0", 8).eval(&p), Tri::No);
        assert_eq!(a(Dir::Dst, true, "10.0.0.0", 8).eval(&p), Tri::No);
        let p6 = syn("fd00:1::7", 1, "fd00:1::2", 2);
        assert_eq!(a(Dir::Dst, false, "fd00:1::", 64).eval(&p6), Tri::Yes);
        assert_eq!(a(Dir::Dst, false, "fd00:2::", 64).eval(&p6), Tri::No);
        let r = Match::AddrRange {
            dir: Dir::Src,
            neg: false,
            lo: "10.1.2.0".parse().unwrap(),
            hi: "10.1.2.9".parse().unwrap(),
        };
        assert_eq!(r.eval(&p4), Tri::Yes);
        let s = Match::AddrSet {
            dir: Dir::Dst,
            neg: false,
            nets: vec![
                ("10.9.9.8".parse().unwrap(), 32),
                ("10.9.0.0".parse().unwrap(), 16),
            ],
        };
        assert_eq!(s.eval(&p4), Tri::Yes);
        assert_eq!(Match::L3 { v6: false }.eval(&p4), Tri::Yes);
        assert_eq!(Match::L3 { v6: true }.eval(&p4), Tri::No);
    }

    /// `-m iprange --src-range lo-hi` and nft `ip saddr lo-hi` are
    /// inclusive at both ends.
    #[test]
    fn address_ranges_hold_their_ends_and_nothing_outside() {
        let r = |lo: &str, hi: &str| Match::AddrRange {
            dir: Dir::Src,
            neg: false,
            lo: lo.parse().unwrap(),
            hi: hi.parse().unwrap(),
        };
        let from = |src: &str| syn(src, 40000, "10.0.0.2", 80);
        let v4 = r("10.1.2.0", "10.1.2.9");
        assert_eq!(v4.eval(&from("10.1.2.0")), Tri::Yes);
        assert_eq!(v4.eval(&from("10.1.2.9")), Tri::Yes);
        assert_eq!(v4.eval(&from("10.1.1.255")), Tri::No);
        assert_eq!(v4.eval(&from("10.1.2.10")), Tri::No);
        let v6 = r("fd00::10", "fd00::1f");
        let from6 = |src: &str| syn(src, 40000, "fd00::2", 80);
        assert_eq!(v6.eval(&from6("fd00::10")), Tri::Yes);
        assert_eq!(v6.eval(&from6("fd00::1f")), Tri::Yes);
        assert_eq!(v6.eval(&from6("fd00::f")), Tri::No);
        assert_eq!(v6.eval(&from6("fd00::20")), Tri::No);
        // An IPv4 range never matches an IPv6 packet.
        assert_eq!(v4.eval(&from6("fd00::10")), Tri::No);
    }

    #[test]
    fn interfaces() {
        let mut p = syn("10.0.0.1", 1, "10.0.0.2", 2);
        let i = |name: &str, neg| Match::Iface {
            input: true,
            neg,
            name: name.into(),
        };
        assert_eq!(i("eth0", false).eval(&p), Tri::Yes);
        assert_eq!(i("eth+", false).eval(&p), Tri::Yes);
        assert_eq!(i("eth*", false).eval(&p), Tri::Yes);
        assert_eq!(i("eth1", false).eval(&p), Tri::No);
        assert_eq!(i("eth1", true).eval(&p), Tri::Yes);
        let o = Match::Iface {
            input: false,
            neg: false,
            name: "eth0".into(),
        };
        assert_eq!(o.eval(&p), Tri::Maybe);
        p.oif = Some("eth0".into());
        assert_eq!(o.eval(&p), Tri::Yes);
        p.iif = Some("veth1".into());
        p.iif_master = Some("br0".into());
        assert_eq!(i("br0", false).eval(&p), Tri::Yes);
        assert_eq!(i("docker0", false).eval(&p), Tri::No);
        p.iif = None;
        assert_eq!(i("eth0", false).eval(&p), Tri::Maybe);
    }

    #[test]
    fn flags_marks_and_states() {
        let mut p = syn("10.0.0.1", 1, "10.0.0.2", 2);
        let syn_only = Match::TcpFlags {
            neg: false,
            mask: TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK,
            value: TCP_SYN,
            any: false,
        };
        assert_eq!(syn_only.eval(&p), Tri::Yes);
        let ct = |states: &[CtState], neg| Match::CtState {
            neg,
            states: states.to_vec(),
        };
        use CtState::*;
        assert_eq!(ct(&[Established, Related], false).eval(&p), Tri::No);
        assert_eq!(ct(&[Established, Related], true).eval(&p), Tri::Yes);
        assert_eq!(ct(&[Invalid], false).eval(&p), Tri::Maybe);
        assert_eq!(ct(&[New, Invalid, Untracked], false).eval(&p), Tri::Yes);
        assert_eq!(ct(&[Nat], false).eval(&p), Tri::Maybe);
        p.tcp_flags = TCP_SYN | TCP_ACK;
        assert_eq!(syn_only.eval(&p), Tri::No);
        assert_eq!(ct(&[New], false).eval(&p), Tri::No);
        assert_eq!(ct(&[Established, Related], false).eval(&p), Tri::Maybe);
        // SYN with FIN or RST is no opening SYN: tcp_error() refuses the
        // combination (nf_conntrack_proto_tcp.c, v6.18), and kdrop, which
        // models only SYN and SYN-ACK, leaves conntrack matches undecided.
        for odd in [TCP_SYN | TCP_FIN, TCP_SYN | TCP_RST] {
            p.tcp_flags = odd;
            assert_eq!(ct(&[Established, Related], false).eval(&p), Tri::Maybe);
        }
        p.tcp_flags = TCP_ACK;
        assert_eq!(ct(&[Established], false).eval(&p), Tri::Maybe);
        // A lone ACK may even open a connection: nf_conntrack_tcp_loose
        // (default 1) picks up connections mid-stream as NEW
        // (net/netfilter/nf_conntrack_proto_tcp.c, v6.18).
        assert_eq!(
            ct(&[Established, Invalid, Untracked], false).eval(&p),
            Tri::Maybe
        );
        let any_rst = Match::TcpFlags {
            neg: false,
            mask: TCP_RST | TCP_FIN,
            value: 0,
            any: true,
        };
        assert_eq!(any_rst.eval(&p), Tri::No);
        p.mark = 0x4010;
        let m = |value, mask| Match::Mark {
            neg: false,
            value,
            mask,
        };
        assert_eq!(m(0x4000, 0x4000).eval(&p), Tri::Yes);
        assert_eq!(m(0x4010, u32::MAX).eval(&p), Tri::Yes);
        assert_eq!(m(0x1, u32::MAX).eval(&p), Tri::No);
        assert_eq!(Match::Unknown("-m set".into()).eval(&p), Tri::Maybe);
    }

    #[test]
    fn all_of_them() {
        let p = syn("10.0.0.1", 1, "10.0.0.2", 80);
        let yes = port(Dir::Dst, false, &[(80, 80)]);
        let no = port(Dir::Dst, false, &[(81, 81)]);
        let maybe = Match::Unknown("x".into());
        assert_eq!(eval_all(&[], &p), Tri::Yes);
        assert_eq!(eval_all(&[yes.clone(), maybe.clone()], &p), Tri::Maybe);
        assert_eq!(eval_all(&[maybe, no], &p), Tri::No);
        assert_eq!(eval_all(&[yes], &p), Tri::Yes);
    }
}
