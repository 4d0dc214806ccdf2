//! Handshakes followed through conntrack and NAT: incident 2 (hairpin DNAT
//! on one bridge, the SYN-ACK skips de-NAT) and incident 5 (DNAT'd SYN
//! forwarded, the reply returns another way). The remote side lives in
//! namespaces of its own; controls must produce nothing.
use std::{net::SocketAddr, path::Path, time::Duration};

use integration_tests::ctnl::CtDeleter;
use integration_tests::record::Finding;
use integration_tests::{
    answered_three_times, assert_kinds, bound, connect_from, in_ns, nf::iptables, ns_name,
    pods_on_bridge, reason_for, run_fix, send_raw_tcp, send_syn, syn_segment, veth, Kdrop, Ns,
};
use kdrop::diagnosis::fix_kinds::Kind;

fn listen(ns: &Ns, addr: &str) -> std::net::TcpListener {
    integration_tests::listen(ns, addr.parse().unwrap())
}

/// Incident 5: office client -> gateway/router -> node B (route for the
/// service CIDR, DNAT) -> backend on the same subnet as node B, whose reply
/// goes back through the router directly, bypassing node B.
struct Asym {
    client: Ns,
    router: Ns,
    node: Ns,
    pod: Ns,
}

const VIP: &str = "10.100.58.158";
const BACKEND: &str = "10.100.0.13";

/// The control's fix, in place from the start: the node masquerades what
/// it sends to the backend, so replies come back through it.
fn masquerade_to_backend(node: &Ns) {
    iptables(
        node,
        &format!("-t nat -A POSTROUTING -d {BACKEND} -j MASQUERADE"),
    );
}

fn asymmetric(test: &str) -> Asym {
    let a = Asym {
        client: Ns::new(&ns_name(&format!("{test}-cl"))).unwrap(),
        router: Ns::new(&ns_name(&format!("{test}-rt"))).unwrap(),
        node: Ns::new(&ns_name(&format!("{test}-nb"))).unwrap(),
        pod: Ns::new(&ns_name(&format!("{test}-pod"))).unwrap(),
    };
    veth(
        &a.client,
        "c0",
        "02:00:00:00:50:01",
        &a.router,
        "r0",
        "02:00:00:00:50:02",
    )
    .unwrap();
    veth(
        &a.node,
        "eth0",
        "02:00:00:00:50:03",
        &a.router,
        "rb",
        "02:00:00:00:50:04",
    )
    .unwrap();
    veth(
        &a.pod,
        "eth0",
        "02:00:00:00:50:05",
        &a.router,
        "ra",
        "02:00:00:00:50:06",
    )
    .unwrap();
    a.router
        .ip(&["link", "add", "vpc", "type", "bridge"])
        .unwrap();
    for port in ["rb", "ra"] {
        a.router
            .ip(&["link", "set", port, "master", "vpc"])
            .unwrap();
    }
    a.router.ip(&["link", "set", "vpc", "up"]).unwrap();
    a.router
        .ip(&["addr", "add", "10.100.0.1/24", "dev", "vpc"])
        .unwrap();
    a.router
        .ip(&["addr", "add", "172.16.0.1/24", "dev", "r0"])
        .unwrap();
    // The route for the service CIDR points at node B.
    a.router
        .ip(&["route", "add", "10.100.58.0/24", "via", "10.100.0.12"])
        .unwrap();
    a.router.sysctl("net/ipv4/ip_forward", "1").unwrap();
    a.client
        .ip(&["addr", "add", "172.16.0.50/24", "dev", "c0"])
        .unwrap();
    a.client
        .ip(&["route", "add", "default", "via", "172.16.0.1"])
        .unwrap();
    a.node
        .ip(&["addr", "add", "10.100.0.12/24", "dev", "eth0"])
        .unwrap();
    a.node
        .ip(&["route", "add", "default", "via", "10.100.0.1"])
        .unwrap();
    a.node.sysctl("net/ipv4/ip_forward", "1").unwrap();
    iptables(&a.node, &format!("-t nat -A PREROUTING -d {VIP} -p tcp --dport 8005 -j DNAT --to-destination 10.100.0.13:8005"));
    a.pod
        .ip(&["addr", "add", &format!("{BACKEND}/24"), "dev", "eth0"])
        .unwrap();
    a.pod
        .ip(&["route", "add", "default", "via", "10.100.0.1"])
        .unwrap();
    a
}

#[test]
fn incident5_asymmetric_return_path_and_its_fix() {
    let a = asymmetric("asym");
    let _l = listen(&a.pod, "10.100.0.13:8005");
    let k = Kdrop::start(&["--json", "--netns", &a.node.name, "--port", "8005"]);
    let src: SocketAddr = "172.16.0.50:45005".parse().unwrap();
    let dst: SocketAddr = format!("{VIP}:8005").parse().unwrap();
    // The client retransmits on its own schedule (1 s, then 2 s later).
    let syn = send_syn(&a.client, src, dst);
    let e = k.expect_record_within("the unanswered handshake", Duration::from_secs(8), |e| {
        e.kind == "unanswered"
    });
    assert_eq!(e.saddr, "172.16.0.50");
    assert_eq!(e.sport, 45005);
    assert_eq!(e.daddr, VIP);
    assert_eq!(e.dport, 8005);
    assert_eq!(e.ifname, "eth0");
    assert_eq!(e.ct().orig.dst, "10.100.58.158:8005");
    assert_eq!(e.ct().reply.src, "10.100.0.13:8005");
    let status = e.ct().status.clone();
    assert!(status.contains(&"DST_NAT".to_string()), "{status:?}");
    assert!(!status.contains(&"SEEN_REPLY".to_string()), "{status:?}");
    let f = e.finding();
    assert_eq!(f.cause, "asymmetric_return_path", "{e}");
    assert_eq!(
        f.summary,
        "SYN 172.16.0.50:45005 -> 10.100.58.158:8005 was DNAT'd to 10.100.0.13:8005 and sent out \
         eth0, but no reply came back through this host: asymmetric return path"
    );
    assert!(
        f.evidence[1].starts_with("3 transmissions of the same SYN"),
        "{f:?}"
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        [
            format!(
                "ip netns exec {} iptables -t nat -A POSTROUTING -d 10.100.0.13/32 -p tcp --dport 8005 -j MASQUERADE",
                a.node.name
            ),
            // The entry made without SNAT: the same port's retries keep it.
            format!(
                "ip netns exec {} conntrack -D -p tcp --orig-src 172.16.0.50 --orig-port-src 45005 \
                 --orig-dst 10.100.58.158 --orig-port-dst 8005",
                a.node.name
            ),
        ]
    );
    k.stop(libc::SIGINT);
    // The old socket goes first: a retransmission of it after the fix would
    // complete its handshake and hold the 5-tuple.
    drop(syn);
    assert_kinds(
        &fix,
        &[Kind::ReturnPathMasquerade, Kind::ConntrackDeleteEntry],
    );
    for cmd in &fix {
        run_fix(cmd);
    }
    // The same 5-tuple: with the stale entry gone, the handshake completes.
    connect_from(&a.client, src, dst).expect("handshake after the fix");
}

/// With masquerade in place from the start: the handshake completes (its
/// SYN sent three times, each answered) and kdrop reports nothing.
#[test]
fn control_masquerade_reports_nothing() {
    let a = asymmetric("asymc");
    masquerade_to_backend(&a.node);
    let _l = listen(&a.pod, "10.100.0.13:8005");
    let k = Kdrop::start(&["--json", "--netns", &a.node.name, "--port", "8005"]);
    let dst: SocketAddr = format!("{VIP}:8005").parse().unwrap();
    let src = "172.16.0.50:45007".parse().unwrap();
    let _c = answered_three_times(&a.client, &a.pod, 8005, src, dst);
    let done = k.stop(libc::SIGINT);
    assert!(done.stdout.is_empty(), "{:?}", done.stdout);
    assert_eq!(done.counts().matched, 0);
}

/// Incident 2: pod A and pod B on bridge cni0 of one node; A connects to
/// service B's cluster IP, DNAT'd to B; B's SYN-ACK is bridged straight back
/// without netfilter, so A has no socket for it and answers with a RST.
struct Hairpin {
    node: Ns,
    pod_a: Ns,
    pod_b: Ns,
}

const CLUSTER_IP: &str = "100.67.30.133";

fn hairpin(test: &str, bridge_nf_call_iptables: &str) -> Hairpin {
    let h = Hairpin {
        node: Ns::new(&ns_name(&format!("{test}-node"))).unwrap(),
        pod_a: Ns::new(&ns_name(&format!("{test}-a"))).unwrap(),
        pod_b: Ns::new(&ns_name(&format!("{test}-b"))).unwrap(),
    };
    pods_on_bridge(&h.node, "10.244.1", &[(&h.pod_a, 5), (&h.pod_b, 9)], 0x01);
    h.node.sysctl("net/ipv4/ip_forward", "1").unwrap();
    iptables(&h.node, &format!("-t nat -A PREROUTING -d {CLUSTER_IP} -p tcp --dport 8002 -j DNAT --to-destination 10.244.1.9:8002"));
    // br_netfilter may be built in or loaded on this host (then new
    // namespaces start with bridge-nf-call-iptables=1): the incident is a
    // node where bridged traffic skips iptables.
    if Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        h.node
            .sysctl(
                "net/bridge/bridge-nf-call-iptables",
                bridge_nf_call_iptables,
            )
            .unwrap();
    }
    h
}

/// Checks the hairpin finding's last fix (masquerade pod A's traffic to
/// pod B), stops kdrop, checks no "reset" record is left, applies the fix
/// and connects from pod A's port `sport`.
fn no_reset_then_the_fix_works(h: &Hairpin, k: Kdrop, f: &Finding, sport: u16) {
    let or = f.fix_or[0].clone();
    assert_eq!(
        or[0],
        format!(
            "ip netns exec {} iptables -t nat -A POSTROUTING -s 10.244.1.5 -d 10.244.1.9/32 -p tcp --dport 8002 -j MASQUERADE",
            h.node.name
        )
    );
    assert!(
        or[1].starts_with(&format!(
            "ip netns exec {} conntrack -D -p tcp --orig-src 10.244.1.5",
            h.node.name
        )),
        "{or:?}"
    );
    assert_eq!(
        f.fix.last().unwrap(),
        &format!(
            "ip netns exec {} sysctl -w net.bridge.bridge-nf-call-iptables=1",
            h.node.name
        )
    );
    let done = k.stop(libc::SIGINT);
    assert!(
        done.records().iter().all(|e| e.kind != "reset"),
        "{:?}",
        done.stdout
    );
    assert_kinds(&or, &[Kind::HairpinMasquerade, Kind::ConntrackDeleteEntry]);
    for cmd in &or {
        run_fix(cmd);
    }
    let dst: SocketAddr = format!("{CLUSTER_IP}:8002").parse().unwrap();
    connect_from(
        &h.pod_a,
        SocketAddr::new("10.244.1.5".parse().unwrap(), sport),
        dst,
    )
    .expect("handshake after the fix");
}

#[test]
fn incident2_hairpin_syn_ack_skips_reverse_nat_and_the_masquerade_fix_works() {
    let h = hairpin("hairp", "0");
    let _l = listen(&h.pod_b, "10.244.1.9:8002");
    // The node runs kdrop for all its namespaces: the DNAT happens in the
    // node's, the refused SYN-ACK dies in pod A's.
    let k = Kdrop::start(&["--json", "--port", "8002"]);
    let src: SocketAddr = "10.244.1.5:43534".parse().unwrap();
    let dst: SocketAddr = format!("{CLUSTER_IP}:8002").parse().unwrap();
    let _syn = send_syn(&h.pod_a, src, dst);
    let e = k.expect_record("the refused SYN-ACK", |e| {
        e.kind == "drop" && e.tcp_flags == "SYN|ACK" && e.dport == 43534
    });
    assert_eq!(e.reason.as_deref(), reason_for("NO_SOCKET"));
    assert_eq!(e.saddr, "10.244.1.9");
    assert_eq!(e.sport, 8002);
    assert_eq!(e.daddr, "10.244.1.5");
    assert_eq!(e.netns_name.as_deref(), Some(h.pod_a.name.as_str()));
    let f = e.finding();
    assert_eq!(f.cause, "hairpin_no_reverse_nat", "{e}");
    assert_eq!(
        f.summary,
        "hairpin: the SYN-ACK from 10.244.1.9:8002 matches the reply side of a DNAT'd \
         connection (10.244.1.5:43534 -> 100.67.30.133:8002 => 10.244.1.9:8002) but arrived \
         un-NAT'd: both ends are on bridge cni0"
    );
    let ev = f.evidence.clone();
    assert!(ev[1].starts_with("conntrack: orig 10.244.1.5:43534 -> 100.67.30.133:8002, reply 10.244.1.9:8002 -> 10.244.1.5:43534"), "{ev:?}");
    // Found by the entry's reply tuple when the SYN was not seen leaving.
    assert!(
        ev[2].contains("bridge cni0") && ev[2].contains("; 10.244.1.5 is on cni0's subnet too"),
        "{ev:?}"
    );
    assert!(
        ev[3].contains("net.bridge.bridge-nf-call-iptables = "),
        "{ev:?}"
    );
    // The client's RST in answer is not a second report: the drop said it.
    no_reset_then_the_fix_works(&h, k, f, 43535);
}

/// Incident 2 with kdrop scoped to the node's namespace: the refused
/// SYN-ACK dies in pod A, out of sight; the node sees the un-NAT'd SYN-ACK
/// and then pod A's RST cross its bridge.
#[test]
fn incident2_seen_from_the_node_is_a_reset_of_an_un_natted_syn_ack() {
    let h = hairpin("hairn", "0");
    let _l = listen(&h.pod_b, "10.244.1.9:8002");
    let k = Kdrop::start(&["--json", "--netns", &h.node.name, "--port", "8002"]);
    let src: SocketAddr = "10.244.1.5:43538".parse().unwrap();
    let dst: SocketAddr = format!("{CLUSTER_IP}:8002").parse().unwrap();
    let _syn = send_syn(&h.pod_a, src, dst);
    let e = k.expect_record("the reset", |e| e.kind == "reset");
    assert_eq!(e.tcp_flags, "RST");
    assert_eq!(e.netns_name.as_deref(), Some(h.node.name.as_str()));
    // The RST left the bridge towards pod B.
    assert_eq!(e.ifname, "veth9", "{e}");
    // The handshake as pod A started it, with the entry that DNAT'd it.
    assert_eq!(
        (e.saddr.as_str(), e.sport, e.daddr.as_str(), e.dport),
        ("10.244.1.5", 43538, CLUSTER_IP, 8002)
    );
    assert_eq!(e.ct().reply.src, "10.244.1.9:8002");
    let f = e.finding();
    assert_eq!(f.cause, "hairpin_no_reverse_nat", "{e}");
    assert_eq!(
        f.summary,
        "hairpin: the SYN-ACK from 10.244.1.9:8002 matches the reply side of a DNAT'd \
         connection (10.244.1.5:43538 -> 100.67.30.133:8002 => 10.244.1.9:8002) but arrived \
         un-NAT'd: both ends are on bridge cni0"
    );
    let ev = f.evidence.clone();
    assert!(
        ev[0].starts_with(&format!(
            "the SYN-ACK 10.244.1.9:8002 -> 10.244.1.5:43538 left veth5 in netns {}; ",
            h.node.name
        )) && ev[0].ends_with(&format!(
            "10.244.1.5 answered it with a RST, which left veth9 in netns {}",
            h.node.name
        )),
        "{ev:?}"
    );
    // One report, though the RST crossed two devices of the node.
    no_reset_then_the_fix_works(&h, k, f, 43539);
}

/// Pod B on another node (routed, not bridged): the reply goes back
/// through netfilter, the handshake works and kdrop reports nothing.
#[test]
fn control_backend_behind_a_router_reports_nothing() {
    let h = hairpin("hairpc", "0");
    let far = Ns::new(&ns_name("hairpc-far")).unwrap();
    veth(
        &h.node,
        "tofar",
        "02:00:00:00:21:01",
        &far,
        "eth0",
        "02:00:00:00:21:02",
    )
    .unwrap();
    h.node
        .ip(&["addr", "add", "10.101.0.1/24", "dev", "tofar"])
        .unwrap();
    far.ip(&["addr", "add", "10.101.0.9/24", "dev", "eth0"])
        .unwrap();
    far.ip(&["route", "add", "default", "via", "10.101.0.1"])
        .unwrap();
    iptables(&h.node, &format!("-t nat -I PREROUTING -d {CLUSTER_IP} -p tcp --dport 8003 -j DNAT --to-destination 10.101.0.9:8003"));
    let _l = listen(&far, "10.101.0.9:8003");
    // --host: other runs on this shared kernel drop packets with port 8003 too.
    let k = Kdrop::start(&["--json", "--port", "8003", "--host", "10.244.1.5"]);
    let dst: SocketAddr = format!("{CLUSTER_IP}:8003").parse().unwrap();
    connect_from(&h.pod_a, "10.244.1.5:43536".parse().unwrap(), dst).expect("handshake");
    let done = k.stop(libc::SIGINT);
    assert!(done.stdout.is_empty(), "{:?}", done.stdout);
    assert_eq!(done.counts().matched, 0);
}

/// br_netfilter with bridge-nf-call-iptables=1: the bridged SYN-ACK goes
/// through conntrack, is un-DNAT'd, and the handshake works.
#[test]
fn control_bridge_nf_call_iptables_reports_nothing() {
    if !Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        // Loading a module would change the host for every other test.
        panic!("br_netfilter is not available here: run `modprobe br_netfilter` first");
    }
    let h = hairpin("hairpn", "1");
    let _l = listen(&h.pod_b, "10.244.1.9:8002");
    // --host: other runs on this shared kernel drop packets with port 8002 too.
    let k = Kdrop::start(&["--json", "--port", "8002", "--host", "10.244.1.5"]);
    let dst: SocketAddr = format!("{CLUSTER_IP}:8002").parse().unwrap();
    connect_from(&h.pod_a, "10.244.1.5:43537".parse().unwrap(), dst).expect("handshake");
    let done = k.stop(libc::SIGINT);
    assert!(done.stdout.is_empty(), "{:?}", done.stdout);
    assert_eq!(done.counts().matched, 0);
}

/// Incident 4: a client pod sends to an internal LB's VIP; the LB (its own
/// namespace, preserving the client address) forwards to this node's
/// NodePort, which DNATs to a backend on this node without SNAT
/// (externalTrafficPolicy=Local): the reply never goes back through the LB.
struct Loop {
    node: Ns,
    lb: Ns,
    pod_a: Ns,
    pod_b: Ns,
}

const LB_VIP: &str = "203.0.113.80";

fn lb_loopback(test: &str) -> Loop {
    let l = Loop {
        node: Ns::new(&ns_name(&format!("{test}-node"))).unwrap(),
        lb: Ns::new(&ns_name(&format!("{test}-lb"))).unwrap(),
        pod_a: Ns::new(&ns_name(&format!("{test}-a"))).unwrap(),
        pod_b: Ns::new(&ns_name(&format!("{test}-b"))).unwrap(),
    };
    veth(
        &l.node,
        "eth0",
        "02:00:00:00:40:01",
        &l.lb,
        "lb0",
        "02:00:00:00:40:02",
    )
    .unwrap();
    l.node
        .ip(&["addr", "add", "10.70.0.10/24", "dev", "eth0"])
        .unwrap();
    l.node
        .ip(&["route", "add", "default", "via", "10.70.0.1"])
        .unwrap();
    pods_on_bridge(&l.node, "10.244.2", &[(&l.pod_a, 5), (&l.pod_b, 9)], 0x01);
    l.node.sysctl("net/ipv4/ip_forward", "1").unwrap();
    // NodePort with externalTrafficPolicy=Local: DNAT to the local backend,
    // no masquerade.
    iptables(&l.node, "-t nat -A PREROUTING -d 10.70.0.10 -p tcp --dport 30080 -j DNAT --to-destination 10.244.2.9:8004");
    l.lb.ip(&["addr", "add", "10.70.0.1/24", "dev", "lb0"])
        .unwrap();
    l.lb.ip(&["route", "add", "10.244.2.0/24", "via", "10.70.0.10"])
        .unwrap();
    l.lb.sysctl("net/ipv4/ip_forward", "1").unwrap();
    l.lb.sysctl("net/ipv4/conf/all/send_redirects", "0")
        .unwrap();
    l.lb.sysctl("net/ipv4/conf/lb0/send_redirects", "0")
        .unwrap();
    // The load balancer keeps the client's address (no SNAT).
    iptables(&l.lb, &format!("-t nat -A PREROUTING -d {LB_VIP} -p tcp --dport 8004 -j DNAT --to-destination 10.70.0.10:30080"));
    l
}

#[test]
fn incident4_lb_loopback_without_snat_and_its_fix() {
    let l = lb_loopback("lbloop");
    let _b = listen(&l.pod_b, "10.244.2.9:8004");
    let k = Kdrop::start(&["--json", "--netns", &l.node.name, "--port", "8004"]);
    let src: SocketAddr = "10.244.2.5:46004".parse().unwrap();
    let dst: SocketAddr = format!("{LB_VIP}:8004").parse().unwrap();
    let syn = send_syn(&l.pod_a, src, dst);
    let e = k.expect_record_within("the looped-back handshake", Duration::from_secs(8), |e| {
        e.kind == "unanswered"
    });
    assert_eq!(e.saddr, "10.244.2.5");
    assert_eq!(e.sport, 46004);
    assert_eq!(e.daddr, LB_VIP);
    assert_eq!(e.ifname, "eth0");
    let f = e.finding();
    assert_eq!(f.cause, "lb_loopback_without_snat", "{e}");
    assert_eq!(
        f.summary,
        "SYN 10.244.2.5:46004 -> 203.0.113.80:8004 left by eth0 to the load balancer, came back \
         as 10.244.2.5:46004 -> 10.70.0.10:30080 and was DNAT'd to 10.244.2.9:8004 without SNAT: \
         the reply goes straight to 10.244.2.5 and bypasses the load balancer"
    );
    let ev = f.evidence.clone();
    assert!(
        ev[0].starts_with("3 transmissions of the same SYN"),
        "{ev:?}"
    );
    assert!(ev[1].contains("sent out veth9"), "{ev:?}");
    let fix = f.fix.clone();
    // In the node's namespace, where the VIP is short-circuited, with the
    // stale entry of the same 5-tuple deleted.
    assert!(
        fix[0].starts_with(&format!(
            "ip netns exec {} iptables -t nat -I PREROUTING -s 10.244.2.5/32 -d 203.0.113.80/32",
            l.node.name
        )),
        "{fix:?}"
    );
    assert!(
        fix[1].starts_with(&format!("ip netns exec {} conntrack -D", l.node.name)),
        "{fix:?}"
    );
    assert!(
        f.fix_notes
            .iter()
            .any(|n| n.starts_with("externalTrafficPolicy: Cluster does not repair this")),
        "{f:?}"
    );
    k.stop(libc::SIGINT);
    // The old socket first (see incident 5), then the fix, then the same
    // 5-tuple again.
    drop(syn);
    assert_kinds(&fix, &[Kind::LoopbackDnat, Kind::ConntrackDeleteEntry]);
    for cmd in &fix {
        run_fix(cmd);
    }
    connect_from(&l.pod_a, src, dst).expect("handshake after the fix");
}

/// The VIP served locally with masquerade (what Cluster policy gives
/// in-cluster clients): the handshake works and kdrop reports nothing.
#[test]
fn control_vip_served_locally_with_snat_reports_nothing() {
    let l = lb_loopback("lbloopc");
    iptables(&l.node, &format!("-t nat -I PREROUTING -s 10.244.2.0/24 -d {LB_VIP} -p tcp --dport 8004 -j DNAT --to-destination 10.244.2.9:8004"));
    iptables(
        &l.node,
        "-t nat -A POSTROUTING -s 10.244.2.0/24 -d 10.244.2.9 -p tcp --dport 8004 -j MASQUERADE",
    );
    let _b = listen(&l.pod_b, "10.244.2.9:8004");
    let k = Kdrop::start(&["--json", "--netns", &l.node.name, "--port", "8004"]);
    let dst: SocketAddr = format!("{LB_VIP}:8004").parse().unwrap();
    // Three transmissions, each answered: the count a looped-back
    // handshake is reported at.
    let src = "10.244.2.5:46006".parse().unwrap();
    let _c = answered_three_times(&l.pod_a, &l.pod_b, 8004, src, dst);
    let done = k.stop(libc::SIGINT);
    assert!(done.stdout.is_empty(), "{:?}", done.stdout);
}

/// A client, a router that SNATs everything leaving towards the server to
/// one address and port (`--to-source 10.98.2.1:40000`, or `snat_to`), and
/// a server listening on 8006.
struct Snat {
    client: Ns,
    router: Ns,
    server: Ns,
}

const SNAT_SERVER: &str = "10.98.2.2:8006";

fn snat_to_one_port(test: &str, snat_to: &[&str]) -> Snat {
    let s = Snat {
        client: Ns::new(&ns_name(&format!("{test}-c"))).unwrap(),
        router: Ns::new(&ns_name(&format!("{test}-r"))).unwrap(),
        server: Ns::new(&ns_name(&format!("{test}-s"))).unwrap(),
    };
    veth(
        &s.client,
        "c0",
        "02:00:00:00:60:01",
        &s.router,
        "r0",
        "02:00:00:00:60:02",
    )
    .unwrap();
    veth(
        &s.server,
        "s0",
        "02:00:00:00:60:03",
        &s.router,
        "r1",
        "02:00:00:00:60:04",
    )
    .unwrap();
    s.client
        .ip(&["addr", "add", "10.98.1.2/24", "dev", "c0"])
        .unwrap();
    s.client
        .ip(&["route", "add", "default", "via", "10.98.1.1"])
        .unwrap();
    s.router
        .ip(&["addr", "add", "10.98.1.1/24", "dev", "r0"])
        .unwrap();
    s.router
        .ip(&["addr", "add", "10.98.2.1/24", "dev", "r1"])
        .unwrap();
    s.router.sysctl("net/ipv4/ip_forward", "1").unwrap();
    s.server
        .ip(&["addr", "add", "10.98.2.2/24", "dev", "s0"])
        .unwrap();
    let mut rule = vec![
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-o",
        "r1",
        "-p",
        "tcp",
        "-j",
    ];
    rule.extend_from_slice(snat_to);
    iptables(&s.router, &rule.join(" "));
    s
}

/// Waits (bounded) until a non-blocking connect on `fd` completed.
fn connected(fd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, 3000) == 1 && pfd.revents & libc::POLLERR == 0 }
}

/// Two connections SNAT'd to the same source address and port, to the same
/// server: the second one's reply tuple is the first one's, conntrack
/// cannot confirm it and drops its SYN (insert_failed).
#[test]
fn snat_port_clash_is_conntrack_insert_failed_and_widening_the_range_fixes_it() {
    let s = snat_to_one_port("ctins", &["SNAT", "--to-source", "10.98.2.1:40000"]);
    let _l = listen(&s.server, SNAT_SERVER);
    let k = Kdrop::start(&["--json", "--netns", &s.router.name, "--port", "8006"]);
    let dst: SocketAddr = SNAT_SERVER.parse().unwrap();
    let first = send_syn(&s.client, "10.98.1.2:41001".parse().unwrap(), dst);
    assert!(
        connected(&first),
        "the first connection takes 10.98.2.1:40000"
    );
    let _second = send_syn(&s.client, "10.98.1.2:41002".parse().unwrap(), dst);
    let e = k.expect_record("the clashing SYN", |e| {
        e.kind == "drop"
            && e.ct
                .as_ref()
                .is_some_and(|c| c.orig.src == "10.98.1.2:41002")
    });
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"));
    // Dropped at POSTROUTING (confirmation), after SNAT.
    assert_eq!(e.saddr, "10.98.2.1");
    assert_eq!(e.sport, 40000);
    assert_eq!(e.ifname, "r0");
    assert!(e.location.starts_with("nf_hook_slow"), "{e}");
    assert_eq!(e.netns_name.as_deref(), Some(s.router.name.as_str()));
    assert_eq!(e.ct().orig.src, "10.98.1.2:41002");
    assert_eq!(e.ct().orig.dst, SNAT_SERVER);
    assert_eq!(e.ct().reply.src, SNAT_SERVER);
    assert_eq!(e.ct().reply.dst, "10.98.2.1:40000");
    let status = e.ct().status.clone();
    assert!(status.contains(&"SRC_NAT".to_string()), "{status:?}");
    assert!(!status.contains(&"CONFIRMED".to_string()), "{status:?}");
    let stats = e.netfilter().conntrack();
    assert_eq!(e.netfilter().dropped_by, "conntrack", "{e}");
    assert!(
        stats.after.insert_failed > stats.before.insert_failed,
        "{stats:?}"
    );
    assert!(stats.after.drop > stats.before.drop, "{stats:?}");
    // conntrack -S (ctnetlink's per-CPU statistics) agrees with what kdrop
    // read from /proc/net/stat/nf_conntrack in that namespace.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &s.router.name, "conntrack", "-S"])
        .output()
        .unwrap();
    assert!(out.status.success(), "conntrack -S: {out:?}");
    let total: u64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("insert_failed=")?.parse::<u64>().ok())
        .sum();
    assert!(total >= 1, "{}", String::from_utf8_lossy(&out.stdout));
    let f = e.finding();
    assert_eq!(f.cause, "conntrack_insert_failed", "{e}");
    assert_eq!(
        f.summary,
        "NAT port clash: 10.98.1.2:41002 -> 10.98.2.2:8006, SNAT'd to 10.98.2.1:40000 -> \
         10.98.2.2:8006, could not be confirmed: another connection already has reply tuple \
         10.98.2.2:8006 -> 10.98.2.1:40000, so conntrack dropped it (insert_failed)"
    );
    let ev = f.evidence.clone();
    assert!(
        ev[1].starts_with("conntrack statistics: insert_failed "),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|l| l.starts_with(
            "NAT rule: -A POSTROUTING -o r1 -p tcp -j SNAT --to-source 10.98.2.1:40000"
        )),
        "{ev:?}"
    );
    // The first connection holds the tuple (a ctnetlink lookup in the router).
    assert!(
        ev.iter().any(|l| l.starts_with(
            "the entry holding that tuple: orig 10.98.1.2:41001 -> 10.98.2.2:8006, state "
        )),
        "{ev:?}"
    );
    let fix = f.fix.clone();
    assert!(
        fix[0].starts_with(&format!("ip netns exec {} iptables", s.router.name))
            && fix[0].ends_with(
                " -t nat -R POSTROUTING 1 -o r1 -p tcp -j SNAT --to-source 10.98.2.1:1024-65535 --random-fully"
            ),
        "{fix:?}"
    );
    k.stop(libc::SIGINT);
    assert_kinds(&fix, &[Kind::SnatWiden]);
    run_fix(&fix[0]);
    connect_from(&s.client, "10.98.1.2:41003".parse().unwrap(), dst)
        .expect("handshake after the fix");
}

/// The same two connections with a port range and --random-fully: both
/// complete, kdrop reports nothing.
#[test]
fn control_snat_with_a_port_range_reports_nothing() {
    let s = snat_to_one_port(
        "ctinsc",
        &[
            "SNAT",
            "--to-source",
            "10.98.2.1:40000-40100",
            "--random-fully",
        ],
    );
    let _l = listen(&s.server, SNAT_SERVER);
    let k = Kdrop::start(&["--json", "--netns", &s.router.name, "--port", "8006"]);
    let dst: SocketAddr = SNAT_SERVER.parse().unwrap();
    let first = send_syn(&s.client, "10.98.1.2:41001".parse().unwrap(), dst);
    assert!(connected(&first));
    connect_from(&s.client, "10.98.1.2:41002".parse().unwrap(), dst).expect("second handshake");
    let done = k.stop(libc::SIGINT);
    assert!(done.stdout.is_empty(), "{:?}", done.stdout);
    assert_eq!(done.counts().matched, 0);
}

/// Runs `conntrack` inside `ns`, returning stdout; fails the test if it
/// fails (`-D` that deleted nothing included).
fn conntrack(ns: &Ns, args: &[&str]) -> String {
    in_ns(ns, &[&["conntrack"], args].concat())
}

/// Waits (bounded) until `ns` has a conntrack entry from source port `sport`.
fn wait_entry(ns: &Ns, sport: u16) {
    let port = sport.to_string();
    for _ in 0..100 {
        if conntrack(ns, &["-L", "-p", "tcp", "--orig-port-src", &port]).contains("src=") {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no conntrack entry for source port {sport}");
}

/// A DNAT'd and masqueraded SYN forwarded to a backend that never answers
/// (blackholed in its own namespace); the entry is deleted before the
/// client's retransmissions add up: the ctnetlink destroy event of an
/// UNREPLIED entry makes it an "unanswered" event, once.
#[test]
fn an_entry_that_dies_unreplied_is_reported_once() {
    let a = asymmetric("ctdes");
    masquerade_to_backend(&a.node);
    iptables(&a.pod, "-A INPUT -p tcp --dport 8005 -j DROP");
    let k = Kdrop::start(&["--json", "--netns", &a.node.name, "--port", "8005"]);
    assert!(
        k.stderr_seen
            .iter()
            .any(|l| l.contains("conntrack destroy events in 1 namespace")),
        "{:?}",
        k.stderr_seen
    );
    // One SYN from a raw socket: no client socket retransmits it, so the
    // node sees exactly one transmission. Its entry is deleted by the test
    // itself over ctnetlink, woken by the entry's creation, long before
    // kdrop would call a lone transmission overdue (1.5 s): a loop of
    // `conntrack -D` execs in the node took longer under TCG, a dozen tests
    // at once (6.1's and 6.12's whole suites).
    let (src, vip) = (
        "172.16.0.50:45008".parse().unwrap(),
        format!("{VIP}:8005").parse().unwrap(),
    );
    let deleter = CtDeleter::new(&a.node);
    let syn = syn_segment(src, vip, 0x2000_0000);
    send_raw_tcp(&a.client, src, vip, &syn);
    deleter.delete_when_created(src, vip, Duration::from_secs(10));
    let e = k.expect_record_within("the entry that died", Duration::from_secs(2), |e| {
        e.kind == "unanswered"
    });
    assert_eq!(e.saddr, "172.16.0.50");
    assert_eq!(e.sport, 45008);
    assert_eq!(e.daddr, VIP);
    assert_eq!(e.ifname, "eth0");
    assert_eq!(e.ct().orig.dst, "10.100.58.158:8005");
    assert_eq!(e.ct().reply.src, "10.100.0.13:8005");
    assert_eq!(e.ct().reply.dst, "10.100.0.12:45008");
    let f = e.finding();
    assert_eq!(f.cause, "unanswered", "{e}");
    assert_eq!(
        f.summary,
        "SYN 172.16.0.50:45008 -> 10.100.58.158:8005 sent once out of eth0 without an answer"
    );
    let ev = f.evidence.clone();
    assert_eq!(ev[0], "1 transmission of the SYN, not answered", "{ev:?}");
    let died = ev.last().unwrap();
    assert!(
        died.starts_with(
            "conntrack: the entry 172.16.0.50:45008 -> 10.100.58.158:8005 (reply 10.100.0.13:8005 -> \
             10.100.0.12:45008) died without ever seeing a reply in netns "
        ),
        "{ev:?}"
    );
    // Debian's 5.10 sends destroy events without the TCP state (no
    // CTA_PROTOINFO); where there is one it is SYN_SENT.
    assert!(
        died.contains("state SYN_SENT") || !died.contains("state "),
        "{died}"
    );
    assert!(
        died.contains("DST_NAT") && !died.contains("SEEN_REPLY"),
        "{died}"
    );
    // A retransmission (the same SYN again, a new entry) does not report
    // the same handshake again.
    send_raw_tcp(&a.client, src, vip, &syn);
    wait_entry(&a.node, 45008);
    assert_eq!(k.next_event(Duration::from_millis(3500)), None);
    let done = k.stop(libc::SIGINT);
    assert!(
        done.stderr
            .iter()
            .any(|l| l.starts_with("kdrop: conntrack entries that died unreplied: received 1,")),
        "{:?}",
        done.stderr
    );
}

/// An answered handshake whose entry is deleted: the kernel filter keeps
/// its destroy event (SEEN_REPLY) from ever reaching kdrop.
#[test]
fn control_an_answered_entry_that_dies_is_filtered_in_the_kernel() {
    let a = asymmetric("ctdesc");
    masquerade_to_backend(&a.node);
    let _l = listen(&a.pod, "10.100.0.13:8005");
    let k = Kdrop::start(&["--json", "--netns", &a.node.name, "--port", "8005"]);
    let dst: SocketAddr = format!("{VIP}:8005").parse().unwrap();
    connect_from(&a.client, "172.16.0.50:45009".parse().unwrap(), dst).expect("handshake");
    wait_entry(&a.node, 45009);
    conntrack(&a.node, &["-D", "-p", "tcp"]);
    // As long as the unreplied entry's test waits for its record.
    assert_eq!(k.next_event(bound(Duration::from_secs(2))), None);
    let done = k.stop(libc::SIGINT);
    assert!(done.stdout.is_empty(), "{:?}", done.stdout);
    assert!(
        !done.stderr.iter().any(|l| l.contains("died unreplied")),
        "{:?}",
        done.stderr
    );
}
