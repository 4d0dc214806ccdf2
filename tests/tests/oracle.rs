//! The oracle (tests/src/oracle.rs) against the running kernel, read with
//! bpftool and sysfs, not with kdrop: every reason its table places at or
//! before this version is in `enum skb_drop_reason`, every later one is
//! not, and the tracepoint arguments and program types match its row.
use std::{collections::HashSet, path::Path, process::Command};

use integration_tests::oracle::{self, REASONS};

/// `bpftool btf dump file /sys/kernel/btf/vmlinux format raw`, once for
/// both tests (18 s of a 5.10 guest's CPU each time).
fn btf_raw() -> &'static str {
    static RAW: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RAW.get_or_init(dump)
}

fn dump() -> String {
    let out = Command::new("bpftool")
        .args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "raw",
        ])
        .output()
        .expect("running bpftool");
    assert!(
        out.status.success(),
        "bpftool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The members of the type `[N] KIND 'name' ...` in bpftool's raw dump:
/// the indented lines after it, each's quoted name.
fn members(raw: &str, header: &str) -> Option<Vec<String>> {
    let mut lines = raw.lines().skip_while(|l| {
        !(l.starts_with('[')
            && l.split_once("] ")
                .is_some_and(|(_, r)| r.starts_with(header)))
    });
    lines.next()?;
    Some(
        lines
            .take_while(|l| l.starts_with('\t'))
            .filter_map(|l| l.trim().strip_prefix('\'')?.split_once('\''))
            .map(|(name, _)| name.to_string())
            .collect(),
    )
}

#[test]
fn drop_reason_table_matches_this_kernels_btf() {
    let raw = btf_raw();
    let v = oracle::running();
    let names: HashSet<String> = members(raw, "ENUM 'skb_drop_reason' ")
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| n.strip_prefix("SKB_DROP_REASON_").map(str::to_string))
        .collect();
    assert_eq!(
        !names.is_empty(),
        oracle::has_drop_reasons(),
        "enum skb_drop_reason on {}: {} names",
        oracle::release(),
        names.len()
    );
    let wrong: Vec<String> = REASONS
        .iter()
        .filter(|(n, _, _)| names.contains(*n) != oracle::has_reason_in(v, n))
        .map(|(n, first, src)| {
            format!(
                "{n} (table: from {}.{}, {src}; BTF: {})",
                first.0,
                first.1,
                if names.contains(*n) {
                    "present"
                } else {
                    "absent"
                }
            )
        })
        .collect();
    assert!(wrong.is_empty(), "on {}: {wrong:?}", oracle::release());
}

#[test]
fn kfree_skb_arguments_match_the_table() {
    let raw = btf_raw();
    let fields = members(raw, "STRUCT 'trace_event_raw_kfree_skb' ")
        .expect("no struct trace_event_raw_kfree_skb in vmlinux BTF");
    let v = oracle::running();
    assert_eq!(
        fields.iter().any(|f| f == "reason"),
        v >= oracle::KFREE_SKB_REASON,
        "{fields:?}"
    );
    assert_eq!(
        fields.iter().any(|f| f == "rx_sk"),
        v >= oracle::KFREE_SKB_RX_SK,
        "{fields:?}"
    );
}

#[test]
fn program_types_match_the_matrix_row() {
    let k = oracle::kernel();
    assert_eq!(
        Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
        k.kprobes,
        "kprobes on {} ({})",
        oracle::release(),
        k.what
    );
    // `cargo xtask vm` loads the netfilter modules before the tests.
    let module_btf = std::fs::read_dir("/sys/kernel/btf")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name() != "vmlinux");
    assert_eq!(
        module_btf,
        k.module_btf,
        "module BTF on {}",
        oracle::release()
    );
}
