//! The node as it is, read on demand: namespaces and their names,
//! interfaces, routing tables and rules (netlink), sysctls, netfilter
//! rulesets and conntrack (the tools' output), ctnetlink events, pods.
//! I/O only: what is read here lands in `model` types for `diagnosis`.
//!
//! [`Node`] is what enrichment asks of the node. [`Live`] reads this
//! machine; a recorded incident can answer the same questions.
pub mod bpf_progs;
pub mod ctevents;
pub mod listeners;
pub mod live;
pub mod neighbours;
pub mod netfilter;
pub mod netlink;
pub mod netns;
pub mod pods;
pub mod procs;
pub mod route_query;
pub mod routing;
pub mod sysctl;
pub mod tc_filters;

use std::sync::Arc;

pub use self::{
    live::Live,
    netns::{in_netns, Netns, NetnsRegistry},
};
use crate::model::{netfilter::Snapshot, packet::Tuple, routing::NetnsContext};

/// A network namespace as records name it.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// Is br_netfilter loaded (bridged packets pass iptables)?
    fn br_netfilter_loaded(&mut self) -> bool;
    /// `symbol+0xoff` for a kernel code address.
    fn symbol(&mut self, addr: u64) -> Option<String>;
}
