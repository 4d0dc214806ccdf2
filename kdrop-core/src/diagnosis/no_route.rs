//! No route for a packet (IP_INNOROUTES, IP_OUTNOROUTES): the policy rules
//! its lookup walked and what each table held, reasoned into [`NoRoute`]
//! (which rule ended the lookup, which table it shadowed, which table
//! would have answered had a rule sent the packet there), then written as
//! a finding: the summary, the evidence, the repair and what to look at.
use std::net::{IpAddr, Ipv4Addr};

use super::{
    fix_kinds::Kind,
    forwarding::Stuck,
    routes::rule_spec,
    routing::{lookup, route_text, rule_matches, rule_text, table_name, Flow},
};
use crate::model::{
    cause::Cause,
    finding::{Finding, Fix},
    packet::Lookup,
    routing::{Route, RouteLookup, Rule, Tables, FR_ACT_TO_TBL},
};

/// Rule actions that end a lookup with an error: blackhole, unreachable,
/// prohibit (include/uapi/linux/fib_rules.h). `fib4_rule_action` returns
/// -EINVAL, -ENETUNREACH or -EACCES for them, and `fib_rules_lookup` stops at
/// any error but -EAGAIN (net/ipv4/fib_rules.c, net/core/fib_rules.c, v6.18):
/// the rules after one are never read. Only `unreachable` reaches `ip_error`
/// as IP_INNOROUTES; the others drop there without a reason.
const ENDS_LOOKUP: [u8; 3] = [6, 7, 8];

/// What the tables say about the packet.
struct NoRoute<'a> {
    /// The input device's name (`lo` for a packet this host sent).
    iif_name: String,
    /// The rules the lookup read, in order, up to the one that ended it.
    rules: &'a [&'a Rule],
    /// The rule that ended the lookup with an error, if one did.
    ender: Option<&'a Rule>,
    /// After the ender: the first rule whose table holds a route for it.
    shadowed: Option<(&'a Rule, &'a Route)>,
    /// The tables the lookup read.
    looked: Vec<u32>,
    /// A table no rule sends the packet to that holds a route for it.
    elsewhere: Option<&'a Route>,
}

/// The repair the facts call for.
enum Repair<'a> {
    /// Delete the rule that ends the lookup before a table that answers.
    DeleteEnder(&'a Rule),
    /// Send the packet to the table that answers.
    RuleTo(&'a Route),
    /// Nothing on the node answers: a route is missing.
    AddRoute,
}

impl<'a> NoRoute<'a> {
    fn repair(&self) -> Repair<'a> {
        match (self.ender, self.shadowed, self.elsewhere) {
            (Some(e), Some(_), _) => Repair::DeleteEnder(e),
            (None, _, Some(r)) => Repair::RuleTo(r),
            _ => Repair::AddRoute,
        }
    }
}

fn flow<'a>(s: &Stuck, iif: &'a str) -> Flow<'a> {
    Flow {
        src: s.src,
        dst: s.dst,
        mark: s.mark,
        iif,
    }
}

/// The rules a lookup for the packet walks, in priority order.
fn walked<'a>(t: &'a Tables, f: &Flow) -> Vec<&'a Rule> {
    let mut rules: Vec<&Rule> = t
        .rules
        .iter()
        .filter(|r| r.family == 2 && rule_matches(r, f))
        .collect();
    rules.sort_by_key(|r| r.priority);
    rules
}

/// Leading bits `a` and `b` share.
fn common_bits(a: Ipv4Addr, b: Ipv4Addr) -> u32 {
    (u32::from(a) ^ u32::from(b)).leading_zeros()
}

/// Routes of `tables` nearest to `dst` (the longest shared prefix with
/// their network), at most three.
fn nearest<'a>(t: &'a Tables, tables: &[u32], dst: Ipv4Addr) -> Vec<&'a Route> {
    let mut v: Vec<(u32, &Route)> = t
        .routes
        .iter()
        .filter(|r| tables.contains(&r.table) && r.kind == 1)
        .filter_map(|r| match r.dst {
            Some(IpAddr::V4(net)) => Some((common_bits(net, dst).min(u32::from(r.dst_len)), r)),
            _ => None,
        })
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.dst_len.cmp(&a.1.dst_len)));
    v.into_iter().take(3).map(|(_, r)| r).collect()
}

/// The reasoning: which rules the lookup read and what stopped it.
fn facts<'a>(s: &Stuck, t: &'a Tables, all: &'a [&'a Rule], iif_name: String) -> NoRoute<'a> {
    let end = all.iter().position(|r| ENDS_LOOKUP.contains(&r.action));
    let (rules, after) = all.split_at(end.map_or(all.len(), |i| i + 1));
    // The first table after the rule that ended the lookup that would have
    // answered: the rule shadows it.
    let shadowed = after
        .iter()
        .filter(|r| r.action == FR_ACT_TO_TBL)
        .find_map(|r| lookup(&t.routes, r.table, s.dst).map(|route| (*r, route)));
    let looked: Vec<u32> = rules
        .iter()
        .filter(|r| r.action == FR_ACT_TO_TBL)
        .map(|r| r.table)
        .collect();
    // A table that holds a route for it but no rule for this packet reads.
    let elsewhere = t
        .routes
        .iter()
        .filter(|r| !looked.contains(&r.table) && r.table != 255 && r.kind == 1)
        .filter(|r| lookup(&t.routes, r.table, s.dst) == Some(*r))
        .max_by_key(|r| r.dst_len);
    NoRoute {
        iif_name,
        rules,
        ender: end.map(|i| all[i]),
        shadowed,
        looked,
        elsewhere,
    }
}

pub fn finding(s: &Stuck, t: &Tables) -> Finding {
    let iif_name = if s.iif == 0 {
        "lo".to_string()
    } else {
        t.link_name(s.iif)
    };
    let all = walked(t, &flow(s, &iif_name));
    let f = facts(s, t, &all, iif_name);
    let (fix, fix_notes) = repair(&f, s);
    let mut evidence = evidence(&f, s, t);
    if let (Repair::DeleteEnder(_), Some((r, route))) = (f.repair(), f.shadowed) {
        evidence.push(format!(
            "rule {}, after it, holds {}: the lookup never reads it",
            rule_text(r),
            route_text(route, t)
        ));
    }
    if let Repair::RuleTo(r) = f.repair() {
        evidence.push(format!(
            "table {} holds {}, but no rule sends this packet there",
            table_name(r.table),
            route_text(r, t)
        ));
    }
    Finding {
        cause: Cause::NoRoute,
        summary: summary(&f, s, t),
        evidence,
        fix,
        fix_notes,
        inspect: inspect(&f, s),
        ..Finding::default()
    }
}

/// `table main, table 100` (`table` for one).
fn tables_text(looked: &[u32]) -> String {
    format!(
        "table{} {}",
        if looked.len() == 1 { "" } else { "s" },
        looked
            .iter()
            .map(|t| table_name(*t))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn summary(f: &NoRoute, s: &Stuck, t: &Tables) -> String {
    let outcome = match (f.ender, f.shadowed) {
        (Some(e), Some((r, route))) => format!(
            "and rule {} ({}) ends the lookup before table {}, which holds {}",
            e.priority,
            rule_spec(e).trim_start(),
            table_name(r.table),
            route_text(route, t)
        ),
        (Some(e), None) => format!(
            "and rule {} ({}) ends the lookup; no table after it holds a route for it either",
            e.priority,
            rule_spec(e).trim_start()
        ),
        (None, _) => "and none holds a route for it".into(),
    };
    let from = if s.iif == 0 {
        "sent by this host".to_string()
    } else {
        format!("arriving on {}", f.iif_name)
    };
    let priorities: Vec<String> = f.rules.iter().map(|r| r.priority.to_string()).collect();
    format!(
        "no route to {} in netns {}: {} -> {} {from}; rule{} {} looked in {}, {outcome}",
        s.dst,
        s.netns,
        s.src,
        s.dst,
        if f.rules.len() == 1 { "" } else { "s" },
        priorities.join(", "),
        tables_text(&f.looked),
    )
}

/// The kernel's own lookups for the packet, or the same one asked now.
fn kernel_lookups(s: &Stuck, t: &Tables) -> Option<String> {
    let own: Vec<&Lookup> = s
        .fib
        .iter()
        .filter(|l| l.src == s.src && l.dst == s.dst)
        .collect();
    let result = |l: &Lookup| match l.err {
        0 => "matched".to_string(),
        // -EAGAIN: fib_table_lookup found no match in this table
        // (net/ipv4/fib_trie.c, v6.18).
        -11 => "found nothing".to_string(),
        e => format!("failed (error {e})"),
    };
    if !own.is_empty() {
        let each: Vec<String> = own
            .iter()
            .map(|l| format!("table {} {}", table_name(l.table), result(l)))
            .collect();
        return Some(format!(
            "the kernel's lookups for {} -> {}: {}",
            s.src,
            s.dst,
            each.join(", ")
        ));
    }
    let (q, answer) = s.asked?;
    Some(format!(
        "kernel, asked now through netlink (ip route get {}{}{}): {}",
        q.dst,
        q.src.map(|a| format!(" from {a}")).unwrap_or_default(),
        q.iif
            .map(|i| format!(" iif {}", t.link_name(i)))
            .unwrap_or_default(),
        match answer {
            RouteLookup::Failed { name, .. } => name.clone(),
            RouteLookup::Found(a) => format!("a route in table {}", table_name(a.table)),
        }
    ))
}

fn evidence(f: &NoRoute, s: &Stuck, t: &Tables) -> Vec<String> {
    let mut evidence = vec![s.kernel.clone()];
    evidence.extend(kernel_lookups(s, t));
    for r in f.rules {
        let held = match (r.action, lookup(&t.routes, r.table, s.dst)) {
            (FR_ACT_TO_TBL, Some(route)) => format!("holds {}", route_text(route, t)),
            (FR_ACT_TO_TBL, None) => {
                format!("table {} holds nothing for {}", table_name(r.table), s.dst)
            }
            _ => "ends the lookup".into(),
        };
        evidence.push(format!("rule {}: {held}", rule_text(r)));
    }
    let near = nearest(t, &f.looked, s.dst);
    if !near.is_empty() {
        let each: Vec<String> = near
            .iter()
            .map(|r| format!("{} (table {})", route_text(r, t), table_name(r.table)))
            .collect();
        evidence.push(format!("nearest routes: {}", each.join("; ")));
    }
    let has_default = t
        .routes
        .iter()
        .any(|r| f.looked.contains(&r.table) && r.dst.is_none());
    // Behind a rule that ends the lookup, a default route would not help.
    if !has_default && f.ender.is_none() {
        evidence.push(format!("no default route in {}", tables_text(&f.looked)));
    }
    evidence
}

fn repair(f: &NoRoute, s: &Stuck) -> (Vec<Fix>, Vec<String>) {
    let ns = s.netns_exec;
    match f.repair() {
        Repair::DeleteEnder(e) => (
            vec![Kind::RuleDelete.fix(format!(
                "{ns}ip rule del priority {}{}",
                e.priority,
                rule_spec(e)
            ))],
            vec![format!(
                "rule {} may be a policy that keeps this traffic out; delete it only if {} \
                 should be reached from here",
                e.priority, s.dst
            )],
        ),
        Repair::RuleTo(r) => {
            let to = match r.dst {
                Some(a) => format!("{a}/{}", r.dst_len),
                None => format!("{}/32", s.dst),
            };
            let table = table_name(r.table);
            (
                vec![Kind::RuleAddTo.fix(format!("{ns}ip rule add to {to} lookup {table}"))],
                vec![format!(
                    "the rule sends every packet to {to} to table {table}; narrow it (from, \
                     iif, fwmark) if only some should go there"
                )],
            )
        }
        Repair::AddRoute => (
            Vec::new(),
            vec![format!(
                "add a route for {} where it is reached: `{ns}ip route add <prefix of {}> via \
                 <next hop> dev <device>`; kdrop cannot know the next hop",
                s.dst, s.dst
            )],
        ),
    }
}

fn inspect(f: &NoRoute, s: &Stuck) -> Vec<String> {
    let ns = s.netns_exec;
    let from = if s.iif == 0 {
        String::new()
    } else {
        format!(" from {} iif {}", s.src, f.iif_name)
    };
    vec![
        format!("{ns}ip route get {}{from}", s.dst),
        format!("{ns}ip rule show"),
        format!("{ns}ip route show table all"),
    ]
}
