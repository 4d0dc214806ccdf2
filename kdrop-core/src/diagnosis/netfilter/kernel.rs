//! Rung 1 of the attribution ladder: the kernel's own verdict. A netfilter
//! function that returned NF_DROP for the packet (recorded by fexit or
//! kretprobe, see event::verdict) says who dropped it: conntrack itself
//! (`nf_conntrack_in`), the NAT step (`nf_nat_inet_fn`), or a rule walker
//! (`nft_do_chain` / `ipt_do_table`) with its table, chain and hook. For a
//! rule walker the counters then name the rule within that table and hook.
use crate::model::{
    netfilter::{Attribution, Backend, DroppedBy, Family, Hook},
    packet::{NfFn, NfVerdict},
};

/// Where the kernel says a rule walker dropped the packet: counters are
/// searched there only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub table: Option<String>,
    pub hook: Option<Hook>,
}

fn walker(verdicts: &[NfVerdict]) -> Option<&NfVerdict> {
    verdicts
        .iter()
        .find(|v| matches!(v.func, NfFn::NftDoChain | NfFn::IptDoTable))
}

fn find(verdicts: &[NfVerdict], f: NfFn) -> Option<&NfVerdict> {
    verdicts.iter().find(|v| v.func == f)
}

/// The scope a counter search should keep to, from the rule walker's verdict.
pub fn scope(verdicts: &[NfVerdict]) -> Option<Scope> {
    let w = walker(verdicts)?;
    Some(Scope {
        table: w.table.clone(),
        hook: w.hook,
    })
}

/// `kernel: ipt_do_table returned NF_DROP for this packet (table filter,
/// hook INPUT, via kretprobe; 12 µs before the free, same CPU)`.
fn line(v: &NfVerdict, rung: &str, drop_ts_ns: u64) -> String {
    let mut at = Vec::new();
    if let Some(t) = &v.table {
        at.push(format!("table {t}"));
    }
    if let Some(c) = &v.chain {
        at.push(format!("chain {c}"));
    }
    if let Some(h) = v.hook {
        at.push(format!("hook {h}"));
    }
    at.push(format!("via {rung}"));
    let errno = v.raw >> 16;
    let err = if errno != 0 {
        format!(" (errno {errno})")
    } else {
        String::new()
    };
    format!(
        "kernel: {} returned NF_DROP{err} for this packet ({}; {} µs before the free, same CPU)",
        v.func.name(),
        at.join(", "),
        drop_ts_ns.saturating_sub(v.ts_ns) / 1000
    )
}

/// An attribution from one verdict: its hook and family, nothing else yet.
fn bare(dropped_by: DroppedBy, method: String, v: &NfVerdict) -> Attribution {
    Attribution {
        hook: v.hook,
        family: v.family,
        ..Attribution::bare(dropped_by, method)
    }
}

/// The attribution from the kernel's verdicts for this drop, with what the
/// counters found (`counted`, searched within `scope(verdicts)`). `rung`
/// names the rung a function's verdict came through.
pub fn combine(
    verdicts: &[NfVerdict],
    drop_ts_ns: u64,
    rung: &dyn Fn(NfFn) -> String,
    counted: Option<Attribution>,
) -> Option<Attribution> {
    let say = Say { drop_ts_ns, rung };
    if let Some(v) = find(verdicts, NfFn::ConntrackIn) {
        return Some(conntrack_refused(&say, v, counted));
    }
    let nat = find(verdicts, NfFn::Nat);
    let Some(w) = walker(verdicts) else {
        // The NAT step dropped it by itself (no rule walker inside it did).
        let Some(v) = nat else {
            return counted;
        };
        let mut a = bare(DroppedBy::Nat, say.method(v), v);
        a.evidence.push(say.evidence(v));
        a.evidence.push(
            "the NAT step could not map this packet: e.g. MASQUERADE out of an interface \
             without an address of the packet's family, or a binding it could not set up"
                .into(),
        );
        return Some(a);
    };
    // A rule walker inside the NAT step (a nat chain) returned the drop:
    // the walker's verdict explains the NAT step's.
    let nat_line = nat.map(|v| {
        format!(
            "{}: the NAT step passed on the verdict of the nat chain",
            say.evidence(v)
        )
    });
    Some(walked(&say, w, counted, nat_line))
}

/// How a verdict is named in an attribution: its rung, its line.
struct Say<'a> {
    drop_ts_ns: u64,
    rung: &'a dyn Fn(NfFn) -> String,
}

impl Say<'_> {
    fn method(&self, v: &NfVerdict) -> String {
        format!(
            "kernel verdict ({} on {})",
            (self.rung)(v.func),
            v.func.name()
        )
    }

    fn evidence(&self, v: &NfVerdict) -> String {
        line(v, &(self.rung)(v.func), self.drop_ts_ns)
    }
}

/// nf_conntrack_in's own NF_DROP, with the conntrack statistics the
/// counters read (they tell a full table from a failed insert).
fn conntrack_refused(say: &Say, v: &NfVerdict, counted: Option<Attribution>) -> Attribution {
    let mut a = bare(DroppedBy::Conntrack, say.method(v), v);
    a.evidence.push(say.evidence(v));
    a.evidence.push(
        "conntrack refuses a packet when it cannot create its entry: the table is full \
         (nf_conntrack_max) or memory ran out"
            .into(),
    );
    if let Some(c) = counted.filter(|c| c.dropped_by == DroppedBy::Conntrack) {
        // The statistics too, not only their lines: they tell a full
        // table from a failed insert (`diagnosis::conntrack::explain`).
        a.conntrack = c.conntrack;
        a.evidence.extend(c.evidence);
    }
    a
}

/// A rule walker's NF_DROP: the counters' rule when they agree with its
/// table and hook, else the table alone, and why the counters do not count.
fn walked(
    say: &Say,
    w: &NfVerdict,
    counted: Option<Attribution>,
    nat_line: Option<String>,
) -> Attribution {
    let agrees = |c: &Attribution| {
        w.hook.is_none_or(|h| c.hook == Some(h))
            && w.table.as_ref().is_none_or(|t| c.table.as_ref() == Some(t))
            && c.dropped_by != DroppedBy::Conntrack
    };
    match counted {
        Some(mut c) if agrees(&c) => {
            c.method = format!("{} + {}", say.method(w), c.method);
            c.evidence.insert(0, say.evidence(w));
            c.evidence.extend(nat_line);
            c
        }
        other => {
            let mut a = bare(DroppedBy::Table, say.method(w), w);
            a.table = w.table.clone();
            a.chain = w.chain.clone();
            // nft_do_chain runs nftables and iptables-nft rules alike.
            a.backend = (w.func == NfFn::IptDoTable).then_some(Backend::IptablesLegacy);
            if a.family.is_none() {
                a.family = Some(if w.saddr.is_ipv4() {
                    Family::Ip
                } else {
                    Family::Ip6
                });
            }
            a.evidence.push(say.evidence(w));
            a.evidence.push(match other {
                Some(c) => format!(
                    "the rule counters point elsewhere ({}), which the kernel's verdict rules out",
                    c.method
                ),
                None => "no rule or policy counter of that table and hook names the rule".into(),
            });
            a.evidence.extend(nat_line);
            a
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(func: NfFn, table: Option<&str>, hook: Option<Hook>) -> NfVerdict {
        NfVerdict {
            ts_ns: 1_000_000,
            cpu: 0,
            func,
            raw: 0,
            netns: 1,
            saddr: "10.0.0.1".parse().unwrap(),
            daddr: "10.0.0.2".parse().unwrap(),
            sport: 40000,
            dport: 80,
            hook,
            family: Some(Family::Ip),
            table: table.map(String::from),
            chain: None,
        }
    }

    fn rung(_: NfFn) -> String {
        "kretprobe".into()
    }

    fn counted(table: &str, hook: Hook) -> Attribution {
        Attribution {
            dropped_by: DroppedBy::Rule,
            method: "rule counters (iptables-legacy-save -c)".into(),
            hook: Some(hook),
            family: Some(Family::Ip),
            backend: Some(Backend::IptablesLegacy),
            table: Some(table.into()),
            chain: Some("INPUT".into()),
            rule: Some("-A INPUT -p tcp -m tcp --dport 80 -j DROP".into()),
            rule_number: Some(1),
            handle: None,
            target: Some("DROP".into()),
            packets_before: Some(0),
            packets_after: Some(1),
            ctstate_invalid: false,
            accepts_established: None,
            before_conntrack: false,
            gone: false,
            conntrack: None,
            evidence: vec!["rule counter went 0 -> 1".into()],
        }
    }

    #[test]
    fn walker_confirms_the_counted_rule() {
        let vs = [v(NfFn::IptDoTable, Some("filter"), Some(Hook::Input))];
        assert_eq!(
            scope(&vs),
            Some(Scope {
                table: Some("filter".into()),
                hook: Some(Hook::Input)
            })
        );
        let a = combine(&vs, 1_012_000, &rung, Some(counted("filter", Hook::Input))).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Rule);
        assert_eq!(
            a.method,
            "kernel verdict (kretprobe on ipt_do_table) + rule counters (iptables-legacy-save -c)"
        );
        assert_eq!(
            a.evidence[0],
            "kernel: ipt_do_table returned NF_DROP for this packet (table filter, hook INPUT, via kretprobe; 12 µs before the free, same CPU)"
        );
        assert_eq!(a.rule_number, Some(1));
    }

    #[test]
    fn walker_alone_names_table_and_hook() {
        let vs = [v(NfFn::NftDoChain, Some("kdt"), Some(Hook::Forward))];
        // Counters that point at another hook are overruled.
        let a = combine(&vs, 1_000_000, &rung, Some(counted("filter", Hook::Input))).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Table);
        assert_eq!(a.table.as_deref(), Some("kdt"));
        assert_eq!(a.hook, Some(Hook::Forward));
        assert_eq!(a.backend, None);
        assert!(a.evidence[1].contains("rules out"), "{:?}", a.evidence);
        let a = combine(&vs, 1_000_000, &rung, None).unwrap();
        assert!(a.evidence[1].starts_with("no rule"), "{:?}", a.evidence);
    }

    /// nf_conntrack_in's verdict with conntrack's statistics moved: the
    /// attribution keeps the statistics (a full table is told from them),
    /// as it did before kprobe kernels gave a verdict (found on 6.1).
    #[test]
    fn conntracks_verdict_keeps_the_statistics() {
        use crate::model::netfilter::ConntrackStats;
        let stats = |drop| ConntrackStats {
            drop,
            count: Some(2),
            max: Some(2),
            ..ConntrackStats::default()
        };
        let counted =
            crate::diagnosis::netfilter::describe::conntrack_attribution(stats(1), stats(2));
        let ct = v(NfFn::ConntrackIn, None, Some(Hook::Prerouting));
        let a = combine(&[ct], 1_005_000, &rung, Some(counted)).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Conntrack);
        let moved = a.conntrack.expect("the statistics");
        assert_eq!((moved.before.drop, moved.after.drop), (1, 2));
        assert_eq!(
            a.evidence.last().unwrap(),
            "conntrack table: 2 entries of nf_conntrack_max 2"
        );
    }

    /// NF_DROP_ERR(x) is `((-x) << 16) | NF_DROP` (include/uapi/linux/
    /// netfilter.h, v6.18): the errno sits in the verdict's upper 16 bits.
    #[test]
    fn an_errno_in_the_verdict_is_shown() {
        let mut ct = v(NfFn::ConntrackIn, None, Some(Hook::Prerouting));
        ct.raw = 12 << 16; // NF_DROP_ERR(-ENOMEM)
        let a = combine(&[ct], 1_005_000, &rung, None).unwrap();
        assert_eq!(
            a.evidence[0],
            "kernel: nf_conntrack_in returned NF_DROP (errno 12) for this packet (hook PREROUTING, via kretprobe; 5 µs before the free, same CPU)"
        );
    }

    #[test]
    fn conntrack_verdict_keeps_conntrack_counters_only() {
        let ct = v(NfFn::ConntrackIn, None, Some(Hook::Prerouting));
        let mut stats = counted("filter", Hook::Input);
        stats.dropped_by = DroppedBy::Conntrack;
        stats.evidence = vec!["conntrack statistics moved: drop 2 -> 3".into()];
        let a = combine(std::slice::from_ref(&ct), 1_000_000, &rung, Some(stats)).unwrap();
        let mut want = Attribution::bare(
            DroppedBy::Conntrack,
            "kernel verdict (kretprobe on nf_conntrack_in)".into(),
        );
        want.hook = Some(Hook::Prerouting);
        want.family = Some(Family::Ip);
        want.evidence = vec![
            "kernel: nf_conntrack_in returned NF_DROP for this packet (hook PREROUTING, via kretprobe; 0 µs before the free, same CPU)".into(),
            "conntrack refuses a packet when it cannot create its entry: the table is full (nf_conntrack_max) or memory ran out".into(),
            "conntrack statistics moved: drop 2 -> 3".into(),
        ];
        assert_eq!(a, want);
        // A rule the counters found is not conntrack's evidence.
        let a = combine(
            &[ct],
            1_000_000,
            &rung,
            Some(counted("filter", Hook::Input)),
        )
        .unwrap();
        assert_eq!(a.evidence.len(), 2, "{:?}", a.evidence);
    }

    #[test]
    fn nat_step_alone_keeps_its_hook_and_family() {
        let mut nat = v(NfFn::Nat, None, Some(Hook::Postrouting));
        nat.family = Some(Family::Ip6);
        nat.saddr = "fd00::1".parse().unwrap();
        nat.daddr = "fd00::2".parse().unwrap();
        let a = combine(&[nat], 1_000_000, &rung, None).unwrap();
        assert_eq!(
            (a.dropped_by, a.hook, a.family),
            (DroppedBy::Nat, Some(Hook::Postrouting), Some(Family::Ip6))
        );
    }

    #[test]
    fn counters_in_the_same_hook_but_another_table_are_overruled() {
        let vs = [v(NfFn::IptDoTable, Some("raw"), Some(Hook::Input))];
        let a = combine(&vs, 1_000_000, &rung, Some(counted("filter", Hook::Input))).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Table);
        assert_eq!(a.table.as_deref(), Some("raw"));
        assert_eq!(
            a.evidence[1],
            "the rule counters point elsewhere (rule counters (iptables-legacy-save -c)), which the kernel's verdict rules out"
        );
        // And the same table in another hook.
        let vs = [v(NfFn::IptDoTable, Some("filter"), Some(Hook::Forward))];
        let a = combine(&vs, 1_000_000, &rung, Some(counted("filter", Hook::Input))).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Table);
    }

    #[test]
    fn conntrack_and_nat_come_first() {
        let ct = v(NfFn::ConntrackIn, None, Some(Hook::Prerouting));
        let w = v(NfFn::IptDoTable, Some("nat"), Some(Hook::Postrouting));
        let a = combine(std::slice::from_ref(&ct), 1_000_000, &rung, None).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Conntrack);
        assert_eq!(a.method, "kernel verdict (kretprobe on nf_conntrack_in)");
        let nat = v(NfFn::Nat, None, Some(Hook::Postrouting));
        // A drop rule in a nat chain: the chain's verdict, the NAT step's after it.
        let a = combine(&[w.clone(), nat.clone()], 1_000_000, &rung, None).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Table);
        assert_eq!(a.table.as_deref(), Some("nat"));
        assert_eq!(a.backend, Some(Backend::IptablesLegacy));
        assert_eq!(a.evidence.len(), 3);
        assert!(a.evidence[2].contains("nf_nat_inet_fn"), "{:?}", a.evidence);
        // The NAT step alone.
        let a = combine(&[nat], 1_000_000, &rung, None).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Nat);
        assert_eq!(a.evidence.len(), 2);
        assert_eq!(combine(&[], 0, &rung, None), None);
        let c = counted("filter", Hook::Input);
        assert_eq!(combine(&[], 0, &rung, Some(c.clone())), Some(c));
    }
}
