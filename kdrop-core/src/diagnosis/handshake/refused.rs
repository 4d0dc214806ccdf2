//! A SYN-ACK the client refused (no socket waits for it, so it answers with
//! a RST): the reply of a DNAT'd handshake that reached the client with
//! the wrong source. Three ways it happens, told apart by what the node
//! shows:
//! - hairpin (incident 2): the namespace that DNAT'd the SYN bridges the
//!   reply straight back to the client, past netfilter;
//! - LB loopback (incident 4): the client waits for a VIP, but its SYN came
//!   back into this node as client -> NodePort and was DNAT'd again without
//!   SNAT, so the reply is un-NAT'd at most to the NodePort;
//! - asymmetric return (incident 5): the DNAT'd SYN left the namespace that
//!   translated it, and the reply went to the client another way.
use crate::model::cause::Cause;
use std::net::{IpAddr, SocketAddr};

use super::{
    findings::{asymmetric, clear_entry, ct_text, host_prefix, iptables_for, show_entry},
    loopback::{lb_loopback, Loopback},
    tracker::{CtBits, Flow},
};
use crate::diagnosis::fix_kinds::Kind;
use crate::model::{
    finding::Finding,
    packet::{Ct, Tuple},
    routing::{Link, Tables},
};

/// Bridge facts for the hairpin case, read from the namespace that did the
/// DNAT.
#[derive(Clone, Debug, Default)]
pub struct BridgeFacts {
    pub br_netfilter_loaded: bool,
    /// net.bridge.bridge-nf-call-iptables in that namespace (None: absent).
    pub call_iptables: Option<u32>,
    /// net.bridge.bridge-nf-call-ip6tables there: IPv6's own switch
    /// (br_netfilter_hooks.c, brnf_call_ip6tables).
    pub call_ip6tables: Option<u32>,
}

impl BridgeFacts {
    /// The switch that decides for a packet of `a`'s family.
    pub fn call_for(&self, a: IpAddr) -> Option<u32> {
        if a.is_ipv4() {
            self.call_iptables
        } else {
            self.call_ip6tables
        }
    }

    /// br_netfilter must be loaded before its switch for `a`'s family
    /// exists to be set.
    pub fn needs_module(&self, a: IpAddr) -> bool {
        !self.br_netfilter_loaded && self.call_for(a).is_none()
    }
}

/// A namespace holding a DNAT'd entry of the handshake, with what the
/// findings need of it.
#[derive(Clone, Debug)]
pub struct Translator<'a> {
    /// The handshake as that namespace tracked it (`ct` is set: DNAT'd).
    pub flow: Flow,
    pub status: Vec<String>,
    pub tables: &'a Tables,
    pub bridge: BridgeFacts,
    /// `ip netns exec <name> ` (empty: kdrop's own namespace).
    pub exec: String,
    /// The namespace as text (name or inode).
    pub netns: String,
    /// The device its DNAT'd SYN left by (or would, by its routes).
    pub dev: String,
}

/// What kdrop found around one refused SYN-ACK.
#[derive(Clone, Debug)]
pub struct Refused<'a> {
    /// The SYN-ACK (server -> client).
    pub syn_ack: Tuple,
    /// The refusal (the drop, or the RST that answered it), as evidence.
    pub kernel: String,
    /// The address the client's SYN-SENT socket waits for, when the client
    /// is on this node (sock_diag).
    pub waits_for: Option<SocketAddr>,
    /// The DNAT'd entry whose reply side is this SYN-ACK.
    pub dnat: Option<Translator<'a>>,
    /// A DNAT'd entry whose original side is the client's end -> the
    /// SYN-ACK's source: the client's SYN came back into that namespace.
    pub back: Option<Translator<'a>>,
    /// `back`'s namespace's own entry for the client's SYN to the address it
    /// waits for (it forwarded that SYN out), and the device it left by; when
    /// the client's socket is out of reach, the entry of the same client end
    /// to another address, unanswered and not NAT'd.
    pub back_stale: Option<(Tuple, Option<String>)>,
}

fn dnat_only(ct: &Ct, bits: &CtBits) -> bool {
    ct.status & bits.dst_nat != 0 && ct.status & bits.src_nat == 0
}

/// The refused SYN-ACK explained, or None when nothing the node shows
/// explains it.
pub fn explain(r: &Refused, bits: &CtBits) -> Option<Finding> {
    // What the client sent to: its socket says, else the entry `back`'s
    // namespace keeps of the SYN it forwarded, else the DNAT'd entry.
    let vip = r
        .waits_for
        .or(r.back_stale.as_ref().map(|(t, _)| t.dst))
        .or_else(|| r.dnat.as_ref().and_then(|d| d.flow.ct).map(|c| c.orig.dst));
    if let (Some(back), Some(vip)) = (&r.back, vip) {
        let ct = back.flow.ct?;
        if ct.orig.dst != vip && dnat_only(&ct, bits) {
            return Some(loopback(r, back, &ct, vip));
        }
    }
    let d = r.dnat.as_ref()?;
    let ct = d.flow.ct?;
    if let Some((how, bridge)) = hairpin_bridge(d, &ct) {
        let summary = format!(
            "hairpin: the SYN-ACK from {} matches the reply side of a DNAT'd connection ({} -> \
             {} => {}) but arrived un-NAT'd: both ends are on bridge {bridge}",
            r.syn_ack.src, ct.orig.src, ct.orig.dst, ct.reply.src,
        );
        return Some(hairpin(d, &ct, (&how, &bridge), summary, r.kernel.clone()));
    }
    dnat_only(&ct, bits).then(|| {
        asymmetric(
            &ct,
            &d.dev,
            vec![
                r.kernel.clone(),
                format!(
                    "conntrack in netns {}: {}",
                    d.netns,
                    ct_text(&ct, &d.status)
                ),
                format!(
                    "{} -> {} reached {} without passing back through netns {}, whose entry \
                     would have turned it into {} -> {}",
                    r.syn_ack.src,
                    r.syn_ack.dst,
                    ct.orig.src.ip(),
                    d.netns,
                    ct.orig.dst,
                    ct.orig.src
                ),
            ],
            &d.exec,
        )
    })
}

fn loopback(r: &Refused, back: &Translator, ct: &Ct, vip: SocketAddr) -> Finding {
    let mut seen = vec![r.kernel.clone()];
    if let Some(w) = r.waits_for {
        seen.push(format!(
            "the client's socket {} waits in SYN-SENT for {w}, not for {}",
            ct.orig.src, r.syn_ack.src
        ));
    }
    if let Some(d) = r
        .dnat
        .as_ref()
        .filter(|d| d.flow.ct.is_some_and(|c| c.orig.dst == vip))
    {
        seen.push(format!(
            "the load balancer (netns {}) DNAT'd it: {}",
            d.netns,
            ct_text(&d.flow.ct.expect("filtered"), &d.status)
        ));
    }
    let (stale, out_dev) = match &r.back_stale {
        Some((t, dev)) => {
            seen.push(format!(
                "netns {} forwarded {} -> {} out{}: its conntrack holds that entry",
                back.netns,
                t.src,
                t.dst,
                dev.as_ref().map(|d| format!(" of {d}")).unwrap_or_default()
            ));
            (Some(*t), dev.clone())
        }
        None => (None, None),
    };
    seen.push(format!(
        "the same client address and port came back into netns {}: conntrack {}, sent out {}",
        back.netns,
        ct_text(ct, &back.status),
        back.dev
    ));
    lb_loopback(
        &Loopback {
            client: ct.orig.src,
            vip,
            came_back_as: ct.orig.dst,
            backend: ct.reply.src,
            out_dev,
            seen,
            stale,
        },
        &back.exec,
    )
}

/// The bridge that carries the reply straight back to the client in the
/// DNAT's namespace, and how kdrop knows: both ends on its subnet, the
/// DNAT'd SYN seen leaving by one of its ports or the backend on its subnet.
fn hairpin_bridge(d: &Translator, ct: &Ct) -> Option<(String, String)> {
    let t = d.tables;
    let (client, backend) = (ct.orig.src.ip(), ct.reply.src.ip());
    let on_subnet = |b: &Link, ip: IpAddr| {
        t.addrs
            .iter()
            .any(|a| a.index == b.index && same_subnet(a.addr, ip, a.prefix_len))
    };
    let is_bridge = |l: &&Link| l.kind.as_deref() == Some("bridge");
    let port = t.link(d.flow.ifindex);
    let (how, br) = match port.and_then(|p| t.link(p.master?)).filter(is_bridge) {
        Some(b) => (
            format!("left by {}, a port of bridge {}", port?.name, b.name),
            b,
        ),
        None => {
            let b = t
                .links
                .iter()
                .filter(is_bridge)
                .find(|b| on_subnet(b, backend))?;
            (
                format!("went to {backend}, on bridge {}'s subnet", b.name),
                b,
            )
        }
    };
    on_subnet(br, client).then(|| (how, br.name.clone()))
}

/// A DNAT'd handshake that died unanswered (`sent`: its transmissions)
/// where the reply is bridged straight back to the client: both ends on
/// one bridge of the DNAT's namespace, whose bridged packets skip
/// netfilter there. The hairpin seen from its silence: the SYN-ACK and the
/// client's RST crossed the bridge before kdrop armed the points that show
/// them (a client that gave up before it retransmitted, the node traced
/// alone), so an entry never replied is all that is left of it.
pub fn silent_hairpin(d: &Translator, bits: &CtBits, sent: String) -> Option<Finding> {
    let ct = d.flow.ct.filter(|c| dnat_only(c, bits))?;
    // With the switch on, a bridged reply is un-DNAT'd and replies the
    // entry: the silence is something else.
    if d.bridge.call_for(ct.orig.src.ip()).is_some_and(|v| v != 0) {
        return None;
    }
    let (how, bridge) = hairpin_bridge(d, &ct)?;
    let summary = format!(
        "hairpin: SYN {} -> {} was DNAT'd to {} and no reply came back through netfilter: both \
         ends are on bridge {bridge}, which hands the reply straight back un-NAT'd",
        ct.orig.src, ct.orig.dst, ct.reply.src,
    );
    Some(hairpin(d, &ct, (&how, &bridge), summary, sent))
}

/// Hairpin: the DNAT'd SYN and its reply cross one bridge of the DNAT's
/// namespace, and bridged packets skip netfilter there. `seen`: what showed
/// it (the first evidence).
fn hairpin(
    d: &Translator,
    ct: &Ct,
    (how, br): (&str, &str),
    summary: String,
    seen: String,
) -> Finding {
    let (client, backend) = (ct.orig.src, ct.reply.src);
    let dnat_ns = &d.exec;
    let mut fix = Vec::new();
    if d.bridge.needs_module(client.ip()) {
        fix.push(Kind::ModprobeBrNetfilter.fix("modprobe br_netfilter".to_string()));
    }
    fix.push(Kind::BridgeNfCall.fix(format!(
        "{dnat_ns}sysctl -w net.bridge.bridge-nf-call-{}=1",
        call_sysctl(client.ip())
    )));
    Finding {
        cause: Cause::HairpinNoReverseNat,
        summary,
        evidence: hairpin_evidence(seen, d, ct, how, br),
        fix,
        fix_or: vec![vec![
            Kind::HairpinMasquerade.fix(format!(
                "{dnat_ns}{} -t nat -A POSTROUTING -s {} -d {}/{} -p tcp --dport {} -j MASQUERADE",
                iptables_for(backend.ip()),
                client.ip(),
                backend.ip(),
                host_prefix(backend.ip()),
                backend.port()
            )),
            Kind::ConntrackDeleteEntry.fix(clear_entry(dnat_ns, &ct.orig)),
        ]],
        fix_notes: vec![
            format!(
                "with bridge-nf-call-{}=1 the SYN-ACK crosses netfilter on the bridge and is \
                 un-DNAT'd; every bridged packet then passes it",
                call_sysctl(client.ip())
            ),
            format!(
                "with the masquerade, {} answers the node, which un-NATs the reply; the entry \
                 made before it has no SNAT, so retries from the same port fail until it is \
                 deleted",
                backend.ip()
            ),
        ],
        inspect: vec![
            format!(
                "{dnat_ns}sysctl net.bridge.bridge-nf-call-{}",
                call_sysctl(client.ip())
            ),
            show_entry(dnat_ns, &ct.orig),
        ],
    }
}

/// What showed it (the refusal, or the transmissions left unanswered), the
/// entry, the bridge the reply crosses and the switches
/// that let it skip netfilter.
fn hairpin_evidence(seen: String, d: &Translator, ct: &Ct, how: &str, br: &str) -> Vec<String> {
    let (client, bridge) = (ct.orig.src, &d.bridge);
    vec![
        seen,
        format!("conntrack: {}", ct_text(ct, &d.status)),
        format!(
            "the DNAT'd SYN {how}; {} is on {br}'s subnet too: the reply is bridged straight \
             back, never routed",
            client.ip()
        ),
        format!(
            "br_netfilter {}; net.bridge.bridge-nf-call-{} = {}: bridged packets skip \
             netfilter, so the reply is not un-DNAT'd",
            if bridge.br_netfilter_loaded {
                "loaded"
            } else {
                "not loaded"
            },
            call_sysctl(client.ip()),
            bridge
                .call_for(client.ip())
                .map_or("absent".to_string(), |v| v.to_string())
        ),
    ]
}

/// The br_netfilter switch of an address's family.
fn call_sysctl(a: IpAddr) -> &'static str {
    if a.is_ipv4() {
        "iptables"
    } else {
        "ip6tables"
    }
}

pub(super) fn same_subnet(a: IpAddr, b: IpAddr, len: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let len = u32::from(len.min(32));
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let len = u32::from(len.min(128));
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::handshake::tests::{tables, tuple, BITS};

    /// br_netfilter is to load only when nothing of it is there: neither
    /// the module nor the family's switch.
    #[test]
    fn the_module_is_needed_only_without_its_switch() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let mut b = BridgeFacts::default();
        assert!(b.needs_module(v4));
        b.call_iptables = Some(0);
        assert!(!b.needs_module(v4));
        assert!(b.needs_module("fd00::1".parse().unwrap()));
        b.br_netfilter_loaded = true;
        assert!(!b.needs_module("fd00::1".parse().unwrap()));
    }

    fn flow(netns: u32, ifindex: u32, ct: Ct) -> Flow {
        Flow {
            orig: ct.orig,
            ct: Some(ct),
            first_ns: 0,
            last_ns: 0,
            syns: 1,
            first_unseen: false,
            from_entry: false,
            isn: 0,
            gave_up: None,
            answered: false,
            reported: false,
            netns,
            ifindex,
            due_ns: 0,
            crossed: Default::default(),
            wire: Tuple {
                src: ct.orig.src,
                dst: ct.reply.src,
            },
        }
    }

    fn ct(orig: (&str, &str), reply: (&str, &str), status: u32) -> Ct {
        Ct {
            orig: tuple(orig.0, orig.1),
            reply: tuple(reply.0, reply.1),
            status,
            mark: 0,
            zone: 0,
            ctinfo: 2,
        }
    }

    fn translator<'a>(t: &'a Tables, ns: &str, f: Flow) -> Translator<'a> {
        Translator {
            flow: f,
            status: vec!["DST_NAT".into()],
            tables: t,
            bridge: BridgeFacts::default(),
            exec: format!("ip netns exec {ns} "),
            netns: ns.into(),
            dev: "eth0".into(),
        }
    }

    /// Incident 5 from the client: the SYN-ACK comes straight from the
    /// backend; the namespace that DNAT'd it has no bridge to both ends.
    #[test]
    fn a_reply_that_bypassed_the_dnat_without_a_bridge_is_asymmetric() {
        let no_bridge = Tables::default();
        let c = ct(
            ("172.16.0.50:45005", "10.0.58.158:80"),
            ("10.0.0.13:8080", "172.16.0.50:45005"),
            BITS.dst_nat,
        );
        let r = Refused {
            syn_ack: tuple("10.0.0.13:8080", "172.16.0.50:45005"),
            kernel: "kernel: NO_SOCKET".into(),
            waits_for: Some("10.0.58.158:80".parse().unwrap()),
            dnat: Some(translator(&no_bridge, "nodeb", flow(9, 0, c))),
            back: None,
            back_stale: None,
        };
        let f = explain(&r, &BITS).unwrap();
        assert_eq!(f.cause, "asymmetric_return_path");
        assert_eq!(
            f.fix,
            [
                "ip netns exec nodeb iptables -t nat -A POSTROUTING -d 10.0.0.13/32 -p tcp --dport 8080 -j MASQUERADE",
                "ip netns exec nodeb conntrack -D -p tcp --orig-src 172.16.0.50 --orig-port-src 45005 --orig-dst 10.0.58.158 --orig-port-dst 80",
            ]
        );
        assert!(f.evidence[2].contains("without passing back through netns nodeb"));
        // With SNAT too, nothing the node shows explains it.
        let mut snat = r.clone();
        snat.dnat.as_mut().unwrap().flow.ct.as_mut().unwrap().status |= BITS.src_nat;
        assert_eq!(explain(&snat, &BITS), None);
    }

    /// Incident 2 over IPv6: the bridge's IPv6 subnet holds both ends, and
    /// the switch that counts is bridge-nf-call-ip6tables (here 0 while the
    /// IPv4 one is 1); the commands are IPv6's.
    #[test]
    fn a_v6_hairpin_names_the_ip6tables_switch() {
        let mut t = tables();
        t.addrs.push(crate::model::routing::Addr {
            index: 5,
            addr: "fd00:245:1::1".parse().unwrap(),
            prefix_len: 64,
            label: None,
        });
        let c = ct(
            ("[fd00:245:1::5]:43801", "[fd00:96::133]:80"),
            ("[fd00:245:1::9]:8080", "[fd00:245:1::5]:43801"),
            BITS.dst_nat,
        );
        let mut d = translator(&t, "node", flow(7, 6, c));
        d.bridge = BridgeFacts {
            br_netfilter_loaded: true,
            call_iptables: Some(1),
            call_ip6tables: Some(0),
        };
        let r = Refused {
            syn_ack: tuple("[fd00:245:1::9]:8080", "[fd00:245:1::5]:43801"),
            kernel: "k".into(),
            waits_for: Some("[fd00:96::133]:80".parse().unwrap()),
            dnat: Some(d),
            back: None,
            back_stale: None,
        };
        let f = explain(&r, &BITS).unwrap();
        assert_eq!(f.cause, "hairpin_no_reverse_nat");
        assert!(f.evidence[3].starts_with(
            "br_netfilter loaded; net.bridge.bridge-nf-call-ip6tables = 0: bridged packets skip"
        ));
        assert_eq!(
            f.fix,
            ["ip netns exec node sysctl -w net.bridge.bridge-nf-call-ip6tables=1"]
        );
        assert_eq!(
            f.fix_or[0],
            [
                "ip netns exec node ip6tables -t nat -A POSTROUTING -s fd00:245:1::5 -d fd00:245:1::9/128 -p tcp --dport 8080 -j MASQUERADE",
                "ip netns exec node conntrack -D -f ipv6 -p tcp --orig-src fd00:245:1::5 --orig-port-src 43801 --orig-dst fd00:96::133 --orig-port-dst 80",
            ]
        );
        // Without br_netfilter (neither switch), the module is loaded first.
        let mut bare = r.clone();
        bare.dnat.as_mut().unwrap().bridge = BridgeFacts::default();
        assert_eq!(
            explain(&bare, &BITS).unwrap().fix[0],
            "modprobe br_netfilter"
        );
    }

    /// Incident 2 traced on the node alone, the client giving up at 1 s:
    /// the SYN-ACK and the client's RST crossed cni0 before kdrop armed
    /// what shows them, and the DNAT'd entry died unreplied. Before this it
    /// was called an asymmetric return path, with a masquerade of the
    /// backend for its fix.
    #[test]
    fn a_dnat_entry_never_replied_across_one_bridge_is_a_silent_hairpin() {
        let t = tables();
        let c = ct(
            ("10.244.1.5:43705", "100.67.30.133:80"),
            ("10.244.1.9:8080", "10.244.1.5:43705"),
            BITS.dst_nat,
        );
        let mut d = translator(&t, "node", flow(7, 6, c));
        d.bridge = BridgeFacts {
            br_netfilter_loaded: true,
            call_iptables: Some(0),
            call_ip6tables: Some(0),
        };
        let sent = "1 transmission of the SYN, not answered".to_string();
        let f = silent_hairpin(&d, &BITS, sent.clone()).unwrap();
        assert_eq!(f.cause, "hairpin_no_reverse_nat");
        assert_eq!(
            f.summary,
            "hairpin: SYN 10.244.1.5:43705 -> 100.67.30.133:80 was DNAT'd to 10.244.1.9:8080 \
             and no reply came back through netfilter: both ends are on bridge cni0, which \
             hands the reply straight back un-NAT'd"
        );
        assert_eq!(f.evidence[0], sent);
        assert!(f.evidence[2].contains("a port of bridge cni0; 10.244.1.5 is on cni0's subnet too"));
        assert!(f.evidence[3].starts_with(
            "br_netfilter loaded; net.bridge.bridge-nf-call-iptables = 0: bridged packets skip"
        ));
        assert_eq!(
            f.fix,
            ["ip netns exec node sysctl -w net.bridge.bridge-nf-call-iptables=1"]
        );
        // The switch on: a bridged reply would have replied the entry.
        let mut on = d.clone();
        on.bridge.call_iptables = Some(1);
        assert_eq!(silent_hairpin(&on, &BITS, sent.clone()), None);
        // Without br_netfilter (no switch), bridged packets skip it too.
        let mut bare = d.clone();
        bare.bridge = BridgeFacts::default();
        let f = silent_hairpin(&bare, &BITS, sent.clone()).unwrap();
        assert_eq!(f.fix[0], "modprobe br_netfilter");
        // SNAT'd too: the reply comes back to this namespace.
        let mut snat = d.clone();
        snat.flow.ct.as_mut().unwrap().status |= BITS.src_nat;
        assert_eq!(silent_hairpin(&snat, &BITS, sent.clone()), None);
        // A client off the bridge: not a hairpin.
        let off = ct(
            ("192.0.2.7:40000", "100.67.30.133:80"),
            ("10.244.1.9:8080", "192.0.2.7:40000"),
            BITS.dst_nat,
        );
        let mut d = translator(&t, "node", flow(7, 6, off));
        d.bridge.br_netfilter_loaded = true;
        assert_eq!(silent_hairpin(&d, &BITS, sent), None);
    }

    /// A bridge in the DNAT's namespace is not enough: the client must be
    /// on it for the reply to be bridged back.
    #[test]
    fn a_client_off_the_bridge_is_no_hairpin() {
        let t = tables();
        let c = ct(
            ("192.0.2.7:40000", "100.67.30.133:80"),
            ("10.244.1.9:8080", "192.0.2.7:40000"),
            BITS.dst_nat,
        );
        let r = Refused {
            syn_ack: tuple("10.244.1.9:8080", "192.0.2.7:40000"),
            kernel: "k".into(),
            waits_for: None,
            dnat: Some(translator(&t, "node", flow(7, 6, c))),
            back: None,
            back_stale: None,
        };
        assert_eq!(explain(&r, &BITS).unwrap().cause, "asymmetric_return_path");
    }

    /// Incident 4: the client waits for the VIP; its SYN came back into
    /// the node as client -> NodePort and was DNAT'd to a local pod. The
    /// load balancer's entry (a namespace here) DNAT'd VIP -> NodePort.
    #[test]
    fn a_client_waiting_for_another_address_looped_back_through_the_lb() {
        let t = tables();
        let lb_tables = Tables::default();
        let lb = ct(
            ("10.244.2.5:46004", "203.0.113.80:80"),
            ("10.70.0.10:30080", "10.244.2.5:46004"),
            BITS.dst_nat,
        );
        let node = ct(
            ("10.244.2.5:46004", "10.70.0.10:30080"),
            ("10.244.2.9:8080", "10.244.2.5:46004"),
            BITS.dst_nat,
        );
        let to_vip = tuple("10.244.2.5:46004", "203.0.113.80:80");
        let mut back = translator(&t, "node", flow(7, 6, node));
        back.dev = "veth9".into();
        let r = Refused {
            syn_ack: tuple("10.70.0.10:30080", "10.244.2.5:46004"),
            kernel: "kernel: NO_SOCKET in netns pod-a".into(),
            waits_for: Some("203.0.113.80:80".parse().unwrap()),
            dnat: Some(translator(&lb_tables, "lb", flow(3, 0, lb))),
            back: Some(back),
            back_stale: Some((to_vip, Some("eth0".into()))),
        };
        let f = explain(&r, &BITS).unwrap();
        assert_eq!(f.cause, "lb_loopback_without_snat");
        assert_eq!(
            f.summary,
            "SYN 10.244.2.5:46004 -> 203.0.113.80:80 left by eth0 to the load balancer, came \
             back as 10.244.2.5:46004 -> 10.70.0.10:30080 and was DNAT'd to 10.244.2.9:8080 \
             without SNAT: the reply goes straight to 10.244.2.5 and bypasses the load balancer"
        );
        // In the node's namespace, not the client's or the load balancer's.
        assert_eq!(
            f.fix,
            [
                "ip netns exec node iptables -t nat -I PREROUTING -s 10.244.2.5/32 -d 203.0.113.80/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.2.9:8080",
                "ip netns exec node conntrack -D -p tcp --orig-src 10.244.2.5 --orig-port-src 46004 --orig-dst 203.0.113.80 --orig-port-dst 80",
            ]
        );
        assert!(f.evidence[1].contains("waits in SYN-SENT for 203.0.113.80:80"));
        assert!(f.evidence[2].starts_with("the load balancer (netns lb) DNAT'd it"));
        // The node alone (the load balancer elsewhere, its entry unseen):
        // the same verdict from the client's socket.
        let node_only = Refused {
            dnat: None,
            back_stale: None,
            ..r.clone()
        };
        let f = explain(&node_only, &BITS).unwrap();
        assert_eq!(f.cause, "lb_loopback_without_snat");
        assert_eq!(
            f.fix.len(),
            1,
            "no entry of the node to delete: {:?}",
            f.fix
        );
        // The node alone, the client's socket out of reach (closed by a
        // 1 s connect timeout): the node's own unanswered entry of the same
        // client end to the VIP tells where it sent it; the DNAT'd entry
        // seen from the SYN-ACK is the one it came back as.
        let node = back_of(&r);
        let socket_gone = Refused {
            waits_for: None,
            dnat: Some(node),
            ..r.clone()
        };
        let f = explain(&socket_gone, &BITS).unwrap();
        assert_eq!(f.cause, "lb_loopback_without_snat");
        assert!(f
            .summary
            .starts_with("SYN 10.244.2.5:46004 -> 203.0.113.80:80 left by eth0"));
        assert_eq!(f.fix.len(), 2, "{:?}", f.fix);
        assert!(
            f.evidence[1].starts_with("netns node forwarded 10.244.2.5:46004 -> 203.0.113.80:80"),
            "{:?}",
            f.evidence
        );
        // Without that entry nothing says the client sent elsewhere.
        let unknown = Refused {
            back_stale: None,
            ..socket_gone
        };
        assert_ne!(
            explain(&unknown, &BITS).map(|f| f.cause.id()),
            Some("lb_loopback_without_snat")
        );
        // The client waits for the address the node DNAT'd: no loop.
        let same = Refused {
            waits_for: Some("10.70.0.10:30080".parse().unwrap()),
            dnat: None,
            ..r
        };
        assert_eq!(explain(&same, &BITS), None);
    }

    fn back_of<'a>(r: &Refused<'a>) -> Translator<'a> {
        r.back.clone().expect("a translator")
    }

    #[test]
    fn subnets_of_both_families() {
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(same_subnet(a("10.1.2.3"), a("10.1.2.200"), 24));
        assert!(!same_subnet(a("10.1.2.3"), a("10.1.3.3"), 24));
        assert!(same_subnet(a("fd00:1::1"), a("fd00:1::ff"), 64));
        assert!(!same_subnet(a("fd00:1::1"), a("fd00:2::1"), 64));
        assert!(!same_subnet(a("10.1.2.3"), a("fd00:1::1"), 0));
    }

    /// br_netfilter loaded but the switch absent in the DNAT's namespace
    /// (before Linux 5.3 the bridge-nf sysctls live in the initial one
    /// only): loading the module again would change nothing.
    #[test]
    fn a_loaded_br_netfilter_is_not_loaded_again() {
        let t = tables();
        let c = ct(
            ("10.244.1.5:43534", "100.67.30.133:80"),
            ("10.244.1.9:8080", "10.244.1.5:43534"),
            BITS.dst_nat,
        );
        let mut d = translator(&t, "node", flow(7, 6, c));
        d.bridge = BridgeFacts {
            br_netfilter_loaded: true,
            call_iptables: None,
            call_ip6tables: Some(1),
        };
        let r = Refused {
            syn_ack: tuple("10.244.1.9:8080", "10.244.1.5:43534"),
            kernel: "k".into(),
            waits_for: None,
            dnat: Some(d),
            back: None,
            back_stale: None,
        };
        let f = explain(&r, &BITS).unwrap();
        assert_eq!(
            f.evidence[3],
            "br_netfilter loaded; net.bridge.bridge-nf-call-iptables = absent: bridged packets \
             skip netfilter, so the reply is not un-DNAT'd"
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node sysctl -w net.bridge.bridge-nf-call-iptables=1"]
        );
    }

    /// An entry that translated nothing (CONFIRMED only) explains no
    /// refused SYN-ACK: neither as the DNAT of the handshake nor as the
    /// client's SYN coming back in.
    #[test]
    fn an_entry_without_dnat_explains_nothing() {
        let no_bridge = Tables::default();
        let plain = ct(
            ("172.16.0.50:45005", "10.0.0.13:8080"),
            ("10.0.0.13:8080", "172.16.0.50:45005"),
            8,
        );
        let r = Refused {
            syn_ack: tuple("10.0.0.13:8080", "172.16.0.50:45005"),
            kernel: "k".into(),
            waits_for: Some("10.0.58.158:80".parse().unwrap()),
            dnat: Some(translator(&no_bridge, "nodeb", flow(9, 0, plain))),
            back: None,
            back_stale: None,
        };
        assert_eq!(explain(&r, &BITS), None);
        let back = Refused {
            dnat: None,
            back: Some(translator(&no_bridge, "nodeb", flow(9, 0, plain))),
            ..r
        };
        assert_eq!(explain(&back, &BITS), None);
    }
}
