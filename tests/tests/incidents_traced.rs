//! Incidents 2, 4 and 5 traced as a user traces them: with only the
//! Service's port (80; every backend listens on 8080, so NAT changes the
//! port on the way), then with no filter at all. Every record of the failed
//! handshake, in whichever namespace kdrop saw it, must carry one cause, the
//! right one, under one handshake id; the fix, run as printed, must let the
//! same client port connect. The topologies are the oracle: the test built
//! them knowing what is broken.
use std::{net::SocketAddr, path::Path};

use integration_tests::{
    answered_three_times_then, assert_kinds, connect_within,
    handshake::{fix_then_connect, one_verdict, records, records_until},
    listen,
    nf::iptables,
    pods_on_bridge, role_ns, send_syn, veth, Kdrop, Ns, Record,
};
use kdrop::diagnosis::fix_kinds::Kind;

/// Pods routed by the node with no bridge (Calico's way): a /32 on each
/// veth, the node answering ARP for the pods' gateway 169.254.1.1.
fn pods_routed(node: &Ns, net: &str, pods: &[(&Ns, u8)]) {
    for (pod, last) in pods {
        let port = format!("cali{last}");
        veth(
            pod,
            "eth0",
            &format!("02:00:00:00:63:{last:02x}"),
            node,
            &port,
            &format!("02:00:00:00:64:{last:02x}"),
        )
        .unwrap();
        node.sysctl(&format!("net/ipv4/conf/{port}/proxy_arp"), "1")
            .unwrap();
        pod.ip(&["addr", "add", &format!("{net}.{last}/32"), "dev", "eth0"])
            .unwrap();
        pod.ip(&["route", "add", "169.254.1.1", "dev", "eth0"])
            .unwrap();
        pod.ip(&["route", "add", "default", "via", "169.254.1.1"])
            .unwrap();
        node.ip(&["route", "add", &format!("{net}.{last}/32"), "dev", &port])
            .unwrap();
    }
}

/// The control after a fix: kdrop again, as the test traced the incident,
/// and a handshake from a new client port whose SYN passes the node three
/// times, each answered (the count an unanswered or looped-back finding
/// is made at). Its only verdict is the client's own rule, the one that
/// dropped the SYN-ACKs to make the SYN go three times: kdrop files under
/// it the SYN-ACKs' drops, the server's duplicate SYNs, its retransmitted
/// SYN-ACKs and, where the device probe was armed after the SYN-ACKs had
/// passed (a slow guest, its first drop's enrichment taking seconds), the
/// client's three SYNs: no looped-back handshake, no cause but the rule.
/// The test lifts that rule only after kdrop's first record of a SYN-ACK
/// drop: kdrop reads the client's rules for it (it has no reading of that
/// namespace from before), and a rule lifted first cannot be named (a slow
/// guest's whole suite did). Later drops read after it is lifted are named
/// from that first reading. With the node alone traced (`node_only`),
/// kdrop sees three SYNs, each answered, and nothing of the client's rule:
/// no record at all.
fn quiet_after_the_fix(
    args: &[&str],
    (client, server): (&Ns, &Ns),
    src: SocketAddr,
    dst: SocketAddr,
    node_only: bool,
) {
    let k = Kdrop::start(args);
    let mut early: Vec<Record> = Vec::new();
    let _c = answered_three_times_then(client, server, BACKEND_PORT, src, dst, || {
        while !node_only && !early.iter().any(|e| e.kind == "drop") {
            early.push(k.expect_record("a record of the client's port", |e| e.of(src)));
        }
    });
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    let recs: Vec<Record> = early
        .into_iter()
        .chain(done.records())
        .filter(|e| e.of(src))
        .collect();
    assert!(!node_only || recs.is_empty(), "{recs:#?}");
    let rule = format!("-A INPUT -p tcp -m tcp --dport {} -j DROP", src.port());
    for e in recs {
        let f = e.finding();
        assert!(
            matches!(e.kind.as_str(), "drop" | "unanswered")
                && f.cause == "netfilter_rule"
                && f.summary.ends_with(&rule)
                && f.inspect[0].starts_with(&format!("ip netns exec {} ", client.name)),
            "{e:#}"
        );
    }
}

const SERVICE: u16 = 80;
const BACKEND_PORT: u16 = 8080;

/// Incident 2: pod A -> ClusterIP:80, DNAT'd to pod B:8080 on the same
/// bridge, bridged replies skip netfilter.
fn incident2(test: &str, args: &[&str], sport: u16, client_does: Client, node_only: bool) {
    let node = role_ns(test, "node");
    let a = role_ns(test, "a");
    let b = role_ns(test, "b");
    pods_on_bridge(&node, "10.245.1", &[(&a, 5), (&b, 9)], 0x61);
    node.sysctl("net/ipv4/ip_forward", "1").unwrap();
    iptables(
        &node,
        "-t nat -A PREROUTING -d 100.67.31.133 -p tcp --dport 80 -j DNAT --to-destination 10.245.1.9:8080",
    );
    if Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        node.sysctl("net/bridge/bridge-nf-call-iptables", "0")
            .unwrap();
    }
    let _l = listen(&b, format!("10.245.1.9:{BACKEND_PORT}").parse().unwrap());
    let src: SocketAddr = format!("10.245.1.5:{sport}").parse().unwrap();
    let dst: SocketAddr = format!("100.67.31.133:{SERVICE}").parse().unwrap();
    let (k, syn, _) = attempt(args, &node, node_only, &a, (src, dst), client_does);
    let recs = records(k, src);
    let f = one_verdict(&recs, "hairpin_no_reverse_nat");
    // Seen refused (the client's drop of the SYN-ACK, or its RST), or,
    // when the client gave up before its first retransmission with the
    // node traced alone, from the entry's silence: the SYN-ACK and the RST
    // crossed the bridge before the points that show them were armed.
    let summary = match recs[0].kind.as_str() {
        "drop" | "reset" => format!(
            "hairpin: the SYN-ACK from 10.245.1.9:8080 matches the reply side of a DNAT'd \
             connection (10.245.1.5:{sport} -> 100.67.31.133:80 => 10.245.1.9:8080) but arrived \
             un-NAT'd: both ends are on bridge cni0"
        ),
        "unanswered" => format!(
            "hairpin: SYN 10.245.1.5:{sport} -> 100.67.31.133:80 was DNAT'd to \
             10.245.1.9:8080 and no reply came back through netfilter: both ends are on bridge \
             cni0, which hands the reply straight back un-NAT'd"
        ),
        other => panic!("a hairpin record of kind {other}: {recs:#?}"),
    };
    assert_eq!(f.summary, summary, "{recs:#?}");
    assert!(
        f.evidence.iter().any(|l| l.ends_with(
            "is on cni0's subnet too: the reply is bridged straight back, never routed"
        )),
        "{f:#?}"
    );
    assert!(
        f.fix.last().unwrap().starts_with(&format!(
            "ip netns exec {} sysctl -w net.bridge.bridge-nf-call-iptables=1",
            node.name
        )),
        "{f:?}"
    );
    // br_netfilter is built in or loaded here: no modprobe before it.
    assert_kinds(&f.fix, &[Kind::BridgeNfCall]);
    fix_then_connect(&f, &a, syn, src, dst);
}

#[test]
fn incident2_traced_by_the_service_port() {
    incident2(
        "tr2p",
        &["--json", "--port", "80"],
        43701,
        Client::KeepsTrying,
        false,
    );
}

#[test]
fn incident2_traced_unfiltered() {
    incident2("tr2a", &["--json"], 43702, Client::KeepsTrying, false);
}

#[test]
fn incident2_client_giving_up_after_3s() {
    let t = std::time::Duration::from_secs(3);
    incident2(
        "tr2g",
        &["--json", "--port", "80"],
        43703,
        Client::GivesUp(t),
        false,
    );
}

/// The node's namespace alone: the pods' namespaces (the client's socket,
/// its RST) out of sight.
#[test]
fn incident2_node_alone_client_giving_up_after_3s() {
    let t = std::time::Duration::from_secs(3);
    incident2(
        "tr2n",
        &["--json", "--port", "80"],
        43704,
        Client::GivesUp(t),
        true,
    );
}

/// The same, the client giving up after 1 s as clients elsewhere do: the
/// verdict comes from the SYN-ACK's RST, not from retransmissions.
#[test]
fn incident2_node_alone_client_giving_up_after_1s() {
    let t = std::time::Duration::from_secs(1);
    incident2(
        "tr2o",
        &["--json", "--port", "80"],
        43705,
        Client::GivesUp(t),
        true,
    );
}

/// How incident 4's node DNATs its node port 30080 to pod B.
#[derive(Clone, Copy, PartialEq)]
enum NodeNat {
    /// One `-j DNAT` rule: nothing on the node ties 30080 to port 80.
    Plain,
    /// kube-proxy's rules for the Service `web/web:http` (port 80, node
    /// port 30080, externalTrafficPolicy Local), restored whole:
    /// tests/fixtures/kube-proxy/incident4.rules.
    KubeProxy,
}

fn incident4(test: &str, args: &[&str], sport: u16, client_does: Client, node_only: bool) {
    incident4_on(test, args, sport, client_does, node_only, NodeNat::Plain);
}

/// Incident 4: pod A -> the LB's VIP:80; the LB DNATs it to the node's
/// NodePort 30080 keeping the client's address; the node DNATs it to pod B
/// (routed pods, no bridge) without SNAT.
fn incident4_on(
    test: &str,
    args: &[&str],
    sport: u16,
    client_does: Client,
    node_only: bool,
    nat: NodeNat,
) {
    let node = role_ns(test, "node");
    let lb = role_ns(test, "lb");
    let a = role_ns(test, "a");
    let b = role_ns(test, "b");
    veth(
        &node,
        "eth0",
        "02:00:00:00:65:01",
        &lb,
        "lb0",
        "02:00:00:00:65:02",
    )
    .unwrap();
    node.ip(&["addr", "add", "10.106.0.10/24", "dev", "eth0"])
        .unwrap();
    node.ip(&["route", "add", "default", "via", "10.106.0.1"])
        .unwrap();
    pods_routed(&node, "10.245.2", &[(&a, 5), (&b, 9)]);
    node.sysctl("net/ipv4/ip_forward", "1").unwrap();
    match nat {
        NodeNat::Plain => iptables(
            &node,
            "-t nat -A PREROUTING -d 10.106.0.10 -p tcp --dport 30080 -j DNAT --to-destination 10.245.2.9:8080",
        ),
        NodeNat::KubeProxy => {
            let rules = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/kube-proxy/incident4.rules");
            // The backend kdrop's fix writes with (`iptables`), as
            // kube-proxy's own rules are.
            node.exec("iptables-restore", &[rules.to_str().unwrap()])
                .unwrap_or_else(|e| panic!("{e:#}"));
        }
    }
    lb.ip(&["addr", "add", "10.106.0.1/24", "dev", "lb0"])
        .unwrap();
    lb.ip(&["route", "add", "10.245.2.0/24", "via", "10.106.0.10"])
        .unwrap();
    lb.sysctl("net/ipv4/ip_forward", "1").unwrap();
    lb.sysctl("net/ipv4/conf/all/send_redirects", "0").unwrap();
    lb.sysctl("net/ipv4/conf/lb0/send_redirects", "0").unwrap();
    iptables(
        &lb,
        "-t nat -A PREROUTING -d 203.0.113.81 -p tcp --dport 80 -j DNAT --to-destination 10.106.0.10:30080",
    );
    let _l = listen(&b, format!("10.245.2.9:{BACKEND_PORT}").parse().unwrap());
    let src: SocketAddr = format!("10.245.2.5:{sport}").parse().unwrap();
    let dst: SocketAddr = format!("203.0.113.81:{SERVICE}").parse().unwrap();
    let (k, syn, args) = attempt(args, &node, node_only, &a, (src, dst), client_does);
    let args = &args.iter().map(String::as_str).collect::<Vec<_>>()[..];
    if nat == NodeNat::KubeProxy {
        let ready = k.stderr_seen.last().unwrap();
        assert!(
            ready.contains("node port 30080 of web/web:80 beside --port"),
            "{ready}"
        );
    }
    // From the node alone the client's socket is out of sight: the pod's
    // RST refusing the SYN-ACK decides the handshake, no "unanswered".
    let recs = if node_only {
        records_until(k, src, "first verdict", |e| e.finding.is_some())
    } else {
        records(k, src)
    };
    let f = one_verdict(&recs, "lb_loopback_without_snat");
    // kube-proxy's rules name the Service of the node port.
    let service = match nat {
        NodeNat::Plain => "",
        NodeNat::KubeProxy => "to service web/web:80: ",
    };
    assert_eq!(
        f.summary,
        format!(
            "{service}SYN 10.245.2.5:{sport} -> 203.0.113.81:80 left by eth0 to the load balancer, came \
             back as 10.245.2.5:{sport} -> 10.106.0.10:30080 and was DNAT'd to 10.245.2.9:8080 \
             without SNAT: the reply goes straight to 10.245.2.5 and bypasses the load balancer"
        )
    );
    // In the node's namespace (not the pod's, not the load balancer's),
    // with the node's stale entry of the same 5-tuple deleted.
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        [
            format!(
                "ip netns exec {} iptables -t nat -I PREROUTING -s 10.245.2.5/32 -d 203.0.113.81/32 -p tcp --dport 80 -j DNAT --to-destination 10.245.2.9:8080",
                node.name
            ),
            format!(
                "ip netns exec {} conntrack -D -p tcp --orig-src 10.245.2.5 --orig-port-src {sport} --orig-dst 203.0.113.81 --orig-port-dst 80",
                node.name
            ),
        ]
    );
    assert!(
        f.fix_notes
            .iter()
            .any(|n| n.starts_with("externalTrafficPolicy: Cluster does not repair this")),
        "{f:?}"
    );
    fix_then_connect(&f, &a, syn, src, dst);
    let again: SocketAddr = format!("10.245.2.5:{}", sport + 50).parse().unwrap();
    quiet_after_the_fix(args, (&a, &b), again, dst, node_only);
}

#[test]
fn incident4_traced_by_the_service_port() {
    incident4(
        "tr4p",
        &["--json", "--port", "80"],
        46701,
        Client::KeepsTrying,
        false,
    );
}

#[test]
fn incident4_traced_unfiltered() {
    incident4("tr4a", &["--json"], 46702, Client::KeepsTrying, false);
}

#[test]
fn incident4_client_giving_up_after_3s() {
    let t = std::time::Duration::from_secs(3);
    incident4(
        "tr4g",
        &["--json", "--port", "80"],
        46703,
        Client::GivesUp(t),
        false,
    );
}

/// The node's namespace alone (`--netns`): its NAT entry for the looped
/// SYN carries the NodePort, its entry for the SYN to the VIP is not NAT'd
/// there, so the NodePort is traced beside the service port (the README's
/// advice for this view).
#[test]
fn incident4_node_alone_client_giving_up_after_3s() {
    let t = std::time::Duration::from_secs(3);
    incident4(
        "tr4n",
        &["--json", "--port", "80", "--port", "30080"],
        46704,
        Client::GivesUp(t),
        true,
    );
}

#[test]
fn incident4_node_alone_client_giving_up_after_1s() {
    let t = std::time::Duration::from_secs(1);
    incident4(
        "tr4o",
        &["--json", "--port", "80", "--port", "30080"],
        46705,
        Client::GivesUp(t),
        true,
    );
}

/// The node alone traced with the Service's port, the one the user knows:
/// kube-proxy's rules tie node port 30080 to it, so kdrop follows both.
#[test]
fn incident4_node_alone_by_the_service_port_with_kube_proxy() {
    let t = std::time::Duration::from_secs(3);
    incident4_on(
        "tr4k",
        &["--json", "--port", "80"],
        46706,
        Client::GivesUp(t),
        true,
        NodeNat::KubeProxy,
    );
}

#[test]
fn incident4_node_alone_by_the_service_port_with_kube_proxy_1s() {
    let t = std::time::Duration::from_secs(1);
    incident4_on(
        "tr4l",
        &["--json", "--port", "80"],
        46707,
        Client::GivesUp(t),
        true,
        NodeNat::KubeProxy,
    );
}

/// How the client of a silent death behaves.
#[derive(Clone, Copy)]
enum Client {
    /// Its socket stays open: the kernel retransmits the SYN at 1 s and 3 s.
    KeepsTrying,
    /// A connect timeout: it closes the socket after this long.
    GivesUp(std::time::Duration),
}

/// kdrop started with `args` (and `--netns <node>` when `node_only`: the
/// node's namespace alone, where the client is out of sight), then the
/// client's SYN `src -> dst` from `client` as `client_does` sends it: the
/// running kdrop, the socket when it stays open, the arguments used.
fn attempt(
    args: &[&str],
    node: &Ns,
    node_only: bool,
    client: &Ns,
    (src, dst): (SocketAddr, SocketAddr),
    client_does: Client,
) -> (Kdrop, Option<std::os::fd::OwnedFd>, Vec<String>) {
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if node_only {
        args.extend(["--netns".to_string(), node.name.clone()]);
    }
    let k = Kdrop::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let syn = match client_does {
        Client::KeepsTrying => Some(send_syn(client, src, dst)),
        Client::GivesUp(t) => {
            connect_within(client, src, dst, t).expect_err("the handshake dies");
            None
        }
    };
    (k, syn, args)
}

/// Incident 5: an office client -> a router -> node B, which DNATs the
/// VIP:80 to a backend:8080 on the router's other port; the backend
/// answers through the router, bypassing node B. `node_only`: kdrop traces
/// node B's namespace alone (`--netns`), as on a real node B, where the
/// client is another host.
fn incident5(test: &str, args: &[&str], sport: u16, client_does: Client, node_only: bool) {
    let client = role_ns(test, "cl");
    let router = role_ns(test, "rt");
    let node = role_ns(test, "nb");
    let pod = role_ns(test, "pod");
    veth(
        &client,
        "c0",
        "02:00:00:00:66:01",
        &router,
        "r0",
        "02:00:00:00:66:02",
    )
    .unwrap();
    veth(
        &node,
        "eth0",
        "02:00:00:00:66:03",
        &router,
        "rb",
        "02:00:00:00:66:04",
    )
    .unwrap();
    veth(
        &pod,
        "eth0",
        "02:00:00:00:66:05",
        &router,
        "ra",
        "02:00:00:00:66:06",
    )
    .unwrap();
    router
        .ip(&["link", "add", "vpc", "type", "bridge"])
        .unwrap();
    for port in ["rb", "ra"] {
        router.ip(&["link", "set", port, "master", "vpc"]).unwrap();
    }
    router.ip(&["link", "set", "vpc", "up"]).unwrap();
    router
        .ip(&["addr", "add", "10.1.0.1/24", "dev", "vpc"])
        .unwrap();
    router
        .ip(&["addr", "add", "172.17.0.1/24", "dev", "r0"])
        .unwrap();
    router
        .ip(&["route", "add", "10.1.58.0/24", "via", "10.1.0.12"])
        .unwrap();
    router.sysctl("net/ipv4/ip_forward", "1").unwrap();
    client
        .ip(&["addr", "add", "172.17.0.50/24", "dev", "c0"])
        .unwrap();
    client
        .ip(&["route", "add", "default", "via", "172.17.0.1"])
        .unwrap();
    node.ip(&["addr", "add", "10.1.0.12/24", "dev", "eth0"])
        .unwrap();
    node.ip(&["route", "add", "default", "via", "10.1.0.1"])
        .unwrap();
    node.sysctl("net/ipv4/ip_forward", "1").unwrap();
    iptables(
        &node,
        "-t nat -A PREROUTING -d 10.1.58.158 -p tcp --dport 80 -j DNAT --to-destination 10.1.0.13:8080",
    );
    pod.ip(&["addr", "add", "10.1.0.13/24", "dev", "eth0"])
        .unwrap();
    pod.ip(&["route", "add", "default", "via", "10.1.0.1"])
        .unwrap();
    let _l = listen(&pod, format!("10.1.0.13:{BACKEND_PORT}").parse().unwrap());
    let src: SocketAddr = format!("172.17.0.50:{sport}").parse().unwrap();
    let dst: SocketAddr = format!("10.1.58.158:{SERVICE}").parse().unwrap();
    let (k, syn, args) = attempt(args, &node, node_only, &client, (src, dst), client_does);
    let args = &args.iter().map(String::as_str).collect::<Vec<_>>()[..];
    let recs = records(k, src);
    let f = one_verdict(&recs, "asymmetric_return_path");
    assert_eq!(
        f.summary,
        format!(
            "SYN 172.17.0.50:{sport} -> 10.1.58.158:80 was DNAT'd to 10.1.0.13:8080 and sent \
             out eth0, but no reply came back through this host: asymmetric return path"
        )
    );
    assert_eq!(
        f.fix.clone(),
        [
            format!(
                "ip netns exec {} iptables -t nat -A POSTROUTING -d 10.1.0.13/32 -p tcp --dport 8080 -j MASQUERADE",
                node.name
            ),
            format!(
                "ip netns exec {} conntrack -D -p tcp --orig-src 172.17.0.50 --orig-port-src {sport} --orig-dst 10.1.58.158 --orig-port-dst 80",
                node.name
            ),
        ]
    );
    fix_then_connect(&f, &client, syn, src, dst);
    let again: SocketAddr = format!("172.17.0.50:{}", sport + 50).parse().unwrap();
    quiet_after_the_fix(args, (&client, &pod), again, dst, node_only);
}

#[test]
fn incident5_traced_by_the_service_port() {
    incident5(
        "tr5p",
        &["--json", "--port", "80"],
        45701,
        Client::KeepsTrying,
        false,
    );
}

#[test]
fn incident5_traced_unfiltered() {
    incident5("tr5a", &["--json"], 45702, Client::KeepsTrying, false);
}

/// The client gives up after 3 s: two transmissions, maybe three.
#[test]
fn incident5_client_giving_up_after_3s() {
    let t = std::time::Duration::from_secs(3);
    incident5(
        "tr5g",
        &["--json", "--port", "80"],
        45703,
        Client::GivesUp(t),
        false,
    );
}

/// Node B alone: the client is another host that gives up after 3 s.
#[test]
fn incident5_node_alone_client_giving_up_after_3s() {
    let t = std::time::Duration::from_secs(3);
    incident5(
        "tr5n",
        &["--json", "--port", "80"],
        45704,
        Client::GivesUp(t),
        true,
    );
}

/// Node B alone, a client that gives up after 1 s: one transmission.
#[test]
fn incident5_node_alone_client_giving_up_after_1s() {
    let t = std::time::Duration::from_secs(1);
    incident5(
        "tr5o",
        &["--json", "--port", "80"],
        45705,
        Client::GivesUp(t),
        true,
    );
}
