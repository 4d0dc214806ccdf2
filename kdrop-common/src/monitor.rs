//! Monitor mode's in-kernel aggregation, sampling and cap.
use crate::{TCP_ACK, TCP_SYN};

/// Monitor mode (`kdrop monitor`), set at load time. All zero: live tracing,
/// every matched drop is an event and nothing is aggregated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorConfig {
    /// 1: count every matched drop in `AGGREGATE` before anything else.
    pub aggregate: u32,
    /// Detailed events per second per CPU (a token bucket refilled from
    /// `bpf_ktime_get_ns`, one second of burst); 0: no cap. Sampling is
    /// `Filter::sample_every`, the same for live tracing and monitor mode.
    pub events_per_sec: u32,
}

impl MonitorConfig {
    pub const fn zeroed() -> Self {
        Self {
            aggregate: 0,
            events_per_sec: 0,
        }
    }
}

/// Entries of the per-CPU `AGGREGATE` hash map (a `u64` packet count each).
pub const AGGREGATE_MAX_ENTRIES: u32 = 4096;

/// What drops are counted by in the kernel. The map is bounded: once it is
/// full, drops count into `AggKey::OVERFLOW`, which userspace inserts first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AggKey {
    /// Raw `enum skb_drop_reason`; `ABSENT` when the kernel gives none.
    pub reason: u32,
    pub netns: u32,
    pub ifindex: u32,
    /// The service side's port (see `service_port`).
    pub port: u16,
    /// 1 only in `OVERFLOW`.
    pub overflow: u16,
}

impl AggKey {
    pub const OVERFLOW: AggKey = AggKey {
        reason: 0,
        netns: 0,
        ifindex: 0,
        port: 0,
        overflow: 1,
    };
}

/// The port that names the service: a SYN's destination, a SYN-ACK's
/// source; otherwise the lower of the two (ephemeral ports are high). Keeps
/// client ports, one per connection, out of the aggregation key.
#[inline(always)]
pub fn service_port(tcp_flags: u8, sport: u16, dport: u16) -> u16 {
    match tcp_flags & (TCP_SYN | TCP_ACK) {
        TCP_SYN => dport,
        f if f == TCP_SYN | TCP_ACK => sport,
        _ => {
            if sport < dport {
                sport
            } else {
                dport
            }
        }
    }
}

/// Per-CPU state of monitor mode's token bucket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimiterState {
    /// Bucket content in nanoseconds of credit (one event costs
    /// 1e9 / events_per_sec), at most one second.
    pub credit_ns: u64,
    pub last_ns: u64,
}

/// Entries of the per-CPU `LIMITER` state: drops, egress packets.
pub const LIMITER_DROP: u32 = 0;
pub const LIMITER_EGRESS: u32 = 1;
pub const LIMITERS: u32 = 2;
