//! Neighbour entries (context::neighbours) read from a real namespace: a
//! route via a next hop that never answers ARP, a peer that does, a
//! permanent entry; `ip neigh show` inside the namespace is the oracle.
use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::{bound, ns_name, veth, Ns};
use kdrop::context::{
    in_netns,
    neighbours::{dump_in, lookup_in},
    netns::ifindex,
};

/// `ip neigh show` lines for `dev` in `ns`.
fn ip_neigh(ns: &Ns, dev: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-n", &ns.name, "-4", "neigh", "show", "dev", dev])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip neigh show: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().to_string())
        .collect()
}

/// ip's line for `addr` (`ADDR [lladdr MAC] [router] STATE...` with `dev`).
fn ip_line(ns: &Ns, dev: &str, addr: &str) -> Option<String> {
    ip_neigh(ns, dev)
        .into_iter()
        .find(|l| l.split_whitespace().next() == Some(addr))
}

/// A UDP datagram from inside `ns` (it waits on the neighbour).
fn send_udp(ns: &Ns, to: SocketAddr) {
    in_netns(&ns.path(), move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.send_to(b"x", to).unwrap();
    })
    .unwrap();
}

/// Polls (bounded) until ip shows `addr` in `state`: neighbour state
/// changes have no event the test can wait on short of a netlink listener.
fn wait_state(ns: &Ns, dev: &str, addr: &str, state: &str) -> String {
    let deadline = Instant::now() + bound(Duration::from_secs(10));
    loop {
        if let Some(l) = ip_line(ns, dev, addr) {
            if l.ends_with(state) {
                return l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{addr} never {state}: {:?}",
            ip_neigh(ns, dev)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn failed_reachable_and_permanent_entries_as_ip_shows_them() {
    let a = Ns::new(&ns_name("nb1-a")).unwrap();
    let b = Ns::new(&ns_name("nb1-b")).unwrap();
    veth(
        &a,
        "ens6",
        "02:00:00:00:af:01",
        &b,
        "p0",
        "02:00:00:00:af:02",
    )
    .unwrap();
    a.ip(&["addr", "add", "10.173.0.1/24", "dev", "ens6"])
        .unwrap();
    b.ip(&["addr", "add", "10.173.0.2/24", "dev", "p0"])
        .unwrap();
    // Nobody owns 10.173.0.3: the route's next hop never answers.
    a.ip(&[
        "route",
        "add",
        "10.174.0.0/24",
        "via",
        "10.173.0.3",
        "dev",
        "ens6",
    ])
    .unwrap();
    a.ip(&[
        "neigh",
        "add",
        "10.173.0.9",
        "lladdr",
        "02:00:00:00:af:09",
        "dev",
        "ens6",
        "nud",
        "permanent",
    ])
    .unwrap();
    // Give up quickly: two solicitations 100 ms apart.
    a.sysctl("net/ipv4/neigh/ens6/retrans_time_ms", "100")
        .unwrap();
    a.sysctl("net/ipv4/neigh/ens6/mcast_solicit", "2").unwrap();
    a.sysctl("net/ipv4/neigh/ens6/ucast_solicit", "0").unwrap();

    send_udp(&a, "10.174.0.1:9".parse().unwrap());
    let failed_line = wait_state(&a, "ens6", "10.173.0.3", "FAILED");
    send_udp(&a, "10.173.0.2:9".parse().unwrap());
    let reach_line = wait_state(&a, "ens6", "10.173.0.2", "REACHABLE");

    let ens6 = in_netns(&a.path(), || ifindex("ens6")).unwrap().unwrap();
    let all = dump_in(&a.path()).unwrap();
    for (addr, line) in [
        ("10.173.0.3", failed_line),
        ("10.173.0.2", reach_line),
        ("10.173.0.9", ip_line(&a, "ens6", "10.173.0.9").unwrap()),
    ] {
        let dst: IpAddr = addr.parse().unwrap();
        let n = all
            .iter()
            .find(|n| n.dst == dst && n.ifindex == ens6)
            .unwrap_or_else(|| panic!("no entry for {addr} in {all:?}"));
        assert_eq!(n.dev, "ens6");
        // ip writes `ADDR [lladdr MAC] STATE` (dev is implied by `show dev`).
        let mut ours = addr.to_string();
        if let Some(mac) = &n.lladdr {
            ours += &format!(" lladdr {mac}");
        }
        if n.router {
            ours += " router";
        }
        ours += &format!(" {}", n.state_text());
        assert_eq!(ours, line, "{n:?}");
    }
    let hop = lookup_in(&a.path(), ens6, "10.173.0.3".parse().unwrap())
        .unwrap()
        .expect("the dead next hop's entry");
    assert!(hop.failed(), "{hop:?}");
    assert!(lookup_in(&a.path(), ens6, "10.173.0.77".parse().unwrap())
        .unwrap()
        .is_none());
}

#[test]
fn incomplete_while_asking() {
    let a = Ns::new(&ns_name("nb2-a")).unwrap();
    let b = Ns::new(&ns_name("nb2-b")).unwrap();
    veth(
        &a,
        "ens7",
        "02:00:00:00:b0:01",
        &b,
        "p0",
        "02:00:00:00:b0:02",
    )
    .unwrap();
    a.ip(&["addr", "add", "10.175.0.1/24", "dev", "ens7"])
        .unwrap();
    // Ask for a long time: 10 solicitations a second apart.
    a.sysctl("net/ipv4/neigh/ens7/mcast_solicit", "10").unwrap();
    send_udp(&a, "10.175.0.3:9".parse().unwrap());
    wait_state(&a, "ens7", "10.175.0.3", "INCOMPLETE");
    let ens7 = in_netns(&a.path(), || ifindex("ens7")).unwrap().unwrap();
    let n = lookup_in(&a.path(), ens7, "10.175.0.3".parse().unwrap())
        .unwrap()
        .unwrap();
    assert!(n.incomplete() && !n.failed(), "{n:?}");
    assert_eq!(n.lladdr, None);
}
