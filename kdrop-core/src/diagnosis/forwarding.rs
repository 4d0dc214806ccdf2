//! A packet the node could not send on: no route for its destination, or a
//! next hop that does not answer ARP. Pure: the kernel's own lookups for
//! the packet (or the same lookup asked through netlink), the namespace's
//! rules and routes and the neighbour entry in; a finding out.
//!
//! Where the kernel drops them, as of v6.18: a forwarded packet with no
//! route is IP_INNOROUTES in `ip_error` (ENETUNREACH from `fib_lookup`,
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/route.c), a
//! locally sent one IP_OUTNOROUTES in `__ip_queue_xmit`; a packet queued
//! for a neighbour whose resolution failed is NEIGH_FAILED in
//! `neigh_invalidate` (net/core/neighbour.c), with skb->dev the egress
//! device.
use crate::model::cause::Cause;
use std::net::{IpAddr, Ipv4Addr};

use super::routing::{lookup, route_text, table_name};
use crate::model::{
    finding::Finding,
    neighbour::Neighbour,
    packet::Lookup,
    routing::{RouteLookup, RouteQuery, Tables},
};

/// Drop reasons this module explains.
pub const REASONS: [&str; 3] = ["IP_INNOROUTES", "IP_OUTNOROUTES", "NEIGH_FAILED"];

/// A packet that could not be sent on, with what the kernel said.
#[derive(Clone, Debug)]
pub struct Stuck<'a> {
    pub reason: &'a str,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// The input device (0: sent by this host).
    pub iif: u32,
    pub mark: u32,
    /// The drop as evidence (reason and place).
    pub kernel: String,
    /// The kernel's lookups for this packet (fib:fib_table_lookup).
    pub fib: &'a [Lookup],
    /// The same lookup asked now through netlink, when the kernel's were
    /// not recorded (the probe is armed on demand, after the first drop).
    pub asked: Option<&'a (RouteQuery, RouteLookup)>,
    /// The entry of the next hop the route chose (NEIGH_FAILED).
    pub neighbour: Option<&'a Neighbour>,
    /// `ip netns exec NAME ` or empty.
    pub netns_exec: &'a str,
    /// The namespace as text.
    pub netns: &'a str,
}

/// The route that sends the packet on: device and next hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    pub table: Option<u32>,
    pub oif: u32,
    /// The gateway, or the destination itself on a connected route.
    pub addr: IpAddr,
    pub via_gateway: bool,
}

/// Where the packet would go: the kernel's forward lookup that answered,
/// else the lookup asked now.
pub fn next_hop(s: &Stuck) -> Option<NextHop> {
    let own = s
        .fib
        .iter()
        .rfind(|l| l.src == s.src && l.dst == s.dst && l.err == 0 && l.res_ifindex != 0)
        .map(|l| NextHop {
            table: Some(l.table),
            oif: l.res_ifindex,
            addr: l.gw.map_or(IpAddr::V4(s.dst), IpAddr::V4),
            via_gateway: l.gw.is_some(),
        });
    own.or_else(|| match s.asked {
        Some((_, RouteLookup::Found(a))) => Some(NextHop {
            table: Some(a.table),
            oif: a.oif?,
            addr: a.gateway.unwrap_or(IpAddr::V4(s.dst)),
            via_gateway: a.gateway.is_some(),
        }),
        _ => None,
    })
}

pub fn explain(s: &Stuck, t: &Tables) -> Option<Finding> {
    match s.reason {
        "IP_INNOROUTES" | "IP_OUTNOROUTES" => Some(super::no_route::finding(s, t)),
        "NEIGH_FAILED" => Some(neighbour_failed(s, t)),
        _ => None,
    }
}

/// The next hop that does not answer and the device it is on; `None`
/// when neither the kernel's lookup nor one asked now says.
fn silent_hop(s: &Stuck, t: &Tables) -> Option<(NextHop, String)> {
    let hop = next_hop(s)?;
    let dev = t.link_name(hop.oif);
    Some((hop, dev))
}

fn neighbour_failed(s: &Stuck, t: &Tables) -> Finding {
    let ns = s.netns_exec;
    let hop = silent_hop(s, t);
    let (summary, notes) = match &hop {
        Some((h, dev)) => silent_words(s, h, dev),
        None => (
            format!("the next hop for {} does not answer ARP", s.dst),
            vec![],
        ),
    };
    let mut inspect = vec![format!("{ns}ip route get {} from {}", s.dst, s.src)];
    if let Some((h, dev)) = &hop {
        inspect.insert(0, format!("{ns}ip neigh show dev {dev} to {}", h.addr));
    }
    Finding {
        cause: Cause::NeighbourFailed,
        summary,
        evidence: neighbour_evidence(s, t, hop.as_ref().map(|(h, _)| h)),
        fix_notes: notes,
        inspect,
        ..Finding::default()
    }
}

/// The kernel's line, the route that chose the next hop, its neighbour
/// entry (or that none is left).
fn neighbour_evidence(s: &Stuck, t: &Tables, hop: Option<&NextHop>) -> Vec<String> {
    let mut evidence = vec![s.kernel.clone()];
    let route = hop.and_then(|h| {
        let table = h.table?;
        lookup(&t.routes, table, s.dst).map(|r| (table, r))
    });
    if let Some((table, r)) = route {
        evidence.push(format!(
            "the route that chose it: {} (table {})",
            route_text(r, t),
            table_name(table)
        ));
    }
    evidence.push(match s.neighbour {
        Some(n) => format!(
            "neighbour {} dev {}: {}{}",
            n.dst,
            n.dev,
            n.state_text(),
            n.probes
                .map(|p| format!(", {p} solicitations unanswered"))
                .unwrap_or_default()
        ),
        None => "no neighbour entry is left for it (the failed one was garbage-collected)".into(),
    });
    evidence
}

/// Summary and notes for a next hop on `dev` that does not answer: a
/// gateway, or the destination on a connected route.
fn silent_words(s: &Stuck, h: &NextHop, dev: &str) -> (String, Vec<String>) {
    let ns = s.netns_exec;
    let state = s
        .neighbour
        .map(|n| format!(" (neighbour {})", n.state_text()))
        .unwrap_or_default();
    if h.via_gateway {
        (
            format!(
                "next hop {} on {dev} does not answer ARP{state}: {} -> {} cannot be sent on",
                h.addr, s.src, s.dst
            ),
            vec![format!(
                "{} is down or not on {dev}'s segment: bring it back, or route {} through a next \
                 hop that answers (`{ns}ip route replace <prefix> via <next hop> dev <device>`)",
                h.addr, s.dst
            )],
        )
    } else {
        (
            format!(
                "{} does not answer ARP on {dev}{state}: it is on {dev}'s subnet (no gateway), and \
                 no host answers for it",
                h.addr
            ),
            vec![format!(
                "{} is down or not on the segment of {dev}; if it moved, the route or address of \
                 {dev} is stale",
                h.addr
            )],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::routing::tests::{link, route, rule};
    use crate::model::routing::{RouteAnswer, RouteType};

    fn tables() -> Tables {
        Tables {
            links: vec![link(1, "lo"), link(2, "eth0"), link(3, "ens6")],
            addrs: vec![],
            routes: vec![
                route(254, Some(("10.0.0.0", 24)), None, 2),
                route(254, Some(("10.123.0.0", 16)), Some("10.123.2.3"), 3),
                route(100, Some(("10.50.0.0", 16)), Some("10.0.0.1"), 2),
            ],
            rules: vec![rule(0, 255), rule(32766, 254), rule(32767, 253)],
            rules6: vec![],
            routes6: vec![],
        }
    }

    fn stuck<'a>(reason: &'a str, dst: &str, fib: &'a [Lookup]) -> Stuck<'a> {
        Stuck {
            reason,
            src: "10.0.0.7".parse().unwrap(),
            dst: dst.parse().unwrap(),
            iif: 2,
            mark: 0,
            kernel: format!("kernel drop reason {reason} at ip_error+0x1"),
            fib,
            asked: None,
            neighbour: None,
            netns_exec: "ip netns exec node ",
            netns: "node",
        }
    }

    #[test]
    fn no_route_names_the_rules_the_tables_and_the_nearest_routes() {
        let t = tables();
        let f = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &[]), &t).unwrap();
        assert_eq!(f.cause, "no_route");
        assert_eq!(
            f.summary,
            "no route to 10.99.0.5 in netns node: 10.0.0.7 -> 10.99.0.5 arriving on eth0; rules \
             0, 32766, 32767 looked in tables local, main, default, and none holds a route for it"
        );
        assert_eq!(
            f.evidence[1..4],
            [
                "rule 0: from all lookup local: table local holds nothing for 10.99.0.5",
                "rule 32766: from all lookup main: table main holds nothing for 10.99.0.5",
                "rule 32767: from all lookup default: table default holds nothing for 10.99.0.5",
            ]
        );
        // 10.99.0.5 shares 9 bits with 10.123.0.0 (0x63 vs 0x7b), 8 with 10.0.0.0.
        assert_eq!(
            f.evidence[4],
            "nearest routes: 10.123.0.0/16 via 10.123.2.3 dev ens6 (table main); 10.0.0.0/24 dev eth0 (table main)"
        );
        assert_eq!(
            f.evidence[5],
            "no default route in tables local, main, default"
        );
        // Nothing on the node knows the next hop: no fix, a note.
        assert!(f.fix.is_empty());
        assert!(f.fix_notes[0].starts_with("add a route for 10.99.0.5"));
        assert_eq!(
            f.inspect[0],
            "ip netns exec node ip route get 10.99.0.5 from 10.0.0.7 iif eth0"
        );
    }

    #[test]
    fn a_route_in_a_table_no_rule_reads_is_repaired_by_a_rule() {
        let t = tables();
        let f = explain(&stuck("IP_INNOROUTES", "10.50.1.1", &[]), &t).unwrap();
        assert_eq!(
            f.evidence.last().unwrap(),
            "table 100 holds 10.50.0.0/16 via 10.0.0.1 dev eth0, but no rule sends this packet there"
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node ip rule add to 10.50.0.0/16 lookup 100"]
        );
    }

    #[test]
    fn the_kernels_own_lookups_are_the_evidence_when_it_recorded_them() {
        let t = tables();
        let l = |table, err| Lookup {
            ts_ns: 1,
            table,
            err,
            iif: 2,
            oif: 0,
            mark: 0,
            src: "10.0.0.7".parse().unwrap(),
            dst: "10.99.0.5".parse().unwrap(),
            res_ifindex: 0,
            gw: None,
            scope: 0,
        };
        let fib = [l(255, -11), l(254, -11), l(253, -11)];
        let f = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &fib), &t).unwrap();
        assert_eq!(
            f.evidence[1],
            "the kernel's lookups for 10.0.0.7 -> 10.99.0.5: table local found nothing, table main \
             found nothing, table default found nothing"
        );
    }

    /// The silent hop's facts: the gateway the kernel chose, its device.
    #[test]
    fn the_silent_hop_is_the_gateway_on_its_device() {
        let t = tables();
        let fib = [Lookup {
            ts_ns: 1,
            table: 254,
            err: 0,
            iif: 2,
            oif: 0,
            mark: 0,
            src: "10.0.0.7".parse().unwrap(),
            dst: "10.123.9.9".parse().unwrap(),
            res_ifindex: 3,
            gw: Some("10.123.2.3".parse().unwrap()),
            scope: 0,
        }];
        let s = stuck("NEIGH_FAILED", "10.123.9.9", &fib);
        let (hop, dev) = silent_hop(&s, &t).unwrap();
        assert!(hop.via_gateway);
        assert_eq!(hop.addr, "10.123.2.3".parse::<IpAddr>().unwrap());
        assert_eq!(dev, "ens6");
    }

    #[test]
    fn a_dead_next_hop_names_the_egress_device_the_gateway_and_its_route() {
        let t = tables();
        let fib = [Lookup {
            ts_ns: 1,
            table: 254,
            err: 0,
            iif: 2,
            oif: 0,
            mark: 0,
            src: "10.0.0.7".parse().unwrap(),
            dst: "10.123.9.9".parse().unwrap(),
            res_ifindex: 3,
            gw: Some("10.123.2.3".parse().unwrap()),
            scope: 0,
        }];
        let n = Neighbour {
            dst: "10.123.2.3".parse().unwrap(),
            ifindex: 3,
            dev: "ens6".into(),
            state: crate::model::neighbour::NUD_FAILED,
            lladdr: None,
            router: false,
            probes: Some(6),
        };
        let mut s = stuck("NEIGH_FAILED", "10.123.9.9", &fib);
        assert_eq!(
            next_hop(&s),
            Some(NextHop {
                table: Some(254),
                oif: 3,
                addr: "10.123.2.3".parse().unwrap(),
                via_gateway: true
            })
        );
        s.neighbour = Some(&n);
        let f = explain(&s, &t).unwrap();
        assert_eq!(f.cause, "neighbour_failed");
        assert_eq!(
            f.summary,
            "next hop 10.123.2.3 on ens6 does not answer ARP (neighbour FAILED): 10.0.0.7 -> \
             10.123.9.9 cannot be sent on"
        );
        assert_eq!(
            f.evidence[1],
            "the route that chose it: 10.123.0.0/16 via 10.123.2.3 dev ens6 (table main)"
        );
        assert_eq!(
            f.evidence[2],
            "neighbour 10.123.2.3 dev ens6: FAILED, 6 solicitations unanswered"
        );
        assert!(f.fix.is_empty());
        assert_eq!(
            f.inspect[0],
            "ip netns exec node ip neigh show dev ens6 to 10.123.2.3"
        );
    }

    /// A `fib:fib_table_lookup` record: `src -> dst` looked up in `table`.
    fn fib(
        src: &str,
        dst: &str,
        table: u32,
        err: i32,
        res_ifindex: u32,
        gw: Option<&str>,
    ) -> Lookup {
        Lookup {
            ts_ns: 1,
            table,
            err,
            iif: 2,
            oif: 0,
            mark: 0,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            res_ifindex,
            gw: gw.map(|g| g.parse().unwrap()),
            scope: 0,
        }
    }

    /// `ip route get DST from 10.0.0.7 iif eth0` answered with a unicast
    /// route of table main through `oif`.
    fn asked(dst: &str, oif: u32, gateway: Option<&str>) -> (RouteQuery, RouteLookup) {
        let q = RouteQuery {
            src: Some("10.0.0.7".parse().unwrap()),
            iif: Some(2),
            ..RouteQuery::get(dst.parse().unwrap())
        };
        let a = RouteAnswer {
            family: 2,
            table: 254,
            kind: RouteType::Unicast,
            scope: 0,
            dst: Some(dst.parse().unwrap()),
            dst_len: 32,
            oif: Some(oif),
            gateway: gateway.map(|g| g.parse().unwrap()),
            prefsrc: None,
            priority: None,
            nexthops: vec![],
            nh_id: None,
            flags: 0,
        };
        (q, RouteLookup::Found(a))
    }

    fn via_ens6() -> NextHop {
        NextHop {
            table: Some(254),
            oif: 3,
            addr: "10.123.2.3".parse().unwrap(),
            via_gateway: true,
        }
    }

    /// The fib ring holds every packet's lookups: one the same host sent to
    /// another destination, answered later, is not where this one went.
    #[test]
    fn another_flows_lookup_is_not_this_packets_next_hop() {
        let fib = [
            fib("10.0.0.7", "10.123.9.9", 254, 0, 3, Some("10.123.2.3")),
            fib("10.0.0.7", "10.0.0.9", 254, 0, 2, None),
        ];
        let s = stuck("NEIGH_FAILED", "10.123.9.9", &fib);
        assert_eq!(next_hop(&s), Some(via_ens6()));
    }

    /// A later packet of the flow found nothing (its route went away while
    /// the neighbour was being resolved): the lookup that matched sent it.
    #[test]
    fn a_lookup_that_found_nothing_is_not_the_next_hop() {
        let fib = [
            fib("10.0.0.7", "10.123.9.9", 255, -11, 0, None),
            fib("10.0.0.7", "10.123.9.9", 254, 0, 3, Some("10.123.2.3")),
            fib("10.0.0.7", "10.123.9.9", 255, -11, 0, None),
            fib("10.0.0.7", "10.123.9.9", 254, -11, 0, None),
            fib("10.0.0.7", "10.123.9.9", 253, -11, 0, None),
        ];
        let s = stuck("NEIGH_FAILED", "10.123.9.9", &fib);
        assert_eq!(next_hop(&s), Some(via_ens6()));
    }

    /// With no lookup recorded, the route the kernel answers now decides;
    /// on a connected route the next hop is the destination itself.
    #[test]
    fn a_connected_destination_asked_through_netlink_is_its_own_next_hop() {
        let t = tables();
        let answer = asked("10.0.0.9", 2, None);
        let mut s = stuck("NEIGH_FAILED", "10.0.0.9", &[]);
        s.asked = Some(&answer);
        assert_eq!(
            next_hop(&s),
            Some(NextHop {
                table: Some(254),
                oif: 2,
                addr: "10.0.0.9".parse().unwrap(),
                via_gateway: false
            })
        );
        let f = explain(&s, &t).unwrap();
        assert_eq!(f.cause, "neighbour_failed");
        assert_eq!(
            f.summary,
            "10.0.0.9 does not answer ARP on eth0: it is on eth0's subnet (no gateway), and no \
             host answers for it"
        );
        assert_eq!(
            f.evidence,
            [
                "kernel drop reason NEIGH_FAILED at ip_error+0x1",
                "the route that chose it: 10.0.0.0/24 dev eth0 (table main)",
                "no neighbour entry is left for it (the failed one was garbage-collected)",
            ]
        );
        assert!(f.fix.is_empty());
        assert_eq!(
            f.fix_notes,
            ["10.0.0.9 is down or not on the segment of eth0; if it moved, the route or address \
              of eth0 is stale"]
        );
        assert_eq!(
            f.inspect,
            [
                "ip netns exec node ip neigh show dev eth0 to 10.0.0.9",
                "ip netns exec node ip route get 10.0.0.9 from 10.0.0.7",
            ]
        );
    }

    /// The answer's gateway is the next hop that must answer ARP, and the
    /// note says to bring it back or route around it.
    #[test]
    fn a_gateway_asked_through_netlink_is_the_next_hop_to_bring_back() {
        let t = tables();
        let answer = asked("10.123.9.9", 3, Some("10.123.2.3"));
        let mut s = stuck("NEIGH_FAILED", "10.123.9.9", &[]);
        s.asked = Some(&answer);
        assert_eq!(next_hop(&s), Some(via_ens6()));
        let f = explain(&s, &t).unwrap();
        assert_eq!(
            f.summary,
            "next hop 10.123.2.3 on ens6 does not answer ARP: 10.0.0.7 -> 10.123.9.9 cannot be \
             sent on"
        );
        assert_eq!(
            f.fix_notes,
            [
                "10.123.2.3 is down or not on ens6's segment: bring it back, or route 10.123.9.9 \
              through a next hop that answers (`ip netns exec node ip route replace <prefix> via \
              <next hop> dev <device>`)"
            ]
        );
    }

    /// A rule for other sources is not one this packet walks.
    #[test]
    fn a_rule_that_does_not_match_the_packet_is_not_walked() {
        let mut t = tables();
        let mut other = rule(100, 100);
        other.src = Some(("192.168.0.0".parse().unwrap(), 16));
        t.rules.push(other);
        let f = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &[]), &t).unwrap();
        assert_eq!(
            f.summary,
            "no route to 10.99.0.5 in netns node: 10.0.0.7 -> 10.99.0.5 arriving on eth0; rules \
             0, 32766, 32767 looked in tables local, main, default, and none holds a route for it"
        );
    }

    /// Only this packet's lookups are its evidence, not those of another
    /// flow from the same source.
    #[test]
    fn lookups_of_another_flow_are_not_the_packets_evidence() {
        let t = tables();
        let fib = [
            fib("10.0.0.7", "10.99.0.5", 255, -11, 0, None),
            fib("10.0.0.7", "10.0.0.9", 254, 0, 2, None),
            fib("10.0.0.7", "10.99.0.5", 254, -11, 0, None),
            fib("10.0.0.7", "10.99.0.5", 253, -11, 0, None),
        ];
        let f = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &fib), &t).unwrap();
        assert_eq!(
            f.evidence[1],
            "the kernel's lookups for 10.0.0.7 -> 10.99.0.5: table local found nothing, table main \
             found nothing, table default found nothing"
        );
    }

    /// `ip rule add to 10.123.0.0/16 unreachable` ends the lookup with
    /// ENETUNREACH ahead of main, which holds a route and a default: the
    /// rules after it are never read, and deleting it is the repair.
    fn unreachable_rule(t: &mut Tables) {
        let mut unreachable = rule(100, 0);
        unreachable.action = 7;
        unreachable.dst = Some(("10.123.0.0".parse().unwrap(), 16));
        t.rules.push(unreachable);
    }

    #[test]
    fn an_unreachable_rule_ahead_of_a_table_that_holds_the_route() {
        let mut t = tables();
        t.routes.push(route(254, None, Some("10.0.0.1"), 2));
        unreachable_rule(&mut t);
        let f = explain(&stuck("IP_INNOROUTES", "10.123.9.9", &[]), &t).unwrap();
        assert_eq!(
            f.summary,
            "no route to 10.123.9.9 in netns node: 10.0.0.7 -> 10.123.9.9 arriving on eth0; rules \
             0, 100 looked in table local, and rule 100 (from all to 10.123.0.0/16 unreachable) \
             ends the lookup before table main, which holds 10.123.0.0/16 via 10.123.2.3 dev ens6"
        );
        // No nearest routes (local holds none) and no word on default
        // routes: main's would not be read either.
        assert_eq!(
            f.evidence,
            [
                "kernel drop reason IP_INNOROUTES at ip_error+0x1",
                "rule 0: from all lookup local: table local holds nothing for 10.123.9.9",
                "rule 100: from all to 10.123.0.0/16 unreachable: ends the lookup",
                "rule 32766: from all lookup main, after it, holds 10.123.0.0/16 via 10.123.2.3 \
                 dev ens6: the lookup never reads it",
            ]
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node ip rule del priority 100 from all to 10.123.0.0/16 unreachable"]
        );
        assert_eq!(
            f.fix_notes,
            [
                "rule 100 may be a policy that keeps this traffic out; delete it only if \
                 10.123.9.9 should be reached from here"
            ]
        );
    }

    /// Deleting the rule would not help when no table after it holds a
    /// route either: the note to add one stays, and the summary says both.
    #[test]
    fn an_unreachable_rule_ahead_of_tables_that_hold_nothing_is_no_repair() {
        let mut t = tables();
        unreachable_rule(&mut t);
        t.routes.retain(|r| r.dst_len != 16);
        let f = explain(&stuck("IP_INNOROUTES", "10.123.9.9", &[]), &t).unwrap();
        assert!(
            f.summary.ends_with(
                "rules 0, 100 looked in table local, and rule 100 (from all to 10.123.0.0/16 \
                 unreachable) ends the lookup; no table after it holds a route for it either"
            ),
            "{}",
            f.summary
        );
        assert!(f.fix.is_empty());
        assert!(f.fix_notes[0].starts_with("add a route for 10.123.9.9"));
        assert_eq!(f.evidence.len(), 3, "{:?}", f.evidence);
    }

    /// A rule that ends the lookup for other destinations is walked past:
    /// the packet's lookup reads every table as before.
    #[test]
    fn an_unreachable_rule_for_another_destination_changes_nothing() {
        let mut t = tables();
        unreachable_rule(&mut t);
        let with = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &[]), &t).unwrap();
        let without = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &[]), &tables()).unwrap();
        assert_eq!(with, without);
    }

    /// Blackhole and prohibit end the lookup too (their drops carry no
    /// reason, but a lookup asked through netlink meets them).
    #[test]
    fn blackhole_and_prohibit_rules_end_the_lookup_as_well() {
        for (action, word) in [(6, "blackhole"), (8, "prohibit")] {
            let mut t = tables();
            unreachable_rule(&mut t);
            t.rules.last_mut().unwrap().action = action;
            let f = explain(&stuck("IP_INNOROUTES", "10.123.9.9", &[]), &t).unwrap();
            assert_eq!(
                f.fix,
                [format!(
                    "ip netns exec node ip rule del priority 100 from all to 10.123.0.0/16 {word}"
                )]
            );
        }
        // A nop does not: no rule ends the walk, so no rule is to blame.
        let mut t = tables();
        unreachable_rule(&mut t);
        t.rules.last_mut().unwrap().action = 3;
        let f = explain(&stuck("IP_INNOROUTES", "10.123.9.9", &[]), &t).unwrap();
        assert!(f.fix.is_empty() && f.summary.ends_with("and none holds a route for it"));
    }

    /// A default route in a table the lookup read is no missing default
    /// (the lookup, asked now, may still fail: the route's next hop).
    #[test]
    fn a_default_route_in_a_table_read_is_not_reported_missing() {
        let mut t = tables();
        t.routes.push(route(253, None, Some("10.0.0.1"), 2));
        let f = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &[]), &t).unwrap();
        assert!(
            !f.evidence.iter().any(|l| l.starts_with("no default route")),
            "{:?}",
            f.evidence
        );
    }

    /// A default route in a table no rule reads is no default for the
    /// packet; it is the route a rule to the destination would reach.
    #[test]
    fn a_default_route_in_a_table_no_rule_reads_is_not_the_packets_default() {
        let mut t = tables();
        t.routes.push(route(100, None, Some("10.0.0.1"), 2));
        let f = explain(&stuck("IP_INNOROUTES", "10.99.0.5", &[]), &t).unwrap();
        assert_eq!(
            f.evidence[4..],
            [
                "nearest routes: 10.123.0.0/16 via 10.123.2.3 dev ens6 (table main); 10.0.0.0/24 \
                 dev eth0 (table main)",
                "no default route in tables local, main, default",
                "table 100 holds default via 10.0.0.1 dev eth0, but no rule sends this packet there",
            ]
        );
        assert_eq!(
            f.fix,
            ["ip netns exec node ip rule add to 10.99.0.5/32 lookup 100"]
        );
        assert_eq!(
            f.fix_notes,
            [
                "the rule sends every packet to 10.99.0.5/32 to table 100; narrow it (from, iif, \
              fwmark) if only some should go there"
            ]
        );
    }
}
