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
pub(crate) mod questions;
pub mod recording;
pub mod replay;
pub mod route_query;
pub mod routing;
pub mod sockets;
pub mod sysctl;
pub mod tape;
pub mod tc_filters;

use std::{net::SocketAddr, sync::Arc};

pub use self::{
    live::Live,
    netns::{in_netns, Netns, NetnsRegistry},
};
use crate::diagnosis::kube::Services;
use crate::model::{netfilter::Snapshot, routing::NetnsContext};

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

/// The Service `namespace/name:port` that `addr` reaches, as kube-proxy's
/// rules name it (Node::service's answer, from Node::kube's).
pub fn service_of(s: &Services, addr: SocketAddr) -> Option<String> {
    s.frontend(addr, s.local.contains(&addr.ip()))
        .map(|f| &f.svc)
        .or_else(|| s.serving(addr))
        .map(|svc| svc.display())
}

/// A plain question of `Node`, declared (questions.rs has each one's doc).
macro_rules! node_plain {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $unknown:expr;)*) => {
        $(
            $(#[$doc])*
            fn $name(&mut self, $($arg: $ty),*) -> $ret;
        )*
    };
}

/// What enrichment needs to know about the node around an event. Answers
/// are cached by the implementation: a flood of identical drops costs one
/// read.
pub trait Node {
    // The plain questions, declared from their one list (questions.rs),
    // which also writes Recorder's, Replay's and the tests' `asked`.
    questions::plain_questions!(node_plain);

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
    /// The Service names kube-proxy's rules give in `netns` (or, when it
    /// holds none, in kdrop's own namespace, the node's), with the
    /// namespace's own addresses (for node ports). None without kube-proxy.
    /// Required, not defaulted: a wrapper (recording, replay) that forgot
    /// it would silently lose the names.
    fn kube(&mut self, netns: u32) -> Option<Arc<Services>>;
}
