//! Against the filter table kube-router v2.11 restores for two pods
//! (tests/fixtures/kube-router), as iptables-save wrote it back.
use std::{collections::BTreeMap, net::IpAddr};

use super::{finding::explain, *};
use crate::{
    diagnosis::{
        netpol::{
            policy::{Peer, Workload},
            Conn,
        },
        reason::DropFacts,
    },
    model::netfilter::{Family, Hook},
    parse::iptables_save::parse_save,
};

const SAVE: &str = include_str!("../../../../tests/fixtures/kube-router/v2.11-filter.save");
const DB_FW: &str = "KUBE-POD-FW-6WMES3SVBEOJXPF5";
const CART_FW: &str = "KUBE-POD-FW-7ILXE6PIDWSDKH4E";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn tables() -> Vec<Table> {
    parse_save(
        SAVE,
        Backend::IptablesNft,
        Family::Ip,
        "iptables-nft-save -c",
    )
    .unwrap()
}

/// The REJECT of a pod chain, attributed as the counters would.
fn rejected_by(chain: &str) -> Attribution {
    let t = tables();
    let c = t[0].chain(chain).unwrap();
    let (n, r) = c
        .rules
        .iter()
        .enumerate()
        .find(|(_, r)| r.verdict == crate::model::netfilter::Verdict::Reject)
        .unwrap();
    let mut a = Attribution::bare(
        DroppedBy::Rule,
        "rule counters (iptables-nft-save -c)".into(),
    );
    a.hook = Some(Hook::Forward);
    a.family = Some(Family::Ip);
    a.backend = Some(Backend::IptablesNft);
    a.table = Some("filter".into());
    a.chain = Some(chain.into());
    a.rule = Some(r.text.clone());
    a.rule_number = Some(n + 1);
    a.target = Some(r.target.clone());
    a
}

const DB: &str = "10.244.7.2";
const CART: &str = "10.244.7.3";

#[test]
fn ingress_no_policy_allowed() {
    let d = classify(&rejected_by(DB_FW), &tables(), ip(CART), ip(DB)).unwrap();
    assert_eq!(d.direction, Direction::Ingress);
    assert_eq!(d.pod.as_deref(), Some("kdt-db/db-0"));
    assert_eq!(d.pod_addr, ip(DB));
    assert_eq!(
        d.policies,
        [PolicyChain {
            chain: "KUBE-NWPLCY-JTIYZ5XDNABE3YNF".into(),
            policy: Some("kdt-db/allow-api".into()),
        }]
    );
}

#[test]
fn egress_no_policy_allowed() {
    let d = classify(&rejected_by(CART_FW), &tables(), ip(CART), ip(DB)).unwrap();
    assert_eq!(d.direction, Direction::Egress);
    assert_eq!(d.pod.as_deref(), Some("kdt-shop/cart-5d8c7b9f4-q7xkz"));
    assert_eq!(d.pod_addr, ip(CART));
    // Its default ingress is no policy of this direction.
    assert_eq!(
        d.policies,
        [PolicyChain {
            chain: "KUBE-NWPLCY-7BEPHQCNUM5BJEMH".into(),
            policy: Some("kdt-shop/cart-egress".into()),
        }]
    );
}

#[test]
fn comments_of_v2_10_and_before() {
    assert_eq!(
        rejecting_pod("rule to REJECT traffic destined for POD name:db-0 namespace: kdt-db")
            .as_deref(),
        Some("kdt-db/db-0")
    );
    assert_eq!(
        rejecting_pod("kdt-db/db-0 reject").as_deref(),
        Some("kdt-db/db-0")
    );
    assert_eq!(rejecting_pod("reject pre-netpol (default-deny)"), None);
    assert_eq!(
        policy_of("run through nw policy allow-api", Some("kdt-db")).as_deref(),
        Some("kdt-db/allow-api")
    );
    assert_eq!(
        policy_of("kdt-db/allow-api policy", None).as_deref(),
        Some("kdt-db/allow-api")
    );
    assert_eq!(policy_of("default ingress", Some("kdt-db")), None);
}

#[test]
fn not_kube_routers() {
    let t = tables();
    // Neither end is the pod's.
    assert_eq!(
        classify(&rejected_by(DB_FW), &t, ip("10.9.0.1"), ip("10.9.0.2")),
        None
    );
    let mut a = rejected_by(DB_FW);
    a.chain = Some("KUBE-ROUTER-FORWARD".into());
    assert_eq!(classify(&a, &t, ip(CART), ip(DB)), None);
    let mut a = rejected_by(DB_FW);
    a.backend = Some(Backend::Nftables);
    assert_eq!(classify(&a, &t, ip(CART), ip(DB)), None);
    let mut a = rejected_by(DB_FW);
    a.dropped_by = DroppedBy::Policy;
    assert_eq!(classify(&a, &t, ip(CART), ip(DB)), None);
}

fn pod(ns: &str, name: &str, app: &str) -> Workload {
    Workload {
        namespace: ns.into(),
        name: name.into(),
        labels: Ok(BTreeMap::from([("app".to_string(), app.to_string())])),
    }
}

#[test]
fn the_finding_in_kubernetes_terms() {
    let a = rejected_by(DB_FW);
    let d = classify(&a, &tables(), ip(CART), ip(DB)).unwrap();
    let db = pod("kdt-db", "db-0", "db");
    let peer = Peer::Pod(pod("kdt-shop", "cart-5d8c7b9f4-q7xkz", "cart"));
    let conn = Conn {
        protected: Some(&db),
        peer: &peer,
        protected_addr: ip(DB),
        peer_addr: ip(CART),
        port: 5432,
    };
    let facts = DropFacts {
        reason: Some("NETFILTER_DROP"),
        ifname: "cni0",
        netns: None,
        src: format!("{CART}:41001"),
        dst: format!("{DB}:5432"),
        location: None,
        tcp_flags: 0x02,
        netfilter: Some(&a),
        unattributed: None,
    };
    let (f, p) = explain(&d, &conn, &a, &facts);
    assert_eq!(f.cause, crate::model::cause::Cause::NetworkPolicyDenied);
    assert_eq!(
        f.summary,
        "kube-router network policy, ingress of pod kdt-db/db-0 from pod \
         kdt-shop/cart-5d8c7b9f4-q7xkz: no NetworkPolicy that selects it allows TCP port 5432 \
         (evaluated NetworkPolicy kdt-db/allow-api (KUBE-NWPLCY-JTIYZ5XDNABE3YNF)), and \
         kube-router rejects what none allowed"
    );
    assert!(f.fix.is_empty());
    assert!(
        f.fix_notes[0].starts_with(
            "apply this NetworkPolicy (kubectl apply -f -) to allow exactly this connection:\n"
        ),
        "{:?}",
        f.fix_notes
    );
    assert!(
        f.fix_notes[0].contains("  - Ingress\n"),
        "{}",
        f.fix_notes[0]
    );
    assert!(f
        .fix_notes
        .last()
        .unwrap()
        .starts_with("kube-router writes"));
    assert_eq!(
        f.inspect,
        [
            "kubectl get pod -n kdt-db db-0 --show-labels",
            "kubectl get networkpolicy -n kdt-db -o yaml",
            "kubectl describe networkpolicy -n kdt-db allow-api",
            "kubectl get pod -n kdt-shop cart-5d8c7b9f4-q7xkz --show-labels",
        ]
    );
    assert!(
        f.evidence.iter().any(|e| e
            == "KUBE-POD-FW-6WMES3SVBEOJXPF5 is the firewall chain of pod kdt-db/db-0 (address \
                10.244.7.2): it rejects what no policy chain of the pod's ingress marked 0x10000"),
        "{:?}",
        f.evidence
    );
    assert_eq!(p.engine, "kube-router");
    assert_eq!(p.verdict, "no_policy_allowed");
    assert_eq!(p.direction, "ingress");
    assert_eq!(p.protected_pod.as_deref(), Some("kdt-db/db-0"));
    assert_eq!(p.peer_pod.as_deref(), Some("kdt-shop/cart-5d8c7b9f4-q7xkz"));
    assert_eq!(p.chain, DB_FW);
    assert_eq!(p.tier, None);
    assert_eq!(
        p.evaluated,
        ["NetworkPolicy kdt-db/allow-api (KUBE-NWPLCY-JTIYZ5XDNABE3YNF)"]
    );

    // The runtime does not know the pod: kube-router's comment names it.
    let conn = Conn {
        protected: None,
        ..conn
    };
    let (f, p) = explain(&d, &conn, &a, &facts);
    assert_eq!(p.protected_pod.as_deref(), Some("kdt-db/db-0"));
    assert!(
        f.summary.contains("ingress of pod kdt-db/db-0 from"),
        "{}",
        f.summary
    );
    assert!(
        f.fix_notes[0].starts_with("10.244.7.2 is no pod of this node's container runtime"),
        "{:?}",
        f.fix_notes
    );
    assert_eq!(f.inspect[0], "kubectl get networkpolicy -n kdt-db -o yaml");
}

/// The drop's facts before any words: the pods, the chain, the policies
/// evaluated.
#[test]
fn the_policy_drop_facts() {
    let a = rejected_by(DB_FW);
    let d = classify(&a, &tables(), ip(CART), ip(DB)).unwrap();
    let db = pod("kdt-db", "db-0", "db");
    let peer = Peer::Pod(pod("kdt-shop", "cart-5d8c7b9f4-q7xkz", "cart"));
    let conn = Conn {
        protected: Some(&db),
        peer: &peer,
        protected_addr: ip(DB),
        peer_addr: ip(CART),
        port: 5432,
    };
    let p = super::finding::policy_drop(&d, &conn, &a);
    assert_eq!((p.engine, p.verdict), ("kube-router", "no_policy_allowed"));
    assert_eq!(p.protected_pod.as_deref(), Some("kdt-db/db-0"));
    assert_eq!(p.port, 5432);
    assert_eq!(p.endpoint_chain, d.pod_chain);
    assert_eq!(p.evaluated.len(), 1);
}

/// The direction's facts: the pod's address is what the jumps into its
/// chain match, the destination for ingress, the source for egress.
#[test]
fn the_direction_is_where_the_pods_address_is() {
    let chain = "KUBE-POD-FW-ABC";
    let jump = Line {
        chain: "KUBE-ROUTER-FORWARD".into(),
        comment: None,
        target: chain.into(),
        src: None,
        dst: Some(ip(DB)),
    };
    let lines = [jump];
    assert_eq!(
        direction_of(&lines, chain, ip(CART), ip(DB)),
        Some((Direction::Ingress, ip(DB)))
    );
    assert_eq!(
        direction_of(&lines, chain, ip(DB), ip(CART)),
        Some((Direction::Egress, ip(DB)))
    );
    assert_eq!(direction_of(&lines, chain, ip(CART), ip(CART)), None);
}

/// kube-router's nftables dataplane: two-pods.nft.in loaded by nft and
/// listed back (`nft -j list ruleset`).
mod nftables {
    use super::*;
    use crate::parse::nft_json::parse_ruleset;

    const JSON: &str = include_str!("../../../../tests/fixtures/kube-router/two-pods-nft.json");

    fn tables() -> Vec<Table> {
        parse_ruleset(JSON).unwrap()
    }

    fn rejected_by(chain: &str) -> Attribution {
        let t = tables();
        let c = t[0].chain(chain).unwrap();
        let (n, r) = c
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.verdict == crate::model::netfilter::Verdict::Reject)
            .unwrap();
        assert!(
            r.text.ends_with("comment \"kdt-db/db-0 reject\"") || chain != DB_FW,
            "{}",
            r.text
        );
        let mut a = Attribution::bare(
            DroppedBy::Rule,
            "ruleset evaluation (nft -j list ruleset)".into(),
        );
        a.hook = Some(Hook::Forward);
        a.family = Some(Family::Ip);
        a.backend = Some(Backend::Nftables);
        a.table = Some("kube-router-filter-ipv4".into());
        a.chain = Some(chain.into());
        a.rule = Some(r.text.clone());
        a.rule_number = Some(n + 1);
        a.handle = r.handle;
        a
    }

    #[test]
    fn both_directions() {
        let d = classify(&rejected_by(DB_FW), &tables(), ip(CART), ip(DB)).unwrap();
        assert_eq!(d.direction, Direction::Ingress);
        assert_eq!(d.pod.as_deref(), Some("kdt-db/db-0"));
        assert_eq!(
            d.policies,
            [PolicyChain {
                chain: "KUBE-NWPLCY-JTIYZ5XDNABE3YNF".into(),
                policy: Some("kdt-db/allow-api".into()),
            }]
        );
        let d = classify(&rejected_by(CART_FW), &tables(), ip(CART), ip(DB)).unwrap();
        assert_eq!(d.direction, Direction::Egress);
        assert_eq!(d.pod_addr, ip(CART));
        assert_eq!(
            d.policies[0].policy.as_deref(),
            Some("kdt-shop/cart-egress")
        );
        // The iptables tables hold no such chain.
        let mut a = rejected_by(DB_FW);
        a.backend = Some(Backend::IptablesNft);
        assert_eq!(classify(&a, &tables(), ip(CART), ip(DB)), None);
    }
}
