//! Run-time statistics of BPF programs: how long each call takes.
//!
//! Enabled with the BPF_ENABLE_STATS command, whose effect lasts only while
//! its fd is open: the kernel turns the statistics off again when the bench
//! ends, even if it crashes (unlike the kernel.bpf_stats_enabled sysctl).
use std::os::fd::{FromRawFd as _, OwnedFd};

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
