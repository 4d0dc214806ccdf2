//! A finding from the kernel's drop reason alone, for drops no richer
//! cause explains (the reverse-path lookup, the rule that dropped...).
use super::fix_kinds::Kind;
use crate::model::cause::Cause;
use crate::model::{
    finding::{Finding, Fix},
    netfilter::Attribution,
};

/// What diagnosis needs to know about a drop.
#[derive(Clone, Debug)]
pub struct DropFacts<'a> {
    pub reason: Option<&'a str>,
    pub ifname: &'a str,
    pub netns: Option<&'a str>,
    pub src: String,
    pub dst: String,
    pub location: Option<&'a str>,
    /// The packet's TCP flags byte (SYN 0x02, ACK 0x10): whether it opens a
    /// connection or answers one decides a netfilter repair.
    pub tcp_flags: u8,
    /// The rule, chain policy or conntrack drop behind a NETFILTER_DROP.
    pub netfilter: Option<&'a Attribution>,
    /// Without `netfilter`: why kdrop could not tell (a tool that failed,
    /// no reading from before; `netfilter::unattributed`).
    pub unattributed: Option<&'a str>,
}

/// A finding from the kernel's drop reason alone. Richer causes (the route
/// the reverse-path lookup took, the rule that dropped) build on this.
pub fn explain(f: &DropFacts) -> Option<Finding> {
    let reason = match f.reason {
        Some(r) => r,
        // No reason (before 5.17), but not a guess: the location
        // (nf_hook_slow frees only on NF_DROP) or the kernel's own NF_DROP
        // verdict for the packet (an attribution exists) says it.
        None if f.netfilter.is_some() || f.location.is_some_and(netfilter_location) => {
            "NETFILTER_DROP"
        }
        None => return Some(no_reason(f)),
    };
    let ns = f
        .netns
        .map(|n| format!("ip netns exec {n} "))
        .unwrap_or_default();
    let iface = f.ifname;
    let (src, dst) = (host(&f.src), host(&f.dst));
    if reason == "NETFILTER_DROP" {
        if let Some(a) = f.netfilter {
            return Some(super::netfilter::finding::explain(a, f));
        }
    }
    // The reason alone rarely says enough to repair; where it does, the
    // repair.
    let (cause, summary, fix, notes, inspect) = source_words(reason, &ns, iface, src, dst)
        .or_else(|| path_words(reason, &ns, iface, dst))
        .or_else(|| socket_words(reason, f, &ns, iface))?;
    Some(Finding {
        cause,
        summary,
        evidence: vec![reason_evidence(f)],
        fix,
        fix_notes: notes,
        inspect,
        ..Finding::default()
    })
}

/// What the reason alone says: cause, summary, repairs, notes, inspection.
type Words = (Cause, String, Vec<Fix>, Vec<String>, Vec<String>);

/// Reasons about the packet's source address.
fn source_words(reason: &str, ns: &str, iface: &str, src: &str, dst: &str) -> Option<Words> {
    match reason {
        "IP_RPFILTER" => Some((
            Cause::RpFilter,
            format!("reverse-path filter on {iface}: the way back to {src} is not via {iface}"),
            vec![
                Kind::RpFilterLoose.fix(format!("{ns}sysctl -w net.ipv4.conf.{iface}.rp_filter=2"))
            ],
            vec![format!(
                "loose mode (2) accepts a packet whose source has any route back; strict \
                 mode (1) wants it back through {iface}"
            )],
            vec![
                format!("{ns}ip route get {src} from {dst}"),
                format!("{ns}sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.{iface}.rp_filter"),
            ],
        )),
        "IP_LOCAL_SOURCE" => Some((
            Cause::MartianLocalSource,
            format!("martian: source {src} is a local address of this host, arriving on {iface}"),
            vec![],
            vec![format!(
                "the source is one of this host's addresses: remove it from the device that \
                 holds it, or stop the peer from using it"
            )],
            vec![format!("{ns}ip route get {src} from {dst}")],
        )),
        "IP_INVALID_SOURCE" => Some((
            Cause::MartianSource,
            format!("martian: source {src} is not a valid source address"),
            vec![],
            vec![],
            vec![format!("{ns}ip route get {src} from {dst}")],
        )),
        "IP_LOCALNET" => Some((
            Cause::MartianLocalnet,
            format!("127.0.0.0/8 address on {iface} without route_localnet"),
            vec![Kind::RouteLocalnet.fix(format!(
                "{ns}sysctl -w net.ipv4.conf.{iface}.route_localnet=1"
            ))],
            vec![],
            vec![format!("{ns}sysctl net.ipv4.conf.{iface}.route_localnet")],
        )),
        _ => None,
    }
}

/// Reasons about the way the packet takes.
fn path_words(reason: &str, ns: &str, iface: &str, dst: &str) -> Option<Words> {
    match reason {
        "OTHERHOST" => Some((
            Cause::Otherhost,
            format!("frame on {iface} was addressed to another host's MAC"),
            vec![],
            vec![],
            vec![format!("{ns}ip neigh show dev {iface}")],
        )),
        "IP_INNOROUTES" | "IP_OUTNOROUTES" => Some((
            Cause::NoRoute,
            format!("no route for {dst}"),
            vec![],
            vec![],
            vec![format!("{ns}ip route get {dst}")],
        )),
        "NEIGH_FAILED" => Some((
            Cause::NeighbourFailed,
            format!("neighbour resolution failed on {iface}"),
            vec![],
            vec![],
            vec![format!("{ns}ip neigh show dev {iface}")],
        )),
        "XFRM_POLICY" => Some((
            Cause::XfrmPolicy,
            "an IPsec policy refused it".into(),
            vec![],
            vec![],
            vec![format!("{ns}ip xfrm policy")],
        )),
        _ => None,
    }
}

/// Reasons about sockets and netfilter (without the rule behind it).
fn socket_words(reason: &str, f: &DropFacts, ns: &str, iface: &str) -> Option<Words> {
    match reason {
        "NO_SOCKET" => Some((
            Cause::NoSocket,
            format!(
                "nothing listens on {} (or the packet matches no connection)",
                f.dst
            ),
            vec![],
            vec![format!(
                "start the service on {}, or point the client at the port it listens on",
                f.dst
            )],
            vec![format!("{ns}ss -ltn")],
        )),
        "NETFILTER_DROP" => Some((
            Cause::Netfilter,
            format!("a netfilter rule or chain policy dropped it on {iface}"),
            vec![],
            vec![match f.unattributed {
                Some(why) => {
                    format!("kdrop could not tell which rule: {why}; the rulesets below hold it")
                }
                None => "kdrop could not tell which rule: the rulesets below hold it".into(),
            }],
            vec![
                format!("{ns}iptables-save -c"),
                format!("{ns}nft list ruleset"),
            ],
        )),
        "TCP_LISTEN_OVERFLOW" | "SOCKET_BACKLOG" => Some((
            Cause::ListenOverflow,
            format!(
                "the listener on {} is overloaded (accept or SYN queue)",
                f.dst
            ),
            vec![],
            vec![],
            vec![format!(
                "{ns}nstat -az TcpExtListenOverflows TcpExtListenDrops"
            )],
        )),
        _ => None,
    }
}

/// Where the drop reason comes from: `kernel drop reason X at LOC`, or on a
/// kernel without reasons the location that implies it.
pub fn reason_evidence(f: &DropFacts) -> String {
    let at = f.location.map(|l| format!(" at {l}")).unwrap_or_default();
    match f.reason {
        Some(r) => format!("kernel drop reason {r}{at}"),
        None if f.location.is_some_and(netfilter_location) => format!(
            "freed{at}: no drop reason on this kernel (5.17+ has them), but nf_hook_slow \
             frees a packet only on a netfilter NF_DROP verdict"
        ),
        None => format!(
            "freed{at}: no drop reason on this kernel (5.17+ has them), after the NF_DROP \
             verdict below"
        ),
    }
}

/// Was the packet freed in `nf_hook_slow`? On kernels without drop reasons
/// that names netfilter as certainly as NETFILTER_DROP: it frees a packet
/// only on an NF_DROP verdict (5.10:
/// https://github.com/torvalds/linux/blob/v5.10/net/netfilter/core.c, `case
/// NF_DROP: kfree_skb(skb)` in `nf_hook_slow`).
pub fn netfilter_location(location: &str) -> bool {
    location.split('+').next() == Some("nf_hook_slow")
}

/// A kernel whose `kfree_skb` carries no reason (before 5.17, e.g. Debian
/// 11's 5.10): say so, with where the packet was freed, rather than guess a
/// cause from the location.
fn no_reason(f: &DropFacts) -> Finding {
    let mut evidence = vec!["this kernel's kfree_skb carries no drop reason (5.17+ does)".into()];
    if let Some(loc) = f.location {
        evidence.push(format!("freed at {loc}"));
    }
    Finding {
        cause: Cause::NoReason,
        summary: format!(
            "dropped on {}; this kernel does not say why, kdrop does not guess",
            f.ifname
        ),
        evidence,
        ..Finding::default()
    }
}

/// `10.0.0.1:80` → `10.0.0.1`; `[2001:db8::1]:80` → `2001:db8::1`.
fn host(endpoint: &str) -> &str {
    let h = endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(reason: &str) -> DropFacts<'_> {
        DropFacts {
            reason: Some(reason),
            ifname: "eth1",
            netns: Some("node"),
            src: "198.51.100.7:40000".into(),
            dst: "10.0.2.20:8080".into(),
            location: Some("ip_rcv_finish_core+0x1a3"),
            tcp_flags: 0x02,
            netfilter: None,
            unattributed: None,
        }
    }

    #[test]
    fn rp_filter() {
        let f = explain(&facts("IP_RPFILTER")).unwrap();
        assert_eq!(f.cause, "rp_filter");
        assert_eq!(
            f.summary,
            "reverse-path filter on eth1: the way back to 198.51.100.7 is not via eth1"
        );
        assert_eq!(
            f.evidence,
            ["kernel drop reason IP_RPFILTER at ip_rcv_finish_core+0x1a3"]
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node sysctl -w net.ipv4.conf.eth1.rp_filter=2"]
        );
        assert_eq!(
            f.inspect[0],
            "ip netns exec node ip route get 198.51.100.7 from 10.0.2.20"
        );
    }

    #[test]
    fn no_socket_and_netfilter() {
        assert_eq!(explain(&facts("NO_SOCKET")).unwrap().cause, "no_socket");
        assert_eq!(
            explain(&facts("NETFILTER_DROP")).unwrap().cause,
            "netfilter"
        );
        assert!(explain(&facts("TCP_CSUM")).is_none());
    }

    #[test]
    fn an_unattributed_netfilter_drop_says_why() {
        let mut f = facts("NETFILTER_DROP");
        assert_eq!(
            explain(&f).unwrap().fix_notes,
            ["kdrop could not tell which rule: the rulesets below hold it"]
        );
        f.unattributed = Some("nft did not answer within 5s");
        let got = explain(&f).unwrap();
        assert_eq!(got.cause, "netfilter");
        assert_eq!(
            got.fix_notes,
            [
                "kdrop could not tell which rule: nft did not answer within 5s; the rulesets \
                 below hold it"
            ]
        );
    }

    #[test]
    fn no_reason_says_so() {
        let mut f = facts("IP_RPFILTER");
        f.reason = None;
        let got = explain(&f).unwrap();
        assert_eq!(got.cause, "no_reason");
        assert_eq!(
            got.summary,
            "dropped on eth1; this kernel does not say why, kdrop does not guess"
        );
        assert_eq!(got.evidence[1], "freed at ip_rcv_finish_core+0x1a3");
        assert!(got.fix.is_empty());
    }

    #[test]
    fn no_reason_but_nf_hook_slow_is_netfilter() {
        let mut f = facts("IP_RPFILTER");
        f.reason = None;
        f.location = Some("nf_hook_slow+0x93");
        let got = explain(&f).unwrap();
        assert_eq!(got.cause, "netfilter");
        assert_eq!(
            got.evidence,
            [
                "freed at nf_hook_slow+0x93: no drop reason on this kernel (5.17+ has them), \
              but nf_hook_slow frees a packet only on a netfilter NF_DROP verdict"
            ]
        );
        // Only that function: nf_hook_slow_list or a prefix is not it.
        assert!(!netfilter_location("nf_hook_slow_list+0x10"));
        assert!(netfilter_location("nf_hook_slow"));
    }

    /// Every reason `explain` names, with its cause, what it points at and
    /// its notes (cargo-mutants found most arms unchecked).
    #[test]
    fn every_reason_has_its_cause() {
        for (reason, cause, summary_has, inspect_has) in [
            (
                "IP_LOCAL_SOURCE",
                "martian_local_source",
                "198.51.100.7",
                "ip route get 198.51.100.7 from 10.0.2.20",
            ),
            (
                "IP_INVALID_SOURCE",
                "martian_source",
                "198.51.100.7",
                "ip route get 198.51.100.7 from 10.0.2.20",
            ),
            ("IP_LOCALNET", "martian_localnet", "eth1", "route_localnet"),
            ("OTHERHOST", "otherhost", "eth1", "ip neigh show dev eth1"),
            (
                "IP_INNOROUTES",
                "no_route",
                "10.0.2.20",
                "ip route get 10.0.2.20",
            ),
            (
                "IP_OUTNOROUTES",
                "no_route",
                "10.0.2.20",
                "ip route get 10.0.2.20",
            ),
            (
                "NEIGH_FAILED",
                "neighbour_failed",
                "eth1",
                "ip neigh show dev eth1",
            ),
            (
                "TCP_LISTEN_OVERFLOW",
                "listen_overflow",
                "10.0.2.20:8080",
                "TcpExtListenOverflows",
            ),
            (
                "SOCKET_BACKLOG",
                "listen_overflow",
                "10.0.2.20:8080",
                "TcpExtListenDrops",
            ),
            ("XFRM_POLICY", "xfrm_policy", "IPsec", "ip xfrm policy"),
        ] {
            let f = explain(&facts(reason)).unwrap_or_else(|| panic!("{reason}: no finding"));
            assert_eq!(f.cause, cause, "{reason}");
            assert!(f.summary.contains(summary_has), "{reason}: {}", f.summary);
            assert!(
                f.inspect.iter().any(|i| i.contains(inspect_has)),
                "{reason}: {:?}",
                f.inspect
            );
            assert_eq!(
                f.evidence,
                [format!(
                    "kernel drop reason {reason} at ip_rcv_finish_core+0x1a3"
                )]
            );
        }
        // The ones with a note instead of a command.
        for reason in ["IP_LOCAL_SOURCE", "NETFILTER_DROP"] {
            let f = explain(&facts(reason)).unwrap();
            assert_eq!(f.fix_notes.len(), 1, "{reason}: {f:?}");
        }
        assert!(explain(&facts("SKB_CSUM")).is_none());
    }

    /// No reason and not freed in nf_hook_slow: the verdict is what says
    /// netfilter, not the location.
    #[test]
    fn reason_evidence_without_a_reason() {
        let mut f = facts("IP_RPFILTER");
        f.reason = None;
        assert!(
            reason_evidence(&f).ends_with("after the NF_DROP verdict below"),
            "{}",
            reason_evidence(&f)
        );
        f.location = Some("nf_hook_slow+0x9c");
        assert!(reason_evidence(&f).contains("nf_hook_slow frees a packet only"));
    }

    #[test]
    fn host_part() {
        assert_eq!(host("10.0.0.1:80"), "10.0.0.1");
        assert_eq!(host("[2001:db8::1]:80"), "2001:db8::1");
    }
}
