//! Reverse-path and martian drops, explained from the kernel's own route
//! lookups for the packet (`fib:fib_table_lookup`) and the namespace's
//! routing context. Pure: recorded events and context in, a finding out.
//!
//! What the kernel does, as of v6.18 (net/ipv4/fib_frontend.c,
//! `__fib_validate_source`,
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/fib_frontend.c#L341):
//! it looks the packet's *source* up with `daddr = src, saddr = dst,
//! iif = loopback, mark = skb->mark if src_valid_mark`, and
//! - fails with -EINVAL (a martian) when the result is a local address and
//!   accept_local is off (reason IP_LOCAL_SOURCE since 6.13);
//! - fails with -EXDEV (IP_RPFILTER) under strict rp_filter when the result
//!   does not leave by the input interface, or under any rp_filter when
//!   there is no route back at all.
use crate::model::cause::Cause;
use std::net::{IpAddr, Ipv4Addr};

pub use super::reverse_path::{RouteDrop, LOOPBACK_IFINDEX};
pub use super::routes::{lookup, route_text, rule_matches, rule_text, table_name, Flow};
use super::{fix_kinds::Kind, reverse_path::reverse_evidence, routes::RT_TABLE_LOCAL};

use crate::model::{
    finding::{Finding, Fix},
    routing::{Addr, Confs, Route, RouteLookup, RouteType, Tables, RTN_LOCAL},
};

/// Drop reasons this module explains.
pub const REASONS: [&str; 4] = [
    "IP_RPFILTER",
    "IP_LOCAL_SOURCE",
    "IP_INVALID_SOURCE",
    "IP_LOCALNET",
];

const EXDEV: i32 = 18;
const EINVAL: i32 = 22;

/// The reason a kernel that names none (5.10: no reason at all; 6.1-6.12:
/// NOT_SPECIFIED for martians) would give, from `fib_validate_source`'s
/// return code or, for a local source, from the drop location and the
/// namespace's addresses; with the evidence line saying how it was derived.
/// `None` when it cannot be known: kdrop does not guess.
pub fn derive_reason(d: &RouteDrop, t: &Tables, c: &Confs) -> Option<(&'static str, String)> {
    let derived = derived(d, t, c)?;
    Some((derived.reason(), derived.evidence(d)))
}

/// How a reason the kernel did not name was derived, before any words.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Derived {
    /// A destination in 127.0.0.0/8 on a device without route_localnet.
    Localnet,
    /// fib_validate_source returned -EXDEV for this packet.
    Exdev,
    /// It returned -EINVAL; `local`: the source is the namespace's own.
    Einval { local: bool },
    /// No return code, but a source local to the namespace.
    LocalSource,
    /// No return code; the reverse lookup asked now is refused under
    /// `rp_filter` on `iif`: `back`, it finds a route (not by `iif`), or none.
    ReverseNow {
        rp_filter: u32,
        iif: String,
        back: bool,
    },
}

/// The facts of `derive_reason`.
fn derived(d: &RouteDrop, t: &Tables, c: &Confs) -> Option<Derived> {
    if d.reason.is_some_and(|r| r != "NOT_SPECIFIED") {
        return None;
    }
    // Routing refusals are freed in ip_rcv_finish_core (v5.10 and v6.1:
    // https://github.com/torvalds/linux/blob/v6.1/net/ipv4/ip_input.c,
    // `drop_error`). Elsewhere a source-check result says nothing about
    // this drop: the packet may not even have been routed (early demux),
    // and the result be that of an earlier skb at the same address.
    if !d.location.starts_with("ip_rcv_finish_core") {
        return None;
    }
    let local = is_local(t, d.src);
    let iif = t.link_name(d.iif);
    let localnet =
        c.all.route_localnet.unwrap_or(0) != 0 || c.dev(&iif).route_localnet.unwrap_or(0) != 0;
    // ip_route_input_slow refuses a loopback destination on a device
    // without route_localnet before any source check (v6.1:
    // https://github.com/torvalds/linux/blob/v6.1/net/ipv4/route.c,
    // `martian_destination`): a source check result is then another
    // packet's, whatever it says.
    if d.dst.is_loopback() && !localnet {
        return Some(Derived::Localnet);
    }
    match d.src_check {
        Some(r) if r == -EXDEV => Some(Derived::Exdev),
        Some(r) if r == -EINVAL => Some(Derived::Einval { local }),
        None if local => Some(Derived::LocalSource),
        // No return code for this packet (its drop armed the probe that
        // gives one): the reverse lookup the kernel answers now, against
        // the rp_filter in force.
        None => {
            let rp = c.rp_filter(&iif);
            let back = match d.asked?.1 {
                RouteLookup::Found(ref a) if a.kind == RouteType::Unicast => Some(a.devices()),
                RouteLookup::Found(_) => return None,
                RouteLookup::Failed { .. } => None,
            };
            let refused = match back {
                Some(ref devs) => rp == 1 && !devs.contains(&d.iif),
                None => rp != 0,
            };
            refused.then(|| Derived::ReverseNow {
                rp_filter: rp,
                iif,
                back: back.is_some(),
            })
        }
        _ => None,
    }
}

impl Derived {
    fn reason(&self) -> &'static str {
        match self {
            Derived::Localnet => "IP_LOCALNET",
            Derived::Exdev | Derived::ReverseNow { .. } => "IP_RPFILTER",
            Derived::Einval { local: true } | Derived::LocalSource => "IP_LOCAL_SOURCE",
            Derived::Einval { local: false } => "IP_INVALID_SOURCE",
        }
    }

    /// The evidence line: where the kernel dropped it, what it named, and
    /// how the reason was derived.
    fn evidence(&self, d: &RouteDrop) -> String {
        let named = if d.reason.is_some() {
            "NOT_SPECIFIED"
        } else {
            "no reason"
        };
        let at = format!("kernel: drop at {} ({named} on this kernel)", d.location);
        match self {
            Derived::Localnet => format!(
                "{at} while routing a packet to 127.0.0.0/8 with route_localnet off (derived from the location, the destination and the sysctl)"
            ),
            Derived::Exdev => format!(
                "{at}; fib_validate_source returned -EXDEV for this packet: reverse-path filter"
            ),
            Derived::Einval { .. } => format!(
                "{at}; fib_validate_source returned -EINVAL for this packet: martian source"
            ),
            Derived::LocalSource => format!(
                "{at} while routing a packet whose source is local to this namespace, an address or a local route (derived from the location; no return code on this kernel)"
            ),
            Derived::ReverseNow {
                rp_filter,
                iif,
                back,
            } => format!(
                "{at} while routing; rp_filter {rp_filter} on {iif} and the reverse lookup, \
                 asked now, {} (derived: no return code for this packet)",
                if *back {
                    format!("does not leave by {iif}")
                } else {
                    "finds no route back".to_string()
                }
            ),
        }
    }
}

/// Is `a` this namespace's own: one of its addresses, or in a local route of
/// table local (AnyIP), which the kernel's reverse lookup answers RTN_LOCAL
/// alike.
fn is_local(t: &Tables, a: Ipv4Addr) -> bool {
    t.addrs.iter().any(|x| x.addr == IpAddr::V4(a))
        || lookup(&t.routes, RT_TABLE_LOCAL, a).is_some_and(|r| r.kind == RTN_LOCAL)
}

/// Explains an IPv4 drop from its route evidence, or `None` if it is not a
/// reverse-path or martian drop.
pub fn explain(d: &RouteDrop, t: &Tables, c: &Confs) -> Option<Finding> {
    let iif = t.link_name(d.iif);
    let (reason, kernel) = match derive_reason(d, t, c) {
        Some((reason, how)) => (reason, how),
        None => {
            let reason = d.reason?;
            (
                reason,
                format!("kernel: drop reason {reason} at {}", d.location),
            )
        }
    };
    let ns = d.netns_exec;
    match reason {
        "IP_RPFILTER" => Some(super::rp_filter::finding(d, t, c, &iif, kernel)),
        "IP_LOCAL_SOURCE" => Some(local_source(d, t, c, &iif, kernel)),
        "IP_INVALID_SOURCE" if is_local(t, d.src) => Some(local_source(d, t, c, &iif, kernel)),
        "IP_LOCALNET" => {
            let which = if d.dst.is_loopback() { d.dst } else { d.src };
            let all = c.all.route_localnet.unwrap_or(0);
            let dev = c.dev(&iif).route_localnet.unwrap_or(0);
            Some(Finding {
                cause: Cause::MartianLocalnet,
                summary: format!(
                    "martian on {iif}: {which} is in 127.0.0.0/8 and route_localnet is off"
                ),
                evidence: vec![
                    kernel,
                    format!(
                        "route_localnet: conf.all={all}, conf.{iif}={dev}: loopback addresses are \
                         only routed from lo"
                    ),
                ],
                fix: vec![Kind::RouteLocalnet.fix(format!(
                    "{ns}sysctl -w net.ipv4.conf.{iif}.route_localnet=1"
                ))],
                inspect: vec![format!(
                    "{ns}sysctl net.ipv4.conf.all.route_localnet net.ipv4.conf.{iif}.route_localnet"
                )],
                ..Finding::default()
            })
        }
        _ => None,
    }
}

/// What makes a martian's source local to the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LocalSource<'a> {
    /// The device it lives on: the kernel's local-table answer, else the
    /// address's (`?` when neither says).
    dev: String,
    /// The namespace's address that is the source, if one is.
    addr: Option<&'a Addr>,
    /// The route of table local that makes it local, if one does.
    route: Option<&'a Route>,
}

impl<'a> LocalSource<'a> {
    /// `answered_on`: the device of the kernel's local answer, if any.
    fn of(d: &RouteDrop, t: &'a Tables, answered_on: Option<u32>) -> Self {
        let addr = t.addrs.iter().find(|a| a.addr == IpAddr::V4(d.src));
        LocalSource {
            dev: answered_on
                .or(addr.map(|a| a.index))
                .map(|i| t.link_name(i))
                .unwrap_or_else(|| "?".into()),
            addr,
            route: lookup(&t.routes, RT_TABLE_LOCAL, d.src).filter(|r| r.kind == RTN_LOCAL),
        }
    }
}

fn local_source(d: &RouteDrop, t: &Tables, c: &Confs, iif: &str, kernel: String) -> Finding {
    let ns = d.netns_exec;
    let ev = reverse_evidence(d, t);
    let l = LocalSource::of(d, t, ev.local);
    let mut evidence = vec![kernel];
    evidence.extend(ev.lines);
    if let Some(route) = l.route {
        evidence.push(format!("route in table local: {}", route_text(route, t)));
    }
    let all = c.all.accept_local.unwrap_or(0);
    let on = c.dev(iif).accept_local.unwrap_or(0);
    evidence.push(format!(
        "accept_local: conf.all={all}, conf.{iif}={on}: packets from this host's own addresses \
         arriving on {iif} are martians"
    ));
    evidence.push(format!(
        "accept_local=1 would let the SYN in but not fix the handshake: the reply to {} is a \
         local address and is delivered locally, never sent back",
        d.src
    ));
    let (what, fix) = local_repair(d, t, &l);
    Finding {
        cause: Cause::MartianLocalSource,
        summary: format!("martian source on {iif}: {} is {what}", d.src),
        evidence,
        fix,
        fix_notes: if l.dev == "kube-ipvs0" {
            vec![format!(
                "kube-proxy (IPVS mode) binds the Service's LoadBalancer IP {} to kube-ipvs0 \
                     and binds it again after the delete: the lasting repair is on the Service. \
                     Kubernetes 1.30+: status.loadBalancer.ingress[].ipMode: Proxy (set by the \
                     cloud controller) stops kube-proxy from binding it; else have the load \
                     balancer health-check from another source address",
                d.src
            )]
        } else {
            Vec::new()
        },
        inspect: vec![
            format!("{ns}ip route get {} from {}", d.src, d.dst),
            format!("{ns}ip -o addr show to {}", d.src),
        ],
        ..Finding::default()
    }
}

/// What the source is, in words, and the delete that makes it not local.
/// The address, or a local route that is none (AnyIP: `ip route add local
/// 203.0.113.0/24 dev lo`), makes the source local; a local route outside
/// table local (a TPROXY table) is named but not deleted.
fn local_repair(d: &RouteDrop, t: &Tables, l: &LocalSource) -> (String, Vec<Fix>) {
    let (ns, dev) = (d.netns_exec, &l.dev);
    match (l.addr, l.route) {
        (Some(a), _) => (
            format!("a local address of this host (local table, on dev {dev})"),
            vec![Kind::LocalAddressDelete.fix(format!(
                "{ns}ip addr del {}/{} dev {dev}",
                d.src, a.prefix_len
            ))],
        ),
        (None, Some(r)) => (
            format!(
                "local to this host by a route, not an address: {} (table local)",
                route_text(r, t)
            ),
            vec![Kind::LocalRouteDelete
                .fix(format!("{ns}ip route del {} table local", route_text(r, t)))],
        ),
        (None, None) => (
            format!("local to this host (local table, on dev {dev})"),
            Vec::new(),
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        diagnosis::way_back::Sender,
        model::{
            neighbour::Neighbour,
            packet::Lookup,
            routing::{
                Addr, Conf, Link, Route, RouteAnswer, RouteNextHop, RouteQuery, Rule,
                FR_ACT_TO_TBL, RTN_UNICAST,
            },
        },
    };

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    pub(crate) fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.into(),
            master: None,
            kind: Some("veth".into()),
            up: true,
        }
    }

    pub(crate) fn route(table: u32, dst: Option<(&str, u8)>, gw: Option<&str>, oif: u32) -> Route {
        Route {
            table,
            family: 2,
            dst: dst.map(|(a, _)| a.parse().unwrap()),
            dst_len: dst.map_or(0, |(_, l)| l),
            kind: RTN_UNICAST,
            scope: 0,
            oif: Some(oif),
            gateway: gw.map(|g| g.parse().unwrap()),
            prefsrc: None,
            priority: 0,
            nexthops: vec![],
        }
    }

    pub(crate) fn rule(priority: u32, table: u32) -> Rule {
        Rule {
            family: 2,
            priority,
            table,
            action: FR_ACT_TO_TBL,
            src: None,
            dst: None,
            fwmark: None,
            fwmask: None,
            iifname: None,
            oifname: None,
            invert: false,
            goto: None,
        }
    }

    /// Incident 1 as in the seed: table 2 for eth1, a pod rule, a fwmark
    /// rule to main ahead of it.
    fn incident1() -> Tables {
        let mut pod_rule = rule(1536, 2);
        pod_rule.src = Some(("10.0.2.20".parse().unwrap(), 32));
        let mut mark_rule = rule(1024, 254);
        mark_rule.fwmark = Some(0x80);
        mark_rule.fwmask = Some(0x80);
        let mut local = route(255, Some(("10.0.2.20", 32)), None, 3);
        local.kind = RTN_LOCAL;
        Tables {
            links: vec![link(1, "lo"), link(2, "eth0"), link(3, "eth1")],
            addrs: vec![Addr {
                index: 3,
                addr: "10.0.2.20".parse().unwrap(),
                prefix_len: 32,
                label: None,
            }],
            routes: vec![
                route(254, None, Some("10.0.1.1"), 2),
                route(254, Some(("10.0.1.0", 24)), None, 2),
                route(2, None, Some("10.0.2.1"), 3),
                local,
            ],
            rules: vec![
                rule(0, 255),
                mark_rule,
                pod_rule,
                rule(32766, 254),
                rule(32767, 253),
            ],
            rules6: vec![],
            routes6: vec![],
        }
    }

    fn confs(all: u32, eth1: u32, vmark: u32) -> Confs {
        let conf = |rp, vmark| Conf {
            rp_filter: Some(rp),
            src_valid_mark: Some(vmark),
            accept_local: Some(0),
            route_localnet: Some(0),
        };
        Confs {
            all: conf(all, vmark),
            devs: [("eth1".to_string(), conf(eth1, 0))].into(),
            bridge_nf_call_iptables: None,
            bridge_nf_call_ip6tables: None,
        }
    }

    fn lookup_ev(table: u32, err: i32, res: u32, gw: Option<&str>, mark: u32) -> Lookup {
        Lookup {
            ts_ns: 1,
            table,
            err,
            iif: LOOPBACK_IFINDEX,
            oif: 0,
            mark,
            src: ip("10.0.2.20"),
            dst: ip("203.0.113.7"),
            res_ifindex: res,
            gw: gw.map(ip),
            scope: 0,
        }
    }

    fn drop<'a>(reason: &'a str, fib: &'a [Lookup], mark: u32) -> RouteDrop<'a> {
        RouteDrop {
            reason: Some(reason),
            location: "ip_rcv_finish_core+0x25b",
            iif: 3,
            src: ip("203.0.113.7"),
            dst: ip("10.0.2.20"),
            mark,
            fib,
            netns_exec: "ip netns exec node ",
            src_check: None,
            asked: None,
            sender: Sender::default(),
        }
    }

    #[test]
    fn strict_rp_filter_through_the_fwmark_rule() {
        let fib = [
            lookup_ev(255, -11, 0, None, 0x80),
            lookup_ev(254, 0, 2, Some("10.0.1.1"), 0x80),
        ];
        let f = explain(
            &drop("IP_RPFILTER", &fib, 0x80),
            &incident1(),
            &confs(1, 1, 1),
        )
        .unwrap();
        assert_eq!(f.cause, "rp_filter_strict");
        assert_eq!(
            f.summary,
            "strict reverse-path filter on eth1: the way back to 203.0.113.7 is via eth0 \
             (rule 1024: from all fwmark 0x80/0x80 lookup main)"
        );
        assert_eq!(
            f.evidence,
            [
                "kernel: drop reason IP_RPFILTER at ip_rcv_finish_core+0x25b",
                "kernel: reverse lookup of 203.0.113.7 (from 10.0.2.20, mark 0x80): table local: \
                 no match; table main → dev eth0 via 10.0.1.1",
                "rp_filter: conf.all=1, conf.eth1=1 → effective 1 (strict: the way back must use \
                 the input interface)",
                "src_valid_mark=1: the packet's mark 0x80 takes part in the reverse lookup",
                "policy rule that decided: 1024: from all fwmark 0x80/0x80 lookup main",
                "route in table main: default via 10.0.1.1 dev eth0",
            ]
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node sysctl -w net.ipv4.conf.eth1.rp_filter=2"]
        );
        assert_eq!(
            f.fix_or,
            [["ip netns exec node ip rule add from 10.0.2.20 lookup 2 priority 1023"]]
        );
        assert_eq!(
            f.inspect[0],
            "ip netns exec node ip route get 203.0.113.7 from 10.0.2.20 mark 0x80"
        );
    }

    #[test]
    fn strict_rp_filter_with_the_kernel_asked_afterwards() {
        let mut t = incident1();
        t.rules.retain(|r| r.priority != 1536);
        let q = RouteQuery {
            src: Some("10.0.2.20".parse().unwrap()),
            mark: Some(0x80),
            fib_match: true,
            ..RouteQuery::get("203.0.113.7".parse().unwrap())
        };
        let answer = RouteLookup::Found(RouteAnswer {
            family: 2,
            table: 254,
            kind: RouteType::Unicast,
            scope: 0,
            dst: None,
            dst_len: 0,
            oif: Some(2),
            gateway: Some("10.0.1.1".parse().unwrap()),
            prefsrc: None,
            priority: None,
            nexthops: vec![],
            nh_id: None,
            flags: 0,
        });
        let asked = (q, answer);
        let mut d = drop("IP_RPFILTER", &[], 0x80);
        d.asked = Some(&asked);
        let f = explain(&d, &t, &confs(0, 1, 1)).unwrap();
        assert_eq!(f.cause, "rp_filter_strict");
        assert!(
            f.summary
                .contains("the way back to 203.0.113.7 is via eth0"),
            "{}",
            f.summary
        );
        assert_eq!(
            f.evidence[1],
            "kernel, asked now through netlink as fib_validate_source asks (this drop came \
             before kdrop armed its route-lookup probe; the retransmission carries the kernel's \
             own): reverse lookup of 203.0.113.7 from 10.0.2.20, mark 0x80: table main → dev \
             eth0 via 10.0.1.1"
        );
        assert!(!f
            .evidence
            .iter()
            .any(|e| e.contains("computed from the current tables")));
        // A kernel without drop reasons (5.10), before the source-check
        // probe was armed: derived from the lookup asked afterwards.
        let mut old = d.clone();
        old.reason = None;
        let f = explain(&old, &t, &confs(0, 1, 1)).unwrap();
        assert_eq!(f.cause, "rp_filter_strict");
        assert!(
            f.evidence[0].contains(
                "rp_filter 1 on eth1 and the reverse lookup, asked now, does not leave by eth1"
            ),
            "{:?}",
            f.evidence
        );
        // Loose mode with a way back: not a reverse-path drop, no guess.
        assert!(derive_reason(&old, &t, &confs(0, 2, 1)).is_none());
        // No route back at all: said as the kernel said it.
        let none = (
            asked.0.clone(),
            RouteLookup::Failed {
                errno: 101,
                name: "ENETUNREACH".into(),
            },
        );
        d.asked = Some(&none);
        let mut t = incident1();
        t.rules.clear();
        t.routes.retain(|r| r.table == 255);
        let f = explain(&d, &t, &confs(0, 1, 1)).unwrap();
        assert!(
            f.summary
                .ends_with("there is no route back to 203.0.113.7 at all"),
            "{}",
            f.summary
        );
        assert!(
            f.evidence[1].ends_with(
                "reverse lookup of 203.0.113.7 from 10.0.2.20, mark 0x80: no route (ENETUNREACH)"
            ),
            "{:?}",
            f.evidence
        );
    }

    #[test]
    fn strict_rp_filter_without_kernel_evidence_uses_the_tables() {
        // No mark: the pod rule (1536) would send the reverse lookup to
        // table 2 (eth1)... but main's rule 32766 is what a pod without a
        // rule hits. Drop the pod rule to get the plain secondary-ENI case.
        let mut t = incident1();
        t.rules.retain(|r| r.priority != 1536);
        let f = explain(&drop("IP_RPFILTER", &[], 0), &t, &confs(0, 1, 0)).unwrap();
        assert_eq!(f.cause, "rp_filter_strict");
        assert!(
            f.summary
                .ends_with("is via eth0 (rule 32766: from all lookup main)"),
            "{}",
            f.summary
        );
        assert!(f
            .evidence
            .iter()
            .any(|e| e.contains("computed from the current tables")));
        assert!(f
            .fix_or
            .iter()
            .flatten()
            .any(|c| c.ends_with("ip rule add from 10.0.2.20 lookup 2 priority 32765")));
    }

    #[test]
    fn loose_rp_filter_with_no_route_back() {
        let mut t = incident1();
        t.routes.retain(|r| r.table == 255);
        let fib = [
            lookup_ev(255, -11, 0, None, 0),
            lookup_ev(254, -101, 0, None, 0),
        ];
        let f = explain(&drop("IP_RPFILTER", &fib, 0), &t, &confs(2, 0, 0)).unwrap();
        assert_eq!(f.cause, "rp_filter_loose");
        assert_eq!(
            f.summary,
            "reverse-path filter on eth1: there is no route back to 203.0.113.7 at all"
        );
        // Loose mode fails only when there is no way back at all
        // (`__fib_validate_source`, net/ipv4/fib_frontend.c v6.18:
        // last_resort). Lookups without a mark: none is shown.
        assert_eq!(
            f.evidence,
            [
                "kernel: drop reason IP_RPFILTER at ip_rcv_finish_core+0x25b",
                "kernel: reverse lookup of 203.0.113.7 (from 10.0.2.20): table local: no match; \
                 table main: network unreachable",
                "rp_filter: conf.all=2, conf.eth1=0 → effective 2 (loose: any way back will do)",
                "the drop carried no source MAC, and 203.0.113.7 is outside every prefix of eth1: \
                 kdrop cannot tell whether it is on eth1's link or behind a router there",
            ]
        );
        // An on-link route to a client behind a router is never answered:
        // the route waits in the notes, in both shapes.
        assert!(f.fix.is_empty(), "{:?}", f.fix);
        assert_eq!(
            f.fix_notes,
            [
                "a route back to 203.0.113.7 through eth1 lets the check pass; kdrop could not \
                 see the next hop (evidence above): behind a router on eth1, `ip netns exec node \
                 ip route add 203.0.113.7/32 via <router> dev eth1` with the router the client's \
                 packets come from (`ip netns exec node ip neigh show dev eth1`); only if the \
                 client is on eth1's link, `ip netns exec node ip route add 203.0.113.7/32 dev \
                 eth1`"
            ]
        );
        assert_eq!(
            f.inspect,
            [
                "ip netns exec node ip route get 203.0.113.7 from 10.0.2.20 iif eth1",
                "ip netns exec node ip neigh show dev eth1",
            ]
        );
    }

    fn neighbour(dst: &str, mac: &str) -> Neighbour {
        Neighbour {
            dst: dst.parse().unwrap(),
            ifindex: 3,
            dev: "eth1".into(),
            state: crate::model::neighbour::NUD_STALE,
            lladdr: Some(mac.into()),
            router: false,
            probes: None,
        }
    }

    /// No route back, the packet from a router on eth1 (its MAC is the
    /// router's neighbour entry): the route goes through it.
    #[test]
    fn no_route_back_repairs_through_the_router_the_packet_came_from() {
        let mut t = incident1();
        t.routes.retain(|r| r.table == 255);
        let fib = [
            lookup_ev(255, -11, 0, None, 0),
            lookup_ev(254, -101, 0, None, 0),
        ];
        t.addrs[0].prefix_len = 24;
        let entries = [
            neighbour("10.0.2.7", "02:00:00:00:00:07"),
            neighbour("10.0.2.1", "02:00:00:00:00:01"),
        ];
        let mut d = drop("IP_RPFILTER", &fib, 0);
        d.sender = Sender {
            mac: Some([2, 0, 0, 0, 0, 1]),
            neighbours: Some(&entries),
        };
        let f = explain(&d, &t, &confs(2, 0, 0)).unwrap();
        assert_eq!(
            f.fix,
            ["ip netns exec node ip route add 203.0.113.7/32 via 10.0.2.1 dev eth1"]
        );
        assert_eq!(
            f.evidence.last().unwrap(),
            "the packet came from 02:00:00:00:00:01 = 10.0.2.1 on eth1 (STALE), a router: the \
             client is not on eth1's link"
        );
        assert_eq!(
            f.fix_notes,
            ["a route back to 203.0.113.7 through eth1 lets the check pass"]
        );
        // The client's own entry has the MAC: it is on the link.
        let entries = [neighbour("203.0.113.7", "02:00:00:00:00:01")];
        d.sender.neighbours = Some(&entries);
        let f = explain(&d, &t, &confs(2, 0, 0)).unwrap();
        assert_eq!(
            f.fix,
            ["ip netns exec node ip route add 203.0.113.7/32 dev eth1"]
        );
        // No MAC, but the client inside eth1's prefix: on-link too.
        d.sender = Sender::default();
        d.src = ip("10.0.2.30");
        let f = explain(&d, &t, &confs(2, 0, 0)).unwrap();
        assert_eq!(
            f.fix,
            ["ip netns exec node ip route add 10.0.2.30/32 dev eth1"]
        );
    }

    #[test]
    fn local_source_martian() {
        let mut t = incident1();
        t.links.push(link(4, "kube-ipvs0"));
        t.addrs.push(Addr {
            index: 4,
            addr: "203.0.113.7".parse().unwrap(),
            prefix_len: 32,
            label: None,
        });
        let mut local = route(255, Some(("203.0.113.7", 32)), None, 4);
        local.kind = RTN_LOCAL;
        t.routes.push(local);
        let fib = [lookup_ev(255, 0, 4, None, 0)];
        let f = explain(&drop("IP_LOCAL_SOURCE", &fib, 0), &t, &confs(0, 0, 0)).unwrap();
        assert_eq!(f.cause, "martian_local_source");
        assert_eq!(
            f.summary,
            "martian source on eth1: 203.0.113.7 is a local address of this host (local table, \
             on dev kube-ipvs0)"
        );
        assert!(f
            .evidence
            .contains(&"route in table local: local 203.0.113.7 dev kube-ipvs0".to_string()));
        assert!(f
            .evidence
            .iter()
            .any(|e| e.starts_with("accept_local: conf.all=0, conf.eth1=0")));
        assert!(f
            .evidence
            .iter()
            .any(|e| e.contains("delivered locally, never sent back")));
        assert_eq!(
            f.fix,
            ["ip netns exec node ip addr del 203.0.113.7/32 dev kube-ipvs0"]
        );
        assert_eq!(
            f.fix_notes,
            [
                "kube-proxy (IPVS mode) binds the Service's LoadBalancer IP 203.0.113.7 to \
              kube-ipvs0 and binds it again after the delete: the lasting repair is on the \
              Service. Kubernetes 1.30+: status.loadBalancer.ingress[].ipMode: Proxy (set by \
              the cloud controller) stops kube-proxy from binding it; else have the load \
              balancer health-check from another source address"
            ]
        );
        assert_eq!(
            f.inspect,
            [
                "ip netns exec node ip route get 203.0.113.7 from 10.0.2.20",
                "ip netns exec node ip -o addr show to 203.0.113.7",
            ]
        );
    }

    /// The facts of a local source: its address, its route, its device.
    #[test]
    fn a_local_source_is_an_address_on_its_device() {
        let mut t = incident1();
        t.links.push(link(4, "kube-ipvs0"));
        t.addrs.push(Addr {
            index: 4,
            addr: "203.0.113.7".parse().unwrap(),
            prefix_len: 32,
            label: None,
        });
        let d = drop("IP_LOCAL_SOURCE", &[], 0);
        let l = LocalSource::of(&d, &t, None);
        assert_eq!(l.dev, "kube-ipvs0");
        assert_eq!(l.addr.map(|a| a.prefix_len), Some(32));
        assert_eq!(l.route, None);
    }

    /// Without the kernel's lookups the address is found among the
    /// namespace's own, and deleted with its own prefix length (an
    /// `ip addr del` with another one matches nothing: `inet_rtm_deladdr`,
    /// net/ipv4/devinet.c v6.18).
    #[test]
    fn a_local_source_without_kernel_lookups_is_found_among_the_addresses() {
        let mut t = incident1();
        t.addrs.push(Addr {
            index: 2,
            addr: "203.0.113.7".parse().unwrap(),
            prefix_len: 24,
            label: None,
        });
        let f = explain(&drop("IP_LOCAL_SOURCE", &[], 0), &t, &confs(0, 0, 0)).unwrap();
        assert_eq!(
            f.summary,
            "martian source on eth1: 203.0.113.7 is a local address of this host (local table, \
             on dev eth0)"
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node ip addr del 203.0.113.7/24 dev eth0"]
        );
        assert!(f.fix_notes.is_empty(), "{:?}", f.fix_notes);
    }

    /// With no kernel evidence the way back is the first table, in rule
    /// order, that a rule selecting the reverse lookup leads to and that has
    /// a route (`fib_rules_lookup`, net/core/fib_rules.c v6.18): a rule for
    /// other sources ahead of it is passed over.
    #[test]
    fn the_way_back_from_the_tables_follows_only_the_rules_that_select_it() {
        let mut t = incident1();
        t.rules.retain(|r| r.priority != 1536);
        let mut other_pods = rule(1000, 2);
        other_pods.src = Some(("10.0.9.0".parse().unwrap(), 24));
        t.rules.push(other_pods);
        let f = explain(&drop("IP_RPFILTER", &[], 0), &t, &confs(0, 1, 0)).unwrap();
        assert_eq!(
            f.summary,
            "strict reverse-path filter on eth1: the way back to 203.0.113.7 is via eth0 (rule \
             32766: from all lookup main)"
        );
    }

    /// The repair rule goes just ahead of the deciding one, never at
    /// priority 0, the local table's rule (as `rpfilter6` keeps to 1).
    #[test]
    fn no_repair_rule_is_offered_ahead_of_a_rule_at_priority_1() {
        let mut t = incident1();
        t.rules.retain(|r| r.priority != 1536);
        for r in &mut t.rules {
            if r.priority == 1024 {
                r.priority = 1;
            }
        }
        let fib = [
            lookup_ev(255, -11, 0, None, 0x80),
            lookup_ev(254, 0, 2, Some("10.0.1.1"), 0x80),
        ];
        let f = explain(&drop("IP_RPFILTER", &fib, 0x80), &t, &confs(1, 1, 1)).unwrap();
        assert_eq!(
            f.summary,
            "strict reverse-path filter on eth1: the way back to 203.0.113.7 is via eth0 (rule \
             1: from all fwmark 0x80/0x80 lookup main)"
        );
        assert!(f.fix_or.is_empty(), "{:?}", f.fix_or);
        assert!(f.fix_notes.is_empty(), "{:?}", f.fix_notes);
    }

    #[test]
    fn localnet_martian() {
        let mut d = drop("IP_LOCALNET", &[], 0);
        d.dst = ip("127.1.1.1");
        let f = explain(&d, &incident1(), &confs(0, 0, 0)).unwrap();
        assert_eq!(f.cause, "martian_localnet");
        // ip_route_input_slow refuses a loopback destination unless
        // route_localnet is on for all or the device (net/ipv4/route.c v6.18,
        // IN_DEV_NET_ROUTE_LOCALNET).
        assert_eq!(
            f.summary,
            "martian on eth1: 127.1.1.1 is in 127.0.0.0/8 and route_localnet is off"
        );
        assert_eq!(
            f.evidence,
            [
                "kernel: drop reason IP_LOCALNET at ip_rcv_finish_core+0x25b",
                "route_localnet: conf.all=0, conf.eth1=0: loopback addresses are only routed \
                 from lo",
            ]
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node sysctl -w net.ipv4.conf.eth1.route_localnet=1"]
        );
        assert_eq!(
            f.inspect,
            [
                "ip netns exec node sysctl net.ipv4.conf.all.route_localnet \
              net.ipv4.conf.eth1.route_localnet"
            ]
        );
    }

    #[test]
    fn reasons_derived_on_kernels_that_name_none() {
        // 5.10: no reason; the kretprobe saw -EXDEV.
        let fib = [lookup_ev(254, 0, 2, Some("10.0.1.1"), 0x80)];
        let mut d = drop("IP_RPFILTER", &fib, 0x80);
        d.reason = None;
        d.src_check = Some(-18);
        let f = explain(&d, &incident1(), &confs(1, 1, 1)).unwrap();
        assert_eq!(f.cause, "rp_filter_strict");
        assert_eq!(
            f.evidence[0],
            "kernel: drop at ip_rcv_finish_core+0x25b (no reason on this kernel); \
             fib_validate_source returned -EXDEV for this packet: reverse-path filter"
        );
        // 6.1: NOT_SPECIFIED and -EINVAL from a local source.
        let mut t = incident1();
        t.addrs.push(Addr {
            index: 2,
            addr: "203.0.113.7".parse().unwrap(),
            prefix_len: 32,
            label: None,
        });
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.src_check = Some(-22);
        assert_eq!(
            explain(&d, &t, &confs(0, 0, 0)).unwrap().cause,
            "martian_local_source"
        );
        // No return code, but the location and a local source say it.
        d.src_check = None;
        let f = explain(&d, &t, &confs(0, 0, 0)).unwrap();
        assert_eq!(f.cause, "martian_local_source");
        assert!(f.evidence[0].contains("derived from the location"));
        // 6.1 and 5.10: a loopback destination refused while routing.
        for reason in [Some("NOT_SPECIFIED"), None] {
            let mut d = drop("NOT_SPECIFIED", &[], 0);
            d.reason = reason;
            d.dst = ip("127.1.1.1");
            let f = explain(&d, &incident1(), &confs(0, 0, 0)).unwrap();
            assert_eq!(f.cause, "martian_localnet");
            assert!(f.evidence[0].contains("derived from the location, the destination"));
            // It never reaches the source check: a result there is another
            // packet's (an skb at the same address a moment before).
            for other in [0, -EXDEV, -EINVAL] {
                d.src_check = Some(other);
                let f = explain(&d, &incident1(), &confs(0, 0, 0)).unwrap();
                assert_eq!(f.cause, "martian_localnet");
            }
            d.src_check = None;
            // With route_localnet on it is not the reason.
            let mut on = confs(0, 0, 0);
            on.all.route_localnet = Some(1);
            assert!(explain(&d, &incident1(), &on).is_none());
            // Elsewhere than in routing, a loopback destination says nothing.
            d.location = "tcp_v4_rcv+0x10";
            assert!(explain(&d, &incident1(), &confs(0, 0, 0)).is_none());
        }
        // Nothing to go on: no finding rather than a guess.
        let d = drop("NOT_SPECIFIED", &[], 0);
        assert!(explain(&d, &incident1(), &confs(1, 1, 0)).is_none());
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.src_check = Some(0);
        assert!(explain(&d, &incident1(), &confs(1, 1, 0)).is_none());
        // A return code with a drop outside routing is not this packet's.
        let mut d = drop("IP_RPFILTER", &[], 0);
        (d.reason, d.src_check, d.location) = (None, Some(-EXDEV), "tcp_v4_rcv+0x10");
        assert!(explain(&d, &incident1(), &confs(1, 1, 0)).is_none());
    }

    #[test]
    fn other_reasons_are_not_routing() {
        assert!(explain(&drop("NO_SOCKET", &[], 0), &incident1(), &confs(1, 1, 0)).is_none());
        let mut d = drop("IP_RPFILTER", &[], 0);
        d.reason = None;
        assert!(explain(&d, &incident1(), &confs(1, 1, 0)).is_none());
    }

    #[test]
    fn rule_matching() {
        let t = incident1();
        let flow = Flow {
            src: ip("10.0.2.20"),
            dst: ip("203.0.113.7"),
            mark: 0,
            iif: "lo",
        };
        let matching: Vec<u32> = t
            .rules
            .iter()
            .filter(|r| rule_matches(r, &flow))
            .map(|r| r.priority)
            .collect();
        assert_eq!(matching, [0, 1536, 32766, 32767]);
        let marked = Flow { mark: 0x81, ..flow };
        assert!(rule_matches(&t.rules[1], &marked));
        let mut iif_rule = rule(10, 2);
        iif_rule.iifname = Some("eth1".into());
        assert!(!rule_matches(&iif_rule, &flow));
        iif_rule.invert = true;
        assert!(rule_matches(&iif_rule, &flow));
        assert_eq!(rule_text(&t.rules[2]), "1536: from 10.0.2.20 lookup 2");
    }

    #[test]
    fn longest_prefix_wins() {
        let t = incident1();
        assert_eq!(lookup(&t.routes, 254, ip("10.0.1.7")).unwrap().dst_len, 24);
        assert_eq!(lookup(&t.routes, 254, ip("8.8.8.8")).unwrap().dst_len, 0);
        assert!(lookup(&t.routes, 7, ip("8.8.8.8")).is_none());
    }

    #[test]
    fn rule_text_prints_prefixes_and_marks_as_ip_rule_does() {
        // A prefix keeps its length; a host (/32, /128) drops it, on `from`
        // and `to` alike (iproute2's ip/iprule.c, print_rule).
        let mut subnet = rule(100, 2);
        subnet.src = Some(("10.0.2.0".parse().unwrap(), 24));
        assert_eq!(rule_text(&subnet), "100: from 10.0.2.0/24 lookup 2");
        subnet.dst = Some(("10.0.3.5".parse().unwrap(), 32));
        assert_eq!(
            rule_text(&subnet),
            "100: from 10.0.2.0/24 to 10.0.3.5 lookup 2"
        );
        subnet.src = Some(("fd00::7".parse().unwrap(), 128));
        subnet.dst = Some(("fd00:1::".parse().unwrap(), 64));
        assert_eq!(
            rule_text(&subnet),
            "100: from fd00::7 to fd00:1::/64 lookup 2"
        );
        subnet.dst = Some(("fd00:1::9".parse().unwrap(), 128));
        assert_eq!(
            rule_text(&subnet),
            "100: from fd00::7 to fd00:1::9 lookup 2"
        );
        subnet.src = Some(("10.0.2.7".parse().unwrap(), 32));
        subnet.dst = Some(("10.0.0.0".parse().unwrap(), 8));
        assert_eq!(
            rule_text(&subnet),
            "100: from 10.0.2.7 to 10.0.0.0/8 lookup 2"
        );
        // `ip rule add fwmark 0x80` gives the rule mask 0xffffffff and the
        // kernel dumps it (net/core/fib_rules.c v6.18, `fib_nl2rule` and
        // `fib_nl_fill_rule`); `ip rule` prints the mask only when it is
        // not all ones.
        let mut whole_mark = rule(1024, 254);
        whole_mark.fwmark = Some(0x80);
        whole_mark.fwmask = Some(u32::MAX);
        assert_eq!(
            rule_text(&whole_mark),
            "1024: from all fwmark 0x80 lookup main"
        );
    }

    #[test]
    fn a_source_check_that_passed_derives_no_reason() {
        // __fib_validate_source (net/ipv4/fib_frontend.c v6.18) returns 0,
        // or 1 for a way back on the input device's own link: the source
        // is fine, and the drop something else.
        // 10.0.2.20 is one of the namespace's addresses, 203.0.113.7 not.
        let t = incident1();
        for src in ["203.0.113.7", "10.0.2.20"] {
            let mut d = drop("NOT_SPECIFIED", &[], 0);
            d.src = ip(src);
            d.dst = ip("10.0.2.99");
            for passed in [0, 1] {
                d.src_check = Some(passed);
                assert_eq!(
                    derive_reason(&d, &t, &confs(1, 1, 0)),
                    None,
                    "{src} {passed}"
                );
            }
        }
    }

    #[test]
    fn a_martian_source_is_derived_local_or_not() {
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.src_check = Some(-EINVAL);
        let t = incident1();
        let got = derived(&d, &t, &confs(0, 0, 0));
        assert_eq!(got, Some(Derived::Einval { local: false }));
        d.src = ip("10.0.2.20");
        d.dst = ip("10.0.2.99");
        assert_eq!(
            derived(&d, &t, &confs(0, 0, 0)),
            Some(Derived::Einval { local: true })
        );
    }

    #[test]
    fn a_martian_source_that_is_not_local_is_an_invalid_source() {
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.src_check = Some(-EINVAL);
        assert_eq!(
            derive_reason(&d, &incident1(), &confs(0, 0, 0)),
            Some((
                "IP_INVALID_SOURCE",
                "kernel: drop at ip_rcv_finish_core+0x25b (NOT_SPECIFIED on this kernel); \
                 fib_validate_source returned -EINVAL for this packet: martian source"
                    .to_string()
            ))
        );
    }

    fn asked_now(answer: RouteLookup) -> (RouteQuery, RouteLookup) {
        let q = RouteQuery::reverse_path_v4(ip("203.0.113.7"), ip("10.0.2.20"), 0, false, 0, None);
        (q, answer)
    }

    fn answer(kind: RouteType, oif: u32, gw: Option<&str>) -> RouteLookup {
        RouteLookup::Found(RouteAnswer {
            family: 2,
            table: if kind == RouteType::Local { 255 } else { 254 },
            kind,
            scope: 0,
            dst: None,
            dst_len: 0,
            oif: Some(oif),
            gateway: gw.map(|g| g.parse().unwrap()),
            prefsrc: None,
            priority: None,
            nexthops: vec![],
            nh_id: None,
            flags: 0,
        })
    }

    /// A reverse lookup that answers a local route (an AnyIP prefix such as
    /// `ip route add local 203.0.113.0/24 dev lo`) makes the kernel refuse
    /// the source as a martian, not under rp_filter (`__fib_validate_source`,
    /// net/ipv4/fib_frontend.c v6.18: res.type != RTN_UNICAST → e_inval).
    #[test]
    fn a_local_way_back_asked_afterwards_is_not_called_reverse_path() {
        let asked = asked_now(answer(RouteType::Local, LOOPBACK_IFINDEX, None));
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.asked = Some(&asked);
        assert_eq!(derive_reason(&d, &incident1(), &confs(1, 1, 0)), None);
        // The same answer as a unicast route out of lo fails strict mode.
        let asked = asked_now(answer(RouteType::Unicast, LOOPBACK_IFINDEX, None));
        d.asked = Some(&asked);
        assert_eq!(
            derive_reason(&d, &incident1(), &confs(1, 1, 0)).map(|(r, _)| r),
            Some("IP_RPFILTER")
        );
    }

    /// No route back fails any rp_filter and passes with it off
    /// (`__fib_validate_source`, net/ipv4/fib_frontend.c v6.18: last_resort).
    #[test]
    fn no_route_back_asked_afterwards_is_refused_only_with_rp_filter_on() {
        let asked = asked_now(RouteLookup::Failed {
            errno: 101,
            name: "ENETUNREACH".into(),
        });
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.reason = None;
        d.asked = Some(&asked);
        assert_eq!(
            derive_reason(&d, &incident1(), &confs(0, 2, 0)),
            Some((
                "IP_RPFILTER",
                "kernel: drop at ip_rcv_finish_core+0x25b (no reason on this kernel) while \
                 routing; rp_filter 2 on eth1 and the reverse lookup, asked now, finds no route \
                 back (derived: no return code for this packet)"
                    .to_string()
            ))
        );
        assert_eq!(derive_reason(&d, &incident1(), &confs(0, 0, 0)), None);
    }

    #[test]
    fn a_mark_left_out_of_the_asked_lookup_is_not_shown_in_it() {
        // src_valid_mark off: the kernel looks up with mark 0, and so did
        // the question asked now.
        let mut t = incident1();
        t.rules.retain(|r| r.priority != 1536);
        let asked = asked_now(answer(RouteType::Unicast, 2, Some("10.0.1.1")));
        assert_eq!(asked.0.mark, Some(0));
        let mut d = drop("IP_RPFILTER", &[], 0x80);
        d.asked = Some(&asked);
        let f = explain(&d, &t, &confs(1, 1, 0)).unwrap();
        assert_eq!(
            f.evidence,
            [
                "kernel: drop reason IP_RPFILTER at ip_rcv_finish_core+0x25b",
                "kernel, asked now through netlink as fib_validate_source asks (this drop came \
                 before kdrop armed its route-lookup probe; the retransmission carries the \
                 kernel's own): reverse lookup of 203.0.113.7 from 10.0.2.20: table main → dev \
                 eth0 via 10.0.1.1",
                "rp_filter: conf.all=1, conf.eth1=1 → effective 1 (strict: the way back must use \
                 the input interface)",
                "src_valid_mark=0: the packet's mark 0x80 does not take part in the reverse lookup",
                "policy rule that decided: 32766: from all lookup main",
                "route in table main: default via 10.0.1.1 dev eth0",
            ]
        );
    }

    /// The packet's own route lookups (the sender's output lookup from lo
    /// when it missed the local table, this namespace's input lookup on
    /// eth1) come with the reverse ones and say nothing of the way back.
    #[test]
    fn the_packets_forward_lookups_are_not_the_way_back() {
        let forward = |table, err, iif, res| Lookup {
            iif,
            src: ip("203.0.113.7"),
            dst: ip("10.0.2.20"),
            ..lookup_ev(table, err, res, None, 0x80)
        };
        let reverse = [
            lookup_ev(255, -11, 0, None, 0x80),
            lookup_ev(254, 0, 2, Some("10.0.1.1"), 0x80),
        ];
        let mut all = vec![
            forward(255, -11, LOOPBACK_IFINDEX, 0),
            forward(255, 0, 3, 3),
        ];
        all.extend(reverse.iter().cloned());
        let f = explain(
            &drop("IP_RPFILTER", &all, 0x80),
            &incident1(),
            &confs(1, 1, 1),
        )
        .unwrap();
        assert_eq!(
            f.evidence[1],
            "kernel: reverse lookup of 203.0.113.7 (from 10.0.2.20, mark 0x80): table local: \
             no match; table main → dev eth0 via 10.0.1.1"
        );
        let only_reverse = explain(
            &drop("IP_RPFILTER", &reverse, 0x80),
            &incident1(),
            &confs(1, 1, 1),
        );
        assert_eq!(Some(f), only_reverse);
    }

    /// A forwarded packet's source check looks up the way back from the
    /// forward route's output device, not from loopback (`__mkroute_input`,
    /// net/ipv4/route.c v6.18): those lookups are the kernel's evidence, and
    /// a swapped lookup from any other device (a reply's) is not.
    #[test]
    fn a_forwarded_packets_reverse_lookup_comes_from_its_output_device() {
        let mut t = incident1();
        t.links.push(link(4, "eth2"));
        t.routes.push(route(254, Some(("10.0.3.0", 24)), None, 4));
        let forward = |table, err, res| Lookup {
            iif: 3,
            src: ip("203.0.113.7"),
            dst: ip("10.0.3.5"),
            ..lookup_ev(table, err, res, None, 0)
        };
        let reverse = |iif, table, err, res, gw| Lookup {
            iif,
            src: ip("10.0.3.5"),
            ..lookup_ev(table, err, res, gw, 0)
        };
        let fib = [
            forward(255, -11, 0),
            forward(254, 0, 4),
            reverse(4, 255, -11, 0, None),
            reverse(4, 254, 0, 2, Some("10.0.1.1")),
        ];
        let mut d = drop("IP_RPFILTER", &fib, 0);
        d.dst = ip("10.0.3.5");
        let f = explain(&d, &t, &confs(1, 1, 1)).unwrap();
        assert_eq!(
            f.evidence[1],
            "kernel: reverse lookup of 203.0.113.7 (from 10.0.3.5): table local: no match; \
             table main → dev eth0 via 10.0.1.1"
        );
        let from_eth0: Vec<Lookup> = fib
            .iter()
            .map(|l| Lookup {
                iif: if l.src == d.dst { 2 } else { l.iif },
                ..l.clone()
            })
            .collect();
        let d = RouteDrop {
            fib: &from_eth0,
            ..d
        };
        let f = explain(&d, &t, &confs(1, 1, 1)).unwrap();
        assert!(
            !f.evidence
                .iter()
                .any(|l| l.starts_with("kernel: reverse lookup")),
            "{:?}",
            f.evidence
        );
    }

    /// A packet to this host is checked from loopback, though its local
    /// route names a device: a swapped lookup from that device is not its
    /// way back.
    #[test]
    fn a_local_deliverys_reverse_lookup_comes_from_loopback_only() {
        let local = Lookup {
            iif: 3,
            src: ip("203.0.113.7"),
            dst: ip("10.0.2.20"),
            ..lookup_ev(255, 0, 3, None, 0)
        };
        let from_eth1 = Lookup {
            iif: 3,
            ..lookup_ev(254, 0, 3, None, 0)
        };
        let fib = [local, from_eth1, lookup_ev(254, 0, 2, Some("10.0.1.1"), 0)];
        let f = explain(&drop("IP_RPFILTER", &fib, 0), &incident1(), &confs(1, 1, 1)).unwrap();
        assert_eq!(
            f.evidence[1],
            "kernel: reverse lookup of 203.0.113.7 (from 10.0.2.20): table main → dev eth0 via \
             10.0.1.1"
        );
    }

    /// Strict mode passes when any next hop of a multipath way back is the
    /// input device (`fib_info_nh_uses_dev`, net/ipv4/fib_frontend.c v6.18),
    /// so every one is named, not only the first.
    #[test]
    fn a_multipath_way_back_asked_afterwards_names_every_next_hop() {
        let mut t = incident1();
        t.links.push(link(4, "eth2"));
        let hop = |oif, gw: &str| RouteNextHop {
            oif,
            gateway: Some(gw.parse().unwrap()),
            flags: 0,
        };
        let mut multipath = answer(RouteType::Unicast, 2, None);
        if let RouteLookup::Found(a) = &mut multipath {
            a.nexthops = vec![hop(2, "10.0.1.1"), hop(4, "10.0.4.1")];
        }
        let asked = asked_now(multipath);
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.asked = Some(&asked);
        let f = explain(&d, &t, &confs(1, 1, 0)).unwrap();
        assert_eq!(f.cause, "rp_filter_strict");
        assert_eq!(
            f.evidence[1],
            "kernel, asked now through netlink as fib_validate_source asks (this drop came \
             before kdrop armed its route-lookup probe; the retransmission carries the kernel's \
             own): reverse lookup of 203.0.113.7 from 10.0.2.20: table main → dev eth0 (next \
             hops on eth0, eth2)"
        );
    }

    /// An AnyIP route (`ip route add local 203.0.113.0/24 dev lo`) makes
    /// every address in it local without one being assigned: where it lives
    /// is the device of the kernel's local answer, from the drop's own
    /// lookups or asked afterwards.
    #[test]
    fn a_local_source_lives_on_the_device_of_the_kernels_local_answer() {
        let mut t = incident1();
        let mut anyip = route(255, Some(("203.0.113.0", 24)), None, LOOPBACK_IFINDEX);
        anyip.kind = RTN_LOCAL;
        t.routes.push(anyip);
        let fib = [lookup_ev(255, 0, LOOPBACK_IFINDEX, None, 0)];
        let asked = asked_now(answer(RouteType::Local, LOOPBACK_IFINDEX, None));
        let mut d = drop("IP_LOCAL_SOURCE", &[], 0);
        d.asked = Some(&asked);
        let own = drop("IP_LOCAL_SOURCE", &fib, 0);
        for (d, lookup) in [
            (
                d,
                "kernel, asked now through netlink as fib_validate_source asks (this drop came \
                 before kdrop armed its route-lookup probe; the retransmission carries the \
                 kernel's own): reverse lookup of 203.0.113.7 from 10.0.2.20: table local → dev lo",
            ),
            (
                own,
                "kernel: reverse lookup of 203.0.113.7 (from 10.0.2.20): table local → dev lo",
            ),
        ] {
            let f = explain(&d, &t, &confs(0, 0, 0)).unwrap();
            assert_eq!(
                f.summary,
                "martian source on eth1: 203.0.113.7 is local to this host by a route, not an \
                 address: local 203.0.113.0/24 dev lo (table local)"
            );
            // No address to delete: the route is what makes it local.
            assert_eq!(
                f.fix,
                ["ip netns exec node ip route del local 203.0.113.0/24 dev lo table local"]
            );
            assert_eq!(
                f.evidence[..3],
                [
                    "kernel: drop reason IP_LOCAL_SOURCE at ip_rcv_finish_core+0x25b",
                    lookup,
                    "route in table local: local 203.0.113.0/24 dev lo",
                ]
            );
        }
    }

    /// A source local by an AnyIP route is a local source on kernels that
    /// name no reason (5.10) or name IP_INVALID_SOURCE for it, as one by an
    /// address is: the kernel's reverse lookup answers RTN_LOCAL for both.
    #[test]
    fn a_source_local_by_a_route_is_a_local_source_without_the_kernels_word() {
        let mut t = incident1();
        let mut anyip = route(255, Some(("203.0.113.0", 24)), None, LOOPBACK_IFINDEX);
        anyip.kind = RTN_LOCAL;
        t.routes.push(anyip);
        let mut d = drop("NOT_SPECIFIED", &[], 0);
        d.reason = None;
        assert_eq!(
            derive_reason(&d, &t, &confs(0, 0, 0)).map(|(r, _)| r),
            Some("IP_LOCAL_SOURCE")
        );
        d.src_check = Some(-EINVAL);
        assert_eq!(
            derive_reason(&d, &t, &confs(0, 0, 0)).map(|(r, _)| r),
            Some("IP_LOCAL_SOURCE")
        );
        let f = explain(&drop("IP_INVALID_SOURCE", &[], 0), &t, &confs(0, 0, 0)).unwrap();
        assert_eq!(f.cause, "martian_local_source");
        // A unicast route to it is no local one.
        t.routes.last_mut().unwrap().kind = RTN_UNICAST;
        d.src_check = None;
        assert_eq!(derive_reason(&d, &t, &confs(0, 0, 0)), None);
    }

    /// v6.18 names IP_INVALID_SOURCE for a source that is multicast,
    /// limited broadcast or 0.0.0.0 (net/ipv4/route.c `ip_route_input_slow`)
    /// or whose reverse lookup ends on a route neither unicast nor local
    /// (net/ipv4/fib_frontend.c `__fib_validate_source`): the reason's own
    /// text says that. Only one of this host's addresses is a local-source
    /// martian, whatever the kernel called it.
    #[test]
    fn an_invalid_source_is_explained_here_only_when_it_is_a_local_address() {
        let mut d = drop("IP_INVALID_SOURCE", &[], 0);
        d.src = ip("10.0.2.255");
        assert_eq!(explain(&d, &incident1(), &confs(0, 0, 0)), None);
        let mut t = incident1();
        t.links.push(link(4, "kube-ipvs0"));
        t.addrs.push(Addr {
            index: 4,
            addr: "203.0.113.7".parse().unwrap(),
            prefix_len: 32,
            label: None,
        });
        let f = explain(&drop("IP_INVALID_SOURCE", &[], 0), &t, &confs(0, 0, 0)).unwrap();
        assert_eq!(f.cause, "martian_local_source");
        assert_eq!(
            f.summary,
            "martian source on eth1: 203.0.113.7 is a local address of this host (local table, \
             on dev kube-ipvs0)"
        );
    }
}
