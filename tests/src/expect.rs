//! What the running kernel lets a test expect: reasons, rungs, versions.
use std::{process::Command, sync::OnceLock};

use serde_json::Value;

use crate::*;

/// Is the running kernel at least `major.minor` (uname's release)?
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    oracle::running() >= (major, minor)
}

/// Does this kernel's `kfree_skb` carry a drop reason (5.17+; not on
/// Debian 11's 5.10)? From uname's version and the oracle, not from kdrop.
pub fn kernel_has_drop_reasons() -> bool {
    oracle::has_drop_reasons()
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
/// here (the oracle's matrix)? Then reverse-path drops are named even
/// without kernel reasons.
pub fn src_check_attaches() -> bool {
    oracle::return_rung("fib_validate_source").is_ok()
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

/// The rung of `func`'s return point (`"kretprobe"`), where the oracle
/// says one attaches here: kdrop check must then have chosen it, or the
/// test fails. Where the oracle says none does, kdrop check must agree,
/// each refusal must be the one the kernel's skip kind explains (a
/// verifier's refusal is not), and the test is recorded as skipped:
/// `None`.
pub fn return_rung_or_skip(test: &str, func: &str) -> Option<String> {
    let got = point_rung(&format!("{func} (return)"));
    match (oracle::return_rung(func), got) {
        (Ok(want), Ok(got)) => {
            assert_eq!(
                got, want,
                "kdrop check chose {got} for {func}, the oracle says {want}"
            );
            Some(got)
        }
        (Ok(want), Err(why)) => panic!(
            "{func}'s {want} attaches on kernel {} (tests/src/oracle.rs), kdrop check attached \
             nothing: {why}",
            oracle::release()
        ),
        (Err(kind), Ok(got)) => panic!(
            "kdrop check attached {got} for {func}, where the oracle expects none ({kind}): \
             update tests/src/oracle.rs"
        ),
        (Err(kind), Err(why)) => {
            let explained = |r: &str| match (kind, r.split_whitespace().next()) {
                ("no-kprobes", Some("kretprobe")) => r.contains("no kprobes in this kernel"),
                // EPERM with an empty verifier log: the kernel refuses the
                // program type, the verifier never ran.
                ("no-kprobes", Some("fexit")) => r.ends_with(
                    "returned Operation not permitted (os error 1). Verifier output: : \
                     Operation not permitted (os error 1)",
                ),
                ("no-module-btf", Some("kretprobe")) => {
                    r.contains("which this kernel does not have")
                }
                ("no-module-btf", Some("fexit")) => true,
                _ => false,
            };
            let refusals: Vec<&str> = why.split("; ").collect();
            assert!(
                !refusals.is_empty() && refusals.iter().all(|r| explained(r)),
                "{func}'s return point was refused for a reason other than {kind}: {why}"
            );
            skip(test, kind, &format!("no {func} return point: {why}"));
            None
        }
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
/// that name where the oracle says this kernel has it, null where kfree_skb
/// has no reasons. A kernel with reasons but not this one is a test that
/// must say what it expects instead (`kernel_reason`).
pub fn expected_reason(name: &str) -> Value {
    Value::from(reason_for(name))
}

/// `expected_reason` for a typed record's `reason`: `Some(name)` where the
/// kernel has it, `None` where kfree_skb has no reasons.
pub fn reason_for(name: &str) -> Option<&str> {
    if oracle::has_reason(name) {
        Some(name)
    } else if !kernel_has_drop_reasons() {
        None
    } else {
        panic!(
            "kernel {} has drop reasons but not {name} (tests/src/oracle.rs): the test must \
             say which reason it expects here",
            oracle::release()
        )
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
/// IP_LOCAL_SOURCE came in 6.13), by the oracle's table: the reason kdrop
/// must report where it has, `None` where the kernel names the drop
/// otherwise (or not at all).
pub fn kernel_reason(name: &str) -> Option<&str> {
    oracle::has_reason(name).then_some(name)
}

/// The `reason` label kdrop monitor gives a drop the kernel names `name`:
/// `unknown` on a kernel without drop reasons.
pub fn expected_reason_label(name: &str) -> &str {
    if oracle::has_reason(name) {
        name
    } else {
        assert!(
            !kernel_has_drop_reasons(),
            "kernel {} has drop reasons but not {name}",
            oracle::release()
        );
        "unknown"
    }
}
