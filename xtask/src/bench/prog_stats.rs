//! Run-time statistics of BPF programs: how long each call takes.
//!
//! Enabled with the BPF_ENABLE_STATS command, whose effect lasts only while
//! its fd is open: the kernel turns the statistics off again when the bench
//! ends, even if it crashes (unlike the kernel.bpf_stats_enabled sysctl).
use std::{
    collections::BTreeMap,
    os::fd::{FromRawFd as _, OwnedFd},
};

use anyhow::{bail, Result};

/// `enum bpf_cmd` value (include/uapi/linux/bpf.h, since Linux 5.8).
const BPF_ENABLE_STATS: libc::c_long = 32;
/// `enum bpf_stats_type`: BPF_STATS_RUN_TIME.
const BPF_STATS_RUN_TIME: u32 = 0;

/// Keeps the statistics on until dropped.
pub fn enable() -> Result<OwnedFd> {
    // `union bpf_attr`'s enable_stats member is one u32; the kernel wants
    // the rest of the union zeroed.
    let attr = [BPF_STATS_RUN_TIME, 0, 0, 0];
    // SAFETY: bpf(2) reads `size_of_val(&attr)` bytes from attr.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ENABLE_STATS,
            attr.as_ptr(),
            size_of_val(&attr) as u32,
        )
    };
    if fd < 0 {
        bail!(
            "enabling BPF run-time statistics: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Mean nanoseconds per call over the BPF programs process `pid` holds
/// (from /proc/<pid>/fdinfo); `None` when they never ran or stats are off.
pub fn ns_per_call(pid: u32) -> Option<f64> {
    let (mut ns, mut calls) = (0u64, 0u64);
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .ok()?
        .flatten()
    {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        // A link's fdinfo names its program too: count programs once.
        if field("link_id:").is_some() {
            continue;
        }
        if let (Some(t), Some(c)) = (field("run_time_ns:"), field("run_cnt:")) {
            ns += t;
            calls += c;
        }
    }
    (calls > 0).then(|| ns as f64 / calls as f64)
}

/// Run count and run time (ns) of each BPF program `pid` holds, by
/// program id (from /proc/<pid>/fdinfo; both stay 0 while the statistics
/// are off).
pub fn snapshot(pid: u32) -> BTreeMap<u32, (u64, u64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if field("link_id:").is_some() {
            continue;
        }
        if let (Some(id), Some(c), Some(t)) =
            (field("prog_id:"), field("run_cnt:"), field("run_time_ns:"))
        {
            out.insert(id as u32, (c, t));
        }
    }
    out
}

/// What one program did between two snapshots.
#[derive(Clone, Debug)]
pub struct ProgRuns {
    pub name: String,
    pub runs: u64,
    pub ns: u64,
}

/// Programs that ran between `before` and `after`, named as bpftool names
/// them (the kernel keeps the first 15 bytes of the name).
pub fn ran(before: &BTreeMap<u32, (u64, u64)>, after: &BTreeMap<u32, (u64, u64)>) -> Vec<ProgRuns> {
    let names = names();
    let mut out: Vec<ProgRuns> = after
        .iter()
        .map(|(id, (c, t))| {
            let (c0, t0) = before.get(id).copied().unwrap_or((0, 0));
            ProgRuns {
                name: names
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| format!("prog {id}")),
                runs: c.saturating_sub(c0),
                ns: t.saturating_sub(t0),
            }
        })
        .filter(|p| p.runs > 0)
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn names() -> BTreeMap<u32, String> {
    let Ok(out) = super::topo::sh("bpftool", &["-j", "prog", "show"]) else {
        return BTreeMap::new();
    };
    let Ok(serde_json::Value::Array(progs)) = serde_json::from_str(&out) else {
        return BTreeMap::new();
    };
    progs
        .iter()
        .filter_map(|p| {
            Some((
                u32::try_from(p.get("id")?.as_u64()?).ok()?,
                p.get("name")?.as_str()?.to_string(),
            ))
        })
        .collect()
}
