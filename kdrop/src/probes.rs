//! Loading the eBPF object and attaching each probe point by the best rung of
//! its ladder the kernel allows, remembering why the others were refused.
use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result};
use aya::{
    maps::{PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf},
    programs::{BtfTracePoint, FExit, KProbe, RawTracePoint, TracePoint},
    Btf as AyaBtf, Ebpf, EbpfLoader, Endianness,
};
use kdrop_common::{
    AggKey, Counters, FibLookupArgs, Filter, KfreeSkbArgs, MonitorConfig, Offsets, COUNTERS_KEY,
    EGRESS_COUNTERS_KEY,
};

use crate::{
    btf::{Btf, Kind},
    kernel,
    nfprobe::{self, NfSetup},
    UserError,
};

/// The eBPF object, built by build.rs and embedded.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/kdrop"));

/// Where kernel BTF comes from; `KDROP_BTF` points elsewhere (kernels without
/// /sys/kernel/btf, e.g. with a BTFHub file).
pub fn btf_path() -> PathBuf {
    std::env::var_os("KDROP_BTF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/kernel/btf/vmlinux"))
}

/// `KDROP_RUNG=tp_btf|raw_tp|tracepoint` restricts the drop path to one rung
/// (to test each rung on a kernel that offers several).
fn forced_rung() -> Result<Option<Rung>> {
    let Some(v) = std::env::var_os("KDROP_RUNG") else {
        return Ok(None);
    };
    let v = v.to_string_lossy();
    [Rung::TpBtf, Rung::RawTp, Rung::Tracepoint]
        .into_iter()
        .find(|r| r.to_string() == v)
        .map(Some)
        .ok_or_else(|| {
            UserError(format!(
                "KDROP_RUNG={v}: not a rung (tp_btf, raw_tp, tracepoint)"
            ))
            .into()
        })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    TpBtf,
    RawTp,
    Tracepoint,
    FExit,
    KRetProbe,
}

impl fmt::Display for Rung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rung::TpBtf => "tp_btf",
            Rung::RawTp => "raw_tp",
            Rung::Tracepoint => "tracepoint",
            Rung::FExit => "fexit",
            Rung::KRetProbe => "kretprobe",
        })
    }
}

/// What happened on one rung.
#[derive(Clone, Debug)]
pub enum Outcome {
    Attached,
    Refused(String),
    NotTried,
}

/// One probe point and its ladder, best rung first.
#[derive(Clone, Debug)]
pub struct ProbeReport {
    pub point: &'static str,
    pub what: &'static str,
    pub rungs: Vec<(Rung, Outcome)>,
}

impl ProbeReport {
    pub fn chosen(&self) -> Option<Rung> {
        self.rungs
            .iter()
            .find(|(_, o)| matches!(o, Outcome::Attached))
            .map(|(r, _)| *r)
    }
}

/// Everything read from the kernel before loading.
pub struct KernelSetup {
    pub btf_path: PathBuf,
    pub btf: Arc<Btf>,
    pub offsets: Offsets,
    pub reasons: kernel::Reasons,
    pub kfree_skb_args: Result<KfreeSkbArgs, String>,
    pub kfree_skb_fields: Result<KfreeSkbArgs, String>,
    pub fib_lookup_args: Result<FibLookupArgs, String>,
    /// Where struct nf_conn came from, or why conntrack cannot be read.
    pub conntrack: Result<String, String>,
    pub ct_names: kernel::CtNames,
    pub net_dev_queue: Result<(), String>,
    /// fexit needs the function in BTF and a trampoline for all its
    /// arguments (6 on 6.1, more on newer kernels: the load says).
    pub fib_validate_source: Result<(), String>,
    /// The netfilter functions whose verdicts kdrop records.
    pub nf: NfSetup,
}

impl KernelSetup {
    pub fn read() -> Result<Self> {
        let btf_path = btf_path();
        if !btf_path.exists() {
            return Err(UserError(format!(
                "no kernel BTF at {}: kdrop needs a kernel built with CONFIG_DEBUG_INFO_BTF=y, \
                 or KDROP_BTF=<file> pointing at this kernel's BTF",
                btf_path.display()
            ))
            .into());
        }
        let btf = Arc::new(Btf::from_file(&btf_path)?);
        let mut offsets =
            kernel::offsets(&btf).context("resolving kernel struct offsets from BTF")?;
        let conntrack = conntrack_offsets(&mut offsets, &btf);
        let ct_names = kernel::CtNames::from_btf(&btf);
        let reasons = kernel::Reasons::from_btf(&btf);
        let kfree_skb_args = kernel::kfree_skb_args(&btf, &reasons).map_err(|e| format!("{e:#}"));
        let kfree_skb_fields = kernel::kfree_skb_fields(&reasons).map_err(|e| format!("{e:#}"));
        let fib_lookup_args = kernel::fib_lookup_args(&btf, &offsets).map_err(|e| format!("{e:#}"));
        let net_dev_queue = kernel::net_dev_queue_args(&btf).map_err(|e| format!("{e:#}"));
        let fib_validate_source = btf
            .find("fib_validate_source", Kind::Func)
            .map(|_| ())
            .ok_or_else(|| "fib_validate_source is not in BTF (inlined or renamed?)".to_string());
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let nf = NfSetup::read(&btf, &release);
        Ok(Self {
            btf_path,
            btf,
            offsets,
            reasons,
            kfree_skb_args,
            kfree_skb_fields,
            fib_lookup_args,
            conntrack,
            ct_names,
            net_dev_queue,
            fib_validate_source,
            nf,
        })
    }
}

/// nf_conn offsets from vmlinux, or from the nf_conntrack module's BTF when
/// conntrack is a module (Debian kernels).
fn conntrack_offsets(offsets: &mut Offsets, vmlinux: &Arc<Btf>) -> Result<String, String> {
    if vmlinux.find("nf_conn", Kind::Struct).is_some() {
        return kernel::conntrack_offsets(offsets, vmlinux)
            .map(|()| "vmlinux BTF".into())
            .map_err(|e| format!("{e:#}"));
    }
    let module = Path::new("/sys/kernel/btf/nf_conntrack");
    if !module.exists() {
        return Err("nf_conntrack is not loaded (no struct nf_conn in BTF)".into());
    }
    let btf = Btf::from_file_split(module, vmlinux.clone()).map_err(|e| format!("{e:#}"))?;
    kernel::conntrack_offsets(offsets, &btf)
        .map(|()| format!("{} (module BTF)", module.display()))
        .map_err(|e| format!("{e:#}"))
}

/// Loaded programs and maps. Dropping it detaches and unloads everything.
pub struct Probes {
    pub ebpf: Ebpf,
    pub reports: Vec<ProbeReport>,
}

/// How a rung attaches its program.
enum Attach {
    TpBtf {
        prog: &'static str,
        tp: &'static str,
    },
    RawTp {
        prog: &'static str,
        tp: &'static str,
    },
    Tracepoint {
        prog: &'static str,
        category: &'static str,
        name: &'static str,
    },
    FExit {
        prog: &'static str,
        func: &'static str,
    },
    /// `entry`: a kprobe saving the arguments for the kretprobe.
    KRetProbe {
        prog: &'static str,
        func: &'static str,
        entry: Option<&'static str>,
    },
}

impl Attach {
    fn rung(&self) -> Rung {
        match self {
            Attach::TpBtf { .. } => Rung::TpBtf,
            Attach::RawTp { .. } => Rung::RawTp,
            Attach::Tracepoint { .. } => Rung::Tracepoint,
            Attach::FExit { .. } => Rung::FExit,
            Attach::KRetProbe { .. } => Rung::KRetProbe,
        }
    }
}

/// A probe point: its rungs best first, each with what it needs from the
/// kernel (`Err` says why that rung cannot even be tried).
struct Point<'a> {
    name: &'static str,
    what: &'static str,
    /// kdrop cannot work without it; other points degrade.
    required: bool,
    /// Evidence for live tracing only: `kdrop monitor` does not attach it.
    trace_only: bool,
    rungs: Vec<(Attach, Result<(), &'a str>)>,
}

fn points<'a>(setup: &'a KernelSetup, fields: &'a Result<KfreeSkbArgs, String>) -> Vec<Point<'a>> {
    let args = setup
        .kfree_skb_args
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str);
    let fields = fields.as_ref().map(|_| ()).map_err(String::as_str);
    let fib = setup
        .fib_lookup_args
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str);
    let fvs = setup
        .fib_validate_source
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str);
    let egress = setup
        .net_dev_queue
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str);
    vec![
        Point {
            name: "skb:kfree_skb",
            what: "drop path",
            required: true,
            trace_only: false,
            rungs: vec![
                (
                    Attach::TpBtf {
                        prog: "kfree_skb_btf",
                        tp: "kfree_skb",
                    },
                    args,
                ),
                (
                    Attach::RawTp {
                        prog: "kfree_skb_raw",
                        tp: "kfree_skb",
                    },
                    args,
                ),
                (
                    Attach::Tracepoint {
                        prog: "kfree_skb_tp",
                        category: "skb",
                        name: "kfree_skb",
                    },
                    fields,
                ),
            ],
        },
        Point {
            name: "fib:fib_table_lookup",
            what: "route lookups (reverse-path evidence)",
            required: false,
            trace_only: false,
            rungs: vec![
                (
                    Attach::TpBtf {
                        prog: "fib_table_lookup_btf",
                        tp: "fib_table_lookup",
                    },
                    fib,
                ),
                (
                    Attach::RawTp {
                        prog: "fib_table_lookup_raw",
                        tp: "fib_table_lookup",
                    },
                    fib,
                ),
                // The classic record carries computed fields, not the
                // pointers the program reads.
                (
                    Attach::Tracepoint {
                        prog: "",
                        category: "fib",
                        name: "fib_table_lookup",
                    },
                    Err("not implemented: its record has no flowi4/nexthop pointers"),
                ),
            ],
        },
        Point {
            name: "fib_validate_source (return)",
            what: "source validation result (reason on kernels without one)",
            required: false,
            trace_only: false,
            rungs: vec![
                (
                    Attach::FExit {
                        prog: "fib_validate_source_fexit",
                        func: "fib_validate_source",
                    },
                    fvs,
                ),
                (
                    Attach::KRetProbe {
                        prog: "fib_validate_source_kretprobe",
                        func: "fib_validate_source",
                        entry: Some("fib_validate_source_kprobe"),
                    },
                    Ok(()),
                ),
            ],
        },
        Point {
            name: "net:net_dev_queue",
            what: "handshake packets leaving devices (unanswered SYNs, NAT)",
            required: false,
            trace_only: false,
            rungs: vec![
                (
                    Attach::TpBtf {
                        prog: "net_dev_queue_btf",
                        tp: "net_dev_queue",
                    },
                    egress,
                ),
                (
                    Attach::RawTp {
                        prog: "net_dev_queue_raw",
                        tp: "net_dev_queue",
                    },
                    egress,
                ),
            ],
        },
    ]
    .into_iter()
    .chain(nf_points(&setup.nf))
    .collect()
}

/// Netfilter verdicts: fexit, else kretprobe (with a kprobe for the
/// arguments), per function.
fn nf_points(nf: &NfSetup) -> Vec<Point<'_>> {
    nfprobe::FUNCS
        .iter()
        .zip(&nf.funcs)
        .map(|(f, facts)| {
            let facts = facts.as_ref().map_err(String::as_str);
            let fexit = facts.and_then(|f| f.fexit.as_ref().map(|_| ()).map_err(String::as_str));
            Point {
                name: f.point,
                what: f.what,
                required: false,
                trace_only: true,
                rungs: vec![
                    (
                        Attach::FExit {
                            prog: f.fexit,
                            func: f.name,
                        },
                        fexit,
                    ),
                    (
                        Attach::KRetProbe {
                            prog: f.kretprobe,
                            func: f.name,
                            entry: Some(f.kprobe),
                        },
                        facts.map(|_| ()),
                    ),
                ],
            }
        })
        .collect()
}

const DROP_PATH: &str = "skb:kfree_skb";

/// `all_rungs`: try every rung (for `kdrop check`) instead of stopping at the
/// first that attaches.
pub fn load(
    setup: &KernelSetup,
    filter: &Filter,
    ring_kib: u32,
    all_rungs: bool,
) -> Result<Probes> {
    load_with(setup, filter, &MonitorConfig::zeroed(), ring_kib, all_rungs)
}

/// `load` with monitor mode's aggregation and cap.
pub fn load_with(
    setup: &KernelSetup,
    filter: &Filter,
    monitor: &MonitorConfig,
    ring_kib: u32,
    all_rungs: bool,
) -> Result<Probes> {
    let absent = KfreeSkbArgs::zeroed();
    let args = setup.kfree_skb_args.as_ref().unwrap_or(&absent);
    let no_fib = FibLookupArgs::zeroed();
    let fib = setup.fib_lookup_args.as_ref().unwrap_or(&no_fib);
    let aya_btf = AyaBtf::parse_file(&setup.btf_path, Endianness::default())
        .with_context(|| format!("parsing {}", setup.btf_path.display()))?;
    let load_object = |fields: &KfreeSkbArgs| -> Result<Ebpf> {
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&aya_btf))
            .override_global("OFFSETS", &setup.offsets, true)
            .override_global("KFREE_SKB_ARGS", args, true)
            .override_global("KFREE_SKB_FIELDS", fields, true)
            .override_global("FIB_ARGS", fib, true)
            .override_global("FILTER", filter, true)
            .override_global("MONITOR", monitor, true)
            .override_global("NF_PROBES", &setup.nf.probes, true)
            .map_max_entries("EVENTS", ring_kib * 1024)
            .load(OBJECT)
            .map_err(|e| anyhow::Error::new(e).context(memlock_hint()))
            .context("loading kdrop's eBPF object")?;
        if monitor.aggregate != 0 {
            insert_overflow_key(&mut ebpf)?;
        }
        Ok(ebpf)
    };
    let mut fields = setup.kfree_skb_fields.clone();
    let mut ebpf = load_object(fields.as_ref().unwrap_or(&absent))?;
    let forced = forced_rung()?;

    let mut reports = Vec::new();
    let n = points(setup, &fields).len();
    for i in 0..n {
        if monitor.aggregate != 0 && points(setup, &fields)[i].trace_only {
            continue;
        }
        let mut report = attach_ladder(
            &mut ebpf,
            &aya_btf,
            &points(setup, &fields)[i],
            all_rungs,
            forced,
        );
        let drop_path = report.point == DROP_PATH;
        if drop_path
            && report.chosen().is_none()
            && fields.is_err()
            && forced != Some(Rung::TpBtf)
            && forced != Some(Rung::RawTp)
        {
            // The last rung left needs the format file, and tracefs is not
            // mounted (no systemd, e.g. this project's VMs): mount it and
            // reload, the record offsets being load-time constants. The drop
            // path is the first point, so nothing is attached yet.
            let why = fields.clone().unwrap_err();
            fields = kernel::mount_tracefs()
                .and_then(|()| kernel::kfree_skb_fields(&setup.reasons))
                .map_err(|e| format!("{why}; {e:#}"));
            if let Ok(f) = &fields {
                ebpf = load_object(f)?;
                report = attach_ladder(
                    &mut ebpf,
                    &aya_btf,
                    &points(setup, &fields)[i],
                    all_rungs,
                    forced,
                );
            }
        }
        let point = &points(setup, &fields)[i];
        if report.chosen().is_none() {
            let why: Vec<String> = report
                .rungs
                .iter()
                .map(|(r, o)| format!("{r}: {}", outcome_text(o)))
                .collect();
            if point.required {
                anyhow::bail!("cannot attach to {} ({})", point.name, why.join("; "));
            }
            log::info!("no {} ({}): {}", point.what, point.name, why.join("; "));
        }
        reports.push(report);
    }
    Ok(Probes { ebpf, reports })
}

/// Monitor mode: the aggregation map's overflow key must exist before the
/// map can fill, i.e. before anything is attached.
fn insert_overflow_key(ebpf: &mut Ebpf) -> Result<()> {
    let mut agg = PerCpuHashMap::<_, AggKey, u64>::try_from(
        ebpf.map_mut("AGGREGATE").context("AGGREGATE map missing")?,
    )?;
    let n = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    let zeros = PerCpuValues::try_from(vec![0u64; n])?;
    agg.insert(AggKey::OVERFLOW, zeros, 0)
        .context("inserting the aggregation overflow key")
}

fn attach_ladder(
    ebpf: &mut Ebpf,
    btf: &AyaBtf,
    point: &Point,
    all_rungs: bool,
    forced: Option<Rung>,
) -> ProbeReport {
    let mut report = ProbeReport {
        point: point.name,
        what: point.what,
        rungs: Vec::new(),
    };
    for (attach, ready) in &point.rungs {
        let rung = attach.rung();
        if let Some(f) = forced.filter(|f| point.name == DROP_PATH && *f != rung) {
            report
                .rungs
                .push((rung, Outcome::Refused(format!("KDROP_RUNG={f} set"))));
            continue;
        }
        if report.chosen().is_some() && !all_rungs {
            report.rungs.push((rung, Outcome::NotTried));
            continue;
        }
        let result = match ready {
            Err(why) => Err(anyhow::anyhow!("{why}")),
            Ok(()) => attach_one(ebpf, btf, attach),
        };
        let outcome = match result {
            Ok(()) => Outcome::Attached,
            Err(e) => Outcome::Refused(short_error(&e)),
        };
        report.rungs.push((rung, outcome));
    }
    report
}

fn attach_one(ebpf: &mut Ebpf, btf: &AyaBtf, attach: &Attach) -> Result<()> {
    match *attach {
        Attach::TpBtf { prog, tp } => {
            let p: &mut BtfTracePoint = program(ebpf, prog)?;
            p.load(tp, btf)?;
            p.attach()?;
        }
        Attach::RawTp { prog, tp } => {
            let p: &mut RawTracePoint = program(ebpf, prog)?;
            p.load()?;
            p.attach(tp)?;
        }
        Attach::Tracepoint {
            prog,
            category,
            name,
        } => {
            let p: &mut TracePoint = program(ebpf, prog)?;
            p.load()?;
            p.attach(category, name)?;
        }
        Attach::FExit { prog, func } => {
            let p: &mut FExit = program(ebpf, prog)?;
            p.load(func, btf)?;
            p.attach()?;
        }
        Attach::KRetProbe { prog, func, entry } => {
            // Before loading: a kernel without kprobes (this CI host) would
            // verify the program only to refuse the attach, and keep it.
            let pmu = Path::new("/sys/bus/event_source/devices/kprobe/type");
            if !pmu.exists() {
                anyhow::bail!("no kprobes in this kernel ({} is missing)", pmu.display());
            }
            // The kretprobe first: a call entered between the two attaches
            // must not leave saved arguments that nothing pops.
            let p: &mut KProbe = program(ebpf, prog)?;
            p.load()?;
            let ret = p.attach(func, 0)?;
            if let Some(entry) = entry {
                let attached = program::<KProbe>(ebpf, entry).and_then(|k| {
                    k.load()?;
                    k.attach(func, 0)?;
                    Ok(())
                });
                if let Err(e) = attached {
                    let _ = program::<KProbe>(ebpf, prog)?.detach(ret);
                    return Err(e.context(format!("kprobe {entry}")));
                }
            }
        }
    }
    Ok(())
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))?;
    Ok(p.try_into()?)
}

/// First line of an error chain: verifier logs can run to thousands of lines.
/// A verifier log's last line says what it refused (its first lines are
/// often notes), so that one is kept too.
fn short_error(e: &anyhow::Error) -> String {
    let s = format!("{e:#}");
    let mut lines = s.lines().filter(|l| !l.trim().is_empty());
    let first: String = lines.next().unwrap_or("").chars().take(240).collect();
    if s.lines().count() > 1 {
        log::debug!("{s}");
    }
    // The log ends with the instruction count; the refusal is just before.
    let last: Vec<&str> = lines
        .filter(|l| {
            !["processed ", "verification time", "stack depth", ": "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    match last.last() {
        Some(l) if s.contains("Verifier output") => {
            format!("{first} ... {}", l.chars().take(160).collect::<String>())
        }
        _ => first,
    }
}

pub fn outcome_text(o: &Outcome) -> String {
    match o {
        Outcome::Attached => "attached".into(),
        Outcome::Refused(why) => format!("refused: {why}"),
        Outcome::NotTried => "not tried (a better rung attached)".into(),
    }
}

impl Probes {
    pub fn take_events(&mut self) -> Result<RingBuf<aya::maps::MapData>> {
        let map = self.ebpf.take_map("EVENTS").context("EVENTS map missing")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Drop counters summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        self.counters_at(COUNTERS_KEY)
    }

    /// Egress handshake packet counters summed over CPUs.
    pub fn egress_counters(&self) -> Result<Counters> {
        self.counters_at(EGRESS_COUNTERS_KEY)
    }

    /// Netfilter verdict record counters summed over CPUs.
    pub fn verdict_counters(&self) -> Result<Counters> {
        self.counters_at(kdrop_common::NF_VERDICT_COUNTERS_KEY)
    }

    fn counters_at(&self, key: u32) -> Result<Counters> {
        let map = self.ebpf.map("COUNTERS").context("COUNTERS map missing")?;
        let arr = PerCpuArray::<_, Counters>::try_from(map)?;
        let mut sum = Counters::default();
        for c in arr.get(&key, 0)?.iter() {
            sum.matched += c.matched;
            sum.emitted += c.emitted;
            sum.lost += c.lost;
            sum.sampled_out += c.sampled_out;
            sum.capped += c.capped;
        }
        Ok(sum)
    }

    /// Monitor mode's per-key drop counts, summed over CPUs.
    pub fn aggregate(&self) -> Result<Vec<(AggKey, u64)>> {
        let map = self
            .ebpf
            .map("AGGREGATE")
            .context("AGGREGATE map missing")?;
        let agg = PerCpuHashMap::<_, AggKey, u64>::try_from(map)?;
        let mut out = Vec::new();
        for item in agg.iter() {
            // A key deleted mid-walk is skipped; nothing deletes here.
            let Ok((k, v)) = item else { continue };
            out.push((k, v.iter().sum()));
        }
        Ok(out)
    }

    /// `fib_validate_source (return), the source validation result: fexit
    /// refused: ...; kretprobe refused: ...` for each point that did not attach.
    pub fn missing(&self) -> Vec<String> {
        self.reports
            .iter()
            .filter(|r| r.chosen().is_none())
            .map(|r| {
                let why: Vec<String> = r
                    .rungs
                    .iter()
                    .map(|(rung, o)| format!("{rung} {}", outcome_text(o)))
                    .collect();
                format!("{} ({}): {}", r.point, r.what, why.join("; "))
            })
            .collect()
    }

    /// `skb:kfree_skb via tp_btf, ...`: the points that attached.
    pub fn describe(&self) -> String {
        self.reports
            .iter()
            .filter_map(|r| Some(format!("{} via {}", r.point, r.chosen()?)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks the effective capabilities (/proc/self/status) before touching BPF.
/// Loading and attaching needs CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN); naming
/// interfaces in other namespaces needs setns, i.e. CAP_SYS_ADMIN: without it
/// kdrop still traces, and says what it cannot do.
pub fn check_privileges() -> Result<Vec<String>, UserError> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |c: u32| eff & (1 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        return Err(UserError(
            "needs root, or CAP_BPF and CAP_PERFMON, to load its eBPF programs \
             (try: sudo kdrop ...)"
                .into(),
        ));
    }
    let mut warnings = Vec::new();
    if !has(CAP_SYS_ADMIN) {
        warnings.push(
            "no CAP_SYS_ADMIN: interfaces in other network namespaces are shown by index".into(),
        );
    }
    if !has(CAP_NET_ADMIN) {
        warnings.push("no CAP_NET_ADMIN: routing and netfilter context is unavailable".into());
    }
    Ok(warnings)
}

/// Why map creation may fail for a process that is not root: kernels before
/// 5.11 charge BPF maps to RLIMIT_MEMLOCK, not to the memory cgroup (the
/// memcg accounting series, Linux 5.11), and raising the limit takes
/// CAP_SYS_RESOURCE. Seen on Debian's 5.10: EPERM creating `EVENTS`.
fn memlock_hint() -> String {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    if !ok || r.rlim_cur == libc::RLIM_INFINITY {
        return "creating maps and programs".into();
    }
    format!(
        "creating maps and programs with RLIMIT_MEMLOCK at {} KiB (kernels before 5.11 \
         charge BPF maps to it: give kdrop CAP_SYS_RESOURCE or a higher limit, e.g. `ulimit -l \
         unlimited`)",
        r.rlim_cur / 1024
    )
}
