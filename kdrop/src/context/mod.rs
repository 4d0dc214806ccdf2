//! The node as it is, read on demand: namespaces and their names,
//! interfaces, routing tables and rules (netlink), sysctls, netfilter
//! rulesets and conntrack (the tools' output), ctnetlink events, pods.
//! I/O only: what is read here lands in `model` types for `diagnosis`.
//!
//! [`Node`] is what enrichment asks of the node. [`Live`] reads this
//! machine; a recorded incident can answer the same questions.
pub mod bpf_progs;
pub mod bundles;
pub mod cilium;
pub mod conntrack_lookup;
pub mod cri;
pub mod ctevents;
pub mod kube;
pub mod listeners;
pub mod live;
pub mod neighbours;
pub mod netfilter;
pub mod netlink;
pub mod netns;
pub mod pod_addrs;
pub mod pods;
pub mod procs;
pub mod programs;
mod questions;
pub mod recording;
pub mod replay;
pub mod route_query;
pub mod routing;
pub mod sockets;
pub mod sysctl;
pub mod tape;
pub mod tc_filters;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

pub use self::{
    live::Live,
    netns::{in_netns, Netns, NetnsRegistry},
};
use crate::diagnosis::kube::Services;
use crate::model::{
    listen::{ListenCounters, ListenerFound},
    netfilter::Snapshot,
    packet::{CtSeen, Tuple},
    pod::{Labels, Pod, PodId},
    progs::{CgroupProgs, HookProgs},
    routing::{NetnsContext, RouteLookup, RouteQuery},
};

/// A network namespace as records name it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetnsName {
    pub inode: u32,
    /// Its name under /run/netns, if it has one.
    pub name: Option<String>,
}

impl NetnsName {
    /// The name, or the inode number.
    pub fn display(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.inode.to_string())
    }

    /// `ip netns exec NAME ` for commands a finding prints, or nothing for a
    /// namespace without a name (kdrop's own, a pod's).
    pub fn exec(&self) -> String {
        self.name
            .as_ref()
            .map(|n| format!("ip netns exec {n} "))
            .unwrap_or_default()
    }
}

/// What enrichment needs to know about the node around an event. Answers
/// are cached by the implementation: a flood of identical drops costs one
/// read.
pub trait Node {
    /// The namespace with this inode, if it still exists.
    fn netns(&mut self, inode: u32) -> Option<NetnsName>;
    /// The interface's name in its namespace (`ifN` when it is gone).
    fn ifname(&mut self, netns: u32, ifindex: u32) -> String;
    /// Links, addresses, routes, rules and conf sysctls of the namespace.
    fn routing(&mut self, netns: u32) -> Option<Arc<NetnsContext>>;
    /// The netfilter snapshots bracketing a drop at `ts_ns`: the newest
    /// before it (if any) and one after it.
    fn netfilter_around(
        &mut self,
        netns: u32,
        ts_ns: u64,
    ) -> Option<(Option<Arc<Snapshot>>, Arc<Snapshot>)>;
    /// The newest netfilter snapshot of the namespace.
    fn netfilter_latest(&mut self, netns: u32) -> Option<Arc<Snapshot>>;
    /// The conntrack entry of the namespace whose reply tuple is `reply`,
    /// as `orig A -> B, state S`.
    fn reply_holder(&mut self, netns: u32, reply: &Tuple) -> Option<String>;
    /// The reverse-path lookup `fib_validate_source` makes for an IPv4
    /// packet `src -> dst`, asked of the kernel now (netlink), and the query
    /// that asked it.
    fn reverse_route(
        &mut self,
        netns: u32,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        src_valid_mark: bool,
    ) -> Option<(RouteQuery, RouteLookup)>;
    /// The kernel's answer to a route query in the namespace, asked now.
    fn route_get(&mut self, netns: u32, q: &RouteQuery) -> Option<RouteLookup>;
    /// The neighbour entry of `addr` on device `ifindex` of the namespace.
    fn neighbour(
        &mut self,
        netns: u32,
        ifindex: u32,
        addr: std::net::IpAddr,
    ) -> Option<crate::model::neighbour::Neighbour>;
    /// The neighbour entries on device `ifindex` of the namespace whose
    /// link-layer address is `lladdr` (one host's IPv4, IPv6 link-local and
    /// global addresses share it); None when they cannot be read.
    fn neighbours_with(
        &mut self,
        netns: u32,
        ifindex: u32,
        lladdr: [u8; 6],
    ) -> Option<Vec<crate::model::neighbour::Neighbour>>;
    /// The device the namespace routes `dst` out of now (`ip route get`).
    fn route_out(&mut self, netns: u32, dst: std::net::IpAddr) -> Option<u32>;
    /// The conntrack entry whose `side` tuple is `t`, in namespace `netns`,
    /// or in any namespace of the node (a SYN-ACK that should have been
    /// un-NAT'd is the reply side of one).
    fn conntrack_find(
        &mut self,
        side: conntrack_lookup::Side,
        t: &Tuple,
        netns: Option<u32>,
    ) -> Option<CtSeen>;
    /// The TCP entries of namespace `netns` whose original source is
    /// `client` (address and port): where it sent its SYNs, NAT'd or not.
    fn conntrack_from(&mut self, netns: u32, client: SocketAddr) -> Vec<CtSeen>;
    /// The remote a client's SYN-SENT socket bound to `local` waits for,
    /// looked for in `netns` first, then in every namespace of the node.
    fn waiting_for(
        &mut self,
        netns: u32,
        local: std::net::SocketAddr,
    ) -> Option<std::net::SocketAddr>;
    /// Is br_netfilter loaded (bridged packets pass iptables)?
    fn br_netfilter_loaded(&mut self) -> bool;
    /// `symbol+0xoff` for a kernel code address.
    fn symbol(&mut self, addr: u64) -> Option<String>;
    /// The pod whose network namespace this is, as the container runtime
    /// recorded it; None for kdrop's own (the node's) and for a namespace
    /// no runtime claims.
    fn pod(&mut self, netns: u32) -> Option<Pod>;
    /// The pod one of whose addresses `addr` is, among the pods the
    /// runtime recorded (never the node's own addresses).
    fn pod_of_addr(&mut self, addr: IpAddr) -> Option<Pod>;
    /// The labels of a pod whose runtime's records (`pod`, `pod_of_addr`)
    /// gave none, asked of the container runtime over CRI; else why not
    /// (no CRI socket, the call failed, no such sandbox), in words. Asked
    /// only by findings that need them. Required, not defaulted, as `kube`.
    fn pod_labels(&mut self, pod: &PodId) -> Result<Labels, String>;
    /// The Service names kube-proxy's rules give in `netns` (or, when it
    /// holds none, in kdrop's own namespace, the node's), with the
    /// namespace's own addresses (for node ports). None without kube-proxy.
    /// Required, not defaulted: a wrapper (recording, replay) that forgot
    /// it would silently lose the names.
    fn kube(&mut self, netns: u32) -> Option<Arc<Services>>;
    /// The Service `namespace/name:port` that `addr` reaches in `netns`: its
    /// virtual address or node port, or a backend endpoint it serves, as
    /// kube-proxy's rules there name it (their comments).
    fn service(&mut self, netns: u32, addr: SocketAddr) -> Option<String> {
        let s = self.kube(netns)?;
        s.frontend(addr, s.local.contains(&addr.ip()))
            .map(|f| &f.svc)
            .or_else(|| s.serving(addr))
            .map(|svc| svc.display())
    }
    /// The listener a connection to `dst` reaches: in `near` first, then in
    /// every namespace of the node where `dst` is a local address; with its
    /// queues, sysctls, counters and owning processes.
    fn listener(&mut self, near: u32, dst: SocketAddr) -> Option<ListenerFound>;
    /// The namespaces whose listeners the listen watch reads: kdrop's own
    /// and every one with a TCP listener on one of `ports` (any port when
    /// empty).
    fn listen_spaces(&mut self, ports: &[u16]) -> Vec<u32>;
    /// The namespace's TcpExt listen counters now (one file read).
    fn listen_counters(&mut self, netns: u32) -> Option<ListenCounters>;
    /// The namespace's listeners on `ports` (every one when empty), each
    /// with its queues, sysctls, counters and owning processes
    /// (`counters_before` None).
    fn listeners_of(&mut self, netns: u32, ports: &[u16]) -> Vec<ListenerFound>;
    /// Does a request socket `local` <- `remote` (SYN-RECV) wait in the
    /// namespace now? None when it cannot be read.
    fn request_pending(
        &mut self,
        netns: u32,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Option<bool>;
    /// What runs on `hook` (`ingress`, `egress` or `xdp`) of a device:
    /// tc filters, tcx and XDP programs, each program described.
    fn hook_programs(&mut self, netns: u32, ifindex: u32, hook: &str) -> Option<HookProgs>;
    /// The cgroup programs on `hook` for the local socket bound to `local`
    /// (its owner's cgroup and the ancestors').
    fn cgroup_programs(&mut self, netns: u32, local: SocketAddr, hook: &str)
        -> Option<CgroupProgs>;
}
