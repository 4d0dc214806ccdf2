//! IPv6 reverse-path drops by netfilter, traced with only the service's
//! port: an ip6tables `-m rpfilter --invert -j DROP` in raw PREROUTING
//! (firewalld's default) and an nft `fib saddr . iif oif missing drop`.
//! The client's address (fd00:61:9::1) reaches the node on eth1, but the
//! node's only way back to it is its default route out of eth0: the strict
//! check fails. kdrop must name the rule, the way back (eth0, table main,
//! the rule that chose it) and a policy route through eth1 that, applied as
//! printed, lets a new connection through. The topology is the oracle.
use std::{net::SocketAddr, time::Duration};

use integration_tests::{connect_from, listen, ns_name, run_fix, send_syn, strs, veth, Kdrop, Ns};
use serde_json::Value;

const PORT: u16 = 8443;
const CLIENT: &str = "fd00:61:9::1";
const SERVER: &str = "fd00:61:1::2";

fn ip6(ns: &Ns, args: &str) {
    let mut a = vec!["-6"];
    a.extend(args.split(' '));
    ns.ip(&a).unwrap_or_else(|e| panic!("ip {args}: {e:#}"));
}

/// The client on the node's eth1, a gateway on its eth0 (the default
/// route). The client's neighbour entry for the node is static: its
/// neighbour solicitations come from fd00:61:9::1 and the check would drop
/// them too, so the SYN would never leave.
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
    ip6(&client, "addr add fd00:61:1::1/64 dev c0 nodad");
    ip6(&client, &format!("addr add {CLIENT}/128 dev c0 nodad"));
    ip6(
        &client,
        &format!("neigh replace {SERVER} lladdr 02:00:00:00:81:02 dev c0 nud permanent"),
    );
    ip6(&node, &format!("addr add {SERVER}/64 dev eth1 nodad"));
    ip6(&node, "addr add fd00:61:2::2/64 dev eth0 nodad");
    ip6(&node, "route add default via fd00:61:2::1 dev eth0");
    ip6(&gw, "addr add fd00:61:2::1/64 dev g0 nodad");
    Lab {
        client,
        node,
        _gw: gw,
    }
}

/// The drop of the client's SYN, with its finding.
fn traced_drop(l: &Lab, sport: u16) -> (Value, std::os::fd::OwnedFd) {
    let k = Kdrop::start(&["--json", "--port", &PORT.to_string()]);
    let src: SocketAddr = format!("[{CLIENT}]:{sport}").parse().unwrap();
    let dst: SocketAddr = format!("[{SERVER}]:{PORT}").parse().unwrap();
    let syn = send_syn(&l.client, src, dst);
    let e = k.expect_event_within("the SYN's drop", Duration::from_secs(10), |e| {
        e["kind"] == "drop" && e["saddr"] == CLIENT && e["sport"] == sport
    });
    k.stop(libc::SIGINT);
    assert_eq!(e["reason"], "NETFILTER_DROP", "{e}");
    assert_eq!(e["ifname"], "eth1", "{e}");
    (e, syn)
}

/// What both rules share: the way back, the rule that chose it, the fix.
fn check_way_back(e: &Value, l: &Lab, asked: &str) {
    let f = &e["finding"];
    assert_eq!(f["cause"], "rpfilter6", "{e}");
    let ns = format!("ip netns exec {} ", l.node.name);
    let ev = strs(&f["evidence"]);
    assert!(
        ev.contains(&format!(
            "reverse lookup as the rule makes it (strict): `{ns}ip -6 route get {CLIENT} from \
             {SERVER}{asked}` answers default via fd00:61:2::1 dev eth0 table main"
        )),
        "{ev:#?}"
    );
    assert!(
        ev.contains(&"policy rule that decided: 32766: from all lookup main".to_string()),
        "{ev:#?}"
    );
    // The node has no IPv6 rule of its own: table 100 is free.
    assert_eq!(
        strs(&f["fix"]),
        [
            format!("{ns}ip -6 route add {CLIENT}/128 dev eth1 table 100"),
            format!("{ns}ip -6 rule add from {SERVER} to {CLIENT}/128 lookup 100 priority 32765"),
        ]
    );
}

fn fix_then_connect(e: &Value, l: &Lab, syn: std::os::fd::OwnedFd, sport: u16) {
    drop(syn);
    for cmd in strs(&e["finding"]["fix"]) {
        run_fix(&cmd);
    }
    connect_from(
        &l.client,
        format!("[{CLIENT}]:{}", sport + 1).parse().unwrap(),
        format!("[{SERVER}]:{PORT}").parse().unwrap(),
    )
    .expect("a new connection after the fix");
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
    assert_eq!(e["netfilter"]["rule"], rule, "{e}");
    assert_eq!(
        e["finding"]["summary"],
        format!(
            "IPv6 reverse-path check failed on eth1: iptables-nft rule in raw/PREROUTING \
             (strict) drops it: the way back to {CLIENT} leaves by eth0, not eth1 (table main, \
             rule 32766: from all lookup main): {rule}"
        )
    );
    check_way_back(&e, &l, " oif eth1");
    assert_eq!(
        strs(&e["finding"]["fix_or"][0]),
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
    assert_eq!(e["netfilter"]["rule"], rule, "{e}");
    assert_eq!(
        e["finding"]["summary"],
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

/// Incident 1's shape over IPv6: the client sits behind a router on eth1;
/// the node sends what comes from its address by table 2 (default via the
/// router), but a mark rule ahead of it (AWS CNI's `fwmark 0x80/0x80
/// lookup main`) catches the check's lookup, which carries the packet's
/// mark (`--validmark`), and main's way back is eth0. The repair route
/// goes through the router, as table 2 does.
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
    let client_addr = "fd00:62:9::1";
    let server = "fd00:62:1::2";
    ip6(&client, &format!("addr add {client_addr}/64 dev c0 nodad"));
    ip6(&client, "route add default via fd00:62:9::fe");
    ip6(&router, "addr add fd00:62:9::fe/64 dev r9 nodad");
    ip6(&router, "addr add fd00:62:1::1/64 dev r1 nodad");
    router.sysctl("net/ipv6/conf/all/forwarding", "1").unwrap();
    ip6(&node, &format!("addr add {server}/64 dev eth1 nodad"));
    ip6(&node, "addr add fd00:62:2::2/64 dev eth0 nodad");
    ip6(&node, "route add default via fd00:62:2::1 dev eth0");
    ip6(&node, "route add default via fd00:62:1::1 dev eth1 table 2");
    ip6(
        &node,
        &format!("rule add from {server} lookup 2 priority 1536"),
    );
    ip6(&node, "rule add fwmark 0x80/0x80 lookup main priority 1024");
    ip6(&gw, "addr add fd00:62:2::1/64 dev g0 nodad");
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
    let e = k.expect_event_within("the SYN's drop", Duration::from_secs(10), |e| {
        e["kind"] == "drop" && e["saddr"] == client_addr && e["sport"] == 48301
    });
    k.stop(libc::SIGINT);
    assert_eq!(e["reason"], "NETFILTER_DROP", "{e}");
    let rule = "-A PREROUTING -m rpfilter --validmark --invert -j DROP";
    let f = &e["finding"];
    assert_eq!(
        f["summary"],
        format!(
            "IPv6 reverse-path check failed on eth1: iptables-nft rule in raw/PREROUTING \
             (strict) drops it: the way back to {client_addr} leaves by eth0, not eth1 (table \
             main, rule 1024: from all fwmark 0x80/0x80 lookup main): {rule}"
        ),
        "{e}"
    );
    let ns = format!("ip netns exec {} ", node.name);
    let ev = strs(&f["evidence"]);
    assert!(
        ev.contains(&format!(
            "reverse lookup as the rule makes it (strict): `{ns}ip -6 route get {client_addr} \
             from {server} oif eth1 mark 0x80` answers default via fd00:62:2::1 dev eth0 table \
             main"
        )),
        "{ev:#?}"
    );
    assert_eq!(
        strs(&f["fix"]),
        [
            format!("{ns}ip -6 route add {client_addr}/128 via fd00:62:1::1 dev eth1 table 100"),
            format!(
                "{ns}ip -6 rule add from {server} to {client_addr}/128 lookup 100 priority 1023"
            ),
        ]
    );
    drop(syn);
    for cmd in strs(&f["fix"]) {
        run_fix(&cmd);
    }
    connect_from(
        &client,
        format!("[{client_addr}]:48302").parse().unwrap(),
        dst,
    )
    .expect("a new connection after the fix");
}
