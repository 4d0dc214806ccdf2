//! `kdrop record`: the session's steps into the bundle, in the order they
//! happen. What the node answered during a step goes in before the step
//! itself, so that a replay has the answers when it takes the step.
use std::path::PathBuf;

use anyhow::Result;

pub use crate::context::tape::Line;
use crate::{
    context::tape::{Header, FORMAT, SCHEMA},
    model::stats::Stats,
};

use super::Session;

/// Where and how much to record.
pub struct Recording {
    pub path: PathBuf,
    /// Stop recording past this many compressed bytes.
    pub max_bytes: u64,
    /// The command line, for the header.
    pub args: Vec<String>,
    /// `--count`.
    pub count: Option<u64>,
}

/// Lower-case hex of the bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn uname() -> (String, String, String) {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Default::default();
    }
    let s = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (s(&u.release), s(&u.version), s(&u.nodename))
}

impl Session {
    /// The bundle's first line: the kernel, its names, the probes.
    pub(super) fn header(&self, r: &Recording) -> Header {
        let (kernel_release, kernel_version, hostname) = uname();
        let facts = &self.enricher.facts;
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Header {
            format: FORMAT.into(),
            schema: SCHEMA,
            kdrop: env!("CARGO_PKG_VERSION").into(),
            kernel_release,
            kernel_version,
            hostname,
            started_realtime_ns: started,
            reasons: facts.reasons.clone(),
            ct_names: facts.ct_names.clone(),
            nf_rungs: facts
                .nf_rungs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            realtime_offset_ns: facts.realtime_offset_ns,
            probes: self.describe(),
            missing: self.missing(),
            args: r.args.clone(),
            count: r.count,
        }
    }

    /// The node's answers since the last step, then the step.
    pub(super) fn taped(&mut self, line: Line) {
        let Some(tape) = self.tape.as_mut() else {
            return;
        };
        let answers = self.enricher.node.take_lines();
        let result = answers
            .iter()
            .chain(std::iter::once(&line))
            .try_for_each(|l| tape.write(l));
        if let Err(e) = result {
            log::warn!("recording stopped: {e:#}");
            tape.full = true;
        }
    }

    /// The size cap is reached (or writing failed): the run ends.
    pub(super) fn tape_full(&self) -> bool {
        self.tape.as_ref().is_some_and(|t| t.full)
    }

    /// Ends the bundle with the accounting; its size in bytes, if recording.
    pub fn finish_recording(&mut self, stats: &Stats) -> Result<Option<u64>> {
        match self.tape.take() {
            Some(t) => Ok(Some(t.finish(stats)?)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_bytes() {
        assert_eq!(super::hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
