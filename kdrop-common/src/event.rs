//! Records on the ring buffer, and the per-CPU state they are built from.
//! Every record starts with an [`EventHeader`]; every record about a packet
//! carries its [`PacketId`].

/// One IPv4 FIB table lookup as `fib:fib_table_lookup` saw it: the kernel's
/// own routing decision, e.g. the reverse-path lookup `fib_validate_source`
/// does for a packet's source.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FibLookup {
    pub ts_ns: u64,
    pub tb_id: u32,
    /// 0, or a negative errno (-EAGAIN: no match in this table).
    pub err: i32,
    pub iif: u32,
    pub oif: u32,
    pub mark: u32,
    /// Network order.
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
    /// Result device ifindex, 0 if none.
    pub res_ifindex: u32,
    /// Gateway (network order) when `gw_family` is AF_INET.
    pub gw: [u8; 4],
    pub scope: u8,
    pub gw_family: u8,
    pub _pad: [u8; 2],
    /// Netns inode of the result device; 0 when the lookup found nothing
    /// (the lookup itself does not say which namespace it ran in).
    pub netns: u32,
    pub _pad2: u32,
}

impl FibLookup {
    pub const fn zeroed() -> Self {
        Self {
            ts_ns: 0,
            tb_id: 0,
            err: 0,
            iif: 0,
            oif: 0,
            mark: 0,
            saddr: [0; 4],
            daddr: [0; 4],
            res_ifindex: 0,
            gw: [0; 4],
            scope: 0,
            gw_family: 0,
            _pad: [0; 2],
            netns: 0,
            _pad2: 0,
        }
    }
}

/// Lookups kept per CPU; a power of two.
pub const FIB_RECENT: usize = 16;
/// Lookups userspace keeps for one drop, out of the `FIB_RECENT` it gets.
pub const FIB_PER_EVENT: usize = 8;
/// How old a lookup may be and still belong to the packet being dropped
/// (same CPU, matching addresses): a packet's route lookups and its drop are
/// microseconds apart in one softirq.
pub const FIB_WINDOW_NS: u64 = 10_000_000;

/// The per-CPU ring of recent lookups.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FibRecent {
    pub next: u32,
    pub _pad: u32,
    pub entries: [FibLookup; FIB_RECENT],
}

/// `EventHeader.kind` values.
pub const EVENT_DROP: u32 = 1;
/// A handshake packet leaving a device ([`PacketEvent`]).
pub const EVENT_EGRESS: u32 = 2;
/// A drop with its CPU's recent route lookups ([`RoutedDropEvent`]).
pub const EVENT_DROP_ROUTED: u32 = 4;
/// A local socket retransmitted its SYN or SYN-ACK ([`PacketEvent`], no
/// conntrack entry, the flags of what was retransmitted).
pub const EVENT_RETRANS: u32 = 5;
pub const EVENT_HEAD: u32 = 6;
/// A local socket left SYN-SENT for CLOSE: its connect() ended without a
/// connection ([`AbandonEvent`]).
pub const EVENT_ABANDON: u32 = 7;

/// The client's initial sequence number a handshake packet carries or
/// answers, from its TCP header: a SYN's own sequence number; a SYN-ACK's
/// (or a RST|ACK refusing a SYN) acknowledgement minus one; a plain RST
/// refusing a SYN-ACK, or the final ACK, carries the client's ISN + 1 as
/// its sequence number (RFC 9293 3.5, 3.10.7). NAT leaves both alone.
pub const fn handshake_isn(flags: u8, seq: u32, ack: u32) -> u32 {
    use crate::{TCP_ACK, TCP_RST, TCP_SYN};
    if flags & TCP_SYN != 0 && flags & TCP_ACK == 0 {
        seq
    } else if flags & TCP_ACK != 0 && flags & (TCP_SYN | TCP_RST) != 0 {
        ack.wrapping_sub(1)
    } else {
        seq.wrapping_sub(1)
    }
}

/// Bytes of a dropped packet copied for `--pcap`, from its IP header.
pub const HEAD_BYTES: usize = 128;

/// The first [`HEAD_BYTES`] bytes of a dropped packet from its network
/// header, written just before its [`DropEvent`], with the same header
/// timestamp and CPU (userspace pairs them by those). Only for drops that
/// become records: admitted, sampled in, and only with `--pcap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadEvent {
    pub header: EventHeader,
    pub bytes: [u8; HEAD_BYTES],
}

/// First bytes of every record on the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    pub kind: u32,
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
}

/// Which packet, and where: embedded in every record about a packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketId {
    /// Network namespace inode.
    pub netns: u32,
    /// Where it came in (or, for a locally sent packet, where it leaves).
    pub ifindex: u32,
    /// `skb->mark`.
    pub mark: u32,
    /// The client's initial sequence number of the handshake this packet
    /// belongs to ([`handshake_isn`]): one connection, even when another
    /// reuses its ports. 0: unknown.
    pub isn: u32,
    /// Network order; IPv4 in the first 4 bytes.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Host order.
    pub sport: u16,
    pub dport: u16,
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    pub tcp_flags: u8,
    pub _pad: [u8; 2],
}

impl PacketId {
    pub const fn zeroed() -> Self {
        Self {
            netns: 0,
            ifindex: 0,
            mark: 0,
            isn: 0,
            saddr: [0; 16],
            daddr: [0; 16],
            sport: 0,
            dport: 0,
            family: 0,
            tcp_flags: 0,
            _pad: [0; 2],
        }
    }
}

/// A TCP packet freed by `kfree_skb` with a drop reason.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropEvent {
    pub header: EventHeader,
    pub pkt: PacketId,
    /// Return address in the function that freed the skb.
    pub location: u64,
    /// Raw `enum skb_drop_reason` value; `ABSENT` when the kernel gives none.
    pub reason: u32,
    /// What `fib_validate_source` returned for this packet (the last call
    /// on this CPU, for this skb, within `FIB_WINDOW_NS` of the drop;
    /// fexit/kretprobe rung): 0 or -errno.
    pub src_check_ret: i32,
    /// 1 when `src_check_ret` is this packet's.
    pub src_check_seen: u32,
    /// In a [`RoutedDropEvent`]: `FibRecent::next` at the copy, the oldest
    /// entry's slot.
    pub fib_next: u32,
    pub ct: CtInfo,
    /// The Ethernet source address the packet arrived with: the neighbour
    /// that sent it (the client, or the router it is behind). Valid when
    /// `src_mac_seen` is 1 (a received packet with an Ethernet header).
    pub src_mac: [u8; 6],
    pub src_mac_seen: u8,
    pub _pad: u8,
}

/// A drop whose reason route lookups can explain (`Evidence::route_reasons`),
/// with a copy of its CPU's ring of recent IPv4 route lookups as it was at
/// the drop; userspace picks the packet's own. Copied whole, not searched:
/// a search loop in the kernel cost the verifier hundreds of thousands of
/// instructions. Other drops are a bare [`DropEvent`], 900 bytes shorter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutedDropEvent {
    pub drop: DropEvent,
    pub fib: [FibLookup; FIB_RECENT],
}

/// The last `fib_validate_source` return on a CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrcCheck {
    pub ts_ns: u64,
    /// The packet it checked (`struct sk_buff *`): a drop takes only its
    /// own packet's result, not that of another packet routed just before.
    pub skb: u64,
    /// kretprobe rung: the skb of the call in progress, saved by the entry
    /// kprobe (the return context has no arguments).
    pub entry_skb: u64,
    pub ret: i32,
    pub _pad: u32,
}

/// One direction of a conntrack entry (`struct nf_conntrack_tuple`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtTuple {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Host order.
    pub sport: u16,
    pub dport: u16,
    pub protonum: u8,
    pub _pad: [u8; 3],
}

impl CtTuple {
    pub const fn zeroed() -> Self {
        Self {
            saddr: [0; 16],
            daddr: [0; 16],
            sport: 0,
            dport: 0,
            protonum: 0,
            _pad: [0; 3],
        }
    }
}

/// The conntrack entry a packet carried (`skb->_nfct`), if any.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtInfo {
    pub orig: CtTuple,
    pub reply: CtTuple,
    /// `enum ip_conntrack_status` bits (names from BTF).
    pub status: u32,
    pub mark: u32,
    pub zone: u16,
    /// `enum ip_conntrack_info` of this packet.
    pub ctinfo: u8,
    /// 1 when the packet had an entry.
    pub present: u8,
    pub _pad: u32,
}

impl CtInfo {
    pub const fn zeroed() -> Self {
        Self {
            orig: CtTuple::zeroed(),
            reply: CtTuple::zeroed(),
            status: 0,
            mark: 0,
            zone: 0,
            ctinfo: 0,
            present: 0,
            _pad: 0,
        }
    }
}

/// A handshake packet (SYN, SYN-ACK or RST) handed to a device for
/// transmission (`net:net_dev_queue`), with its conntrack entry; or a SYN
/// or SYN-ACK a local socket retransmitted (`EVENT_RETRANS`, no entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketEvent {
    pub header: EventHeader,
    pub pkt: PacketId,
    pub ct: CtInfo,
}

/// A local socket whose connect() ended in SYN-SENT (`sock:
/// inet_sock_set_state` SYN_SENT -> CLOSE): the application gave up (a
/// connect timeout, `err` 0), the kernel did (`ETIMEDOUT` after
/// tcp_syn_retries), or an answer refused it (`ECONNREFUSED`,
/// `EHOSTUNREACH`, ...). `pkt` is the socket's ends (client first) with the
/// SYN's sequence number; `retransmits` the SYN's retransmissions.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbandonEvent {
    pub header: EventHeader,
    pub pkt: PacketId,
    /// `sk->sk_err` (a positive errno; 0 when none was set).
    pub err: i32,
    /// `icsk_retransmits`, `ABSENT` when unreadable.
    pub retransmits: u32,
}

/// Entries of the per-CPU `COUNTERS` map, one per source of records.
pub const COUNTERS_KEY: u32 = 0;
/// Handshake packets leaving devices.
pub const EGRESS_COUNTERS_KEY: u32 = 1;
/// Netfilter verdict records (nf.rs).
pub const NF_VERDICT_COUNTERS_KEY: u32 = 2;
/// SYN and SYN-ACK retransmissions of local sockets, and their connects
/// abandoned in SYN-SENT.
pub const RETRANS_COUNTERS_KEY: u32 = 3;
pub const COUNTERS_KEYS: u32 = 4;

/// Per-CPU counters. `matched == emitted + lost + sampled_out + capped` on
/// every CPU, always.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets that passed the filter.
    pub matched: u64,
    /// Events written to the ring buffer.
    pub emitted: u64,
    /// Events lost because the ring buffer was full.
    pub lost: u64,
    /// Matched packets left out by sampling (`Filter::sample_every`).
    pub sampled_out: u64,
    /// Matched packets monitor mode's per-second cap refused
    /// (`MonitorConfig::events_per_sec`).
    pub capped: u64,
}
