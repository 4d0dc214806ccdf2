//! Incidents 2 and 5 and a Service REJECT over IPv6, traced as a user
//! traces them: with only the Service's port (80; the backends listen on
//! 8080), once with only the client's network (`--host` with an IPv6
//! CIDR). NAT by ip6tables (hairpin) and by an nft `inet` table
//! (asymmetric). Every record of the failed handshake must carry one cause,
//! the right one, under one handshake id; the fix, run as printed, must let
//! a new connection through. The topologies are the oracle: the test built
//! them knowing what is broken. Addresses: fd00:… inside the namespaces the
//! tests create.
use std::{net::SocketAddr, path::Path};

use integration_tests::{
    connect_from, connect_within,
    handshake::{self, fix_then_connect, records},
    ip6, kernel_reason, listen,
    record::{Finding, Record},
    role_ns, send_syn, veth, Kdrop, Ns,
};

/// An address usable at once (no duplicate address detection).
fn addr(ns: &Ns, cidr: &str, dev: &str) {
    ip6(ns, &format!("addr add {cidr} dev {dev} nodad"));
}

/// A permanent neighbour entry: no neighbour discovery delays or loses the
/// first packets (the v4 labs' ARP answers at once; NDP over a fresh bridge
/// may not), so every transmission of the SYN meets its fate at once.
fn neigh(ns: &Ns, addr: &str, mac: &str, dev: &str) {
    ip6(
        ns,
        &format!("neigh replace {addr} lladdr {mac} dev {dev} nud permanent"),
    );
}

fn forwarding(ns: &Ns) {
    ns.sysctl("net/ipv6/conf/all/forwarding", "1").unwrap();
}

/// One handshake, one cause, one id, over IPv6; returns the verdict.
fn one_verdict(recs: &[Record], cause: &str) -> Finding {
    assert!(recs.iter().all(|e| e.family == "ipv6"), "{recs:#?}");
    handshake::one_verdict(recs, cause)
}

/// Who DNATs the Service: ip6tables (kube-proxy's iptables mode) or an
/// nft `inet` table (its nftables mode uses one family for both).
#[derive(Clone, Copy)]
enum Nat {
    Ip6tables,
    NftInet,
}

/// DNAT of `[vip]:port` to `[backend]:to` in PREROUTING.
fn dnat(node: &Ns, nat: Nat, vip: &str, port: u16, backend: &str, to: u16) {
    let target = format!("[{backend}]:{to}");
    match nat {
        Nat::Ip6tables => {
            let port = port.to_string();
            node.exec(
                "ip6tables",
                &[
                    "-t",
                    "nat",
                    "-A",
                    "PREROUTING",
                    "-d",
                    vip,
                    "-p",
                    "tcp",
                    "--dport",
                    &port,
                    "-j",
                    "DNAT",
                    "--to-destination",
                    &target,
                ],
            )
            .unwrap();
        }
        Nat::NftInet => {
            for cmd in [
                "add table inet kube".to_string(),
                "add chain inet kube pre { type nat hook prerouting priority dstnat; }".into(),
                format!(
                    "add rule inet kube pre ip6 daddr {vip} tcp dport {port} dnat ip6 to {target}"
                ),
            ] {
                node.exec("nft", &[&cmd]).unwrap();
            }
        }
    }
}

const SERVICE: u16 = 80;
const BACKEND_PORT: u16 = 8080;

/// How the hairpin's client behaves, and what kdrop traces.
#[derive(Clone, Copy)]
enum Seen {
    /// The client keeps its socket open (it retransmits); kdrop traces
    /// with the test's arguments alone.
    Everywhere,
    /// The client gives up after 1 s, before its first retransmission;
    /// kdrop traces the node's namespace alone (`--netns`).
    NodeAloneClientGivingUpAfter1s,
}

/// Incident 2 over IPv6: pod A -> ClusterIP [fd00:108::133]:80, DNAT'd by
/// ip6tables to pod B:8080 on the same bridge; bridge-nf-call-ip6tables=0,
/// so the bridged reply skips netfilter and is not un-DNAT'd.
fn hairpin(test: &str, nat: Nat, args: &[&str], sport: u16, seen: Seen) {
    let node = role_ns(test, "node");
    let a = role_ns(test, "a");
    let b = role_ns(test, "b");
    node.ip(&["link", "add", "cni0", "type", "bridge"]).unwrap();
    node.ip(&["link", "set", "cni0", "address", "02:00:00:00:70:01"])
        .unwrap();
    node.ip(&["link", "set", "cni0", "up"]).unwrap();
    addr(&node, "fd00:111:1::1/64", "cni0");
    for (pod, last) in [(&a, 5u8), (&b, 9)] {
        let port = format!("veth{last}");
        veth(
            pod,
            "eth0",
            &format!("02:00:00:00:71:{last:02x}"),
            &node,
            &port,
            &format!("02:00:00:00:72:{last:02x}"),
        )
        .unwrap();
        node.ip(&["link", "set", &port, "master", "cni0"]).unwrap();
        addr(pod, &format!("fd00:111:1::{last}/64"), "eth0");
        ip6(pod, "route add default via fd00:111:1::1");
        neigh(pod, "fd00:111:1::1", "02:00:00:00:70:01", "eth0");
        let mac = format!("02:00:00:00:71:{last:02x}");
        neigh(&node, &format!("fd00:111:1::{last}"), &mac, "cni0");
    }
    neigh(&a, "fd00:111:1::9", "02:00:00:00:71:09", "eth0");
    neigh(&b, "fd00:111:1::5", "02:00:00:00:71:05", "eth0");
    forwarding(&node);
    dnat(
        &node,
        nat,
        "fd00:108::133",
        SERVICE,
        "fd00:111:1::9",
        BACKEND_PORT,
    );
    if Path::new("/proc/sys/net/bridge/bridge-nf-call-ip6tables").exists() {
        node.sysctl("net/bridge/bridge-nf-call-ip6tables", "0")
            .unwrap();
    }
    let _l = listen(
        &b,
        format!("[fd00:111:1::9]:{BACKEND_PORT}").parse().unwrap(),
    );
    let mut args = args.to_vec();
    if let Seen::NodeAloneClientGivingUpAfter1s = seen {
        args.extend(["--netns", &node.name]);
    }
    let k = Kdrop::start(&args);
    let src: SocketAddr = format!("[fd00:111:1::5]:{sport}").parse().unwrap();
    let dst: SocketAddr = format!("[fd00:108::133]:{SERVICE}").parse().unwrap();
    let syn = match seen {
        Seen::Everywhere => Some(send_syn(&a, src, dst)),
        Seen::NodeAloneClientGivingUpAfter1s => {
            connect_within(&a, src, dst, std::time::Duration::from_secs(1))
                .expect_err("the handshake dies");
            None
        }
    };
    let recs = records(k, src);
    let f = one_verdict(&recs, "hairpin_no_reverse_nat");
    // Refused where kdrop saw the SYN-ACK (the client's drop of it, its
    // RST); from the entry's silence where both went by before kdrop armed
    // what shows them (incidents_traced's incident2 says more).
    let summary = match recs[0].kind.as_str() {
        "drop" | "reset" => format!(
            "hairpin: the SYN-ACK from [fd00:111:1::9]:8080 matches the reply side of a DNAT'd \
             connection ([fd00:111:1::5]:{sport} -> [fd00:108::133]:80 => [fd00:111:1::9]:8080) \
             but arrived un-NAT'd: both ends are on bridge cni0"
        ),
        "unanswered" => format!(
            "hairpin: SYN [fd00:111:1::5]:{sport} -> [fd00:108::133]:80 was DNAT'd to \
             [fd00:111:1::9]:8080 and no reply came back through netfilter: both ends are on \
             bridge cni0, which hands the reply straight back un-NAT'd"
        ),
        other => panic!("a hairpin record of kind {other}: {recs:#?}"),
    };
    assert_eq!(f.summary, summary, "{recs:#?}");
    let ev = f.evidence.clone();
    assert!(
        ev.iter().any(|e| e.ends_with(
            "net.bridge.bridge-nf-call-ip6tables = 0: bridged packets skip netfilter, so the \
             reply is not un-DNAT'd"
        )),
        "{ev:#?}"
    );
    assert_eq!(
        f.fix.last().unwrap(),
        &format!(
            "ip netns exec {} sysctl -w net.bridge.bridge-nf-call-ip6tables=1",
            node.name
        ),
        "{f:?}"
    );
    assert_eq!(
        f.fix_or[0].clone(),
        [
            format!(
                "ip netns exec {} ip6tables -t nat -A POSTROUTING -s fd00:111:1::5 -d fd00:111:1::9/128 -p tcp --dport 8080 -j MASQUERADE",
                node.name
            ),
            format!(
                "ip netns exec {} conntrack -D -f ipv6 -p tcp --orig-src fd00:111:1::5 --orig-port-src {sport} --orig-dst fd00:108::133 --orig-port-dst 80",
                node.name
            ),
        ]
    );
    // The sysctl repairs the entry in place: the same 5-tuple connects.
    fix_then_connect(&f, &a, syn, src, dst);
}

#[test]
fn hairpin_v6_traced_by_the_service_port() {
    hairpin(
        "v6hp",
        Nat::Ip6tables,
        &["--json", "--port", "80"],
        43801,
        Seen::Everywhere,
    );
}

/// The node alone, a client elsewhere giving up at 1 s: no retransmission,
/// the refused SYN-ACK unseen; the verdict comes when the next is overdue.
#[test]
fn hairpin_v6_node_alone_client_giving_up_after_1s() {
    hairpin(
        "v6ho",
        Nat::Ip6tables,
        &["--json", "--port", "80"],
        43803,
        Seen::NodeAloneClientGivingUpAfter1s,
    );
}

#[test]
fn hairpin_v6_nft_inet_traced_unfiltered() {
    hairpin("v6hn", Nat::NftInet, &["--json"], 43802, Seen::Everywhere);
}

/// Incident 5 over IPv6, NAT by an nft `inet` table: an office client ->
/// a router -> node B, which DNATs the VIP:80 to a backend:8080 on the
/// router's other side; the backend answers through the router,
/// bypassing node B.
fn asymmetric(test: &str, nat: Nat, args: &[&str], sport: u16) {
    let client = role_ns(test, "cl");
    let router = role_ns(test, "rt");
    let node = role_ns(test, "nb");
    let pod = role_ns(test, "pod");
    for (n, dev, mac, peer_dev, peer_mac) in [
        (&client, "c0", "01", "r0", "02"),
        (&node, "eth0", "03", "rb", "04"),
        (&pod, "eth0", "05", "ra", "06"),
    ] {
        veth(
            n,
            dev,
            &format!("02:00:00:00:76:{mac}"),
            &router,
            peer_dev,
            &format!("02:00:00:00:76:{peer_mac}"),
        )
        .unwrap();
    }
    router
        .ip(&["link", "add", "vpc", "type", "bridge"])
        .unwrap();
    for port in ["rb", "ra"] {
        router.ip(&["link", "set", port, "master", "vpc"]).unwrap();
    }
    router
        .ip(&["link", "set", "vpc", "address", "02:00:00:00:76:07"])
        .unwrap();
    router.ip(&["link", "set", "vpc", "up"]).unwrap();
    addr(&router, "fd00:107::1/64", "vpc");
    addr(&router, "fd00:109:17::1/64", "r0");
    ip6(&router, "route add fd00:107:58::/64 via fd00:107::12");
    forwarding(&router);
    addr(&client, "fd00:109:17::50/64", "c0");
    ip6(&client, "route add default via fd00:109:17::1");
    addr(&node, "fd00:107::12/64", "eth0");
    ip6(&node, "route add default via fd00:107::1");
    forwarding(&node);
    dnat(
        &node,
        nat,
        "fd00:107:58::158",
        SERVICE,
        "fd00:107::13",
        BACKEND_PORT,
    );
    addr(&pod, "fd00:107::13/64", "eth0");
    ip6(&pod, "route add default via fd00:107::1");
    neigh(&client, "fd00:109:17::1", "02:00:00:00:76:02", "c0");
    neigh(&router, "fd00:109:17::50", "02:00:00:00:76:01", "r0");
    neigh(&router, "fd00:107::12", "02:00:00:00:76:03", "vpc");
    neigh(&router, "fd00:107::13", "02:00:00:00:76:05", "vpc");
    neigh(&node, "fd00:107::1", "02:00:00:00:76:07", "eth0");
    neigh(&node, "fd00:107::13", "02:00:00:00:76:05", "eth0");
    neigh(&pod, "fd00:107::1", "02:00:00:00:76:07", "eth0");
    neigh(&pod, "fd00:107::12", "02:00:00:00:76:03", "eth0");
    let _l = listen(
        &pod,
        format!("[fd00:107::13]:{BACKEND_PORT}").parse().unwrap(),
    );
    let k = Kdrop::start(args);
    let src: SocketAddr = format!("[fd00:109:17::50]:{sport}").parse().unwrap();
    let dst: SocketAddr = format!("[fd00:107:58::158]:{SERVICE}").parse().unwrap();
    let syn = send_syn(&client, src, dst);
    let recs = records(k, src);
    let f = one_verdict(&recs, "asymmetric_return_path");
    assert_eq!(
        f.summary,
        format!(
            "SYN [fd00:109:17::50]:{sport} -> [fd00:107:58::158]:80 was DNAT'd to \
             [fd00:107::13]:8080 and sent out eth0, but no reply came back through this host: \
             asymmetric return path"
        )
    );
    assert_eq!(
        f.fix.clone(),
        [
            format!(
                "ip netns exec {} ip6tables -t nat -A POSTROUTING -d fd00:107::13/128 -p tcp --dport 8080 -j MASQUERADE",
                node.name
            ),
            format!(
                "ip netns exec {} conntrack -D -f ipv6 -p tcp --orig-src fd00:109:17::50 --orig-port-src {sport} --orig-dst fd00:107:58::158 --orig-port-dst 80",
                node.name
            ),
        ]
    );
    fix_then_connect(&f, &client, syn, src, dst);
}

#[test]
fn asymmetric_v6_nft_inet_traced_by_the_service_port() {
    asymmetric("v6as", Nat::NftInet, &["--json", "--port", "80"], 45801);
}

#[test]
fn asymmetric_v6_ip6tables_traced_by_the_service_port() {
    asymmetric("v6ai", Nat::Ip6tables, &["--json", "--port", "80"], 45803);
}

#[test]
fn asymmetric_v6_nft_inet_traced_by_the_client_network() {
    asymmetric(
        "v6ah",
        Nat::NftInet,
        &["--json", "--host", "fd00:109:17::/64"],
        45802,
    );
}

/// A Service with no endpoints, over IPv6: kube-proxy's filter rule
/// REJECTs new connections to its address (here served on the node, so
/// that once kube-proxy drops the REJECT a connection reaches the listener).
#[test]
fn no_endpoints_reject_v6() {
    let test = "v6ne";
    let node = role_ns(test, "node");
    let pod = role_ns(test, "pod");
    veth(
        &pod,
        "eth0",
        "02:00:00:00:77:01",
        &node,
        "cali5",
        "02:00:00:00:77:02",
    )
    .unwrap();
    addr(&node, "fd00:110:2::1/64", "cali5");
    addr(&pod, "fd00:110:2::5/64", "eth0");
    ip6(&pod, "route add default via fd00:110:2::1");
    addr(&node, "fd00:108::20/128", "lo");
    let jump = "-A INPUT -m conntrack --ctstate NEW -m comment --comment";
    let reject = "-A KUBE-SERVICES -d fd00:108::20/128 -p tcp -m comment --comment";
    let reject_tail = "-m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable";
    for (head, comment, tail) in [
        ("-N KUBE-SERVICES", None, ""),
        (jump, Some("kubernetes service portals"), "-j KUBE-SERVICES"),
        (reject, Some("ns6/svc6:p80 has no endpoints"), reject_tail),
    ] {
        let mut args: Vec<&str> = head.split(' ').collect();
        args.extend(comment);
        args.extend(tail.split(' ').filter(|s| !s.is_empty()));
        node.exec("ip6tables", &args).unwrap();
    }
    let _l = listen(&node, "[fd00:108::20]:80".parse().unwrap());
    let k = Kdrop::start(&["--json", "--port", "80"]);
    let src: SocketAddr = "[fd00:110:2::5]:47801".parse().unwrap();
    let dst: SocketAddr = "[fd00:108::20]:80".parse().unwrap();
    let _syn = send_syn(&pod, src, dst);
    // The kernel's reason where it names one (none before 5.17).
    let reason = kernel_reason("NETFILTER_DROP");
    let e = k.expect_record("the REJECTed SYN", |e| {
        e.of(src) && e.kind == "drop" && e.reason.as_deref() == reason
    });
    let rule = format!("{reject} \"ns6/svc6:p80 has no endpoints\" {reject_tail}");
    assert_eq!(e.family, "ipv6");
    assert_eq!(e.netfilter().family.as_deref(), Some("ip6"), "{e}");
    assert_eq!(e.netfilter().rule.as_deref(), Some(&*rule), "{e}");
    let f = e.finding();
    // kube-proxy's own rule: named as Kubernetes names it, and no fix on
    // the node (kube-proxy rewrites its rules within seconds).
    assert_eq!(f.cause, "kube_no_endpoints", "{e}");
    assert_eq!(e.service.as_deref(), Some("ns6/svc6:80"), "{e}");
    assert_eq!(
        f.summary,
        "Service ns6/svc6 port p80 has no ready endpoints: kube-proxy rejects new connections to its cluster IP [fd00:108::20]:80"
    );
    assert!(f.fix.is_empty(), "{e}");
    assert!(
        f.fix_notes[0].starts_with("give the Service ready endpoints"),
        "{e}"
    );
    assert_eq!(
        f.inspect[..2],
        [
            "kubectl -n ns6 get endpointslices -l kubernetes.io/service-name=svc6",
            "kubectl -n ns6 get svc svc6 -o yaml"
        ]
    );
    k.stop(libc::SIGINT);
    // The repair the note names, as kube-proxy writes it once the Service
    // has a ready endpoint (here the node itself serves the address): the
    // "has no endpoints" REJECT goes.
    node.exec("ip6tables", &["-w", "-t", "filter", "-F", "KUBE-SERVICES"])
        .unwrap();
    connect_from(&pod, "[fd00:110:2::5]:47802".parse().unwrap(), dst)
        .expect("a new connection after the fix");
}
