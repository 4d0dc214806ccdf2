//! Kernel text addresses to `symbol+0xoff`, from /proc/kallsyms.
use std::{
    fs,
    io::BufRead as _,
    sync::{Once, OnceLock},
};

use anyhow::{Context as _, Result};

#[derive(Debug, Default)]
pub struct Symbols {
    /// Sorted by address.
    syms: Vec<(u64, String)>,
}

impl Symbols {
    pub fn load() -> Result<Self> {
        let f = fs::File::open("/proc/kallsyms").context("opening /proc/kallsyms")?;
        let mut syms = Vec::with_capacity(200_000);
        for line in std::io::BufReader::new(f).lines() {
            let line = line.context("reading /proc/kallsyms")?;
            if let Some(s) = parse_line(&line) {
                syms.push(s);
            }
        }
        Ok(Self::from_vec(syms))
    }

    pub fn from_vec(mut syms: Vec<(u64, String)>) -> Self {
        syms.sort_unstable_by_key(|s| s.0);
        Self { syms }
    }

    /// `None` when addresses are hidden (kptr_restrict) or out of range.
    pub fn resolve(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (base, name) = &self.syms[i];
        if *base == 0 {
            return None;
        }
        Some(format!("{name}+{:#x}", addr - base))
    }
}

/// The kernel's symbols, read once per process and shared. /proc/kallsyms
/// is 200k lines, some 75 ms of CPU; the monitor's two contexts (events,
/// metric labels) used to read it each, right after the readiness line.
/// Unreadable: addresses stay addresses (said once).
pub fn shared() -> &'static Symbols {
    static SYMBOLS: OnceLock<Symbols> = OnceLock::new();
    SYMBOLS.get_or_init(|| {
        Symbols::load().unwrap_or_else(|e| {
            log::warn!("no kernel symbols, locations stay addresses: {e:#}");
            Symbols::default()
        })
    })
}

/// Starts reading the shared symbols off the startup path, once: a first
/// drop's location then costs no wait. A reader that comes first waits
/// for this one read.
pub fn prefetch() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        std::thread::spawn(|| {
            shared();
        });
    });
}

/// `ffffffff81a2b3c0 T ip_rcv_finish_core.constprop.0\t[mod]` → text symbols only.
fn parse_line(line: &str) -> Option<(u64, String)> {
    let mut it = line.split_ascii_whitespace();
    let addr = u64::from_str_radix(it.next()?, 16).ok()?;
    let kind = it.next()?;
    if !matches!(kind, "T" | "t" | "W" | "w") {
        return None;
    }
    Some((addr, it.next()?.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_symbol_plus_offset() {
        let lines = [
            "ffffffff81000000 T _stext",
            "ffffffff81a00000 t ip_rcv_finish_core",
            "ffffffff81a00400 T ip_rcv",
            "ffffffff82000000 D some_data",
            "ffffffffc0000000 t nf_hook_slow\t[nf_tables]",
        ];
        let s = Symbols::from_vec(lines.iter().filter_map(|l| parse_line(l)).collect());
        assert_eq!(
            s.resolve(0xffffffff81a001a3).as_deref(),
            Some("ip_rcv_finish_core+0x1a3")
        );
        assert_eq!(s.resolve(0xffffffff81a00400).as_deref(), Some("ip_rcv+0x0"));
        assert_eq!(
            s.resolve(0xffffffffc0000010).as_deref(),
            Some("nf_hook_slow+0x10")
        );
        assert_eq!(s.resolve(0x1000), None);
        assert_eq!(s.resolve(0), None);
    }

    #[test]
    fn hidden_addresses_resolve_to_nothing() {
        let s = Symbols::from_vec(vec![(0, "ip_rcv".into())]);
        assert_eq!(s.resolve(0xffffffff81a001a3), None);
    }
}
