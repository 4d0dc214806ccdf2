//! Forwarding failures on a router between a client and a server: no route
//! for the server (IP_INNOROUTES) and a next hop that never answers ARP
//! (NEIGH_FAILED), traced with the service's port only. The router's rules
//! and routes are the oracle: the test wrote them.
use std::{
    net::{SocketAddr, TcpListener},
    os::fd::OwnedFd,
    time::Duration,
};

use integration_tests::{
    assert_kinds, connect_from, listen, ns_name, reason_for, run_fix, send_syn, veth, Kdrop, Ns,
    Record,
};
use kdrop::diagnosis::fix_kinds::Kind;

/// client (10.N.1.2) - router (10.N.1.1 on r0, 10.N.2.1 on r1) - server
/// (10.N.2.2 on s0, and the service address 10.N.3.2/32). The router has no
/// route to 10.N.3.0/24 and no default route.
struct Lab {
    client: Ns,
    router: Ns,
    server: Ns,
    net: u8,
}

impl Lab {
    fn new(test: &str, net: u8) -> Self {
        let l = Lab {
            client: Ns::new(&ns_name(&format!("{test}-c"))).unwrap(),
            router: Ns::new(&ns_name(&format!("{test}-r"))).unwrap(),
            server: Ns::new(&ns_name(&format!("{test}-s"))).unwrap(),
            net,
        };
        let mac = |last: u8| format!("02:00:00:00:{net:02x}:{last:02x}");
        veth(&l.client, "c0", &mac(1), &l.router, "r0", &mac(2)).unwrap();
        veth(&l.server, "s0", &mac(3), &l.router, "r1", &mac(4)).unwrap();
        for ns in [&l.client, &l.router, &l.server] {
            ns.sysctl("net/ipv4/conf/all/rp_filter", "0").unwrap();
            ns.sysctl("net/ipv4/conf/default/rp_filter", "0").unwrap();
        }
        l.client
            .ip(&["addr", "add", &l.addr(1, 2, 24), "dev", "c0"])
            .unwrap();
        l.client
            .ip(&["route", "add", "default", "via", &l.host(1, 1)])
            .unwrap();
        l.router
            .ip(&["addr", "add", &l.addr(1, 1, 24), "dev", "r0"])
            .unwrap();
        l.router
            .ip(&["addr", "add", &l.addr(2, 1, 24), "dev", "r1"])
            .unwrap();
        l.router.sysctl("net/ipv4/ip_forward", "1").unwrap();
        l.server
            .ip(&["addr", "add", &l.addr(2, 2, 24), "dev", "s0"])
            .unwrap();
        l.server
            .ip(&["addr", "add", &l.addr(3, 2, 32), "dev", "s0"])
            .unwrap();
        l.server
            .ip(&["route", "add", "default", "via", &l.host(2, 1)])
            .unwrap();
        l
    }

    fn host(&self, subnet: u8, last: u8) -> String {
        format!("10.{}.{subnet}.{last}", self.net)
    }

    fn addr(&self, subnet: u8, last: u8, len: u8) -> String {
        format!("{}/{len}", self.host(subnet, last))
    }

    fn service(&self, port: u16) -> SocketAddr {
        format!("{}:{port}", self.host(3, 2)).parse().unwrap()
    }

    fn client_end(&self, port: u16) -> SocketAddr {
        format!("{}:{port}", self.host(1, 2)).parse().unwrap()
    }
}

/// The first drop of the client's port on the router.
fn drop_of(k: &Kdrop, sport: u16) -> Record {
    k.expect_record_within("the router's drop", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.sport == sport
    })
}

impl Lab {
    /// Every test's start: the server listening on the service's `port`,
    /// kdrop tracing that port, the client's SYN from `sport` (its socket
    /// kept open), and the router's first drop of it.
    fn trace(&self, port: u16, sport: u16) -> (TcpListener, Kdrop, OwnedFd, Record) {
        let srv = listen(&self.server, self.service(port));
        let k = Kdrop::start(&["--json", "--port", &port.to_string()]);
        let syn = send_syn(&self.client, self.client_end(sport), self.service(port));
        let e = drop_of(&k, sport);
        (srv, k, syn, e)
    }
}

#[test]
fn no_route_names_rules_tables_and_nearest_routes() {
    let l = Lab::new("fwnr", 81);
    let (_srv, k, _syn, e) = l.trace(7081, 41081);
    assert_eq!(e.reason.as_deref(), reason_for("IP_INNOROUTES"), "{e}");
    assert_eq!(e.netns_name.as_deref(), Some(l.router.name.as_str()));
    assert_eq!(e.ifname, "r0");
    let f = e.finding();
    assert_eq!(f.cause, "no_route", "{e}");
    assert_eq!(
        f.summary,
        format!(
            "no route to 10.81.3.2 in netns {}: 10.81.1.2 -> 10.81.3.2 arriving on r0; rules 0, \
             32766, 32767 looked in tables local, main, default, and none holds a route for it",
            l.router.name
        )
    );
    let ev = f.evidence.clone();
    assert!(
        ev.contains(
            &"rule 32766: from all lookup main: table main holds nothing for 10.81.3.2".into()
        ),
        "{ev:?}"
    );
    // The router's own subnets, nearest first: 10.81.2.0/24 shares 23
    // leading bits with 10.81.3.2, 10.81.1.0/24 shares 22.
    assert!(
        ev.iter()
            .any(|l| l.starts_with("nearest routes: 10.81.2.0/24 dev r1 (table main)")),
        "{ev:?}"
    );
    assert!(
        ev.contains(&"no default route in tables local, main, default".into()),
        "{ev:?}"
    );
    // Nothing on the router says where 10.81.3.0/24 is: no command, a note.
    assert!(f.fix.is_empty(), "{f:?}");
    assert!(f.fix_notes[0].starts_with("add a route for 10.81.3.2"));
    k.stop(libc::SIGINT);
    // The note's repair, with the next hop only the test knows: the
    // finding named what was missing.
    l.router
        .ip(&["route", "add", "10.81.3.0/24", "via", &l.host(2, 2)])
        .unwrap();
    connect_from(&l.client, l.client_end(41082), l.service(7081)).expect("with the route");
}

#[test]
fn a_route_no_rule_reads_is_repaired_by_the_rule_kdrop_prints() {
    let l = Lab::new("fwrule", 82);
    // The route exists, in a table no rule sends this packet to.
    l.router
        .ip(&[
            "route",
            "add",
            "10.82.3.0/24",
            "via",
            &l.host(2, 2),
            "table",
            "100",
        ])
        .unwrap();
    let (_srv, k, _syn, e) = l.trace(7082, 41083);
    let f = e.finding();
    assert_eq!(f.cause, "no_route", "{e}");
    assert!(
        f.evidence.contains(
            &"table 100 holds 10.82.3.0/24 via 10.82.2.2 dev r1, but no rule sends this packet there"
                .into()
        ),
        "{f:?}"
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        [format!(
            "ip netns exec {} ip rule add to 10.82.3.0/24 lookup 100",
            l.router.name
        )]
    );
    k.stop(libc::SIGINT);
    assert_kinds(&fix, &[Kind::RuleAddTo]);
    for cmd in &fix {
        run_fix(cmd);
    }
    connect_from(&l.client, l.client_end(41084), l.service(7082)).expect("after the fix");
}

/// An `unreachable` policy rule ahead of main, which holds the route: the
/// kernel stops at the rule (ENETUNREACH, IP_INNOROUTES in `ip_error`), and
/// the rule is what to delete. The test wrote the rule and the route.
#[test]
fn an_unreachable_rule_ahead_of_the_route_is_named_and_deleted() {
    let l = Lab::new("fwunr", 84);
    l.router
        .ip(&["route", "add", "10.84.3.0/24", "via", &l.host(2, 2)])
        .unwrap();
    l.router
        .ip(&[
            "rule",
            "add",
            "priority",
            "100",
            "to",
            "10.84.3.0/24",
            "unreachable",
        ])
        .unwrap();
    let (_srv, k, _syn, e) = l.trace(7084, 41087);
    assert_eq!(e.reason.as_deref(), reason_for("IP_INNOROUTES"), "{e}");
    assert_eq!(e.ifname, "r0");
    let f = e.finding();
    assert_eq!(f.cause, "no_route", "{e}");
    assert_eq!(
        f.summary,
        format!(
            "no route to 10.84.3.2 in netns {}: 10.84.1.2 -> 10.84.3.2 arriving on r0; rules 0, \
             100 looked in table local, and rule 100 (from all to 10.84.3.0/24 unreachable) ends \
             the lookup before table main, which holds 10.84.3.0/24 via 10.84.2.2 dev r1",
            l.router.name
        )
    );
    let ev = f.evidence.clone();
    assert!(
        ev.contains(&"rule 100: from all to 10.84.3.0/24 unreachable: ends the lookup".into()),
        "{ev:?}"
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        [format!(
            "ip netns exec {} ip rule del priority 100 from all to 10.84.3.0/24 unreachable",
            l.router.name
        )]
    );
    k.stop(libc::SIGINT);
    assert_kinds(&fix, &[Kind::RuleDelete]);
    for cmd in &fix {
        run_fix(cmd);
    }
    connect_from(&l.client, l.client_end(41088), l.service(7084)).expect("after the fix");
}

#[test]
fn a_dead_next_hop_names_the_egress_device_the_gateway_and_its_state() {
    let l = Lab::new("fwneigh", 83);
    // 10.83.2.9 is on r1's subnet, but nobody has it.
    l.router
        .ip(&[
            "route",
            "add",
            "10.83.3.0/24",
            "via",
            &l.host(2, 9),
            "dev",
            "r1",
        ])
        .unwrap();
    // Three solicitations 100 ms apart instead of 1 s: the neighbour fails
    // (and frees its queue) within a second.
    l.router
        .sysctl("net/ipv4/neigh/r1/retrans_time_ms", "100")
        .unwrap();
    let (_srv, k, _syn, e) = l.trace(7083, 41085);
    assert_eq!(e.reason.as_deref(), reason_for("NEIGH_FAILED"), "{e}");
    assert_eq!(e.netns_name.as_deref(), Some(l.router.name.as_str()));
    let f = e.finding();
    assert_eq!(f.cause, "neighbour_failed", "{e}");
    assert_eq!(
        f.summary,
        "next hop 10.83.2.9 on r1 does not answer ARP (neighbour FAILED): 10.83.1.2 -> 10.83.3.2 \
         cannot be sent on"
    );
    let ev = f.evidence.clone();
    assert_eq!(
        ev[1],
        "the route that chose it: 10.83.3.0/24 via 10.83.2.9 dev r1 (table main)"
    );
    assert!(
        ev[2].starts_with("neighbour 10.83.2.9 dev r1: FAILED"),
        "{ev:?}"
    );
    assert!(f.fix.is_empty(), "{f:?}");
    k.stop(libc::SIGINT);
    // The oracle: with a next hop that answers, the same route works.
    l.router
        .ip(&[
            "route",
            "replace",
            "10.83.3.0/24",
            "via",
            &l.host(2, 2),
            "dev",
            "r1",
        ])
        .unwrap();
    connect_from(&l.client, l.client_end(41086), l.service(7083)).expect("via a live next hop");
}

/// A forwarded SYN refused by strict rp_filter on the router: the way back
/// to the client leaves by a second link (r2), not the one the SYN came in
/// on (r0). The kernel checks the source with the forward route's output
/// device as the input of its reverse lookup (`__mkroute_input` passes
/// `FIB_RES_OIF`, net/ipv4/route.c v6.18), and the retransmission's drop
/// carries that lookup.
#[test]
fn a_forwarded_syn_refused_by_rp_filter_carries_the_kernels_reverse_lookup() {
    let l = Lab::new("fwrpf", 85);
    veth(
        &l.client,
        "c1",
        "02:00:00:00:55:05",
        &l.router,
        "r2",
        "02:00:00:00:55:06",
    )
    .unwrap();
    l.client
        .ip(&["addr", "add", &l.addr(4, 2, 24), "dev", "c1"])
        .unwrap();
    l.router
        .ip(&["addr", "add", &l.addr(4, 1, 24), "dev", "r2"])
        .unwrap();
    l.router
        .ip(&["route", "add", "10.85.3.0/24", "via", &l.host(2, 2)])
        .unwrap();
    // Replies to the client take the second link; its SYNs come by the first.
    l.router
        .ip(&["route", "add", &l.addr(1, 2, 32), "via", &l.host(4, 2)])
        .unwrap();
    l.router.sysctl("net/ipv4/conf/r0/rp_filter", "1").unwrap();
    // The router would not answer the client's ARP either: an ARP request's
    // sender passes the same reverse-path check (`arp_process`,
    // net/ipv4/arp.c v6.18). Give the client the router's address.
    l.client
        .ip(&[
            "neigh",
            "add",
            &l.host(1, 1),
            "lladdr",
            "02:00:00:00:55:02",
            "dev",
            "c0",
            "nud",
            "permanent",
        ])
        .unwrap();
    let (_srv, k, _syn, e) = l.trace(7085, 41089);
    assert_eq!(e.reason.as_deref(), reason_for("IP_RPFILTER"), "{e}");
    assert_eq!(e.ifname, "r0");
    assert_eq!(e.finding().cause, "rp_filter_strict", "{e}");
    // The first drop arms the route-lookup probe; a retransmission (1 s,
    // 3 s, 7 s) carries the kernel's own lookup. Without custom rules the
    // kernel reads one table, main (local is merged into it,
    // `fib_lookup` in include/net/ip_fib.h, v6.18).
    let again = k.expect_record_within(
        "a retransmission's drop with the kernel's own lookup",
        Duration::from_secs(20),
        |e| {
            e.sport == 41089
                && e.finding
                    .as_ref()
                    .and_then(|f| f.evidence.get(1))
                    .is_some_and(|l| l.starts_with("kernel: "))
        },
    );
    let f = again.finding();
    assert_eq!(
        f.evidence[1],
        "kernel: reverse lookup of 10.85.1.2 (from 10.85.3.2): table main → dev r2 via 10.85.4.2",
        "{f:?}"
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        [format!(
            "ip netns exec {} sysctl -w net.ipv4.conf.r0.rp_filter=2",
            l.router.name
        )]
    );
    k.stop(libc::SIGINT);
    for cmd in &fix {
        run_fix(cmd);
    }
    connect_from(&l.client, l.client_end(41090), l.service(7085)).expect("after the fix");
}
