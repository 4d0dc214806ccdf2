//! An [`Attribution`] as a diagnosis [`Finding`]: which rule, policy or
//! conntrack drop, the evidence, the repair (an ACCEPT for the service where
//! the drop would meet it, with the replies' ACCEPT by conntrack state where a
//! DROP policy would drop them too, or the rule deleted), and the commands
//! that show the counters. Each repair is of a kind in `fixes`.
use super::{
    fixes::{FixKind, IPTABLES_ESTABLISHED, NFT_ESTABLISHED},
    matching::{TCP_ACK, TCP_SYN},
};
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

/// How to let this packet's connection through, and how to look.
struct Repair {
    fix: Vec<String>,
    fix_or: Vec<Vec<String>>,
    notes: Vec<String>,
    inspect: Vec<String>,
}

/// A SYN without ACK opens a connection; anything else (a SYN-ACK, an ACK)
/// answers or continues one that conntrack already tracks.
fn opens(tcp_flags: u8) -> bool {
    tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// Where the repair goes, and what it lets through.
struct Site<'a> {
    ns: &'a str,
    family: &'a str,
    table: &'a str,
    chain: &'a str,
    dst: &'a str,
    port: &'a str,
    v6: bool,
}

/// The repair for a rule or policy drop. A SYN: an ACCEPT for its
/// destination and port where the drop would meet it (before the rule, or
/// at the end of the chain for its policy). A reply: an ACCEPT by conntrack
/// state there instead (its destination port is the client's, no service's).
/// A DROP policy also needs the replies of what the ACCEPT lets in: they
/// cross the same chain on a router or bridge (FORWARD), and a chain with no
/// ESTABLISHED rule drops them; that rule goes first, as Docker and
/// Kubernetes put it. Deleting the rule is the other repair.
fn repair(a: &Attribution, f: &DropFacts, ns: &str) -> Repair {
    let (dst, port) = split_endpoint(&f.dst);
    let s = Site {
        ns,
        family: a.family.map_or("", |x| x.name()),
        table: a.table.as_deref().unwrap_or(""),
        chain: a.chain.as_deref().unwrap_or(""),
        dst,
        port,
        v6: dst.contains(':'),
    };
    let mut r = Repair {
        fix: Vec::new(),
        fix_or: Vec::new(),
        notes: Vec::new(),
        inspect: Vec::new(),
    };
    // conntrack calls the packet INVALID: an ACCEPT would hide that, and
    // deleting the rule lets every such packet in; the cause is elsewhere.
    if a.ctstate_invalid {
        if let Some(b) = a.backend {
            r.inspect.extend(inspect(b, a.family, &s));
        }
        return r;
    }
    let opens = opens(f.tcp_flags);
    // Unknown counts as missing: a second ESTABLISHED rule is harmless.
    let replies_pass = a.accepts_established == Some(true);
    match a.backend {
        Some(Backend::Nftables) => nft_repair(a, &s, opens, replies_pass, &mut r),
        Some(b) => iptables_repair(a, b, &s, opens, replies_pass, &mut r),
        None => {}
    }
    if let Some(b) = a.backend {
        r.inspect.extend(inspect(b, a.family, &s));
    }
    notes(a, &s, opens, &mut r);
    r
}

/// The commands that show the chain with its counters.
fn inspect(b: Backend, family: Option<Family>, s: &Site) -> Vec<String> {
    let Site {
        ns, table, chain, ..
    } = s;
    match b {
        Backend::Nftables => vec![format!(
            "{ns}nft -a list chain {} {table} {chain}",
            s.family
        )],
        b => {
            let tool = iptables_tool(b, family);
            vec![
                format!("{ns}{tool} -t {table} -L {chain} -v -n -x --line-numbers"),
                format!("{ns}{tool}-save -c -t {table}"),
            ]
        }
    }
}

fn nft_repair(a: &Attribution, s: &Site, opens: bool, replies_pass: bool, r: &mut Repair) {
    let Site {
        ns,
        family,
        table,
        chain,
        dst,
        port,
        ..
    } = s;
    let verb = |v: &str| format!("{ns}nft {v} rule {family} {table} {chain}");
    let l3 = if s.v6 { "ip6" } else { "ip" };
    let accept = format!("{l3} daddr {dst} tcp dport {port} accept");
    match (a.dropped_by, a.handle) {
        (DroppedBy::Rule, Some(h)) => {
            let what = if opens {
                accept
            } else {
                NFT_ESTABLISHED.into()
            };
            r.fix
                .push(format!("{} position {h} {what}", verb("insert")));
            r.fix_or.push(vec![format!(
                "{ns}nft delete rule {family} {table} {chain} handle {h}"
            )]);
        }
        (DroppedBy::Policy, _) => {
            // `insert` without a position puts the rule first.
            if !replies_pass {
                r.fix.push(format!("{} {NFT_ESTABLISHED}", verb("insert")));
            }
            if opens {
                r.fix.push(format!("{} {accept}", verb("add")));
            }
        }
        _ => {}
    }
}

fn iptables_repair(
    a: &Attribution,
    b: Backend,
    s: &Site,
    opens: bool,
    replies_pass: bool,
    r: &mut Repair,
) {
    let Site {
        ns,
        table,
        chain,
        dst,
        port,
        ..
    } = s;
    let tool = iptables_tool(b, a.family);
    let accept = format!("-p tcp -d {dst} --dport {port} -j ACCEPT");
    match a.dropped_by {
        DroppedBy::Rule => {
            if let Some(n) = a.rule_number {
                let what = if opens {
                    accept
                } else {
                    IPTABLES_ESTABLISHED.into()
                };
                r.fix
                    .push(format!("{ns}{tool} -t {table} -I {chain} {n} {what}"));
            }
            // The rule as `iptables -S` writes it: `-A CHAIN spec`.
            if let Some(spec) = a.rule.as_deref().and_then(|t| t.strip_prefix("-A ")) {
                r.fix_or
                    .push(vec![format!("{ns}{tool} -t {table} -D {spec}")]);
            }
        }
        DroppedBy::Policy => {
            if !replies_pass {
                r.fix.push(format!(
                    "{ns}{tool} -t {table} -I {chain} 1 {IPTABLES_ESTABLISHED}"
                ));
            }
            if opens {
                r.fix
                    .push(format!("{ns}{tool} -t {table} -A {chain} {accept}"));
            }
        }
        _ => {}
    }
}

/// What the repairs change, in words.
fn notes(a: &Attribution, s: &Site, opens: bool, r: &mut Repair) {
    let to = if s.v6 {
        format!("[{}]:{}", s.dst, s.port)
    } else {
        format!("{}:{}", s.dst, s.port)
    };
    let est = r.fix.iter().any(|c| {
        matches!(
            FixKind::of(c),
            Some(FixKind::IptablesAcceptEstablished | FixKind::NftAcceptEstablished)
        )
    });
    let mut parts = Vec::new();
    if opens && !r.fix.is_empty() {
        parts.push(format!("lets TCP to {to} through, from any client"));
    }
    if est {
        let place = if a.dropped_by == DroppedBy::Policy {
            "first in the chain"
        } else {
            "before the rule"
        };
        parts.push(format!(
            "accepts the packets of connections {} already let through (their replies), {place}",
            s.chain
        ));
    }
    if a.dropped_by == DroppedBy::Policy && !opens && !est {
        r.notes.push(
            "the chain accepts established connections already: conntrack did not count this \
             packet as one (a reply to a SYN it never saw?)"
                .into(),
        );
    }
    if parts.is_empty() {
        return;
    }
    let what = parts.join("; it ");
    r.notes.push(if r.fix_or.is_empty() {
        format!("the repair {what}")
    } else {
        format!("the first repair {what}; deleting the rule lets everything it dropped through")
    });
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
            tcp_flags: TCP_SYN,
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
            accepts_established: None,
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
        // The chain accepts no established packets: that rule first, so
        // that the replies pass whatever the chain's other rules say.
        assert_eq!(
            f.fix,
            [
                "ip netns exec srv nft insert rule inet kdt input ct state established,related accept",
                "ip netns exec srv nft add rule inet kdt input ip6 daddr 2001:db8::2 tcp dport 80 accept"
            ]
        );
        assert!(f.fix_or.is_empty(), "{:?}", f.fix_or);
        assert_eq!(
            f.inspect,
            ["ip netns exec srv nft -a list chain inet kdt input"]
        );
        // No rule to delete: the note offers no such thing.
        assert_eq!(
            f.fix_notes,
            [
                "the repair lets TCP to [2001:db8::2]:80 through, from any client; it accepts the \
              packets of connections input already let through (their replies), first in the chain"
            ]
        );
        // A chain that accepts them already gets the service's ACCEPT alone.
        p.accepts_established = Some(true);
        let f = explain(&p, &facts);
        assert_eq!(
            f.fix,
            ["ip netns exec srv nft add rule inet kdt input ip6 daddr 2001:db8::2 tcp dport 80 accept"]
        );
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
        // No ruleset repair: accepting INVALID packets hides the cause.
        assert!(f.fix.is_empty() && f.fix_or.is_empty(), "{f:?}");

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
            [
                "ip netns exec srv iptables-legacy -t filter -I FORWARD 1 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                "ip netns exec srv iptables-legacy -t filter -A FORWARD -p tcp -d 10.0.0.2 --dport 80 -j ACCEPT"
            ]
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

    /// A reply (here a SYN-ACK to the client's port) is let through by its
    /// conntrack state where the drop met it: an ACCEPT for the client's
    /// port would help no other connection.
    #[test]
    fn replies_are_accepted_by_conntrack_state() {
        let mut facts = facts();
        facts.tcp_flags = TCP_SYN | TCP_ACK;
        facts.src = "10.0.0.2:80".into();
        facts.dst = "10.0.0.1:40000".into();
        let mut p = rule();
        p.dropped_by = DroppedBy::Policy;
        p.chain = Some("FORWARD".into());
        p.rule = None;
        p.rule_number = None;
        let f = explain(&p, &facts);
        assert_eq!(
            f.fix,
            ["ip netns exec srv iptables-legacy -t filter -I FORWARD 1 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
        );
        assert_eq!(
            f.fix_notes,
            [
                "the repair accepts the packets of connections FORWARD already let through (their \
              replies), first in the chain"
            ]
        );
        // The chain accepts them already: conntrack did not see this one as
        // part of a connection; no rule would change that.
        p.accepts_established = Some(true);
        let f = explain(&p, &facts);
        assert!(f.fix.is_empty(), "{:?}", f.fix);
        assert!(f.fix_notes[0].starts_with("the chain accepts established connections already"));

        // A rule's drop: the state ACCEPT goes before the rule.
        let f = explain(&rule(), &facts);
        assert_eq!(
            f.fix,
            ["ip netns exec srv iptables-legacy -t filter -I INPUT 2 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
        );
        let mut n = rule();
        n.backend = Some(Backend::Nftables);
        n.family = Some(Family::Inet);
        n.table = Some("kdt".into());
        n.chain = Some("forward".into());
        n.handle = Some(7);
        let f = explain(&n, &facts);
        assert_eq!(
            f.fix,
            ["ip netns exec srv nft insert rule inet kdt forward position 7 ct state established,related accept"]
        );
        assert_eq!(
            f.fix_or,
            [["ip netns exec srv nft delete rule inet kdt forward handle 7"]]
        );
    }

    /// Every command a netfilter finding writes is of a kind that names the
    /// integration test applying it (fixes.rs).
    #[test]
    fn every_command_written_has_a_kind() {
        let mut syn_ack = facts();
        syn_ack.tcp_flags = TCP_SYN | TCP_ACK;
        for backend in [
            Backend::IptablesLegacy,
            Backend::IptablesNft,
            Backend::Nftables,
        ] {
            for dropped_by in [DroppedBy::Rule, DroppedBy::Policy] {
                for est in [None, Some(true)] {
                    for f in [facts(), syn_ack.clone()] {
                        let mut a = rule();
                        a.backend = Some(backend);
                        a.dropped_by = dropped_by;
                        a.handle = Some(3);
                        a.accepts_established = est;
                        let found = explain(&a, &f);
                        for cmd in found.fix.iter().chain(found.fix_or.iter().flatten()) {
                            assert!(FixKind::of(cmd).is_some(), "{cmd}");
                        }
                    }
                }
            }
        }
    }
}
