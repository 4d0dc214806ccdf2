//! An [`Attribution`] as a diagnosis [`Finding`]: which rule, policy or
//! conntrack drop, the evidence, and the commands that show its counters.
use crate::{
    diagnosis::reason::{reason_evidence, DropFacts},
    model::{
        finding::Finding,
        netfilter::{Attribution, Backend, DroppedBy, Family},
    },
};

/// The iptables binary for a backend and family (`ip6tables-legacy`).
fn iptables_tool(backend: Backend, family: Option<Family>) -> &'static str {
    match (backend, family) {
        (Backend::IptablesLegacy, Some(Family::Ip6)) => "ip6tables-legacy",
        (Backend::IptablesLegacy, _) => "iptables-legacy",
        (_, Some(Family::Ip6)) => "ip6tables-nft",
        _ => "iptables-nft",
    }
}

pub fn explain(a: &Attribution, f: &DropFacts) -> Finding {
    let ns = f
        .netns
        .map(|n| format!("ip netns exec {n} "))
        .unwrap_or_default();
    let family = a.family.map_or("", |x| x.name());
    let table = a.table.as_deref().unwrap_or("");
    let chain = a.chain.as_deref().unwrap_or("");
    let hook = a.hook.map_or_else(String::new, |h| format!(", {h} hook"));
    let backend = a.backend.map_or("", |b| b.name());
    let mut fix = Vec::new();
    match a.backend {
        Some(Backend::Nftables) => {
            fix.push(format!("{ns}nft -a list chain {family} {table} {chain}"))
        }
        Some(b) => {
            let tool = iptables_tool(b, a.family);
            fix.push(format!(
                "{ns}{tool} -t {table} -L {chain} -v -n -x --line-numbers"
            ));
            fix.push(format!("{ns}{tool}-save -c -t {table}"));
        }
        None => {}
    }
    let rule = a.rule.as_deref().unwrap_or("");
    let which = match (a.rule_number, a.handle) {
        (_, Some(h)) => format!("rule (handle {h})"),
        (Some(n), None) => format!("rule {n}"),
        _ => "rule".into(),
    };
    let (cause, summary) = match a.dropped_by {
        DroppedBy::Rule if a.ctstate_invalid => {
            fix.push(format!("{ns}conntrack -S"));
            (
                "conntrack_invalid",
                format!(
                    "conntrack could not place this packet in a connection (state INVALID) and {backend} {which} in {table}/{chain} ({family}{hook}) drops INVALID packets: {rule}"
                ),
            )
        }
        DroppedBy::Rule => (
            "netfilter_rule",
            format!("{backend} {which} in {table}/{chain} ({family}{hook}) dropped it: {rule}"),
        ),
        DroppedBy::Policy => (
            "netfilter_policy",
            format!(
                "no rule accepted it: policy {} of {backend} chain {table}/{chain} ({family}{hook})",
                a.target.as_deref().unwrap_or("DROP")
            ),
        ),
        DroppedBy::Conntrack => {
            fix.push(format!("{ns}conntrack -S"));
            fix.push(format!(
                "{ns}sysctl net.netfilter.nf_conntrack_count net.netfilter.nf_conntrack_max"
            ));
            (
                "conntrack_drop",
                "conntrack itself dropped it (table full, or the entry could not be inserted)".into(),
            )
        }
        DroppedBy::Nat => (
            "nat_drop",
            format!(
                "the NAT step dropped it ({family}{hook}{}): no address or port to map it to",
                if table.is_empty() {
                    String::new()
                } else {
                    format!(", table {table}")
                }
            ),
        ),
        DroppedBy::Table => (
            "netfilter_table",
            format!(
                "{} table {table}{} ({family}{hook}) dropped it: a rule or the chain policy; the counters do not say which",
                if backend.is_empty() { "netfilter" } else { backend },
                if chain.is_empty() {
                    String::new()
                } else {
                    format!(", chain {chain}")
                }
            ),
        ),
    };
    let mut evidence = vec![reason_evidence(f)];
    evidence.push(format!("method: {}", a.method));
    evidence.extend(a.evidence.iter().cloned());
    Finding {
        cause,
        summary,
        evidence,
        fix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::netfilter::Hook;

    fn facts() -> DropFacts<'static> {
        DropFacts {
            reason: Some("NETFILTER_DROP"),
            ifname: "s0",
            netns: Some("srv"),
            src: "10.0.0.1:40000".into(),
            dst: "10.0.0.2:80".into(),
            location: Some("nf_hook_slow+0x7d"),
            netfilter: None,
        }
    }

    fn rule() -> Attribution {
        Attribution {
            dropped_by: DroppedBy::Rule,
            method: "rule counters (iptables-legacy-save -c)".into(),
            hook: Some(Hook::Input),
            family: Some(Family::Ip),
            backend: Some(Backend::IptablesLegacy),
            table: Some("filter".into()),
            chain: Some("INPUT".into()),
            rule: Some("-A INPUT -p tcp -m tcp --dport 80 -j DROP".into()),
            rule_number: Some(2),
            handle: None,
            target: Some("DROP".into()),
            packets_before: Some(0),
            packets_after: Some(1),
            ctstate_invalid: false,
            conntrack: None,
            evidence: vec!["its counter went 0 -> 1".into()],
        }
    }

    #[test]
    fn rule_finding() {
        let f = explain(&rule(), &facts());
        assert_eq!(f.cause, "netfilter_rule");
        assert_eq!(
            f.summary,
            "iptables-legacy rule 2 in filter/INPUT (ip, INPUT hook) dropped it: -A INPUT -p tcp -m tcp --dport 80 -j DROP"
        );
        assert_eq!(
            f.evidence,
            [
                "kernel drop reason NETFILTER_DROP at nf_hook_slow+0x7d",
                "method: rule counters (iptables-legacy-save -c)",
                "its counter went 0 -> 1"
            ]
        );
        assert_eq!(
            f.fix,
            [
                "ip netns exec srv iptables-legacy -t filter -L INPUT -v -n -x --line-numbers",
                "ip netns exec srv iptables-legacy-save -c -t filter"
            ]
        );
    }

    #[test]
    fn invalid_policy_nft_and_conntrack() {
        let mut a = rule();
        a.ctstate_invalid = true;
        a.backend = Some(Backend::IptablesNft);
        a.family = Some(Family::Ip6);
        let f = explain(&a, &facts());
        assert_eq!(f.cause, "conntrack_invalid");
        assert!(f.fix[0].starts_with("ip netns exec srv ip6tables-nft -t filter"));
        assert_eq!(f.fix.last().unwrap(), "ip netns exec srv conntrack -S");

        let mut p = rule();
        p.dropped_by = DroppedBy::Policy;
        p.chain = Some("FORWARD".into());
        p.hook = Some(Hook::Forward);
        p.rule = None;
        let f = explain(&p, &facts());
        assert_eq!(f.cause, "netfilter_policy");
        assert_eq!(
            f.summary,
            "no rule accepted it: policy DROP of iptables-legacy chain filter/FORWARD (ip, FORWARD hook)"
        );

        let mut n = rule();
        n.backend = Some(Backend::Nftables);
        n.family = Some(Family::Inet);
        n.table = Some("kdt".into());
        n.chain = Some("input".into());
        n.handle = Some(4);
        n.rule = Some("tcp dport 80 counter drop".into());
        let mut facts = facts();
        facts.netns = None;
        let f = explain(&n, &facts);
        assert_eq!(
            f.summary,
            "nftables rule (handle 4) in kdt/input (inet, INPUT hook) dropped it: tcp dport 80 counter drop"
        );
        assert_eq!(f.fix, ["nft -a list chain inet kdt input"]);

        let mut c = rule();
        c.dropped_by = DroppedBy::Conntrack;
        c.backend = None;
        let f = explain(&c, &facts);
        assert_eq!(f.cause, "conntrack_drop");
        assert_eq!(f.fix[0], "conntrack -S");
    }
}
