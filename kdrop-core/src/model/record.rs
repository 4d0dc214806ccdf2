//! What kdrop reports for one event: the JSON schema (README). Field names
//! are a promise: add fields, never rename these.
use std::{net::IpAddr, sync::Arc};

use serde::Serialize;

use super::{finding::Finding, netfilter::Attribution, pod::ConnPods, policy::PolicyDrop};

/// A drop with everything userspace learned about it. Field names are the JSON
/// schema (README): add fields, never rename these.
#[derive(Clone, Debug, Serialize)]
pub struct DropRecord {
    /// The kernel record's CPU and timestamp (a drop's): pairs it with the
    /// packet's bytes for --pcap. Not part of the output.
    #[serde(skip)]
    pub packet: Option<(u32, u64)>,
    pub ts: String,
    pub kind: &'static str,
    pub netns: u32,
    pub netns_name: Option<String>,
    /// `pod` (the pod whose network namespace this is: `namespace/name` as
    /// the container runtime recorded it, else its UID, else
    /// `container/<id12>`; null for the node or a namespace no runtime
    /// claims), `container` (its containers by name, `,` between several),
    /// `client_pod` and `backend_pod` (the pods whose addresses start and
    /// serve the connection, after any DNAT), `service`
    /// (`namespace/name:port` of the Service the connection was sent to, or
    /// whose endpoint it reached, from kube-proxy's rules).
    #[serde(flatten)]
    pub pods: ConnPods,
    pub ifname: String,
    pub ifindex: u32,
    pub family: &'static str,
    pub saddr: IpAddr,
    pub sport: u16,
    pub daddr: IpAddr,
    pub dport: u16,
    pub tcp_flags: String,
    /// Kernel name without `SKB_DROP_REASON_`; null when the kernel gives none.
    pub reason: Option<String>,
    /// `symbol+0xoff`, or the raw address when symbols are hidden.
    pub location: String,
    pub mark: u32,
    /// The kernel's IPv4 route lookups for this packet (fib:fib_table_lookup).
    pub route_lookups: Vec<LookupRecord>,
    /// The conntrack entry the packet carried.
    pub ct: Option<CtRecord>,
    /// Shared: a flood of drops with one cause carries one finding
    /// (enrich::memo), and each handshake keeps its verdict.
    pub finding: Option<Arc<Finding>>,
    /// For NETFILTER_DROP: the rule, chain policy or conntrack drop.
    pub netfilter: Option<Arc<Attribution>>,
    /// A connection a network policy denied (Calico, kube-router,
    /// Cilium), in Kubernetes terms; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<PolicyDrop>,
    /// The connection attempt this record belongs to: every record of one
    /// handshake (its drops, its retransmissions counted, the RST that
    /// refused it, its conntrack entry dying) has the same id and the same
    /// verdict in `finding`.
    pub handshake: Option<u64>,
}

/// A conntrack entry: both directions, as `conntrack -L` shows them.
#[derive(Clone, Debug, Serialize)]
pub struct CtRecord {
    pub orig: TupleRecord,
    pub reply: TupleRecord,
    /// `enum ip_conntrack_status` bit names, e.g. `["CONFIRMED", "DST_NAT"]`.
    pub status: Vec<String>,
    pub mark: u32,
    pub zone: u16,
}

#[derive(Clone, Debug, Serialize)]
pub struct TupleRecord {
    pub src: String,
    pub dst: String,
}

/// One route lookup the kernel did for the packet.
#[derive(Clone, Debug, Serialize)]
pub struct LookupRecord {
    pub table: u32,
    /// 0, or the negative errno of a failed lookup (-11: no match in this table).
    pub err: i32,
    pub src: std::net::Ipv4Addr,
    pub dst: std::net::Ipv4Addr,
    pub iif: u32,
    pub oif: u32,
    pub mark: u32,
    /// Result interface name, resolved in the packet's namespace.
    pub dev: Option<String>,
    pub gw: Option<std::net::Ipv4Addr>,
}

impl DropRecord {
    pub fn src(&self) -> String {
        endpoint(self.saddr, self.sport)
    }

    pub fn dst(&self) -> String {
        endpoint(self.daddr, self.dport)
    }
}

pub fn endpoint(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}
