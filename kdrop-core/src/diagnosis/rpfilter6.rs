//! IPv6 reverse-path drops by netfilter: an ip6tables `-m rpfilter
//! --invert -j DROP` rule (firewalld's default, raw PREROUTING) or an nft
//! `fib saddr . iif oif missing drop`. The netfilter finding names the rule;
//! this adds the way back the kernel found (the route query that reproduces
//! the rule's lookup, `RouteQuery::reverse_path_v6`), the policy rule that
//! chose its table, and the repair: a policy route back through the input
//! interface, or the check made loose. Pure.
//!
//! What the rules compare, as of v6.18:
//! - `rpfilter_mt` / `rpfilter_lookup_reverse6`
//!   (https://github.com/torvalds/linux/blob/v6.18/net/ipv6/netfilter/ip6t_rpfilter.c):
//!   passes when the lookup's device is the input device, or with `--loose`
//!   when any route is found; `--validmark` puts the packet's mark in the
//!   lookup; `--invert` turns "passes" into "matches", so the DROP hits the
//!   packets that fail.
//! - `nft_fib6_eval` (https://github.com/torvalds/linux/blob/v6.18/net/ipv6/netfilter/nft_fib_ipv6.c):
//!   with `. iif` the result counts only when its device is the input
//!   device; `oif missing` is true when it does not.
use crate::model::cause::Cause;
use std::net::{IpAddr, Ipv6Addr};

use super::{
    fix_kinds::Kind,
    netfilter::matching::in_prefix,
    routes::{rule_text, table_name, RT_TABLE_LOCAL},
    way_back::{self, Sender},
};
use crate::model::{
    finding::{Finding, Fix},
    netfilter::{Attribution, Backend},
    routing::{RouteAnswer, RouteLookup, RouteQuery, Rule, Tables, FR_ACT_TO_TBL},
};

/// The reverse-path check a rule makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// `-m rpfilter`: `loose` (`--loose`), `validmark` (`--validmark`).
    Rpfilter { loose: bool, validmark: bool },
    /// nft `fib saddr [. mark] . iif oif missing`: `iif` keyed (strict),
    /// `mark` keyed.
    Fib { iif: bool, mark: bool },
}

impl Check {
    /// The check of the rule an attribution names, if it is one.
    pub fn of(a: &Attribution) -> Option<Check> {
        let text = a.rule.as_deref()?;
        if text.contains("-m rpfilter") {
            // Only a rule that drops what fails: `--invert` (passing is
            // what the match reports).
            if !text.contains("--invert") {
                return None;
            }
            return Some(Check::Rpfilter {
                loose: text.contains("--loose"),
                validmark: text.contains("--validmark"),
            });
        }
        let fib = text.find("fib saddr")?;
        let expr = &text[fib..];
        let end = expr.find(" oif missing")?;
        let keys = &expr[..end];
        Some(Check::Fib {
            iif: keys.contains(". iif"),
            mark: keys.contains(". mark"),
        })
    }

    /// Does the result have to leave by the input device?
    pub fn strict(self) -> bool {
        match self {
            Check::Rpfilter { loose, .. } => !loose,
            Check::Fib { iif, .. } => iif,
        }
    }

    fn uses_mark(self) -> bool {
        match self {
            Check::Rpfilter { validmark, .. } => validmark,
            Check::Fib { mark, .. } => mark,
        }
    }

    /// The route query that asks what the rule's lookup asks
    /// (`RouteQuery::reverse_path_v6`): ip6t_rpfilter prefers the input
    /// device as oif in strict mode; nft's fib looks up without it and
    /// compares afterwards.
    pub fn query(self, src: Ipv6Addr, dst: Ipv6Addr, iif: u32, mark: u32) -> RouteQuery {
        let mark = self.uses_mark().then_some(mark);
        let loose = match self {
            Check::Rpfilter { loose, .. } => loose,
            Check::Fib { .. } => true,
        };
        RouteQuery::reverse_path_v6(src, dst, iif, mark, loose)
    }
}

/// The query for a route to the client that leaves by the input device
/// (an oif without a source makes the kernel keep to that device,
/// RT6_LOOKUP_F_IFACE in `ip6_route_output_flags`): its gateway, if any,
/// is the one the repair route needs.
pub fn via_iif_query(src: Ipv6Addr, iif: u32) -> RouteQuery {
    RouteQuery {
        oif: Some(iif),
        ..RouteQuery::get(src.into())
    }
}

/// One IPv6 reverse-path drop and what the node answered.
#[derive(Clone, Debug)]
pub struct Rpf6<'a> {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub iif: u32,
    pub mark: u32,
    pub check: Check,
    /// The reverse lookup asked ([`Check::query`]) and its answer.
    pub asked: &'a RouteQuery,
    pub answer: &'a RouteLookup,
    /// The answer of [`via_iif_query`].
    pub via_iif: Option<&'a RouteLookup>,
    /// The neighbour that handed the packet to the node.
    pub sender: Sender<'a>,
    /// `ip netns exec <name> ` (empty: kdrop's own namespace).
    pub netns_exec: &'a str,
}

/// Does policy rule `r` select the reverse lookup (from lo, source the
/// packet's destination, to the packet's source, with `mark`, oif the
/// input device when the query names one)? fib_rule_match in
/// net/core/fib_rules.c and fib6_rule_match in net/ipv6/fib6_rules.c (v6.18).
fn selects(r: &Rule, d: &Rpf6, oif: Option<&str>) -> bool {
    let from = d.asked.src;
    let hit = r.iifname.as_deref().is_none_or(|i| i == "lo")
        && r.oifname.as_deref().is_none_or(|o| Some(o) == oif)
        && r.fwmark
            .is_none_or(|m| (m ^ d.asked.mark.unwrap_or(0)) & r.fwmask.unwrap_or(u32::MAX) == 0)
        && r.src
            .is_none_or(|(a, l)| from.and_then(|f| in_prefix(f, a, l)) == Some(true))
        && r.dst
            .is_none_or(|(a, l)| in_prefix(IpAddr::V6(d.src), a, l) == Some(true));
    hit != r.invert
}

/// The first policy rule that selects the lookup and leads to `table`.
fn deciding<'a>(t: &'a Tables, d: &Rpf6, table: u32) -> Option<&'a Rule> {
    let oif = d.asked.oif.map(|i| t.link_name(i));
    let mut rules: Vec<&Rule> = t.rules6.iter().collect();
    rules.sort_by_key(|r| r.priority);
    rules
        .into_iter()
        .filter(|r| r.action == FR_ACT_TO_TBL && selects(r, d, oif.as_deref()))
        .find(|r| r.table == table)
}

/// `fd00:2::/64 via fe80::1 dev eth0 table main`.
fn answer_text(a: &RouteAnswer, t: &Tables) -> String {
    let dst = match a.dst {
        Some(d) if a.dst_len == 128 => d.to_string(),
        Some(d) => format!("{d}/{}", a.dst_len),
        None => "default".into(),
    };
    let mut s = dst;
    if let Some(gw) = a.gateway {
        s.push_str(&format!(" via {gw}"));
    }
    let devs: Vec<String> = a.devices().iter().map(|&i| t.link_name(i)).collect();
    if !devs.is_empty() {
        s.push_str(&format!(" dev {}", devs.join(",")));
    }
    s.push_str(&format!(" table {}", table_name(a.table)));
    s
}

/// `ip -6 route get` as the lookup was asked.
fn route_get(d: &Rpf6, t: &Tables) -> String {
    let mut s = format!("{}ip -6 route get {}", d.netns_exec, d.src);
    if let Some(from) = d.asked.src {
        s.push_str(&format!(" from {from}"));
    }
    if let Some(o) = d.asked.oif {
        s.push_str(&format!(" oif {}", t.link_name(o)));
    }
    if let Some(m) = d.asked.mark.filter(|&m| m != 0) {
        s.push_str(&format!(" mark {m:#x}"));
    }
    s
}

/// A table number for the repair route that no rule reads and no route is
/// in: from 100, past the kernel's 252-255 (compat, default, main, local;
/// include/uapi/linux/rtnetlink.h) when 100-251 are all taken.
fn free_table(t: &Tables) -> u32 {
    let taken = |n: u32| {
        t.rules.iter().chain(&t.rules6).any(|r| r.table == n)
            || t.routes.iter().chain(&t.routes6).any(|r| r.table == n)
    };
    (100..RT_TABLE_LOCAL - 3)
        .chain(RT_TABLE_LOCAL + 1..)
        .find(|n| !taken(*n))
        .expect("fewer rules and routes than table numbers")
}

/// The rule changed to loose mode, where a route back through any device
/// passes: `ip6tables -R` of the rule with `--loose`, or the nft rule
/// replaced without its `. iif` key.
fn loosen(a: &Attribution, ns: &str) -> Option<Fix> {
    let table = a.table.as_deref()?;
    let chain = a.chain.as_deref()?;
    let text = a.rule.as_deref()?;
    match a.backend? {
        Backend::Nftables => {
            let family = a.family?.name();
            let h = a.handle?;
            let body = text.replacen(" . iif", "", 1);
            Some(Kind::Rpfilter6NftLoose.fix(format!(
                "{ns}nft replace rule {family} {table} {chain} handle {h} {body}"
            )))
        }
        b => {
            let tool = match b {
                Backend::IptablesLegacy => "ip6tables-legacy",
                _ => "ip6tables-nft",
            };
            let n = a.rule_number?;
            let spec = text.strip_prefix(&format!("-A {chain} "))?;
            let spec = spec.replacen("-m rpfilter", "-m rpfilter --loose", 1);
            Some(
                Kind::Rpfilter6Ip6tablesLoose
                    .fix(format!("{ns}{tool} -t {table} -R {chain} {n} {spec}")),
            )
        }
    }
}

/// The netfilter finding `nf` for this drop, with the way back and the
/// repair.
/// What the rule's reverse lookup found.
enum Found<'a> {
    /// A unicast route, leaving by other devices; the rule that chose its
    /// table, if one did.
    Elsewhere(&'a RouteAnswer, Option<&'a Rule>),
    /// No route back at all: the lookup's error.
    Nothing(&'a str),
    /// A route of another type (blackhole, unreachable, ...).
    Other(&'a RouteAnswer),
}

fn found<'a>(d: &'a Rpf6, t: &'a Tables) -> Found<'a> {
    match d.answer {
        RouteLookup::Found(r) if r.kind == crate::model::routing::RouteType::Unicast => {
            Found::Elsewhere(r, deciding(t, d, r.table))
        }
        RouteLookup::Failed { name, .. } => Found::Nothing(name),
        RouteLookup::Found(r) => Found::Other(r),
    }
}

/// The lookup as evidence, and why the check failed.
fn lookup_text(f: &Found, d: &Rpf6, t: &Tables, iif: &str) -> (Vec<String>, String) {
    let mode = if d.check.strict() { "strict" } else { "loose" };
    let asked = route_get(d, t);
    let lookup = format!("reverse lookup as the rule makes it ({mode}): `{asked}` answers");
    match f {
        Found::Elsewhere(r, rule) => {
            let mut ev = vec![format!("{lookup} {}", answer_text(r, t))];
            let out: Vec<String> = r.devices().iter().map(|&i| t.link_name(i)).collect();
            let decided = match rule {
                Some(p) => {
                    ev.push(format!("policy rule that decided: {}", rule_text(p)));
                    format!("table {}, rule {}", table_name(r.table), rule_text(p))
                }
                None => format!("table {}", table_name(r.table)),
            };
            let why = format!(
                "the way back to {} leaves by {}, not {iif} ({decided})",
                d.src,
                out.join(",")
            );
            (ev, why)
        }
        Found::Nothing(name) => (
            vec![format!("{lookup} {name}")],
            format!("there is no route back to {} ({name})", d.src),
        ),
        Found::Other(r) => (
            vec![format!(
                "{lookup} a {:?} route ({})",
                r.kind,
                answer_text(r, t)
            )],
            format!("the way back to {} is a {:?} route", d.src, r.kind),
        ),
    }
}

/// A policy route back through the input device, with the next hop the
/// client is reached through there (the neighbour the packet came from,
/// else the gateway the node already uses on that side); or, for a strict
/// check that found a route elsewhere, the rule made loose.
fn repairs(
    f: &Found,
    a: &Attribution,
    d: &Rpf6,
    t: &Tables,
    iif: &str,
) -> (String, Vec<Fix>, Vec<Vec<Fix>>, Vec<String>) {
    let ns = d.netns_exec;
    let asked_gw = match d.via_iif {
        Some(RouteLookup::Found(r)) if r.devices().contains(&d.iif) => r.gateway,
        _ => None,
    };
    let w = way_back::decide(IpAddr::V6(d.src), d.iif, &d.sender, asked_gw, t);
    let table = free_table(t);
    let decided = match f {
        Found::Elsewhere(_, rule) => *rule,
        _ => None,
    };
    let priority = decided.map_or(1, |r| r.priority.saturating_sub(1).max(1));
    let from = d.asked.src.map_or(String::new(), |s| format!("from {s} "));
    let route = |args: &str| format!("{ns}ip -6 route add {}/128{args} table {table}", d.src);
    let policy = format!(
        "{ns}ip -6 rule add {from}to {}/128 lookup {table} priority {priority}",
        d.src
    );
    let sends = format!(
        "the policy route sends the way back to {} (the rule's lookup, and the replies from {}) \
         out of {iif}, where the client's packets come in",
        d.src,
        d.asked
            .src
            .map_or("this host".to_string(), |s| s.to_string()),
    );
    let neigh = format!("{ns}ip -6 neigh show dev {iif}");
    let (fix, first_note) = match w.command(iif, route, &neigh) {
        Ok(cmd) => (
            vec![
                Kind::Rpfilter6Route.fix(cmd),
                Kind::Rpfilter6Rule.fix(policy),
            ],
            sends,
        ),
        Err(how) => (Vec::new(), format!("{sends}; {how}; then `{policy}`")),
    };
    let mut fix_or = Vec::new();
    if matches!(f, Found::Elsewhere(..)) && d.check.strict() {
        fix_or.extend(loosen(a, ns).map(|c| vec![c]));
    }
    let mut notes = vec![first_note];
    if !fix_or.is_empty() {
        notes.push(
            "loose mode only checks that some route back exists; a firewall manager \
             (firewalld: IPv6_rpfilter=loose) rewrites a rule changed by hand"
                .into(),
        );
    }
    (w.evidence, fix, fix_or, notes)
}

pub fn explain(nf: Finding, a: &Attribution, d: &Rpf6, t: &Tables) -> Finding {
    let iif = t.link_name(d.iif);
    let place = format!(
        "{} rule in {}/{}",
        a.backend.map_or("netfilter", |b| b.name()),
        a.table.as_deref().unwrap_or(""),
        a.chain.as_deref().unwrap_or("")
    );
    let rule = a.rule.as_deref().unwrap_or("");
    let mode = if d.check.strict() { "strict" } else { "loose" };
    let f = found(d, t);
    let (lookup, why) = lookup_text(&f, d, t, &iif);
    let mut evidence = nf.evidence;
    evidence.extend(lookup);
    evidence.push(format!(
        "the check passes only when the way back to {} leaves by {iif}, where the packet came in{}",
        d.src,
        if d.check.strict() {
            ""
        } else {
            " (loose: by any device)"
        }
    ));
    let (way, fix, fix_or, fix_notes) = repairs(&f, a, d, t, &iif);
    evidence.push(way);
    let mut inspect = vec![route_get(d, t), format!("{}ip -6 rule show", d.netns_exec)];
    inspect.extend(nf.inspect);
    Finding {
        cause: Cause::Rpfilter6,
        summary: format!(
            "IPv6 reverse-path check failed on {iif}: {place} ({mode}) drops it: {why}: {rule}"
        ),
        evidence,
        fix,
        fix_or,
        fix_notes,
        inspect,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        neighbour::Neighbour,
        netfilter::{DroppedBy, Family, Hook},
        routing::{Link, RouteType, RTN_UNICAST},
    };

    fn attribution(backend: Backend, rule: &str) -> Attribution {
        Attribution {
            dropped_by: DroppedBy::Rule,
            method: "rule counters".into(),
            hook: Some(Hook::Prerouting),
            family: Some(if backend == Backend::Nftables {
                Family::Inet
            } else {
                Family::Ip6
            }),
            backend: Some(backend),
            table: Some(
                if backend == Backend::Nftables {
                    "fw"
                } else {
                    "raw"
                }
                .into(),
            ),
            chain: Some(
                if backend == Backend::Nftables {
                    "pre"
                } else {
                    "PREROUTING"
                }
                .into(),
            ),
            rule: Some(rule.into()),
            rule_number: Some(1),
            handle: (backend == Backend::Nftables).then_some(4),
            target: Some("DROP".into()),
            packets_before: Some(0),
            packets_after: Some(1),
            ctstate_invalid: false,
            accepts_established: None,
            before_conntrack: false,
            gone: false,
            conntrack: None,
            evidence: vec![],
        }
    }

    fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.into(),
            master: None,
            kind: Some("veth".into()),
            up: true,
        }
    }

    fn tables() -> Tables {
        let rule = |priority, table, src: Option<&str>| Rule {
            family: 10,
            priority,
            table,
            action: FR_ACT_TO_TBL,
            src: src.map(|s| (s.parse().unwrap(), 64)),
            dst: None,
            fwmark: None,
            fwmask: None,
            iifname: None,
            oifname: None,
            invert: false,
            goto: None,
        };
        Tables {
            links: vec![link(1, "lo"), link(2, "eth0"), link(3, "eth1")],
            rules6: vec![
                rule(0, 255, None),
                rule(1000, 100, Some("fd00:9::")),
                rule(32766, 254, None),
            ],
            ..Tables::default()
        }
    }

    fn found(table: u32, dev: u32, gw: Option<&str>) -> RouteLookup {
        RouteLookup::Found(RouteAnswer {
            family: 10,
            dst_len: 0,
            table,
            kind: RouteType::Unicast,
            scope: 0,
            flags: 0,
            dst: None,
            oif: Some(dev),
            gateway: gw.map(|g| g.parse().unwrap()),
            prefsrc: None,
            priority: None,
            nexthops: vec![],
            nh_id: None,
        })
    }

    fn src() -> Ipv6Addr {
        "fd00:61:9::1".parse().unwrap()
    }

    fn dst() -> Ipv6Addr {
        "fd00:61:1::2".parse().unwrap()
    }

    #[test]
    fn recognizes_the_rules() {
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --invert -j DROP",
        );
        assert_eq!(
            Check::of(&a),
            Some(Check::Rpfilter {
                loose: false,
                validmark: false
            })
        );
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --loose --validmark --invert -j DROP",
        );
        assert_eq!(
            Check::of(&a),
            Some(Check::Rpfilter {
                loose: true,
                validmark: true
            })
        );
        // Without --invert the rule matches the packets that pass.
        let a = attribution(Backend::IptablesNft, "-A PREROUTING -m rpfilter -j ACCEPT");
        assert_eq!(Check::of(&a), None);
        let a = attribution(
            Backend::Nftables,
            "fib saddr . iif oif missing counter drop",
        );
        assert_eq!(
            Check::of(&a),
            Some(Check::Fib {
                iif: true,
                mark: false
            })
        );
        let a = attribution(Backend::Nftables, "fib saddr . mark oif missing drop");
        assert_eq!(
            Check::of(&a),
            Some(Check::Fib {
                iif: false,
                mark: true
            })
        );
        let a = attribution(Backend::Nftables, "tcp dport 80 drop");
        assert_eq!(Check::of(&a), None);
    }

    #[test]
    fn queries_follow_each_rule() {
        let strict = Check::Rpfilter {
            loose: false,
            validmark: false,
        };
        let q = strict.query(src(), dst(), 3, 0x80);
        assert_eq!(
            (q.oif, q.mark, q.src),
            (Some(3), Some(0), Some(dst().into()))
        );
        let q = Check::Rpfilter {
            loose: false,
            validmark: true,
        }
        .query(src(), dst(), 3, 0x80);
        assert_eq!(q.mark, Some(0x80));
        // nft looks up without the oif preference, compares afterwards.
        let q = Check::Fib {
            iif: true,
            mark: false,
        }
        .query(src(), dst(), 3, 0x80);
        assert_eq!((q.oif, q.mark), (None, Some(0)));
        let v = via_iif_query(src(), 3);
        assert_eq!((v.oif, v.src), (Some(3), None));
    }

    fn drop<'a>(check: Check, asked: &'a RouteQuery, answer: &'a RouteLookup) -> Rpf6<'a> {
        Rpf6 {
            src: src(),
            dst: dst(),
            iif: 3,
            mark: 0,
            check,
            asked,
            answer,
            via_iif: None,
            sender: Sender::default(),
            netns_exec: "ip netns exec node ",
        }
    }

    /// The client's own neighbour entry on eth1.
    fn client_entry() -> Neighbour {
        Neighbour {
            dst: src().into(),
            ifindex: 3,
            dev: "eth1".into(),
            state: crate::model::neighbour::NUD_STALE,
            lladdr: Some("02:00:00:00:81:01".into()),
            router: false,
            probes: None,
        }
    }

    fn nf() -> Finding {
        Finding {
            cause: Cause::NetfilterRule,
            evidence: vec!["kernel drop reason NETFILTER_DROP".into()],
            inspect: vec!["ip netns exec node ip6tables-nft -t raw -L PREROUTING".into()],
            ..Finding::default()
        }
    }

    #[test]
    fn ip6tables_strict_way_back_by_another_device() {
        let check = Check::Rpfilter {
            loose: false,
            validmark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let ans = found(254, 2, Some("fd00:61:2::1"));
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --invert -j DROP",
        );
        // The SYN came from the client's own MAC: it is on eth1's link.
        let entries = [client_entry()];
        let mut d = drop(check, &q, &ans);
        d.sender = Sender {
            mac: Some([2, 0, 0, 0, 0x81, 1]),
            neighbours: Some(&entries),
        };
        let f = explain(nf(), &a, &d, &tables());
        assert_eq!(f.cause, "rpfilter6");
        assert_eq!(
            f.summary,
            "IPv6 reverse-path check failed on eth1: iptables-nft rule in raw/PREROUTING \
             (strict) drops it: the way back to fd00:61:9::1 leaves by eth0, not eth1 (table \
             main, rule 32766: from all lookup main): -A PREROUTING -m rpfilter --invert -j DROP"
        );
        assert_eq!(
            f.evidence.last().unwrap(),
            "the packet came from 02:00:00:00:81:01 = fd00:61:9::1 on eth1: the client itself, \
             on eth1's link"
        );
        assert_eq!(
            f.evidence[1],
            "reverse lookup as the rule makes it (strict): `ip netns exec node ip -6 route get \
             fd00:61:9::1 from fd00:61:1::2 oif eth1` answers default via fd00:61:2::1 dev eth0 \
             table main"
        );
        assert_eq!(
            f.evidence[2],
            "policy rule that decided: 32766: from all lookup main"
        );
        assert_eq!(
            f.fix,
            [
                "ip netns exec node ip -6 route add fd00:61:9::1/128 dev eth1 table 101",
                "ip netns exec node ip -6 rule add from fd00:61:1::2 to fd00:61:9::1/128 lookup 101 priority 32765",
            ]
        );
        assert_eq!(
            f.fix_or,
            [["ip netns exec node ip6tables-nft -t raw -R PREROUTING 1 -m rpfilter --loose --invert -j DROP"]]
        );
        assert_eq!(
            f.fix_notes,
            [
                "the policy route sends the way back to fd00:61:9::1 (the rule's lookup, and the \
                 replies from fd00:61:1::2) out of eth1, where the client's packets come in",
                "loose mode only checks that some route back exists; a firewall manager \
                 (firewalld: IPv6_rpfilter=loose) rewrites a rule changed by hand",
            ]
        );
        assert_eq!(f.inspect[1], "ip netns exec node ip -6 rule show");
        assert_eq!(f.inspect.len(), 3);
    }

    #[test]
    fn a_policy_rule_names_its_table_and_the_gateway_on_the_input_side() {
        let check = Check::Fib {
            iif: true,
            mark: false,
        };
        let q = RouteQuery {
            src: Some("fd00:9::5".parse().unwrap()),
            ..check.query(src(), dst(), 3, 0)
        };
        let ans = found(100, 2, None);
        let via = found(254, 3, Some("fe80::1"));
        let a = attribution(
            Backend::Nftables,
            "fib saddr . iif oif missing counter drop",
        );
        let mut d = drop(check, &q, &ans);
        d.via_iif = Some(&via);
        let f = explain(nf(), &a, &d, &tables());
        // The node's own route through eth1 wins over the query's answer.
        let mut t = tables();
        t.routes6.push(crate::model::routing::Route {
            table: 7,
            family: 10,
            dst: Some("fd00:61::".parse().unwrap()),
            dst_len: 32,
            kind: RTN_UNICAST,
            scope: 0,
            oif: Some(3),
            gateway: Some("fd00:61:1::fe".parse().unwrap()),
            prefsrc: None,
            priority: 1024,
            nexthops: vec![],
        });
        assert_eq!(
            explain(nf(), &a, &d, &t).fix[0],
            "ip netns exec node ip -6 route add fd00:61:9::1/128 via fd00:61:1::fe dev eth1 table 101"
        );
        assert!(f.summary.ends_with(
            "leaves by eth0, not eth1 (table 100, rule 1000: from fd00:9::/64 lookup 100): \
             fib saddr . iif oif missing counter drop"
        ));
        assert_eq!(
            f.fix,
            [
                "ip netns exec node ip -6 route add fd00:61:9::1/128 via fe80::1 dev eth1 table 101",
                "ip netns exec node ip -6 rule add from fd00:9::5 to fd00:61:9::1/128 lookup 101 priority 999",
            ]
        );
        assert_eq!(
            f.fix_or,
            [["ip netns exec node nft replace rule inet fw pre handle 4 fib saddr oif missing counter drop"]]
        );
    }

    #[test]
    fn no_route_back_at_all() {
        let check = Check::Rpfilter {
            loose: true,
            validmark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let ans = RouteLookup::Failed {
            errno: 101,
            name: "ENETUNREACH".into(),
        };
        let a = attribution(
            Backend::IptablesLegacy,
            "-A PREROUTING -m rpfilter --loose --invert -j DROP",
        );
        let f = explain(nf(), &a, &drop(check, &q, &ans), &tables());
        assert!(f
            .summary
            .contains("(loose) drops it: there is no route back to fd00:61:9::1 (ENETUNREACH)"));
        // Nothing says where the client is: the repair waits in the notes.
        assert!(f.fix.is_empty(), "{:?}", f.fix);
        assert!(
            f.fix_notes[0].ends_with(
                "then `ip netns exec node ip -6 rule add from fd00:61:1::2 to fd00:61:9::1/128 \
                 lookup 101 priority 1`"
            ),
            "{}",
            f.fix_notes[0]
        );
        assert!(f.fix_or.is_empty());
    }

    fn rule6(priority: u32, table: u32) -> Rule {
        Rule {
            family: 10,
            priority,
            table,
            action: FR_ACT_TO_TBL,
            src: None,
            dst: None,
            fwmark: None,
            fwmask: None,
            iifname: None,
            oifname: None,
            invert: false,
            goto: None,
        }
    }

    fn net(s: &str, len: u8) -> Option<(IpAddr, u8)> {
        Some((s.parse().unwrap(), len))
    }

    /// The rule that decided is the first, by priority, whose selectors all
    /// take the lookup ip6t_rpfilter makes: from lo, source the packet's
    /// destination, to its source, its mark with --validmark, the input
    /// device as oif in strict mode (`rpfilter_lookup_reverse6`,
    /// net/ipv6/netfilter/ip6t_rpfilter.c; `fib_rule_match`,
    /// net/core/fib_rules.c; `fib6_rule_match`, net/ipv6/fib6_rules.c, v6.18).
    #[test]
    fn the_deciding_rule_is_the_first_whose_selectors_all_take_the_lookup() {
        let check = Check::Rpfilter {
            loose: false,
            validmark: true,
        };
        let q = check.query(src(), dst(), 3, 0x180);
        let ans = found(100, 2, Some("fe80::1"));
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --validmark --invert -j DROP",
        );
        let mut t = tables();
        // Each of these leads to table 100 but misses on one selector.
        let mut other_iif = rule6(900, 100);
        other_iif.iifname = Some("eth1".into());
        let mut other_oif = rule6(910, 100);
        other_oif.oifname = Some("eth0".into());
        let mut other_mark = rule6(920, 100);
        other_mark.fwmark = Some(0x1);
        let mut other_from = rule6(930, 100);
        other_from.src = net("fd00:9::", 64);
        let mut other_to = rule6(940, 100);
        other_to.dst = net("fd00:99::", 64);
        // This one takes it: 0x180 under mask 0xff is 0x80.
        let mut taken = rule6(1000, 100);
        taken.src = net("fd00:61:1::", 64);
        taken.dst = net("fd00:61:9::", 64);
        taken.fwmark = Some(0x80);
        taken.fwmask = Some(0xff);
        taken.iifname = Some("lo".into());
        t.rules6 = vec![
            rule6(0, 255),
            other_iif,
            other_oif,
            other_mark,
            other_from,
            other_to,
            taken,
            rule6(32766, 254),
        ];
        let mut d = drop(check, &q, &ans);
        d.mark = 0x180;
        let entries = [client_entry()];
        d.sender = Sender {
            mac: Some([2, 0, 0, 0, 0x81, 1]),
            neighbours: Some(&entries),
        };
        let f = explain(nf(), &a, &d, &t);
        assert_eq!(
            f.evidence,
            [
                "kernel drop reason NETFILTER_DROP",
                "reverse lookup as the rule makes it (strict): `ip netns exec node ip -6 route get \
                 fd00:61:9::1 from fd00:61:1::2 oif eth1 mark 0x180` answers default via fe80::1 \
                 dev eth0 table 100",
                "policy rule that decided: 1000: from fd00:61:1::/64 to fd00:61:9::/64 fwmark \
                 0x80/0xff iif lo lookup 100",
                "the check passes only when the way back to fd00:61:9::1 leaves by eth1, where the \
                 packet came in",
                "the packet came from 02:00:00:00:81:01 = fd00:61:9::1 on eth1: the client \
                 itself, on eth1's link",
            ]
        );
        assert_eq!(
            f.fix[1],
            "ip netns exec node ip -6 rule add from fd00:61:1::2 to fd00:61:9::1/128 lookup 101 \
             priority 999"
        );
    }

    #[test]
    fn answers_print_their_prefix_as_ip_route_does() {
        let t = tables();
        let with_dst = |dst: &str, len| {
            let RouteLookup::Found(mut a) = found(100, 2, Some("fe80::1")) else {
                unreachable!()
            };
            a.dst = Some(dst.parse().unwrap());
            a.dst_len = len;
            a
        };
        // A host route without its length, as `ip -6 route` shows it.
        assert_eq!(
            answer_text(&with_dst("fd00:61:9::1", 128), &t),
            "fd00:61:9::1 via fe80::1 dev eth0 table 100"
        );
        assert_eq!(
            answer_text(&with_dst("fd00:61::", 48), &t),
            "fd00:61::/48 via fe80::1 dev eth0 table 100"
        );
    }

    fn route6(
        table: u32,
        dst: Option<(&str, u8)>,
        oif: Option<u32>,
        gw: Option<&str>,
    ) -> crate::model::routing::Route {
        crate::model::routing::Route {
            table,
            family: 10,
            dst: dst.map(|(a, _)| a.parse().unwrap()),
            dst_len: dst.map_or(0, |(_, l)| l),
            kind: RTN_UNICAST,
            scope: 0,
            oif,
            gateway: gw.map(|g| g.parse().unwrap()),
            prefsrc: None,
            priority: 1024,
            nexthops: vec![],
        }
    }

    /// The repair route takes the gateway of the node's own longest unicast
    /// route to the client that can leave by the input device: through a
    /// default route, or the next hop on that device of a multipath one.
    #[test]
    fn the_repair_takes_the_gateway_of_the_nodes_own_way_out_of_the_input_device() {
        let check = Check::Rpfilter {
            loose: false,
            validmark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let ans = found(254, 2, Some("fd00:61:2::1"));
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --invert -j DROP",
        );
        let d = drop(check, &q, &ans);
        let hop = |oif, gw: &str| (oif, Some(gw.parse().unwrap()));
        let eth1_default = route6(7, None, Some(3), Some("fe80::1"));
        let mut multipath_both = route6(254, Some(("fd00:61::", 32)), None, None);
        multipath_both.nexthops = vec![hop(2, "fe80::2"), hop(3, "fe80::3")];
        let mut multipath_eth0 = route6(254, Some(("fd00:61::", 32)), None, None);
        multipath_eth0.nexthops = vec![hop(2, "fe80::2"), hop(2, "fe80::4")];
        // A route that delivers locally (TPROXY-style, in a policy table)
        // sends nothing out, whatever its device.
        let mut local = route6(7, Some(("fd00:61:9::", 64)), Some(3), None);
        local.kind = crate::model::routing::RTN_LOCAL;
        let via_router = route6(7, Some(("fd00:61::", 32)), Some(3), Some("fd00:61:1::fe"));
        for (routes, fix) in [
            (vec![eth1_default.clone()], "via fe80::1 dev eth1"),
            (
                vec![eth1_default.clone(), multipath_both],
                "via fe80::3 dev eth1",
            ),
            (vec![eth1_default, multipath_eth0], "via fe80::1 dev eth1"),
            (vec![via_router, local], "via fd00:61:1::fe dev eth1"),
        ] {
            let mut t = tables();
            t.routes6 = routes;
            assert_eq!(
                explain(nf(), &a, &d, &t).fix[0],
                format!("ip netns exec node ip -6 route add fd00:61:9::1/128 {fix} table 101")
            );
        }
    }

    /// Tables 252-255 are the kernel's compat, default, main and local
    /// (include/uapi/linux/rtnetlink.h): never the repair's own.
    #[test]
    fn the_repair_table_is_never_a_reserved_one() {
        let mut t = tables();
        t.rules6 = (100..252).map(|n| rule6(n, n)).collect();
        assert_eq!(free_table(&t), 256);
    }

    /// A table an IPv4 rule reads, or that holds routes no rule reads yet,
    /// is someone's: the repair's route would join them.
    #[test]
    fn the_repair_table_is_one_nothing_uses() {
        let mut t = tables();
        t.rules6 = vec![rule6(1000, 100)];
        t.rules = vec![crate::diagnosis::routing::tests::rule(1001, 101)];
        t.routes6
            .push(crate::diagnosis::routing::tests::route(102, None, None, 2));
        t.routes
            .push(crate::diagnosis::routing::tests::route(103, None, None, 2));
        assert_eq!(free_table(&t), 104);
    }

    /// ip6t_rpfilter fails a local answer in loose mode too, unless
    /// --accept-local (`rpfilter_lookup_reverse6`,
    /// net/ipv6/netfilter/ip6t_rpfilter.c v6.18: RTF_LOCAL): it is named
    /// as such, and loose mode is not offered.
    #[test]
    fn a_local_way_back_is_named_and_loose_mode_is_not_offered() {
        let check = Check::Rpfilter {
            loose: false,
            validmark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let RouteLookup::Found(mut local) = found(255, 1, None) else {
            unreachable!()
        };
        local.kind = RouteType::Local;
        local.dst = Some(src().into());
        local.dst_len = 128;
        let ans = RouteLookup::Found(local);
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --invert -j DROP",
        );
        let f = explain(nf(), &a, &drop(check, &q, &ans), &tables());
        assert_eq!(
            f.summary,
            "IPv6 reverse-path check failed on eth1: iptables-nft rule in raw/PREROUTING \
             (strict) drops it: the way back to fd00:61:9::1 is a Local route: -A PREROUTING -m \
             rpfilter --invert -j DROP"
        );
        assert_eq!(
            f.evidence[1],
            "reverse lookup as the rule makes it (strict): `ip netns exec node ip -6 route get \
             fd00:61:9::1 from fd00:61:1::2 oif eth1` answers a Local route (fd00:61:9::1 dev lo \
             table local)"
        );
        assert!(f.fix_or.is_empty(), "{:?}", f.fix_or);
    }

    /// A rule of the legacy backend is only seen, and so only replaced, by
    /// ip6tables-legacy.
    #[test]
    fn a_legacy_rule_is_loosened_with_the_legacy_tool() {
        let check = Check::Rpfilter {
            loose: false,
            validmark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let ans = found(254, 2, Some("fd00:61:2::1"));
        let a = attribution(
            Backend::IptablesLegacy,
            "-A PREROUTING -m rpfilter --invert -j DROP",
        );
        let f = explain(nf(), &a, &drop(check, &q, &ans), &tables());
        assert_eq!(
            f.fix_or,
            [[
                "ip netns exec node ip6tables-legacy -t raw -R PREROUTING 1 -m rpfilter --loose \
               --invert -j DROP"
            ]]
        );
    }

    /// A gateway is only one to use on the input device's link: an answer
    /// to the query through that device that leaves by another one gives
    /// none. Nothing else says where the client is: no on-link route is
    /// offered as a fix, the notes give both shapes.
    #[test]
    fn a_gateway_on_another_device_is_not_taken_for_the_repair() {
        let check = Check::Fib {
            iif: true,
            mark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let ans = found(254, 2, Some("fd00:61:2::1"));
        let elsewhere = found(254, 2, Some("fe80::9"));
        let a = attribution(
            Backend::Nftables,
            "fib saddr . iif oif missing counter drop",
        );
        let mut d = drop(check, &q, &ans);
        d.via_iif = Some(&elsewhere);
        let f = explain(nf(), &a, &d, &tables());
        assert!(f.fix.is_empty(), "{:?}", f.fix);
        assert_eq!(
            f.fix_notes[0],
            "the policy route sends the way back to fd00:61:9::1 (the rule's lookup, and the \
             replies from fd00:61:1::2) out of eth1, where the client's packets come in; kdrop \
             could not see the next hop (evidence above): behind a router on eth1, `ip netns \
             exec node ip -6 route add fd00:61:9::1/128 via <router> dev eth1 table 101` with \
             the router the client's packets come from (`ip netns exec node ip -6 neigh show \
             dev eth1`); only if the client is on eth1's link, `ip netns exec node ip -6 route \
             add fd00:61:9::1/128 dev eth1 table 101`; then `ip netns exec node ip -6 rule add \
             from fd00:61:1::2 to fd00:61:9::1/128 lookup 101 priority 32765`"
        );
        // The loose rule stays the other repair.
        assert_eq!(f.fix_or.len(), 1);
    }

    /// The SYN came from a router on eth1: the repair goes through the
    /// router's address as the neighbour table has it, even where the
    /// node's own routes through eth1 would say otherwise.
    #[test]
    fn the_router_the_packet_came_from_is_the_repairs_gateway() {
        let check = Check::Rpfilter {
            loose: false,
            validmark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let ans = found(254, 2, Some("fd00:61:2::1"));
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --invert -j DROP",
        );
        let router = Neighbour {
            dst: "fe80::fe".parse().unwrap(),
            lladdr: Some("02:00:00:00:81:fe".into()),
            ..client_entry()
        };
        let entries = [client_entry(), router];
        let mut d = drop(check, &q, &ans);
        d.sender = Sender {
            mac: Some([2, 0, 0, 0, 0x81, 0xfe]),
            neighbours: Some(&entries),
        };
        let mut t = tables();
        t.routes6 = vec![route6(7, None, Some(3), Some("fe80::1"))];
        let f = explain(nf(), &a, &d, &t);
        assert_eq!(
            f.fix[0],
            "ip netns exec node ip -6 route add fd00:61:9::1/128 via fe80::fe dev eth1 table 101"
        );
        assert_eq!(
            f.evidence.last().unwrap(),
            "the packet came from 02:00:00:00:81:fe = fe80::fe on eth1 (STALE), a router: the \
             client is not on eth1's link"
        );
    }

    /// With no route back at all loose mode fails too (`rpfilter_mt`,
    /// net/ipv6/netfilter/ip6t_rpfilter.c v6.18): only the route is offered.
    #[test]
    fn no_route_back_in_strict_mode_offers_no_loose_mode() {
        let check = Check::Rpfilter {
            loose: false,
            validmark: false,
        };
        let q = check.query(src(), dst(), 3, 0);
        let ans = RouteLookup::Failed {
            errno: 101,
            name: "ENETUNREACH".into(),
        };
        let a = attribution(
            Backend::IptablesNft,
            "-A PREROUTING -m rpfilter --invert -j DROP",
        );
        let f = explain(nf(), &a, &drop(check, &q, &ans), &tables());
        assert!(f.fix_or.is_empty(), "{:?}", f.fix_or);
        assert!(f.fix.is_empty(), "{:?}", f.fix);
        assert_eq!(f.fix_notes.len(), 1);
        assert!(
            f.fix_notes[0].contains("kdrop could not see the next hop"),
            "{}",
            f.fix_notes[0]
        );
    }
}
