//! Harness for kdrop's integration tests: run the real binary, wait for its
//! readiness line, provoke real drops from namespaces the test owns.
use std::{path::PathBuf, process::Command, time::Duration};

pub mod allowed_skips;
mod binary;
mod bpf;
pub mod caps;
pub mod containerd;
mod expect;
pub mod oracle;
mod skip;
mod sockets;
mod topo;
pub use binary::*;
pub use bpf::*;
pub use expect::*;
pub use skip::skip;
pub use sockets::*;
pub use topo::*;
pub mod cilium;
pub mod cri;
pub mod ctnl;
pub mod flood;
pub mod handshake;
pub mod manifest;
pub mod netpol;
pub mod nets;
pub mod nf;
pub mod prom;
pub mod record;
pub use record::Record;
pub mod scrape;
pub use kdrop::lab::netlab::{ip, veth, Ns};
use serde_json::Value;

/// How long kdrop may take to attach. Startup is well under a second; this
/// only bounds a hang.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long to wait for an event after provoking its drop.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A bound stretched by `KDROP_TEST_TIME_SCALE` (a whole number, default 1):
/// `cargo xtask vm` sets it for guests under TCG, several times slower than
/// this machine. Bounds only: nothing waits longer than its event needs.
pub fn bound(d: Duration) -> Duration {
    let scale = std::env::var("KDROP_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    d * scale
}

pub fn kdrop_bin() -> PathBuf {
    let bin = std::env::var_os("KDROP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/kdrop")
        });
    assert!(
        bin.exists(),
        "{} missing: run the tests with `cargo xtask test`",
        bin.display()
    );
    bin
}

/// Runs one of kdrop's fix commands exactly as printed.
pub fn run_fix(cmd: &str) {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .expect("running sh");
    assert!(
        out.status.success(),
        "fix `{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits (bounded, 10 s stretched in a guest) until `cond` holds; fails
/// the test with `what` if it never does. For states with no event to wait
/// on (a counter, a table entry), polled every 20 ms.
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + bound(Duration::from_secs(10));
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not happen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts that kdrop's repair commands `cmds` are, in order, of `kinds`
/// (`kdrop::diagnosis::fix_kinds`): a test applies the kinds the catalogue
/// lists it for.
pub fn assert_kinds(cmds: &[String], kinds: &[kdrop::diagnosis::fix_kinds::Kind]) {
    let got: Vec<_> = cmds
        .iter()
        .map(|c| kdrop::diagnosis::fix_kinds::Kind::of(c))
        .collect();
    let want: Vec<_> = kinds.iter().map(|k| Some(*k)).collect();
    assert_eq!(got, want, "{cmds:?}");
}

/// A JSON array of strings (a finding's evidence or fix).
pub fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The inode of a namespace, as JSON events carry it.
pub fn inode(ns: &Ns) -> u64 {
    u64::from(ns.inode().unwrap())
}
