//! A reverse-path filter drop (IP_RPFILTER): the check in force and the way
//! back the reverse lookup found, reasoned into [`Check`] and [`WayBack`],
//! then written as a finding. What the kernel does: routing.rs's module
//! documentation (`__fib_validate_source`, v6.18).
use std::net::{IpAddr, Ipv4Addr};

use super::{
    fix_kinds::Kind,
    reverse_path::{reverse_evidence, RouteDrop},
    routes::{lookup, route_text, rule_matches, rule_text, table_name, Flow, RT_TABLE_LOCAL},
    way_back,
};
use crate::model::{
    cause::Cause,
    finding::{Finding, Fix},
    routing::{Confs, Rule, Tables, FR_ACT_TO_TBL},
};

/// The check in force on the input interface.
struct Check {
    /// Effective rp_filter (the larger of conf.all and the device's).
    rp: u32,
    all: u32,
    dev: u32,
    /// src_valid_mark: the packet's mark takes part in the reverse lookup.
    vmark: bool,
}

impl Check {
    fn of(c: &Confs, iif: &str) -> Self {
        Check {
            rp: c.rp_filter(iif),
            all: c.all.rp_filter.unwrap_or(0),
            dev: c.dev(iif).rp_filter.unwrap_or(0),
            vmark: c.or(iif, |c| c.src_valid_mark),
        }
    }

    fn cause(&self) -> Cause {
        if self.rp == 2 {
            Cause::RpFilterLoose
        } else {
            Cause::RpFilterStrict
        }
    }
}

/// The way back to the source the reverse lookup takes.
struct WayBack<'a> {
    table: u32,
    out_if: u32,
    /// The policy rule whose table answered (none: no rule, the table).
    rule: Option<&'a Rule>,
    /// Computed from the current tables: the kernel's own lookup was not
    /// recorded for this packet.
    computed: bool,
    /// A table whose way to the client leaves by the input interface, and
    /// the priority a rule sending the replies there would take (ahead of
    /// the deciding rule).
    policy: Option<(u32, u32)>,
}

/// The lookup `fib_validate_source` makes: the packet's source, from its
/// destination, as if arriving on lo, with the mark when it counts.
fn reverse_flow(d: &RouteDrop, k: &Check) -> Flow<'static> {
    Flow {
        src: d.dst,
        dst: d.src,
        mark: if k.vmark { d.mark } else { 0 },
        iif: "lo",
    }
}

/// The policy rules the reverse lookup walked, in priority order, up to the
/// one whose table answered.
fn deciding_rule<'a>(t: &'a Tables, flow: &Flow, table: u32) -> Option<&'a Rule> {
    let mut rules: Vec<&Rule> = t.rules.iter().collect();
    rules.sort_by_key(|r| r.priority);
    rules
        .into_iter()
        .filter(|r| r.action == FR_ACT_TO_TBL && rule_matches(r, flow))
        .find(|r| r.table == table)
}

/// The way back from the current tables (the kernel's answer was not
/// recorded): the first matching rule whose table holds a route.
fn computed_way_back(
    d: &RouteDrop,
    t: &Tables,
    flow: &Flow,
) -> Option<(u32, u32, Option<Ipv4Addr>)> {
    let mut rules: Vec<&Rule> = t.rules.iter().collect();
    rules.sort_by_key(|r| r.priority);
    rules
        .iter()
        .filter(|r| r.action == FR_ACT_TO_TBL && rule_matches(r, flow))
        .find_map(|r| {
            let route = lookup(&t.routes, r.table, d.src)?;
            let gw = match route.gateway {
                Some(IpAddr::V4(g)) => Some(g),
                _ => None,
            };
            Some((r.table, route.oif?, gw))
        })
}

/// A table whose route to the client leaves by the input interface: a rule
/// for the packet's destination ahead of the deciding one sends replies
/// (and the reverse lookup) there.
fn policy_alternative(d: &RouteDrop, t: &Tables, rule: Option<&Rule>) -> Option<(u32, u32)> {
    let mut tables: Vec<u32> = t.routes.iter().map(|r| r.table).collect();
    tables.sort_unstable();
    tables.dedup();
    let tb = tables
        .into_iter()
        .filter(|&tb| tb != RT_TABLE_LOCAL)
        .find(|&tb| lookup(&t.routes, tb, d.src).is_some_and(|r| r.oif == Some(d.iif)))?;
    let r = rule.filter(|r| r.priority > 1)?;
    Some((tb, r.priority - 1))
}

pub fn finding(d: &RouteDrop, t: &Tables, c: &Confs, iif: &str, kernel: String) -> Finding {
    let k = Check::of(c, iif);
    let flow = reverse_flow(d, &k);
    let ev = reverse_evidence(d, t);
    let mut evidence = vec![kernel];
    evidence.extend(ev.lines);
    evidence.extend(check_evidence(d, &k, iif));
    let answer = ev.answer.or_else(|| computed_way_back(d, t, &flow));
    let Some((table, out_if, _)) = answer else {
        return no_way_back(d, t, &k, iif, evidence);
    };
    let rule = deciding_rule(t, &flow, table);
    let w = WayBack {
        table,
        out_if,
        rule,
        computed: ev.answer.is_none(),
        policy: policy_alternative(d, t, rule),
    };
    evidence.extend(way_back_evidence(d, t, &w));
    let (fix, fix_or, fix_notes) = repairs(d, &w, iif);
    let decided = match w.rule {
        Some(r) => format!("rule {}", rule_text(r)),
        None => format!("table {}", table_name(w.table)),
    };
    Finding {
        cause: k.cause(),
        summary: format!(
            "{} reverse-path filter on {iif}: the way back to {} is via {} ({decided})",
            if k.rp == 2 { "loose" } else { "strict" },
            d.src,
            t.link_name(w.out_if)
        ),
        evidence,
        fix,
        fix_or,
        fix_notes,
        inspect: inspect(d, &k, iif),
    }
}

/// The sysctls of the check, and the mark's part in the lookup.
fn check_evidence(d: &RouteDrop, k: &Check, iif: &str) -> Vec<String> {
    let mode = match k.rp {
        1 => "strict: the way back must use the input interface",
        2 => "loose: any way back will do",
        _ => "off",
    };
    let mut lines = vec![format!(
        "rp_filter: conf.all={}, conf.{iif}={} → effective {} ({mode})",
        k.all, k.dev, k.rp
    )];
    if d.mark != 0 {
        lines.push(format!(
            "src_valid_mark={}: the packet's mark {:#x} {} the reverse lookup",
            u8::from(k.vmark),
            d.mark,
            if k.vmark {
                "takes part in"
            } else {
                "does not take part in"
            }
        ));
    }
    lines
}

fn way_back_evidence(d: &RouteDrop, t: &Tables, w: &WayBack) -> Vec<String> {
    let mut lines = Vec::new();
    if w.computed {
        lines.push(
            "no kernel route evidence for this packet: the way back below is computed from the \
             current tables"
                .into(),
        );
    }
    if let Some(r) = w.rule {
        lines.push(format!("policy rule that decided: {}", rule_text(r)));
    }
    if let Some(route) = lookup(&t.routes, w.table, d.src) {
        lines.push(format!(
            "route in table {}: {}",
            table_name(w.table),
            route_text(route, t)
        ));
    }
    lines
}

/// Loose mode; or a policy rule that sends the replies back out of the
/// input interface, when a table has that way.
fn repairs(d: &RouteDrop, w: &WayBack, iif: &str) -> (Vec<Fix>, Vec<Vec<Fix>>, Vec<String>) {
    let ns = d.netns_exec;
    let fix =
        vec![Kind::RpFilterLoose.fix(format!("{ns}sysctl -w net.ipv4.conf.{iif}.rp_filter=2"))];
    let Some((tb, priority)) = w.policy else {
        return (fix, Vec::new(), Vec::new());
    };
    let rule = Kind::RpFilterPolicyRule.fix(format!(
        "{ns}ip rule add from {} lookup {} priority {priority}",
        d.dst,
        table_name(tb)
    ));
    let note = format!(
        "the policy rule also sends the replies from {} back out of {iif}, where the client's \
         packets come in; loose mode only stops the check",
        d.dst
    );
    (fix, vec![vec![rule]], vec![note])
}

fn inspect(d: &RouteDrop, k: &Check, iif: &str) -> Vec<String> {
    let ns = d.netns_exec;
    let mark = if k.vmark && d.mark != 0 {
        format!(" mark {:#x}", d.mark)
    } else {
        String::new()
    };
    vec![
        format!("{ns}ip route get {} from {}{mark}", d.src, d.dst),
        format!("{ns}ip rule show"),
        format!("{ns}sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.{iif}.rp_filter"),
    ]
}

/// No route back at all: a host route to the client through the input
/// device, with the next hop the client is reached through there
/// (`way_back`); only in `fix_notes` when kdrop cannot tell it.
fn no_way_back(
    d: &RouteDrop,
    t: &Tables,
    k: &Check,
    iif: &str,
    mut evidence: Vec<String>,
) -> Finding {
    let ns = d.netns_exec;
    let w = way_back::decide(IpAddr::V4(d.src), d.iif, &d.sender, None, t);
    evidence.push(w.evidence.clone());
    let route = |args: &str| format!("{ns}ip route add {}/32{args}", d.src);
    let passes = format!(
        "a route back to {} through {iif} lets the check pass",
        d.src
    );
    let neigh = format!("{ns}ip neigh show dev {iif}");
    let (fix, note) = match w.command(iif, route, &neigh) {
        Ok(cmd) => (vec![Kind::RouteBack.fix(cmd)], passes),
        Err(how) => (Vec::new(), format!("{passes}; {how}")),
    };
    Finding {
        cause: k.cause(),
        summary: format!(
            "reverse-path filter on {iif}: there is no route back to {} at all",
            d.src
        ),
        evidence,
        fix,
        fix_notes: vec![note],
        inspect: vec![
            format!("{ns}ip route get {} from {} iif {iif}", d.src, d.dst),
            neigh,
        ],
        ..Finding::default()
    }
}
