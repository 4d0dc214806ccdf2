//! Felix's nftables dataplane: tests/fixtures/calico/two-pods.nft.in
//! loaded by nft and listed back (`nft -j list ruleset`).
use super::{felix::Owner, *};
use crate::model::netfilter::Hook;

fn owner(kind: &str, name: &str) -> Option<Owner> {
    Some(Owner {
        kind: kind.into(),
        name: name.into(),
    })
}
use crate::parse::nft_json::parse_ruleset;

const JSON: &str = include_str!("../../../../tests/fixtures/calico/two-pods-nft.json");
const DB_IF: &str = "calid8e0b7a1c42";
const CART_IF: &str = "cali5f3a9e6b210";

fn tables() -> Vec<Table> {
    parse_ruleset(JSON).unwrap()
}

/// The rule of `chain` (Felix's name, without its layer) whose comment
/// contains `comment`, attributed as the counters would.
fn attributed(chain: &str, comment: &str) -> Attribution {
    let t = tables();
    let layered = format!("filter-{chain}");
    let c = t[0].chain(&layered).unwrap();
    let (n, r) = c
        .rules
        .iter()
        .enumerate()
        .find(|(_, r)| r.text.contains(comment))
        .unwrap_or_else(|| panic!("{chain}: no rule with {comment}"));
    let mut a = Attribution::bare(
        DroppedBy::Rule,
        "ruleset evaluation (nft -j list ruleset)".into(),
    );
    a.hook = Some(Hook::Forward);
    a.family = Some(Family::Ip);
    a.backend = Some(Backend::Nftables);
    a.table = Some("calico".into());
    a.chain = Some(layered);
    a.rule = Some(r.text.clone());
    a.rule_number = Some(n + 1);
    a.handle = r.handle;
    a.target = Some(r.target.clone());
    a
}

#[test]
fn rules_read_back() {
    let r = FelixRule::parse_nft(
        "filter-cali-tw-calid8e0b7a1c42",
        r#"meta mark & 0x00020000 == 0x00000000 counter jump filter-cali-pi-_3lTDF2a_ZC7H2weaLbk comment "cali:DN2eWzHYSlW4ZdFi;""#,
    )
    .unwrap();
    assert_eq!(r.chain, "cali-tw-calid8e0b7a1c42");
    assert_eq!(r.target, "cali-pi-_3lTDF2a_ZC7H2weaLbk");
    assert!(r.comments.is_empty());
    let r = FelixRule::parse_nft(
        "filter-cali-FORWARD",
        r#"iifname "cali*" counter jump filter-cali-from-wl-dispatch comment "cali:8ZoYfO5HKXWbB3pk; Start of tier default""#,
    )
    .unwrap();
    assert_eq!(r.in_iface.as_deref(), Some("cali*"));
    assert_eq!(r.comments, ["Start of tier default"]);
    // The dispatch by verdict map names no interface of its own.
    let r = FelixRule::parse_nft(
        "filter-cali-to-wl-dispatch",
        "oifname vmap @filter-cali-to-wl-dispatch",
    )
    .unwrap();
    assert_eq!(r.out_iface, None);
}

#[test]
fn end_of_tier_default() {
    let a = attributed(&format!("cali-tw-{DB_IF}"), "End of tier default.");
    let d = classify(&a, &tables(), CART_IF, None).expect("Felix's nftables chain");
    assert_eq!(d.direction, Direction::Ingress);
    // The chains as nft lists them.
    assert_eq!(d.endpoint_chain, format!("filter-cali-tw-{DB_IF}"));
    assert_eq!(d.iface.as_deref(), Some(DB_IF));
    let Ended::NoPolicyPassed { tier, policies } = d.ended else {
        panic!("{d:?}")
    };
    assert_eq!(tier, "default");
    assert_eq!(policies.len(), 1);
    assert_eq!(policies[0].chain, "filter-cali-pi-_3lTDF2a_ZC7H2weaLbk");
    assert_eq!(
        policies[0].owner,
        owner("KubernetesNetworkPolicy", "kdt-db/allow-monitoring")
    );
}

#[test]
fn a_deny_rule_and_an_egress_end_of_tier() {
    let a = attributed("cali-pi-_cS5Lb0y8WoQRLr489lA", "security.deny-kdt-shop");
    let d = classify(&a, &tables(), CART_IF, Some(DB_IF)).unwrap();
    assert_eq!(d.endpoint_chain, format!("filter-cali-tw-{DB_IF}"));
    let Ended::Denied { tier, policy, .. } = d.ended else {
        panic!("{d:?}")
    };
    assert_eq!(tier.as_deref(), Some("security"));
    assert_eq!(
        policy.owner,
        owner("NetworkPolicy", "kdt-db/security.deny-kdt-shop")
    );
    let a = attributed(&format!("cali-fw-{CART_IF}"), "End of tier default.");
    let d = classify(&a, &tables(), CART_IF, None).unwrap();
    assert_eq!(d.direction, Direction::Egress);
    let Ended::NoPolicyPassed { policies, .. } = d.ended else {
        panic!("{d:?}")
    };
    assert_eq!(policies[0].chain, "filter-cali-po-_SQdETO35tu-PTW1f-11");
    // Another table's chain of the same name is not Felix's.
    let mut a = attributed(&format!("cali-fw-{CART_IF}"), "End of tier default.");
    a.chain = Some(format!("cali-fw-{CART_IF}"));
    assert_eq!(classify(&a, &tables(), CART_IF, None), None);
}
