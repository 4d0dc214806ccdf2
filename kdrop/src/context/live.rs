//! [`Node`] for this machine: netlink, /proc/sys, the netfilter tools and
//! kallsyms, each cached.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    conntrack_lookup::{from_client, lookup, Side},
    kube::KubeCache,
    listeners::{counters_in, listener_for, listens_in, on_ports, snapshot_in, ListenCounters},
    neighbours,
    netfilter::{conntrack::reply_holder, NetfilterContext},
    netns::{self, in_netns, IfNames, Netns, NetnsRegistry},
    pods::Pods,
    procs::{Held, Holders},
    programs::{hook_progs, request_pending, socket_cgroup_progs},
    route_query::{query, reverse_lookup_v4},
    routing::ContextCache,
    sockets::syn_sent_to,
    NetnsName, Node,
};
use crate::{
    diagnosis::kube::Services,
    kernel::symbols,
    model::{
        listen::ListenerFound,
        netfilter::Snapshot,
        packet::{CtSeen, Tuple},
        pod::{Labels, Pod, PodId},
        progs::{CgroupProgs, HookProgs},
        routing::{NetnsContext, RouteLookup, RouteQuery},
    },
};

/// An entry looked for: by which tuple, in which namespace (None: all).
type FoundKey = (Side, Tuple, Option<u32>);

/// A reverse lookup asked, by namespace and the packet's fields.
type RouteKey = (u32, Ipv4Addr, Ipv4Addr, u32, bool);

/// Answers kept this long (a clashing reply tuple's holder (one ctnetlink lookup), a reverse
/// lookup): a burst of identical drops costs one question, not one each.
const HOLDER_FRESH: Duration = Duration::from_secs(1);
/// Drop locations kept named (kernel text does not move while kdrop runs).
const LOCATIONS_KEPT: usize = 4096;
const HOLDERS_KEPT: usize = 4096;
/// Namespaces searched for an entry by tuple.
const MAX_SEARCHED: usize = 64;
/// Namespaces the listen watch looks at for listeners (one sock_diag dump
/// each, every few seconds).
const MAX_WATCHED: usize = 1024;

pub struct Live {
    registry: NetnsRegistry,
    ifnames: IfNames,
    own_netns: u32,
    contexts: ContextCache,
    netfilter: NetfilterContext,
    reply_holders: HashMap<(u32, Tuple), (Instant, Option<String>)>,
    /// Entries found by tuple lately.
    found: HashMap<FoundKey, (Instant, Option<CtSeen>)>,
    /// Reverse lookups asked lately.
    routes: HashMap<RouteKey, (Instant, Option<(RouteQuery, RouteLookup)>)>,
    pods: Pods,
    kube: KubeCache,
    /// Processes holding sockets and BPF programs (one bounded scan).
    holders: Holders,
    /// Each namespace's listen counters at the previous read.
    listen_counters: HashMap<u32, ListenCounters>,
    /// Destinations no namespace listened on lately: a burst of
    /// unanswered SYNs to a remote host costs one search.
    no_listener: HashMap<SocketAddr, Instant>,
    /// Cilium's drop counts at the previous read, by map id.
    cilium_seen: HashMap<u32, Vec<crate::model::progs::CiliumCount>>,
    /// Drop locations named lately: a flood drops at a handful of places.
    locations: HashMap<u64, Option<String>>,
}

impl Live {
    /// Cilium's drop counts, when one of `map_ids` is its metrics map, with
    /// the counts this node read from it the time before.
    fn cilium_metrics(&mut self, map_ids: &[u32]) -> Option<crate::model::progs::CiliumMetrics> {
        let (id, fd) = super::cilium::find(map_ids)?;
        let now = super::cilium::read(&fd)
            .map_err(|e| log::debug!("cilium_metrics (map {id}): {e:#}"))
            .ok()?;
        let before = self.cilium_seen.insert(id, now.clone());
        Some(crate::model::progs::CiliumMetrics {
            map_id: id,
            now,
            before,
        })
    }

    /// The kernel's symbols are not read here: `symbols::prefetch` after
    /// the programs are loaded keeps the read of /proc/kallsyms out of the
    /// start's memory peak (the BTF parsed for loading).
    pub fn new() -> Result<Self> {
        Ok(Self {
            registry: NetnsRegistry::new(),
            ifnames: IfNames::default(),
            own_netns: netns::own()?.inode,
            contexts: ContextCache::default(),
            netfilter: NetfilterContext::new(),
            reply_holders: HashMap::new(),
            found: HashMap::new(),
            routes: HashMap::new(),
            pods: Pods::default(),
            kube: KubeCache::default(),
            holders: Holders::new(),
            listen_counters: HashMap::new(),
            no_listener: HashMap::new(),
            cilium_seen: HashMap::new(),
            locations: HashMap::new(),
        })
    }

    /// kdrop's own namespace.
    pub fn own_netns(&self) -> u32 {
        self.own_netns
    }

    /// Is `ip` one of the namespace's addresses?
    fn is_local(&mut self, netns: u32, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.routing(netns)
            .is_some_and(|c| c.tables.addrs.iter().any(|a| a.addr == ip))
    }

    /// The prefix that runs a command in the namespace: its name, else
    /// (a pod's) through a process in it, else nothing (kdrop's own).
    fn exec_in(&self, ns: &Netns, pid: Option<u32>) -> String {
        match (&ns.name, pid) {
            (Some(n), _) => format!("ip netns exec {n} "),
            (None, _) if ns.inode == self.own_netns => String::new(),
            (None, Some(pid)) => format!("nsenter -t {pid} -n "),
            (None, None) => String::new(),
        }
    }

    /// Reads the rulesets of the namespace now, so that its first
    /// NETFILTER_DROP has counters from before it.
    pub fn prime_netfilter(&mut self, inode: u32) {
        if let Some(ns) = self.registry.lookup(inode) {
            self.netfilter.prime(&ns);
        }
    }

    /// What kept the newest reading of the namespace's rules from being
    /// whole: a tool that failed or did not answer (not one that is not
    /// installed).
    pub fn rules_unread(&self, inode: u32) -> Vec<String> {
        self.netfilter
            .latest(inode)
            .map(|s| {
                s.problems
                    .iter()
                    .filter(|p| !p.contains("installed"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Lists the pods' sandboxes now, in the background: a NetworkPolicy
    /// finding then names its pods' labels without a call to the runtime.
    pub fn ask_pod_labels_ahead(&mut self) {
        self.pods.ask_labels_ahead();
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
        let holder = reply_holder(&ns, reply);
        self.reply_holders
            .insert(key, (Instant::now(), holder.clone()));
        holder
    }

    fn reverse_route(
        &mut self,
        netns: u32,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        src_valid_mark: bool,
    ) -> Option<(RouteQuery, RouteLookup)> {
        let key = (netns, src, dst, mark, src_valid_mark);
        if let Some((at, answer)) = self.routes.get(&key) {
            if at.elapsed() < HOLDER_FRESH {
                return answer.clone();
            }
        }
        if self.routes.len() > HOLDERS_KEPT {
            self.routes.clear();
        }
        let ns = self.registry.lookup(netns)?;
        let answer = in_netns(&ns.path, move || {
            reverse_lookup_v4(src, dst, mark, src_valid_mark, 0, None)
        })
        .and_then(|r| r)
        .map_err(|e| log::debug!("reverse route of {src} in netns {netns}: {e:#}"))
        .ok();
        self.routes.insert(key, (Instant::now(), answer.clone()));
        answer
    }

    fn route_get(&mut self, netns: u32, q: &RouteQuery) -> Option<RouteLookup> {
        let ns = self.registry.lookup(netns)?;
        let q = q.clone();
        in_netns(&ns.path, move || query(&q))
            .and_then(|r| r)
            .map_err(|e| log::debug!("route query in netns {netns}: {e:#}"))
            .ok()
    }

    fn neighbour(
        &mut self,
        netns: u32,
        ifindex: u32,
        addr: std::net::IpAddr,
    ) -> Option<crate::model::neighbour::Neighbour> {
        let ns = self.registry.lookup(netns)?;
        neighbours::lookup_in(&ns.path, ifindex, addr)
            .map_err(|e| log::debug!("neighbour {addr} in netns {netns}: {e:#}"))
            .ok()
            .flatten()
    }

    fn neighbours_with(
        &mut self,
        netns: u32,
        ifindex: u32,
        lladdr: [u8; 6],
    ) -> Option<Vec<crate::model::neighbour::Neighbour>> {
        let ns = self.registry.lookup(netns)?;
        neighbours::dump_in(&ns.path)
            .map(|all| neighbours::with_lladdr(all, ifindex, &lladdr))
            .map_err(|e| log::debug!("neighbours of if{ifindex} in netns {netns}: {e:#}"))
            .ok()
    }

    fn route_out(&mut self, netns: u32, dst: std::net::IpAddr) -> Option<u32> {
        let ns = self.registry.lookup(netns)?;
        let answer = in_netns(&ns.path, move || query(&RouteQuery::get(dst)))
            .ok()?
            .ok()?;
        match answer {
            RouteLookup::Found(a) => a.oif,
            RouteLookup::Failed { .. } => None,
        }
    }

    fn conntrack_find(&mut self, side: Side, t: &Tuple, netns: Option<u32>) -> Option<CtSeen> {
        let key = (side, *t, netns);
        if let Some((at, found)) = self.found.get(&key) {
            if at.elapsed() < HOLDER_FRESH {
                return found.clone();
            }
        }
        if self.found.len() > HOLDERS_KEPT {
            self.found.clear();
        }
        // One ctnetlink GET per namespace, at most MAX_SEARCHED of them: a
        // refused SYN-ACK is rare, a namespace without the entry answers
        // ENOENT at once.
        let namespaces = match netns {
            Some(n) => self.registry.lookup(n).into_iter().collect(),
            None => self.registry.all(),
        };
        let found =
            namespaces
                .iter()
                .take(MAX_SEARCHED)
                .find_map(|ns| match lookup(ns, side, t, 0) {
                    Ok(found) => found,
                    Err(e) => {
                        log::debug!("conntrack lookup in netns {}: {e:#}", ns.inode);
                        None
                    }
                });
        self.found.insert(key, (Instant::now(), found.clone()));
        found
    }

    fn conntrack_from(&mut self, netns: u32, client: SocketAddr) -> Vec<CtSeen> {
        let Some(ns) = self.registry.lookup(netns) else {
            return Vec::new();
        };
        from_client(&ns, client).unwrap_or_else(|e| {
            log::debug!("conntrack entries from {client} in netns {netns}: {e:#}");
            Vec::new()
        })
    }

    fn waiting_for(&mut self, netns: u32, local: SocketAddr) -> Option<SocketAddr> {
        let first = self.registry.lookup(netns);
        let rest = self.registry.all();
        first
            .into_iter()
            .chain(rest.into_iter().filter(|n| n.inode != netns))
            .take(MAX_SEARCHED)
            .find_map(|ns| {
                in_netns(&ns.path, move || syn_sent_to(local))
                    .and_then(|r| r)
                    .map_err(|e| log::debug!("sockets of netns {}: {e:#}", ns.inode))
                    .ok()
                    .flatten()
            })
    }

    fn br_netfilter_loaded(&mut self) -> bool {
        Path::new("/sys/module/br_netfilter").exists()
    }

    fn symbol(&mut self, addr: u64) -> Option<String> {
        if let Some(s) = self.locations.get(&addr) {
            return s.clone();
        }
        let s = symbols::shared().resolve(addr);
        if self.locations.len() >= LOCATIONS_KEPT {
            self.locations.clear();
        }
        self.locations.insert(addr, s.clone());
        s
    }

    fn pod(&mut self, netns: u32) -> Option<Pod> {
        self.pods.of_netns(netns)
    }

    fn pod_of_addr(&mut self, addr: IpAddr) -> Option<Pod> {
        self.pods.of_addr(addr)
    }

    fn pod_labels(&mut self, pod: &PodId) -> Result<Labels, String> {
        self.pods.labels(pod)
    }

    fn service(&mut self, netns: u32, addr: SocketAddr) -> Option<String> {
        let s = self.kube(netns)?;
        super::service_of(&s, addr)
    }

    fn kube(&mut self, netns: u32) -> Option<Arc<Services>> {
        let ns = self.registry.lookup(netns)?;
        let own = netns == self.own_netns;
        let here = self.kube.get(&mut self.netfilter, &ns, own);
        if here.as_ref().is_some_and(|s| !s.is_empty()) || own {
            return here.filter(|s| !s.is_empty());
        }
        // A pod's namespace: kube-proxy's rules are the node's.
        let own = self.registry.lookup(self.own_netns)?;
        self.kube
            .get(&mut self.netfilter, &own, true)
            .filter(|s| !s.is_empty())
    }

    fn listener(&mut self, near: u32, dst: SocketAddr) -> Option<ListenerFound> {
        if self
            .no_listener
            .get(&dst)
            .is_some_and(|at| at.elapsed() < HOLDER_FRESH)
        {
            return None;
        }
        if self.no_listener.len() > HOLDERS_KEPT {
            self.no_listener.clear();
        }
        let first = self.registry.lookup(near);
        let rest = self.registry.all();
        let spaces: Vec<Netns> = first
            .into_iter()
            .chain(rest.into_iter().filter(|n| n.inode != near))
            .take(MAX_SEARCHED)
            .collect();
        for ns in spaces {
            let snap = match snapshot_in(&ns.path) {
                Ok(s) => s,
                Err(e) => {
                    log::debug!("listeners of netns {}: {e:#}", ns.inode);
                    continue;
                }
            };
            let Some(l) = listener_for(&snap.listeners, dst).cloned() else {
                continue;
            };
            // A wildcard listener takes the SYN only where dst is local.
            if l.local.ip().is_unspecified() && !self.is_local(ns.inode, dst.ip()) {
                continue;
            }
            let before = self.listen_counters.insert(ns.inode, snap.counters.clone());
            let owners = self.holders.lookup(Held::Socket(l.inode));
            return Some(ListenerFound {
                netns: ns.inode,
                netns_name: ns.name.clone().unwrap_or_else(|| ns.inode.to_string()),
                exec: self.exec_in(&ns, owners.first().map(|p| p.pid)),
                listener: l,
                sysctls: snap.sysctls,
                counters: snap.counters,
                counters_before: before,
                owners,
            });
        }
        self.no_listener.insert(dst, Instant::now());
        None
    }

    fn listen_spaces(&mut self, ports: &[u16]) -> Vec<u32> {
        let own = self.own_netns;
        let mut out = vec![own];
        for ns in self.registry.all().into_iter().take(MAX_WATCHED) {
            if ns.inode == own {
                continue;
            }
            match listens_in(&ns.path, ports) {
                Ok(true) => out.push(ns.inode),
                Ok(false) => {}
                Err(e) => log::debug!("listeners of netns {}: {e:#}", ns.inode),
            }
        }
        out
    }

    fn listen_counters(&mut self, netns: u32) -> Option<ListenCounters> {
        let ns = self.registry.lookup(netns)?;
        counters_in(&ns.path)
            .map_err(|e| log::debug!("listen counters of netns {netns}: {e:#}"))
            .ok()
    }

    fn listeners_of(&mut self, netns: u32, ports: &[u16]) -> Vec<ListenerFound> {
        let Some(ns) = self.registry.lookup(netns) else {
            return Vec::new();
        };
        let snap = match snapshot_in(&ns.path) {
            Ok(s) => s,
            Err(e) => {
                log::debug!("listeners of netns {netns}: {e:#}");
                return Vec::new();
            }
        };
        snap.listeners
            .iter()
            .filter(|l| on_ports(l, ports))
            .map(|l| {
                let owners = self.holders.lookup(Held::Socket(l.inode));
                ListenerFound {
                    netns,
                    netns_name: ns.name.clone().unwrap_or_else(|| netns.to_string()),
                    exec: self.exec_in(&ns, owners.first().map(|p| p.pid)),
                    listener: l.clone(),
                    sysctls: snap.sysctls.clone(),
                    counters: snap.counters.clone(),
                    counters_before: None,
                    owners,
                }
            })
            .collect()
    }

    fn request_pending(
        &mut self,
        netns: u32,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Option<bool> {
        let ns = self.registry.lookup(netns)?;
        request_pending(&ns.path, local, remote)
            .map_err(|e| log::debug!("request sockets of netns {netns}: {e:#}"))
            .ok()
    }

    fn cgroup_programs(
        &mut self,
        netns: u32,
        local: SocketAddr,
        hook: &str,
    ) -> Option<CgroupProgs> {
        let ns = self.registry.lookup(netns)?;
        socket_cgroup_progs(&ns.path, local, hook, &mut self.holders)
            .map_err(|e| log::debug!("cgroup programs of {local} in netns {netns}: {e:#}"))
            .ok()
            .flatten()
    }

    fn hook_programs(&mut self, netns: u32, ifindex: u32, hook: &str) -> Option<HookProgs> {
        let ns = self.registry.lookup(netns)?;
        let mut h = hook_progs(&ns.path, ifindex, hook, &mut self.holders)
            .map_err(|e| log::debug!("programs of if{ifindex} in netns {netns}: {e:#}"))
            .ok()?;
        for p in &mut h.progs {
            p.cilium_metrics = self.cilium_metrics(&p.map_ids);
        }
        Some(h)
    }
}
