//! Loading kdrop's eBPF object with the kernel's facts as globals, then
//! attaching every point by its ladder.
use anyhow::{Context as _, Result};
use aya::{
    maps::{PerCpuHashMap, PerCpuValues},
    Btf as AyaBtf, Ebpf, EbpfLoader, Endianness,
};

use kdrop_common::{AggKey, FibLookupArgs, Filter, KfreeSkbArgs, MonitorConfig};

use super::{
    attach::attach_ladder,
    ladder::{forced_rung, outcome_text, points, Rung, DROP_PATH},
    setup::KernelSetup,
    Probes,
};

use crate::kernel::tracefs;

/// The eBPF object, built by build.rs and embedded.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/kdrop"));
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
            fields = tracefs::mount_tracefs()
                .and_then(|()| tracefs::kfree_skb_fields(&setup.reasons))
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
