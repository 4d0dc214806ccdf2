//! Against the rule sets kube-proxy writes (tests/fixtures/kube-proxy).
#![cfg(test)]
use std::net::SocketAddr;

use super::*;
use crate::diagnosis::kube::{classify, finding::explain, KubeDrop};
use crate::diagnosis::reason::DropFacts;
use crate::model::netfilter::{Attribution, Backend, DroppedBy, Family, Hook};

const V131_SAVE: &str = include_str!("../../../../tests/fixtures/kube-proxy/v1.31-iptables.save");
const V131_RULES: &str = include_str!("../../../../tests/fixtures/kube-proxy/v1.31-iptables.rules");
const V122_SAVE: &str = include_str!("../../../../tests/fixtures/kube-proxy/v1.22-iptables.save");
const V131_READY: &str =
    include_str!("../../../../tests/fixtures/kube-proxy/v1.31-iptables-ready.rules");

fn services(text: &str) -> Services {
    Services::from_rules(text.lines().filter_map(KubeRule::parse))
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn named(s: &Services, addr: &str, local: bool) -> Option<(String, Kind)> {
    s.frontend(sa(addr), local)
        .map(|f| (f.svc.display(), f.kind))
}

#[test]
fn svc_port_names() {
    let p = SvcPort::parse("ns1/svc1:p80").unwrap();
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str(), p.port_name.as_str()),
        ("ns1", "svc1", "p80")
    );
    assert_eq!(p.display(), "ns1/svc1:p80");
    assert_eq!(p.port_phrase(), "port p80");
    // An unnamed port: kube-proxy writes `ns/svc`, before 1.25 `ns/svc:`.
    let u = SvcPort::parse("default/mysql").unwrap();
    assert_eq!(u.display(), "default/mysql");
    assert_eq!(SvcPort::parse("default/echo:").unwrap().port_name, "");
    assert_eq!(
        SvcPort {
            port: Some(3306),
            ..u
        }
        .port_phrase(),
        "port 3306"
    );
    assert_eq!(SvcPort::parse("kubernetes forwarding rules"), None);
    assert_eq!(SvcPort::parse("Redirect"), None);
}

/// Namespaces and Service names are lowercase DNS labels, never empty: a
/// comment someone else wrote with a slash in its first word names no
/// Service.
#[test]
fn svc_port_parse_rejects_what_kubernetes_would_not_name() {
    assert_eq!(SvcPort::parse("/svc1:p80"), None);
    assert_eq!(SvcPort::parse("ns1/:p80"), None);
    assert_eq!(SvcPort::parse("Ns1/svc1:p80"), None);
    assert_eq!(SvcPort::parse("ns1/Svc1:p80"), None);
    assert_eq!(SvcPort::parse("Allow/Deny"), None);
    assert_eq!(
        SvcPort::parse("kube-system/kube-dns:dns-tcp"),
        Some(SvcPort {
            namespace: "kube-system".into(),
            name: "kube-dns".into(),
            port_name: "dns-tcp".into(),
            port: None,
        })
    );
}

#[test]
fn rule_parts() {
    let r = KubeRule::parse(
        r#"-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable"#,
    )
    .unwrap();
    assert_eq!(r.chain, "KUBE-SERVICES");
    assert_eq!(r.dst, Some("172.30.0.46".parse().unwrap()));
    assert_eq!(r.dport, Some(80));
    assert_eq!(r.target, "REJECT");
    assert_eq!(r.remark(), "has no endpoints");
    assert_eq!(r.svc().unwrap().display(), "ns6/svc6:p80");
    // A negated source is no destination.
    let m = KubeRule::parse(
        r#"-A KUBE-SVC-X ! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ"#,
    )
    .unwrap();
    assert_eq!(m.dst, Some("172.30.0.41".parse().unwrap()));
    assert!(KubeRule::parse(":KUBE-SERVICES - [0:0]").is_none());
    assert_eq!(
        chain_hash("KUBE-SVL-GNZBNJ2PO5MGZ6GT"),
        Some("GNZBNJ2PO5MGZ6GT")
    );
    assert_eq!(chain_hash("KUBE-SEP-RS4RBKLTHTF2IUXJ"), None);
}

/// `!` negates the one match after it: a negated address, mark or state is
/// not the rule's, and the matches after it are read as written.
#[test]
fn a_negated_match_is_not_the_rules_value() {
    // Docker's jump for the node's own addresses other than loopback.
    let docker =
        KubeRule::parse("-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER")
            .unwrap();
    assert_eq!(
        (docker.dst, docker.dst_local, docker.target.as_str()),
        (None, true, "DOCKER")
    );
    let localnet = KubeRule::parse(line(V122_SAVE, "block incoming localnet")).unwrap();
    assert_eq!(
        (localnet.dst, localnet.ctstate, localnet.target.as_str()),
        (Some("127.0.0.0".parse().unwrap()), None, "DROP")
    );
    let masq = KubeRule::parse(line(V122_SAVE, "-A KUBE-POSTROUTING -m mark !")).unwrap();
    assert_eq!((masq.mark, masq.target.as_str()), (None, "RETURN"));
    let input = KubeRule::parse(
        "-A INPUT -p tcp -m addrtype ! --dst-type LOCAL -m tcp ! --dport 22 -j DROP",
    )
    .unwrap();
    assert_eq!(
        (input.dst_local, input.dport, input.target.as_str()),
        (false, None, "DROP")
    );
}

/// A NodePort Service with no endpoints gets no nat rules from kube-proxy:
/// filter's REJECTs are the only trace of its cluster IP and node port.
#[test]
fn the_filter_reject_alone_names_a_node_port_without_endpoints() {
    let s = services(
        r#"-A KUBE-SERVICES -d 172.30.0.43/32 -p tcp -m comment --comment "ns3/svc3:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns3/svc3:p80 has no endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 3003 -j REJECT --reject-with icmp-port-unreachable"#,
    );
    assert_eq!(
        named(&s, "192.0.2.10:3003", true),
        Some(("ns3/svc3:80".into(), Kind::NodePort))
    );
    assert_eq!(
        named(&s, "172.30.0.43:80", false),
        Some(("ns3/svc3:80".into(), Kind::ClusterIp))
    );
}

/// kube-proxy itself answers the healthCheckNodePort of an
/// externalTrafficPolicy: Local Service (filter's KUBE-NODEPORTS ACCEPT):
/// it is no node port of the Service.
#[test]
fn the_health_check_node_port_is_not_a_service_node_port() {
    for text in [V131_SAVE, V122_SAVE] {
        let s = services(text);
        assert_eq!(named(&s, "192.0.2.10:30000", true), None);
        assert_eq!(
            named(&s, "192.0.2.10:3001", true),
            Some(("ns2/svc2:80".into(), Kind::NodePort))
        );
    }
}

/// Empty means kube-proxy named nothing here: a virtual address, a node
/// port or an endpoint alone is a name.
#[test]
fn services_are_empty_only_without_any_address_named() {
    assert!(Services::default().is_empty());
    assert!(!services(V131_SAVE).is_empty());
    let vip = services(line(
        V131_SAVE,
        "\"ns1/svc1:p80 cluster IP\" -m tcp --dport 80 -j KUBE-SVC",
    ));
    assert_eq!(
        (vip.vips.len(), vip.node_ports.len(), vip.endpoints.len()),
        (1, 0, 0)
    );
    assert!(!vip.is_empty());
    let node_port = services(line(
        V131_SAVE,
        "-A KUBE-NODEPORTS -p tcp -m comment --comment \"ns3/svc3:p80\"",
    ));
    assert_eq!(
        (
            node_port.vips.len(),
            node_port.node_ports.len(),
            node_port.endpoints.len()
        ),
        (0, 1, 0)
    );
    assert!(!node_port.is_empty());
    let endpoint = services(line(V131_SAVE, "--to-destination 10.180.0.1:80"));
    assert_eq!(
        (
            endpoint.vips.len(),
            endpoint.node_ports.len(),
            endpoint.endpoints.len()
        ),
        (0, 0, 1)
    );
    assert!(!endpoint.is_empty());
}

/// kube-proxy's Service rules are in nat and filter of the iptables
/// backends; kube-proxy-shaped rules elsewhere name nothing.
#[test]
fn from_tables_reads_only_the_iptables_nat_and_filter_tables() {
    use crate::parse::iptables_save::parse_save;
    let tables = parse_save(
        V131_SAVE,
        Backend::IptablesLegacy,
        Family::Ip,
        "iptables-legacy-save -c",
    )
    .unwrap();
    assert_eq!(
        tables.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["nat", "filter"]
    );
    let s = Services::from_tables(&tables);
    let want = services(V131_SAVE);
    assert_eq!(s.vips, want.vips);
    assert_eq!(s.node_ports, want.node_ports);
    assert_eq!(s.endpoints, want.endpoints);
    assert_eq!(s.chains, want.chains);
    // The cluster IP only nat names, and the one only filter names.
    assert_eq!(
        named(&s, "172.30.0.41:80", false),
        Some(("ns1/svc1:80".into(), Kind::ClusterIp))
    );
    assert_eq!(
        named(&s, "172.30.0.46:80", false),
        Some(("ns6/svc6:80".into(), Kind::ClusterIp))
    );

    let renamed = |name: &str| {
        let mut t = tables.clone();
        t.iter_mut().for_each(|t| t.name = name.into());
        t
    };
    assert!(Services::from_tables(&renamed("mangle")).is_empty());
    assert!(Services::from_tables(&renamed("raw")).is_empty());
    let mut nft = tables.clone();
    nft.iter_mut().for_each(|t| t.backend = Backend::Nftables);
    assert!(Services::from_tables(&nft).is_empty());
}

/// `kdrop record` bundles carry the Services as JSON, where a tuple key
/// cannot be an object key: mark_drops goes as a list of pairs and comes
/// back whole.
#[test]
fn mark_drops_survive_a_json_round_trip() {
    let s = services(V122_SAVE);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(
        json["mark_drops"],
        serde_json::json!([[["ns2", "svc2", "p80"], true]])
    );
    let back: Services = serde_json::from_value(json).unwrap();
    assert_eq!(back.mark_drops, s.mark_drops);
    assert_eq!(back.vips, s.vips);
}

/// Once a Service has endpoints kube-proxy writes no filter rule for it:
/// the nat jumps alone name its external IP.
#[test]
fn the_nat_comment_names_an_external_ip() {
    let s = services(V131_READY);
    assert_eq!(
        named(&s, "192.168.99.22:80", false),
        Some(("ns2/svc2:80".into(), Kind::ExternalIp))
    );
    assert_eq!(
        named(&s, "192.168.99.33:80", false),
        Some(("ns4/svc4:80".into(), Kind::ExternalIp))
    );
    assert_eq!(
        named(&s, "1.2.3.4:80", false),
        Some(("ns2/svc2:80".into(), Kind::LoadBalancer))
    );
    assert_eq!(
        named(&s, "172.30.0.46:80", false),
        Some(("ns6/svc6:80".into(), Kind::ClusterIp))
    );
}

/// Both the restore input kube-proxy writes and what iptables-save prints
/// back give the same names.
#[test]
fn v131_names() {
    for text in [V131_SAVE, V131_RULES] {
        let s = services(text);
        assert_eq!(
            named(&s, "172.30.0.41:80", false),
            Some(("ns1/svc1:80".into(), Kind::ClusterIp))
        );
        assert_eq!(
            named(&s, "1.2.3.4:80", false),
            Some(("ns2/svc2:80".into(), Kind::LoadBalancer))
        );
        assert_eq!(
            named(&s, "192.168.99.22:80", false),
            Some(("ns2/svc2:80".into(), Kind::ExternalIp))
        );
        assert_eq!(
            named(&s, "5.6.7.8:80", false),
            Some(("ns5/svc5:80".into(), Kind::LoadBalancer))
        );
        // No endpoints: only the filter REJECT names the cluster IP.
        assert_eq!(
            named(&s, "172.30.0.46:80", false),
            Some(("ns6/svc6:80".into(), Kind::ClusterIp))
        );
        // Node ports only on the node's own addresses.
        assert_eq!(
            named(&s, "192.0.2.10:3001", true),
            Some(("ns2/svc2:80".into(), Kind::NodePort))
        );
        assert_eq!(named(&s, "192.0.2.10:3001", false), None);
        assert_eq!(
            named(&s, "192.0.2.10:3003", true),
            Some(("ns3/svc3:80".into(), Kind::NodePort))
        );
        assert_eq!(named(&s, "172.30.0.41:81", false), None);
        // Backends.
        assert_eq!(
            s.serving(sa("10.180.0.1:80")).unwrap().display(),
            "ns1/svc1:80"
        );
        assert_eq!(
            s.serving(sa("10.180.0.4:80")).unwrap().display(),
            "ns4/svc4:80"
        );
        assert_eq!(
            s.serving(sa("10.180.0.5:80")).unwrap().display(),
            "ns4/svc4:80"
        );
        assert_eq!(s.serving(sa("10.180.0.9:80")), None);
        assert_eq!(s.endpoints.len(), 5);
        assert_eq!(s.chains["XPGD46QRK7WJZT7O"].display(), "ns1/svc1:80");
        assert_eq!(s.chains["GNZBNJ2PO5MGZ6GT"].display(), "ns2/svc2:80");
        assert!(s.mark_drops.is_empty());
    }
}

/// `--port 80` follows the node ports of the Services on port 80, and
/// nothing for a port no Service has.
#[test]
fn node_ports_of_a_service_port() {
    for text in [V131_SAVE, V131_RULES] {
        let s = services(text);
        let of = |ports: &[u16]| {
            s.node_ports_of(ports)
                .into_iter()
                .map(|(np, svc)| (np, svc.display()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            of(&[80]),
            [
                (3001, "ns2/svc2:80".to_string()),
                (3002, "ns5/svc5:80".to_string()),
                (3003, "ns3/svc3:80".to_string())
            ]
        );
        // A node port asked for already is not added again; the health
        // check node port (30000) is no Service's node port.
        assert_eq!(of(&[80, 3002]).len(), 2);
        assert!(of(&[443, 30000]).is_empty());
        assert!(of(&[]).is_empty());
    }
}

#[test]
fn v122_names() {
    let s = services(V122_SAVE);
    assert_eq!(
        named(&s, "172.30.0.41:80", false),
        Some(("ns1/svc1:80".into(), Kind::ClusterIp))
    );
    assert_eq!(
        named(&s, "10.1.1.1:3001", true),
        Some(("ns2/svc2:80".into(), Kind::NodePort))
    );
    assert_eq!(
        s.serving(sa("10.180.0.2:80")).unwrap().display(),
        "ns2/svc2:80"
    );
    // KUBE-XLB marks for want of a local endpoint (KUBE-FW marks too).
    assert_eq!(
        s.mark_drops
            .get(&("ns2".into(), "svc2".into(), "p80".into())),
        Some(&true)
    );
}

fn line<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no rule with {needle}"))
}

fn attribution(table: &str, rule: &str) -> Attribution {
    let r = KubeRule::parse(rule).unwrap();
    Attribution {
        dropped_by: DroppedBy::Rule,
        method: "rule counters (iptables-legacy-save -c)".into(),
        hook: Some(Hook::Forward),
        family: Some(Family::Ip),
        backend: Some(Backend::IptablesLegacy),
        table: Some(table.into()),
        chain: Some(r.chain),
        rule: Some(rule.into()),
        rule_number: Some(1),
        handle: None,
        target: Some(r.target),
        packets_before: Some(0),
        packets_after: Some(1),
        ctstate_invalid: false,
        accepts_established: None,
        before_conntrack: false,
        gone: false,
        conntrack: None,
        evidence: vec![],
    }
}

fn facts(src: &str, dst: &str) -> DropFacts<'static> {
    DropFacts {
        reason: Some("NETFILTER_DROP"),
        ifname: "n0",
        netns: Some("node"),
        src: src.into(),
        dst: dst.into(),
        location: Some("nf_hook_slow+0x7d"),
        tcp_flags: 0x02,
        netfilter: None,
        unattributed: None,
    }
}

#[test]
fn no_endpoints_reject() {
    let s = services(V131_SAVE);
    let a = attribution("filter", line(V131_SAVE, "has no endpoints"));
    let k = classify(&a, &s, sa("172.30.0.46:80"), false).unwrap();
    assert_eq!(
        k,
        KubeDrop::NoEndpoints {
            svc: s.vips[&sa("172.30.0.46:80")].svc.clone(),
            kind: Kind::ClusterIp
        }
    );
    let f = explain(&k, &a, &facts("10.0.0.2:40000", "172.30.0.46:80"));
    assert_eq!(f.cause, "kube_no_endpoints");
    assert_eq!(
        f.summary,
        "Service ns6/svc6 port p80 has no ready endpoints: kube-proxy rejects new connections to its cluster IP 172.30.0.46:80"
    );
    assert!(f.fix.is_empty() && f.fix_or.is_empty());
    assert_eq!(
        f.inspect,
        [
            "kubectl -n ns6 get endpointslices -l kubernetes.io/service-name=svc6",
            "kubectl -n ns6 get svc svc6 -o yaml",
            "ip netns exec node iptables-legacy -t filter -L KUBE-SERVICES -v -n -x --line-numbers"
        ]
    );
    assert!(f.fix_notes[0].starts_with("give the Service ready endpoints"));
    assert!(f
        .fix_notes
        .last()
        .unwrap()
        .contains("deleting it repairs nothing"));
    assert!(
        f.evidence
            .iter()
            .any(|e| e
                .starts_with("rule in filter/KUBE-SERVICES: -A KUBE-SERVICES -d 172.30.0.46/32"))
    );
}

#[test]
fn no_local_endpoints_drop() {
    let s = services(V131_SAVE);
    let np = line(V131_SAVE, "--dst-type LOCAL -m tcp --dport 3001 -j DROP");
    let a = attribution("filter", np);
    let k = classify(&a, &s, sa("192.0.2.10:3001"), true).unwrap();
    let f = explain(&k, &a, &facts("192.168.7.2:40000", "192.0.2.10:3001"));
    assert_eq!(f.cause, "kube_no_local_endpoints");
    assert_eq!(
        f.summary,
        "Service ns2/svc2 port p80 has no endpoint on this node and externalTrafficPolicy is Local: kube-proxy drops new connections to its node port 3001 here"
    );
    assert!(f.fix.is_empty());
    assert!(f.fix_notes[0].contains("set externalTrafficPolicy: Cluster"));
    assert_eq!(
        f.inspect[0],
        "kubectl -n ns2 get endpointslices -l kubernetes.io/service-name=svc2"
    );

    // The load-balancer IP: the same Service, named as reached.
    let lb = attribution(
        "filter",
        line(
            V131_SAVE,
            "1.2.3.4/32 -p tcp -m comment --comment \"ns2/svc2:p80 has no local",
        ),
    );
    let k = classify(&lb, &s, sa("1.2.3.4:80"), false).unwrap();
    assert_eq!(
        k,
        KubeDrop::NoLocalEndpoints {
            svc: s.vips[&sa("1.2.3.4:80")].svc.clone(),
            kind: Kind::LoadBalancer,
            marked: false
        }
    );
    let f = explain(&k, &lb, &facts("192.168.7.2:40000", "1.2.3.4:80"));
    assert!(f
        .summary
        .ends_with("new connections to its load-balancer IP 1.2.3.4:80 here"));
}

/// internalTrafficPolicy: Local with no endpoint on this node: kube-proxy
/// drops what reaches the cluster IP here; the advice is about the
/// internal policy, with nothing about masquerading or load balancers.
#[test]
fn no_local_endpoints_on_a_cluster_ip_names_the_internal_traffic_policy() {
    let rule = r#"-A KUBE-SERVICES -d 172.30.0.47/32 -p tcp -m comment --comment "ns7/svc7:p80 has no local endpoints" -m tcp --dport 80 -j DROP"#;
    let s = services(rule);
    let a = attribution("filter", rule);
    let k = classify(&a, &s, sa("172.30.0.47:80"), false).unwrap();
    assert_eq!(
        k,
        KubeDrop::NoLocalEndpoints {
            svc: SvcPort {
                namespace: "ns7".into(),
                name: "svc7".into(),
                port_name: "p80".into(),
                port: Some(80),
            },
            kind: Kind::ClusterIp,
            marked: false
        }
    );
    let f = explain(&k, &a, &facts("10.0.0.2:40000", "172.30.0.47:80"));
    assert_eq!(
        f.summary,
        "Service ns7/svc7 port p80 has no endpoint on this node and internalTrafficPolicy is Local: kube-proxy drops new connections to its cluster IP 172.30.0.47:80 here"
    );
    assert_eq!(
        f.fix_notes,
        [
            "run a ready endpoint of the Service on this node, or set internalTrafficPolicy: Cluster (then traffic is forwarded to endpoints on other nodes), or send the traffic only to nodes that have an endpoint",
            "kube-proxy wrote this rule and rewrites it within seconds of any change: deleting it repairs nothing",
        ]
    );
}

#[test]
fn mark_drop_before_1_25() {
    let s = services(V122_SAVE);
    let a = attribution(
        "filter",
        line(V122_SAVE, "-m mark --mark 0x8000/0x8000 -j DROP"),
    );
    let k = classify(&a, &s, sa("10.1.1.1:3001"), true).unwrap();
    assert!(matches!(
        &k,
        KubeDrop::NoLocalEndpoints { kind: Kind::NodePort, marked: true, svc } if svc.display() == "ns2/svc2:80"
    ));
    let f = explain(&k, &a, &facts("192.168.7.2:40000", "10.1.1.1:3001"));
    assert!(f
        .summary
        .contains("KUBE-XLB chain set the KUBE-MARK-DROP mark (0x8000) and KUBE-FIREWALL dropped"));
    // A mark for a destination no rule names.
    assert_eq!(
        classify(&a, &s, sa("10.9.9.9:9999"), false),
        Some(KubeDrop::Marked)
    );
    // The localnet rule of the same chain.
    let l = attribution("filter", line(V122_SAVE, "block incoming localnet"));
    assert_eq!(
        classify(&l, &s, sa("127.0.0.1:3001"), true),
        Some(KubeDrop::Localnet)
    );
}

#[test]
fn forward_invalid_and_source_ranges() {
    let s = services(V131_SAVE);
    let a = attribution("filter", line(V131_SAVE, "--ctstate INVALID -j DROP"));
    let k = classify(&a, &s, sa("10.180.0.1:80"), false).unwrap();
    assert_eq!(k, KubeDrop::ForwardInvalid);
    let f = explain(&k, &a, &facts("10.0.0.2:40000", "10.180.0.1:80"));
    assert_eq!(f.cause, "kube_forward_invalid");
    assert!(f.fix.is_empty());
    assert_eq!(f.inspect[0], "ip netns exec node conntrack -S");
    // kube-proxy with nfacct writes the same rule with a counter.
    let nfacct = attribution(
        "filter",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP",
    );
    assert_eq!(
        classify(&nfacct, &s, sa("10.180.0.1:80"), false),
        Some(KubeDrop::ForwardInvalid)
    );

    let fw = attribution("filter", line(V131_SAVE, "traffic not accepted by KUBE-FW"));
    let k = classify(&fw, &s, sa("5.6.7.8:80"), false).unwrap();
    let f = explain(&k, &fw, &facts("198.51.100.7:40000", "5.6.7.8:80"));
    assert_eq!(f.cause, "kube_source_ranges");
    assert_eq!(
        f.summary,
        "Service ns5/svc5 port p80 accepts its load-balancer IP only from spec.loadBalancerSourceRanges, and 198.51.100.7 is not in them"
    );
    // Rules kube-proxy did not write, or that only accept, are not its drops.
    let other = attribution(
        "filter",
        "-A FORWARD -d 10.180.0.1/32 -p tcp -m tcp --dport 80 -j DROP",
    );
    assert_eq!(classify(&other, &s, sa("10.180.0.1:80"), false), None);
    let masq = attribution(
        "filter",
        line(V131_SAVE, "kubernetes forwarding rules\" -m mark"),
    );
    assert_eq!(classify(&masq, &s, sa("10.180.0.1:80"), false), None);
}

mod nftables {
    use super::*;
    use crate::diagnosis::kube::nft::chain_svc;

    /// `nft -j list table ip kube-proxy` after `nft -f` of kube-proxy's
    /// transaction (tests/fixtures/kube-proxy/nftables.nft).
    const JSON: &str = include_str!("../../../../tests/fixtures/kube-proxy/nftables.json");

    fn services() -> Services {
        let mut s = Services::default();
        s.add_nft(&serde_json::from_str(JSON).unwrap());
        s
    }

    fn nft_attribution(chain: &str, rule: &str) -> Attribution {
        Attribution {
            backend: Some(Backend::Nftables),
            family: Some(Family::Ip),
            table: Some("kube-proxy".into()),
            chain: Some(chain.into()),
            rule: Some(rule.into()),
            rule_number: None,
            handle: Some(54),
            method: "ruleset evaluation (nft -j list ruleset)".into(),
            ..attribution("filter", "-A X -j DROP")
        }
    }

    #[test]
    fn chain_names() {
        let (p, svc, ep) = chain_svc("endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80").unwrap();
        assert_eq!(
            (p, svc.display().as_str(), ep),
            ("endpoint", "ns1/svc1:p80", Some(sa("10.180.0.1:80")))
        );
        let (p, svc, ep) = chain_svc("external-42NFTM6N-ns2/svc2/tcp/p80").unwrap();
        assert_eq!(
            (p, svc.display().as_str(), ep),
            ("external", "ns2/svc2:p80", None)
        );
        // A namespace with dashes.
        let (_, svc, _) = chain_svc("service-ABCDEFGH-kube-system/kube-dns/udp/dns").unwrap();
        assert_eq!(svc.display(), "kube-system/kube-dns:dns");
        assert!(chain_svc("service-endpoints-check").is_none());
        assert!(chain_svc("reject-chain").is_none());
    }

    #[test]
    fn names() {
        let s = services();
        assert_eq!(
            named(&s, "172.30.0.41:80", false),
            Some(("ns1/svc1:80".into(), Kind::ClusterIp))
        );
        assert_eq!(
            named(&s, "1.2.3.4:80", false),
            Some(("ns2/svc2:80".into(), Kind::ExternalIp))
        );
        assert_eq!(
            named(&s, "172.30.0.46:80", false),
            Some(("ns6/svc6:80".into(), Kind::ClusterIp))
        );
        assert_eq!(
            named(&s, "192.168.0.2:3003", true),
            Some(("ns3/svc3:80".into(), Kind::NodePort))
        );
        assert_eq!(
            s.serving(sa("10.180.0.2:80")).unwrap().display(),
            "ns2/svc2:80"
        );
        assert_eq!(s.endpoints.len(), 3);
        // The node ports `--port 80` follows, from the nftables mode too.
        let of80: Vec<u16> = s.node_ports_of(&[80]).iter().map(|(p, _)| *p).collect();
        assert_eq!(of80, [3001, 3003]);
    }

    #[test]
    fn drops() {
        let s = services();
        let reject = nft_attribution("reject-chain", "reject");
        let k = classify(&reject, &s, sa("172.30.0.46:80"), false).unwrap();
        let f = explain(&k, &reject, &facts("10.0.0.2:40000", "172.30.0.46:80"));
        assert_eq!(
            f.summary,
            "Service ns6/svc6 port p80 has no ready endpoints: kube-proxy rejects new connections to its cluster IP 172.30.0.46:80"
        );
        // No `iptables -L` for an nftables table; the kubectl commands stay.
        assert_eq!(f.inspect.len(), 2);
        let vmap = nft_attribution(
            "nodeport-endpoints-check",
            "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
        );
        let k = classify(&vmap, &s, sa("192.168.0.2:3001"), true).unwrap();
        assert!(matches!(
            &k,
            KubeDrop::NoLocalEndpoints { kind: Kind::NodePort, marked: false, svc } if svc.display() == "ns2/svc2:80"
        ));
        let lb = nft_attribution(
            "service-endpoints-check",
            "ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
        );
        assert!(matches!(
            classify(&lb, &s, sa("1.2.3.4:80"), false),
            Some(KubeDrop::NoLocalEndpoints {
                kind: Kind::ExternalIp,
                ..
            })
        ));
        // A node port's number on an address that is not this node's:
        // not the node port.
        let reject = nft_attribution("reject-chain", "reject");
        assert_eq!(classify(&reject, &s, sa("10.9.9.9:3001"), false), None);
        // A table kube-proxy does not own.
        let mut other = lb.clone();
        other.table = Some("filter".into());
        assert_eq!(classify(&other, &s, sa("1.2.3.4:80"), false), None);
    }

    /// kube-dns serves `dns` on UDP 53 and `dns-tcp` on TCP 53 at one
    /// cluster IP: a TCP connection to it is the `dns-tcp` port's, and a
    /// UDP-only port names no TCP address.
    #[test]
    fn only_tcp_elements_name_a_service_port() {
        let json = serde_json::json!({"nftables": [
            {"map": {"family": "ip", "name": "service-ips", "table": "kube-proxy", "elem": [
                [{"concat": ["172.30.0.10", "tcp", 53]},
                 {"goto": {"target": "service-NWBZK7IH-kube-system/kube-dns/tcp/dns-tcp"}}],
                [{"concat": ["172.30.0.10", "udp", 53]},
                 {"goto": {"target": "service-FY5PMXPG-kube-system/kube-dns/udp/dns"}}],
                [{"concat": ["172.30.0.12", "udp", 514]},
                 {"goto": {"target": "service-QXKOR3DD-ns7/syslog/udp/syslog"}}]
            ]}}
        ]});
        let mut s = Services::default();
        s.add_nft(&json);
        assert_eq!(
            s.frontend(sa("172.30.0.10:53"), false),
            Some(&Frontend {
                svc: SvcPort {
                    namespace: "kube-system".into(),
                    name: "kube-dns".into(),
                    port_name: "dns-tcp".into(),
                    port: Some(53),
                },
                kind: Kind::ClusterIp,
            })
        );
        assert_eq!(named(&s, "172.30.0.12:514", false), None);
        assert_eq!(s.vips.len(), 1);
    }
}

/// With no Service map entry for the destination, the rule's own chain and
/// matches say what kind of address was refused.
#[test]
fn the_kind_comes_from_the_rule_when_no_service_names_the_address() {
    let s = Services::default();
    let kind = |rule: &str, dst: &str, local: bool| match classify(
        &attribution("filter", rule),
        &s,
        sa(dst),
        local,
    ) {
        Some(KubeDrop::NoEndpoints { kind, .. } | KubeDrop::NoLocalEndpoints { kind, .. }) => {
            Some(kind)
        }
        _ => None,
    };
    assert_eq!(
        kind(
            r#"-A KUBE-SERVICES -d 10.96.0.9/32 -p tcp -m comment --comment "ns/a:p has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable"#,
            "10.96.0.9:80",
            false
        ),
        Some(Kind::ClusterIp)
    );
    assert_eq!(
        kind(
            r#"-A KUBE-EXTERNAL-SERVICES -d 5.6.7.9/32 -p tcp -m comment --comment "ns/a:p has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable"#,
            "5.6.7.9:80",
            false
        ),
        Some(Kind::ExternalIp)
    );
    assert_eq!(
        kind(
            r#"-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns/a:p has no endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j REJECT --reject-with icmp-port-unreachable"#,
            "192.0.2.1:30080",
            true
        ),
        Some(Kind::NodePort)
    );
}

/// KUBE-FIREWALL's own drops are the mark and localnet rules; another
/// DROP someone put in that chain is not kube-proxy's.
#[test]
fn an_unmarked_uncommented_drop_in_kube_firewall_is_not_localnet() {
    let s = services(V122_SAVE);
    let a = attribution("filter", "-A KUBE-FIREWALL -j DROP");
    assert_eq!(classify(&a, &s, sa("127.0.0.1:3001"), true), None);
}

/// On an IPv6 cluster kube-proxy writes its rules with ip6tables: the
/// listing must name the family's tool of the backend that holds the rule.
#[test]
fn a_drop_is_listed_with_the_iptables_tool_of_its_family_and_backend() {
    let rule = r#"-A KUBE-SERVICES -d fd00:10:96::46/128 -p tcp -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable"#;
    let s = services(rule);
    let inspect = |backend, family| {
        let a = Attribution {
            backend: Some(backend),
            family: Some(family),
            ..attribution("filter", rule)
        };
        let k = classify(&a, &s, sa("[fd00:10:96::46]:80"), false).unwrap();
        explain(
            &k,
            &a,
            &facts("[fd00:10:244::2]:40000", "[fd00:10:96::46]:80"),
        )
        .inspect
    };
    for (backend, family, tool) in [
        (Backend::IptablesLegacy, Family::Ip6, "ip6tables-legacy"),
        (Backend::IptablesNft, Family::Ip6, "ip6tables-nft"),
        (Backend::IptablesLegacy, Family::Ip, "iptables-legacy"),
        (Backend::IptablesNft, Family::Ip, "iptables-nft"),
    ] {
        assert_eq!(
            inspect(backend, family),
            [
                "kubectl -n ns6 get endpointslices -l kubernetes.io/service-name=svc6".to_string(),
                "kubectl -n ns6 get svc svc6 -o yaml".to_string(),
                format!(
                    "ip netns exec node {tool} -t filter -L KUBE-SERVICES -v -n -x --line-numbers"
                ),
            ],
            "{backend:?} {family:?}"
        );
    }
}

/// `spec.loadBalancerSourceRanges` takes CIDRs: the note names the client
/// as one, without the brackets an IPv6 socket address carries.
#[test]
fn a_source_range_drop_names_the_client_as_a_cidr() {
    let svc = SvcPort::parse("ns1/lb:p443").unwrap();
    let k = KubeDrop::SourceRange { svc };
    let rule = r#"-A KUBE-PROXY-FIREWALL -d 192.0.2.10/32 -p tcp -m comment --comment "ns1/lb:p443 traffic not accepted by KUBE-FW-X" -m tcp --dport 443 -j DROP"#;
    let a = attribution("filter", rule);
    for (src, dst, client, cidr) in [
        (
            "10.0.0.7:40000",
            "192.0.2.10:443",
            "10.0.0.7",
            "10.0.0.7/32",
        ),
        (
            "[2001:db8::7]:40000",
            "[2001:db8:1::10]:443",
            "2001:db8::7",
            "2001:db8::7/128",
        ),
    ] {
        let f = explain(&k, &a, &facts(src, dst));
        assert_eq!(f.cause, "kube_source_ranges");
        assert!(
            f.summary.ends_with(&format!("and {client} is not in them")),
            "{}",
            f.summary
        );
        assert_eq!(
            f.fix_notes[0],
            format!(
                "add the client's address ({cidr}) to the Service's \
                 spec.loadBalancerSourceRanges, or connect from an address it allows"
            )
        );
    }
}

/// One rule's facts: a cluster IP names a frontend and gives the
/// Service's port to its other names.
#[test]
fn a_cluster_ip_rule_names_a_frontend_and_its_port() {
    let r = KubeRule::parse(
        "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp --dport 80 -j KUBE-SVC-ABC",
    )
    .unwrap();
    let svc = r.svc().unwrap();
    let mut s = Services::default();
    let mut ports = HashMap::new();
    s.add_rule(&r, svc.clone(), &mut ports);
    let a: SocketAddr = "10.96.0.10:80".parse().unwrap();
    assert_eq!(s.vips[&a].kind, Kind::ClusterIp);
    assert_eq!(ports[&svc.key()], 80);
    assert_eq!(s.chains["ABC"], svc);
}

/// A mark-drop's facts: the Service the frontend names, by what its
/// KUBE-MARK-DROP rules said of it; none without a frontend.
#[test]
fn a_marked_drop_is_the_services_by_its_mark_rules() {
    use crate::diagnosis::kube::marked;
    let svc = SvcPort::parse("ns1/svc1:p80").unwrap();
    let f = Frontend {
        svc: svc.clone(),
        kind: Kind::LoadBalancer,
    };
    let mut s = Services::default();
    assert_eq!(marked(&s, None), KubeDrop::Marked);
    assert_eq!(marked(&s, Some(&f)), KubeDrop::Marked);
    s.mark_drops.insert(svc.key(), true);
    assert_eq!(
        marked(&s, Some(&f)),
        KubeDrop::NoLocalEndpoints {
            svc,
            kind: Kind::LoadBalancer,
            marked: true
        }
    );
}
