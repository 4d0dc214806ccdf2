//! IPv6 reverse-path drops by netfilter, traced with only the service's
//! port: an ip6tables `-m rpfilter --invert -j DROP` in raw PREROUTING
//! (firewalld's default) and an nft `fib saddr . iif oif missing drop`.
//! The client's address (fd00:161:9::1) reaches the node on eth1, but the
//! node's only way back to it is its default route out of eth0: the strict
//! check fails. kdrop must name the rule, the way back (eth0, table main,
//! the rule that chose it) and a policy route through eth1 that, applied as
//! printed, lets a new connection through. The topology is the oracle.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use integration_tests::{
    assert_kinds, connect_from, connect_within, handshake, ip6, kernel_reason, listen, ns_name,
    run_fix, send_syn, veth, wait_retransmitted, Kdrop, Ns, Record,
};
use kdrop::diagnosis::fix_kinds::Kind;

const PORT: u16 = 8443;
const CLIENT: &str = "fd00:161:9::1";
const SERVER: &str = "fd00:161:1::2";

/// `dev`'s link-local address in `ns`, as the kernel gave it: the address
/// a router's neighbour solicitations come from (`ndisc_send_ns` takes the
/// link-local one when the packet waiting is not its own,
/// net/ipv6/ndisc.c v6.18), so the one the node's entry for it has.
fn link_local(ns: &Ns, dev: &str) -> String {
    let out = std::process::Command::new("ip")
        .args([
            "-n", &ns.name, "-6", "-o", "addr", "show", "dev", dev, "scope", "link",
        ])
        .output()
        .expect("running ip");
    let text = String::from_utf8_lossy(&out.stdout);
    // `4: r1    inet6 fe80::ff:fe00:e803/64 scope link ...`
    let addr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .unwrap_or_else(|| panic!("no link-local address on {dev}: {text}"));
    addr.split('/').next().unwrap().to_string()
}

/// The client on the node's eth1, a gateway on its eth0 (the default
/// route). The client's neighbour entry for the node is static: its
/// neighbour solicitations come from fd00:161:9::1 and the check would drop
/// them too, so the SYN would never leave. So is the node's entry for the
/// client, which a client on the link leaves there when it resolves the
/// node: it tells kdrop that the SYN's sender is the client itself, on
/// eth1's link (the repair route is on-link).
struct Lab {
    client: Ns,
    node: Ns,
    _gw: Ns,
}

fn lab(test: &str) -> Lab {
    let client = Ns::new(&ns_name(&format!("{test}-c"))).unwrap();
    let node = Ns::new(&ns_name(&format!("{test}-n"))).unwrap();
    let gw = Ns::new(&ns_name(&format!("{test}-g"))).unwrap();
    veth(
        &client,
        "c0",
        "02:00:00:00:81:01",
        &node,
        "eth1",
        "02:00:00:00:81:02",
    )
    .unwrap();
    veth(
        &gw,
        "g0",
        "02:00:00:00:81:03",
        &node,
        "eth0",
        "02:00:00:00:81:04",
    )
    .unwrap();
    ip6(&client, "addr add fd00:161:1::1/64 dev c0 nodad");
    ip6(&client, &format!("addr add {CLIENT}/128 dev c0 nodad"));
    ip6(
        &client,
        &format!("neigh replace {SERVER} lladdr 02:00:00:00:81:02 dev c0 nud permanent"),
    );
    ip6(&node, &format!("addr add {SERVER}/64 dev eth1 nodad"));
    ip6(
        &node,
        &format!("neigh replace {CLIENT} lladdr 02:00:00:00:81:01 dev eth1 nud permanent"),
    );
    ip6(&node, "addr add fd00:161:2::2/64 dev eth0 nodad");
    ip6(&node, "route add default via fd00:161:2::1 dev eth0");
    ip6(&gw, "addr add fd00:161:2::1/64 dev g0 nodad");
    Lab {
        client,
        node,
        _gw: gw,
    }
}

/// The dropped SYN's socket, still retransmitting, and when it was sent.
type Syn = (std::os::fd::OwnedFd, Instant);

/// The drop of the client's SYN, with its finding.
fn traced_drop(l: &Lab, sport: u16) -> (Record, Syn) {
    let k = Kdrop::start(&["--json", "--port", &PORT.to_string()]);
    let src: SocketAddr = format!("[{CLIENT}]:{sport}").parse().unwrap();
    let dst: SocketAddr = format!("[{SERVER}]:{PORT}").parse().unwrap();
    let sent = Instant::now();
    let syn = send_syn(&l.client, src, dst);
    let e = k.expect_record_within("the SYN's drop", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.saddr == CLIENT && e.sport == sport
    });
    k.stop(libc::SIGINT);
    assert_eq!(e.reason.as_deref(), kernel_reason("NETFILTER_DROP"), "{e}");
    assert_eq!(e.ifname, "eth1", "{e}");
    (e, (syn, sent))
}

/// What both rules share: the way back, the rule that chose it, the fix.
fn check_way_back(e: &Record, l: &Lab, asked: &str) {
    let f = e.finding();
    assert_eq!(f.cause, "rpfilter6", "{e}");
    let ns = format!("ip netns exec {} ", l.node.name);
    let ev = f.evidence.clone();
    assert!(
        ev.contains(&format!(
            "reverse lookup as the rule makes it (strict): `{ns}ip -6 route get {CLIENT} from \
             {SERVER}{asked}` answers default via fd00:161:2::1 dev eth0 table main"
        )),
        "{ev:#?}"
    );
    assert!(
        ev.contains(&"policy rule that decided: 32766: from all lookup main".to_string()),
        "{ev:#?}"
    );
    assert!(
        ev.contains(&format!(
            "the packet came from 02:00:00:00:81:01 = {CLIENT} on eth1: the client itself, on \
             eth1's link"
        )),
        "{ev:#?}"
    );
    // The node has no IPv6 rule of its own: table 100 is free.
    assert_eq!(
        f.fix,
        [
            format!("{ns}ip -6 route add {CLIENT}/128 dev eth1 table 100"),
            format!("{ns}ip -6 rule add from {SERVER} to {CLIENT}/128 lookup 100 priority 32765"),
        ]
    );
}

/// The route and the rule, applied; then a new connection (the next port).
fn fix_then_connect(e: &Record, l: &Lab, syn: Syn, sport: u16) {
    let f = e.finding();
    assert_kinds(&f.fix, &[Kind::Rpfilter6Route, Kind::Rpfilter6Rule]);
    handshake::fix_then_connect(
        f,
        &l.client,
        syn.0,
        format!("[{CLIENT}]:{}", sport + 1).parse().unwrap(),
        format!("[{SERVER}]:{PORT}").parse().unwrap(),
    );
}

#[test]
fn ip6tables_rpfilter_strict() {
    let l = lab("rpf6i");
    l.node
        .exec(
            "ip6tables",
            &[
                "-t",
                "raw",
                "-A",
                "PREROUTING",
                "-m",
                "rpfilter",
                "--invert",
                "-j",
                "DROP",
            ],
        )
        .unwrap();
    let _srv = listen(&l.node, format!("[{SERVER}]:{PORT}").parse().unwrap());
    let (e, syn) = traced_drop(&l, 48101);
    let rule = "-A PREROUTING -m rpfilter --invert -j DROP";
    assert_eq!(e.netfilter().rule.as_deref(), Some(rule), "{e}");
    assert_eq!(
        e.finding().summary,
        format!(
            "IPv6 reverse-path check failed on eth1: iptables-nft rule in raw/PREROUTING \
             (strict) drops it: the way back to {CLIENT} leaves by eth0, not eth1 (table main, \
             rule 32766: from all lookup main): {rule}"
        )
    );
    check_way_back(&e, &l, " oif eth1");
    assert_eq!(
        e.finding().fix_or[0].clone(),
        [format!(
            "ip netns exec {} ip6tables-nft -t raw -R PREROUTING 1 -m rpfilter --loose --invert -j DROP",
            l.node.name
        )]
    );
    fix_then_connect(&e, &l, syn, 48101);
}

#[test]
fn nft_fib_saddr_iif() {
    let l = lab("rpf6n");
    for cmd in [
        "add table inet fw",
        "add chain inet fw pre { type filter hook prerouting priority raw; }",
        "add rule inet fw pre fib saddr . iif oif missing counter drop",
    ] {
        l.node.exec("nft", &[cmd]).unwrap();
    }
    let _srv = listen(&l.node, format!("[{SERVER}]:{PORT}").parse().unwrap());
    let (e, syn) = traced_drop(&l, 48201);
    let rule = "fib saddr . iif oif missing counter drop";
    assert_eq!(e.netfilter().rule.as_deref(), Some(rule), "{e}");
    assert_eq!(
        e.finding().summary,
        format!(
            "IPv6 reverse-path check failed on eth1: nftables rule in fw/pre (strict) drops it: \
             the way back to {CLIENT} leaves by eth0, not eth1 (table main, rule 32766: from all \
             lookup main): {rule}"
        )
    );
    // nft's fib looks up without preferring the input device.
    check_way_back(&e, &l, "");
    fix_then_connect(&e, &l, syn, 48201);
}

/// The lab with the way back working: the gateway behind eth0 forwards to
/// the client by a second link (fd00:161:3::/64), as in asymmetric routing
/// that works. The strict check still drops the SYN (the way back leaves by
/// eth0); loose mode, kdrop's other repair (`fix_or`), only asks that a way
/// back exist, and the SYN-ACK then goes by eth0 and the gateway.
fn asymmetric_lab(test: &str) -> Lab {
    let l = lab(test);
    veth(
        &l._gw,
        "g1",
        "02:00:00:00:81:05",
        &l.client,
        "c1",
        "02:00:00:00:81:06",
    )
    .unwrap();
    ip6(&l._gw, "addr add fd00:161:3::2/64 dev g1 nodad");
    ip6(&l.client, "addr add fd00:161:3::1/64 dev c1 nodad");
    ip6(
        &l._gw,
        &format!("route add {CLIENT}/128 via fd00:161:3::1 dev g1"),
    );
    l._gw.sysctl("net/ipv6/conf/all/forwarding", "1").unwrap();
    l
}

/// Applies kdrop's loose-mode repair as printed (it must be of `kind`),
/// then a new connection and the dropped SYN's retransmission complete.
fn loosen_then_connect(e: &Record, l: &Lab, (syn, sent): Syn, sport: u16, kind: Kind) {
    let or = e.finding().fix_or[0].clone();
    assert_kinds(&or, &[kind]);
    for cmd in &or {
        run_fix(cmd);
    }
    let dst: SocketAddr = format!("[{SERVER}]:{PORT}").parse().unwrap();
    connect_from(
        &l.client,
        format!("[{CLIENT}]:{}", sport + 1).parse().unwrap(),
        dst,
    )
    .expect("a new connection after the loose rule");
    wait_retransmitted(&syn, sent).expect("the first SYN's retransmission");
}

#[test]
fn ip6tables_rpfilter_loosened() {
    let l = asymmetric_lab("rpf6li");
    l.node
        .exec(
            "ip6tables",
            &[
                "-t",
                "raw",
                "-A",
                "PREROUTING",
                "-m",
                "rpfilter",
                "--invert",
                "-j",
                "DROP",
            ],
        )
        .unwrap();
    let _srv = listen(&l.node, format!("[{SERVER}]:{PORT}").parse().unwrap());
    let (e, syn) = traced_drop(&l, 48501);
    assert_eq!(
        e.finding().fix_or[0].clone(),
        [format!(
            "ip netns exec {} ip6tables-nft -t raw -R PREROUTING 1 -m rpfilter --loose --invert -j DROP",
            l.node.name
        )]
    );
    loosen_then_connect(&e, &l, syn, 48501, Kind::Rpfilter6Ip6tablesLoose);
}

#[test]
fn nft_fib_loosened() {
    let l = asymmetric_lab("rpf6ln");
    for cmd in [
        "add table inet fw",
        "add chain inet fw pre { type filter hook prerouting priority raw; }",
        "add rule inet fw pre fib saddr . iif oif missing counter drop",
    ] {
        l.node.exec("nft", &[cmd]).unwrap();
    }
    let _srv = listen(&l.node, format!("[{SERVER}]:{PORT}").parse().unwrap());
    let (e, syn) = traced_drop(&l, 48601);
    let or = e.finding().fix_or[0].clone();
    assert!(
        or.len() == 1
            && or[0].starts_with(&format!(
                "ip netns exec {} nft replace rule inet fw pre handle ",
                l.node.name
            ))
            && or[0].ends_with(" fib saddr oif missing counter drop"),
        "{or:?}"
    );
    loosen_then_connect(&e, &l, syn, 48601, Kind::Rpfilter6NftLoose);
}

/// Incident 1's shape over IPv6: the client sits behind a router on eth1;
/// the node sends what comes from its address by table 2 (default via the
/// router), but a mark rule ahead of it (AWS CNI's `fwmark 0x80/0x80
/// lookup main`) catches the check's lookup, which carries the packet's
/// mark (`--validmark`), and main's way back is eth0. The repair route
/// goes through the router the SYN came from, as table 2 does.
#[test]
fn ip6tables_rpfilter_validmark_behind_a_router() {
    let test = "rpf6m";
    let client = Ns::new(&ns_name(&format!("{test}-c"))).unwrap();
    let router = Ns::new(&ns_name(&format!("{test}-r"))).unwrap();
    let node = Ns::new(&ns_name(&format!("{test}-n"))).unwrap();
    let gw = Ns::new(&ns_name(&format!("{test}-g"))).unwrap();
    veth(
        &client,
        "c0",
        "02:00:00:00:82:01",
        &router,
        "r9",
        "02:00:00:00:82:02",
    )
    .unwrap();
    veth(
        &router,
        "r1",
        "02:00:00:00:82:03",
        &node,
        "eth1",
        "02:00:00:00:82:04",
    )
    .unwrap();
    veth(
        &gw,
        "g0",
        "02:00:00:00:82:05",
        &node,
        "eth0",
        "02:00:00:00:82:06",
    )
    .unwrap();
    let client_addr = "fd00:162:9::1";
    let server = "fd00:162:1::2";
    ip6(&client, &format!("addr add {client_addr}/64 dev c0 nodad"));
    ip6(&client, "route add default via fd00:162:9::fe");
    ip6(&router, "addr add fd00:162:9::fe/64 dev r9 nodad");
    ip6(&router, "addr add fd00:162:1::1/64 dev r1 nodad");
    router.sysctl("net/ipv6/conf/all/forwarding", "1").unwrap();
    ip6(&node, &format!("addr add {server}/64 dev eth1 nodad"));
    ip6(&node, "addr add fd00:162:2::2/64 dev eth0 nodad");
    ip6(&node, "route add default via fd00:162:2::1 dev eth0");
    ip6(
        &node,
        "route add default via fd00:162:1::1 dev eth1 table 2",
    );
    ip6(
        &node,
        &format!("rule add from {server} lookup 2 priority 1536"),
    );
    ip6(&node, "rule add fwmark 0x80/0x80 lookup main priority 1024");
    ip6(&gw, "addr add fd00:162:2::1/64 dev g0 nodad");
    for rule in [
        "-t raw -A PREROUTING -i eth1 -j MARK --set-xmark 0x80/0x80",
        "-t raw -A PREROUTING -m rpfilter --validmark --invert -j DROP",
    ] {
        node.exec("ip6tables", &rule.split(' ').collect::<Vec<_>>())
            .unwrap();
    }
    let _srv = listen(&node, format!("[{server}]:{PORT}").parse().unwrap());
    let k = Kdrop::start(&["--json", "--port", &PORT.to_string()]);
    let src: SocketAddr = format!("[{client_addr}]:48301").parse().unwrap();
    let dst: SocketAddr = format!("[{server}]:{PORT}").parse().unwrap();
    let syn = send_syn(&client, src, dst);
    let e = k.expect_record_within("the SYN's drop", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.saddr == client_addr && e.sport == 48301
    });
    k.stop(libc::SIGINT);
    assert_eq!(e.reason.as_deref(), kernel_reason("NETFILTER_DROP"), "{e}");
    let rule = "-A PREROUTING -m rpfilter --validmark --invert -j DROP";
    let f = e.finding();
    assert_eq!(
        f.summary,
        format!(
            "IPv6 reverse-path check failed on eth1: iptables-nft rule in raw/PREROUTING \
             (strict) drops it: the way back to {client_addr} leaves by eth0, not eth1 (table \
             main, rule 1024: from all fwmark 0x80/0x80 lookup main): {rule}"
        ),
        "{e}"
    );
    let ns = format!("ip netns exec {} ", node.name);
    let ev = f.evidence.clone();
    assert!(
        ev.contains(&format!(
            "reverse lookup as the rule makes it (strict): `{ns}ip -6 route get {client_addr} \
             from {server} oif eth1 mark 0x80` answers default via fd00:162:2::1 dev eth0 table \
             main"
        )),
        "{ev:#?}"
    );
    // Through the router the SYN came from (its MAC is the node's entry
    // for the router's link-local address), as table 2 goes.
    let router_ll = link_local(&router, "r1");
    assert_eq!(
        f.fix,
        [
            format!("{ns}ip -6 route add {client_addr}/128 via {router_ll} dev eth1 table 100"),
            format!(
                "{ns}ip -6 rule add from {server} to {client_addr}/128 lookup 100 priority 1023"
            ),
        ]
    );
    drop(syn);
    for cmd in f.fix.clone() {
        run_fix(&cmd);
    }
    connect_from(
        &client,
        format!("[{client_addr}]:48302").parse().unwrap(),
        dst,
    )
    .expect("a new connection after the fix");
}

/// The issue's node: two links, the client (fd00:164::2) a routed host
/// behind the router on the secondary link eth1 (fd00:163:2::1), the
/// default route out of eth0, and firewalld's strict ip6tables rpfilter.
/// Nothing is static: the router solicits the node's address, which
/// leaves its entry (with the MAC the SYN comes from) on the node. The
/// repair must route through the router, by the address it solicited the
/// node from (its link-local one); the on-link route the fix used to be is tried first and must
/// fail (the node solicits the client's address on eth1 and nobody
/// answers), which shows the test can.
#[test]
fn a_routed_client_is_repaired_through_its_router() {
    let test = "rpf6via";
    let (client_addr, router_global, server) = ("fd00:164::2", "fd00:163:2::1", "fd00:163:2::2");
    let port = 7232;
    let client = Ns::new(&ns_name(&format!("{test}-c"))).unwrap();
    let router = Ns::new(&ns_name(&format!("{test}-r"))).unwrap();
    let node = Ns::new(&ns_name(&format!("{test}-n"))).unwrap();
    let gw = Ns::new(&ns_name(&format!("{test}-g"))).unwrap();
    let link = |a: &Ns, a_if, a_mac, b: &Ns, b_if, b_mac| {
        veth(a, a_if, a_mac, b, b_if, b_mac).unwrap();
    };
    link(
        &client,
        "c0",
        "02:00:00:00:e8:01",
        &router,
        "r9",
        "02:00:00:00:e8:02",
    );
    link(
        &router,
        "r1",
        "02:00:00:00:e8:03",
        &node,
        "eth1",
        "02:00:00:00:e8:04",
    );
    link(
        &gw,
        "g0",
        "02:00:00:00:e8:05",
        &node,
        "eth0",
        "02:00:00:00:e8:06",
    );
    ip6(&client, &format!("addr add {client_addr}/64 dev c0 nodad"));
    ip6(&client, "route add default via fd00:164::1");
    ip6(&router, "addr add fd00:164::1/64 dev r9 nodad");
    ip6(
        &router,
        &format!("addr add {router_global}/64 dev r1 nodad"),
    );
    router.sysctl("net/ipv6/conf/all/forwarding", "1").unwrap();
    ip6(&node, &format!("addr add {server}/64 dev eth1 nodad"));
    ip6(&node, "addr add fd00:163:1::2/64 dev eth0 nodad");
    ip6(&node, "route add default via fd00:163:1::1 dev eth0");
    ip6(&gw, "addr add fd00:163:1::1/64 dev g0 nodad");
    node.exec(
        "ip6tables",
        &[
            "-t",
            "raw",
            "-A",
            "PREROUTING",
            "-m",
            "rpfilter",
            "--invert",
            "-j",
            "DROP",
        ],
    )
    .unwrap();
    let dst: SocketAddr = format!("[{server}]:{port}").parse().unwrap();
    let _srv = listen(&node, dst);
    let k = Kdrop::start(&["--json", "--port", &port.to_string()]);
    let src: SocketAddr = format!("[{client_addr}]:48401").parse().unwrap();
    let sent = Instant::now();
    let syn = send_syn(&client, src, dst);
    let e = k.expect_record_within("the SYN's drop", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.saddr == client_addr && e.sport == 48401
    });
    k.stop(libc::SIGINT);
    assert_eq!(e.reason.as_deref(), kernel_reason("NETFILTER_DROP"), "{e}");
    assert_eq!(e.ifname, "eth1", "{e}");
    let f = e.finding();
    assert_eq!(f.cause, "rpfilter6", "{e}");
    let ns = format!("ip netns exec {} ", node.name);
    // The router's address as the node's neighbour table has it: the
    // link-local one its solicitations came from.
    let router_addr = link_local(&router, "r1");
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        [
            format!("{ns}ip -6 route add {client_addr}/128 via {router_addr} dev eth1 table 100"),
            format!(
                "{ns}ip -6 rule add from {server} to {client_addr}/128 lookup 100 priority 32765"
            ),
        ]
    );
    let ev = f.evidence.clone();
    assert!(
        ev.iter().any(|l| l.starts_with(&format!(
            "the packet came from 02:00:00:00:e8:03 = {router_addr} on eth1 ("
        )) && l.ends_with("), a router: the client is not on eth1's link")),
        "{ev:#?}"
    );

    // The on-link route with the same rule: the SYN passes the check now,
    // but the SYN-ACK waits for a neighbour that never answers.
    let on_link = format!("{ns}ip -6 route add {client_addr}/128 dev eth1 table 100");
    run_fix(&on_link);
    run_fix(&fix[1]);
    let again: SocketAddr = format!("[{client_addr}]:48402").parse().unwrap();
    connect_within(&client, again, dst, Duration::from_secs(2))
        .expect_err("an on-link route to a routed client must not connect");
    run_fix(&format!(
        "{ns}ip -6 route del {client_addr}/128 dev eth1 table 100"
    ));
    run_fix(&fix[1].replacen(" rule add ", " rule del ", 1));

    for cmd in &fix {
        run_fix(cmd);
    }
    let new: SocketAddr = format!("[{client_addr}]:48403").parse().unwrap();
    connect_from(&client, new, dst).expect("a new connection after kdrop's fix");
    // The first SYN's socket, still retransmitting: the same tuple too.
    wait_retransmitted(&syn, sent).expect("the first SYN's retransmission");
}
