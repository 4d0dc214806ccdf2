//! What a process holds in the kernel: BPF objects, descriptors, memory.
use std::{process::Command, time::Duration};

/// BPF objects a process holds, from /proc/<pid>/fdinfo: ("prog", id),
/// ("link", id), ("map", id).
pub fn bpf_objects_of(pid: u32) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    let dir = format!("/proc/{pid}/fdinfo");
    for entry in std::fs::read_dir(&dir).expect("reading fdinfo").flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        // A link's fdinfo also names its program: take the link id only.
        let obj = if let Some(id) = field("link_id:") {
            ("link", id)
        } else if let Some(id) = field("prog_id:") {
            ("prog", id)
        } else if let Some(id) = field("map_id:") {
            ("map", id)
        } else {
            continue;
        };
        out.push(obj);
    }
    out
}

/// Kernels before 5.11 charge BPF programs and maps to RLIMIT_MEMLOCK (the
/// memcg accounting series came in 5.11), and a guest's limit is the
/// kernel's default of 64 KiB: a test's own `BPF_PROG_LOAD`, and the
/// bpftool it runs, then fail with EPERM. kdrop copes through aya, which
/// raises the limit to infinity on such kernels when a load is refused
/// (aya 0.14 `sys/bpf.rs`, `RAISE_MEMLIMIT`); a test that loads programs
/// itself does the same for its own process, and so for the commands it
/// starts, which inherit the limit. Root may (CAP_SYS_RESOURCE); a failure
/// fails the test.
pub fn raise_memlock_before_5_11() {
    if crate::kernel_at_least(5, 11) {
        return;
    }
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct it is given.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    assert_eq!(
        rc,
        0,
        "raising RLIMIT_MEMLOCK: {}",
        std::io::Error::last_os_error()
    );
}

/// Does a program, link or map with this id still exist (bpftool asks the
/// kernel by id)?
pub fn bpf_object_exists(what: &str, id: u64) -> bool {
    Command::new("bpftool")
        .args([what, "show", "id", &id.to_string()])
        .output()
        .expect("running bpftool")
        .status
        .success()
}

/// Waits (bounded) until none of `objects` exists any more. The kernel frees
/// a program, link or map when its last reference goes, which can trail the
/// owner's exit a little: polling, as there is no event to wait on.
pub fn assert_released(objects: &[(&'static str, u64)]) {
    for (what, id) in objects {
        let gone = (0..200).any(|_| {
            let exists = bpf_object_exists(what, *id);
            if exists {
                std::thread::sleep(Duration::from_millis(10));
            }
            !exists
        });
        assert!(gone, "{what} {id} still exists after kdrop exited");
    }
}

/// Open file descriptors of a process.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Open descriptors of a process that are not files on a filesystem: BPF
/// objects, epoll, pipes, sockets. Files come and go (kdrop reads
/// /proc/kallsyms on a thread while it starts); these are its setup.
pub fn kernel_object_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|target| !target.starts_with("/"))
                .count()
        })
        .unwrap_or(0)
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
