//! Skips that show: a `SKIP <test>: <kind> (<detail>)` line the runners
//! count, allowed only for the kinds tests/src/allowed_skips.rs lists for
//! this kernel.
use std::io::Write as _;

use crate::{allowed_skips, oracle};

/// Records that `test` does not run (or runs only in part) here, for a
/// reason of `kind`; fails the test if this kernel does not allow `kind`.
pub fn skip(test: &str, kind: &str, detail: &str) {
    let (major, minor) = oracle::running();
    let version = format!("{major}.{minor}");
    assert!(
        allowed_skips::allowed(&version, kind),
        "{test} would skip ({kind}: {detail}), which kernel {version} does not allow \
         (tests/src/allowed_skips.rs)"
    );
    // Straight to the process's stdout: libtest captures print!, and the
    // runners must see this line for passing tests too.
    let line = format!("SKIP {test}: {kind} ({})\n", detail.replace('\n', " "));
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}
