//! `cargo xtask bench`: what kdrop costs a node under a SYN flood, side by
//! side with what a user would run instead, in one run.
//!
//! A bounded flood (synflood) goes from a client namespace through a veth to
//! a node namespace whose iptables rule drops every SYN. Each round runs
//! every variant once, in an order that rotates between rounds, with a
//! no-tracer baseline between any two, and each variant is compared to the
//! baselines right before and after it: the machine is shared, so absolute
//! rates drift, ratios measured close together much less.
mod interrupt;
mod prog_stats;
mod tools;
mod topo;

use std::{collections::BTreeMap, process::Command};

use anyhow::{Context as _, Result};

use self::{
    tools::{Running, Stopped, Tool, Variant},
    topo::Topo,
};

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// Rounds; each runs every variant once.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Length of each flood, seconds.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Most packets in one flood (it also stops after --secs).
    #[arg(long, default_value_t = 50_000_000)]
    count: u64,
    /// Only these variants, e.g. `b,c,e2` (the baseline `a` always runs).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// CPU to pin the flood to (its softirq, where the drops happen, runs
    /// there too); the tracers' own processes run on the other CPUs, as
    /// they would on a node with more than two.
    #[arg(long, default_value_t = 0)]
    cpu: usize,
    /// Also measure the nanoseconds each tool's BPF programs take per call
    /// (kernel run-time statistics, on only while the bench runs). The
    /// statistics' own clock reads are in the figure and slow every program
    /// down: compare the figures with each other, and take throughput from
    /// a run without this flag.
    #[arg(long)]
    prog_stats: bool,
    /// Run the full torture tests instead (a 60 s flood, 100 start/stop
    /// cycles, ...): tests/tests/torture.rs with KDROP_TORTURE=full.
    #[arg(long)]
    torture: bool,
}

/// Debian packages for the tools compared, by binary.
const TOOLS: &[(&str, &str)] = &[
    ("bpftrace", "bpftrace"),
    ("tcpdump", "tcpdump"),
    ("dropwatch", "dropwatch"),
];

/// One variant in one round.
#[derive(Clone, Debug)]
struct Sample {
    /// Packets the node dropped (its iptables counter) per second of the
    /// flooding thread's CPU time, which includes the receive and drop path
    /// (softirq in its context): what a CPU given to the flood alone would
    /// drop. Other work on the shared machine hardly moves it.
    pps_cpu: f64,
    /// The same per second of wall time: what this machine did, with
    /// whatever else ran on the flood's CPU meanwhile.
    pps: f64,
    /// Each over the baselines right before and after.
    ratio_cpu: f64,
    ratio: f64,
    ready_ms: Option<f64>,
    stopped: Option<Stopped>,
    secs: f64,
}

pub fn run(o: &Opts) -> Result<()> {
    if o.torture {
        return torture();
    }
    crate::build()?;
    let missing = install_tools();
    let machine = machine();
    // This process's threads (readers of the tools' output) stay off the
    // flood's CPU too; the flood thread pins itself to it.
    keep_off_cpu(o.cpu);
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
    // Ctrl-C ends the bench between two floods (each is bounded), through
    // the guards that remove its namespaces.
    interrupt::catch();
    let topo = Topo::new()?;
    let mut variants = tools::variants(&topo, &kdrop);
    if let Some(only) = &o.only {
        variants.retain(|v| v.tool.is_none() || only.iter().any(|k| k == v.key));
    }
    let mut na: BTreeMap<&str, String> = BTreeMap::new();
    for v in &variants {
        if let Some(t) = v.tool {
            if let Some(why) = missing.get(&bin_of(t)) {
                na.insert(v.key, why.clone());
            }
        }
    }
    eprintln!(
        "xtask: bench: {} rounds of {} s floods, variants {}",
        o.rounds,
        o.secs,
        variants.iter().map(|v| v.key).collect::<Vec<_>>().join(",")
    );
    let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    let mut failed: BTreeMap<&str, usize> = BTreeMap::new();
    let baseline = variants
        .iter()
        .find(|v| v.tool.is_none())
        .cloned()
        .context("no baseline variant")?;
    for round in 0..o.rounds {
        // A B1 A B2 A ...: each variant is compared to the mean of the
        // baselines right before and after it. The order rotates between
        // rounds so no variant always follows the same one.
        let mut order: Vec<&Variant> = variants
            .iter()
            .filter(|v| v.tool.is_some() && !na.contains_key(&v.key))
            .collect();
        let k = round % order.len().max(1);
        order.rotate_left(k);
        interrupt::check()?;
        let mut prev = measure(&baseline, &topo, o)?;
        log(round, &baseline, &prev);
        samples.entry(baseline.key).or_default().push(prev.clone());
        for v in order {
            interrupt::check()?;
            let mut s = match measure(v, &topo, o) {
                Ok(s) => s,
                Err(e) if round == 0 => {
                    eprintln!("xtask: bench: ({}) n/a: {e:#}", v.key);
                    na.insert(v.key, format!("{e:#}"));
                    continue;
                }
                // Another tool failing later (the machine is shared: someone
                // may hold what it needs) costs that round's sample, not the
                // bench. A kdrop failure, an accounting mismatch included,
                // ends it.
                Err(e) if v.tool != Some(Tool::Kdrop) => {
                    eprintln!("xtask: bench: ({}) failed this round: {e:#}", v.key);
                    *failed.entry(v.key).or_default() += 1;
                    continue;
                }
                Err(e) => return Err(e.context(format!("variant ({})", v.key))),
            };
            log(round, v, &s);
            let next = measure(&baseline, &topo, o)?;
            log(round, &baseline, &next);
            s.ratio = s.pps / ((prev.pps + next.pps) / 2.0);
            s.ratio_cpu = s.pps_cpu / ((prev.pps_cpu + next.pps_cpu) / 2.0);
            samples.entry(v.key).or_default().push(s);
            samples.entry(baseline.key).or_default().push(next.clone());
            prev = next;
        }
    }
    drop(topo);
    print!(
        "{}",
        table(o, &machine, &others, &variants, &samples, &na, &failed)
    );
    Ok(())
}

fn log(round: usize, v: &Variant, s: &Sample) {
    let counters = s
        .stopped
        .as_ref()
        .and_then(|st| st.kdrop)
        .map(|[m, e, l, so]| format!("  matched {m} emitted {e} lost {l} sampled out {so}"))
        .unwrap_or_default();
    eprintln!(
        "xtask: bench: round {} ({}) {:>9.0} pps per flood CPU second, {:>9.0} pps{counters}",
        round + 1,
        v.key,
        s.pps_cpu,
        s.pps
    );
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

fn measure(v: &Variant, topo: &Topo, o: &Opts) -> Result<Sample> {
    let tracer = match v.tool {
        Some(_) => Some(Running::start(v, o.cpu)?),
        None => None,
    };
    let before = topo.dropped()?;
    let sent = topo.flood(o.secs, o.count, Some(o.cpu))?;
    let dropped = topo.dropped()? - before;
    let secs = sent.elapsed.as_secs_f64();
    let ready_ms = tracer.as_ref().map(|t| t.ready.as_secs_f64() * 1e3);
    let stopped = tracer.map(Running::stop).transpose()?;
    if let Some([m, e, l, s]) = stopped.as_ref().and_then(|s| s.kdrop) {
        // The kernel's own accounting, and (when it matches every drop)
        // against the independent count.
        anyhow::ensure!(
            m == e + l + s,
            "({}) matched {m} != emitted {e} + lost {l} + sampled out {s}",
            v.key
        );
        if v.key != "b" {
            anyhow::ensure!(
                m == dropped,
                "({}) kdrop matched {m}, the node's DROP rule counted {dropped}",
                v.key
            );
        }
    }
    Ok(Sample {
        pps_cpu: dropped as f64 / sent.cpu.as_secs_f64().max(1e-9),
        pps: dropped as f64 / secs,
        ratio_cpu: 1.0,
        ratio: 1.0,
        ready_ms,
        stopped,
        secs,
    })
}

/// (min, median, max).
fn spread(mut xs: Vec<f64>) -> Option<(f64, f64, f64)> {
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

fn table(
    o: &Opts,
    machine: &str,
    others: &[String],
    variants: &[Variant],
    samples: &BTreeMap<&str, Vec<Sample>>,
    na: &BTreeMap<&str, String>,
    failed: &BTreeMap<&str, usize>,
) -> String {
    let mut s = format!(
        "\nkdrop bench: {} rounds x {} s SYN flood through a veth, the node drops with iptables; {machine}\n\
         min/median/max over rounds; ratios are to the mean of the no-tracer runs right before and after\n",
        o.rounds, o.secs,
    );
    if !others.is_empty() {
        s.push_str(&format!(
            "note: attached to skb:kfree_skb by someone else during the run: {}\n",
            others.join("; ")
        ));
    }
    s.push_str(&format!(
        "\n{:<52} {:>24} {:>17} {:>20} {:>17}\n",
        "throughput", "pps per flood CPU s", "ratio", "pps (wall)", "ratio (wall)"
    ));
    let rows: Vec<(&Variant, &Vec<Sample>)> = variants
        .iter()
        .filter_map(|v| Some((v, samples.get(v.key)?)))
        .collect();
    let col = |xs: &[Sample], f: &dyn Fn(&Sample) -> Option<f64>| {
        spread(xs.iter().filter_map(f).collect())
    };
    let name = |v: &Variant| format!("({}) {}", v.key, v.label);
    for (v, xs) in &rows {
        s.push_str(&format!(
            "{:<52} {:>24} {:>17} {:>20} {:>17}\n",
            name(v),
            fmt3(col(xs, &|x| Some(x.pps_cpu)), kilo),
            fmt3(col(xs, &|x| Some(x.ratio_cpu)), |x| format!("{x:.2}")),
            fmt3(col(xs, &|x| Some(x.pps)), kilo),
            fmt3(col(xs, &|x| Some(x.ratio)), |x| format!("{x:.2}")),
        ));
    }
    for (key, n) in failed {
        s.push_str(&format!(
            "({key}) failed to run in {n} round(s): fewer samples above\n"
        ));
    }
    for (key, why) in na {
        if let Some(v) = variants.iter().find(|v| v.key == *key) {
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
        let st = |f: &dyn Fn(&Stopped, f64) -> Option<f64>| {
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
    s.push('\n');
    for (v, _) in rows.iter().filter(|(v, _)| v.tool == Some(Tool::Bpftrace)) {
        let prog = if v.key == "e1" {
            tools::BPFTRACE_COUNT
        } else {
            tools::BPFTRACE_PRINT
        };
        s.push_str(&format!("({}) bpftrace -e '{prog}'\n", v.key));
    }
    s
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
