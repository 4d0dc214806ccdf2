//! A thread that wakes every millisecond on the CPUs the tools use, for
//! the whole bench, baselines included.
//!
//! On this machine (sched_autogroup_enabled=1, other users compiling) how
//! much of its CPU the workload gets depends on whether its session has a
//! task that wakes often on the other CPU: measured on h1, the workload
//! ran 51-58 % of the wall time with nothing else of ours awake, 99-100 %
//! with a 1 ms sleep loop in the session on CPU 1. Every tool brings such
//! wake-ups (its own userspace), the baseline none, so every tool's
//! wall-clock ratio came out above 1. With this thread the baselines and
//! the tools run in the same scheduling conditions. It costs about 1,000
//! short wake-ups a second, off the workload's CPU.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

pub struct Companion {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Companion {
    /// Starts it; the calling thread's CPU affinity (kept off the
    /// workload's CPU) is inherited.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Companion {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Companion {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
