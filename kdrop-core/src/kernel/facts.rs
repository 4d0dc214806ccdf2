//! What kdrop needs to know about the running kernel, all of it read from the
//! kernel itself at load time: struct member offsets and the `kfree_skb`
//! tracepoint's shape from BTF, drop reason names from `enum skb_drop_reason`,
//! record offsets from the tracepoint's format file.
use std::collections::HashMap;

use anyhow::{bail, Context as _, Result};
use kdrop_common::{FibLookupArgs, KfreeSkbArgs, Offsets, RetransArgs, ABSENT};

use super::btf::{Btf, Kind};

/// Resolves `struct.path` to a byte offset and checks the member's size, so a
/// kernel that changed a member's type is refused instead of misread.
pub fn offset(btf: &Btf, strukt: &str, path: &str, size: u32) -> Result<u32> {
    let id = btf
        .find(strukt, Kind::Struct)
        .with_context(|| format!("kernel BTF has no struct {strukt}"))?;
    let m = btf
        .member(id, path)
        .with_context(|| format!("kernel BTF has no member {strukt}.{path}"))?;
    let got = btf.size_of(m.type_id).unwrap_or(0);
    if got != size {
        bail!("{strukt}.{path} is {got} bytes in this kernel, kdrop reads {size}");
    }
    m.byte_offset()
        .with_context(|| format!("{strukt}.{path} cannot be read"))
}

pub fn offsets(btf: &Btf) -> Result<Offsets> {
    // Members of struct sk_buff, net_device, sock and net as of
    // https://github.com/torvalds/linux/blob/v6.18/include/linux/skbuff.h#L883
    // (sk_buff), include/linux/netdevice.h (net_device), include/net/sock.h
    // (sock_common.skc_net), include/net/net_namespace.h (net.ns).
    Ok(Offsets {
        skb_head: offset(btf, "sk_buff", "head", 8)?,
        skb_network_header: offset(btf, "sk_buff", "network_header", 2)?,
        skb_protocol: offset(btf, "sk_buff", "protocol", 2)?,
        skb_dev: offset(btf, "sk_buff", "dev", 8)?,
        skb_sk: offset(btf, "sk_buff", "sk", 8)?,
        skb_iif: offset(btf, "sk_buff", "skb_iif", 4)?,
        skb_mark: offset(btf, "sk_buff", "mark", 4)?,
        dev_ifindex: offset(btf, "net_device", "ifindex", 4)?,
        dev_net: offset(btf, "net_device", "nd_net.net", 8)?,
        sk_net: offset(btf, "sock", "__sk_common.skc_net.net", 8)?,
        net_inum: offset(btf, "net", "ns.inum", 4)?,
        // Route lookup evidence is optional: a kernel that lays these out
        // differently loses the evidence, not the drops.
        fl4_oif: optional(btf, "flowi4", "__fl_common.flowic_oif", 4),
        fl4_iif: optional(btf, "flowi4", "__fl_common.flowic_iif", 4),
        fl4_mark: optional(btf, "flowi4", "__fl_common.flowic_mark", 4),
        fl4_saddr: optional(btf, "flowi4", "saddr", 4),
        fl4_daddr: optional(btf, "flowi4", "daddr", 4),
        nhc_dev: optional(btf, "fib_nh_common", "nhc_dev", 8),
        // A union of __be32 and in6_addr: 16 bytes, IPv4 first.
        nhc_gw: optional(btf, "fib_nh_common", "nhc_gw", 16),
        nhc_gw_family: optional(btf, "fib_nh_common", "nhc_gw_family", 1),
        nhc_scope: optional(btf, "fib_nh_common", "nhc_scope", 1),
        skb_nfct: optional(btf, "sk_buff", "_nfct", 8),
        // The Ethernet header's place, for the drop's source MAC (the
        // neighbour that sent it): without it drops carry none.
        skb_mac_header: optional(btf, "sk_buff", "mac_header", 2),
        // A socket's ends, for the retransmission tracepoints, which pass
        // sockets, not packets (include/net/sock.h, include/net/request_sock.h).
        sk_common: embedded(btf, "sock", "__sk_common", "sock_common"),
        req_common: embedded(btf, "request_sock", "__req_common", "sock_common"),
        skc_daddr: optional(btf, "sock_common", "skc_daddr", 4),
        skc_rcv_saddr: optional(btf, "sock_common", "skc_rcv_saddr", 4),
        skc_dport: optional(btf, "sock_common", "skc_dport", 2),
        skc_num: optional(btf, "sock_common", "skc_num", 2),
        skc_family: optional(btf, "sock_common", "skc_family", 2),
        skc_state: optional(btf, "sock_common", "skc_state", 1),
        skc_v6_daddr: optional(btf, "sock_common", "skc_v6_daddr", 16),
        skc_v6_rcv_saddr: optional(btf, "sock_common", "skc_v6_rcv_saddr", 16),
        skc_net: optional(btf, "sock_common", "skc_net.net", 8),
        // The handshake's ISN and how a connect() ended (include/linux/tcp.h,
        // include/net/inet_connection_sock.h, include/net/sock.h, v6.18):
        // without them events lose the ISN (0: unknown) or the errno.
        tcp_snd_una: optional(btf, "tcp_sock", "snd_una", 4),
        req_rcv_isn: optional(btf, "tcp_request_sock", "rcv_isn", 4),
        icsk_retransmits: optional(btf, "inet_connection_sock", "icsk_retransmits", 1),
        sk_err: optional(btf, "sock", "sk_err", 4),
        // Conntrack members are filled by `conntrack_offsets` (nf_conn may
        // live in module BTF).
        ..Offsets::zeroed()
    })
}

/// Offsets of `struct nf_conn` and its tuples (include/net/netfilter/
/// nf_conntrack.h and nf_conntrack_tuple.h as of v6.18), from vmlinux BTF when
/// conntrack is built in, else from the nf_conntrack module's split BTF. All
/// or nothing: a partial layout would misread tuples.
pub fn conntrack_offsets(o: &mut Offsets, btf: &Btf) -> Result<()> {
    let set = |o: &mut Offsets, btf: &Btf| -> Result<()> {
        let th = btf
            .find("nf_conntrack_tuple_hash", Kind::Struct)
            .context("no struct nf_conntrack_tuple_hash")?;
        o.ct_tuple = offset(
            btf,
            "nf_conn",
            "tuplehash",
            2 * btf.size_of(th).unwrap_or(0),
        )? + offset(btf, "nf_conntrack_tuple_hash", "tuple", 40)?;
        o.ct_tuplehash_size = btf.size_of(th).context("sizeof nf_conntrack_tuple_hash")?;
        o.tuple_src_addr = offset(btf, "nf_conntrack_tuple", "src.u3", 16)?;
        o.tuple_src_port = offset(btf, "nf_conntrack_tuple", "src.u.all", 2)?;
        o.tuple_dst_addr = offset(btf, "nf_conntrack_tuple", "dst.u3", 16)?;
        o.tuple_dst_port = offset(btf, "nf_conntrack_tuple", "dst.u.all", 2)?;
        o.tuple_protonum = offset(btf, "nf_conntrack_tuple", "dst.protonum", 1)?;
        o.ct_status = offset(btf, "nf_conn", "status", 8)?;
        o.ct_mark = offset(btf, "nf_conn", "mark", 4).unwrap_or(ABSENT);
        o.ct_zone = offset(btf, "nf_conn", "zone.id", 2).unwrap_or(ABSENT);
        Ok(())
    };
    let mut tmp = *o;
    let result = set(&mut tmp, btf);
    if result.is_ok() {
        *o = tmp;
    }
    result
}

/// Names of `enum ip_conntrack_status` bits (`IPS_SEEN_REPLY_BIT` → bit 1,
/// "SEEN_REPLY") and of `enum ip_conntrack_info` values, from BTF.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CtNames {
    pub status_bits: Vec<(u32, String)>,
}

impl CtNames {
    pub fn from_btf(btf: &Btf) -> Self {
        let mut n = CtNames::default();
        if let Some(id) = btf.find("ip_conntrack_status", Kind::Enum) {
            for (name, v) in btf.enum_values(id) {
                if let Some(short) = name
                    .strip_prefix("IPS_")
                    .and_then(|s| s.strip_suffix("_BIT"))
                {
                    n.status_bits.push((v as u32, short.to_string()));
                }
            }
        }
        n
    }

    /// The status bit for `name` (`"DST_NAT"`), if the kernel has it.
    pub fn bit(&self, name: &str) -> Option<u32> {
        self.status_bits
            .iter()
            .find(|(_, n)| n == name)
            .map(|(b, _)| 1u32 << b)
    }

    pub fn status(&self, status: u32) -> Vec<String> {
        self.status_bits
            .iter()
            .filter(|(b, _)| *b < 32 && status & (1 << b) != 0)
            .map(|(_, n)| n.clone())
            .collect()
    }
}

/// `net:net_dev_queue` passes `(struct sk_buff *skb)`:
/// https://github.com/torvalds/linux/blob/v6.18/include/trace/events/net.h#L89
pub fn net_dev_queue_args(btf: &Btf) -> Result<()> {
    let id = btf
        .find("btf_trace_net_dev_queue", Kind::Typedef)
        .context("kernel BTF has no btf_trace_net_dev_queue")?;
    let params = btf
        .params(id)
        .context("btf_trace_net_dev_queue is not a function")?;
    let names: Vec<String> = params.iter().skip(1).map(|&p| btf.type_name(p)).collect();
    if names.first().map(String::as_str) != Some("struct sk_buff *") {
        bail!(
            "net_dev_queue passes ({}), not the skb first",
            names.join(", ")
        );
    }
    Ok(())
}

/// `TP_PROTO` argument types of tracepoint `tp` (from its `btf_trace_<tp>`
/// typedef, past the context pointer).
fn tp_params(btf: &Btf, tp: &str) -> Result<Vec<String>> {
    let name = format!("btf_trace_{tp}");
    let id = btf
        .find(&name, Kind::Typedef)
        .with_context(|| format!("kernel BTF has no {name} (no {tp} tracepoint?)"))?;
    let params = btf
        .params(id)
        .with_context(|| format!("{name} is not a function"))?;
    Ok(params.iter().skip(1).map(|&p| btf.type_name(p)).collect())
}

/// Position of the first argument of type `want` (ignoring `const`).
fn position(names: &[String], want: &str) -> Option<u32> {
    names
        .iter()
        .position(|n| n.trim_start_matches("const ") == want)
        .map(|i| i as u32)
        .filter(|&i| i <= 4)
}

/// What the socket tracepoints can be used with.
pub struct SocketPoints {
    pub args: RetransArgs,
    pub retrans_skb: Result<(), String>,
    pub retrans_synack: Result<(), String>,
    pub set_state: Result<(), String>,
}

/// Where the socket tracepoints pass the socket (and request):
/// `tcp_retransmit_skb(sk, skb[, err])`, `tcp_retransmit_synack(sk, req)`
/// as of v6.18 (include/trace/events/tcp.h), `inet_sock_set_state(sk,
/// oldstate, newstate)` (include/trace/events/sock.h, v4.16+); each `Err`
/// says why that tracepoint cannot be used.
pub fn socket_points(btf: &Btf, o: &Offsets) -> SocketPoints {
    let mut a = RetransArgs::zeroed();
    let socks = [
        o.sk_common,
        o.skc_daddr,
        o.skc_num,
        o.skc_dport,
        o.skc_family,
        o.skc_net,
    ];
    let layout = if socks.contains(&ABSENT) {
        Err("struct sock_common is laid out differently (see debug log)".to_string())
    } else {
        Ok(())
    };
    let skb = layout.clone().and_then(|()| {
        let names = tp_params(btf, "tcp_retransmit_skb").map_err(|e| format!("{e:#}"))?;
        a.skb_sk = position(&names, "struct sock *")
            .ok_or_else(|| format!("tcp_retransmit_skb passes no sock: ({})", names.join(", ")))?;
        if o.skc_state == ABSENT {
            return Err("sock_common.skc_state is laid out differently".into());
        }
        Ok(())
    });
    let synack = layout.clone().and_then(|()| {
        let names = tp_params(btf, "tcp_retransmit_synack").map_err(|e| format!("{e:#}"))?;
        a.synack_sk = position(&names, "struct sock *").unwrap_or(ABSENT);
        a.synack_req = position(&names, "struct request_sock *").ok_or_else(|| {
            format!(
                "tcp_retransmit_synack passes no request_sock: ({})",
                names.join(", ")
            )
        })?;
        if o.req_common == ABSENT {
            return Err("request_sock.__req_common is laid out differently".into());
        }
        Ok(())
    });
    let set_state = layout.and_then(|()| {
        let names = tp_params(btf, "inet_sock_set_state").map_err(|e| format!("{e:#}"))?;
        let (sk, old, new) = state_positions(&names).ok_or_else(|| {
            format!(
                "inet_sock_set_state does not pass (sock, oldstate, newstate): ({})",
                names.join(", ")
            )
        })?;
        // The programs read them at these constant positions (main.rs).
        if (sk, old, new) != (0, 1, 2) {
            return Err(format!(
                "inet_sock_set_state passes ({}): kdrop reads (sock, oldstate, newstate)",
                names.join(", ")
            ));
        }
        (a.state_sk, a.state_old, a.state_new) = (sk, old, new);
        Ok(())
    });
    SocketPoints {
        args: a,
        retrans_skb: skb,
        retrans_synack: synack,
        set_state,
    }
}

/// `inet_sock_set_state`'s socket and the two `int` states after it, old
/// first (`TP_PROTO(const struct sock *sk, const int oldstate, const int
/// newstate)`, unchanged since v4.16).
fn state_positions(names: &[String]) -> Option<(u32, u32, u32)> {
    let sk = position(names, "struct sock *")?;
    let mut ints = names
        .iter()
        .enumerate()
        .skip(sk as usize + 1)
        .filter(|(_, n)| n.trim_start_matches("const ") == "int")
        .map(|(i, _)| i as u32)
        .filter(|&i| i <= 4);
    Some((sk, ints.next()?, ints.next()?))
}

/// The offset of `strukt.path` when it is a `struct inner` (checked by
/// size: the member must be exactly the kernel's `struct inner`).
fn embedded(btf: &Btf, strukt: &str, path: &str, inner: &str) -> u32 {
    match btf.find(inner, Kind::Struct).and_then(|id| btf.size_of(id)) {
        Some(size) => optional(btf, strukt, path, size),
        None => ABSENT,
    }
}

fn optional(btf: &Btf, strukt: &str, path: &str, size: u32) -> u32 {
    offset(btf, strukt, path, size).unwrap_or_else(|e| {
        log::debug!("{e:#}");
        ABSENT
    })
}

/// Drop reason names from the running kernel's `enum skb_drop_reason`.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Reasons {
    names: HashMap<u32, String>,
    subsystems: HashMap<u32, String>,
    consumed: Option<u32>,
}

const SUBSYS_SHIFT: u32 = 16;

impl Reasons {
    pub fn from_btf(btf: &Btf) -> Self {
        let mut r = Reasons::default();
        if let Some(id) = btf.find("skb_drop_reason", Kind::Enum) {
            for (name, v) in btf.enum_values(id) {
                let short = name
                    .strip_prefix("SKB_DROP_REASON_")
                    .or_else(|| name.strip_prefix("SKB_"))
                    .unwrap_or(name);
                if name == "SKB_CONSUMED" {
                    r.consumed = Some(v as u32);
                }
                if short != "MAX" {
                    r.names.insert(v as u32, short.to_string());
                }
            }
        }
        // Reasons owned by a subsystem carry its id in the high bits
        // (https://github.com/torvalds/linux/blob/v6.18/include/net/dropreason.h).
        if let Some(id) = btf.find("skb_drop_reason_subsys", Kind::Enum) {
            for (name, v) in btf.enum_values(id) {
                let short = name.strip_prefix("SKB_DROP_REASON_SUBSYS_").unwrap_or(name);
                if short != "NUM" {
                    r.subsystems.insert(v as u32, short.to_string());
                }
            }
        }
        r
    }

    /// Test and replay helper: reasons from (name, value) pairs as BTF spells them.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let mut r = Reasons::default();
        for (name, v) in pairs {
            let short = name.strip_prefix("SKB_DROP_REASON_").unwrap_or(name);
            r.names.insert(v, short.to_string());
        }
        r
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Does this kernel have the reason `name` (without its prefix)?
    pub fn has(&self, name: &str) -> bool {
        self.names.values().any(|n| n == name)
    }

    pub fn consumed(&self) -> Option<u32> {
        self.consumed
    }

    /// The raw value of the reason `name` (without its prefix).
    pub fn value(&self, name: &str) -> Option<u32> {
        self.names
            .iter()
            .find_map(|(&v, n)| (n == name).then_some(v))
    }

    /// The kernel's name without the `SKB_DROP_REASON_` prefix; `None` when the
    /// kernel gave no reason (`ABSENT`).
    pub fn name(&self, raw: u32) -> Option<String> {
        if raw == ABSENT {
            return None;
        }
        if let Some(n) = self.names.get(&raw) {
            return Some(n.clone());
        }
        let (subsys, code) = (raw >> SUBSYS_SHIFT, raw & 0xffff);
        Some(match self.subsystems.get(&subsys) {
            Some(s) if subsys != 0 => format!("{s}/{code}"),
            _ => format!("UNKNOWN_{raw}"),
        })
    }
}

/// Positions of the `kfree_skb` tracepoint's arguments in `TP_PROTO`, found by
/// type in `btf_trace_kfree_skb` (its first parameter is the `void *__data`
/// every trace hook gets). On 6.18 it is `(skb, location, reason, rx_sk)`:
/// https://github.com/torvalds/linux/blob/v6.18/include/trace/events/skb.h#L24
pub fn kfree_skb_args(btf: &Btf, reasons: &Reasons) -> Result<KfreeSkbArgs> {
    let id = btf
        .find("btf_trace_kfree_skb", Kind::Typedef)
        .context("kernel BTF has no btf_trace_kfree_skb (no skb:kfree_skb tracepoint?)")?;
    let params = btf
        .params(id)
        .context("btf_trace_kfree_skb is not a function")?;
    let names: Vec<String> = params.iter().skip(1).map(|&p| btf.type_name(p)).collect();
    let pos = |want: &str, from: usize| {
        names
            .iter()
            .skip(from)
            .position(|n| n == want)
            .map(|i| (i + from) as u32)
    };
    let skb = pos("struct sk_buff *", 0)
        .with_context(|| format!("kfree_skb passes no sk_buff: ({})", names.join(", ")))?;
    let location = pos("void *", skb as usize + 1).unwrap_or(ABSENT);
    let reason = pos("enum skb_drop_reason", 0).unwrap_or(ABSENT);
    if skb > 4 || (location != ABSENT && location > 4) || (reason != ABSENT && reason > 4) {
        bail!("kfree_skb arguments out of reach: ({})", names.join(", "));
    }
    Ok(KfreeSkbArgs {
        skb,
        location,
        reason,
        consumed: reasons.consumed().unwrap_or(ABSENT),
    })
}

/// Positions of `fib:fib_table_lookup`'s arguments, found by type in
/// `btf_trace_fib_table_lookup`: `(u32 tb_id, const struct flowi4 *,
/// const struct fib_nh_common *, int err)` since 5.3; 5.2 and older pass a
/// `struct fib_nh *` and are refused
/// (https://github.com/torvalds/linux/blob/v6.18/include/trace/events/fib.h#L14).
pub fn fib_lookup_args(btf: &Btf, offsets: &Offsets) -> Result<FibLookupArgs> {
    let id = btf
        .find("btf_trace_fib_table_lookup", Kind::Typedef)
        .context("kernel BTF has no btf_trace_fib_table_lookup")?;
    let params = btf
        .params(id)
        .context("btf_trace_fib_table_lookup is not a function")?;
    let names: Vec<String> = params.iter().skip(1).map(|&p| btf.type_name(p)).collect();
    let pos = |want: &str| names.iter().position(|n| n == want).map(|i| i as u32);
    let shape = || format!("({})", names.join(", "));
    let args = FibLookupArgs {
        tb_id: pos("u32").with_context(|| format!("no table id in {}", shape()))?,
        flp: pos("struct flowi4 *").with_context(|| format!("no flowi4 in {}", shape()))?,
        nhc: pos("struct fib_nh_common *")
            .with_context(|| format!("no fib_nh_common in {}", shape()))?,
        err: pos("int").with_context(|| format!("no error in {}", shape()))?,
    };
    if [args.tb_id, args.flp, args.nhc, args.err]
        .iter()
        .any(|&i| i > 4)
    {
        bail!("fib_table_lookup arguments out of reach: {}", shape());
    }
    if [
        offsets.fl4_saddr,
        offsets.fl4_daddr,
        offsets.fl4_iif,
        offsets.nhc_dev,
    ]
    .contains(&ABSENT)
    {
        bail!("this kernel's flowi4/fib_nh_common layout is not one kdrop reads");
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::tests::sample;

    #[test]
    fn reasons_and_args_from_btf() {
        let (_, data) = sample();
        let btf = Btf::parse(&data, None).unwrap();
        let r = Reasons::from_btf(&btf);
        assert_eq!(r.name(16).as_deref(), Some("IP_RPFILTER"));
        assert_eq!(r.name(2).as_deref(), Some("NOT_SPECIFIED"));
        assert_eq!(r.name(1).as_deref(), Some("CONSUMED"));
        assert_eq!(r.consumed(), Some(1));
        assert_eq!(r.name(ABSENT), None);
        assert_eq!(r.name(999).as_deref(), Some("UNKNOWN_999"));
        let a = kfree_skb_args(&btf, &r).unwrap();
        assert_eq!((a.skb, a.location, a.reason, a.consumed), (0, 1, 2, 1));
    }

    #[test]
    fn offsets_check_member_sizes() {
        let (_, data) = sample();
        let btf = Btf::parse(&data, None).unwrap();
        assert_eq!(offset(&btf, "sk_buff", "network_header", 2).unwrap(), 10);
        let err = offset(&btf, "sk_buff", "network_header", 4).unwrap_err();
        assert!(err.to_string().contains("is 2 bytes"), "{err:#}");
        assert!(offset(&btf, "sk_buff", "nope", 2).is_err());
        assert!(offset(&btf, "nope", "x", 2).is_err());
    }
}
