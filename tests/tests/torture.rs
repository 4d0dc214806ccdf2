//! Torture: kdrop under a flood, killed, and started and stopped over and
//! over. CI runs a bounded form (seconds of flood, a few cycles);
//! `KDROP_TORTURE=full` (what `cargo xtask bench --torture` sets) runs the
//! full one: a 60 s flood and 100 cycles.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use integration_tests::{
    assert_released, bpf_objects_of, fd_count, ns_name, status_kib, Kdrop, Ns, Pair,
};

fn full() -> bool {
    std::env::var("KDROP_TORTURE").is_ok_and(|v| v == "full")
}

/// One at a time: the flood wants the CPUs, and the fd count of this test
/// process is only meaningful when no other test opens pipes meanwhile.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Peak RSS allowed under a flood (BENCHMARKS.md target).
const RSS_LIMIT_KIB: u64 = 50 * 1024;

#[test]
fn flood_keeps_kdrop_up_with_bounded_memory_and_exact_counts() {
    let _alone = alone();
    let secs = if full() { 60 } else { 3 };
    let p = Pair::new("tflood", 71);
    p.drop_syns_to(5711);
    let k = Kdrop::start(&["--json", "--netns", &p.server.name, "--port", "5711"]);
    let pid = k.pid();
    let before = p.dropped();
    let done = AtomicBool::new(false);
    let (sent, peak_rss) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            // Sample memory while the flood runs; bounded by the flood's end
            // and by a deadline.
            let deadline = Instant::now() + Duration::from_secs(secs + 30);
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                let rss = status_kib(pid, "VmRSS").expect("kdrop died under the flood");
                peak = peak.max(rss);
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        let sent = p.flood(5711, u64::MAX, Duration::from_secs(secs));
        done.store(true, Ordering::Relaxed);
        (sent, watcher.join().unwrap())
    });
    let dropped = p.dropped() - before;
    let hwm = status_kib(pid, "VmHWM").expect("kdrop died under the flood");
    let fin = k.stop(libc::SIGINT);
    assert!(fin.status.success(), "{fin:?}");
    let c = fin.counts();
    eprintln!("flood {sent:?}: {c:?}, RSS peak {peak_rss} KiB, high water {hwm} KiB");
    assert!(hwm < RSS_LIMIT_KIB && peak_rss < RSS_LIMIT_KIB, "{hwm} KiB");
    assert_eq!(c.matched, dropped, "{c:?} vs {dropped} dropped of {sent:?}");
    assert_eq!(c.matched, c.emitted + c.lost, "{c:?}");
    assert_eq!(c.received, c.emitted, "{c:?}");
}

#[test]
fn sigkill_leaves_no_program_link_or_map() {
    let _alone = alone();
    let k = Kdrop::start(&["--port", "5712"]);
    let objects = bpf_objects_of(k.pid());
    for kind in ["prog", "link", "map"] {
        assert!(
            objects.iter().any(|(k, _)| *k == kind),
            "kdrop holds no {kind}: {objects:?}"
        );
    }
    let done = k.stop(libc::SIGKILL);
    assert!(!done.status.success(), "{done:?}");
    // No summary: SIGKILL gives no chance to write one. The kernel still
    // drops every object with the last fd.
    assert_released(&objects);
}

/// kdrop's descriptors that are not files (as `kernel_object_fds` counts
/// them) at rest, as kinds (`anon_inode:bpf-map`, `socket`, `net`): the
/// fewest seen over a second. Its listen watch opens its namespace and a
/// sock_diag socket for a moment on every poll: a leak stays in every
/// sample, those do not.
fn resting_fds(pid: u32) -> Vec<String> {
    let sample = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read_link(e.path()).ok())
                    .filter(|t| !t.starts_with("/"))
                    .map(|t| {
                        let t = t.to_string_lossy();
                        t.split_once(":[").map_or(t.to_string(), |(k, _)| k.into())
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    (0..20)
        .map(|_| {
            let s = sample();
            std::thread::sleep(Duration::from_millis(50));
            s
        })
        .min_by_key(|s| s.len())
        .unwrap()
}

#[test]
fn start_stop_cycles_leave_nothing_and_leak_no_fds() {
    let _alone = alone();
    let cycles = if full() { 100 } else { 5 };
    let own_fds = fd_count(std::process::id());
    // One namespace of its own: without --netns kdrop opens a conntrack
    // event socket in each namespace there is at its start, as many as the
    // tests beside it have (a guest's other lane: 48, then 51, on 6.1).
    let ns = Ns::new(&ns_name("tcycles")).unwrap();
    let mut kdrop_fds = None;
    for i in 0..cycles {
        let k = Kdrop::start(&["--netns", &ns.name, "--port", "5713"]);
        let fds = resting_fds(k.pid());
        // Same program, same setup: the same BPF objects, pipes and
        // sockets every time.
        assert_eq!(
            *kdrop_fds.get_or_insert_with(|| fds.clone()),
            fds,
            "cycle {i}"
        );
        let objects = bpf_objects_of(k.pid());
        let signal = if i % 2 == 0 {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        let done = k.stop(signal);
        assert!(done.status.success(), "cycle {i}: {done:?}");
        assert_released(&objects);
    }
    // The harness's pipes and threads went with each kdrop.
    assert_eq!(fd_count(std::process::id()), own_fds);
}
