//! One kernel's closing line, `N passed, N failed, N skipped`, from libtest's
//! output and the tests' `SKIP <test>: <kind> (...)` lines; a skip whose
//! kind the kernel does not allow (tests/src/allowed_skips.rs) fails the run.
use std::collections::BTreeSet;

use crate::allowed_skips;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Tests that ran and passed (libtest's "passed" less the skipped).
    pub passed: u32,
    pub failed: u32,
    /// Distinct tests that printed a SKIP line.
    pub skipped: u32,
    /// `test: kind` of each skip this kernel does not allow.
    pub unexpected: Vec<String>,
}

impl Tally {
    /// Reads a run's output on kernel `version` (`major.minor`).
    pub fn of(log: &str, version: &str) -> Tally {
        let mut libtest_passed = 0;
        let mut failed = 0;
        let mut skipped = BTreeSet::new();
        let mut unexpected = BTreeSet::new();
        for line in log.lines() {
            if let Some((test, kind)) = allowed_skips::parse_skip(line) {
                skipped.insert(test.to_string());
                if !allowed_skips::allowed(version, kind) {
                    unexpected.insert(format!("{test}: {kind}"));
                }
                continue;
            }
            let Some(rest) = line.trim().strip_prefix("test result: ") else {
                continue;
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let n: u32 = n.parse().unwrap_or(0);
                match what {
                    "passed" => libtest_passed += n,
                    "failed" => failed += n,
                    _ => {}
                }
            }
        }
        let skipped = skipped.len() as u32;
        Tally {
            passed: libtest_passed.saturating_sub(skipped),
            failed,
            skipped,
            unexpected: unexpected.into_iter().collect(),
        }
    }

    /// Nothing failed and every skip is allowed.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.unexpected.is_empty()
    }

    pub fn line(&self) -> String {
        let mut s = format!(
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        );
        if !self.unexpected.is_empty() {
            s.push_str(&format!(
                " ({} not allowed: {})",
                self.unexpected.len(),
                self.unexpected.join(", ")
            ));
        }
        s
    }
}

/// `major.minor` of a release string (`6.12.107+deb13-amd64` → `6.12`).
pub fn version_of(release: &str) -> String {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    format!(
        "{}.{}",
        parts.next().unwrap_or("0"),
        parts.next().unwrap_or("0")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
running 3 tests
test ipt_do_table_verdict ... SKIP ipt_do_table_verdict: no-kprobes (kretprobe refused)
ok
SKIP nft_do_chain_verdict: no-kprobes (x)
SKIP nft_do_chain_verdict: no-kprobes (x)
test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s
test result: FAILED. 8 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 20s
";

    #[test]
    fn counts_skips_apart_from_passes() {
        let t = Tally::of(LOG, "6.18");
        assert_eq!((t.passed, t.failed, t.skipped), (9, 2, 2));
        assert!(t.unexpected.is_empty());
        assert_eq!(t.line(), "9 passed, 2 failed, 2 skipped");
        assert!(!t.ok());
    }

    #[test]
    fn a_skip_the_kernel_does_not_allow_fails() {
        let log = "SKIP ipt_do_table_verdict: no-kprobes (kretprobe refused)\n\
                   test result: ok. 1 passed; 0 failed; 0 ignored\n";
        let t = Tally::of(log, "6.1");
        assert_eq!((t.passed, t.failed, t.skipped), (0, 0, 1));
        assert!(!t.ok());
        assert_eq!(
            t.line(),
            "0 passed, 0 failed, 1 skipped (1 not allowed: ipt_do_table_verdict: no-kprobes)"
        );
        assert!(Tally::of(log, "6.18").ok());
    }

    #[test]
    fn versions() {
        assert_eq!(version_of("6.12.107+deb13-amd64"), "6.12");
        assert_eq!(version_of("6.18.44-fc-v782"), "6.18");
    }
}
