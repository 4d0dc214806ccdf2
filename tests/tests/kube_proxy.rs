//! kube-proxy's own rules, as kube-proxy writes them (tests/fixtures/kube-proxy,
//! restored whole with iptables-legacy-restore), in a "node" namespace between
//! a client and a backend: a Service with no endpoints rejects, a Local
//! Service with no endpoint on the node drops, and a working ClusterIP names
//! its Service in a later drop. kdrop is told only the Service's port.
//!
//! The namespaces are addressed as the fixture's cluster is (pods in
//! 10.0.0.0/8 and 10.180.0.0/24, the node's own addresses for node ports), so
//! the rule sets are restored exactly as written: nothing is substituted.
use std::{io::ErrorKind, net::SocketAddr, path::PathBuf};

use integration_tests::{
    assert_kinds, connect_from, inode, listen, ns_name, reason_for, run_fix, send_syn, veth, Kdrop,
    Ns, Record,
};
use kdrop::diagnosis::{fix_kinds::Kind, netfilter::fixes::FixKind};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/kube-proxy")
        .join(name)
}

/// A rule line of the fixture's `iptables-save` output: what the kernel
/// holds, independent of kdrop.
fn saved(needle: &str) -> String {
    let text = std::fs::read_to_string(fixture("v1.31-iptables.save")).unwrap();
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no rule with {needle}"))
        .to_string()
}

/// client (a pod 10.0.1.2, and an outside host 192.168.7.2) — node (kube-proxy's
/// rules, 10.0.1.1 / 192.168.7.1 / 10.180.0.254) — backend (the endpoints
/// 10.180.0.1, .2 and .6, listening on :80).
struct Cluster {
    client: Ns,
    node: Ns,
    backend: Ns,
    _listener: std::net::TcpListener,
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

impl Cluster {
    /// The cluster with kube-proxy's iptables rules.
    fn new(tag: &str) -> Self {
        let c = Self::bare(tag);
        c.restore("v1.31-iptables.rules");
        c
    }

    /// The namespaces and addresses, no kube-proxy rules yet.
    fn bare(tag: &str) -> Self {
        let client = Ns::new(&ns_name(&format!("kp{tag}-c"))).unwrap();
        let node = Ns::new(&ns_name(&format!("kp{tag}-n"))).unwrap();
        let backend = Ns::new(&ns_name(&format!("kp{tag}-b"))).unwrap();
        veth(
            &client,
            "c0",
            "02:00:00:00:07:01",
            &node,
            "n0",
            "02:00:00:00:07:02",
        )
        .unwrap();
        veth(
            &node,
            "n1",
            "02:00:00:00:07:03",
            &backend,
            "b0",
            "02:00:00:00:07:04",
        )
        .unwrap();
        for a in ["10.0.1.2/24", "192.168.7.2/24", "192.168.0.9/24"] {
            client.ip(&["addr", "add", a, "dev", "c0"]).unwrap();
        }
        client
            .ip(&["route", "add", "default", "via", "10.0.1.1"])
            .unwrap();
        // 192.168.0.2: the node address in the nftables fixture's nodeport-ips.
        for a in ["10.0.1.1/24", "192.168.7.1/24", "192.168.0.2/24"] {
            node.ip(&["addr", "add", a, "dev", "n0"]).unwrap();
        }
        node.ip(&["addr", "add", "10.180.0.254/24", "dev", "n1"])
            .unwrap();
        // Cluster IPs are routed like any address off the node.
        node.ip(&["route", "add", "default", "via", "10.180.0.1"])
            .unwrap();
        node.sysctl("net/ipv4/ip_forward", "1").unwrap();
        for a in ["10.180.0.1/24", "10.180.0.2/24", "10.180.0.6/24"] {
            backend.ip(&["addr", "add", a, "dev", "b0"]).unwrap();
        }
        backend
            .ip(&["route", "add", "default", "via", "10.180.0.254"])
            .unwrap();
        let listener = listen(&backend, sa("0.0.0.0:80"));
        Cluster {
            client,
            node,
            backend,
            _listener: listener,
        }
    }

    /// What kube-proxy does on every sync: the whole rule set, restored.
    fn restore(&self, name: &str) {
        let path = fixture(name);
        self.node
            .exec("iptables-legacy-restore", &[path.to_str().unwrap()])
            .unwrap_or_else(|e| panic!("{e:#}"));
    }
}

/// The drop of a SYN `src -> dst` in the node, as kdrop reports it.
fn node_drop(k: &Kdrop, c: &Cluster, src: SocketAddr, dst: SocketAddr) -> Record {
    let _syn = send_syn(&c.client, src, dst);
    let node = inode(&c.node);
    let e = k.expect_record("the drop in the node", |e| {
        e.is_tuple(&src, &dst) && e.netns == node && e.kind == "drop"
    });
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"), "{e}");
    e
}

/// kube-proxy's own finding: named for the Service, nothing to run, the
/// objects to look at.
fn check_kube_finding(e: &Record, cause: &str, summary: &str, ns: &str, svc: &str) {
    let f = e.finding();
    assert_eq!(f.cause, cause, "{e}");
    assert!(
        f.summary.contains(summary),
        "summary {} lacks {summary}",
        f.summary
    );
    assert!(f.fix.is_empty(), "{e}");
    let inspect = f.inspect.clone();
    for want in [
        format!("kubectl -n {ns} get endpointslices -l kubernetes.io/service-name={svc}"),
        format!("kubectl -n {ns} get svc {svc} -o yaml"),
    ] {
        assert!(inspect.contains(&want), "{want} not in {inspect:?}");
    }
    let notes = f.fix_notes.join("\n");
    assert!(notes.contains("deleting it repairs nothing"), "{notes}");
}

#[test]
fn no_endpoints_reject() {
    let c = Cluster::new("r");
    let (src, vip) = (sa("10.0.1.2:41001"), sa("172.30.0.46:80"));
    let k = Kdrop::start(&["--json", "--port", "80"]);
    let e = node_drop(&k, &c, src, vip);
    assert_eq!(e.netfilter().table.as_deref(), Some("filter"), "{e}");
    assert_eq!(e.netfilter().chain.as_deref(), Some("KUBE-SERVICES"), "{e}");
    assert_eq!(
        e.netfilter().rule.as_deref(),
        Some(&*saved("ns6/svc6:p80 has no endpoints")),
        "{e}"
    );
    check_kube_finding(
        &e,
        "kube_no_endpoints",
        "Service ns6/svc6 port p80 has no ready endpoints: kube-proxy rejects new connections to its cluster IP 172.30.0.46:80",
        "ns6",
        "svc6",
    );
    assert_eq!(e.service.as_deref(), Some("ns6/svc6:80"), "{e}");
    k.stop(libc::SIGINT);
    // The REJECT answers: refused, not timed out.
    let err = connect_from(&c.client, sa("10.0.1.2:41011"), vip).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    // The note's repair: a ready endpoint (10.180.0.6:80); kube-proxy then
    // writes its rules, and a new connection is served.
    c.restore("v1.31-iptables-ready.rules");
    connect_from(&c.client, sa("10.0.1.2:41021"), vip).expect("svc6 with a ready endpoint");
    drop(c.backend);
}

#[test]
fn no_local_endpoint_drop() {
    let c = Cluster::new("l");
    // From outside the cluster to the node's own address: the node port.
    let (src, np) = (sa("192.168.7.2:41002"), sa("192.168.7.1:3001"));
    let k = Kdrop::start(&["--json", "--port", "3001"]);
    let e = node_drop(&k, &c, src, np);
    assert_eq!(
        e.netfilter().chain.as_deref(),
        Some("KUBE-EXTERNAL-SERVICES"),
        "{e}"
    );
    assert_eq!(
        e.netfilter().rule.as_deref(),
        Some(&*saved("--dst-type LOCAL -m tcp --dport 3001 -j DROP")),
        "{e}"
    );
    check_kube_finding(
        &e,
        "kube_no_local_endpoints",
        "Service ns2/svc2 port p80 has no endpoint on this node and externalTrafficPolicy is Local: kube-proxy drops new connections to its node port 3001 here",
        "ns2",
        "svc2",
    );
    let notes = e.finding().fix_notes.join("\n");
    assert!(
        notes.contains("run a ready endpoint of the Service on this node"),
        "{notes}"
    );
    assert_eq!(e.service.as_deref(), Some("ns2/svc2:80"), "{e}");
    k.stop(libc::SIGINT);
    // The note's repair: svc2's endpoint 10.180.0.2 runs on this node.
    c.restore("v1.31-iptables-ready.rules");
    connect_from(&c.client, sa("192.168.7.2:41022"), np).expect("node port with a local endpoint");
}

#[test]
fn cluster_ip_names_its_service() {
    let c = Cluster::new("n");
    let vip = sa("172.30.0.41:80");
    // kube-proxy's DNAT works: the backend pod answers the cluster IP.
    connect_from(&c.client, sa("10.0.1.2:41003"), vip).expect("svc1 through its cluster IP");
    // A policy on the node between the Service and its backend.
    c.node
        .exec(
            "iptables-legacy",
            &[
                "-I",
                "FORWARD",
                "1",
                "-d",
                "10.180.0.1/32",
                "-p",
                "tcp",
                "-m",
                "tcp",
                "--dport",
                "80",
                "-j",
                "DROP",
            ],
        )
        .unwrap();
    let k = Kdrop::start(&["--json", "--port", "80"]);
    // After DNAT, the packet in FORWARD goes to the backend endpoint.
    let (src, backend) = (sa("10.0.1.2:41004"), sa("10.180.0.1:80"));
    let e = node_drop(&k, &c, src, backend);
    assert_eq!(e.netfilter().chain.as_deref(), Some("FORWARD"), "{e}");
    assert_eq!(
        e.netfilter().rule.as_deref(),
        Some("-A FORWARD -d 10.180.0.1/32 -p tcp -m tcp --dport 80 -j DROP"),
        "{e}"
    );
    assert_eq!(e.service.as_deref(), Some("ns1/svc1:80"), "{e}");
    let f = e.finding();
    assert_eq!(f.cause, "netfilter_rule", "{e}");
    let summary = f.summary.as_str();
    assert!(summary.starts_with("to service ns1/svc1:80: "), "{summary}");
    k.stop(libc::SIGINT);
    let fix = f.fix.clone();
    // kube-proxy's rules are not repaired; this one is the test's own.
    assert_kinds(&fix, &[Kind::Netfilter(FixKind::IptablesAcceptBeforeRule)]);
    for cmd in &fix {
        run_fix(cmd);
    }
    connect_from(&c.client, sa("10.0.1.2:41024"), vip).expect("after the fix");
}

/// kube-proxy's nftables mode: the same Services in its `ip kube-proxy`
/// table (verdict maps, no rule comments).
#[test]
fn nftables_mode() {
    let c = Cluster::bare("t");
    let path = fixture("nftables.nft");
    c.node
        .exec("nft", &["-f", path.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let k = Kdrop::start(&["--json", "--port", "80"]);
    let (src, vip) = (sa("10.0.1.2:41005"), sa("172.30.0.46:80"));
    let e = node_drop(&k, &c, src, vip);
    assert_eq!(e.netfilter().table.as_deref(), Some("kube-proxy"), "{e}");
    check_kube_finding(
        &e,
        "kube_no_endpoints",
        "Service ns6/svc6 port p80 has no ready endpoints: kube-proxy rejects new connections to its cluster IP 172.30.0.46:80",
        "ns6",
        "svc6",
    );
    assert_eq!(e.service.as_deref(), Some("ns6/svc6:80"), "{e}");
    k.stop(libc::SIGINT);
    let k = Kdrop::start(&["--json", "--port", "3001"]);
    let (src, np) = (sa("192.168.0.9:41006"), sa("192.168.0.2:3001"));
    let e = node_drop(&k, &c, src, np);
    check_kube_finding(
        &e,
        "kube_no_local_endpoints",
        "Service ns2/svc2 port p80 has no endpoint on this node and externalTrafficPolicy is Local: kube-proxy drops new connections to its node port 3001 here",
        "ns2",
        "svc2",
    );
    assert_eq!(e.service.as_deref(), Some("ns2/svc2:80"), "{e}");
    k.stop(libc::SIGINT);
}
