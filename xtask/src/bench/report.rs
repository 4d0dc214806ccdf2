//! The tables the bench prints: one per workload, with the tools' own cost,
//! their BPF programs' runs (with --prog-stats) and, for the healthy
//! workloads, whether each target is met.
use std::collections::BTreeMap;

use super::{
    measure::{Kind, Sample},
    variants::{self, Tool, Variant},
    Opts,
};

/// Everything measured for one workload.
pub struct Results<'a> {
    pub kind: &'static Kind,
    pub variants: Vec<Variant>,
    pub samples: BTreeMap<&'a str, Vec<Sample>>,
    pub na: BTreeMap<&'a str, String>,
    pub failed: BTreeMap<&'a str, usize>,
    /// 1-minute load average after each run.
    pub load: Vec<f64>,
    /// Wall-clock seconds the workload's rounds took.
    pub took: f64,
}

/// (min, median, max).
pub fn spread(mut xs: Vec<f64>) -> Option<(f64, f64, f64)> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    let med = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    };
    Some((xs[0], med, xs[n - 1]))
}

fn fmt3(s: Option<(f64, f64, f64)>, f: impl Fn(f64) -> String) -> String {
    match s {
        Some((a, b, c)) => format!("{}/{}/{}", f(a), f(b), f(c)),
        None => "-".into(),
    }
}

fn kilo(x: f64) -> String {
    format!("{:.0}k", x / 1e3)
}

/// Rates in the workload's unit: thousands, or MB as they are.
fn rate(kind: &Kind) -> fn(f64) -> String {
    if kind.unit == "MB" {
        |x| format!("{x:.0}")
    } else {
        kilo
    }
}

fn col(xs: &[Sample], f: &dyn Fn(&Sample) -> Option<f64>) -> Option<(f64, f64, f64)> {
    spread(xs.iter().filter_map(f).collect())
}

fn name(v: &Variant) -> String {
    format!("({}) {}", v.key, v.label)
}

pub fn table(o: &Opts, machine: &str, others: &[String], r: &Results) -> String {
    let k = r.kind;
    let mut s = format!(
        "\nkdrop bench: {} rounds x {} s {}; {machine}\n\
         min/median/max over rounds; ratios are to the mean of the no-tracer runs right before and after\n",
        o.rounds, o.secs, k.title,
    );
    if let Some((lo, _, hi)) = spread(r.load.clone()) {
        s.push_str(&format!(
            "load average (1 min) {lo:.1}-{hi:.1} during the runs; {:.0} s in all\n",
            r.took
        ));
    }
    let all: Vec<Sample> = r.samples.values().flatten().cloned().collect();
    if let Some((lo, med, hi)) = col(&all, &|x| Some(100.0 * x.on_cpu)) {
        s.push_str(&format!(
            "the workload's threads ran {lo:.0}/{med:.0}/{hi:.0} % of the wall time (min/median/max over runs)\n"
        ));
    }
    if !others.is_empty() {
        s.push_str(&format!(
            "note: attached to skb:kfree_skb by someone else during the run: {}\n",
            others.join("; ")
        ));
    }
    s.push_str(&format!(
        "\n{:<52} {:>24} {:>17} {:>20} {:>17}\n",
        "throughput", k.lead, "ratio", k.wall, "ratio (wall)"
    ));
    let rows: Vec<(&Variant, &Vec<Sample>)> = r
        .variants
        .iter()
        .filter_map(|v| Some((v, r.samples.get(v.key)?)))
        .collect();
    let f = rate(k);
    for (v, xs) in &rows {
        s.push_str(&format!(
            "{:<52} {:>24} {:>17} {:>20} {:>17}\n",
            name(v),
            fmt3(col(xs, &|x| Some(x.rate_cpu)), f),
            fmt3(col(xs, &|x| Some(x.ratio_cpu)), |x| format!("{x:.2}")),
            fmt3(col(xs, &|x| Some(x.rate)), f),
            fmt3(col(xs, &|x| Some(x.ratio)), |x| format!("{x:.2}")),
        ));
    }
    for (key, n) in &r.failed {
        s.push_str(&format!(
            "({key}) failed to run in {n} round(s): fewer samples above\n"
        ));
    }
    for (key, why) in &r.na {
        if let Some(v) = r.variants.iter().find(|v| v.key == *key) {
            s.push_str(&format!("{:<52} n/a: {why}\n", name(v)));
        }
    }
    s.push_str(&format!(
        "\n{:<52} {:>20} {:>16} {:>16} {:>15} {:>16}\n",
        "the tool itself",
        "events/s to user",
        "CPU % of a core",
        "peak RSS MiB",
        "ready ms",
        "BPF ns per call"
    ));
    for (v, xs) in rows.iter().filter(|(v, _)| v.tool.is_some()) {
        let st = |f: &dyn Fn(&super::tools::Stopped, f64) -> Option<f64>| {
            col(xs, &|x| x.stopped.as_ref().and_then(|st| f(st, x.secs)))
        };
        s.push_str(&format!(
            "{:<52} {:>20} {:>16} {:>16} {:>15} {:>16}\n",
            name(v),
            fmt3(st(&|st, secs| st.to_user.map(|n| n as f64 / secs)), kilo),
            fmt3(
                st(&|st, secs| Some(100.0 * st.cpu_flood / secs)),
                |x| format!("{x:.0}")
            ),
            fmt3(
                st(&|st, _| Some(st.maxrss_kib as f64 / 1024.0)),
                |x| format!("{x:.1}")
            ),
            fmt3(col(xs, &|x| x.ready_ms), |x| format!("{x:.0}")),
            fmt3(st(&|st, _| st.prog_ns), |x| format!("{x:.0}")),
        ));
    }
    s.push_str(&programs(k, &rows));
    s.push_str(&health(k, &rows));
    if k.key == "flood" {
        s.push_str(&floor(&rows));
    }
    s.push('\n');
    for (v, _) in &rows {
        if let Some(prog) = variants::bpftrace_prog(v) {
            s.push_str(&format!("({}) bpftrace -e '{prog}'\n", v.key));
        }
    }
    if k.key != "flood" {
        s.push_str(&super::targets::verdicts(k.key, &rows));
    }
    s
}

/// kdrop's kernel side against the no-op program on its points (issue 29):
/// (b), whose filter matches nothing, within 0.03 of it; (c) and (d) by
/// how much more the records cost.
fn floor(rows: &[(&Variant, &Vec<Sample>)]) -> String {
    let med = |key: &str| {
        let (_, xs) = rows.iter().find(|(v, _)| v.key == key)?;
        spread(xs.iter().map(|x| x.ratio_cpu).collect()).map(|(_, m, _)| m)
    };
    let Some(n) = med("n") else {
        return String::new();
    };
    let mut s = format!(
        "
against the no-op floor (n), {n:.2} (median ratio per CPU s):
"
    );
    for key in ["b", "c", "d"] {
        let Some(r) = med(key) else { continue };
        let verdict = match key {
            "b" if n - r <= 0.03 => ", within 0.03: met",
            "b" => ", within 0.03: MISSED",
            _ => "",
        };
        s.push_str(&format!(
            "  ({key}) {r:.2}, {:.2} below it{verdict}
",
            n - r
        ));
    }
    s
}

/// Per tool, each BPF program that ran: runs per unit of work and ns per
/// call, medians over rounds (the kernel counts runs only while run-time
/// statistics are on: --prog-stats).
fn programs(k: &Kind, rows: &[(&Variant, &Vec<Sample>)]) -> String {
    let mut out = String::new();
    for (v, xs) in rows.iter().filter(|(v, _)| v.tool.is_some()) {
        let mut per: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for x in xs.iter() {
            for p in x.stopped.iter().flat_map(|st| &st.progs) {
                let e = per.entry(&p.name).or_default();
                e.0.push(p.runs as f64 / x.units.max(1e-9));
                e.1.push(p.ns as f64 / p.runs.max(1) as f64);
            }
        }
        if per.is_empty() {
            continue;
        }
        let progs: Vec<String> = per
            .into_iter()
            .map(|(n, (runs, ns))| {
                let med = |xs: Vec<f64>| spread(xs).map_or(0.0, |(_, m, _)| m);
                format!("{n} {:.2}/{} {:.0} ns", med(runs), k.unit, med(ns))
            })
            .collect();
        out.push_str(&format!("{:<52} {}\n", name(v), progs.join("; ")));
    }
    if out.is_empty() {
        return out;
    }
    format!(
        "\nBPF programs that ran (runs per {} and ns per call, medians; other traffic on the host included)\n{out}",
        k.unit
    )
}

/// How the healthy traffic fared in every run, and kdrop's view of it.
fn health(k: &Kind, rows: &[(&Variant, &Vec<Sample>)]) -> String {
    if k.key == "flood" {
        return String::new();
    }
    let all: Vec<&Sample> = rows.iter().flat_map(|(_, xs)| xs.iter()).collect();
    let retrans: u64 = all.iter().map(|x| x.retrans).sum();
    let sirq = all.iter().map(|x| x.softirqd).fold(0.0, f64::max);
    let kdrop_drops: u64 = rows
        .iter()
        .filter(|(v, _)| v.tool == Some(Tool::Kdrop))
        .flat_map(|(_, xs)| xs.iter())
        .filter_map(|x| x.stopped.as_ref()?.kdrop.map(|[m, ..]| m))
        .sum();
    let followed: Vec<String> = rows
        .iter()
        .filter(|(v, _)| v.tool == Some(Tool::Kdrop))
        .filter_map(|(v, xs)| {
            let per: Vec<f64> = xs
                .iter()
                .filter_map(|x| {
                    let a = x
                        .stopped
                        .as_ref()?
                        .accounts
                        .iter()
                        .find(|a| a.label != "drops")?;
                    Some(a.get("matched") as f64 / x.units.max(1e-9))
                })
                .collect();
            let (_, med, _) = spread(per)?;
            Some(format!("({}) {med:.2}/{}", v.key, k.unit))
        })
        .collect();
    let mut s = format!(
        "\nhealth: {} runs, none with a drop counter moving, a unit lost or a retransmission left without a DSACK \
         (checked every run, baselines included); {retrans} TCP segments retransmitted in all, each DSACKed (spurious); \
         ksoftirqd did at most {:.1} % of a run's softirq work\n\
         kdrop's drop path matched {kdrop_drops} packets in all its runs here\n",
        all.len(),
        100.0 * sirq,
    );
    if let Some(line) = kfree_reasons(k, rows) {
        s.push_str(&line);
    }
    if !followed.is_empty() {
        s.push_str(&format!(
            "kdrop's handshake packets followed (matched, median per {}): {}\n",
            k.unit,
            followed.join(", ")
        ));
    }
    s
}

/// What bpftrace's kfree_skb count (bt-kfree) saw, by drop reason, per
/// unit of work: the whole host's frees while the workload ran, so another
/// user's traffic shows up too. Reason names from the running kernel's BTF.
fn kfree_reasons(k: &Kind, rows: &[(&Variant, &Vec<Sample>)]) -> Option<String> {
    let (_, xs) = rows.iter().find(|(v, _)| v.key == "bt-kfree")?;
    let mut per: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for x in xs.iter() {
        for (key, n) in x.stopped.iter().flat_map(|st| &st.counts) {
            per.entry(key)
                .or_default()
                .push(*n as f64 / x.units.max(1e-9));
        }
    }
    if per.is_empty() {
        return Some("kfree_skb during the (bt-kfree) runs: none\n".into());
    }
    let names = super::topo::sh(
        "bpftool",
        &["btf", "dump", "file", "/sys/kernel/btf/vmlinux"],
    )
    .map(|d| super::parse::drop_reasons(&d))
    .unwrap_or_default();
    let mut by: Vec<(f64, String)> = per
        .into_iter()
        .map(|(key, mut v)| {
            // Rounds where the reason did not occur count as 0.
            v.resize(xs.len().max(v.len()), 0.0);
            let med = spread(v).map_or(0.0, |(_, m, _)| m);
            (
                med,
                names.get(key).cloned().unwrap_or_else(|| key.to_string()),
            )
        })
        .collect();
    by.sort_by(|a, b| b.0.total_cmp(&a.0));
    let parts: Vec<String> = by
        .iter()
        .take(6)
        .map(|(m, n)| format!("{n} {m:.3}"))
        .collect();
    Some(format!(
        "kfree_skb by reason during the (bt-kfree) runs, whole host, median per {}: {}\n",
        k.unit,
        parts.join(", ")
    ))
}
