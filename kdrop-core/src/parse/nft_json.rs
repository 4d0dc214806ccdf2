//! `nft -j list ruleset` (libnftables JSON, schema version 1) into
//! [`Table`]s; their rule text is rendered from the same JSON (nft_render).
use std::{collections::HashMap, net::IpAddr};

use serde_json::Value;

use super::{
    iptables_save::proto_number,
    nft_render::{quote, render_expr, render_match},
};
use crate::model::netfilter::{
    priority_of, Backend, BaseChain, Chain, CtState, Dir, Family, Hook, Match, Policy, Rule, Table,
    Verdict, PROTO_TCP,
};

pub const SOURCE: &str = "nft -j list ruleset";

/// Parses the whole ruleset. Objects kdrop does not use (maps, flowtables,
/// ...) are skipped; a rule for an unknown chain is an error.
pub fn parse_ruleset(json: &str) -> Result<Vec<Table>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("{SOURCE}: {e}"))?;
    let items = v
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{SOURCE}: no \"nftables\" array"))?;
    let mut tables: Vec<Table> = Vec::new();
    let mut sets: HashMap<(String, String, String), Vec<Value>> = HashMap::new();
    for item in items {
        if let Some(s) = item.get("set").or_else(|| item.get("map")) {
            let key = (
                str_of(s, "family").to_string(),
                str_of(s, "table").to_string(),
                str_of(s, "name").to_string(),
            );
            let elems = s
                .get("elem")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            sets.insert(key, elems);
        }
    }
    for item in items {
        if let Some(t) = item.get("table") {
            let Some(family) = Family::parse(str_of(t, "family")) else {
                continue;
            };
            tables.push(Table {
                backend: Backend::Nftables,
                family,
                name: str_of(t, "name").to_string(),
                chains: Vec::new(),
                source: SOURCE.to_string(),
            });
        } else if let Some(c) = item.get("chain") {
            let Some(table) = find_table(&mut tables, c) else {
                continue;
            };
            let base = Hook::parse(str_of(c, "hook")).and_then(|hook| {
                let prio = match c.get("prio") {
                    Some(Value::Number(n)) => n.as_i64().map(|n| n as i32),
                    Some(Value::String(s)) => priority_of(table.family, s),
                    _ => None,
                }?;
                Some(BaseChain {
                    hook,
                    priority: prio,
                    policy: if str_of(c, "policy") == "drop" {
                        Policy::Drop
                    } else {
                        Policy::Accept
                    },
                    policy_packets: None,
                })
            });
            table.chains.push(Chain {
                name: str_of(c, "name").to_string(),
                base,
                rules: Vec::new(),
            });
        } else if let Some(r) = item.get("rule") {
            let family = str_of(r, "family").to_string();
            let tname = str_of(r, "table").to_string();
            let Some(table) = find_table(&mut tables, r) else {
                continue;
            };
            let lookup = |name: &str| sets.get(&(family.clone(), tname.clone(), name.to_string()));
            let rule = parse_rule(r, &lookup);
            let cname = str_of(r, "chain");
            let chain = table
                .chains
                .iter_mut()
                .find(|c| c.name == cname)
                .ok_or_else(|| format!("{SOURCE}: rule for unknown chain {cname}"))?;
            chain.rules.push(rule);
        }
    }
    Ok(tables)
}

pub(super) fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn find_table<'a>(tables: &'a mut [Table], obj: &Value) -> Option<&'a mut Table> {
    let family = Family::parse(str_of(obj, "family"))?;
    let name = str_of(obj, "table");
    tables
        .iter_mut()
        .find(|t| t.family == family && t.name == name)
}

/// An iptables-nft table (`ip filter` with chains named `INPUT`, ...) whose
/// own tool reports it better: rule specs as `iptables -S` writes them and
/// chain policy counters, which `nft -j` lacks.
pub fn looks_like_xtables(t: &Table) -> bool {
    matches!(t.family, Family::Ip | Family::Ip6)
        && ["filter", "nat", "mangle", "raw", "security"].contains(&t.name.as_str())
        && t.chains
            .iter()
            .filter_map(|c| c.base.as_ref().map(|b| (c, b)))
            .all(|(c, b)| c.name == b.hook.name())
}

type SetLookup<'a> = dyn Fn(&str) -> Option<&'a Vec<Value>> + 'a;

fn parse_rule(r: &Value, sets: &SetLookup<'_>) -> Rule {
    let exprs = r
        .get("expr")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut matches = Vec::new();
    let mut verdict = Verdict::Continue;
    let mut target = String::new();
    let mut packets = None;
    let mut counted_matches = 0;
    let mut words = Vec::new();
    for e in &exprs {
        words.push(render_expr(e));
        let Some((key, body)) = e.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        match key.as_str() {
            "match" => matches.extend(match_of(body, sets)),
            "counter" => {
                if let Some(p) = body.get("packets").and_then(Value::as_u64) {
                    packets = Some(p);
                    counted_matches = matches.len();
                }
            }
            "accept" | "drop" | "reject" | "return" | "jump" | "goto" | "queue" => {
                verdict = match key.as_str() {
                    "accept" => Verdict::Accept,
                    "drop" => Verdict::Drop,
                    "reject" => Verdict::Reject,
                    "return" => Verdict::Return,
                    "queue" => Verdict::Terminal,
                    k => {
                        let t = str_of(body, "target").to_string();
                        if k == "jump" {
                            Verdict::Jump(t)
                        } else {
                            Verdict::Goto(t)
                        }
                    }
                };
                target = render_expr(e);
            }
            "snat" | "dnat" | "masquerade" | "redirect" | "tproxy" | "synproxy" => {
                verdict = Verdict::Terminal;
                target = render_expr(e);
            }
            "vmap" => {
                let (may_drop, chains) = vmap_verdicts(body, sets);
                if may_drop || !chains.is_empty() {
                    verdict = Verdict::Map { may_drop, chains };
                    target = render_expr(e);
                }
            }
            "xt" => {
                let name = str_of(body, "name");
                if str_of(body, "type") == "target" {
                    verdict = match name {
                        "REJECT" => Verdict::Reject,
                        "DROP" => Verdict::Drop,
                        _ => Verdict::Continue,
                    };
                    target = name.to_string();
                } else {
                    matches.push(Match::Unknown(format!("xt match {name}")));
                }
            }
            // Statements that only match some packets.
            "limit" | "quota" | "meter" | "set" | "connlimit" | "numgen" => {
                matches.push(Match::Unknown(render_expr(e)));
            }
            _ => {}
        }
    }
    let mut text = words.join(" ");
    if let Some(c) = r.get("comment").and_then(Value::as_str) {
        text.push_str(&format!(" comment {}", quote(c)));
    }
    if packets.is_none() {
        counted_matches = 0;
    }
    Rule {
        text,
        handle: r.get("handle").and_then(Value::as_u64),
        matches,
        verdict,
        target,
        packets,
        counted_matches,
    }
}

/// Verdicts of a verdict map: does one drop, which chains does it jump to.
fn vmap_verdicts(body: &Value, sets: &SetLookup<'_>) -> (bool, Vec<String>) {
    let data = body.get("data");
    let elems: Vec<Value> = match data {
        Some(Value::String(s)) => match s.strip_prefix('@').and_then(sets) {
            Some(v) => v.clone(),
            // Unknown map: it may drop.
            None => return (true, Vec::new()),
        },
        Some(d) => d
            .get("set")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let mut may_drop = false;
    let mut chains = Vec::new();
    for el in &elems {
        // [key, verdict] pairs.
        let Some(v) = el.as_array().and_then(|a| a.get(1)) else {
            continue;
        };
        if v.get("drop").is_some() || v.get("reject").is_some() {
            may_drop = true;
        }
        for k in ["jump", "goto"] {
            if let Some(t) = v
                .get(k)
                .and_then(|j| j.get("target"))
                .and_then(Value::as_str)
            {
                chains.push(t.to_string());
            }
        }
    }
    (may_drop, chains)
}

/// The matches one `match` expression stands for; `Unknown` for what kdrop
/// does not evaluate.
fn match_of(body: &Value, sets: &SetLookup<'_>) -> Vec<Match> {
    let op = body.get("op").and_then(Value::as_str).unwrap_or("==");
    let (Some(left), Some(right)) = (body.get("left"), body.get("right")) else {
        return vec![Match::Unknown(body.to_string())];
    };
    // `@name` → the named set's elements.
    let resolved;
    let right = match right.as_str().and_then(|s| s.strip_prefix('@')) {
        Some(name) => match sets(name) {
            Some(elems) => {
                resolved = serde_json::json!({ "set": elems });
                &resolved
            }
            None => return vec![unknown(body)],
        },
        None => right,
    };
    match_parts(op, left, right).unwrap_or_else(|| vec![unknown(body)])
}

fn unknown(body: &Value) -> Match {
    Match::Unknown(render_match(body))
}

fn match_parts(op: &str, left: &Value, right: &Value) -> Option<Vec<Match>> {
    let neg = match op {
        "==" | "in" => false,
        "!=" => true,
        "<" | ">" | "<=" | ">=" => false,
        _ => return None,
    };
    if let Some(p) = left.get("payload") {
        let proto = str_of(p, "protocol");
        let field = str_of(p, "field");
        return match (proto, field) {
            ("tcp" | "udp" | "sctp" | "udplite" | "dccp" | "th", "dport" | "sport") => {
                let l4 = match proto {
                    "tcp" | "th" => PROTO_TCP,
                    other => proto_number(other).unwrap_or(0),
                };
                Some(vec![Match::Port {
                    dir: if field == "dport" { Dir::Dst } else { Dir::Src },
                    neg,
                    proto: l4,
                    ranges: port_ranges(op, right)?,
                }])
            }
            ("ip" | "ip6", "saddr" | "daddr") => {
                let dir = if field == "saddr" { Dir::Src } else { Dir::Dst };
                Some(vec![
                    Match::L3 { v6: proto == "ip6" },
                    addr_match(dir, neg, right)?,
                ])
            }
            ("ip", "protocol") | ("ip6", "nexthdr") => Some(vec![
                Match::L3 { v6: proto == "ip6" },
                proto_match(neg, right)?,
            ]),
            ("tcp", "flags") => Some(vec![flags_match(op, None, right)?]),
            _ => None,
        };
    }
    if let Some(m) = left.get("meta") {
        let key = str_of(m, "key");
        return match key {
            "l4proto" => Some(vec![proto_match(neg, right)?]),
            "iifname" | "oifname" | "iif" | "oif" => {
                let name = right.as_str()?.to_string();
                Some(vec![Match::Iface {
                    input: key.starts_with('i'),
                    neg,
                    name,
                }])
            }
            "mark" => Some(vec![Match::Mark {
                neg,
                value: u32_of(right)?,
                mask: u32::MAX,
            }]),
            "nfproto" | "protocol" => {
                let v6 = match right.as_str()? {
                    "ipv4" | "ip" => false,
                    "ipv6" | "ip6" => true,
                    _ => return None,
                };
                // `meta nfproto != ipv4`: the other family.
                Some(vec![Match::L3 { v6: v6 != neg }])
            }
            _ => None,
        };
    }
    if let Some(c) = left.get("ct") {
        if str_of(c, "key") != "state" {
            return None;
        }
        let states = words_of(right)?
            .iter()
            .map(|s| CtState::parse(s))
            .collect::<Option<Vec<_>>>()?;
        return Some(vec![Match::CtState { neg, states }]);
    }
    if let Some(and) = left.get("&").and_then(Value::as_array) {
        let inner = and.first()?;
        let mask = and.get(1)?;
        if inner
            .get("payload")
            .is_some_and(|p| str_of(p, "field") == "flags")
        {
            return Some(vec![flags_match(op, Some(mask), right)?]);
        }
        if inner
            .get("meta")
            .is_some_and(|m| str_of(m, "key") == "mark")
        {
            return Some(vec![Match::Mark {
                neg,
                value: u32_of(right)?,
                mask: u32_of(mask)?,
            }]);
        }
    }
    None
}

fn u32_of(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => match s.strip_prefix("0x") {
            Some(h) => u32::from_str_radix(h, 16).ok(),
            None => s.parse().ok(),
        },
        _ => None,
    }
}

/// A single word, a list, or an anonymous set of words (`ct state`, flags).
fn words_of(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::String(s) => Some(vec![s.clone()]),
        Value::Array(a) => a.iter().map(|x| x.as_str().map(String::from)).collect(),
        Value::Object(_) => words_of(v.get("set")?),
        _ => None,
    }
}

fn proto_match(neg: bool, right: &Value) -> Option<Match> {
    let protos: Vec<u8> = match right {
        Value::Number(n) => vec![u8::try_from(n.as_u64()?).ok()?],
        Value::String(s) => vec![proto_number(s)?],
        Value::Object(_) => right
            .get("set")?
            .as_array()?
            .iter()
            .map(|x| match x {
                Value::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
                Value::String(s) => proto_number(s),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?,
        _ => return None,
    };
    // Only TCP is evaluated: a set holding it is as good as `tcp`.
    let proto = if protos.contains(&PROTO_TCP) {
        PROTO_TCP
    } else {
        protos.first().copied().unwrap_or(0)
    };
    Some(Match::Proto { neg, proto })
}

fn flags_match(op: &str, mask: Option<&Value>, right: &Value) -> Option<Match> {
    let value = flag_bits(right)?;
    let (mask, any) = match (mask, op) {
        (Some(m), _) => (flag_bits(m)?, false),
        // `tcp flags syn` (op "in"): that bit is set.
        (None, "in") => (value, true),
        (None, _) => (0xff, false),
    };
    let (neg, any) = match (op, any) {
        ("!=", a) => (true, a),
        (_, a) => (false, a),
    };
    Some(Match::TcpFlags {
        neg,
        mask,
        value,
        any,
    })
}

fn flag_bits(v: &Value) -> Option<u8> {
    use kdrop_common::{TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, TCP_URG};
    if let Some(n) = v.as_u64() {
        return u8::try_from(n).ok();
    }
    words_of(v)?.iter().try_fold(0u8, |acc, f| {
        Some(
            acc | match f.as_str() {
                "fin" => TCP_FIN,
                "syn" => TCP_SYN,
                "rst" => TCP_RST,
                "psh" => TCP_PSH,
                "ack" => TCP_ACK,
                "urg" => TCP_URG,
                "ecn" => TCP_ECE,
                "cwr" => TCP_CWR,
                _ => return None,
            },
        )
    })
}

/// Ports from `80`, `{"range": [a, b]}`, `{"set": [...]}`, and comparisons.
fn port_ranges(op: &str, right: &Value) -> Option<Vec<(u16, u16)>> {
    let one = |v: &Value| -> Option<(u16, u16)> {
        if let Some(r) = v.get("range").and_then(Value::as_array) {
            return Some((port_of(r.first()?)?, port_of(r.get(1)?)?));
        }
        let p = port_of(v)?;
        Some((p, p))
    };
    if let Some(set) = right.get("set").and_then(Value::as_array) {
        return set.iter().map(one).collect();
    }
    let (lo, hi) = one(right)?;
    Some(vec![match op {
        "<" => (0, lo.checked_sub(1)?),
        "<=" => (0, lo),
        ">" => (lo.checked_add(1)?, u16::MAX),
        ">=" => (lo, u16::MAX),
        _ => (lo, hi),
    }])
}

fn port_of(v: &Value) -> Option<u16> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        Value::Object(_) => port_of(v.get("elem")?.get("val")?),
        _ => None,
    }
}

fn addr_match(dir: Dir, neg: bool, right: &Value) -> Option<Match> {
    if let Some(set) = right.get("set").and_then(Value::as_array) {
        let nets = set.iter().map(net_of).collect::<Option<Vec<_>>>()?;
        return Some(Match::AddrSet { dir, neg, nets });
    }
    if let Some(r) = right.get("range").and_then(Value::as_array) {
        return Some(Match::AddrRange {
            dir,
            neg,
            lo: r.first()?.as_str()?.parse().ok()?,
            hi: r.get(1)?.as_str()?.parse().ok()?,
        });
    }
    let (net, len) = net_of(right)?;
    Some(Match::Addr { dir, neg, net, len })
}

/// `"10.0.0.1"`, `{"prefix": {"addr", "len"}}`, a set element wrapping one.
fn net_of(v: &Value) -> Option<(IpAddr, u8)> {
    if let Some(p) = v.get("prefix") {
        let a: IpAddr = p.get("addr")?.as_str()?.parse().ok()?;
        return Some((a, u8::try_from(p.get("len")?.as_u64()?).ok()?));
    }
    if let Some(e) = v.get("elem") {
        return net_of(e.get("val")?);
    }
    let a: IpAddr = v.as_str()?.parse().ok()?;
    Some((a, if a.is_ipv4() { 32 } else { 128 }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnosis::netfilter::matching::{eval_all, tests::syn, Tri, TCP_ACK, TCP_SYN};

    /// `nft -j list ruleset` from nftables 1.0.6 for:
    /// table inet kdt { set allow { type ipv4_addr; elements = { 10.9.0.1 } }
    ///   chain input { type filter hook input priority filter; policy drop;
    ///     ct state established,related accept
    ///     iifname "lo" accept
    ///     ip saddr @allow tcp dport 22 counter accept
    ///     tcp dport { 80, 8000-8080 } counter reject with tcp reset
    ///     ip6 daddr fd00::/64 tcp dport 5510 drop comment "v6 block"
    ///     tcp flags syn / fin,syn,rst,ack counter jump sub
    ///     meta l4proto tcp limit rate 10/second counter accept } ... }
    const RULESET: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
 {"table": {"family": "inet", "name": "kdt", "handle": 7}},
 {"chain": {"family": "inet", "table": "kdt", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
 {"chain": {"family": "inet", "table": "kdt", "name": "sub", "handle": 2}},
 {"set": {"family": "inet", "name": "allow", "table": "kdt", "type": "ipv4_addr", "handle": 3, "elem": ["10.9.0.1"]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 4, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 5, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}, {"accept": null}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 6, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@allow"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}}, {"counter": {"packets": 3, "bytes": 180}}, {"accept": null}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 8, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": {"set": [80, {"range": [8000, 8080]}]}}}, {"counter": {"packets": 2, "bytes": 120}}, {"reject": {"type": "tcp reset"}}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 9, "comment": "v6 block", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": {"prefix": {"addr": "fd00::", "len": 64}}}}, {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 5510}}, {"drop": null}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 10, "expr": [{"match": {"op": "==", "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["fin", "syn", "rst", "ack"]]}, "right": "syn"}}, {"counter": {"packets": 5, "bytes": 300}}, {"jump": {"target": "sub"}}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "input", "handle": 11, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"limit": {"rate": 10, "burst": 5, "per": "second"}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},
 {"rule": {"family": "inet", "table": "kdt", "chain": "sub", "handle": 12, "expr": [{"counter": {"packets": 5, "bytes": 300}}, {"match": {"op": "!=", "left": {"payload": {"protocol": "tcp", "field": "sport"}}, "right": {"range": [1024, 65535]}}}, {"drop": null}]}},
 {"table": {"family": "ip", "name": "filter", "handle": 8}},
 {"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
 {"chain": {"family": "ip", "table": "filter", "name": "KUBE", "handle": 2}},
 {"table": {"family": "ip", "name": "nat", "handle": 9}},
 {"chain": {"family": "ip", "table": "nat", "name": "weird", "handle": 1, "type": "nat", "hook": "prerouting", "prio": "dstnat", "policy": "accept"}},
 {"table": {"family": "netdev", "name": "nd", "handle": 10}},
 {"chain": {"family": "netdev", "table": "nd", "name": "ing", "handle": 1, "type": "filter", "hook": "ingress", "dev": "eth0", "prio": 0, "policy": "accept"}}
]}"#;

    fn tables() -> Vec<Table> {
        parse_ruleset(RULESET).unwrap()
    }

    fn rule(t: &[Table], handle: u64) -> Rule {
        t.iter()
            .flat_map(|t| &t.chains)
            .flat_map(|c| &c.rules)
            .find(|r| r.handle == Some(handle))
            .unwrap()
            .clone()
    }

    #[test]
    fn tables_and_chains() {
        let t = tables();
        assert_eq!(t.len(), 4);
        assert_eq!((t[0].family, t[0].name.as_str()), (Family::Inet, "kdt"));
        let input = t[0].chain("input").unwrap();
        let base = input.base.as_ref().unwrap();
        assert_eq!(
            (base.hook, base.priority, base.policy, base.policy_packets),
            (Hook::Input, 0, Policy::Drop, None)
        );
        assert!(t[0].chain("sub").unwrap().base.is_none());
        assert_eq!(input.rules.len(), 7);
        // The ingress chain is not one of the five hooks kdrop walks.
        assert!(t[3].chains[0].base.is_none());
        assert_eq!(
            t[2].chains[0].base.as_ref().unwrap().priority,
            -100,
            "named priority"
        );
    }

    #[test]
    fn xtables_lookalikes() {
        let t = tables();
        assert!(!looks_like_xtables(&t[0]));
        assert!(looks_like_xtables(&t[1]));
        assert!(!looks_like_xtables(&t[2]), "nat with a chain named weird");
        assert!(!looks_like_xtables(&t[3]));
    }

    #[test]
    fn rule_text() {
        let t = tables();
        assert_eq!(rule(&t, 4).text, "ct state established,related accept");
        assert_eq!(rule(&t, 5).text, "iifname \"lo\" accept");
        assert_eq!(
            rule(&t, 6).text,
            "ip saddr @allow tcp dport 22 counter accept"
        );
        assert_eq!(
            rule(&t, 8).text,
            "tcp dport { 80, 8000-8080 } counter reject with tcp reset"
        );
        assert_eq!(
            rule(&t, 9).text,
            "ip6 daddr fd00::/64 tcp dport 5510 drop comment \"v6 block\""
        );
        assert_eq!(
            rule(&t, 10).text,
            "tcp flags & (fin|syn|rst|ack) == syn counter jump sub"
        );
        assert_eq!(rule(&t, 8).target, "reject with tcp reset");
        assert_eq!(rule(&t, 12).text, "counter tcp sport != 1024-65535 drop");
    }

    #[test]
    fn verdicts_and_counters() {
        let t = tables();
        let r = rule(&t, 8);
        assert_eq!(r.verdict, Verdict::Reject);
        assert_eq!(
            (r.packets, r.counted_matches, r.matches.len()),
            (Some(2), 1, 1)
        );
        let r = rule(&t, 9);
        assert_eq!((r.verdict, r.packets), (Verdict::Drop, None));
        assert_eq!(rule(&t, 10).verdict, Verdict::Jump("sub".into()));
        // A counter in front of the match counts every packet reaching it.
        let r = rule(&t, 12);
        assert_eq!(
            (r.packets, r.counted_matches, r.matches.len()),
            (Some(5), 0, 1)
        );
        let r = rule(&t, 11);
        assert_eq!(r.counted_matches, 2, "limit counts as a match");
    }

    #[test]
    fn matches_evaluate() {
        let t = tables();
        let p = syn("10.9.0.1", 40000, "10.9.0.2", 22);
        let e = |h, p: &crate::diagnosis::netfilter::Packet| eval_all(&rule(&t, h).matches, p);
        assert_eq!(e(4, &p), Tri::No, "a SYN is never established");
        let mut lo = p.clone();
        lo.iif = Some("lo".into());
        assert_eq!(e(5, &lo), Tri::Yes);
        assert_eq!(e(5, &p), Tri::No);
        assert_eq!(e(6, &p), Tri::Yes, "named set resolved");
        assert_eq!(e(6, &syn("10.9.0.3", 40000, "10.9.0.2", 22)), Tri::No);
        assert_eq!(e(8, &syn("10.9.0.1", 1, "10.9.0.2", 8001)), Tri::Yes);
        assert_eq!(e(8, &p), Tri::No);
        assert_eq!(e(9, &syn("fd00::1", 1, "fd00::2", 5510)), Tri::Yes);
        assert_eq!(e(9, &syn("10.0.0.1", 1, "10.0.0.2", 5510)), Tri::No);
        assert_eq!(e(10, &p), Tri::Yes);
        let mut synack = p.clone();
        synack.tcp_flags = TCP_SYN | TCP_ACK;
        assert_eq!(e(10, &synack), Tri::No);
        assert_eq!(e(11, &p), Tri::Maybe);
        assert_eq!(e(12, &p), Tri::No);
        assert_eq!(e(12, &syn("10.9.0.1", 53, "10.9.0.2", 22)), Tri::Yes);
    }

    #[test]
    fn more_match_shapes() {
        let parse = |m: &str| {
            let v: Value = serde_json::from_str(m).unwrap();
            match_of(&v, &|_| None)
        };
        let p = syn("10.0.0.1", 40000, "10.0.0.2", 80);
        let e = |m: &str| eval_all(&parse(m), &p);
        assert_eq!(
            e(
                r#"{"op": "<", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 1024}"#
            ),
            Tri::Yes
        );
        assert_eq!(
            e(
                r#"{"op": ">=", "left": {"payload": {"protocol": "th", "field": "dport"}}, "right": 81}"#
            ),
            Tri::No
        );
        assert_eq!(
            e(
                r#"{"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 80}"#
            ),
            Tri::No
        );
        assert_eq!(
            e(
                r#"{"op": "in", "left": {"payload": {"protocol": "tcp", "field": "flags"}}, "right": "syn"}"#
            ),
            Tri::Yes
        );
        assert_eq!(
            e(r#"{"op": "==", "left": {"&": [{"meta": {"key": "mark"}}, 255]}, "right": 0}"#),
            Tri::Yes
        );
        assert_eq!(
            e(r#"{"op": "!=", "left": {"meta": {"key": "nfproto"}}, "right": "ipv4"}"#),
            Tri::No
        );
        assert_eq!(
            e(r#"{"op": "==", "left": {"ip": {"key": "x"}}, "right": 1}"#),
            Tri::Maybe
        );
        assert_eq!(
            e(
                r#"{"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@nope"}"#
            ),
            Tri::Maybe
        );
        assert_eq!(
            e(
                r#"{"op": "==", "left": {"payload": {"protocol": "ip", "field": "protocol"}}, "right": {"set": ["udp", "tcp"]}}"#
            ),
            Tri::Yes
        );
        assert_eq!(
            e(
                r#"{"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"range": ["10.0.0.1", "10.0.0.9"]}}"#
            ),
            Tri::Yes
        );
    }

    #[test]
    fn vmaps() {
        let v: Value = serde_json::from_str(
            r#"{"key": {"payload": {"protocol": "tcp", "field": "dport"}}, "data": {"set": [[80, {"accept": null}], [81, {"drop": null}], [82, {"jump": {"target": "svc"}}]]}}"#,
        )
        .unwrap();
        assert_eq!(
            vmap_verdicts(&v, &|_| None),
            (true, vec!["svc".to_string()])
        );
        let named: Value = serde_json::from_str(r#"{"key": 1, "data": "@m"}"#).unwrap();
        assert_eq!(vmap_verdicts(&named, &|_| None), (true, vec![]));
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(parse_ruleset("not json").is_err());
        assert!(parse_ruleset("{}").is_err());
        assert!(parse_ruleset(r#"{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"rule": {"family": "ip", "table": "t", "chain": "nope", "expr": []}}]}"#).is_err());
        assert_eq!(parse_ruleset(r#"{"nftables": []}"#).unwrap(), vec![]);
    }
}
