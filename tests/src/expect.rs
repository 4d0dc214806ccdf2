//! What the running kernel lets a test expect: reasons, rungs, versions.
use std::{process::Command, sync::OnceLock};

use serde_json::Value;

use crate::*;

/// Is the running kernel at least `major.minor` (uname's release)?
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    have >= (major, minor)
}

/// Does this kernel's `kfree_skb` carry a drop reason (5.17+; not on
/// Debian 11's 5.10)? Asked of `kdrop check` once per test process, so tests
/// key on what kdrop found in BTF, not on version strings.
pub fn kernel_has_drop_reasons() -> bool {
    let text = check_output();
    let line = text
        .lines()
        .find(|l| l.starts_with("kfree_skb "))
        .unwrap_or_else(|| panic!("kdrop check names no kfree_skb arguments:\n{text}"));
    if line.contains("no reason argument") {
        false
    } else if line.contains("reason #") {
        true
    } else {
        panic!("kdrop check: unexpected {line:?}")
    }
}

/// The rungs of the drop path's ladder that `kdrop check` could attach here
/// (it tries every one), e.g. `["tp_btf", "raw_tp"]`.
pub fn attachable_rungs() -> Vec<String> {
    check_output()
        .lines()
        .skip_while(|l| !l.starts_with("probe       skb:kfree_skb"))
        .skip(1)
        .map_while(|l| l.strip_prefix("              "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, outcome)| outcome.trim() == "attached")
        .map(|(rung, _)| rung.to_string())
        .collect()
}

/// Does the fib_validate_source return rung (fexit or kretprobe) attach
/// here? Then reverse-path drops are named even without kernel reasons.
pub fn src_check_attaches() -> bool {
    check_output()
        .lines()
        .find(|l| l.starts_with("probe       fib_validate_source (return)"))
        .is_some_and(|l| !l.ends_with("using none"))
}

/// The rung `kdrop check` chose for an optional probe point (`"nft_do_chain
/// (return)"`), or why none attached (the point's refusals, for a test's
/// skip message).
pub fn point_rung(point: &str) -> Result<String, String> {
    let text = check_output();
    let head = format!("probe       {point} ");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&head));
    let line = lines
        .next()
        .ok_or_else(|| format!("kdrop check lists no probe point {point}"))?;
    match line.rsplit_once("using ") {
        Some((_, r)) if r != "none" => Ok(r.to_string()),
        _ => Err(lines
            .map_while(|l| l.strip_prefix("              "))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// The cause kdrop gives an rp_filter drop: named from the kernel's reason,
/// or derived from fib_validate_source's return code where only that is
/// available; `no_reason` where neither is.
pub fn expected_rp_filter_cause() -> &'static str {
    if kernel_has_drop_reasons() || src_check_attaches() {
        "rp_filter_strict"
    } else {
        "no_reason"
    }
}

/// `kdrop check`'s report, run once per test process.
fn check_output() -> &'static str {
    static OUT: OnceLock<String> = OnceLock::new();
    OUT.get_or_init(|| {
        let out = Command::new(kdrop_bin())
            .arg("check")
            .output()
            .expect("running kdrop check");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "kdrop check failed:\n{text}");
        text
    })
}

/// The `reason` an event must carry for a drop the kernel names `name`:
/// that name where kfree_skb has reasons, null where it has none.
pub fn expected_reason(name: &str) -> Value {
    if kernel_has_drop_reasons() {
        Value::from(name)
    } else {
        Value::Null
    }
}

/// The finding's `cause` for a drop whose kernel reason gives `cause`; on a
/// kernel without reasons kdrop says it cannot know (`no_reason`).
pub fn expected_cause(cause: &str) -> &str {
    if kernel_has_drop_reasons() {
        cause
    } else {
        "no_reason"
    }
}

/// Whether the running kernel's `enum skb_drop_reason` has `name` (e.g.
/// IP_LOCAL_SOURCE came in 6.13): the reason kdrop reports where it has,
/// `None` where the kernel names the drop otherwise (or not at all).
pub fn kernel_reason(name: &str) -> Option<&str> {
    let btf = kdrop::kernel::btf::Btf::from_file(std::path::Path::new("/sys/kernel/btf/vmlinux"))
        .unwrap();
    kdrop::kernel::facts::Reasons::from_btf(&btf)
        .has(name)
        .then_some(name)
}

/// The `reason` label kdrop monitor gives a drop the kernel names `name`:
/// `unknown` on a kernel without drop reasons.
pub fn expected_reason_label(name: &str) -> &str {
    if kernel_has_drop_reasons() {
        name
    } else {
        "unknown"
    }
}
