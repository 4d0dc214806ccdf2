//! Conntrack's own drops, named from the statistics that moved around them
//! and the entry the packet carried: a NAT port clash at confirmation
//! (`conntrack_insert_failed`) or a full table (`conntrack_table_full`).
//! Pure: counters, the packet's entry and the namespace's NAT rules in, a
//! finding out.
//!
//! Both reach kdrop as `NETFILTER_DROP` at `nf_hook_slow` (the conntrack
//! hook returned NF_DROP, nf_hook_slow frees with that reason:
//! https://github.com/torvalds/linux/blob/v6.18/net/netfilter/core.c), so
//! the reason and location cannot tell them apart; the counters can
//! (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_core.c):
//! - `__nf_conntrack_confirm` finds the new entry's original or reply
//!   tuple already in the table and `nf_ct_resolve_clash` cannot merge it
//!   (TCP never can: no `allow_clash`): `insert_failed` and `drop` +1. The
//!   packet still carries the unconfirmed entry, NAT already applied.
//! - the same function with a hash chain too long: `chaintoolong` and
//!   `insert_failed` +1, no `drop`.
//! - `nf_conntrack_in` when `__nf_conntrack_alloc` finds the namespace's
//!   count above `nf_conntrack_max` and `early_drop` can evict nothing
//!   (it only evicts entries that are not ASSURED): `drop` +1, no entry on
//!   the packet.
use super::{
    fix_kinds::Kind,
    handshake::{findings::ct_text, CtBits},
    netfilter::describe::stats_moved,
};
use crate::model::cause::Cause;
use crate::model::{
    finding::Finding,
    netfilter::{Backend, ConntrackMoved, Family, Table},
    packet::Ct,
};

/// A SNAT or MASQUERADE rule of the namespace, for the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatRule {
    pub backend: Backend,
    pub family: Family,
    pub table: String,
    pub chain: String,
    /// 1-based, as `--line-numbers`.
    pub number: usize,
    pub handle: Option<u64>,
    /// As `iptables -S` writes it, or nftables rule text.
    pub text: String,
    /// `SNAT --to-source 10.0.0.1:40000`, `MASQUERADE`, `snat`, ...
    pub target: String,
}

/// The SNAT / MASQUERADE rules in `tables`, in order.
pub fn nat_rules(tables: &[Table]) -> Vec<NatRule> {
    let mut out = Vec::new();
    for t in tables {
        for c in &t.chains {
            for (i, r) in c.rules.iter().enumerate() {
                let is_snat = match t.backend {
                    Backend::Nftables => r.text.contains("snat ") || r.text.contains("masquerade"),
                    _ => r.target.starts_with("SNAT") || r.target.starts_with("MASQUERADE"),
                };
                if is_snat {
                    out.push(NatRule {
                        backend: t.backend,
                        family: t.family,
                        table: t.name.clone(),
                        chain: c.name.clone(),
                        number: i + 1,
                        handle: r.handle,
                        text: r.text.clone(),
                        target: r.target.clone(),
                    });
                }
            }
        }
    }
    out
}

/// What the drop needs: the counters, the packet's entry, where it died.
#[derive(Clone, Debug)]
pub struct CtDrop<'a> {
    pub moved: &'a ConntrackMoved,
    pub ct: Option<&'a Ct>,
    pub bits: &'a CtBits,
    /// Status bit names of `ct`.
    pub status: &'a [String],
    pub nat_rules: &'a [NatRule],
    /// `kernel drop reason NETFILTER_DROP at nf_hook_slow+0x..`.
    pub kernel: String,
    /// `ip netns exec <name> ` or empty.
    pub netns_exec: &'a str,
    /// The namespace as it is named in text.
    pub netns: &'a str,
    /// The entry that holds the clashing reply tuple, as `conntrack -L`
    /// shows it, if it could be looked up.
    pub holder: Option<String>,
}

/// A table counts as full from this fill on: the count is read after the
/// drop, when entries may already have expired.
const FULL_PERCENT: u64 = 95;

/// `conntrack_insert_failed` or `conntrack_table_full`; `None` when the
/// counters say neither (the generic `conntrack_drop` then applies).
pub fn explain(d: &CtDrop) -> Option<Finding> {
    let (b, a) = (&d.moved.before, &d.moved.after);
    let insert_failed = a.insert_failed > b.insert_failed;
    let chain = a.chaintoolong > b.chaintoolong;
    let dropped = a.drop > b.drop;
    let full = match (a.count, a.max) {
        (Some(count), Some(max)) if max > 0 => count * 100 >= max * FULL_PERCENT,
        _ => false,
    };
    let stats = format!("conntrack statistics: {}", stats_moved(b, a));
    if insert_failed && chain && !dropped {
        return Some(chain_too_long(d, stats));
    }
    if insert_failed {
        return Some(insert_failed_finding(d, stats));
    }
    if dropped && d.ct.is_none() && (full || a.early_drop > b.early_drop) {
        return Some(table_full(d, stats));
    }
    None
}

fn fill(d: &CtDrop) -> String {
    let a = &d.moved.after;
    match (a.count, a.max) {
        (Some(c), Some(m)) => format!("{c} entries of nf_conntrack_max {m}"),
        _ => "fill unknown".into(),
    }
}

/// A packet's entry that could not be confirmed, and what NAT did to it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Clash<'a> {
    ct: &'a Ct,
    snat: bool,
    dnat: bool,
    /// The SNAT rule that gave it its source, when it was SNAT'd.
    rule: Option<&'a NatRule>,
}

impl<'a> Clash<'a> {
    fn of(d: &CtDrop<'a>, ct: &'a Ct) -> Self {
        let snat = ct.status & d.bits.src_nat != 0;
        // As the packet left NAT: the reply tuple turned around.
        let out_src = ct.reply.dst;
        Clash {
            ct,
            snat,
            dnat: ct.status & d.bits.dst_nat != 0,
            rule: snat
                .then(|| pick_snat_rule(d.nat_rules, out_src.ip()))
                .flatten(),
        }
    }
}

fn insert_failed_finding(d: &CtDrop, stats: String) -> Finding {
    let mut f = Finding {
        cause: Cause::ConntrackInsertFailed,
        summary: "conntrack could not insert the packet's entry (insert_failed): its tuple \
                 clashes with an existing connection"
            .into(),
        evidence: vec![d.kernel.clone(), stats],
        inspect: vec![format!("{}conntrack -S", d.netns_exec)],
        ..Finding::default()
    };
    if let Some(ct) = d.ct {
        clash_words(d, &Clash::of(d, ct), &mut f);
    }
    f
}

/// The clash's evidence, what to look at and the repair: the entry, the
/// tuple already taken, the NAT rule and its widening (or a note).
fn clash_words(d: &CtDrop, c: &Clash, f: &mut Finding) {
    let (ns, ct) = (d.netns_exec, c.ct);
    f.evidence.push(format!(
        "the packet's conntrack entry, never confirmed: {}",
        ct_text(ct, d.status)
    ));
    f.evidence.push(format!(
        "__nf_conntrack_confirm found reply tuple {} -> {} already in the table and TCP \
         allows no clash resolution: the entry is not inserted and the packet is dropped",
        ct.reply.src, ct.reply.dst
    ));
    if let Some(h) = &d.holder {
        f.evidence
            .push(format!("the entry holding that tuple: {h}"));
    }
    f.inspect.push(format!(
        "{ns}conntrack -L -p tcp --reply-src {} --reply-port-src {} --reply-dst {} --reply-port-dst {}",
        ct.reply.src.ip(),
        ct.reply.src.port(),
        ct.reply.dst.ip(),
        ct.reply.dst.port()
    ));
    if let Some(r) = c.rule {
        f.evidence.push(format!(
            "NAT rule: {} ({} {}/{} rule {})",
            r.text,
            r.backend.name(),
            r.table,
            r.chain,
            r.number
        ));
        if let Some(w) = widen_fix(r, ns) {
            f.fix.push(Kind::SnatWiden.fix(w));
        }
    }
    if (c.snat || c.dnat) && f.fix.is_empty() {
        f.fix_notes.push(
            "give the SNAT/MASQUERADE rule a port range and random port selection \
             (iptables --to-source ADDR:1024-65535 --random-fully; nftables snat to \
             ADDR:1024-65535 fully-random), or more source addresses"
                .into(),
        );
    }
    f.summary = clash_summary(c);
}

/// `NAT port clash: A -> B, SNAT'd to C -> B, could not be confirmed ...`.
fn clash_summary(c: &Clash) -> String {
    let ct = c.ct;
    let (out_src, out_dst) = (ct.reply.dst, ct.reply.src);
    let nat = match (c.snat, c.dnat) {
        (true, _) => format!(", SNAT'd to {out_src} -> {out_dst},"),
        (false, true) => format!(", DNAT'd to {out_src} -> {out_dst},"),
        _ => String::new(),
    };
    format!(
        "{}: {} -> {}{} could not be confirmed: another connection already has reply \
         tuple {} -> {}, so conntrack dropped it (insert_failed)",
        if c.snat || c.dnat {
            "NAT port clash"
        } else {
            "conntrack insert failed"
        },
        ct.orig.src,
        ct.orig.dst,
        nat,
        ct.reply.src,
        ct.reply.dst
    )
}

/// The SNAT rule that maps to `addr`, else the only MASQUERADE rule.
fn pick_snat_rule(rules: &[NatRule], addr: std::net::IpAddr) -> Option<&NatRule> {
    let a = addr.to_string();
    rules
        .iter()
        .find(|r| {
            to_source(&r.target).is_some_and(|s| s.split(':').next() == Some(a.as_str()))
                || (r.backend == Backend::Nftables && r.text.contains(&format!("snat to {a}")))
        })
        .or_else(|| {
            let masq: Vec<&NatRule> = rules
                .iter()
                .filter(|r| r.target.starts_with("MASQUERADE") || r.text.contains("masquerade"))
                .collect();
            (masq.len() == 1).then(|| masq[0])
        })
}

/// The argument of `--to-source` in an iptables target.
fn to_source(target: &str) -> Option<&str> {
    let mut it = target.split_whitespace();
    it.find(|t| *t == "--to-source")?;
    it.next()
}

/// The same iptables rule with a full port range and `--random-fully`:
/// `iptables-nft -t nat -R POSTROUTING 1 ... --to-source A:1024-65535 --random-fully`.
fn widen_fix(r: &NatRule, ns: &str) -> Option<String> {
    let tool = match (r.backend, r.family) {
        (Backend::Nftables, _) => return None,
        (Backend::IptablesLegacy, Family::Ip6) => "ip6tables-legacy",
        (Backend::IptablesLegacy, _) => "iptables-legacy",
        (_, Family::Ip6) => "ip6tables-nft",
        _ => "iptables-nft",
    };
    let spec = r
        .text
        .strip_prefix(&format!("-A {} ", r.chain))
        .unwrap_or(&r.text);
    let mut toks: Vec<String> = spec.split_whitespace().map(String::from).collect();
    let ports = "1024-65535";
    let mut widened = false;
    for i in 0..toks.len() {
        match toks[i].as_str() {
            "--to-source" if i + 1 < toks.len() => {
                let addr = toks[i + 1].split(':').next().unwrap_or("").to_string();
                toks[i + 1] = format!("{addr}:{ports}");
                widened = true;
            }
            "--to-ports" if i + 1 < toks.len() => {
                toks[i + 1] = ports.into();
                widened = true;
            }
            _ => {}
        }
    }
    if !widened && !r.target.starts_with("MASQUERADE") {
        return None;
    }
    if !toks.iter().any(|t| t == "--random-fully") {
        toks.push("--random-fully".into());
    }
    Some(format!(
        "{ns}{tool} -t {} -R {} {} {}",
        r.table,
        r.chain,
        r.number,
        toks.join(" ")
    ))
}

fn chain_too_long(d: &CtDrop, stats: String) -> Finding {
    let a = &d.moved.after;
    Finding {
        cause: Cause::ConntrackInsertFailed,
        summary: format!(
            "conntrack refused the packet's entry: a hash chain of the conntrack table was too \
             long (chaintoolong) in netns {}",
            d.netns
        ),
        evidence: vec![
            d.kernel.clone(),
            stats,
            format!("conntrack table: {}", fill(d)),
        ],
        fix: vec![Kind::ConntrackBuckets.fix(format!(
            "sysctl -w net.netfilter.nf_conntrack_buckets={}",
            a.buckets.map_or(262_144, |b| b * 2)
        ))],
        fix_notes: vec!["in the initial namespace: the hash table is global".into()],
        inspect: vec![format!("{}conntrack -S", d.netns_exec)],
        ..Finding::default()
    }
}

fn table_full(d: &CtDrop, stats: String) -> Finding {
    let a = &d.moved.after;
    let max = a.max.unwrap_or(0);
    let mut evidence = vec![
        d.kernel.clone(),
        stats,
        format!(
            "conntrack table of netns {}: {} (the count is per namespace, the limit global)",
            d.netns,
            fill(d)
        ),
        "no entry on the packet: __nf_conntrack_alloc refused one and early_drop found no \
         unassured entry to evict; the kernel logs \"nf_conntrack: table full, dropping packet\""
            .into(),
    ];
    if a.early_drop > d.moved.before.early_drop {
        evidence.push(format!(
            "early_drop {} -> {}: the kernel was already evicting unassured entries to make room",
            d.moved.before.early_drop, a.early_drop
        ));
    }
    let new_max = if max > 0 { max * 2 } else { 262_144 };
    Finding {
        cause: Cause::ConntrackTableFull,
        summary: format!(
            "conntrack table full in netns {}: {}; new connections are dropped",
            d.netns,
            fill(d)
        ),
        evidence,
        fix: vec![
            Kind::ConntrackMax.fix(format!(
                "sysctl -w net.netfilter.nf_conntrack_max={new_max}"
            )),
            Kind::ConntrackBuckets.fix(format!(
                "sysctl -w net.netfilter.nf_conntrack_buckets={}",
                a.buckets.map_or(new_max / 4, |b| b * 2)
            )),
        ],
        fix_notes: vec!["in the initial namespace: the limit and the hash table are global".into()],
        inspect: vec![
            format!("{}conntrack -C", d.netns_exec),
            format!("{}conntrack -S", d.netns_exec),
        ],
        ..Finding::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        diagnosis::handshake::tests::{tuple, BITS},
        model::netfilter::{Chain, ConntrackStats, Rule, Verdict},
    };

    fn snat_ct() -> Ct {
        Ct {
            orig: tuple("10.98.1.2:41002", "10.98.2.2:8006"),
            reply: tuple("10.98.2.2:8006", "10.98.2.1:40000"),
            status: BITS.src_nat | (1 << 7) | (1 << 8),
            mark: 0,
            zone: 0,
            ctinfo: 2,
        }
    }

    fn moved(b: ConntrackStats, a: ConntrackStats) -> ConntrackMoved {
        ConntrackMoved {
            before: b,
            after: a,
        }
    }

    fn rule(text: &str) -> NatRule {
        NatRule {
            backend: Backend::IptablesNft,
            family: Family::Ip,
            table: "nat".into(),
            chain: "POSTROUTING".into(),
            number: 2,
            handle: None,
            text: text.into(),
            target: text.split_once(" -j ").unwrap().1.into(),
        }
    }

    fn drop<'a>(m: &'a ConntrackMoved, ct: Option<&'a Ct>, rules: &'a [NatRule]) -> CtDrop<'a> {
        CtDrop {
            moved: m,
            ct,
            bits: &BITS,
            status: &[],
            nat_rules: rules,
            kernel: "kernel drop reason NETFILTER_DROP at nf_hook_slow+0x4e".into(),
            netns_exec: "ip netns exec rt ",
            netns: "rt",
            holder: None,
        }
    }

    #[test]
    fn a_snat_port_clash_is_insert_failed_with_the_tuples_and_a_wider_range() {
        let b = ConntrackStats::default();
        let a = ConntrackStats {
            insert_failed: 1,
            drop: 1,
            count: Some(1),
            max: Some(262_144),
            ..b
        };
        let m = moved(b, a);
        let ct = snat_ct();
        let rules = [
            rule("-A POSTROUTING -o eth9 -j MASQUERADE"),
            rule("-A POSTROUTING -o r1 -p tcp -j SNAT --to-source 10.98.2.1:40000"),
        ];
        let mut d = drop(&m, Some(&ct), &rules);
        d.holder = Some("orig 10.98.1.2:41001 -> 10.98.2.2:8006".into());
        let f = explain(&d).unwrap();
        assert_eq!(f.cause, "conntrack_insert_failed");
        assert_eq!(
            f.summary,
            "NAT port clash: 10.98.1.2:41002 -> 10.98.2.2:8006, SNAT'd to 10.98.2.1:40000 -> \
             10.98.2.2:8006, could not be confirmed: another connection already has reply tuple \
             10.98.2.2:8006 -> 10.98.2.1:40000, so conntrack dropped it (insert_failed)"
        );
        assert_eq!(
            f.evidence[1],
            "conntrack statistics: insert_failed 0 -> 1, drop 0 -> 1 (early_drop 0, \
             chaintoolong 0, invalid 0, clash_resolve 0)"
        );
        assert!(f.evidence[2].starts_with("the packet's conntrack entry, never confirmed: orig 10.98.1.2:41002 -> 10.98.2.2:8006, reply 10.98.2.2:8006 -> 10.98.2.1:40000"), "{:?}", f.evidence);
        assert_eq!(
            f.evidence[4],
            "the entry holding that tuple: orig 10.98.1.2:41001 -> 10.98.2.2:8006"
        );
        assert!(f.evidence[5].starts_with("NAT rule: -A POSTROUTING -o r1"));
        assert_eq!(
            f.fix[0],
            "ip netns exec rt iptables-nft -t nat -R POSTROUTING 2 -o r1 -p tcp -j SNAT \
             --to-source 10.98.2.1:1024-65535 --random-fully"
        );
        assert_eq!(f.fix.len(), 1, "{:?}", f.fix);
        assert_eq!(f.inspect[0], "ip netns exec rt conntrack -S");
        assert_eq!(
            f.inspect[1],
            "ip netns exec rt conntrack -L -p tcp --reply-src 10.98.2.2 --reply-port-src 8006 \
             --reply-dst 10.98.2.1 --reply-port-dst 40000"
        );
    }

    #[test]
    fn masquerade_is_widened_and_nftables_gets_advice() {
        let r = rule("-A POSTROUTING -o r1 -j MASQUERADE --to-ports 40000");
        assert_eq!(
            widen_fix(&r, "").unwrap(),
            "iptables-nft -t nat -R POSTROUTING 2 -o r1 -j MASQUERADE --to-ports 1024-65535 --random-fully"
        );
        let r = rule("-A POSTROUTING -o r1 -j MASQUERADE --random-fully");
        assert_eq!(
            widen_fix(&r, "").unwrap(),
            "iptables-nft -t nat -R POSTROUTING 2 -o r1 -j MASQUERADE --random-fully"
        );
        let mut n = rule("-A X -j SNAT --to-source 1.2.3.4");
        n.backend = Backend::Nftables;
        assert_eq!(widen_fix(&n, ""), None);
        assert_eq!(
            pick_snat_rule(&[rule("-A X -j MASQUERADE")], "1.2.3.4".parse().unwrap())
                .map(|r| r.number),
            Some(2)
        );
        assert_eq!(
            pick_snat_rule(
                &[rule("-A X -j SNAT --to-source 9.9.9.9")],
                "1.2.3.4".parse().unwrap()
            ),
            None
        );
    }

    #[test]
    fn a_full_table_is_named_when_the_count_is_at_the_limit() {
        let b = ConntrackStats {
            drop: 4,
            ..ConntrackStats::default()
        };
        let a = ConntrackStats {
            drop: 5,
            count: Some(65_536),
            max: Some(65_536),
            ..b
        };
        let m = moved(b, a);
        let f = explain(&drop(&m, None, &[])).unwrap();
        assert_eq!(f.cause, "conntrack_table_full");
        assert_eq!(
            f.summary,
            "conntrack table full in netns rt: 65536 entries of nf_conntrack_max 65536; new \
             connections are dropped"
        );
        assert_eq!(f.fix[0], "sysctl -w net.netfilter.nf_conntrack_max=131072");
        assert_eq!(
            f.fix_notes,
            ["in the initial namespace: the limit and the hash table are global"]
        );
        assert_eq!(f.inspect[0], "ip netns exec rt conntrack -C");
        // Far from the limit and nothing evicted: not a full table.
        let a2 = ConntrackStats {
            count: Some(100),
            ..a
        };
        let m2 = moved(b, a2);
        assert_eq!(explain(&drop(&m2, None, &[])), None);
        // early_drop moving says the table was at the limit even if the
        // count has fallen since.
        let a3 = ConntrackStats {
            early_drop: 3,
            ..a2
        };
        let m3 = moved(b, a3);
        let f = explain(&drop(&m3, None, &[])).unwrap();
        assert_eq!(f.cause, "conntrack_table_full");
        assert!(f.evidence.last().unwrap().starts_with("early_drop 0 -> 3"));
        // A packet that carries an entry was not refused one.
        let ct = snat_ct();
        assert_eq!(explain(&drop(&m, Some(&ct), &[])), None);
    }

    #[test]
    fn a_long_chain_is_insert_failed_without_drop() {
        let b = ConntrackStats::default();
        let a = ConntrackStats {
            insert_failed: 1,
            chaintoolong: 1,
            max: Some(262_144),
            count: Some(10),
            ..b
        };
        let m = moved(b, a);
        let f = explain(&drop(&m, Some(&snat_ct()), &[])).unwrap();
        assert_eq!(f.cause, "conntrack_insert_failed");
        assert!(f.summary.contains("hash chain"), "{}", f.summary);
    }

    #[test]
    fn nat_rules_are_found_in_both_backends() {
        let t = crate::parse::iptables_save::parse_save(
            "*nat\n:POSTROUTING ACCEPT [0:0]\n[0:0] -A POSTROUTING -o r1 -j SNAT --to-source 10.0.0.1:40000\n[0:0] -A POSTROUTING -j ACCEPT\nCOMMIT\n",
            Backend::IptablesLegacy,
            Family::Ip,
            "iptables-legacy-save -c",
        )
        .unwrap();
        let r = nat_rules(&t);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].chain.as_str(), r[0].number), ("POSTROUTING", 1));
        assert_eq!(r[0].target, "SNAT --to-source 10.0.0.1:40000");
    }

    #[test]
    fn nftables_nat_rules_are_snat_or_masquerade_statements() {
        let rule = |text: &str| Rule {
            text: text.into(),
            handle: Some(7),
            matches: Vec::new(),
            verdict: Verdict::Terminal,
            target: String::new(),
            packets: None,
            counted_matches: 0,
        };
        let t = Table {
            backend: Backend::Nftables,
            family: Family::Ip,
            name: "nat".into(),
            chains: vec![Chain {
                name: "post".into(),
                base: None,
                rules: vec![
                    rule("oifname \"r1\" masquerade"),
                    rule("ip daddr 10.0.0.2 accept"),
                    rule("oifname \"r2\" snat to 10.0.0.1"),
                ],
            }],
            source: "nft -j list ruleset".into(),
        };
        let r = nat_rules(&[t]);
        let found: Vec<(usize, &str)> = r.iter().map(|r| (r.number, r.text.as_str())).collect();
        assert_eq!(
            found,
            [
                (1, "oifname \"r1\" masquerade"),
                (3, "oifname \"r2\" snat to 10.0.0.1")
            ]
        );
        assert_eq!(r[0].handle, Some(7));
    }

    /// Counters that are non-zero but did not move say nothing.
    #[test]
    fn only_counters_that_moved_decide() {
        let b = ConntrackStats {
            chaintoolong: 3,
            drop: 2,
            ..ConntrackStats::default()
        };
        // insert_failed alone moved: a clash, not a long chain.
        let a = ConntrackStats {
            insert_failed: 1,
            ..b
        };
        let m = moved(b, a);
        let f = explain(&drop(&m, Some(&snat_ct()), &[])).unwrap();
        assert_eq!(f.cause, "conntrack_insert_failed");
        assert!(f.summary.starts_with("NAT port clash"), "{}", f.summary);
        // A long chain, but a drop moved too: the clash finding.
        let a = ConntrackStats {
            insert_failed: 1,
            chaintoolong: 4,
            drop: 3,
            ..b
        };
        let m = moved(b, a);
        let f = explain(&drop(&m, Some(&snat_ct()), &[])).unwrap();
        assert!(!f.summary.contains("hash chain"), "{}", f.summary);
    }

    /// A table is full from 95 % of nf_conntrack_max; a limit of 0 (unset)
    /// or half a table is not full.
    #[test]
    fn full_means_at_least_95_percent_of_a_set_limit() {
        let b = ConntrackStats {
            drop: 1,
            ..ConntrackStats::default()
        };
        let at = |count: u64, max: u64| {
            let a = ConntrackStats {
                drop: 2,
                count: Some(count),
                max: Some(max),
                ..b
            };
            explain(&drop(&moved(b, a), None, &[])).map(|f| f.cause.id())
        };
        assert_eq!(at(0, 0), None);
        assert_eq!(at(50, 100), None);
        assert_eq!(at(94, 100), None);
        assert_eq!(at(95, 100), Some("conntrack_table_full"));
        // early_drop did not move: no line says it did.
        let a = ConntrackStats {
            drop: 2,
            early_drop: 5,
            count: Some(100),
            max: Some(100),
            ..b
        };
        let b = ConntrackStats { early_drop: 5, ..b };
        let f = explain(&drop(&moved(b, a), None, &[])).unwrap();
        assert_eq!(f.evidence.len(), 4, "{:?}", f.evidence);
    }

    fn clash() -> ConntrackMoved {
        let b = ConntrackStats::default();
        moved(
            b,
            ConntrackStats {
                insert_failed: 1,
                ..b
            },
        )
    }

    /// The clash's facts: SNAT'd, by the rule that maps to its source.
    #[test]
    fn a_clash_knows_its_nat_and_rule() {
        let m = clash();
        let ct = snat_ct();
        let rules = [
            rule("-A POSTROUTING -o eth9 -j MASQUERADE"),
            rule("-A POSTROUTING -o r1 -p tcp -j SNAT --to-source 10.98.2.1:40000"),
        ];
        let d = drop(&m, Some(&ct), &rules);
        let c = Clash::of(&d, &ct);
        assert!(c.snat && !c.dnat);
        assert_eq!(c.rule, Some(&rules[1]));
    }

    /// Whether the entry was SNAT'd, DNAT'd or neither decides the summary
    /// and whether a port-range note stands in for a rule's fix.
    #[test]
    fn the_nat_bits_name_the_clash() {
        let m = clash();
        let dnat = Ct {
            orig: tuple("10.98.1.2:41002", "10.96.0.10:80"),
            reply: tuple("10.98.2.2:8006", "10.98.1.2:41002"),
            status: BITS.dst_nat | (1 << 7),
            ..snat_ct()
        };
        let f = explain(&drop(&m, Some(&dnat), &[])).unwrap();
        assert_eq!(
            f.summary,
            "NAT port clash: 10.98.1.2:41002 -> 10.96.0.10:80, DNAT'd to 10.98.1.2:41002 -> \
             10.98.2.2:8006, could not be confirmed: another connection already has reply tuple \
             10.98.2.2:8006 -> 10.98.1.2:41002, so conntrack dropped it (insert_failed)"
        );
        assert!(f.fix.is_empty(), "{:?}", f.fix);
        assert_eq!(f.fix_notes.len(), 1, "{:?}", f.fix_notes);
        assert!(f.fix_notes[0].starts_with("give the SNAT/MASQUERADE rule a port range"));

        let plain = Ct {
            reply: tuple("10.98.2.2:8006", "10.98.1.2:41002"),
            status: 1 << 7,
            ..dnat
        };
        let f = explain(&drop(&m, Some(&plain), &[])).unwrap();
        assert!(
            f.summary.starts_with(
                "conntrack insert failed: 10.98.1.2:41002 -> 10.96.0.10:80 could not be confirmed"
            ),
            "{}",
            f.summary
        );
        assert!(f.fix.is_empty() && f.fix_notes.is_empty(), "{f:?}");

        // SNAT with a rule to widen: the fix, and no note beside it.
        let rules = [rule(
            "-A POSTROUTING -o r1 -p tcp -j SNAT --to-source 10.98.2.1:40000",
        )];
        let f = explain(&drop(&m, Some(&snat_ct()), &rules)).unwrap();
        assert_eq!(f.fix.len(), 1, "{:?}", f.fix);
        assert!(f.fix_notes.is_empty(), "{:?}", f.fix_notes);
        // No entry at all: the counters' sentence.
        let f = explain(&drop(&m, None, &[])).unwrap();
        assert_eq!(
            f.summary,
            "conntrack could not insert the packet's entry (insert_failed): its tuple clashes \
             with an existing connection"
        );
    }

    /// nftables' snat statement is matched by the address it maps to.
    #[test]
    fn an_nftables_snat_rule_is_picked_by_its_address() {
        let nft = |n: usize, addr: &str| NatRule {
            backend: Backend::Nftables,
            number: n,
            text: format!("oifname \"r1\" snat to {addr}"),
            target: String::new(),
            ..rule("-A POSTROUTING -j SNAT")
        };
        let rules = [nft(1, "10.9.9.9"), nft(2, "10.98.2.1")];
        let f = explain(&drop(&clash(), Some(&snat_ct()), &rules)).unwrap();
        let named: Vec<&String> = f
            .evidence
            .iter()
            .filter(|e| e.starts_with("NAT rule: "))
            .collect();
        assert_eq!(
            named,
            ["NAT rule: oifname \"r1\" snat to 10.98.2.1 (nftables nat/POSTROUTING rule 2)"]
        );
        // nftables gets the advice, not a command.
        assert!(f.fix.is_empty());
        assert_eq!(f.fix_notes.len(), 1);
    }

    #[test]
    fn the_widened_rule_is_written_for_its_own_tool() {
        let text = "-A POSTROUTING -o r1 -j SNAT --to-source 10.0.0.1";
        let with = |backend, family| NatRule {
            backend,
            family,
            ..rule(text)
        };
        let tool = |r: &NatRule| {
            widen_fix(r, "")
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            tool(&with(Backend::IptablesLegacy, Family::Ip)),
            "iptables-legacy"
        );
        assert_eq!(
            tool(&with(Backend::IptablesLegacy, Family::Ip6)),
            "ip6tables-legacy"
        );
        assert_eq!(
            tool(&with(Backend::IptablesNft, Family::Ip6)),
            "ip6tables-nft"
        );
        assert_eq!(
            tool(&with(Backend::IptablesNft, Family::Ip)),
            "iptables-nft"
        );
        assert_eq!(widen_fix(&with(Backend::Nftables, Family::Ip), ""), None);
    }

    /// A rule cut short after `--to-source` / `--to-ports` (no argument)
    /// is left as it is, not indexed past its end.
    #[test]
    fn a_rule_ending_in_its_option_is_not_read_past() {
        let snat = NatRule {
            target: "SNAT --to-source".into(),
            ..rule("-A POSTROUTING -j SNAT --to-source")
        };
        assert_eq!(widen_fix(&snat, ""), None);
        let masq = rule("-A POSTROUTING -j MASQUERADE --to-ports");
        assert_eq!(
            widen_fix(&masq, "").unwrap(),
            "iptables-nft -t nat -R POSTROUTING 2 -j MASQUERADE --to-ports --random-fully"
        );
    }

    #[test]
    fn a_long_chain_says_where_and_doubles_the_buckets() {
        let b = ConntrackStats::default();
        let a = ConntrackStats {
            insert_failed: 1,
            chaintoolong: 1,
            count: Some(10),
            max: Some(262_144),
            buckets: Some(65_536),
            ..b
        };
        let m = moved(b, a);
        let f = explain(&drop(&m, Some(&snat_ct()), &[])).unwrap();
        assert_eq!(
            f.evidence,
            [
                "kernel drop reason NETFILTER_DROP at nf_hook_slow+0x4e",
                "conntrack statistics: insert_failed 0 -> 1, chaintoolong 0 -> 1 (drop 0, \
                 early_drop 0, invalid 0, clash_resolve 0)",
                "conntrack table: 10 entries of nf_conntrack_max 262144",
            ]
        );
        assert_eq!(
            f.fix,
            ["sysctl -w net.netfilter.nf_conntrack_buckets=131072"]
        );
        assert_eq!(
            f.fix_notes,
            ["in the initial namespace: the hash table is global"]
        );
        assert_eq!(f.inspect, ["ip netns exec rt conntrack -S"]);
        // Buckets unknown: a default size.
        let m = moved(
            b,
            ConntrackStats {
                buckets: None,
                count: None,
                ..a
            },
        );
        let f = explain(&drop(&m, Some(&snat_ct()), &[])).unwrap();
        assert_eq!(
            f.fix,
            ["sysctl -w net.netfilter.nf_conntrack_buckets=262144"]
        );
        assert_eq!(f.evidence[2], "conntrack table: fill unknown");
    }

    /// A full table whose limit could not be read (early_drop moved): the
    /// fix proposes sizes of its own.
    #[test]
    fn a_full_table_of_unknown_size_gets_default_sizes() {
        let b = ConntrackStats {
            drop: 1,
            ..ConntrackStats::default()
        };
        let a = ConntrackStats {
            drop: 2,
            early_drop: 1,
            ..b
        };
        let f = explain(&drop(&moved(b, a), None, &[])).unwrap();
        assert_eq!(
            f.fix,
            [
                "sysctl -w net.netfilter.nf_conntrack_max=262144",
                "sysctl -w net.netfilter.nf_conntrack_buckets=65536"
            ]
        );
        assert_eq!(
            f.evidence[2],
            "conntrack table of netns rt: fill unknown (the count is per namespace, the limit \
             global)"
        );
        assert_eq!(
            f.inspect,
            [
                "ip netns exec rt conntrack -C",
                "ip netns exec rt conntrack -S"
            ]
        );
        let a = ConntrackStats {
            max: Some(1000),
            count: Some(990),
            buckets: Some(256),
            ..a
        };
        let f = explain(&drop(&moved(b, a), None, &[])).unwrap();
        assert_eq!(
            f.fix,
            [
                "sysctl -w net.netfilter.nf_conntrack_max=2000",
                "sysctl -w net.netfilter.nf_conntrack_buckets=512"
            ]
        );
    }
}
