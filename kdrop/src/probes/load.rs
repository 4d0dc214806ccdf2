//! Loading kdrop's eBPF object with the kernel's facts as globals, then
//! attaching every point by its ladder.
use anyhow::{Context as _, Result};
use aya::{
    maps::{PerCpuHashMap, PerCpuValues},
    Btf as AyaBtf, Ebpf, EbpfLoader, Endianness,
};

use kdrop_common::{AggKey, Evidence, FibLookupArgs, Filter, KfreeSkbArgs, MonitorConfig};

use super::{
    arm::PointState,
    attach::attach_ladder,
    ladder::{forced_rung, outcome_text, points, Rung, DROP_PATH},
    setup::KernelSetup,
    Probes,
};

use crate::kernel::tracefs;

/// The eBPF object, built by build.rs and embedded.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/kdrop"));

/// How to load: the filter and settings the programs get as globals.
pub struct Config<'a> {
    pub filter: &'a Filter,
    /// Monitor mode's aggregation and cap (zeroed: live tracing).
    pub monitor: &'a MonitorConfig,
    /// Which drops carry route lookups.
    pub evidence: &'a Evidence,
    pub ring_kib: u32,
    /// Try every rung (`kdrop check`) instead of stopping at the first that
    /// attaches; on-demand points then stay attached.
    pub all_rungs: bool,
}

/// Loads the object and attaches every point by its ladder. On-demand
/// points are attached once (so a rung that would be refused is known
/// now) and detached again until armed.
pub fn load(setup: &KernelSetup, cfg: &Config) -> Result<Probes> {
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
            .override_global("RETRANS_ARGS", &setup.sockets.args, true)
            .override_global("FILTER", cfg.filter, true)
            .override_global("MONITOR", cfg.monitor, true)
            .override_global("EVIDENCE", cfg.evidence, true)
            .override_global("NF_PROBES", &setup.nf.probes, true)
            .map_max_entries("EVENTS", cfg.ring_kib * 1024)
            .load(OBJECT)
            .map_err(|e| anyhow::Error::new(e).context(memlock_hint()))
            .context("loading kdrop's eBPF object")?;
        if cfg.monitor.aggregate != 0 {
            insert_overflow_key(&mut ebpf)?;
        }
        Ok(ebpf)
    };
    let mut fields = setup.kfree_skb_fields.clone();
    let mut ebpf = load_object(fields.as_ref().unwrap_or(&absent))?;
    let forced = forced_rung()?;

    let mut reports = Vec::new();
    let mut states = Vec::new();
    let n = points(setup, &fields).len();
    for i in 0..n {
        if cfg.monitor.aggregate != 0 && points(setup, &fields)[i].trace_only {
            continue;
        }
        let (mut report, mut chosen) = attach_ladder(
            &mut ebpf,
            &aya_btf,
            &points(setup, &fields)[i],
            cfg.all_rungs,
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
            fields = tracefs::mount_tracefs()
                .and_then(|()| tracefs::kfree_skb_fields(&setup.reasons))
                .map_err(|e| format!("{why}; {e:#}"));
            if let Ok(f) = &fields {
                ebpf = load_object(f)?;
                (report, chosen) = attach_ladder(
                    &mut ebpf,
                    &aya_btf,
                    &points(setup, &fields)[i],
                    cfg.all_rungs,
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
        let mut state = PointState::new(point.name, point.demand, chosen);
        if point.demand.is_some() && !cfg.all_rungs {
            state.disarm(&mut ebpf)?;
        }
        reports.push(report);
        states.push(state);
    }
    Ok(Probes {
        ebpf,
        reports,
        points: states,
    })
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
