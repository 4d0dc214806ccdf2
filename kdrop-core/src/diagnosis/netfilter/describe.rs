//! The chosen candidate (or conntrack's moved statistics) as an
//! [`Attribution`]: who dropped the packet, by which method, with the
//! evidence in words.
use super::{
    attribution::{invalid_state, path_tier, Candidate, Kind, COUNTER_TIERS},
    matching::Tri,
};
use crate::model::netfilter::{
    Attribution, Backend, Chain, ConntrackMoved, ConntrackStats, CtState, DroppedBy, Hook, Match,
    Rule, Snapshot, Verdict, PROTO_TCP,
};

pub fn conntrack_attribution(b: ConntrackStats, a: ConntrackStats) -> Attribution {
    let mut evidence = vec![format!(
        "conntrack statistics of the namespace moved while no rule or policy counter for this packet did: {}",
        stats_moved(&b, &a)
    )];
    if let (Some(count), Some(max)) = (a.count, a.max) {
        evidence.push(format!(
            "conntrack table: {count} entries of nf_conntrack_max {max}"
        ));
    }
    Attribution {
        conntrack: Some(ConntrackMoved {
            before: b,
            after: a,
        }),
        evidence,
        ..Attribution::bare(
            DroppedBy::Conntrack,
            "conntrack statistics (/proc/net/stat/nf_conntrack)".into(),
        )
    }
}

/// `insert_failed 0 -> 1, drop 0 -> 1 (early_drop 0, chaintoolong 0)`:
/// the counters that moved first, the others as they stand.
pub fn stats_moved(b: &ConntrackStats, a: &ConntrackStats) -> String {
    let all = [
        ("insert_failed", b.insert_failed, a.insert_failed),
        ("drop", b.drop, a.drop),
        ("early_drop", b.early_drop, a.early_drop),
        ("chaintoolong", b.chaintoolong, a.chaintoolong),
        ("invalid", b.invalid, a.invalid),
        ("clash_resolve", b.clash_resolve, a.clash_resolve),
    ];
    let moved: Vec<String> = all
        .iter()
        .filter(|(_, b, a)| a != b)
        .map(|(n, b, a)| format!("{n} {b} -> {a}"))
        .collect();
    let still: Vec<String> = all
        .iter()
        .filter(|(_, b, a)| a == b)
        .map(|(n, _, a)| format!("{n} {a}"))
        .collect();
    if still.is_empty() {
        moved.join(", ")
    } else {
        format!("{} ({})", moved.join(", "), still.join(", "))
    }
}

/// Whether `chain` has a rule accepting every TCP packet of an established
/// connection: a conntrack state match with ESTABLISHED and nothing else
/// but `-p tcp` (Docker's and Kubernetes' first FORWARD rule). A rule with
/// more conditions (an interface) lets only some replies through.
pub(super) fn accepts_established(chain: &Chain) -> bool {
    let fits = |m: &Match| match m {
        Match::CtState { neg: false, states } => states.contains(&CtState::Established),
        Match::Proto { neg: false, proto } => *proto == PROTO_TCP,
        _ => false,
    };
    chain.rules.iter().any(|r| {
        r.verdict == Verdict::Accept
            && r.matches.iter().any(|m| matches!(m, Match::CtState { .. }))
            && r.matches.iter().all(fits)
    })
}

/// conntrack's hook runs at priority -200 (NF_IP_PRI_CONNTRACK): a base
/// chain before it sees no state. A user chain is judged by its table
/// (iptables' raw, at -300); nftables user chains are taken to run after.
fn before_conntrack(c: &Candidate) -> bool {
    const CONNTRACK_PRIORITY: i32 = -200;
    match &c.chain.base {
        Some(b) => b.priority < CONNTRACK_PRIORITY,
        None => c.table.backend != Backend::Nftables && c.table.name == "raw",
    }
}

pub(super) fn describe(
    c: &Candidate,
    hooks: &[Hook],
    unrelated: usize,
    first_sight: bool,
    after: &Snapshot,
) -> Attribution {
    let t = c.table;
    let counters = path_tier(c) <= COUNTER_TIERS;
    let method = if counters {
        format!("rule counters ({})", t.source)
    } else {
        format!("ruleset evaluation ({})", t.source)
    };
    let (before, after_n) = c.evidence.counts();
    let (rule, rule_number, handle, target, ctstate_invalid) = match c.kind {
        Kind::Rule(i) => {
            let r = &c.chain.rules[i];
            (
                Some(r.text.clone()),
                Some(i + 1),
                r.handle,
                Some(r.target.clone()),
                invalid_state(r),
            )
        }
        Kind::Policy => (None, None, None, Some(policy_target(t.backend)), false),
    };
    Attribution {
        dropped_by: match c.kind {
            Kind::Rule(_) => DroppedBy::Rule,
            Kind::Policy => DroppedBy::Policy,
        },
        method,
        hook: Some(c.hook),
        family: Some(t.family),
        backend: Some(t.backend),
        table: Some(t.name.clone()),
        chain: Some(c.chain.name.clone()),
        rule,
        rule_number,
        handle,
        target,
        packets_before: before,
        packets_after: after_n,
        ctstate_invalid,
        accepts_established: matches!(c.kind, Kind::Policy).then(|| accepts_established(c.chain)),
        before_conntrack: before_conntrack(c),
        gone: false,
        conntrack: None,
        evidence: evidence(c, hooks, unrelated, first_sight && !counters, after),
    }
}

/// A chain policy's target as its backend writes it.
fn policy_target(backend: Backend) -> String {
    if backend == Backend::Nftables {
        "drop"
    } else {
        "DROP"
    }
    .to_string()
}

/// The candidate's evidence in words: its counter and matches (or that no
/// rule decided before the policy), then what makes it less sure.
/// `first_look`: the first snapshot of the namespace, without counters.
fn evidence(
    c: &Candidate,
    hooks: &[Hook],
    unrelated: usize,
    first_look: bool,
    after: &Snapshot,
) -> Vec<String> {
    let mut evidence = match c.kind {
        Kind::Rule(i) => rule_evidence(c, &c.chain.rules[i]),
        Kind::Policy => vec![
            counter_moved("policy", c.evidence.counts()),
            format!(
                "no rule of {} {}/{} ({} hook) accepted or dropped it before the policy",
                c.table.family.name(),
                c.table.name,
                c.chain.name,
                c.hook
            ),
        ],
    };
    if !c.sure {
        evidence.push(
            "an earlier rule that kdrop could not fully evaluate may have decided first".into(),
        );
    }
    if c.off_path {
        evidence.push(format!(
            "outside the hooks this packet's addresses imply ({})",
            hooks
                .iter()
                .map(|h| h.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if unrelated > 0 {
        evidence.push(format!(
            "{unrelated} other rule counters moved meanwhile; their matches exclude this packet"
        ));
    }
    if first_look {
        evidence.push(FIRST_LOOK.into());
    }
    evidence.extend(after.problems.iter().cloned());
    evidence
}

/// A rule's counter and how far its matches fit the packet.
fn rule_evidence(c: &Candidate, r: &Rule) -> Vec<String> {
    let unknown: Vec<&str> = r
        .matches
        .iter()
        .filter_map(|m| match m {
            Match::Unknown(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    let fit = match c.matches {
        Tri::Yes => "the rule's matches fit this packet".into(),
        _ if !unknown.is_empty() => format!(
            "the rule's other matches fit this packet; not evaluated: {}",
            unknown.join(", ")
        ),
        _ => "the rule's matches may fit this packet".into(),
    };
    vec![counter_moved("rule", c.evidence.counts()), fit]
}

/// The evidence of a walk without a reading from before.
pub const FIRST_LOOK: &str =
    "first look at this namespace: later drops are compared with this snapshot";

/// A rule's evidence when it has no counter.
pub const NO_COUNTER: &str = "the rule has no counter";

/// `rule counter ...` / `policy counter ...`, or that there is none.
fn counter_moved(what: &str, counts: (Option<u64>, Option<u64>)) -> String {
    match counts {
        (Some(b), Some(a)) => {
            format!("{what} counter went {b} -> {a} packets between the snapshots around the drop")
        }
        (None, Some(a)) => format!(
            "{what} counter stands at {a} packets (first look at this namespace: no snapshot \
             from before)"
        ),
        _ if what == "rule" => NO_COUNTER.into(),
        _ => format!("the {what} has no counter"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unresolved clash counts both insert_failed and drop
    /// (nf_ct_resolve_clash, net/netfilter/nf_conntrack_core.c, v6.18).
    #[test]
    fn moved_counters_come_first_and_the_rest_as_they_stand() {
        let b = ConntrackStats {
            early_drop: 4,
            invalid: 9,
            ..ConntrackStats::default()
        };
        let a = ConntrackStats {
            insert_failed: 1,
            drop: 1,
            ..b
        };
        assert_eq!(
            stats_moved(&b, &a),
            "insert_failed 0 -> 1, drop 0 -> 1 (early_drop 4, chaintoolong 0, invalid 9, clash_resolve 0)"
        );
    }

    /// A policy drop's facts: the chain, the backend's target, no rule,
    /// and where it sits against conntrack.
    #[test]
    fn a_policy_drop_is_described_by_its_chain() {
        use super::super::attribution::Evidence;
        use crate::model::netfilter::{BaseChain, Family, Policy, Table};
        let table = Table {
            backend: Backend::Nftables,
            family: Family::Inet,
            name: "filter".into(),
            chains: vec![],
            source: "nft -j list ruleset".into(),
        };
        let chain = Chain {
            name: "input".into(),
            base: Some(BaseChain {
                hook: Hook::Input,
                priority: 0,
                policy: Policy::Drop,
                policy_packets: None,
            }),
            rules: vec![],
        };
        let c = Candidate {
            table: &table,
            chain: &chain,
            hook: Hook::Input,
            kind: Kind::Policy,
            matches: Tri::Yes,
            evidence: Evidence::Delta {
                before: 1,
                after: 2,
                full: true,
            },
            sure: true,
            off_path: false,
        };
        let a = describe(&c, &[Hook::Input], 0, false, &Snapshot::default());
        assert_eq!(a.dropped_by, DroppedBy::Policy);
        assert_eq!((a.rule, a.rule_number), (None, None));
        assert_eq!(a.target.as_deref(), Some("drop"));
        assert_eq!((a.packets_before, a.packets_after), (Some(1), Some(2)));
        assert_eq!(a.accepts_established, Some(false));
        assert!(!a.before_conntrack);
        assert_eq!(a.evidence.len(), 2);
    }

    #[test]
    fn a_full_conntrack_table_is_the_whole_attribution() {
        let b = ConntrackStats {
            drop: 2,
            count: Some(65535),
            max: Some(65536),
            ..ConntrackStats::default()
        };
        let a = ConntrackStats {
            drop: 3,
            count: Some(65536),
            ..b
        };
        let mut want = Attribution::bare(
            DroppedBy::Conntrack,
            "conntrack statistics (/proc/net/stat/nf_conntrack)".into(),
        );
        want.conntrack = Some(ConntrackMoved {
            before: b,
            after: a,
        });
        want.evidence = vec![
            "conntrack statistics of the namespace moved while no rule or policy counter for this packet did: drop 2 -> 3 (insert_failed 0, early_drop 0, chaintoolong 0, invalid 0, clash_resolve 0)".into(),
            "conntrack table: 65536 entries of nf_conntrack_max 65536".into(),
        ];
        assert_eq!(conntrack_attribution(b, a), want);
        // Without the fill levels, no line about them.
        let bare = ConntrackStats {
            count: None,
            max: None,
            ..a
        };
        assert_eq!(conntrack_attribution(b, bare).evidence.len(), 1);
    }
}
