//! An [`Attribution`] as a diagnosis [`Finding`]: which rule, policy or
//! conntrack drop, the evidence, the repair (an ACCEPT for the service where
//! the drop would meet it, with one for its replies where a DROP policy
//! would drop them too, or the rule deleted), and the commands that show the
//! counters. Each repair is of a kind in `fixes`.
use super::{
    fixes::{FixKind, IPTABLES_ESTABLISHED, NFT_ESTABLISHED},
    matching::{TCP_ACK, TCP_SYN},
};
use crate::model::cause::Cause;
use crate::{
    diagnosis::{
        fix_kinds::Kind,
        reason::{reason_evidence, DropFacts},
    },
    model::{
        finding::{Finding, Fix},
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
    fix: Vec<Fix>,
    fix_or: Vec<Vec<Fix>>,
    notes: Vec<String>,
    inspect: Vec<String>,
}

/// A SYN without ACK opens a connection; anything else (a SYN-ACK, an ACK)
/// answers or continues one that conntrack already tracks.
fn opens(tcp_flags: u8) -> bool {
    tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// Where the repair goes: the namespace prefix and the chain.
struct Site<'a> {
    ns: &'a str,
    family: &'a str,
    table: &'a str,
    chain: &'a str,
}

/// What a repair rule accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Accept<'a> {
    /// TCP to the service (address, port): a new connection to it.
    Service(&'a str, &'a str),
    /// Packets of connections already let through (conntrack state
    /// ESTABLISHED or RELATED): among them, their replies.
    Established,
    /// TCP from the service (address, port): its replies, where no
    /// connection state is known yet (a chain that runs before conntrack).
    Replies(&'a str, &'a str),
}

/// Where a repair rule goes in the chain.
#[derive(Clone, Copy, Debug, PartialEq)]
enum At {
    /// Before the rule that dropped the packet.
    Rule,
    /// First in the chain.
    First,
    /// Last, just ahead of the policy.
    Last,
}

/// The ACCEPTs a rule or policy drop needs, in order. A SYN: its service,
/// where the drop met it (before the rule, or last for the policy). A
/// reply: accepted by conntrack state instead (its destination port is the
/// client's, no service's). A DROP policy also drops the replies of what
/// the service's ACCEPT lets in where they cross the same chain (FORWARD on
/// a router or a bridge, local connections): the ESTABLISHED rule first, as
/// Docker and Kubernetes put it, unless the chain has one. A chain that runs
/// before conntrack (the raw table) sees no state: the service's replies by
/// address and port there.
fn accepts<'a>(a: &Attribution, f: &'a DropFacts, opens: bool) -> Vec<(At, Accept<'a>)> {
    let (dst, port) = split_endpoint(&f.dst);
    let (src, sport) = split_endpoint(&f.src);
    // Whose replies: the service's, the SYN's destination or the reply's
    // source.
    let replies = if opens {
        Accept::Replies(dst, port)
    } else {
        Accept::Replies(src, sport)
    };
    let state = if a.before_conntrack {
        replies
    } else {
        Accept::Established
    };
    let mut out = Vec::new();
    match a.dropped_by {
        DroppedBy::Rule if opens => out.push((At::Rule, Accept::Service(dst, port))),
        DroppedBy::Rule => out.push((At::Rule, state)),
        DroppedBy::Policy => {
            // Unknown counts as missing: a second ESTABLISHED rule is
            // harmless.
            if a.before_conntrack {
                out.push((At::Last, replies));
            } else if a.accepts_established != Some(true) {
                out.push((At::First, Accept::Established));
            }
            if opens {
                out.push((At::Last, Accept::Service(dst, port)));
            }
        }
        _ => {}
    }
    out
}

/// The repair for a rule or policy drop (see `accepts`); deleting the rule
/// is the other repair.
fn repair(a: &Attribution, f: &DropFacts, ns: &str) -> Repair {
    let s = Site {
        ns,
        family: a.family.map_or("", |x| x.name()),
        table: a.table.as_deref().unwrap_or(""),
        chain: a.chain.as_deref().unwrap_or(""),
    };
    let v6 = split_endpoint(&f.dst).0.contains(':');
    let mut r = Repair {
        fix: Vec::new(),
        fix_or: Vec::new(),
        notes: Vec::new(),
        inspect: Vec::new(),
    };
    let Some(b) = a.backend else {
        return r;
    };
    r.inspect.extend(inspect(b, a.family, &s));
    // conntrack calls the packet INVALID: an ACCEPT would hide that, and
    // deleting the rule lets every such packet in; the cause is elsewhere.
    if a.ctstate_invalid {
        return r;
    }
    let opens = opens(f.tcp_flags);
    let wanted = accepts(a, f, opens);
    for &(at, what) in &wanted {
        let cmd = match b {
            Backend::Nftables => nft_accept(a, &s, at, what, v6),
            b => iptables_accept(a, b, &s, at, what),
        };
        r.fix
            .extend(cmd.map(|c| Kind::Netfilter(kind_of(b, at, what)).fix(c)));
    }
    if let Some(del) = delete_rule(a, b, &s) {
        let kind = match b {
            Backend::Nftables => FixKind::NftDeleteRule,
            _ => FixKind::IptablesDeleteRule,
        };
        r.fix_or.push(vec![Kind::Netfilter(kind).fix(del)]);
    }
    notes(a, f, &wanted, &mut r);
    r
}

/// The kind of the ACCEPT `what` placed `at` with backend `b`.
fn kind_of(b: Backend, at: At, what: Accept) -> FixKind {
    let nft = b == Backend::Nftables;
    match (what, at, nft) {
        (Accept::Service(..), At::Rule, false) => FixKind::IptablesAcceptBeforeRule,
        (Accept::Service(..), At::Rule, true) => FixKind::NftAcceptBeforeRule,
        (Accept::Service(..), _, false) => FixKind::IptablesAcceptAtPolicy,
        (Accept::Service(..), _, true) => FixKind::NftAcceptAtPolicy,
        (Accept::Established, _, false) => FixKind::IptablesAcceptEstablished,
        (Accept::Established, _, true) => FixKind::NftAcceptEstablished,
        (Accept::Replies(..), _, false) => FixKind::IptablesAcceptReplies,
        (Accept::Replies(..), _, true) => FixKind::NftAcceptReplies,
    }
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

/// One nftables ACCEPT; `None` for a rule's place without its handle.
fn nft_accept(a: &Attribution, s: &Site, at: At, what: Accept, v6: bool) -> Option<String> {
    let Site {
        ns,
        family,
        table,
        chain,
    } = s;
    let l3 = if v6 { "ip6" } else { "ip" };
    let rule = match what {
        Accept::Service(addr, port) => format!("{l3} daddr {addr} tcp dport {port} accept"),
        Accept::Established => NFT_ESTABLISHED.into(),
        Accept::Replies(addr, port) => format!("{l3} saddr {addr} tcp sport {port} accept"),
    };
    let place = match at {
        At::Rule => format!(
            "insert rule {family} {table} {chain} position {}",
            a.handle?
        ),
        // `insert` without a position puts the rule first.
        At::First => format!("insert rule {family} {table} {chain}"),
        At::Last => format!("add rule {family} {table} {chain}"),
    };
    Some(format!("{ns}nft {place} {rule}"))
}

/// One iptables ACCEPT; `None` for a rule's place without its number.
fn iptables_accept(a: &Attribution, b: Backend, s: &Site, at: At, what: Accept) -> Option<String> {
    let Site {
        ns, table, chain, ..
    } = s;
    let tool = iptables_tool(b, a.family);
    let rule = match what {
        Accept::Service(addr, port) => format!("-p tcp -d {addr} --dport {port} -j ACCEPT"),
        Accept::Established => IPTABLES_ESTABLISHED.into(),
        Accept::Replies(addr, port) => format!("-p tcp -s {addr} --sport {port} -j ACCEPT"),
    };
    let place = match at {
        At::Rule => format!("-I {chain} {}", a.rule_number?),
        At::First => format!("-I {chain} 1"),
        At::Last => format!("-A {chain}"),
    };
    Some(format!("{ns}{tool} -t {table} {place} {rule}"))
}

/// The dropping rule deleted: by handle, or as `iptables -S` wrote it.
fn delete_rule(a: &Attribution, b: Backend, s: &Site) -> Option<String> {
    let Site {
        ns,
        family,
        table,
        chain,
    } = s;
    if a.dropped_by != DroppedBy::Rule {
        return None;
    }
    match b {
        Backend::Nftables => Some(format!(
            "{ns}nft delete rule {family} {table} {chain} handle {}",
            a.handle?
        )),
        b => {
            let spec = a.rule.as_deref()?.strip_prefix("-A ")?;
            let tool = iptables_tool(b, a.family);
            Some(format!("{ns}{tool} -t {table} -D {spec}"))
        }
    }
}

/// `10.0.0.2:80`, `[2001:db8::2]:80`.
fn endpoint(addr: &str, port: &str) -> String {
    if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

/// What the repairs change, in words.
fn notes(a: &Attribution, f: &DropFacts, wanted: &[(At, Accept)], r: &mut Repair) {
    let chain = a.chain.as_deref().unwrap_or("");
    let parts: Vec<String> = wanted
        .iter()
        .map(|(at, what)| match what {
            Accept::Service(addr, port) => format!(
                "lets TCP to {} through, from any client",
                endpoint(addr, port)
            ),
            Accept::Established => format!(
                "accepts the packets of connections {chain} already let through (their \
                 replies), {}",
                if *at == At::First {
                    "first in the chain"
                } else {
                    "before the rule"
                }
            ),
            Accept::Replies(addr, port) => format!(
                "accepts TCP from {} (the service's replies: {chain} runs before conntrack, \
                 which knows no connection there yet; it also lets that port open connections)",
                endpoint(addr, port)
            ),
        })
        .collect();
    if a.dropped_by == DroppedBy::Policy && !opens(f.tcp_flags) && wanted.is_empty() {
        r.notes.push(
            "the chain accepts established connections already: conntrack did not count this \
             packet as one (a reply to a SYN it never saw?)"
                .into(),
        );
    }
    if parts.is_empty() || r.fix.is_empty() {
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
    let mut r = repair(a, f, &ns);
    if a.gone {
        // Nothing left to repair: a repair would accept or delete what is
        // no longer there.
        r.fix.clear();
        r.fix_or.clear();
        r.notes = vec![
            "the rule is gone already (deleted after the drop): it drops no new connection; \
             if it comes back, so do the drops"
                .into(),
        ];
    }
    let cause = cause(a);
    match cause {
        Cause::ConntrackInvalid => {
            r.inspect.push(format!("{ns}conntrack -S"));
            r.notes.push(
                "conntrack calls a packet INVALID when it fits no connection it tracks (a \
                 reply it never saw the start of, a sequence number out of window): a path that \
                 skips this host one way, or an entry that expired, is the usual cause"
                    .into(),
            );
        }
        Cause::ConntrackDrop => {
            r.inspect.push(format!("{ns}conntrack -S"));
            r.inspect.push(format!(
                "{ns}sysctl net.netfilter.nf_conntrack_count net.netfilter.nf_conntrack_max"
            ));
        }
        _ => {}
    }
    let mut evidence = vec![reason_evidence(f)];
    evidence.push(format!("method: {}", a.method));
    evidence.extend(a.evidence.iter().cloned());
    Finding {
        cause,
        summary: summary(a),
        evidence,
        fix: r.fix,
        fix_or: r.fix_or,
        fix_notes: r.notes,
        inspect: r.inspect,
    }
}

/// The cause an attribution names: a rule dropping INVALID packets is
/// conntrack's refusal, not the rule's.
fn cause(a: &Attribution) -> Cause {
    match a.dropped_by {
        DroppedBy::Rule if a.ctstate_invalid => Cause::ConntrackInvalid,
        DroppedBy::Rule => Cause::NetfilterRule,
        DroppedBy::Policy => Cause::NetfilterPolicy,
        DroppedBy::Conntrack => Cause::ConntrackDrop,
        DroppedBy::Nat => Cause::NatDrop,
        DroppedBy::Table => Cause::NetfilterTable,
    }
}

/// Who dropped it, in the words of its backend, table, chain and rule.
fn summary(a: &Attribution) -> String {
    let family = a.family.map_or("", |x| x.name());
    let table = a.table.as_deref().unwrap_or("");
    let chain = a.chain.as_deref().unwrap_or("");
    let hook = a.hook.map_or_else(String::new, |h| format!(", {h} hook"));
    let backend = a.backend.map_or("", |b| b.name());
    let rule = a.rule.as_deref().unwrap_or("");
    let which = match (a.rule_number, a.handle) {
        (_, Some(h)) => format!("rule (handle {h})"),
        (Some(n), None) => format!("rule {n}"),
        _ => "rule".into(),
    };
    match a.dropped_by {
        DroppedBy::Rule if a.ctstate_invalid => format!(
            "conntrack could not place this packet in a connection (state INVALID) and {backend} {which} in {table}/{chain} ({family}{hook}) drops INVALID packets: {rule}"
        ),
        DroppedBy::Rule => {
            format!("{backend} {which} in {table}/{chain} ({family}{hook}) dropped it: {rule}")
        }
        DroppedBy::Policy => format!(
            "no rule accepted it: policy {} of {backend} chain {table}/{chain} ({family}{hook})",
            a.target.as_deref().unwrap_or("DROP")
        ),
        DroppedBy::Conntrack => {
            "conntrack itself dropped it (table full, or the entry could not be inserted)".into()
        }
        DroppedBy::Nat => format!(
            "the NAT step dropped it ({family}{hook}{}): no address or port to map it to",
            if table.is_empty() {
                String::new()
            } else {
                format!(", table {table}")
            }
        ),
        DroppedBy::Table => format!(
            "{} table {table}{} ({family}{hook}) dropped it: a rule or the chain policy; the counters do not say which",
            if backend.is_empty() { "netfilter" } else { backend },
            if chain.is_empty() {
                String::new()
            } else {
                format!(", chain {chain}")
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{diagnosis::netfilter::fixes::FixKind, model::netfilter::Hook};

    #[test]
    fn a_rule_dropping_invalid_packets_is_conntracks_refusal() {
        let mut a = Attribution::bare(DroppedBy::Rule, "rule counters".into());
        assert_eq!(cause(&a), Cause::NetfilterRule);
        a.ctstate_invalid = true;
        assert_eq!(cause(&a), Cause::ConntrackInvalid);
        a.dropped_by = DroppedBy::Nat;
        assert_eq!(cause(&a), Cause::NatDrop);
    }

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
            unattributed: None,
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
            before_conntrack: false,
            gone: false,
            conntrack: None,
            evidence: vec!["its counter went 0 -> 1".into()],
        }
    }

    #[test]
    fn a_rule_gone_since_the_drop_has_nothing_to_repair() {
        let a = Attribution {
            gone: true,
            ..rule()
        };
        let f = explain(&a, &facts());
        assert_eq!(f.cause, "netfilter_rule");
        assert!(f
            .summary
            .ends_with("-A INPUT -p tcp -m tcp --dport 80 -j DROP"));
        assert!(f.fix.is_empty() && f.fix_or.is_empty(), "{f:?}");
        assert_eq!(
            f.fix_notes,
            ["the rule is gone already (deleted after the drop): it drops no new connection; if \
              it comes back, so do the drops"]
        );
        assert_eq!(
            f.inspect[0],
            "ip netns exec srv iptables-legacy -t filter -L INPUT -v -n -x --line-numbers"
        );
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
                "the repair accepts the packets of connections input already let through (their \
                 replies), first in the chain; it lets TCP to [2001:db8::2]:80 through, from any client"
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
                for (est, raw) in [(None, false), (Some(true), false), (None, true)] {
                    for f in [facts(), syn_ack.clone()] {
                        let mut a = rule();
                        a.backend = Some(backend);
                        a.dropped_by = dropped_by;
                        a.handle = Some(3);
                        a.accepts_established = est;
                        a.before_conntrack = raw;
                        let found = explain(&a, &f);
                        for cmd in found.fix.iter().chain(found.fix_or.iter().flatten()) {
                            assert!(FixKind::of(cmd).is_some(), "{cmd}");
                        }
                    }
                }
            }
        }
    }

    /// In a chain before conntrack (raw) no state is known: the service's
    /// replies are accepted by address and port instead.
    #[test]
    fn a_chain_before_conntrack_accepts_the_services_replies() {
        let mut p = rule();
        p.dropped_by = DroppedBy::Policy;
        p.table = Some("raw".into());
        p.chain = Some("PREROUTING".into());
        p.rule = None;
        p.rule_number = None;
        p.before_conntrack = true;
        let f = explain(&p, &facts());
        assert_eq!(
            f.fix,
            [
                "ip netns exec srv iptables-legacy -t raw -A PREROUTING -p tcp -s 10.0.0.2 --sport 80 -j ACCEPT",
                "ip netns exec srv iptables-legacy -t raw -A PREROUTING -p tcp -d 10.0.0.2 --dport 80 -j ACCEPT"
            ]
        );
        assert!(
            f.fix_notes[0].contains("PREROUTING runs before conntrack"),
            "{:?}",
            f.fix_notes
        );
        // The SYN-ACK itself: its source is the service.
        let mut syn_ack = facts();
        syn_ack.tcp_flags = TCP_SYN | TCP_ACK;
        syn_ack.src = "10.0.0.2:80".into();
        syn_ack.dst = "10.0.0.1:40000".into();
        let f = explain(&p, &syn_ack);
        assert_eq!(
            f.fix,
            ["ip netns exec srv iptables-legacy -t raw -A PREROUTING -p tcp -s 10.0.0.2 --sport 80 -j ACCEPT"]
        );
        let mut n = p.clone();
        n.backend = Some(Backend::Nftables);
        n.family = Some(Family::Inet);
        n.table = Some("kdt".into());
        n.chain = Some("pre".into());
        let f = explain(&n, &facts());
        assert_eq!(
            f.fix,
            [
                "ip netns exec srv nft add rule inet kdt pre ip saddr 10.0.0.2 tcp sport 80 accept",
                "ip netns exec srv nft add rule inet kdt pre ip daddr 10.0.0.2 tcp dport 80 accept"
            ]
        );
    }
}
