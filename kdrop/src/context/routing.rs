//! Routing context per network namespace: links, addresses, routes, rules
//! (netlink) and the IPv4 conf sysctls, cached. A namespace is read again
//! when its netlink notifications say something changed, and its sysctls at
//! most once a second (only rp_filter changes are notified), so a flood of
//! identical drops costs one read.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    netlink::{dump_tables, Socket, GROUPS},
    netns::{in_netns, Netns},
    sysctl::read_confs,
};
use crate::model::routing::NetnsContext;

struct Entry {
    ctx: Arc<NetnsContext>,
    /// Subscribed to this namespace's route/rule/address/link changes.
    watcher: Socket,
    sysctls_read: Instant,
}

pub const SYSCTL_TTL: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct ContextCache {
    entries: HashMap<u32, Entry>,
    generation: u64,
    /// How many full reads were done (for tests and the summary).
    pub reads: u64,
}

impl ContextCache {
    pub fn get(&mut self, ns: &Netns) -> Result<Arc<NetnsContext>> {
        let stale = match self.entries.get(&ns.inode) {
            None => true,
            Some(e) => e.watcher.drain(),
        };
        if stale {
            let (tables, confs, watcher) = in_netns(&ns.path, || -> Result<_> {
                // Subscribe first: a change during the dump is then seen.
                let watcher = Socket::open(GROUPS, true)?;
                let tables = dump_tables()?;
                let confs = read_confs(tables.links.iter().map(|l| l.name.as_str()));
                Ok((tables, confs, watcher))
            })??;
            self.generation += 1;
            self.reads += 1;
            let ctx = Arc::new(NetnsContext {
                tables,
                confs,
                generation: self.generation,
            });
            self.entries.insert(
                ns.inode,
                Entry {
                    ctx: ctx.clone(),
                    watcher,
                    sysctls_read: Instant::now(),
                },
            );
            return Ok(ctx);
        }
        let entry = self.entries.get_mut(&ns.inode).expect("checked above");
        if entry.sysctls_read.elapsed() >= SYSCTL_TTL {
            let names: Vec<String> = entry
                .ctx
                .tables
                .links
                .iter()
                .map(|l| l.name.clone())
                .collect();
            let confs = in_netns(&ns.path, move || {
                read_confs(names.iter().map(String::as_str))
            })?;
            entry.sysctls_read = Instant::now();
            if confs != entry.ctx.confs {
                self.generation += 1;
                entry.ctx = Arc::new(NetnsContext {
                    tables: entry.ctx.tables.clone(),
                    confs,
                    generation: self.generation,
                });
            }
        }
        Ok(entry.ctx.clone())
    }

    /// Forgets a namespace (it went away).
    pub fn remove(&mut self, inode: u32) {
        self.entries.remove(&inode);
    }
}
