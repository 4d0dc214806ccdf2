//! An [`Attribution`] as a diagnosis [`Finding`]: which rule, policy or
//! conntrack drop, the evidence, the repair (an ACCEPT for the service where
//! the drop would meet it, or the rule deleted), and the commands that show
//! the counters.
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

/// `10.0.0.1:80` → (`10.0.0.1`, `80`); `[2001:db8::1]:80` → (`2001:db8::1`, `80`).
fn split_endpoint(e: &str) -> (&str, &str) {
    let (h, p) = e.rsplit_once(':').unwrap_or((e, ""));
    (h.trim_start_matches('[').trim_end_matches(']'), p)
}

/// How to let this packet's service through, and how to look.
struct Repair {
    fix: Vec<String>,
    fix_or: Vec<Vec<String>>,
    notes: Vec<String>,
    inspect: Vec<String>,
}

/// The repair for a rule or policy drop: an ACCEPT for the packet's
/// destination and port where the drop would meet it (before the rule, or
/// at the end of the chain for its policy); deleting the rule as the other.
fn repair(a: &Attribution, f: &DropFacts, ns: &str) -> Repair {
    let family = a.family.map_or("", |x| x.name());
    let table = a.table.as_deref().unwrap_or("");
    let chain = a.chain.as_deref().unwrap_or("");
    let (dst, port) = split_endpoint(&f.dst);
    let v6 = dst.contains(':');
    let mut r = Repair {
        fix: Vec::new(),
        fix_or: Vec::new(),
        notes: Vec::new(),
        inspect: Vec::new(),
    };
    match a.backend {
        Some(Backend::Nftables) => {
            r.inspect
                .push(format!("{ns}nft -a list chain {family} {table} {chain}"));
            let l3 = if v6 { "ip6" } else { "ip" };
            let accept = format!("{l3} daddr {dst} tcp dport {port} accept");
            match (a.dropped_by, a.handle) {
                (DroppedBy::Rule, Some(h)) => {
                    r.fix.push(format!(
                        "{ns}nft insert rule {family} {table} {chain} position {h} {accept}"
                    ));
                    r.fix_or.push(vec![format!(
                        "{ns}nft delete rule {family} {table} {chain} handle {h}"
                    )]);
                }
                (DroppedBy::Policy, _) => r.fix.push(format!(
                    "{ns}nft add rule {family} {table} {chain} {accept}"
                )),
                _ => {}
            }
        }
        Some(b) => {
            let tool = iptables_tool(b, a.family);
            r.inspect.push(format!(
                "{ns}{tool} -t {table} -L {chain} -v -n -x --line-numbers"
            ));
            r.inspect.push(format!("{ns}{tool}-save -c -t {table}"));
            let accept = format!("-p tcp -d {dst} --dport {port} -j ACCEPT");
            match a.dropped_by {
                DroppedBy::Rule => {
                    if let Some(n) = a.rule_number {
                        r.fix
                            .push(format!("{ns}{tool} -t {table} -I {chain} {n} {accept}"));
                    }
                    // The rule as `iptables -S` writes it: `-A CHAIN spec`.
                    if let Some(spec) = a.rule.as_deref().and_then(|t| t.strip_prefix("-A ")) {
                        r.fix_or
                            .push(vec![format!("{ns}{tool} -t {table} -D {spec}")]);
                    }
                }
                DroppedBy::Policy => r
                    .fix
                    .push(format!("{ns}{tool} -t {table} -A {chain} {accept}")),
                _ => {}
            }
        }
        None => {}
    }
    if !r.fix.is_empty() {
        let to = if v6 {
            format!("[{dst}]:{port}")
        } else {
            format!("{dst}:{port}")
        };
        // Only a rule's drop offers its deletion as the other repair.
        r.notes.push(if r.fix_or.is_empty() {
            format!("the repair lets TCP to {to} through, from any client")
        } else {
            format!(
                "the first repair lets TCP to {to} through, from any client; deleting the rule \
                 lets everything it dropped through"
            )
        });
    }
    r
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
    let mut r = repair(a, f, &ns);
    let rule = a.rule.as_deref().unwrap_or("");
    let which = match (a.rule_number, a.handle) {
        (_, Some(h)) => format!("rule (handle {h})"),
        (Some(n), None) => format!("rule {n}"),
        _ => "rule".into(),
    };
    let (cause, summary) = match a.dropped_by {
        DroppedBy::Rule if a.ctstate_invalid => {
            r.inspect.push(format!("{ns}conntrack -S"));
            r.notes.push(
                "conntrack calls a packet INVALID when it fits no connection it tracks (a \
                 reply it never saw the start of, a sequence number out of window): a path that \
                 skips this host one way, or an entry that expired, is the usual cause"
                    .into(),
            );
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
            r.inspect.push(format!("{ns}conntrack -S"));
            r.inspect.push(format!(
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
        fix: r.fix,
        fix_or: r.fix_or,
        fix_notes: r.notes,
        inspect: r.inspect,
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
        // An ACCEPT for the service where the rule would meet it...
        assert_eq!(
            f.fix,
            ["ip netns exec srv iptables-legacy -t filter -I INPUT 2 -p tcp -d 10.0.0.2 --dport 80 -j ACCEPT"]
        );
        // ...or the rule deleted, as iptables -S wrote it.
        assert_eq!(
            f.fix_or,
            [["ip netns exec srv iptables-legacy -t filter -D INPUT -p tcp -m tcp --dport 80 -j DROP"]]
        );
        assert_eq!(
            f.fix_notes,
            ["the first repair lets TCP to 10.0.0.2:80 through, from any client; deleting the rule lets everything it dropped through"]
        );
        // Listing is inspecting, not repairing.
        assert_eq!(
            f.inspect,
            [
                "ip netns exec srv iptables-legacy -t filter -L INPUT -v -n -x --line-numbers",
                "ip netns exec srv iptables-legacy-save -c -t filter"
            ]
        );
    }

    #[test]
    fn ip6tables_legacy_rule_is_repaired_with_ip6tables_legacy() {
        let mut a = rule();
        a.family = Some(Family::Ip6);
        let mut facts = facts();
        facts.src = "[2001:db8::1]:40000".into();
        facts.dst = "[2001:db8::2]:80".into();
        let f = explain(&a, &facts);
        assert_eq!(
            f.fix,
            ["ip netns exec srv ip6tables-legacy -t filter -I INPUT 2 -p tcp -d 2001:db8::2 --dport 80 -j ACCEPT"]
        );
        assert_eq!(
            f.fix_or,
            [["ip netns exec srv ip6tables-legacy -t filter -D INPUT -p tcp -m tcp --dport 80 -j DROP"]]
        );
        assert_eq!(
            f.inspect,
            [
                "ip netns exec srv ip6tables-legacy -t filter -L INPUT -v -n -x --line-numbers",
                "ip netns exec srv ip6tables-legacy-save -c -t filter"
            ]
        );
        // An IPv6 endpoint in brackets, as `ss` and curl write it.
        assert_eq!(
            f.fix_notes,
            [
                "the first repair lets TCP to [2001:db8::2]:80 through, from any client; deleting \
              the rule lets everything it dropped through"
            ]
        );
    }

    /// An nftables chain policy applies after the chain's last rule: an
    /// accept appended with `nft add rule` comes before it.
    #[test]
    fn nftables_policy_is_repaired_by_appending_an_accept() {
        let mut p = rule();
        p.dropped_by = DroppedBy::Policy;
        p.backend = Some(Backend::Nftables);
        p.family = Some(Family::Inet);
        p.table = Some("kdt".into());
        p.chain = Some("input".into());
        p.rule = None;
        p.rule_number = None;
        p.target = Some("drop".into());
        let mut facts = facts();
        facts.dst = "[2001:db8::2]:80".into();
        let f = explain(&p, &facts);
        assert_eq!(
            f.summary,
            "no rule accepted it: policy drop of nftables chain kdt/input (inet, INPUT hook)"
        );
        assert_eq!(
            f.fix,
            ["ip netns exec srv nft add rule inet kdt input ip6 daddr 2001:db8::2 tcp dport 80 accept"]
        );
        assert!(f.fix_or.is_empty(), "{:?}", f.fix_or);
        assert_eq!(
            f.inspect,
            ["ip netns exec srv nft -a list chain inet kdt input"]
        );
        // No rule to delete: the note offers no such thing.
        assert_eq!(
            f.fix_notes,
            ["the repair lets TCP to [2001:db8::2]:80 through, from any client"]
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
        assert!(f.inspect[0].starts_with("ip netns exec srv ip6tables-nft -t filter"));
        assert_eq!(f.inspect.last().unwrap(), "ip netns exec srv conntrack -S");

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
        assert_eq!(
            f.fix,
            ["ip netns exec srv iptables-legacy -t filter -A FORWARD -p tcp -d 10.0.0.2 --dport 80 -j ACCEPT"]
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
        assert_eq!(f.inspect, ["nft -a list chain inet kdt input"]);
        assert_eq!(
            f.fix,
            ["nft insert rule inet kdt input position 4 ip daddr 10.0.0.2 tcp dport 80 accept"]
        );
        assert_eq!(f.fix_or, [["nft delete rule inet kdt input handle 4"]]);

        let mut c = rule();
        c.dropped_by = DroppedBy::Conntrack;
        c.backend = None;
        let f = explain(&c, &facts);
        assert_eq!(f.cause, "conntrack_drop");
        assert!(f.fix.is_empty());
        // Nothing to repair, nothing to say about a repair.
        assert!(f.fix_notes.is_empty(), "{:?}", f.fix_notes);
        assert_eq!(f.inspect[0], "conntrack -S");
    }
}
