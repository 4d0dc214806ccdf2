//! Loading kdrop's eBPF object with the kernel's facts as globals, then
//! attaching every point by its ladder.
use anyhow::{Context as _, Result};
use aya::{
    maps::{PerCpuHashMap, PerCpuValues},
    Btf as AyaBtf, Ebpf, Endianness,
};

use kdrop_common::{AggKey, Evidence, FibLookupArgs, Filter, KfreeSkbArgs, MonitorConfig};

use super::{
    arm::PointState,
    attach::{attach_ladder, btf_lookup},
    ladder::{forced_rung, outcome_text, points, Rung, DROP_PATH},
    setup::KernelSetup,
    verify::verify_ahead,
    Probes,
};

use crate::kernel::{btf::Kind, tracefs};

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
    let aya_btf = attach_btf(setup, &setup.kfree_skb_fields)?;
    let load_object = |fields: &KfreeSkbArgs| -> Result<Ebpf> {
        // The loader reads its BTF only to apply the object's CO-RE
        // relocations (aya-0.14.0/src/bpf.rs:495-496), and kdrop's object
        // has none (`object_has_no_core_relocations`): the skeleton serves.
        let mut ebpf = setup
            .loader
            .take()
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
    let all = points(setup, &fields);
    let wanted: Vec<_> = all
        .iter()
        .filter(|p| cfg.monitor.aggregate == 0 || !p.trace_only)
        .collect();
    verify_ahead(&mut ebpf, &aya_btf, &wanted, forced);

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

/// The BTF aya is given to load the programs: a skeleton of vmlinux's
/// (`kdrop_core::kernel::btf::skeleton`) with just the types its attach
/// lookups ask for (`btf_lookup`, over every rung of the ladder), at the
/// ids kdrop's own parse of the same file found. aya parsing the whole file
/// again cost ~60 ms of each start; the skeleton, a few.
fn attach_btf(setup: &KernelSetup, fields: &Result<KfreeSkbArgs, String>) -> Result<AyaBtf> {
    let wanted: Vec<(String, Kind)> = points(setup, fields)
        .iter()
        .flat_map(|p| &p.rungs)
        .filter_map(|(attach, _)| btf_lookup(attach))
        .collect();
    let wanted: Vec<(&str, Kind)> = wanted.iter().map(|(n, k)| (n.as_str(), *k)).collect();
    AyaBtf::parse(&setup.btf.skeleton_of(&wanted), Endianness::default())
        .with_context(|| format!("parsing the skeleton of {}", setup.btf_path.display()))
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

#[cfg(test)]
mod tests {
    use aya_obj::btf::BtfKind;
    use kdrop_core::kernel::btf::skeleton;

    use super::*;

    /// `load_object` hands aya the skeleton, against which no CO-RE
    /// relocation could be applied: the object must have none
    /// (`.BTF.ext`'s core_relo_len, after func_info and line_info, is 0).
    #[test]
    fn object_has_no_core_relocations() {
        let ext = elf_section(OBJECT, ".BTF.ext").expect("no .BTF.ext in kdrop's object");
        let u32_at = |o: usize| u32::from_le_bytes(ext[o..o + 4].try_into().unwrap());
        assert_eq!(
            u16::from_le_bytes([ext[0], ext[1]]),
            0xeb9f,
            "BTF.ext magic"
        );
        let hdr_len = u32_at(4);
        assert!(
            hdr_len < 32 || u32_at(28) == 0,
            "CO-RE relocations in the object"
        );
    }

    /// A section of a little-endian ELF64 file, by name.
    fn elf_section<'a>(elf: &'a [u8], name: &str) -> Option<&'a [u8]> {
        let u16_at = |o: usize| usize::from(u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()));
        let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
        let (shoff, shentsize, shnum, shstrndx) =
            (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
        let header = |i: usize| shoff + i * shentsize;
        let body = |i: usize| &elf[u64_at(header(i) + 24)..][..u64_at(header(i) + 32)];
        let names = body(shstrndx);
        (0..shnum)
            .find(|&i| {
                let n = &names[u32_at(header(i))..];
                n.starts_with(name.as_bytes()) && n.get(name.len()) == Some(&0)
            })
            .map(body)
    }

    /// aya finds each type of a skeleton at the id it was put at.
    #[test]
    fn aya_finds_skeleton_types_at_their_ids() {
        let blob = skeleton(&[
            (70_000, Kind::Func, "nft_do_chain"),
            (7, Kind::Typedef, "btf_trace_kfree_skb"),
            (8, Kind::Func, "fib_validate_source"),
        ]);
        let btf = AyaBtf::parse(&blob, Endianness::default()).unwrap();
        let id = |n: &str, k| btf.id_by_type_name_kind(n, k).ok();
        assert_eq!(id("btf_trace_kfree_skb", BtfKind::Typedef), Some(7));
        assert_eq!(id("fib_validate_source", BtfKind::Func), Some(8));
        assert_eq!(id("nft_do_chain", BtfKind::Func), Some(70_000));
        assert_eq!(id("fib_validate_source", BtfKind::Typedef), None);
    }

    /// On a host with vmlinux BTF: the skeleton kdrop builds from its own
    /// parse gives aya the ids aya's parse of the whole file does.
    #[test]
    fn skeleton_ids_match_the_kernels() {
        let path = std::path::Path::new("/sys/kernel/btf/vmlinux");
        let Ok(ours) = crate::kernel::btf_file::read(path) else {
            // Said, not silent: a host without BTF cannot run kdrop at all.
            eprintln!("SKIP skeleton_ids_match_the_kernels: no {}", path.display());
            return;
        };
        let whole = AyaBtf::parse_file(path, Endianness::default()).unwrap();
        let wanted = [
            ("btf_trace_kfree_skb", Kind::Typedef, BtfKind::Typedef),
            ("btf_trace_net_dev_queue", Kind::Typedef, BtfKind::Typedef),
            ("fib_validate_source", Kind::Func, BtfKind::Func),
            ("nf_hook_slow", Kind::Func, BtfKind::Func),
        ];
        let names: Vec<(&str, Kind)> = wanted.iter().map(|&(n, k, _)| (n, k)).collect();
        let sk = AyaBtf::parse(&ours.skeleton_of(&names), Endianness::default()).unwrap();
        for (name, _, kind) in wanted {
            assert_eq!(
                sk.id_by_type_name_kind(name, kind).ok(),
                whole.id_by_type_name_kind(name, kind).ok(),
                "{name}"
            );
        }
    }
}
