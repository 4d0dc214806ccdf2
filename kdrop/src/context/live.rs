//! [`Node`] for this machine: netlink, /proc/sys, the netfilter tools and
//! kallsyms, each cached.
use std::{
    collections::HashMap,
    path::Path,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    netfilter::{conntrack::reply_holder, NetfilterContext},
    netns::{self, IfNames, NetnsRegistry},
    routing::ContextCache,
    NetnsName, Node,
};
use crate::{
    kernel::symbols::Symbols,
    model::{netfilter::Snapshot, packet::Tuple, routing::NetnsContext},
};

/// Holders of a clashing reply tuple kept this long: a burst of clashes on
/// one tuple costs one `conntrack -L`, not one each.
const HOLDER_FRESH: Duration = Duration::from_secs(1);
const HOLDERS_KEPT: usize = 4096;

pub struct Live {
    registry: NetnsRegistry,
    ifnames: IfNames,
    own_netns: u32,
    contexts: ContextCache,
    netfilter: NetfilterContext,
    reply_holders: HashMap<(u32, Tuple), (Instant, Option<String>)>,
    symbols: Option<Symbols>,
    symbols_loading: Option<JoinHandle<Result<Symbols>>>,
}

impl Live {
    pub fn new() -> Result<Self> {
        Ok(Self {
            registry: NetnsRegistry::new(),
            ifnames: IfNames::default(),
            own_netns: netns::own()?.inode,
            contexts: ContextCache::default(),
            netfilter: NetfilterContext::new(),
            reply_holders: HashMap::new(),
            symbols: None,
            // 100k+ lines: read off the startup path.
            symbols_loading: Some(std::thread::spawn(Symbols::load)),
        })
    }

    /// kdrop's own namespace.
    pub fn own_netns(&self) -> u32 {
        self.own_netns
    }

    /// Reads the rulesets of the namespace now, so that its first
    /// NETFILTER_DROP has counters from before it.
    pub fn prime_netfilter(&mut self, inode: u32) {
        if let Some(ns) = self.registry.lookup(inode) {
            self.netfilter.prime(&ns);
        }
    }
}

impl Node for Live {
    fn netns(&mut self, inode: u32) -> Option<NetnsName> {
        let ns = self.registry.lookup(inode)?;
        Some(NetnsName {
            inode,
            name: ns.name,
        })
    }

    fn ifname(&mut self, netns: u32, ifindex: u32) -> String {
        let ns = self.registry.lookup(netns);
        self.ifnames
            .get(ns.as_ref(), self.own_netns, netns, ifindex)
    }

    fn routing(&mut self, netns: u32) -> Option<Arc<NetnsContext>> {
        let ns = self.registry.lookup(netns)?;
        match self.contexts.get(&ns) {
            Ok(c) => Some(c),
            Err(e) => {
                log::warn!("routing context of netns {netns}: {e:#}");
                None
            }
        }
    }

    fn netfilter_around(
        &mut self,
        netns: u32,
        ts_ns: u64,
    ) -> Option<(Option<Arc<Snapshot>>, Arc<Snapshot>)> {
        let ns = self.registry.lookup(netns)?;
        self.netfilter.around(&ns, ts_ns)
    }

    fn netfilter_latest(&mut self, netns: u32) -> Option<Arc<Snapshot>> {
        self.netfilter.latest(netns)
    }

    fn reply_holder(&mut self, netns: u32, reply: &Tuple) -> Option<String> {
        let key = (netns, *reply);
        if let Some((at, holder)) = self.reply_holders.get(&key) {
            if at.elapsed() < HOLDER_FRESH {
                return holder.clone();
            }
        }
        if self.reply_holders.len() > HOLDERS_KEPT {
            self.reply_holders.clear();
        }
        let ns = self.registry.lookup(netns)?;
        let holder = reply_holder(&ns.path, reply);
        self.reply_holders
            .insert(key, (Instant::now(), holder.clone()));
        holder
    }

    fn br_netfilter_loaded(&mut self) -> bool {
        Path::new("/sys/module/br_netfilter").exists()
    }

    fn symbol(&mut self, addr: u64) -> Option<String> {
        if let Some(h) = self.symbols_loading.take() {
            let syms = match h.join() {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    log::warn!("no kernel symbols, locations stay addresses: {e:#}");
                    Symbols::default()
                }
                Err(_) => Symbols::default(),
            };
            self.symbols = Some(syms);
        }
        self.symbols
            .get_or_insert_with(Symbols::default)
            .resolve(addr)
    }
}
