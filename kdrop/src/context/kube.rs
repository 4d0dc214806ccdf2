//! kube-proxy's Service names per namespace, read from the namespace's
//! netfilter snapshots (the ones taken around drops, or one taken here):
//! rebuilt when a newer snapshot exists, re-read when the one it came from
//! is older than [`FRESH`] (kube-proxy rewrites its rules on every
//! endpoint change). Only the node's own namespace is read for names alone:
//! another namespace is named from the snapshots its netfilter drops took,
//! so that a flood of drops in pods spawns no rule dumps.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    netfilter::{
        snapshot::{run, which},
        NetfilterContext,
    },
    netns::{in_netns, Netns},
};
use crate::{
    diagnosis::kube::{nft::TABLE, Services},
    model::netfilter::{Backend, Snapshot},
};

const FRESH: Duration = Duration::from_secs(5);

struct Entry {
    snap: Arc<Snapshot>,
    read: Instant,
    services: Arc<Services>,
}

#[derive(Default)]
pub struct KubeCache {
    by_ns: HashMap<u32, Entry>,
}

/// kube-proxy's nftables table of one family, as JSON (its verdict maps
/// hold the names; the snapshot keeps only chains and rules).
fn nft_table(ns: &Netns, family: &'static str) -> Option<serde_json::Value> {
    let nft = which("nft")?;
    let read = in_netns(&ns.path, move || {
        run(&nft, &["-j", "list", "table", family, TABLE])
    });
    match read {
        Ok(Ok(text)) => serde_json::from_str(&text).ok(),
        Ok(Err(e)) | Err(e) => {
            log::debug!(
                "kube-proxy's nftables table in {}: {e:#}",
                ns.path.display()
            );
            None
        }
    }
}

fn build(snap: &Snapshot, ns: &Netns) -> Services {
    let mut s = Services::from_tables(&snap.tables);
    for t in &snap.tables {
        if t.backend == Backend::Nftables && t.name == TABLE {
            if let Some(json) = nft_table(ns, t.family.name()) {
                s.add_nft(&json);
            }
        }
    }
    s.local = snap
        .ifaces
        .iter()
        .flat_map(|i| i.addrs.iter().copied())
        .collect();
    s
}

impl KubeCache {
    /// The names in `ns`, empty when kube-proxy wrote nothing there;
    /// `may_read`: take a snapshot when none is fresh.
    pub fn get(
        &mut self,
        nf: &mut NetfilterContext,
        ns: &Netns,
        may_read: bool,
    ) -> Option<Arc<Services>> {
        let latest = nf.latest(ns.inode);
        if let Some(e) = self.by_ns.get(&ns.inode) {
            let same = latest.as_ref().is_some_and(|l| Arc::ptr_eq(l, &e.snap));
            if same && (e.read.elapsed() < FRESH || !may_read) {
                return Some(Arc::clone(&e.services));
            }
        }
        let newer = latest.filter(|l| {
            self.by_ns
                .get(&ns.inode)
                .is_none_or(|e| !Arc::ptr_eq(l, &e.snap))
        });
        // No snapshot newer than the one read: read the rules now.
        let snap = match newer {
            Some(s) => s,
            None if may_read => nf.around(ns, u64::MAX)?.1,
            None => return None,
        };
        let services = Arc::new(build(&snap, ns));
        if self.by_ns.len() > 256 {
            self.by_ns.clear();
        }
        self.by_ns.insert(
            ns.inode,
            Entry {
                snap,
                read: Instant::now(),
                services: Arc::clone(&services),
            },
        );
        Some(services)
    }
}
