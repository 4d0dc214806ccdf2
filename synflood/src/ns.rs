//! What every generator here shares: the namespace safety rail, pinning,
//! and the calling thread's CPU clock.
use std::{
    fs, io, os::fd::AsRawFd as _, os::unix::fs::MetadataExt as _, path::Path, time::Duration,
};

/// CPU time the calling thread has used (user + system, softirq work that
/// ran in its context included).
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Time the calling thread has spent runnable but waiting for a CPU
/// (/proc/thread-self/schedstat, second field; zero where the kernel keeps
/// no scheduler statistics).
pub fn thread_wait() -> Duration {
    fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

fn netns_inode(path: &Path) -> io::Result<u64> {
    Ok(fs::metadata(path)?.ino())
}

/// The initial namespace's inode number where the kernel fixes it
/// (`PROC_NET_INIT_INO` in include/linux/proc_ns.h; this 6.18 kernel does),
/// otherwise PID 1's when we may look at it (a sandbox may hide PID 1).
const PROC_NET_INIT_INO: u64 = 0xEFFF_FFF9;

/// Is the calling thread in a namespace created with `ip netns add` (named
/// under /run/netns) that is not the initial one?
pub fn in_own_namespace() -> io::Result<bool> {
    let here = netns_inode(Path::new("/proc/thread-self/ns/net"))?;
    let init = netns_inode(Path::new("/proc/1/ns/net")).ok();
    if here == PROC_NET_INIT_INO || Some(here) == init {
        return Ok(false);
    }
    let named = fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .any(|e| netns_inode(&e.path()).is_ok_and(|i| i == here))
        })
        .unwrap_or(false);
    Ok(named)
}

/// Moves the calling thread into the namespace at `netns` (a file such as
/// /run/netns/NAME), refuses to go on unless that is one created for it,
/// and pins the thread to `cpu`.
pub fn enter(netns: &Path, cpu: Option<usize>) -> io::Result<()> {
    let file = fs::File::open(netns)?;
    // SAFETY: setns on this thread only; the fd is valid for the call.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if !in_own_namespace()? {
        return Err(io::Error::other(format!(
            "refusing to send traffic outside a namespace created for it (/run/netns): {}",
            netns.display()
        )));
    }
    if let Some(cpu) = cpu {
        pin_to(cpu)?;
    }
    Ok(())
}

pub fn pin_to(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays within it for
    // cpu < CPU_SETSIZE, checked by the kernel's answer otherwise.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
