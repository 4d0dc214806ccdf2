//! What the process sets up first, before any thread exists: the
//! capabilities its file grants made effective, and the locked-memory limit
//! kernels before 5.11 charge BPF maps to.
//!
//! The image's binary carries its capabilities as *permitted* only
//! (`setcap ...=p`, `cargo xtask image`): with the effective bit, exec fails
//! (EPERM) when the container's bounding set lacks one of them
//! (security/commoncap.c, `bprm_caps_from_vfs_caps`: "insufficient to
//! execute correctly", returned only for a file with the effective bit;
//! seen on this host's 6.18, whose root lacks SYS_RESOURCE), so the file
//! could not carry CAP_SYS_RESOURCE for the nodes that need it without
//! breaking every pod that is not granted it. Without the bit, the kernel
//! keeps what the bounding set allows and kdrop raises it itself.

/// `_LINUX_CAPABILITY_VERSION_3` (include/uapi/linux/capability.h, since
/// 2.6.26): two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// include/uapi/linux/capability.h.
const CAP_SYS_RESOURCE: u32 = 24;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// What `raise` did, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Raised {
    /// Capabilities (bits) made effective that were only permitted.
    pub capabilities: u64,
    /// RLIMIT_MEMLOCK's soft limit before and after, when it changed.
    pub memlock: Option<(u64, u64)>,
}

/// Makes the permitted capabilities effective, then lifts RLIMIT_MEMLOCK
/// as far as they allow. Call before any thread starts: capabilities are
/// per thread, and threads inherit the caller's. Failures are left to the
/// checks that follow (`probes::check_privileges`, the loader's hint).
pub fn raise() -> Raised {
    let mut raised = Raised::default();
    if let Some(mut data) = capget() {
        let missing = |d: &[CapData; 2]| {
            u64::from(d[0].permitted & !d[0].effective)
                | u64::from(d[1].permitted & !d[1].effective) << 32
        };
        let wanted = missing(&data);
        if wanted != 0 {
            for d in &mut data {
                d.effective |= d.permitted;
            }
            if capset(&data) {
                raised.capabilities = wanted;
            }
        }
    }
    raised.memlock = raise_memlock(has_effective(CAP_SYS_RESOURCE));
    raised
}

fn capget() -> Option<[CapData; 2]> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget(2) writes two CapData for version 3 into `data`.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    (r == 0).then_some(data)
}

fn capset(data: &[CapData; 2]) -> bool {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset(2) reads two CapData for version 3 from `data`.
    unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) == 0 }
}

fn has_effective(cap: u32) -> bool {
    capget().is_some_and(|d| d[(cap / 32) as usize].effective & (1 << (cap % 32)) != 0)
}

/// Lifts RLIMIT_MEMLOCK's soft limit to unlimited (with CAP_SYS_RESOURCE)
/// or to the hard limit. Kernels before 5.11 charge BPF maps and programs
/// to it (the memcg accounting series, 5.11), and a container's default is
/// 64 KiB; later kernels ignore it, and raising it costs nothing. Returns
/// the soft limit before and after, when it changed.
fn raise_memlock(sys_resource: bool) -> Option<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    let before = r.rlim_cur;
    let want = if sys_resource {
        libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        }
    } else {
        libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        }
    };
    if want.rlim_cur == before && want.rlim_max == r.rlim_max {
        return None;
    }
    // SAFETY: setrlimit reads the struct it is given.
    (unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &want) } == 0)
        .then_some((before, want.rlim_cur))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test process's own sets, read back as /proc says them: capget
    /// speaks version 3 and its words are laid out as the kernel's.
    #[test]
    fn capget_agrees_with_proc_status() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let field = |k: &str| {
            let v = status.lines().find_map(|l| l.strip_prefix(k)).unwrap();
            u64::from_str_radix(v.trim(), 16).unwrap()
        };
        let d = capget().expect("capget");
        let word = |f: fn(&CapData) -> u32| u64::from(f(&d[0])) | u64::from(f(&d[1])) << 32;
        assert_eq!(word(|c| c.effective), field("CapEff:"));
        assert_eq!(word(|c| c.permitted), field("CapPrm:"));
        assert_eq!(word(|c| c.inheritable), field("CapInh:"));
    }
}
