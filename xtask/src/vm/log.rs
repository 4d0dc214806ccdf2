//! What a guest's log says: test counts, the rung kdrop chose, reasons.
use std::{path::PathBuf, time::Duration};

use crate::tally::Tally;

pub struct VmResult {
    /// `Kernel::label`: `6.1`, `6.1-arm64`.
    pub kernel: String,
    pub release: String,
    /// `kdrop check`'s chosen rung for skb:kfree_skb, as the guest printed it.
    pub rung: String,
    pub reasons: String,
    /// Passed, failed, skipped (and skips this kernel does not allow).
    pub tally: Tally,
    /// None when the guest never wrote its status (crash, timeout).
    pub status: Option<i32>,
    pub boot: Duration,
    pub total: Duration,
    /// The log the guest wrote itself (its shared directory's guest.log).
    pub log: PathBuf,
}

impl VmResult {
    pub fn ok(&self) -> bool {
        self.status == Some(0) && self.tally.ok()
    }

    pub fn line(&self) -> String {
        format!(
            "{:<5} {:<24} {}: {}; drop reasons: {}; {}; boot {:.0} s, total {:.0} s",
            self.kernel,
            self.release,
            if self.ok() { "PASS" } else { "FAIL" },
            self.rung,
            self.reasons,
            self.tally.line(),
            self.boot.as_secs_f64(),
            self.total.as_secs_f64(),
        )
    }
}

/// `[   14.565543] virtme-ng-init: ...`
pub(super) fn is_kernel_message(line: &str) -> bool {
    // printk's `[%5lu.%06lu]`.
    let Some((stamp, _)) = line
        .trim_start()
        .strip_prefix('[')
        .and_then(|l| l.split_once(']'))
    else {
        return false;
    };
    stamp.trim().split_once('.').is_some_and(|(s, us)| {
        !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && us.len() == 6
            && us.bytes().all(|b| b.is_ascii_digit())
    })
}

/// `probe       skb:kfree_skb (drop path): using tp_btf` → `kfree_skb via tp_btf`.
pub fn rung_of(log: &str) -> String {
    let rungs: Vec<String> = log
        .lines()
        .filter_map(|l| l.strip_prefix("probe"))
        .filter_map(|l| {
            let (point, rest) = l.trim().split_once(' ')?;
            let rung = rest.split_once(": using ")?.1;
            Some(format!("{point} via {}", rung.trim()))
        })
        .collect();
    if rungs.is_empty() {
        "no rung (kdrop check failed?)".into()
    } else {
        rungs.join(", ")
    }
}

/// Whether `kdrop check` found a reason argument in kfree_skb.
pub fn reasons_of(log: &str) -> String {
    match log.lines().find_map(|l| l.strip_prefix("kfree_skb")) {
        Some(l) if l.contains("no reason argument") => "none (kfree_skb has no reason)".into(),
        Some(l) if l.contains("reason #") => "yes".into(),
        Some(l) => l.trim().to_string(),
        None => "unknown".into(),
    }
}
