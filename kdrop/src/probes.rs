//! Loading the eBPF object and attaching each probe point by the best rung of
//! its ladder the kernel allows, remembering why the others were refused.
use std::{fmt, path::PathBuf};

use anyhow::{Context as _, Result};
use aya::{
    maps::{PerCpuArray, RingBuf},
    programs::{BtfTracePoint, RawTracePoint, TracePoint},
    Btf as AyaBtf, Ebpf, EbpfLoader, Endianness,
};
use kdrop_common::{Counters, Filter, KfreeSkbArgs, Offsets, COUNTERS_KEY};

use crate::{btf::Btf, kernel, UserError};

/// The eBPF object, built by build.rs and embedded.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/kdrop"));

/// Where kernel BTF comes from; `KDROP_BTF` points elsewhere (kernels without
/// /sys/kernel/btf, e.g. with a BTFHub file).
pub fn btf_path() -> PathBuf {
    std::env::var_os("KDROP_BTF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/kernel/btf/vmlinux"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    TpBtf,
    RawTp,
    Tracepoint,
}

impl fmt::Display for Rung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rung::TpBtf => "tp_btf",
            Rung::RawTp => "raw_tp",
            Rung::Tracepoint => "tracepoint",
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
    pub btf: Btf,
    pub offsets: Offsets,
    pub reasons: kernel::Reasons,
    pub kfree_skb_args: Result<KfreeSkbArgs, String>,
    pub kfree_skb_fields: Result<KfreeSkbArgs, String>,
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
        let btf = Btf::from_file(&btf_path)?;
        let offsets = kernel::offsets(&btf).context("resolving kernel struct offsets from BTF")?;
        let reasons = kernel::Reasons::from_btf(&btf);
        let kfree_skb_args = kernel::kfree_skb_args(&btf, &reasons).map_err(|e| format!("{e:#}"));
        let kfree_skb_fields = kernel::kfree_skb_fields(&reasons).map_err(|e| format!("{e:#}"));
        Ok(Self {
            btf_path,
            btf,
            offsets,
            reasons,
            kfree_skb_args,
            kfree_skb_fields,
        })
    }
}

/// Loaded programs and maps. Dropping it detaches and unloads everything.
pub struct Probes {
    pub ebpf: Ebpf,
    pub reports: Vec<ProbeReport>,
}

/// `all_rungs`: try every rung (for `kdrop check`) instead of stopping at the
/// first that attaches.
pub fn load(
    setup: &KernelSetup,
    filter: &Filter,
    ring_kib: u32,
    all_rungs: bool,
) -> Result<Probes> {
    let absent = KfreeSkbArgs::zeroed();
    let args = setup.kfree_skb_args.as_ref().unwrap_or(&absent);
    let fields = setup.kfree_skb_fields.as_ref().unwrap_or(&absent);
    let aya_btf = AyaBtf::parse_file(&setup.btf_path, Endianness::default())
        .with_context(|| format!("parsing {}", setup.btf_path.display()))?;
    let mut ebpf = EbpfLoader::new()
        .btf(Some(&aya_btf))
        .override_global("OFFSETS", &setup.offsets, true)
        .override_global("KFREE_SKB_ARGS", args, true)
        .override_global("KFREE_SKB_FIELDS", fields, true)
        .override_global("FILTER", filter, true)
        .map_max_entries("EVENTS", ring_kib * 1024)
        .load(OBJECT)
        .context("loading kdrop's eBPF object")?;

    let mut report = ProbeReport {
        point: "skb:kfree_skb",
        what: "drop path",
        rungs: Vec::new(),
    };
    for rung in [Rung::TpBtf, Rung::RawTp, Rung::Tracepoint] {
        if report.chosen().is_some() && !all_rungs {
            report.rungs.push((rung, Outcome::NotTried));
            continue;
        }
        let outcome = match attach_kfree_skb(&mut ebpf, rung, setup, &aya_btf) {
            Ok(()) => Outcome::Attached,
            Err(e) => Outcome::Refused(short_error(&e)),
        };
        report.rungs.push((rung, outcome));
    }
    if report.chosen().is_none() {
        let why: Vec<String> = report
            .rungs
            .iter()
            .map(|(r, o)| format!("{r}: {}", outcome_text(o)))
            .collect();
        anyhow::bail!("cannot attach to skb:kfree_skb ({})", why.join("; "));
    }
    Ok(Probes {
        ebpf,
        reports: vec![report],
    })
}

fn attach_kfree_skb(ebpf: &mut Ebpf, rung: Rung, setup: &KernelSetup, btf: &AyaBtf) -> Result<()> {
    match rung {
        Rung::TpBtf => {
            setup
                .kfree_skb_args
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let p: &mut BtfTracePoint = program(ebpf, "kfree_skb_btf")?;
            p.load("kfree_skb", btf)?;
            p.attach()?;
        }
        Rung::RawTp => {
            setup
                .kfree_skb_args
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let p: &mut RawTracePoint = program(ebpf, "kfree_skb_raw")?;
            p.load()?;
            p.attach("kfree_skb")?;
        }
        Rung::Tracepoint => {
            setup
                .kfree_skb_fields
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let p: &mut TracePoint = program(ebpf, "kfree_skb_tp")?;
            p.load()?;
            p.attach("skb", "kfree_skb")?;
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
fn short_error(e: &anyhow::Error) -> String {
    let s = format!("{e:#}");
    let first = s.lines().next().unwrap_or("").to_string();
    if s.lines().count() > 1 {
        log::debug!("{s}");
    }
    first.chars().take(240).collect()
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

    /// Counters summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        let map = self.ebpf.map("COUNTERS").context("COUNTERS map missing")?;
        let arr = PerCpuArray::<_, Counters>::try_from(map)?;
        let mut sum = Counters::default();
        for c in arr.get(&COUNTERS_KEY, 0)?.iter() {
            sum.matched += c.matched;
            sum.emitted += c.emitted;
            sum.lost += c.lost;
            sum.sampled_out += c.sampled_out;
        }
        Ok(sum)
    }

    /// `kfree_skb via tp_btf`
    pub fn describe(&self) -> String {
        self.reports
            .iter()
            .map(|r| {
                let rung = r.chosen().map_or("none".into(), |r| r.to_string());
                format!("{} via {rung}", r.point)
            })
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
