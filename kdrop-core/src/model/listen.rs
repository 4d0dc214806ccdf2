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

    /// The SYN queue at or past its limit: as many request sockets as the
    /// backlog (`inet_csk_reqsk_queue_is_full` compares them with
    /// `sk_max_ack_backlog`; 6.18 refuses only past it, holding backlog + 1
    /// as `tests/tests/listeners.rs` shows; older kernels at it), so equal
    /// is called full here, to blame a listener, never as a verdict.
    pub fn syn_queue_full(&self) -> bool {
        self.accept_backlog > 0 && self.syn_queue >= self.accept_backlog
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

/// How much the namespace's TcpExt listen counters grew between two reads
/// (a counter unreadable at either read, or one that went back because
/// the namespace was made again, counts 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenMoved {
    /// SYNs (and final ACKs) refused because the accept queue was full.
    pub listen_overflows: u64,
    /// Every SYN a listener dropped, overflows included.
    pub listen_drops: u64,
    /// SYNs dropped because the SYN queue was full and cookies were off.
    pub req_q_full_drop: u64,
    /// SYNs answered with a cookie because the SYN queue was full.
    pub req_q_full_do_cookies: u64,
    /// Cookies sent for any reason (tcp_syncookies=2 sends them always).
    pub syncookies_sent: u64,
}

impl ListenMoved {
    pub fn between(before: &ListenCounters, now: &ListenCounters) -> Self {
        let d = |b: Option<u64>, n: Option<u64>| match (b, n) {
            (Some(b), Some(n)) => n.saturating_sub(b),
            _ => 0,
        };
        Self {
            listen_overflows: d(before.listen_overflows, now.listen_overflows),
            listen_drops: d(before.listen_drops, now.listen_drops),
            req_q_full_drop: d(before.req_q_full_drop, now.req_q_full_drop),
            req_q_full_do_cookies: d(before.req_q_full_do_cookies, now.req_q_full_do_cookies),
            syncookies_sent: d(before.syncookies_sent, now.syncookies_sent),
        }
    }

    /// Did a listener refuse (or cookie) anything? SyncookiesSent alone
    /// does not count: with tcp_syncookies=2 it moves for every SYN.
    pub fn any(&self) -> bool {
        self.listen_overflows
            + self.listen_drops
            + self.req_q_full_drop
            + self.req_q_full_do_cookies
            > 0
    }

    pub fn add(&mut self, o: &ListenMoved) {
        self.listen_overflows += o.listen_overflows;
        self.listen_drops += o.listen_drops;
        self.req_q_full_drop += o.req_q_full_drop;
        self.req_q_full_do_cookies += o.req_q_full_do_cookies;
        self.syncookies_sent += o.syncookies_sent;
    }
}
