//! TCP listeners as the node shows them (sock_diag, /proc): their queues,
//! the sysctls that bound them, the TcpExt counters that record their
//! overflows, and the processes that own them. Filled by
//! `context::listeners` and `context::procs`.
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

/// A TCP listener and its queues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    pub local: SocketAddr,
    /// SO_BINDTODEVICE ifindex (0: none).
    pub bound_if: u32,
    /// Connections waiting for accept() (`sk_ack_backlog`).
    pub accept_queue: u32,
    /// The backlog in force: min(listen()'s backlog, somaxconn) (`sk_max_ack_backlog`).
    pub accept_backlog: u32,
    /// Request sockets waiting for the final ACK (SYN queue).
    pub syn_queue: u32,
    pub inode: u64,
    pub uid: u32,
}

/// Sysctls of the namespace that bound listen queues (None: unreadable).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenSysctls {
    pub somaxconn: Option<u32>,
    pub tcp_max_syn_backlog: Option<u32>,
    pub tcp_syncookies: Option<u32>,
}

/// TcpExt counters of the namespace (/proc/thread-self/net/netstat).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenCounters {
    pub listen_overflows: Option<u64>,
    pub listen_drops: Option<u64>,
    pub syncookies_sent: Option<u64>,
    pub req_q_full_drop: Option<u64>,
    pub req_q_full_do_cookies: Option<u64>,
}

/// Everything above for one namespace, read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenSnapshot {
    pub listeners: Vec<Listener>,
    pub sysctls: ListenSysctls,
    pub counters: ListenCounters,
}

/// A process holding the object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    pub pid: u32,
    pub comm: String,
    /// argv joined by spaces (empty for kernel threads).
    pub cmdline: String,
}

/// The listener a SYN went to, found in its namespace, with what bounds
/// its queues and the process that should be calling accept().
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerFound {
    pub netns: u32,
    /// The namespace's name (or inode) as records show it.
    pub netns_name: String,
    /// The prefix that runs a command in that namespace (`ip netns exec N `,
    /// `nsenter -t PID -n `), empty for kdrop's own.
    pub exec: String,
    pub listener: Listener,
    pub sysctls: ListenSysctls,
    pub counters: ListenCounters,
    /// The counters at kdrop's previous read of this namespace, if any.
    pub counters_before: Option<ListenCounters>,
    /// Processes holding the listening socket.
    pub owners: Vec<ProcessRef>,
}

impl Listener {
    /// The kernel's test: more waiting than the backlog allows.
    pub fn accept_queue_full(&self) -> bool {
        self.accept_queue > self.accept_backlog
    }

    /// Does a SYN to `dst` reach this listener's address? (The wildcard
    /// address, or the same address; an IPv6 wildcard also takes IPv4 unless
    /// IPV6_V6ONLY, which diag does not report.)
    pub fn serves(&self, dst: SocketAddr) -> bool {
        if self.local.port() != dst.port() {
            return false;
        }
        let (mine, theirs) = (canon(self.local.ip()), canon(dst.ip()));
        mine == theirs
            || mine.is_unspecified() && (mine.is_ipv4() == theirs.is_ipv4() || mine.is_ipv6())
    }
}

/// The listener a SYN to `dst` goes to: an exact address before a wildcard.
pub fn listener_for(listeners: &[Listener], dst: SocketAddr) -> Option<&Listener> {
    let serving = || listeners.iter().filter(move |l| l.serves(dst));
    serving()
        .find(|l| !l.local.ip().is_unspecified())
        .or_else(|| serving().next())
}

/// IPv4-mapped IPv6 addresses as IPv4.
fn canon(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}
