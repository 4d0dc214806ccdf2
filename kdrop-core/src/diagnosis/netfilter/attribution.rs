//! Choosing the rule, chain policy or conntrack drop that killed a packet,
//! from two snapshots of the namespace's rulesets (before and after the drop)
//! and the packet itself.
//!
//! The packet is walked through the hooks its direction implies (a packet to
//! a local address: PREROUTING then INPUT; from one: OUTPUT (then
//! POSTROUTING); neither: PREROUTING, FORWARD, POSTROUTING, which is also
//! the bridge path with br_netfilter), base chains in priority order, rules
//! in order, following jumps. Each rule that drops (DROP, REJECT, a `vmap`
//! that can) becomes a candidate unless its matches exclude the packet or
//! its counter shows it matched nothing between the snapshots; so does each
//! base chain with a DROP policy the walk can reach. The candidate with the
//! strongest evidence wins (see [`tier`]), ties going to the one the packet
//! meets first. Unrelated traffic moves other counters; their rules' matches
//! exclude this packet, so they never compete.
use std::{collections::HashMap, net::IpAddr};

use super::{
    describe::{conntrack_attribution, describe},
    kernel::Scope,
    matching::{eval_all, Packet, Tri},
};
use crate::model::netfilter::{
    Attribution, Backend, Chain, ConntrackStats, CtState, Family, Hook, Iface, Match, Policy, Rule,
    Snapshot, Table, Verdict,
};
use crate::model::packet::Drop;

/// The dropped packet as the kernel reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dropped {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub tcp_flags: u8,
    pub mark: u32,
    /// In the packet's namespace; 0 for a locally sent packet before routing.
    pub ifindex: u32,
}

impl Dropped {
    pub fn of(d: &Drop) -> Self {
        Dropped {
            src: d.saddr,
            dst: d.daddr,
            sport: d.sport,
            dport: d.dport,
            tcp_flags: d.tcp_flags,
            mark: d.mark,
            ifindex: d.ifindex,
        }
    }
}

/// What a counter says about one rule or policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Evidence {
    /// No counter (nftables rule without `counter`, nftables policy).
    None,
    /// No snapshot from before: the total.
    Total(u64),
    /// `full`: the counter counts exactly the packets the rule matched.
    Delta { before: u64, after: u64, full: bool },
}

impl Evidence {
    /// The counter proves it matched nothing in the window (or ever).
    fn excludes(self) -> bool {
        match self {
            Evidence::None => false,
            Evidence::Total(n) => n == 0,
            Evidence::Delta { before, after, .. } => after == before,
        }
    }

    fn moved(self) -> bool {
        matches!(self, Evidence::Delta { before, after, full: true } if after > before)
    }

    pub(super) fn counts(self) -> (Option<u64>, Option<u64>) {
        match self {
            Evidence::None => (None, None),
            Evidence::Total(n) => (None, Some(n)),
            Evidence::Delta { before, after, .. } => (Some(before), Some(after)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Rule(usize),
    Policy,
}

/// A place where the packet may have been dropped.
#[derive(Clone, Debug)]
pub(super) struct Candidate<'a> {
    pub(super) table: &'a Table,
    pub(super) chain: &'a Chain,
    pub(super) hook: Hook,
    pub(super) kind: Kind,
    pub(super) matches: Tri,
    pub(super) evidence: Evidence,
    /// Reached with no uncertain turn (a rule that may or may not have
    /// accepted or jumped) on the way.
    pub(super) sure: bool,
    /// In a hook the packet's direction does not imply.
    pub(super) off_path: bool,
}

/// Lower is stronger evidence.
fn tier(c: &Candidate) -> u8 {
    if c.off_path {
        path_tier(c) + OFF_PATH
    } else {
        path_tier(c)
    }
}

/// Candidates in hooks the packet's direction does not imply come after all
/// others.
const OFF_PATH: u8 = 8;

pub(super) fn path_tier(c: &Candidate) -> u8 {
    let moved = c.evidence.moved();
    let weak = matches!(c.evidence, Evidence::Total(_));
    match (c.kind, moved, c.matches, c.sure, weak) {
        (Kind::Rule(_), true, Tri::Yes, _, _) => 0,
        (Kind::Policy, true, _, _, _) => 1,
        (Kind::Rule(_), true, _, _, _) => 2,
        // 3: conntrack's own drop counter moved.
        (_, false, Tri::Yes, true, false) => 4,
        (_, false, Tri::Yes, true, true) => 5,
        (_, false, Tri::Yes, false, _) => 6,
        _ => 7,
    }
}

const CONNTRACK_TIER: u8 = 3;
/// Above this, no counter says it: the answer comes from evaluation.
pub(super) const COUNTER_TIERS: u8 = 2;

/// Hooks a packet meets, in order, from whether its addresses are local to
/// the namespace; and the interfaces rules see for it.
pub fn path_of(d: &Dropped, ifaces: &[Iface]) -> (Vec<Hook>, Packet) {
    let local = |a: IpAddr| ifaces.iter().any(|i| i.addrs.contains(&a));
    let dev = ifaces
        .iter()
        .find(|i| i.index == d.ifindex && d.ifindex != 0);
    let name = dev.map(|i| i.name.clone());
    let mut p = Packet {
        src: d.src,
        dst: d.dst,
        sport: d.sport,
        dport: d.dport,
        tcp_flags: d.tcp_flags,
        mark: d.mark,
        iif: name.clone(),
        iif_master: dev.and_then(|i| i.master.clone()),
        oif: None,
    };
    use Hook::*;
    let hooks = if ifaces.is_empty() {
        Hook::ALL.to_vec()
    } else {
        match (local(d.src), local(d.dst)) {
            (true, true) => vec![Output, Postrouting, Prerouting, Input],
            (true, false) => {
                // Locally sent: the event's interface is where it leaves.
                // At LOCAL_OUT skb->dev is not set yet (ifindex 0); ip_output()
                // sets it before POSTROUTING (net/ipv4/ip_output.c, Linux 6.18).
                p.iif = None;
                p.iif_master = None;
                p.oif = name;
                if d.ifindex == 0 {
                    vec![Output]
                } else {
                    vec![Output, Postrouting]
                }
            }
            (false, true) => vec![Prerouting, Input],
            (false, false) => vec![Prerouting, Forward, Postrouting],
        }
    };
    (hooks, p)
}

fn family_fits(f: Family, p: &Packet) -> bool {
    match f {
        Family::Ip => p.src.is_ipv4(),
        Family::Ip6 => p.src.is_ipv6(),
        Family::Inet => true,
        // Bridge family chains see frames crossing a bridge.
        Family::Bridge => p.iif_master.is_some(),
        Family::Arp | Family::Netdev => false,
    }
}

type RuleKey = (Backend, Family, String, String, String, usize);
type ChainKey = (Backend, Family, String, String);

/// Identifies rules across snapshots: nftables by handle, iptables by text
/// and how many identical rules come before it in the chain (positions shift
/// when rules are inserted).
fn rule_keys(t: &Table, c: &Chain) -> Vec<RuleKey> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    c.rules
        .iter()
        .map(|r| {
            let id = match r.handle {
                Some(h) => (format!("#{h}"), 0),
                None => {
                    let n = seen.entry(&r.text).or_default();
                    *n += 1;
                    (r.text.clone(), *n)
                }
            };
            (
                t.backend,
                t.family,
                t.name.clone(),
                c.name.clone(),
                id.0,
                id.1,
            )
        })
        .collect()
}

fn chain_key(t: &Table, c: &Chain) -> ChainKey {
    (t.backend, t.family, t.name.clone(), c.name.clone())
}

/// Counters of the snapshot before.
#[derive(Default)]
struct Before {
    present: bool,
    /// Counters ignored: a walk by matches alone (`deleted_since`).
    uncounted: bool,
    rules: HashMap<RuleKey, u64>,
    policies: HashMap<ChainKey, u64>,
}

impl Before {
    /// Without `counted`, every counter is ignored.
    fn of(s: Option<&Snapshot>, counted: bool) -> Self {
        let Some(s) = s else {
            return Self {
                uncounted: !counted,
                ..Self::default()
            };
        };
        let mut b = Before {
            present: true,
            uncounted: !counted,
            ..Self::default()
        };
        for t in &s.tables {
            for c in &t.chains {
                if let Some(p) = c.base.as_ref().and_then(|b| b.policy_packets) {
                    b.policies.insert(chain_key(t, c), p);
                }
                for (k, r) in rule_keys(t, c).into_iter().zip(&c.rules) {
                    if let Some(p) = r.packets {
                        b.rules.insert(k, p);
                    }
                }
            }
        }
        b
    }

    fn evidence(&self, before: Option<u64>, after: Option<u64>, full: bool) -> Evidence {
        match (after, self.present) {
            _ if self.uncounted => Evidence::None,
            (None, _) => Evidence::None,
            (Some(a), false) => Evidence::Total(a),
            // A rule, chain or table that is new since the snapshot before
            // started at zero.
            (Some(a), true) => Evidence::Delta {
                before: before.unwrap_or(0),
                after: a,
                full,
            },
        }
    }
}

struct Walker<'a> {
    tables: Vec<&'a Table>,
    packet: &'a Packet,
    before: Before,
    keys: HashMap<(usize, usize), Vec<RuleKey>>,
    found: Vec<Candidate<'a>>,
    off_path: bool,
    /// A rule that may have dropped the packet came before.
    maybe_dropped: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Dropped,
    Accepted,
    /// End of the chain, or RETURN.
    FellThrough,
}

const MAX_DEPTH: usize = 32;

impl<'a> Walker<'a> {
    fn rule_evidence(&mut self, ti: usize, ci: usize, ri: usize) -> Evidence {
        let t = self.tables[ti];
        let c = &t.chains[ci];
        let r = &c.rules[ri];
        let key = &self.keys.entry((ti, ci)).or_insert_with(|| rule_keys(t, c))[ri];
        let before = self.before.rules.get(key).copied();
        let full = r.counted_matches == r.matches.len();
        self.before.evidence(before, r.packets, full)
    }

    fn walk_hook(&mut self, hook: Hook) -> bool {
        let mut bases: Vec<(usize, usize, i32)> = Vec::new();
        for (ti, t) in self.tables.iter().enumerate() {
            for (ci, c) in t.chains.iter().enumerate() {
                if let Some(b) = c.base.as_ref().filter(|b| b.hook == hook) {
                    bases.push((ti, ci, b.priority));
                }
            }
        }
        bases.sort_by_key(|&(_, _, prio)| prio);
        for (ti, ci, _) in bases {
            let mut sure = true;
            match self.walk_chain(ti, ci, hook, &mut sure, 0) {
                Flow::Dropped => return true,
                Flow::Accepted => {}
                Flow::FellThrough => {
                    let t = self.tables[ti];
                    let c = &t.chains[ci];
                    let Some(base) = &c.base else { continue };
                    if base.policy != Policy::Drop {
                        continue;
                    }
                    let before = self.before.policies.get(&chain_key(t, c)).copied();
                    let evidence = self.before.evidence(before, base.policy_packets, true);
                    if evidence.excludes() {
                        continue;
                    }
                    self.found.push(Candidate {
                        table: t,
                        chain: c,
                        hook,
                        kind: Kind::Policy,
                        matches: Tri::Yes,
                        evidence,
                        sure: sure && !self.maybe_dropped,
                        off_path: self.off_path,
                    });
                    if sure {
                        return true;
                    }
                    // The policy may have dropped it: what a later base
                    // chain drops is no surer.
                    self.maybe_dropped = true;
                }
            }
        }
        false
    }

    fn walk_chain(
        &mut self,
        ti: usize,
        ci: usize,
        hook: Hook,
        sure: &mut bool,
        depth: usize,
    ) -> Flow {
        let t: &'a Table = self.tables[ti];
        let c: &'a Chain = &t.chains[ci];
        if depth > MAX_DEPTH {
            *sure = false;
            return Flow::FellThrough;
        }
        for (ri, r) in c.rules.iter().enumerate() {
            let st = eval_all(&r.matches, self.packet);
            let evidence = self.rule_evidence(ti, ci, ri);
            if st == Tri::No || evidence.excludes() {
                continue;
            }
            let definite = st == Tri::Yes;
            if r.verdict.drops() {
                self.found.push(Candidate {
                    table: t,
                    chain: c,
                    hook,
                    kind: Kind::Rule(ri),
                    matches: st,
                    evidence,
                    sure: *sure && !self.maybe_dropped,
                    off_path: self.off_path,
                });
                if definite && matches!(r.verdict, Verdict::Drop | Verdict::Reject) {
                    return Flow::Dropped;
                }
                self.maybe_dropped = true;
            }
            if let Some(flow) = self.follow(ti, &r.verdict, definite, hook, sure, depth) {
                return flow;
            }
        }
        Flow::FellThrough
    }

    /// Where a rule's verdict, once its matches fit (`definite`) or may,
    /// takes the walk: `Some` flow when it ends the chain's walk here,
    /// `None` to go on with the next rule; jumps and gotos walk their chain
    /// first. An uncertain turn makes the rest not `sure`.
    fn follow(
        &mut self,
        ti: usize,
        verdict: &Verdict,
        definite: bool,
        hook: Hook,
        sure: &mut bool,
        depth: usize,
    ) -> Option<Flow> {
        let t: &'a Table = self.tables[ti];
        match verdict {
            Verdict::Drop | Verdict::Reject | Verdict::Continue => {}
            Verdict::Accept | Verdict::Terminal => {
                if definite {
                    return Some(Flow::Accepted);
                }
                *sure = false;
            }
            Verdict::Return => {
                if definite {
                    return Some(Flow::FellThrough);
                }
                *sure = false;
            }
            Verdict::Jump(target) | Verdict::Goto(target) => {
                let tci = t.chains.iter().position(|x| &x.name == target)?;
                let mut inner = *sure && definite;
                let flow = self.walk_chain(ti, tci, hook, &mut inner, depth + 1);
                if !definite {
                    *sure = false;
                    return None;
                }
                *sure = inner;
                match (flow, matches!(verdict, Verdict::Goto(_))) {
                    (Flow::FellThrough, false) => {}
                    // A goto chain that falls through returns past us.
                    (Flow::FellThrough, true) => return Some(Flow::FellThrough),
                    (f, _) => return Some(f),
                }
            }
            Verdict::Map { chains, .. } => {
                for target in chains {
                    if let Some(tci) = t.chains.iter().position(|x| &x.name == target) {
                        let mut inner = false;
                        self.walk_chain(ti, tci, hook, &mut inner, depth + 1);
                    }
                }
                *sure = false;
            }
        }
        None
    }
}

/// Counts rules whose counters moved between the snapshots although their
/// matches exclude this packet: the unrelated traffic kdrop saw past.
fn unrelated_moves(tables: &[&Table], packet: &Packet, before: &Before) -> usize {
    if !before.present {
        return 0;
    }
    let mut n = 0;
    for t in tables {
        for c in &t.chains {
            for (k, r) in rule_keys(t, c).iter().zip(&c.rules) {
                let (Some(a), Some(b)) = (r.packets, before.rules.get(k)) else {
                    continue;
                };
                if a > *b && eval_all(&r.matches, packet) == Tri::No {
                    n += 1;
                }
            }
        }
    }
    n
}

pub(super) fn invalid_state(r: &Rule) -> bool {
    r.matches.iter().any(|m| {
        matches!(m, Match::CtState { neg: false, states } if states.contains(&CtState::Invalid))
    })
}

fn conntrack_moved(
    before: Option<&Snapshot>,
    after: &Snapshot,
) -> Option<(ConntrackStats, ConntrackStats)> {
    let b = before?.conntrack?;
    let a = after.conntrack?;
    // A clash that could not be resolved counts drop and insert_failed; a
    // chain too long only insert_failed; a full table only drop
    // (nf_ct_resolve_clash, __nf_conntrack_confirm, nf_conntrack_in:
    // https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_core.c).
    (a.drop > b.drop || a.insert_failed > b.insert_failed).then_some((b, a))
}

/// The answer, or `None` when nothing in the rulesets or conntrack's
/// counters points at a drop of this packet.
pub fn attribute(d: &Dropped, before: Option<&Snapshot>, after: &Snapshot) -> Option<Attribution> {
    attribute_within(d, before, after, None)
}

/// `attribute`, searching only the table and hook the kernel's verdict
/// names (see `kernel::scope`).
pub fn attribute_within(
    d: &Dropped,
    before: Option<&Snapshot>,
    after: &Snapshot,
    scope: Option<&Scope>,
) -> Option<Attribution> {
    attribute_in(d, before, after, scope, true)
        .or_else(|| super::deleted::deleted_since(d, before?, after, scope))
}

/// The walk itself (`attribute_within` without the deleted rule's case);
/// without `counted`, by the rules' matches alone.
pub(super) fn attribute_in(
    d: &Dropped,
    before: Option<&Snapshot>,
    after: &Snapshot,
    scope: Option<&Scope>,
    counted: bool,
) -> Option<Attribution> {
    let (mut hooks, packet) = path_of(d, &after.ifaces);
    if let Some(h) = scope.and_then(|s| s.hook) {
        hooks = vec![h];
    }
    let tables: Vec<&Table> = after
        .tables
        .iter()
        .filter(|t| family_fits(t.family, &packet))
        .filter(|t| {
            scope
                .and_then(|s| s.table.as_ref())
                .is_none_or(|n| &t.name == n)
        })
        .collect();
    let mut w = Walker {
        tables: tables.clone(),
        packet: &packet,
        before: Before::of(before, counted),
        keys: HashMap::new(),
        found: Vec::new(),
        off_path: false,
        maybe_dropped: false,
    };
    for &hook in &hooks {
        if w.walk_hook(hook) {
            break;
        }
    }
    // Outside the implied path only for what counters show, and never
    // when the kernel named the hook.
    if scope.is_none() && w.found.iter().all(|c| tier(c) > COUNTER_TIERS) {
        w.off_path = true;
        for hook in Hook::ALL.into_iter().filter(|h| !hooks.contains(h)) {
            w.walk_hook(hook);
        }
    }
    let best = w
        .found
        .iter()
        .enumerate()
        .min_by_key(|(i, c)| (tier(c), *i))
        .map(|(_, c)| c.clone());
    let unrelated = unrelated_moves(&tables, &packet, &w.before);
    let first_sight = before.is_none();
    if let Some((b, a)) = conntrack_moved(before, after).filter(|_| scope.is_none()) {
        if best.as_ref().is_none_or(|c| tier(c) > CONNTRACK_TIER) {
            return Some(conntrack_attribution(b, a));
        }
    }
    let best = best?;
    Some(describe(&best, &hooks, unrelated, first_sight, after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        diagnosis::netfilter::matching::{TCP_ACK, TCP_SYN},
        model::netfilter::DroppedBy,
        parse::{iptables_save::parse_save, nft_json::parse_ruleset},
    };

    const SERVER: &str = "10.7.0.2";
    const CLIENT: &str = "10.7.0.1";

    fn ifaces() -> Vec<Iface> {
        vec![
            Iface {
                index: 1,
                name: "lo".into(),
                master: None,
                addrs: vec!["127.0.0.1".parse().unwrap()],
            },
            Iface {
                index: 2,
                name: "s0".into(),
                master: None,
                addrs: vec![SERVER.parse().unwrap(), "fd00:7::2".parse().unwrap()],
            },
        ]
    }

    fn legacy(text: &str) -> Vec<Table> {
        parse_save(
            text,
            Backend::IptablesLegacy,
            Family::Ip,
            "iptables-legacy-save -c",
        )
        .unwrap()
    }

    fn snap(tables: Vec<Table>) -> Snapshot {
        Snapshot {
            tables,
            ifaces: ifaces(),
            ..Snapshot::default()
        }
    }

    /// A SYN from the client to the server's port.
    fn syn_in(dport: u16) -> Dropped {
        Dropped {
            src: CLIENT.parse().unwrap(),
            dst: SERVER.parse().unwrap(),
            sport: 40000,
            dport,
            tcp_flags: TCP_SYN,
            mark: 0,
            ifindex: 2,
        }
    }

    /// `*filter` with INPUT rules, each `[packets] spec`.
    fn filter(policy: &str, input: &[(u64, &str)], extra: &str) -> String {
        let mut s = format!(
            "*filter\n:INPUT {policy}\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{extra}"
        );
        for (n, spec) in input {
            s.push_str(&format!("[{n}:0] -A INPUT {spec}\n"));
        }
        s.push_str("COMMIT\n");
        s
    }

    /// A policy's drop says whether its chain accepts established
    /// connections: a bare state rule does, one limited to an interface
    /// (some replies only) does not.
    #[test]
    fn a_policy_drop_says_whether_its_chain_accepts_established() {
        let with = |rules: &[(u64, &str)], n: u64| {
            snap(legacy(&filter(&format!("DROP [{n}:0]"), rules, "")))
        };
        for (rule, accepts) in [
            ("-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", true),
            ("-p tcp -m state --state ESTABLISHED -j ACCEPT", true),
            ("-i lo -m conntrack --ctstate ESTABLISHED -j ACCEPT", false),
            ("-m conntrack --ctstate NEW -j ACCEPT", false),
            ("-m conntrack --ctstate ESTABLISHED -j DROP", false),
        ] {
            let rules = [(0, "-p tcp -m tcp --dport 22 -j ACCEPT"), (0, rule)];
            let a = attribute(&syn_in(80), Some(&with(&rules, 1)), &with(&rules, 2)).unwrap();
            assert_eq!(a.dropped_by, DroppedBy::Policy, "{rule}");
            assert_eq!(a.accepts_established, Some(accepts), "{rule}");
        }
        // The raw table runs before conntrack: no state is known there.
        let raw = |n: u64| {
            snap(legacy(&format!(
                "*raw\n:PREROUTING DROP [{n}:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
            )))
        };
        let a = attribute(&syn_in(80), Some(&raw(1)), &raw(2)).unwrap();
        assert_eq!(
            (a.dropped_by, a.table.as_deref()),
            (DroppedBy::Policy, Some("raw"))
        );
        assert!(a.before_conntrack);
        // A rule's drop does not say.
        let rules = [(0, "-p tcp -m tcp --dport 80 -j DROP")];
        let b = snap(legacy(&filter("ACCEPT [0:0]", &rules, "")));
        let after = snap(legacy(&filter(
            "ACCEPT [0:0]",
            &[(1, "-p tcp -m tcp --dport 80 -j DROP")],
            "",
        )));
        let a = attribute(&syn_in(80), Some(&b), &after).unwrap();
        assert_eq!(a.accepts_established, None);
        assert!(!a.before_conntrack);
    }

    #[test]
    fn the_rule_whose_counter_moved_and_that_matches() {
        let before = filter(
            "ACCEPT [0:0]",
            &[
                (5, "-p tcp -m tcp --dport 22 -j DROP"),
                (0, "-p tcp -m tcp --dport 80 -j DROP"),
                (0, "-s 10.7.0.1/32 -p tcp -m tcp --dport 80 -j DROP"),
            ],
            "",
        );
        let after = filter(
            "ACCEPT [0:0]",
            &[
                (9, "-p tcp -m tcp --dport 22 -j DROP"),
                (1, "-p tcp -m tcp --dport 80 -j DROP"),
                (0, "-s 10.7.0.1/32 -p tcp -m tcp --dport 80 -j DROP"),
            ],
            "",
        );
        let a = attribute(
            &syn_in(80),
            Some(&snap(legacy(&before))),
            &snap(legacy(&after)),
        )
        .unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Rule);
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
        assert_eq!(a.hook, Some(Hook::Input));
        assert_eq!(a.family, Some(Family::Ip));
        assert_eq!(a.backend, Some(Backend::IptablesLegacy));
        assert_eq!(a.table.as_deref(), Some("filter"));
        assert_eq!(a.chain.as_deref(), Some("INPUT"));
        assert_eq!(
            a.rule.as_deref(),
            Some("-A INPUT -p tcp -m tcp --dport 80 -j DROP")
        );
        assert_eq!(a.rule_number, Some(2));
        assert_eq!(a.target.as_deref(), Some("DROP"));
        assert_eq!((a.packets_before, a.packets_after), (Some(0), Some(1)));
        assert!(!a.ctstate_invalid);
        assert!(
            a.evidence.contains(
                &"1 other rule counters moved meanwhile; their matches exclude this packet".into()
            ),
            "{:?}",
            a.evidence
        );
    }

    #[test]
    fn chain_policy_when_its_counter_moved() {
        let text = |n| {
            format!(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [{n}:0]\n:OUTPUT ACCEPT [0:0]\n\
                 [0:0] -A FORWARD -i br0 -o br0 -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n"
            )
        };
        // Bridged between two ports of br0: neither address is local.
        let mut s_before = snap(legacy(&text(4)));
        let mut s_after = snap(legacy(&text(5)));
        for s in [&mut s_before, &mut s_after] {
            s.ifaces = vec![Iface {
                index: 3,
                name: "bp0".into(),
                master: Some("br0".into()),
                addrs: vec![],
            }];
        }
        let mut d = syn_in(80);
        d.ifindex = 3;
        let a = attribute(&d, Some(&s_before), &s_after).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Policy);
        assert_eq!(a.hook, Some(Hook::Forward));
        assert_eq!(a.chain.as_deref(), Some("FORWARD"));
        assert_eq!(a.target.as_deref(), Some("DROP"));
        assert_eq!(a.rule, None);
        assert_eq!((a.packets_before, a.packets_after), (Some(4), Some(5)));
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
        assert_eq!(
            a.evidence,
            [
                "policy counter went 4 -> 5 packets between the snapshots around the drop",
                "no rule of ip filter/FORWARD (FORWARD hook) accepted or dropped it before the policy",
            ]
        );

        // The same packet to port 22 would have been accepted by the rule
        // (-i br0 matches through the bridge port): nothing dropped it here.
        let mut d22 = d;
        d22.dport = 22;
        let s_same = {
            let mut s = s_before.clone();
            s.tables = legacy(&text(4));
            s
        };
        assert_eq!(attribute(&d22, Some(&s_before), &s_same), None);
    }

    #[test]
    fn output_drops_of_locally_sent_packets() {
        let before = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n[0:0] -A INPUT -p tcp -m tcp --dport 81 -j DROP\n[0:0] -A OUTPUT -p tcp -m tcp --dport 81 -j DROP\nCOMMIT\n";
        let after = before.replace("[0:0] -A OUTPUT", "[1:60] -A OUTPUT");
        let d = Dropped {
            src: SERVER.parse().unwrap(),
            dst: "10.9.9.9".parse().unwrap(),
            sport: 40000,
            dport: 81,
            tcp_flags: TCP_SYN,
            mark: 0,
            ifindex: 0,
        };
        let a = attribute(&d, Some(&snap(legacy(before))), &snap(legacy(&after))).unwrap();
        assert_eq!(a.hook, Some(Hook::Output));
        assert_eq!(a.chain.as_deref(), Some("OUTPUT"));
        assert_eq!(a.rule_number, Some(1));
    }

    #[test]
    fn raw_table_comes_before_filter() {
        let text = |raw: u64, filt: u64| {
            format!(
                "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n[{raw}:0] -A PREROUTING -p tcp -m tcp --dport 80 -j DROP\nCOMMIT\n{}",
                filter("ACCEPT [0:0]", &[(filt, "-p tcp -m tcp --dport 80 -j DROP")], "")
            )
        };
        let a = attribute(
            &syn_in(80),
            Some(&snap(legacy(&text(0, 0)))),
            &snap(legacy(&text(1, 0))),
        )
        .unwrap();
        assert_eq!(
            (a.table.as_deref(), a.hook),
            (Some("raw"), Some(Hook::Prerouting))
        );
        assert_eq!(a.chain.as_deref(), Some("PREROUTING"));
        // Without a snapshot from before, the walk stops at the raw rule
        // that matches for sure: the filter rule is never reached.
        let a = attribute(&syn_in(80), None, &snap(legacy(&text(3, 3)))).unwrap();
        assert_eq!(a.table.as_deref(), Some("raw"));
        assert_eq!(a.method, "ruleset evaluation (iptables-legacy-save -c)");
        assert!(
            a.evidence.iter().any(|e| e.contains("first look")),
            "{:?}",
            a.evidence
        );
    }

    #[test]
    fn first_sight_excludes_rules_that_never_matched() {
        let after = filter(
            "ACCEPT [0:0]",
            &[
                (0, "-p tcp -m tcp --dport 80 -j DROP"),
                (
                    7,
                    "-p tcp -m multiport --dports 79:81 -j REJECT --reject-with tcp-reset",
                ),
            ],
            "",
        );
        let a = attribute(&syn_in(80), None, &snap(legacy(&after))).unwrap();
        assert_eq!(a.rule_number, Some(2));
        assert_eq!(a.target.as_deref(), Some("REJECT --reject-with tcp-reset"));
        assert_eq!((a.packets_before, a.packets_after), (None, Some(7)));
    }

    /// `inet kdt` with one base chain `input` (policy accept) holding
    /// `rules`, each an nft JSON `expr` array with its handle.
    fn nft_input(rules: &[(u64, &str)]) -> Vec<Table> {
        let mut items = vec![
            r#"{"table": {"family": "inet", "name": "kdt"}}"#.to_string(),
            r#"{"chain": {"family": "inet", "table": "kdt", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}}"#.to_string(),
        ];
        for (handle, expr) in rules {
            items.push(format!(
                r#"{{"rule": {{"family": "inet", "table": "kdt", "chain": "input", "handle": {handle}, "expr": {expr}}}}}"#
            ));
        }
        parse_ruleset(&format!(r#"{{"nftables": [{}]}}"#, items.join(","))).unwrap()
    }

    /// The packet meets the ipset rule first, but only the port rule
    /// certainly matches it: both counters moved, the port rule wins.
    #[test]
    fn a_rule_that_surely_matches_beats_an_earlier_one_that_may() {
        let text = |set: u64, port: u64| {
            filter(
                "ACCEPT [0:0]",
                &[
                    (set, "-m set --match-set blocked src -j DROP"),
                    (port, "-p tcp -m tcp --dport 80 -j DROP"),
                ],
                "",
            )
        };
        let before = snap(legacy(&text(5, 0)));
        let a = attribute(&syn_in(80), Some(&before), &snap(legacy(&text(6, 1)))).unwrap();
        assert_eq!(a.rule_number, Some(2));
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
        assert_eq!(
            a.evidence,
            [
                "rule counter went 0 -> 1 packets between the snapshots around the drop",
                "the rule's matches fit this packet",
                "an earlier rule that kdrop could not fully evaluate may have decided first",
            ]
        );
        // Only the ipset rule moved: it is the answer, with what kdrop
        // could not evaluate named.
        let a = attribute(&syn_in(80), Some(&before), &snap(legacy(&text(6, 0)))).unwrap();
        assert_eq!(a.rule_number, Some(1));
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
        assert_eq!(
            a.evidence,
            [
                "rule counter went 5 -> 6 packets between the snapshots around the drop",
                "the rule's other matches fit this packet; not evaluated: -m set --match-set blocked src",
            ]
        );
    }

    /// iptables-save writes a rule twice when it was appended twice; each
    /// copy keeps its own counter.
    #[test]
    fn identical_rules_keep_their_own_counters() {
        let text = |first: u64, second: u64| {
            filter(
                "ACCEPT [0:0]",
                &[
                    (first, "-p tcp -m tcp --dport 80 -j DROP"),
                    (second, "-p tcp -m tcp --dport 80 -j DROP"),
                ],
                "",
            )
        };
        let a = attribute(
            &syn_in(80),
            Some(&snap(legacy(&text(5, 0)))),
            &snap(legacy(&text(6, 0))),
        )
        .unwrap();
        assert_eq!(a.rule_number, Some(1));
        assert_eq!((a.packets_before, a.packets_after), (Some(5), Some(6)));
    }

    /// An ipset ACCEPT kdrop cannot evaluate comes first: the DROP after it
    /// is the answer, with that doubt said.
    #[test]
    fn a_drop_after_an_accept_kdrop_cannot_evaluate_is_unsure() {
        // Other clients in the set moved its counter meanwhile.
        let text = |n: u64| {
            filter(
                "ACCEPT [0:0]",
                &[
                    (7 + 2 * n, "-m set --match-set allowed src -j ACCEPT"),
                    (n, "-p tcp -m tcp --dport 80 -j DROP"),
                ],
                "",
            )
        };
        let a = attribute(
            &syn_in(80),
            Some(&snap(legacy(&text(0)))),
            &snap(legacy(&text(1))),
        )
        .unwrap();
        assert_eq!(a.rule_number, Some(2));
        assert_eq!(
            a.evidence,
            [
                "rule counter went 0 -> 1 packets between the snapshots around the drop",
                "the rule's matches fit this packet",
                "an earlier rule that kdrop could not fully evaluate may have decided first",
            ]
        );
    }

    /// A base chain's DROP policy that may have dropped the packet (an
    /// ipset ACCEPT before it kdrop cannot evaluate) leaves the next base
    /// chain of the hook in doubt too: mangle INPUT runs before filter
    /// INPUT (NF_IP_PRI_MANGLE -150, NF_IP_PRI_FILTER 0).
    #[test]
    fn a_policy_that_may_have_dropped_leaves_later_tables_in_doubt() {
        let text = format!(
            "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT DROP [3:0]\n:FORWARD ACCEPT [0:0]\n\
             :OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
             [9:0] -A INPUT -m set --match-set allowed src -j ACCEPT\nCOMMIT\n{}",
            filter(
                "ACCEPT [0:0]",
                &[(1, "-p tcp -m tcp --dport 80 -j DROP")],
                ""
            )
        );
        let a = attribute(&syn_in(80), None, &snap(legacy(&text))).unwrap();
        // Neither is sure; the first on the packet's path is named, with
        // the doubt (the filter rule came out sure before).
        assert_eq!(
            (a.table.as_deref(), a.rule.as_deref()),
            (Some("mangle"), None)
        );
        assert_eq!(
            a.evidence[1..3],
            [
                "no rule of ip mangle/INPUT (INPUT hook) accepted or dropped it before the policy",
                "an earlier rule that kdrop could not fully evaluate may have decided first",
            ]
        );
    }

    /// Jumps are followed 32 chains deep (MAX_DEPTH); deeper, the walk
    /// gives up rather than loop.
    #[test]
    fn jumps_are_followed_to_the_depth_limit() {
        let text = |depth: usize, n: u64| {
            let mut decls = String::new();
            let mut rules = format!("[{n}:0] -A INPUT -j C1\n");
            for i in 1..=depth {
                decls.push_str(&format!(":C{i} - [0:0]\n"));
                if i < depth {
                    rules.push_str(&format!("[{n}:0] -A C{i} -j C{}\n", i + 1));
                } else {
                    rules.push_str(&format!(
                        "[{n}:0] -A C{i} -p tcp -m tcp --dport 80 -j DROP\n"
                    ));
                }
            }
            format!(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{decls}{rules}COMMIT\n"
            )
        };
        let at = |depth| {
            attribute(
                &syn_in(80),
                Some(&snap(legacy(&text(depth, 0)))),
                &snap(legacy(&text(depth, 1))),
            )
        };
        let a = at(MAX_DEPTH).unwrap();
        assert_eq!(a.chain.as_deref(), Some("C32"));
        assert_eq!(a.hook, Some(Hook::Input));
        assert_eq!(at(MAX_DEPTH + 1), None);
    }

    /// Without counters too: a rate limit kdrop cannot evaluate may have
    /// dropped the SYN, the port rule after it surely would have.
    #[test]
    fn without_counters_a_rule_that_surely_matches_beats_one_that_may() {
        let s = snap(nft_input(&[
            (
                2,
                r#"[{"limit": {"rate": 100, "burst": 5, "per": "second", "inv": true}}, {"drop": null}]"#,
            ),
            (
                3,
                r#"[{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}}, {"drop": null}]"#,
            ),
        ]));
        let a = attribute(&syn_in(80), Some(&s), &s).unwrap();
        assert_eq!((a.handle, a.rule_number), (Some(3), Some(2)));
        assert_eq!(a.method, "ruleset evaluation (nft -j list ruleset)");
        assert_eq!(
            a.evidence,
            [
                "the rule has no counter",
                "the rule's matches fit this packet",
                "an earlier rule that kdrop could not fully evaluate may have decided first",
            ]
        );
    }

    /// An iptables rule never sees an IPv6 packet nor an ip6tables rule an
    /// IPv4 one: their counters move for the other family's traffic.
    #[test]
    fn tables_of_the_other_family_are_not_searched() {
        let text = |n: u64| {
            filter(
                "ACCEPT [0:0]",
                &[(n, "-p tcp -m tcp --dport 80 -j DROP")],
                "",
            )
        };
        let v6 = |n| {
            parse_save(
                &text(n),
                Backend::IptablesLegacy,
                Family::Ip6,
                "ip6tables-legacy-save -c",
            )
            .unwrap()
        };
        let a = attribute(&syn_in(80), Some(&snap(v6(0))), &snap(v6(1)));
        assert_eq!(a, None);
        let mut d6 = syn_in(80);
        d6.src = "fd00:7::1".parse().unwrap();
        d6.dst = "fd00:7::2".parse().unwrap();
        let a = attribute(&d6, Some(&snap(v6(0))), &snap(v6(1))).unwrap();
        assert_eq!(a.family, Some(Family::Ip6));
        assert_eq!(a.method, "rule counters (ip6tables-legacy-save -c)");
        assert_eq!(
            attribute(&d6, Some(&snap(legacy(&text(0)))), &snap(legacy(&text(1)))),
            None
        );
    }

    /// A drop counted in FORWARD for a packet to a local address only
    /// counts when nothing on its own path (PREROUTING, INPUT) explains it.
    #[test]
    fn a_rule_on_the_path_beats_a_counter_off_it() {
        let forward = |n: u64| {
            format!(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n[{n}:0] -A FORWARD -p tcp -m tcp --dport 80 -j DROP\nCOMMIT\n"
            )
        };
        let both = |n| {
            let mut t = legacy(&forward(n));
            t.extend(nft_input(&[(
                2,
                r#"[{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}}, {"drop": null}]"#,
            )]));
            snap(t)
        };
        let a = attribute(&syn_in(80), Some(&both(0)), &both(1)).unwrap();
        assert_eq!(a.backend, Some(Backend::Nftables));
        assert_eq!((a.hook, a.handle), (Some(Hook::Input), Some(2)));
        assert_eq!(a.method, "ruleset evaluation (nft -j list ruleset)");
        assert_eq!(
            a.evidence,
            [
                "the rule has no counter",
                "the rule's matches fit this packet",
            ]
        );
    }

    /// A verdict map that sends port 80 to `drop` decides before a later
    /// rule that would drop it too (nft_do_chain stops at the first
    /// verdict, net/netfilter/nf_tables_core.c, v6.18).
    #[test]
    fn a_verdict_map_that_fits_decides_before_later_rules() {
        let rules = |counter: &str| {
            nft_input(&[
                (
                    2,
                    &format!(
                        r#"[{counter}{{"vmap": {{"key": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "data": {{"set": [[22, {{"accept": null}}], [80, {{"drop": null}}]]}}}}}}]"#
                    ),
                ),
                (
                    3,
                    &format!(
                        r#"[{{"match": {{"op": "==", "left": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "right": 80}}}}, {counter}{{"drop": null}}]"#
                    ),
                ),
            ])
        };
        // No counters: evaluation, the map first.
        let s = snap(rules(""));
        let a = attribute(&syn_in(80), Some(&s), &s).unwrap();
        assert_eq!((a.handle, a.rule_number), (Some(2), Some(1)));
        assert_eq!(a.method, "ruleset evaluation (nft -j list ruleset)");
        assert_eq!(
            a.evidence,
            [
                "the rule has no counter",
                "the rule's matches fit this packet"
            ]
        );
        // Counters but no snapshot from before: the same, from their totals.
        let s = snap(rules(r#"{"counter": {"packets": 3, "bytes": 180}}, "#));
        let a = attribute(&syn_in(80), None, &s).unwrap();
        assert_eq!((a.handle, a.rule_number), (Some(2), Some(1)));
        assert_eq!((a.packets_before, a.packets_after), (None, Some(3)));
        assert_eq!(
            a.evidence,
            [
                "rule counter stands at 3 packets (first look at this namespace: no snapshot from before)",
                "the rule's matches fit this packet",
                "first look at this namespace: later drops are compared with this snapshot",
            ]
        );
    }

    #[test]
    fn user_chains_are_followed_from_their_hook() {
        let text = |n: u64| {
            format!(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-FW - [0:0]\n:EMPTY - [0:0]\n\
                 [{n}:0] -A INPUT -j EMPTY\n[{n}:0] -A INPUT -j KUBE-FW\n[0:0] -A OUTPUT -j KUBE-FW\n\
                 [2:0] -A KUBE-FW -s 192.0.2.0/24 -j RETURN\n[{n}:0] -A KUBE-FW -d 10.7.0.2/32 -p tcp -m tcp --dport 443 -j DROP\nCOMMIT\n"
            )
        };
        let a = attribute(
            &syn_in(443),
            Some(&snap(legacy(&text(3)))),
            &snap(legacy(&text(4))),
        )
        .unwrap();
        assert_eq!(a.hook, Some(Hook::Input));
        assert_eq!(a.chain.as_deref(), Some("KUBE-FW"));
        assert_eq!(a.rule_number, Some(2));
        // Every turn on the way was certain: no doubt in the evidence.
        assert_eq!(
            a.evidence,
            [
                "rule counter went 3 -> 4 packets between the snapshots around the drop",
                "the rule's matches fit this packet",
            ]
        );
    }

    /// A jump kdrop cannot evaluate (an ipset) may or may not lead to the
    /// DROP behind it.
    #[test]
    fn a_drop_behind_a_jump_kdrop_cannot_evaluate_is_unsure() {
        let text = |n: u64| {
            format!(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:LOG-DROP - [0:0]\n\
                 [{n}:0] -A INPUT -m set --match-set blocklist src -j LOG-DROP\n\
                 [{n}:0] -A LOG-DROP -j LOG --log-prefix \"blocked: \"\n[{n}:0] -A LOG-DROP -j DROP\nCOMMIT\n"
            )
        };
        let a = attribute(
            &syn_in(80),
            Some(&snap(legacy(&text(0)))),
            &snap(legacy(&text(1))),
        )
        .unwrap();
        assert_eq!(
            (a.chain.as_deref(), a.rule_number),
            (Some("LOG-DROP"), Some(2))
        );
        assert_eq!(
            a.evidence,
            [
                "rule counter went 0 -> 1 packets between the snapshots around the drop",
                "the rule's matches fit this packet",
                "an earlier rule that kdrop could not fully evaluate may have decided first",
            ]
        );
    }

    /// A verdict map's element is not evaluated, but the chains it can
    /// jump to are searched.
    #[test]
    fn chains_a_verdict_map_jumps_to_are_searched() {
        let json = r#"{"nftables": [{"table": {"family": "inet", "name": "kdt"}},
 {"chain": {"family": "inet", "table": "kdt", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
 {"chain": {"family": "inet", "table": "kdt", "name": "svc80", "handle": 2}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 3, "expr": [{"vmap": {"key": {"payload": {"protocol": "tcp", "field": "dport"}}, "data": {"set": [[80, {"jump": {"target": "svc80"}}]]}}}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "svc80", "handle": 4, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.7.0.1"}}, {"drop": null}]}}
]}"#;
        let s = snap(parse_ruleset(json).unwrap());
        let a = attribute(&syn_in(80), Some(&s), &s).unwrap();
        assert_eq!((a.chain.as_deref(), a.handle), (Some("svc80"), Some(4)));
        assert_eq!(a.rule.as_deref(), Some("ip saddr 10.7.0.1 drop"));
        assert_eq!(
            a.evidence,
            [
                "the rule has no counter",
                "the rule's matches fit this packet",
                "an earlier rule that kdrop could not fully evaluate may have decided first",
            ]
        );
    }

    #[test]
    fn rules_are_recognized_across_insertions() {
        let before = filter(
            "ACCEPT [0:0]",
            &[(3, "-p tcp -m tcp --dport 80 -j DROP")],
            "",
        );
        let after = filter(
            "ACCEPT [0:0]",
            &[
                (0, "-p tcp -m tcp --dport 8080 -j DROP"),
                (4, "-p tcp -m tcp --dport 80 -j DROP"),
            ],
            "",
        );
        let a = attribute(
            &syn_in(80),
            Some(&snap(legacy(&before))),
            &snap(legacy(&after)),
        )
        .unwrap();
        assert_eq!((a.packets_before, a.packets_after), (Some(3), Some(4)));
        assert_eq!(a.rule_number, Some(2));
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
    }

    #[test]
    fn invalid_state_drops() {
        let text = |n| {
            filter(
                "ACCEPT [0:0]",
                &[
                    (100, "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
                    (n, "-m conntrack --ctstate INVALID -j DROP"),
                ],
                "",
            )
        };
        // A SYN-ACK nobody asked for: conntrack calls it INVALID.
        let d = Dropped {
            src: "10.7.0.9".parse().unwrap(),
            dst: SERVER.parse().unwrap(),
            sport: 80,
            dport: 40000,
            tcp_flags: TCP_SYN | TCP_ACK,
            mark: 0,
            ifindex: 2,
        };
        let mut after = text(1);
        after = after.replace("[100:0]", "[140:0]");
        let a = attribute(&d, Some(&snap(legacy(&text(0)))), &snap(legacy(&after))).unwrap();
        assert!(a.ctstate_invalid);
        assert_eq!(a.rule_number, Some(2));
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
        assert!(
            a.evidence.iter().any(|e| e.contains("may fit")),
            "{:?}",
            a.evidence
        );
    }

    #[test]
    fn nft_policy_and_rules_without_counters() {
        let ruleset = |n: u64| {
            format!(
                r#"{{"nftables": [{{"table": {{"family": "inet", "name": "kdt"}}}},
 {{"chain": {{"family": "inet", "table": "kdt", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}}}},
 {{"rule": {{"family": "inet", "table": "kdt", "chain": "input", "handle": 2, "expr": [{{"match": {{"op": "==", "left": {{"meta": {{"key": "iifname"}}}}, "right": "lo"}}}}, {{"accept": null}}]}}}},
 {{"rule": {{"family": "inet", "table": "kdt", "chain": "input", "handle": 3, "expr": [{{"match": {{"op": "==", "left": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "right": 22}}}}, {{"counter": {{"packets": {n}, "bytes": 0}}}}, {{"accept": null}}]}}}},
 {{"rule": {{"family": "inet", "table": "kdt", "chain": "input", "handle": 4, "expr": [{{"match": {{"op": "==", "left": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "right": 5511}}}}, {{"drop": null}}]}}}},
 {{"rule": {{"family": "inet", "table": "kdt", "chain": "input", "handle": 5, "expr": [{{"match": {{"op": "==", "left": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "right": 5512}}}}, {{"counter": {{"packets": {n}, "bytes": 0}}}}, {{"drop": null}}]}}}}
]}}"#
            )
        };
        let s = |n| snap(parse_ruleset(&ruleset(n)).unwrap());
        // No rule fits port 80: the policy, which nftables keeps no counter for.
        let a = attribute(&syn_in(80), Some(&s(1)), &s(1)).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Policy);
        assert_eq!(a.method, "ruleset evaluation (nft -j list ruleset)");
        assert_eq!(
            (a.family, a.table.as_deref(), a.chain.as_deref()),
            (Some(Family::Inet), Some("kdt"), Some("input"))
        );
        assert_eq!(a.target.as_deref(), Some("drop"));
        assert_eq!(a.backend, Some(Backend::Nftables));
        // A rule without a counter: evaluation.
        let a = attribute(&syn_in(5511), Some(&s(1)), &s(1)).unwrap();
        assert_eq!((a.dropped_by, a.handle), (DroppedBy::Rule, Some(4)));
        assert_eq!(a.rule.as_deref(), Some("tcp dport 5511 drop"));
        assert_eq!(a.method, "ruleset evaluation (nft -j list ruleset)");
        // With a counter that moved: counters.
        let a = attribute(&syn_in(5512), Some(&s(1)), &s(2)).unwrap();
        assert_eq!((a.handle, a.rule_number), (Some(5), Some(4)));
        assert_eq!(a.method, "rule counters (nft -j list ruleset)");
        assert_eq!(a.rule.as_deref(), Some("tcp dport 5512 counter drop"));
        // A counter that did not move clears its rule: the policy remains.
        let a = attribute(&syn_in(5512), Some(&s(1)), &s(1)).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Policy);
        // IPv6 sees the inet table too.
        let mut d6 = syn_in(5511);
        d6.src = "fd00:7::1".parse().unwrap();
        d6.dst = "fd00:7::2".parse().unwrap();
        assert_eq!(attribute(&d6, Some(&s(1)), &s(1)).unwrap().handle, Some(4));
    }

    #[test]
    fn busy_ruleset_with_unrelated_traffic() {
        // 400 rules; traffic to other ports and from other sources moves
        // many of them, including one with this packet's port.
        let mut before = Vec::new();
        let mut after = Vec::new();
        for i in 0..200u64 {
            let spec = format!("-p tcp -m tcp --dport {} -j DROP", 20000 + i);
            before.push((i, spec.clone()));
            after.push((i + i % 3, spec));
            let spec = format!("-s 192.0.2.{}/32 -j DROP", i % 250);
            before.push((i, spec.clone()));
            after.push((i + i % 2, spec));
        }
        let decoy = "-s 10.7.0.3/32 -p tcp -m tcp --dport 8443 -j DROP".to_string();
        let target = "-s 10.7.0.1/32 -p tcp -m tcp --dport 8443 -j DROP".to_string();
        before.insert(150, (10, decoy.clone()));
        after.insert(150, (25, decoy));
        before.insert(300, (0, target.clone()));
        after.insert(300, (1, target.clone()));
        let as_text = |v: &[(u64, String)]| {
            let rules: Vec<(u64, &str)> = v.iter().map(|(n, s)| (*n, s.as_str())).collect();
            filter("ACCEPT [0:0]", &rules, "")
        };
        let a = attribute(
            &syn_in(8443),
            Some(&snap(legacy(&as_text(&before)))),
            &snap(legacy(&as_text(&after))),
        )
        .unwrap();
        assert_eq!(
            a.rule.as_deref(),
            Some(format!("-A INPUT {target}").as_str())
        );
        assert_eq!(a.rule_number, Some(301));
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
        assert!(
            a.evidence
                .iter()
                .any(|e| e.starts_with("234 other rule counters moved")),
            "{:?}",
            a.evidence
        );
    }

    #[test]
    fn conntrack_itself() {
        let text = filter(
            "ACCEPT [0:0]",
            &[(0, "-p tcp -m tcp --dport 80 -j DROP")],
            "",
        );
        let mut b = snap(legacy(&text));
        let mut a = snap(legacy(&text));
        b.conntrack = Some(ConntrackStats {
            drop: 2,
            ..ConntrackStats::default()
        });
        a.conntrack = Some(ConntrackStats {
            drop: 3,
            count: Some(65536),
            max: Some(65536),
            ..ConntrackStats::default()
        });
        let r = attribute(&syn_in(443), Some(&b), &a).unwrap();
        assert_eq!(r.dropped_by, DroppedBy::Conntrack);
        assert_eq!(
            r.method,
            "conntrack statistics (/proc/net/stat/nf_conntrack)"
        );
        assert!(r.evidence[1].contains("65536 entries"), "{:?}", r.evidence);
        // Without that counter moving, nothing explains a drop to port 443.
        b.conntrack = a.conntrack;
        assert_eq!(attribute(&syn_in(443), Some(&b), &a), None);
    }

    /// A hash chain too long counts insert_failed (and chaintoolong), not
    /// drop (__nf_conntrack_confirm, net/netfilter/nf_conntrack_core.c,
    /// v6.18).
    #[test]
    fn conntrack_insert_failed_alone_is_conntrack_too() {
        let mut b = snap(legacy(&filter("ACCEPT [0:0]", &[], "")));
        let mut a = b.clone();
        b.conntrack = Some(ConntrackStats::default());
        a.conntrack = Some(ConntrackStats {
            insert_failed: 1,
            chaintoolong: 1,
            ..ConntrackStats::default()
        });
        let r = attribute(&syn_in(443), Some(&b), &a).unwrap();
        assert_eq!(r.dropped_by, DroppedBy::Conntrack);
        assert_eq!(
            r.evidence,
            ["conntrack statistics of the namespace moved while no rule or policy counter for this packet did: insert_failed 0 -> 1, chaintoolong 0 -> 1 (drop 0, early_drop 0, invalid 0, clash_resolve 0)"]
        );
    }

    /// A rule counter that moved is stronger evidence than conntrack's
    /// drop counter; a rule kdrop only evaluated (no counter) is weaker.
    #[test]
    fn conntrack_counters_rank_between_rule_counters_and_evaluation() {
        let stats = |drop| {
            Some(ConntrackStats {
                drop,
                ..ConntrackStats::default()
            })
        };
        let text = |n: u64| {
            filter(
                "ACCEPT [0:0]",
                &[(n, "-p tcp -m tcp --dport 80 -j DROP")],
                "",
            )
        };
        let mut b = snap(legacy(&text(0)));
        let mut a = snap(legacy(&text(1)));
        b.conntrack = stats(2);
        a.conntrack = stats(3);
        let r = attribute(&syn_in(80), Some(&b), &a).unwrap();
        assert_eq!((r.dropped_by, r.rule_number), (DroppedBy::Rule, Some(1)));

        let port80 = r#"[{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}}, {"drop": null}]"#;
        let mut b = snap(nft_input(&[(2, port80)]));
        let mut a = b.clone();
        b.conntrack = stats(2);
        a.conntrack = stats(3);
        let r = attribute(&syn_in(80), Some(&b), &a).unwrap();
        assert_eq!(r.dropped_by, DroppedBy::Conntrack);
    }

    /// The kernel's verdict (ipt_do_table returned NF_DROP in table filter,
    /// hook INPUT) keeps the counter search to that table and hook.
    #[test]
    fn a_kernel_scope_keeps_the_search_to_its_table_and_hook() {
        let text = |raw: u64, filt: u64, fwd: u64| {
            format!(
                "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n[{raw}:0] -A PREROUTING -p tcp -m tcp --dport 80 -j DROP\nCOMMIT\n\
                 *filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                 [{filt}:0] -A INPUT -p tcp -m tcp --dport 80 -j DROP\n[{fwd}:0] -A FORWARD -p tcp -m tcp --dport 80 -j DROP\nCOMMIT\n"
            )
        };
        let scope = Scope {
            table: Some("filter".into()),
            hook: Some(Hook::Input),
        };
        let before = snap(legacy(&text(0, 0, 0)));
        let after = snap(legacy(&text(1, 1, 0)));
        // Unscoped, the raw rule the packet meets first.
        let a = attribute(&syn_in(80), Some(&before), &after).unwrap();
        assert_eq!(a.table.as_deref(), Some("raw"));
        let a = attribute_within(&syn_in(80), Some(&before), &after, Some(&scope)).unwrap();
        assert_eq!(
            (a.table.as_deref(), a.hook, a.rule_number),
            (Some("filter"), Some(Hook::Input), Some(1))
        );
        // Nothing moved in filter/INPUT: no answer from counters, and none
        // from other hooks either, the kernel having named this one.
        let after = snap(legacy(&text(0, 0, 1)));
        assert_eq!(
            attribute_within(&syn_in(80), Some(&before), &after, Some(&scope)),
            None
        );
    }

    #[test]
    fn rules_kdrop_cannot_evaluate_make_it_unsure() {
        let text = filter(
            "DROP [0:0]",
            &[(0, "-m set --match-set allowed src -j ACCEPT")],
            "",
        )
        .replace(":INPUT DROP [0:0]", ":INPUT DROP");
        // No counters at all (iptables-save without -c): evaluation only.
        let t = legacy(&text.replace("[0:0] -A", "-A"));
        let a = attribute(&syn_in(80), None, &snap(t)).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Policy);
        assert!(
            a.evidence
                .iter()
                .any(|e| e.contains("could not fully evaluate")),
            "{:?}",
            a.evidence
        );
    }

    #[test]
    fn legacy_and_nft_side_by_side() {
        let nft_json = |n: u64| {
            format!(
                r#"{{"nftables": [{{"table": {{"family": "ip", "name": "t"}}}},
 {{"chain": {{"family": "ip", "table": "t", "name": "pre", "handle": 1, "type": "filter", "hook": "prerouting", "prio": -350, "policy": "accept"}}}},
 {{"rule": {{"family": "ip", "table": "t", "chain": "pre", "handle": 2, "expr": [{{"match": {{"op": "==", "left": {{"payload": {{"protocol": "ip", "field": "saddr"}}}}, "right": "10.7.0.1"}}}}, {{"counter": {{"packets": {n}, "bytes": 0}}}}, {{"drop": null}}]}}}}]}}"#
            )
        };
        let leg = filter(
            "ACCEPT [0:0]",
            &[(0, "-p tcp -m tcp --dport 80 -j DROP")],
            "",
        );
        let both = |n| {
            let mut t = legacy(&leg);
            t.extend(parse_ruleset(&nft_json(n)).unwrap());
            snap(t)
        };
        let a = attribute(&syn_in(80), Some(&both(0)), &both(1)).unwrap();
        assert_eq!(a.backend, Some(Backend::Nftables));
        assert_eq!((a.hook, a.handle), (Some(Hook::Prerouting), Some(2)));
    }

    #[test]
    fn off_path_only_for_counters() {
        // A drop counted in FORWARD although the address is local (a DNAT
        // kdrop does not model, say): still found, flagged.
        let text = |n| {
            format!(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n[{n}:0] -A FORWARD -p tcp -m tcp --dport 80 -j DROP\nCOMMIT\n"
            )
        };
        let a = attribute(
            &syn_in(80),
            Some(&snap(legacy(&text(0)))),
            &snap(legacy(&text(1))),
        )
        .unwrap();
        assert_eq!(a.hook, Some(Hook::Forward));
        assert_eq!(a.method, "rule counters (iptables-legacy-save -c)");
        assert!(
            a.evidence.iter().any(|e| e.contains("outside the hooks")),
            "{:?}",
            a.evidence
        );
        assert_eq!(attribute(&syn_in(80), None, &snap(legacy(&text(0)))), None);
    }

    #[test]
    fn paths() {
        let (h, p) = path_of(&syn_in(80), &ifaces());
        assert_eq!(h, [Hook::Prerouting, Hook::Input]);
        assert_eq!(p.iif.as_deref(), Some("s0"));
        let mut out = syn_in(80);
        std::mem::swap(&mut out.src, &mut out.dst);
        let (h, p) = path_of(&out, &ifaces());
        assert_eq!(h, [Hook::Output, Hook::Postrouting]);
        assert_eq!((p.iif, p.oif.as_deref()), (None, Some("s0")));
        out.ifindex = 0;
        assert_eq!(path_of(&out, &ifaces()).0, [Hook::Output]);
        let mut fwd = syn_in(80);
        fwd.dst = "10.8.0.1".parse().unwrap();
        assert_eq!(
            path_of(&fwd, &ifaces()).0,
            [Hook::Prerouting, Hook::Forward, Hook::Postrouting]
        );
        assert_eq!(path_of(&fwd, &[]).0, Hook::ALL);
        let mut lo = syn_in(80);
        lo.src = SERVER.parse().unwrap();
        assert_eq!(path_of(&lo, &ifaces()).0.len(), 4);
    }

    /// Only `--sport` and multiport `--ports` (and their nftables forms)
    /// read a source port; a `--dport` rule or none does not.
    #[test]
    fn which_rulesets_read_source_ports() {
        let save =
            |rule: &str| format!("*filter\n:INPUT ACCEPT [0:0]\n[3:120] -A INPUT {rule}\nCOMMIT\n");
        let reads =
            |rule: &str| crate::diagnosis::netfilter::reads_source_port(&snap(legacy(&save(rule))));
        assert!(!reads("-p tcp -m tcp --dport 80 -j DROP"));
        assert!(!reads("-p tcp -m multiport --dports 80,443 -j DROP"));
        assert!(reads("-p tcp -m tcp --sport 1024:2023 -j DROP"));
        assert!(reads("-p tcp -m multiport --ports 80,443 -j DROP"));
        assert!(!crate::diagnosis::netfilter::reads_source_port(&snap(
            Vec::new()
        )));
    }
}
