//! Against a filter table in the shape Felix renders it
//! (tests/fixtures/calico).
use std::{collections::BTreeMap, net::IpAddr};

use super::{
    felix::{self, FelixRule, Owner},
    finding::{explain, Conn},
    policy::{network_policy, Peer, Workload},
    *,
};
use crate::{
    diagnosis::reason::DropFacts,
    model::netfilter::{Chain as NfChain, Hook, Rule, Verdict},
};

const FELIX: &str = include_str!("../../../../tests/fixtures/calico/felix-v3.30-filter.save");

const DB_IF: &str = "calib3b2b0cd317";
const CART_IF: &str = "calidb34f9848c0";
const DENY_SHOP: &str = "cali-pi-_KX4OHmKjvJsrhL55kdq";
const DENY_EGRESS: &str = "cali-po-_4PMH1fmZQsaPNytqfJK";

/// The fixture as a table (rule text is all the diagnosis reads).
fn tables(backend: Backend) -> Vec<Table> {
    table_of(FELIX, backend)
}

fn table_of(text: &str, backend: Backend) -> Vec<Table> {
    let mut chains: Vec<NfChain> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("-A ")) {
        let name = line.split_whitespace().nth(1).unwrap().to_string();
        let rule = Rule {
            text: line.to_string(),
            handle: None,
            matches: Vec::new(),
            verdict: Verdict::Continue,
            target: String::new(),
            packets: Some(0),
            counted_matches: 0,
        };
        match chains.iter_mut().find(|c| c.name == name) {
            Some(c) => c.rules.push(rule),
            None => chains.push(NfChain {
                name,
                base: None,
                rules: vec![rule],
            }),
        }
    }
    vec![Table {
        backend,
        family: Family::Ip,
        name: "filter".into(),
        chains,
        source: "iptables-nft-save -c".into(),
    }]
}

/// What the counters would say of the `n`th rule (1-based) of `chain`.
fn attributed(chain: &str, n: usize) -> Attribution {
    let text = FELIX
        .lines()
        .filter(|l| l.starts_with(&format!("-A {chain} ")))
        .nth(n - 1)
        .unwrap_or_else(|| panic!("{chain} has no rule {n}"));
    let mut a = Attribution::bare(
        DroppedBy::Rule,
        "rule counters (iptables-nft-save -c)".into(),
    );
    a.hook = Some(Hook::Forward);
    a.family = Some(Family::Ip);
    a.backend = Some(Backend::IptablesNft);
    a.table = Some("filter".into());
    a.chain = Some(chain.into());
    a.rule = Some(text.into());
    a.rule_number = Some(n);
    a.target = Some("DROP".into());
    a
}

fn classified(chain: &str, n: usize, iin: &str, out: Option<&str>) -> CalicoDrop {
    classify(
        &attributed(chain, n),
        &tables(Backend::IptablesNft),
        iin,
        out,
    )
    .unwrap_or_else(|| panic!("{chain} rule {n} not read as Calico's"))
}

fn owner(kind: &str, name: &str) -> Option<Owner> {
    Some(Owner {
        kind: kind.into(),
        name: name.into(),
    })
}

#[test]
fn rules_and_comments() {
    let r = FelixRule::parse(
        r#"-A cali-to-wl-dispatch -o calib3b2b0cd317 -m comment --comment "cali:mMoQpzC-4Lok0nYP" -g cali-tw-calib3b2b0cd317"#,
    )
    .unwrap();
    assert_eq!(r.out_iface.as_deref(), Some(DB_IF));
    assert_eq!(r.target, "cali-tw-calib3b2b0cd317");
    // Felix's own hash comment is not a comment of the rule's.
    assert!(r.comments.is_empty());
    assert_eq!(
        felix::end_of_tier("End of tier default. Drop if no policies passed packet"),
        Some("default")
    );
    assert_eq!(
        felix::end_of_tier("End of tier sec. Reject if no policies passed packet"),
        Some("sec")
    );
    assert_eq!(felix::end_of_tier("Start of tier default"), None);
    assert!(felix::no_profile("Drop if no profiles matched"));
    assert_eq!(
        felix::owner_comment("KubernetesNetworkPolicy data/allow-web ingress"),
        owner("KubernetesNetworkPolicy", "data/allow-web")
    );
    // Before Calico 3.30: `Policy <ns>/<tier>.<name>`.
    assert_eq!(
        felix::owner_comment("Policy data/knp.default.allow-web egress"),
        owner("Policy", "data/knp.default.allow-web")
    );
    assert_eq!(felix::owner_comment("Return if policy accepted"), None);
    assert_eq!(felix::owner_comment("Start of tier default"), None);
    assert_eq!(FelixRule::parse("-I cali-x -j DROP"), None);
}

/// A pod app=web does not match: tier security passes it, tier default's
/// only policy does not allow it, the tier's end drops it.
#[test]
fn end_of_tier_ingress() {
    let d = classified("cali-tw-calib3b2b0cd317", 11, "eth0", None);
    assert_eq!(d.direction, Direction::Ingress);
    assert_eq!(d.iface.as_deref(), Some(DB_IF));
    assert!(!d.ambiguous);
    assert_eq!(
        d.ended,
        Ended::NoPolicyPassed {
            tier: "default".into(),
            policies: vec![Chain {
                chain: "cali-pi-knp/data/allow-web".into(),
                owner: owner("KubernetesNetworkPolicy", "data/allow-web"),
            }],
        }
    );
    // The security tier's end: its own policy only.
    let d = classified("cali-tw-calib3b2b0cd317", 7, "eth0", None);
    let Ended::NoPolicyPassed { tier, policies } = d.ended else {
        panic!("{d:?}")
    };
    assert_eq!(tier, "security");
    assert_eq!(policies.len(), 1);
    assert_eq!(policies[0].chain, DENY_SHOP);
}

#[test]
fn explicit_deny_by_the_routed_interface() {
    let d = classified(DENY_SHOP, 1, CART_IF, Some(DB_IF));
    assert_eq!(d.direction, Direction::Ingress);
    assert_eq!(d.endpoint_chain, "cali-tw-calib3b2b0cd317");
    assert!(!d.ambiguous);
    assert_eq!(
        d.ended,
        Ended::Denied {
            tier: Some("security".into()),
            policy: Chain {
                chain: DENY_SHOP.into(),
                owner: owner("NetworkPolicy", "data/security.deny-shop"),
            },
            rule_number: Some(1),
        }
    );
    // Both workloads' chains reach the policy: without the interface it
    // routed to, kdrop says it took the first.
    let d = classified(DENY_SHOP, 1, CART_IF, None);
    assert!(d.ambiguous);
}

#[test]
fn egress_deny_and_end_of_tier() {
    let d = classified(DENY_EGRESS, 1, CART_IF, None);
    assert_eq!(d.direction, Direction::Egress);
    assert_eq!(d.endpoint_chain, "cali-fw-calidb34f9848c0");
    assert_eq!(d.iface.as_deref(), Some(CART_IF));
    let Ended::Denied { tier, policy, .. } = &d.ended else {
        panic!("{d:?}")
    };
    assert_eq!(tier.as_deref(), Some("security"));
    assert_eq!(
        policy.owner,
        owner("NetworkPolicy", "shop/security.deny-egress-data")
    );
    let d = classified("cali-fw-calidb34f9848c0", 9, CART_IF, None);
    assert_eq!(d.direction, Direction::Egress);
    assert!(matches!(d.ended, Ended::NoPolicyPassed { ref tier, .. } if tier == "security"));
}

#[test]
fn no_profile_matched() {
    let d = classified("cali-tw-calidb34f9848c0", 12, "eth0", None);
    let Ended::NoProfileMatched { profiles } = d.ended else {
        panic!("{d:?}")
    };
    let names: Vec<_> = profiles.iter().map(|p| p.chain.as_str()).collect();
    assert_eq!(names, ["cali-pri-kns.shop", "cali-pri-ksa.shop.default"]);
    assert_eq!(profiles[0].owner, owner("Profile", "kns.shop"));
}

#[test]
fn not_calicos() {
    let t = tables(Backend::IptablesNft);
    // A drop rule of Felix's that no policy wrote.
    let a = attributed("cali-tw-calib3b2b0cd317", 2);
    assert_eq!(classify(&a, &t, "eth0", None), None);
    let a = attributed("cali-from-wl-dispatch", 3);
    assert_eq!(classify(&a, &t, "eth0", None), None);
    let mut a = attributed("cali-tw-calib3b2b0cd317", 11);
    a.chain = Some("FORWARD".into());
    assert_eq!(classify(&a, &t, "eth0", None), None);
    // Another backend's table holds no such chain.
    let a = attributed("cali-tw-calib3b2b0cd317", 11);
    assert_eq!(
        classify(&a, &tables(Backend::IptablesLegacy), "eth0", None),
        None
    );
    let mut p = attributed("cali-tw-calib3b2b0cd317", 11);
    p.dropped_by = DroppedBy::Policy;
    assert_eq!(classify(&p, &t, "eth0", None), None);
}

fn pod(ns: &str, name: &str, labels: &[(&str, &str)]) -> Workload {
    Workload {
        namespace: ns.into(),
        name: name.into(),
        labels: Ok(labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()),
    }
}

#[test]
fn the_policy_allows_exactly_the_connection() {
    let db = pod("data", "db-0", &[("app", "db"), ("tier", "true")]);
    let cart = pod("shop", "cart-7d9f5c8b6-x2kqp", &[("app", "cart")]);
    let y = network_policy(Direction::Ingress, &db, &Peer::Pod(cart.clone()), 5432);
    assert_eq!(
        y,
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: "kdrop-allow-cart-7d9f5c8b6-x2kqp-to-db-0-5432"
  namespace: "data"
spec:
  podSelector:
    matchLabels:
      "app": "db"
      "tier": "true"
  policyTypes:
  - Ingress
  ingress:
  - from:
    - namespaceSelector:
        matchLabels:
          "kubernetes.io/metadata.name": "shop"
      podSelector:
        matchLabels:
          "app": "cart"
    ports:
    - protocol: TCP
      port: 5432
"#
    );
    let y = network_policy(Direction::Egress, &cart, &Peer::Pod(db), 5432);
    assert!(y.contains("  namespace: \"shop\"\n"), "{y}");
    assert!(y.contains("  - Egress\n  egress:\n  - to:\n"), "{y}");
    assert!(
        y.contains("name: \"kdrop-allow-cart-7d9f5c8b6-x2kqp-to-db-0-5432\""),
        "{y}"
    );
    let ip: IpAddr = "2001:db8::7".parse().unwrap();
    let y = network_policy(Direction::Ingress, &cart, &Peer::Addr(ip), 80);
    assert!(
        y.contains("    - ipBlock:\n        cidr: \"2001:db8::7/128\"\n"),
        "{y}"
    );
    assert!(y.contains("name: \"kdrop-allow-2001-db8--7-to-cart"), "{y}");
    // Labels unknown: the selector says so by selecting the namespace.
    let bare = Workload {
        labels: Err("no CRI socket found".into()),
        ..pod("data", "db-0", &[])
    };
    let y = network_policy(Direction::Ingress, &bare, &Peer::Addr(ip), 80);
    assert!(y.contains("  podSelector:\n    {}\n"), "{y}");
}

#[test]
fn finding_in_kubernetes_terms() {
    let d = classified("cali-tw-calib3b2b0cd317", 11, "eth0", None);
    let a = attributed("cali-tw-calib3b2b0cd317", 11);
    let db = pod("data", "db-0", &[("app", "db")]);
    let peer = Peer::Pod(pod("shop", "cart", &[("app", "cart")]));
    let conn = Conn {
        protected: Some(&db),
        peer: &peer,
        protected_addr: "10.244.9.3".parse().unwrap(),
        peer_addr: "10.244.9.2".parse().unwrap(),
        port: 5432,
    };
    let facts = DropFacts {
        reason: Some("NETFILTER_DROP"),
        ifname: CART_IF,
        netns: None,
        src: "10.244.9.2:40000".into(),
        dst: "10.244.9.3:5432".into(),
        location: Some("nf_hook_slow+0x9c"),
        tcp_flags: 0x02,
        netfilter: Some(&a),
        unattributed: None,
    };
    let (f, p) = explain(&d, &conn, &a, &facts);
    assert_eq!(f.cause, "network_policy_denied");
    assert!(f.fix.is_empty());
    assert!(
        f.summary.starts_with(
            "Calico network policy, ingress of pod data/db-0 from pod shop/cart: no policy of \
             tier default"
        ),
        "{}",
        f.summary
    );
    assert!(
        f.summary.contains("KubernetesNetworkPolicy data/allow-web"),
        "{}",
        f.summary
    );
    assert!(
        f.fix_notes[0].contains("kind: NetworkPolicy"),
        "{:?}",
        f.fix_notes
    );
    assert!(
        f.fix_notes[0].contains("to allow exactly this connection:"),
        "{:?}",
        f.fix_notes
    );
    assert!(f
        .inspect
        .contains(&"kubectl get networkpolicy -n data -o yaml".to_string()));
    assert!(f
        .inspect
        .contains(&"kubectl get globalnetworkpolicies.crd.projectcalico.org".to_string()));
    assert_eq!(
        (p.verdict, p.direction, p.port, p.protocol),
        ("no_policy_allowed", "ingress", 5432, "TCP")
    );
    assert_eq!(p.protected_pod.as_deref(), Some("data/db-0"));
    assert_eq!(p.peer_pod.as_deref(), Some("shop/cart"));
    assert_eq!(p.tier.as_deref(), Some("default"));
    assert_eq!(p.chain, "cali-tw-calib3b2b0cd317");
    assert_eq!(p.policy, None);

    // An explicit deny in another tier: the notes say a NetworkPolicy
    // alone does not override it.
    let d = classified(DENY_SHOP, 1, CART_IF, Some(DB_IF));
    let a = attributed(DENY_SHOP, 1);
    let (f, p) = explain(&d, &conn, &a, &facts);
    assert_eq!(p.verdict, "denied_by_rule");
    assert_eq!(
        p.policy.as_deref(),
        Some("NetworkPolicy data/security.deny-shop")
    );
    assert_eq!(p.chain, DENY_SHOP);
    assert_eq!(p.endpoint_chain, "cali-tw-calib3b2b0cd317");
    assert!(
        f.fix_notes
            .iter()
            .any(|n| n.contains("denies it explicitly")),
        "{:?}",
        f.fix_notes
    );
    // Labelled both: nothing said about labels.
    assert!(
        !f.fix_notes.iter().any(|n| n.contains("labels")),
        "{:?}",
        f.fix_notes
    );
}

#[test]
fn the_notes_say_why_a_selector_is_not_exact() {
    let d = classified("cali-tw-calib3b2b0cd317", 11, "eth0", None);
    let a = attributed("cali-tw-calib3b2b0cd317", 11);
    let facts = DropFacts {
        reason: Some("NETFILTER_DROP"),
        ifname: CART_IF,
        netns: None,
        src: "10.244.9.2:40000".into(),
        dst: "10.244.9.3:5432".into(),
        location: Some("nf_hook_slow+0x9c"),
        tcp_flags: 0x02,
        netfilter: Some(&a),
        unattributed: None,
    };
    let notes = |db: &Workload, cart: &Workload| {
        let peer = Peer::Pod(cart.clone());
        let conn = Conn {
            protected: Some(db),
            peer: &peer,
            protected_addr: "10.244.9.3".parse().unwrap(),
            peer_addr: "10.244.9.2".parse().unwrap(),
            port: 5432,
        };
        explain(&d, &conn, &a, &facts).0.fix_notes
    };
    let unread = |w: Workload, why: &str| Workload {
        labels: Err(why.into()),
        ..w
    };
    let db = pod("data", "db-0", &[("app", "db")]);
    let cart = pod("shop", "cart", &[("app", "cart")]);
    let why = "no CRI socket found: looked for /run/containerd/containerd.sock";
    // Both unread for one reason: said once, with it.
    let n = notes(&unread(db.clone(), why), &unread(cart.clone(), why));
    assert!(n[0].contains("to allow this connection (and, with its `{}` selectors"));
    assert!(n[0].contains("  podSelector:\n    {}\n"), "{}", n[0]);
    assert_eq!(
        n[1],
        format!(
            "the container runtime's records on this node do not give the pods' labels \
             ({why}): a selector written `{{}}` selects every pod of the namespace; replace it \
             with the pod's labels (kubectl get pod --show-labels) to allow only this pod"
        )
    );
    // The peer's alone, another reason: the protected pod is selected by
    // its labels, the peer's selector is `{}`.
    let failed = "ListPodSandbox on /run/containerd/containerd.sock failed: no answer within 1s";
    let n = notes(&db, &unread(cart.clone(), failed));
    assert!(
        n[0].contains("    matchLabels:\n      \"app\": \"db\"\n"),
        "{}",
        n[0]
    );
    assert!(
        n[0].contains("      podSelector:\n        {}\n"),
        "{}",
        n[0]
    );
    assert!(n[1].contains(&format!("labels ({failed}):")), "{}", n[1]);
    // A pod the runtime gave no labels: no selector picks it alone.
    let n = notes(&pod("data", "db-0", &[]), &cart);
    assert!(n[0].contains("(and, with its `{}` selectors"), "{}", n[0]);
    assert!(
        n[1].starts_with("pod data/db-0 has no labels: its selector `{}` selects every pod"),
        "{}",
        n[1]
    );
    assert!(!n.iter().any(|n| n.contains("do not give")), "{n:?}");
}

/// Calico before 3.30 (one tier, unnamed): "Start of policies", "Drop if
/// no policies passed packet", `Policy <ns>/<tier>.<name>` comments
/// (felix/rules/endpoints.go and policy.go before projectcalico/calico
/// 4ff3cb0427, which names the tier).
#[test]
fn before_calico_3_30() {
    let text = r#"-A cali-tw-cali1234567890a -m comment --comment "cali:Hb5Q7zm6Hv7nQbYq" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A cali-tw-cali1234567890a -m comment --comment "cali:QfMo6j0VZPeOlQ9Z" -m conntrack --ctstate INVALID -j DROP
-A cali-tw-cali1234567890a -m comment --comment "cali:2aJBFoHWk1yWRyX4" -j MARK --set-xmark 0x0/0x30000
-A cali-tw-cali1234567890a -m comment --comment "cali:Ha0SKmGxPVYqtt5n" -m comment --comment "Start of policies" -j MARK --set-xmark 0x0/0x20000
-A cali-tw-cali1234567890a -m comment --comment "cali:YTlJDIcIWb4AdKkE" -m mark --mark 0x0/0x20000 -j cali-pi-_Fl4UZX5G15XFWYBmGCP
-A cali-tw-cali1234567890a -m comment --comment "cali:QvlMvBETv_UgVB7Y" -m comment --comment "Return if policy accepted" -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-tw-cali1234567890a -m comment --comment "cali:bO3vdhZM4CUUvR2P" -m comment --comment "Drop if no policies passed packet" -m mark --mark 0x0/0x20000 -j DROP
-A cali-pi-_Fl4UZX5G15XFWYBmGCP -m comment --comment "cali:4Ja0fLqo6D0vPRjt" -m comment --comment "Policy data/knp.default.allow-web ingress" -p tcp -m multiport --dports 5432 -j MARK --set-xmark 0x10000/0x10000
"#;
    let mut a = attributed("cali-tw-calib3b2b0cd317", 11);
    a.chain = Some("cali-tw-cali1234567890a".into());
    a.rule = text.lines().nth(6).map(String::from);
    a.rule_number = Some(7);
    let d = classify(&a, &table_of(text, Backend::IptablesNft), "eth0", None).unwrap();
    assert_eq!(d.iface.as_deref(), Some("cali1234567890a"));
    assert_eq!(
        d.ended,
        Ended::NoPolicyPassed {
            tier: "default".into(),
            policies: vec![Chain {
                chain: "cali-pi-_Fl4UZX5G15XFWYBmGCP".into(),
                owner: owner("Policy", "data/knp.default.allow-web"),
            }],
        }
    );
    assert_eq!(
        felix::end_of_tier("Reject if no policies passed packet"),
        Some("default")
    );
    assert_eq!(felix::end_of_tier("Drop if no profiles matched"), None);
}

/// Policies sharing a selector in one tier are grouped behind a
/// `cali-gi-` chain (felix/rules/endpoints.go, policy groups): the tier's
/// policies are read through it, and a deny in one of them finds the
/// workload through it.
#[test]
fn policy_groups() {
    let text = r#"-A cali-tw-cali1234567890a -m comment --comment "cali:Ha0SKmGxPVYqtt5n" -m comment --comment "Start of tier default" -j MARK --set-xmark 0x0/0x20000
-A cali-tw-cali1234567890a -m comment --comment "cali:YTlJDIcIWb4AdKkE" -m mark --mark 0x0/0x20000 -j cali-gi-Xy8pQ2mN4bV6cR1t
-A cali-tw-cali1234567890a -m comment --comment "cali:QvlMvBETv_UgVB7Y" -m comment --comment "Return if policy accepted" -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-tw-cali1234567890a -m comment --comment "cali:bO3vdhZM4CUUvR2P" -m comment --comment "End of tier default. Drop if no policies passed packet" -m mark --mark 0x0/0x20000 -j DROP
-A cali-gi-Xy8pQ2mN4bV6cR1t -m comment --comment "cali:aa" -m mark --mark 0x0/0x20000 -j cali-pi-knp/data/a
-A cali-gi-Xy8pQ2mN4bV6cR1t -m comment --comment "cali:bb" -m comment --comment "Return if policy accepted" -m mark --mark 0x10000/0x10000 -j RETURN
-A cali-gi-Xy8pQ2mN4bV6cR1t -m comment --comment "cali:cc" -m mark --mark 0x0/0x20000 -j cali-pi-np/data/b
-A cali-pi-knp/data/a -m comment --comment "cali:dd" -m comment --comment "KubernetesNetworkPolicy data/a ingress" -p tcp -m multiport --dports 80 -j MARK --set-xmark 0x10000/0x10000
-A cali-pi-np/data/b -m comment --comment "cali:ee" -m comment --comment "NetworkPolicy data/b ingress" -p tcp -m multiport --dports 5432 -j DROP
"#;
    let t = table_of(text, Backend::IptablesNft);
    let mut a = attributed("cali-tw-calib3b2b0cd317", 11);
    a.chain = Some("cali-tw-cali1234567890a".into());
    a.rule = text.lines().nth(3).map(String::from);
    a.rule_number = Some(4);
    let d = classify(&a, &t, "eth0", None).unwrap();
    let Ended::NoPolicyPassed { tier, policies } = d.ended else {
        panic!("{d:?}")
    };
    assert_eq!(tier, "default");
    let chains: Vec<_> = policies.iter().map(|p| p.chain.as_str()).collect();
    assert_eq!(chains, ["cali-pi-knp/data/a", "cali-pi-np/data/b"]);
    a.chain = Some("cali-pi-np/data/b".into());
    a.rule = text.lines().nth(8).map(String::from);
    a.rule_number = Some(1);
    let d = classify(&a, &t, "eth0", Some("cali1234567890a")).unwrap();
    assert_eq!(d.endpoint_chain, "cali-tw-cali1234567890a");
    assert!(
        matches!(d.ended, Ended::Denied { ref tier, .. } if tier.as_deref() == Some("default"))
    );
}

/// The drop's facts before any words: the engine, the pods, the chains.
#[test]
fn the_policy_drop_facts() {
    let d = classified("cali-tw-calib3b2b0cd317", 11, "eth0", None);
    let a = attributed("cali-tw-calib3b2b0cd317", 11);
    let db = pod("data", "db-0", &[("app", "db")]);
    let peer = Peer::Pod(pod("shop", "cart", &[("app", "cart")]));
    let conn = Conn {
        protected: Some(&db),
        peer: &peer,
        protected_addr: "10.244.9.3".parse().unwrap(),
        peer_addr: "10.244.9.2".parse().unwrap(),
        port: 5432,
    };
    let p = super::finding::policy_drop(&d, &conn, &a);
    assert_eq!((p.engine, p.dataplane), ("calico", "iptables"));
    assert_eq!(p.protected_pod.as_deref(), Some("data/db-0"));
    assert_eq!(p.endpoint_chain, "cali-tw-calib3b2b0cd317");
    assert_eq!(p.port, 5432);
}
