//! A namespace's netfilter state around each drop: a per-namespace history
//! of snapshots (snapshot.rs) gives each drop a "before" (taken at startup
//! for the traced namespace, or after an earlier drop) and an "after" (taken
//! when the event is read, or shared by every event of a batch that
//! happened before it).
pub mod conntrack;
// Their parsers are the core's (no I/O there).
pub use kdrop_core::parse::{iptables_save, nft_json, nft_render};
pub mod snapshot;

use std::{collections::HashMap, sync::Arc, time::Duration};

use self::snapshot::{snapshot, tool_name, Tools, START_TOOL_TIMEOUT, TOOL_TIMEOUT};
use crate::{context::netns::Netns, model::netfilter::Snapshot};

/// Snapshots kept per namespace (before, after, and one spare for events
/// read out of order across a batch).
const HISTORY: usize = 3;
/// Namespaces remembered (a kube-proxy ruleset can hold tens of thousands of
/// rules); the least recently used is forgotten.
const MAX_NAMESPACES: usize = 64;

/// Snapshots per namespace.
pub struct NetfilterContext {
    tools: Arc<Tools>,
    history: HashMap<u32, Vec<Arc<Snapshot>>>,
    /// Namespaces by last use, for forgetting.
    used: Vec<u32>,
}

impl Default for NetfilterContext {
    fn default() -> Self {
        Self::new()
    }
}

impl NetfilterContext {
    pub fn new() -> Self {
        NetfilterContext {
            tools: Arc::new(Tools::find()),
            history: HashMap::new(),
            used: Vec::new(),
        }
    }

    fn touch(&mut self, inode: u32) {
        self.used.retain(|&i| i != inode);
        self.used.push(inode);
        if self.used.len() > MAX_NAMESPACES {
            let old = self.used.remove(0);
            self.history.remove(&old);
        }
    }

    fn take(&mut self, ns: &Netns) -> Option<Arc<Snapshot>> {
        self.take_within(ns, TOOL_TIMEOUT)
    }

    fn take_within(&mut self, ns: &Netns, timeout: Duration) -> Option<Arc<Snapshot>> {
        match snapshot(&ns.path, &self.tools, timeout) {
            Ok(s) => {
                log::debug!(
                    "netfilter snapshot of {}: {} tables in {:.1} ms",
                    ns.path.display(),
                    s.tables.len(),
                    (s.finished_ns - s.started_ns) as f64 / 1e6
                );
                let s = Arc::new(s);
                let h = self.history.entry(ns.inode).or_default();
                h.push(Arc::clone(&s));
                if h.len() > HISTORY {
                    h.remove(0);
                }
                self.touch(ns.inode);
                Some(s)
            }
            Err(e) => {
                log::debug!("netfilter snapshot of {}: {e:#}", ns.path.display());
                None
            }
        }
    }

    /// The newest snapshot of the namespace with this inode.
    pub fn latest(&self, inode: u32) -> Option<Arc<Snapshot>> {
        self.history.get(&inode)?.last().cloned()
    }

    /// A "before" for the first drop in `ns`: call before tracing starts.
    pub fn prime(&mut self, ns: &Netns) {
        self.take_within(ns, START_TOOL_TIMEOUT);
    }

    /// The snapshots that bracket a drop at `ts_ns` (CLOCK_MONOTONIC) in
    /// `ns`: the newest taken before it, if any, and one taken after it
    /// (read now when none was).
    pub fn around(
        &mut self,
        ns: &Netns,
        ts_ns: u64,
    ) -> Option<(Option<Arc<Snapshot>>, Arc<Snapshot>)> {
        let hist = self.history.get(&ns.inode).cloned().unwrap_or_default();
        let before = hist.iter().rev().find(|s| s.finished_ns < ts_ns).cloned();
        let after = match hist.iter().find(|s| s.started_ns > ts_ns) {
            Some(s) => Arc::clone(s),
            None => self.take(ns)?,
        };
        Some((before, after))
    }
}

/// For `kdrop check`: which attribution methods this host offers, best
/// first.
/// `kernel` names the rung each netfilter function's verdict comes
/// through (from the probe reports).
pub fn describe_methods(kernel: &[(&str, Option<String>)]) -> Vec<String> {
    let t = Tools::find();
    let tools: Vec<String> = [&t.legacy4, &t.legacy6, &t.nft_save4, &t.nft_save6]
        .into_iter()
        .flatten()
        .map(|p| tool_name(p))
        .chain(t.nft.as_ref().map(|_| "nft -j".to_string()))
        .collect();
    let used: Vec<String> = kernel
        .iter()
        .filter_map(|(f, r)| Some(format!("{f} via {}", r.as_ref()?)))
        .collect();
    vec![
        if used.is_empty() {
            "kernel verdicts (nf_conntrack_in, nf_nat_inet_fn, nft_do_chain, ipt_do_table): \
             none here, their probes did not attach"
                .to_string()
        } else {
            format!("kernel verdicts: {}", used.join(", "))
        },
        if tools.is_empty() {
            "rule counters: no iptables-save or nft found".into()
        } else {
            format!("rule counters before/after each drop: {}", tools.join(", "))
        },
        "ruleset evaluation: for nftables rules and policies without counters".into(),
    ]
}
