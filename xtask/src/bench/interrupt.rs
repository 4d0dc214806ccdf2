//! Ctrl-C and SIGTERM as a flag the bench checks between floods, so that it
//! ends through its guards (namespaces removed, tools stopped) instead of
//! dying with them in place.
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Result};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn catch() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

pub fn check() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted: namespaces removed, tools stopped");
    }
    Ok(())
}
