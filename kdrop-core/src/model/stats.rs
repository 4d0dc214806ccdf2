//! The accounting of a run: the kernel's per-source counters (matched =
//! emitted + lost + sampled out + capped, on every CPU) and userspace's own.
use std::time::Duration;

use kdrop_common::{Counters, FollowStats};

#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Drops (`skb:kfree_skb`).
    pub drops: Counters,
    /// Handshake packets leaving devices.
    pub egress: Counters,
    /// Netfilter drop verdicts.
    pub verdicts: Counters,
    /// SYN and SYN-ACK retransmissions of local sockets.
    pub retrans: Counters,
    /// Connections followed across NAT and namespaces.
    pub follow: FollowStats,
    /// On-demand points that were armed: name, how often, how long.
    pub armed: Vec<(String, u32, Duration)>,
    /// Ring buffer records that did not decode.
    pub undecodable: u64,
    /// ctnetlink destroy events read, and socket overruns (events lost).
    pub ct_received: u64,
    pub ct_overruns: u64,
    /// SYN drops not reported: TCP freed them after answering them another
    /// way, outside any failed handshake (enrich's `tcp_freed`).
    pub answered_by_tcp: u64,
    pub elapsed: Duration,
}
