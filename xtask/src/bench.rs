//! `cargo xtask bench`: what kdrop costs a node, side by side with what a
//! user would run instead, in one run: under a SYN flood the node drops,
//! and on healthy traffic (small forwarded packets, TCP connection churn,
//! a bulk stream) that nothing drops.
//!
//! The flood (synflood) goes from a client namespace through a veth to a
//! node namespace whose iptables rule drops every SYN. The healthy
//! workloads (synflood::healthy) go from a client namespace through a
//! router namespace to a server namespace. Each round runs every variant of
//! a workload once, in an order that rotates between rounds, with a
//! no-tracer baseline between any two, and each variant is compared to the
//! baselines right before and after it: the machine is shared, so absolute
//! rates drift, ratios measured close together much less.
mod companion;
mod health;
mod interrupt;
mod measure;
pub mod noop;
mod parse;
mod points;
mod prog_stats;
mod report;
mod routed;
mod targets;
mod tools;
mod topo;
mod variants;

use std::{collections::BTreeMap, process::Command, time::Instant};

use anyhow::{bail, Context as _, Result};

use self::{
    measure::{measure, Load, Sample, Unhealthy},
    report::Results,
    routed::{Routed, Work},
    tools::Running,
    topo::Topo,
    variants::{Tool, Variant},
};

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// Rounds; each runs every variant once.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Length of each run (flood or healthy workload), seconds.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Most units in one run (flood packets, datagrams, connections,
    /// 64 KiB writes); each also stops after --secs.
    #[arg(long, default_value_t = 50_000_000)]
    count: u64,
    /// Workloads and flood variants: `h1`, `h2`, `h3` (healthy workloads,
    /// each with every healthy variant), `flood` (every flood variant) or
    /// flood variants such as `n,b,c,e2` (the baseline `a` always runs;
    /// `n` is a no-op program on kdrop's points, the kernel side's floor).
    /// Default: the flood and h1, h2, h3.
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Only these variants of the healthy workloads, e.g. `mon,kd-none`
    /// (the baseline `base` always runs): kd-none, kd-match, mon,
    /// bt-kfree, bt-points, tcpdump.
    #[arg(long, value_delimiter = ',')]
    variants: Option<Vec<String>>,
    /// CPU to pin the flood and the healthy clients to (the softirq that
    /// carries their packets runs there too); the healthy servers run on
    /// the next CPU, the tracers' own processes off this one, as they
    /// would on a node with more than two.
    #[arg(long, default_value_t = 0)]
    cpu: usize,
    /// Also measure the nanoseconds each tool's BPF programs take per call
    /// and how often each runs per unit of work (kernel run-time
    /// statistics, on only while the bench runs). The statistics' own
    /// clock reads are in the figure and slow every program down: compare
    /// the figures with each other, and take throughput from a run
    /// without this flag.
    #[arg(long)]
    prog_stats: bool,
    /// Run the full torture tests instead (a 60 s flood, 100 start/stop
    /// cycles, ...): tests/tests/torture.rs with KDROP_TORTURE=full.
    #[arg(long)]
    torture: bool,
}

const FLOOD_KEYS: &[&str] = &["a", "n", "b", "c", "d", "e1", "e2", "f", "g"];
const HEALTHY: &[(&str, Work)] = &[("h1", Work::Udp), ("h2", Work::Churn), ("h3", Work::Stream)];
const HEALTHY_KEYS: &[&str] = &[
    "base",
    "kd-none",
    "kd-match",
    "mon",
    "bt-kfree",
    "bt-points",
    "tcpdump",
];

/// What `--only` and `--variants` asked for.
struct Selection {
    /// Flood variants (the baseline included), empty for no flood.
    flood: Vec<String>,
    healthy: Vec<Work>,
    variants: Vec<String>,
}

fn select(o: &Opts) -> Result<Selection> {
    let all_flood = || FLOOD_KEYS.iter().map(|k| k.to_string()).collect();
    let mut sel = Selection {
        flood: Vec::new(),
        healthy: Vec::new(),
        variants: HEALTHY_KEYS.iter().map(|k| k.to_string()).collect(),
    };
    match &o.only {
        None => {
            sel.flood = all_flood();
            sel.healthy = HEALTHY.iter().map(|(_, w)| *w).collect();
        }
        Some(only) => {
            for k in only.iter().map(|k| k.trim()) {
                if k == "flood" {
                    sel.flood = all_flood();
                } else if let Some((_, w)) = HEALTHY.iter().find(|(h, _)| *h == k) {
                    if !sel.healthy.contains(w) {
                        sel.healthy.push(*w);
                    }
                } else if FLOOD_KEYS.contains(&k) {
                    if !sel.flood.iter().any(|f| f == k) {
                        sel.flood.push(k.to_string());
                    }
                } else {
                    bail!(
                        "--only {k}: not a workload (flood, h1, h2, h3) or flood variant ({})",
                        FLOOD_KEYS.join(", ")
                    );
                }
            }
        }
    }
    if let Some(vs) = &o.variants {
        for k in vs.iter().map(|k| k.trim()) {
            if !HEALTHY_KEYS.contains(&k) {
                bail!(
                    "--variants {k}: not a healthy variant ({})",
                    HEALTHY_KEYS.join(", ")
                );
            }
        }
        sel.variants = vs.iter().map(|k| k.trim().to_string()).collect();
    }
    if o.rounds == 0 || o.secs.is_nan() || o.secs <= 0.0 {
        bail!("--rounds and --secs must be positive");
    }
    Ok(sel)
}

/// Debian packages for the tools compared, by binary.
const TOOLS: &[(&str, &str)] = &[
    ("bpftrace", "bpftrace"),
    ("tcpdump", "tcpdump"),
    ("dropwatch", "dropwatch"),
];

pub fn run(o: &Opts) -> Result<()> {
    if o.torture {
        return torture();
    }
    let sel = select(o)?;
    crate::build()?;
    let missing = install_tools();
    let machine = machine();
    // This process's threads (readers of the tools' output) stay off the
    // workload's CPU too; the flood and client threads pin themselves to it.
    keep_off_cpu(o.cpu);
    let _companion = companion::Companion::start();
    let others = others_on_kfree_skb();
    if !others.is_empty() {
        eprintln!(
            "xtask: bench: not ours, attached to skb:kfree_skb (they cost every variant, the baseline too): {}",
            others.join("; ")
        );
    }
    let _stats = if o.prog_stats {
        Some(prog_stats::enable()?)
    } else {
        None
    };
    let kdrop = crate::kdrop_bin();
    // Ctrl-C ends the bench between two runs (each is bounded), through
    // the guards that remove its namespaces.
    interrupt::catch();
    // Each table is printed as soon as it is there: a later failure keeps it.
    if !sel.flood.is_empty() {
        let floor = if sel.flood.iter().any(|k| k == "n") {
            kdrop_points(&kdrop, o.cpu)?.and_then(|ps| {
                let exe = std::env::current_exe().map_err(|e| format!("this xtask: {e}"))?;
                let mut argv = vec![exe.display().to_string(), "bench-noop".into()];
                argv.extend(ps.iter().map(noop::arg));
                Ok(argv)
            })
        } else {
            Err("not asked for".into())
        };
        let topo = Topo::new()?;
        let mut vs = variants::flood(&topo, &kdrop, floor);
        vs.retain(|v| v.tool.is_none() || sel.flood.iter().any(|k| k == v.key));
        let r = rounds(o, Load::Flood(&topo), vs, &missing)?;
        drop(topo);
        print!("{}", report::table(o, &machine, &others, &r));
    }
    if !sel.healthy.is_empty() {
        let points = if sel.variants.iter().any(|k| k == "bt-points") {
            kdrop_points(&kdrop, o.cpu)?
                .and_then(|ps| points::bpftrace(&ps).map_err(|e| format!("{e:#}")))
        } else {
            Err("not asked for".into())
        };
        let routed = Routed::new()?;
        for work in &sel.healthy {
            let mut vs = variants::healthy(&kdrop, &routed.router, &points);
            vs.retain(|v| v.tool.is_none() || sel.variants.iter().any(|k| k == v.key));
            let r = rounds(o, Load::Healthy(&routed, *work), vs, &missing)?;
            print!("{}", report::table(o, &machine, &others, &r));
        }
    }
    Ok(())
}

/// kdrop's points, read from its readiness line; or why there are none.
fn kdrop_points(kdrop: &std::path::Path, cpu: usize) -> Result<Result<Vec<points::Point>, String>> {
    let v = Variant {
        key: "points",
        label: "kdrop, to read its points".into(),
        tool: Some(Tool::Kdrop),
        argv: vec![
            kdrop.display().to_string(),
            "--port".into(),
            topo::OTHER_PORT.to_string(),
        ],
    };
    let t = Running::start(&v, cpu).context("starting kdrop to read the points it attaches")?;
    let line = t.ready_line.clone();
    let st = t.stop()?;
    for a in &st.accounts {
        a.check().map_err(anyhow::Error::msg)?;
    }
    let points = points::parse(&line);
    eprintln!(
        "xtask: bench: kdrop attaches {} ({line:?})",
        points
            .iter()
            .map(|p| format!("{} via {}", p.name, p.rung))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if points.is_empty() {
        return Ok(Err("kdrop's readiness line names no point".into()));
    }
    Ok(Ok(points))
}

/// Every round of one workload: A B1 A B2 A ..., each variant compared to
/// the mean of the baselines right before and after it. The order rotates
/// between rounds so no variant always follows the same one.
fn rounds<'v>(
    o: &Opts,
    load: Load,
    variants: Vec<Variant>,
    missing: &BTreeMap<String, String>,
) -> Result<Results<'v>> {
    let t0 = Instant::now();
    let kind = load.kind();
    let mut r = Results {
        kind,
        variants,
        samples: BTreeMap::new(),
        na: BTreeMap::new(),
        failed: BTreeMap::new(),
        load: Vec::new(),
        took: 0.0,
    };
    let keys: Vec<(&'static str, Option<Tool>)> =
        r.variants.iter().map(|v| (v.key, v.tool)).collect();
    for v in &r.variants {
        if let Some(t) = v.tool {
            if let Some(why) = missing.get(&bin_of(t)) {
                r.na.insert(v.key, why.clone());
            } else if let Some(why) = v.argv.first().and_then(|a| a.strip_prefix("n/a: ")) {
                r.na.insert(v.key, why.to_string());
            }
        }
    }
    eprintln!(
        "xtask: bench: {}: {} rounds of {} s runs, variants {}",
        kind.key,
        o.rounds,
        o.secs,
        keys.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(",")
    );
    let baseline = r
        .variants
        .iter()
        .find(|v| v.tool.is_none())
        .cloned()
        .context("no baseline variant")?;
    let one = |v: &Variant, round: usize, r: &mut Results<'v>| -> Result<Sample> {
        interrupt::check()?;
        let s = measure(v, load, o)?;
        log(kind.key, round, v, &s);
        r.load.extend(loadavg());
        Ok(s)
    };
    if let Load::Healthy(..) = load {
        // Unmeasured: the first stream in fresh namespaces ran at half the
        // rate per CPU second of every later one (page and socket memory
        // not yet warm), which would skew the first ratios.
        interrupt::check()?;
        measure(&baseline, load, o).context("warm-up run")?;
    }
    for round in 0..o.rounds {
        let mut order: Vec<Variant> = r
            .variants
            .iter()
            .filter(|v| v.tool.is_some() && !r.na.contains_key(&v.key))
            .cloned()
            .collect();
        let k = round % order.len().max(1);
        order.rotate_left(k);
        let mut prev = one(&baseline, round, &mut r)?;
        r.samples
            .entry(baseline.key)
            .or_default()
            .push(prev.clone());
        for v in order {
            let mut s = match one(&v, round, &mut r) {
                Ok(s) => s,
                // The workload was not healthy, or kdrop failed or its
                // accounts did not add up: the bench ends.
                Err(e) if e.is::<Unhealthy>() || v.tool == Some(Tool::Kdrop) => {
                    return Err(e.context(format!("{} variant ({})", kind.key, v.key)))
                }
                Err(e) if round == 0 => {
                    eprintln!("xtask: bench: ({}) n/a: {e:#}", v.key);
                    r.na.insert(v.key, format!("{e:#}"));
                    continue;
                }
                // Another tool failing later (the machine is shared: someone
                // may hold what it needs) costs that round's sample.
                Err(e) => {
                    eprintln!("xtask: bench: ({}) failed this round: {e:#}", v.key);
                    *r.failed.entry(v.key).or_default() += 1;
                    continue;
                }
            };
            let next = one(&baseline, round, &mut r)?;
            s.ratio = s.rate / ((prev.rate + next.rate) / 2.0);
            s.ratio_cpu = s.rate_cpu / ((prev.rate_cpu + next.rate_cpu) / 2.0);
            r.samples.entry(v.key).or_default().push(s);
            r.samples
                .entry(baseline.key)
                .or_default()
                .push(next.clone());
            prev = next;
        }
    }
    r.took = t0.elapsed().as_secs_f64();
    Ok(r)
}

fn log(workload: &str, round: usize, v: &Variant, s: &Sample) {
    let counters = s
        .stopped
        .as_ref()
        .map(|st| {
            st.accounts
                .iter()
                .map(|a| {
                    let kv: Vec<String> =
                        a.values.iter().map(|(k, v)| format!("{k} {v}")).collect();
                    format!("  [{}: {}]", a.label, kv.join(", "))
                })
                .collect::<String>()
        })
        .unwrap_or_default();
    let share = if s.on_cpu > 0.0 {
        format!(
            "  on CPU {:.0} %, client waited {:.0} %",
            100.0 * s.on_cpu,
            100.0 * s.client_waited
        )
    } else {
        String::new()
    };
    let retrans = if s.retrans > 0 {
        format!("  {} retransmitted", s.retrans)
    } else {
        String::new()
    };
    eprintln!(
        "xtask: bench: {workload} round {} ({}) {:>10.0} per lead CPU second, {:>10.0} per second{share}{retrans}{counters}",
        round + 1,
        v.key,
        s.rate_cpu,
        s.rate
    );
}

/// The 1-minute load average.
fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Online CPUs (not this process's affinity, which the bench narrows).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// BPF programs someone else attached to kfree_skb (bpftool's view).
fn others_on_kfree_skb() -> Vec<String> {
    ["link", "perf"]
        .iter()
        .filter_map(|what| topo::sh("bpftool", &[what, "show"]).ok())
        .flat_map(|out| {
            let lines: Vec<String> = out.lines().map(str::to_string).collect();
            // `bpftool link show` names the tracepoint on a second line.
            lines
                .iter()
                .enumerate()
                .filter(|(_, l)| l.contains("kfree_skb"))
                .map(|(i, l)| {
                    let prev = if l.trim_start().starts_with("tp ") && i > 0 {
                        lines[i - 1].trim().to_string() + " "
                    } else {
                        String::new()
                    };
                    format!("{prev}{}", l.trim())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn keep_off_cpu(avoid: usize) {
    let cpus = online_cpus();
    if cpus < 2 {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in (0..cpus).filter(|&c| c != avoid) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn bin_of(t: Tool) -> String {
    match t {
        Tool::Kdrop => "kdrop",
        Tool::Bpftrace => "bpftrace",
        Tool::Tcpdump => "tcpdump",
        Tool::Dropwatch => "dropwatch",
        Tool::Noop => "xtask",
    }
    .to_string()
}

/// Installs the compared tools through apt when missing; returns those that
/// are still missing, with the reason.
fn install_tools() -> BTreeMap<String, String> {
    let missing: Vec<(&str, &str)> = TOOLS
        .iter()
        .copied()
        .filter(|(bin, _)| !crate::bootstrap::have(bin))
        .collect();
    let mut out = BTreeMap::new();
    if missing.is_empty() {
        return out;
    }
    let pkgs: Vec<&str> = missing.iter().map(|(_, p)| *p).collect();
    let installed = crate::bootstrap::apt_install_packages(&pkgs);
    for (bin, pkg) in missing {
        if !crate::bootstrap::have(bin) {
            let why = match &installed {
                Ok(()) => format!("apt installed {pkg} but there is no {bin}"),
                Err(e) => format!("{pkg} not installable: {e:#}"),
            };
            out.insert(bin.to_string(), why);
        }
    }
    out
}

fn machine() -> String {
    let cpus = online_cpus();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs, {mem_gib:.1} GiB, Linux {}", kernel.trim())
}

/// The torture tests in their full form.
fn torture() -> Result<()> {
    crate::build()?;
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["test", "-p", "integration-tests", "--test", "torture"])
        .args(["--", "--test-threads", "1", "--nocapture"])
        .env("KDROP_BIN", crate::kdrop_bin())
        .env("KDROP_TORTURE", "full");
    crate::run(&mut cmd).context("torture tests")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(only: Option<&str>, variants: Option<&str>) -> Opts {
        let list = |s: &str| s.split(',').map(str::to_string).collect();
        Opts {
            rounds: 5,
            secs: 2.0,
            count: 1,
            only: only.map(list),
            variants: variants.map(list),
            cpu: 0,
            prog_stats: false,
            torture: false,
        }
    }

    #[test]
    fn selections() {
        let all = select(&opts(None, None)).unwrap();
        assert_eq!(all.flood.len(), FLOOD_KEYS.len());
        assert_eq!(all.healthy, [Work::Udp, Work::Churn, Work::Stream]);
        assert_eq!(all.variants.len(), HEALTHY_KEYS.len());
        // The flood letters alone: no healthy workload.
        let f = select(&opts(Some("b,c"), None)).unwrap();
        assert_eq!(f.flood, ["b", "c"]);
        assert!(f.healthy.is_empty());
        let h = select(&opts(Some("h2,h1,h2"), Some("mon,kd-none"))).unwrap();
        assert!(h.flood.is_empty());
        assert_eq!(h.healthy, [Work::Churn, Work::Udp]);
        assert_eq!(h.variants, ["mon", "kd-none"]);
        assert_eq!(
            select(&opts(Some("flood,h3"), None)).unwrap().flood.len(),
            FLOOD_KEYS.len()
        );
        assert!(
            FLOOD_KEYS.contains(&"n"),
            "the no-op floor is a flood variant"
        );
        for bad in [opts(Some("h4"), None), opts(None, Some("b"))] {
            assert!(select(&bad).is_err());
        }
    }
}
