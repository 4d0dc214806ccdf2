//! Types shared by the eBPF programs and userspace.
//!
//! Everything here crosses the kernel/user boundary byte for byte: `#[repr(C)]`,
//! integers and arrays only, padding spelled out, no bools or enums. Userspace
//! gets `aya::Pod` impls with the `user` feature.
#![no_std]

pub mod nf;

/// Highest number of `--port` values the kernel filter holds.
pub const MAX_PORTS: usize = 16;
/// Highest number of `--host` CIDRs the kernel filter holds.
pub const MAX_HOSTS: usize = 4;

/// `Offset` value for a member the running kernel does not have.
pub const ABSENT: u32 = u32::MAX;

/// Byte offsets of the kernel struct members the programs read, resolved from
/// the running kernel's BTF at load time (Rust eBPF has no CO-RE).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `sk_buff.head` (`unsigned char *`).
    pub skb_head: u32,
    /// `sk_buff.network_header` (`__u16`, relative to `head`).
    pub skb_network_header: u32,
    /// `sk_buff.protocol` (`__be16`).
    pub skb_protocol: u32,
    /// `sk_buff.dev` (`struct net_device *`).
    pub skb_dev: u32,
    /// `sk_buff.sk` (`struct sock *`).
    pub skb_sk: u32,
    /// `sk_buff.skb_iif` (`int`): the ifindex the packet arrived on.
    pub skb_iif: u32,
    /// `sk_buff.mark` (`__u32`).
    pub skb_mark: u32,
    /// `net_device.ifindex` (`int`).
    pub dev_ifindex: u32,
    /// `net_device.nd_net.net` (`struct net *`).
    pub dev_net: u32,
    /// `sock.__sk_common.skc_net.net` (`struct net *`).
    pub sk_net: u32,
    /// `net.ns.inum` (`unsigned int`): the netns inode number.
    pub net_inum: u32,
    /// `flowi4.__fl_common.flowic_oif` (`int`).
    pub fl4_oif: u32,
    /// `flowi4.__fl_common.flowic_iif` (`int`).
    pub fl4_iif: u32,
    /// `flowi4.__fl_common.flowic_mark` (`__u32`).
    pub fl4_mark: u32,
    /// `flowi4.saddr` (`__be32`).
    pub fl4_saddr: u32,
    /// `flowi4.daddr` (`__be32`).
    pub fl4_daddr: u32,
    /// `fib_nh_common.nhc_dev` (`struct net_device *`).
    pub nhc_dev: u32,
    /// `fib_nh_common.nhc_gw` (union; IPv4 in its first 4 bytes).
    pub nhc_gw: u32,
    /// `fib_nh_common.nhc_gw_family` (`u8`).
    pub nhc_gw_family: u32,
    /// `fib_nh_common.nhc_scope` (`unsigned char`).
    pub nhc_scope: u32,
    pub _pad: u32,
    /// `sk_buff._nfct` (`unsigned long`: `struct nf_conn *` | ctinfo).
    pub skb_nfct: u32,
    /// `nf_conn.tuplehash[0].tuple`; the reply tuple follows at
    /// `+ ct_tuplehash_size`.
    pub ct_tuple: u32,
    pub ct_tuplehash_size: u32,
    /// Within `struct nf_conntrack_tuple`: `src.u3`, `src.u.all`,
    /// `dst.u3`, `dst.u.all`, `dst.protonum`.
    pub tuple_src_addr: u32,
    pub tuple_src_port: u32,
    pub tuple_dst_addr: u32,
    pub tuple_dst_port: u32,
    pub tuple_protonum: u32,
    /// `nf_conn.status` (`unsigned long`), `nf_conn.mark` (`u32`),
    /// `nf_conn.zone.id` (`u16`).
    pub ct_status: u32,
    pub ct_mark: u32,
    pub ct_zone: u32,
}

impl Offsets {
    pub const fn zeroed() -> Self {
        Self {
            skb_head: ABSENT,
            skb_network_header: ABSENT,
            skb_protocol: ABSENT,
            skb_dev: ABSENT,
            skb_sk: ABSENT,
            skb_iif: ABSENT,
            skb_mark: ABSENT,
            dev_ifindex: ABSENT,
            dev_net: ABSENT,
            sk_net: ABSENT,
            net_inum: ABSENT,
            fl4_oif: ABSENT,
            fl4_iif: ABSENT,
            fl4_mark: ABSENT,
            fl4_saddr: ABSENT,
            fl4_daddr: ABSENT,
            nhc_dev: ABSENT,
            nhc_gw: ABSENT,
            nhc_gw_family: ABSENT,
            nhc_scope: ABSENT,
            _pad: 0,
            skb_nfct: ABSENT,
            ct_tuple: ABSENT,
            ct_tuplehash_size: ABSENT,
            tuple_src_addr: ABSENT,
            tuple_src_port: ABSENT,
            tuple_dst_addr: ABSENT,
            tuple_dst_port: ABSENT,
            tuple_protonum: ABSENT,
            ct_status: ABSENT,
            ct_mark: ABSENT,
            ct_zone: ABSENT,
        }
    }
}

/// Where the `skb:kfree_skb` arguments are. For tp_btf and raw_tp these are
/// indexes into the `TP_PROTO` arguments; for the classic tracepoint they are
/// byte offsets into the trace record (from its `format` file). `ABSENT` when
/// the kernel does not pass it (no `reason` before 5.17).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KfreeSkbArgs {
    pub skb: u32,
    pub location: u32,
    pub reason: u32,
    /// The reason value that means "consumed, not dropped" (`SKB_CONSUMED`),
    /// `ABSENT` if the kernel has none.
    pub consumed: u32,
}

impl KfreeSkbArgs {
    pub const fn zeroed() -> Self {
        Self {
            skb: ABSENT,
            location: ABSENT,
            reason: ABSENT,
            consumed: ABSENT,
        }
    }
}

/// Where the `fib:fib_table_lookup` arguments are: `TP_PROTO` indexes for
/// tp_btf/raw_tp. `ABSENT` when the kernel does not pass one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FibLookupArgs {
    pub tb_id: u32,
    pub flp: u32,
    pub nhc: u32,
    pub err: u32,
}

impl FibLookupArgs {
    pub const fn zeroed() -> Self {
        Self {
            tb_id: ABSENT,
            flp: ABSENT,
            nhc: ABSENT,
            err: ABSENT,
        }
    }
}

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

/// An address or CIDR in the kernel filter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// Network-order address bytes; IPv4 uses the first 4.
    pub addr: [u8; 16],
    /// The prefix as a byte mask (userspace fills it from `prefix_len`), so
    /// the kernel side compares without branches.
    pub mask: [u8; 16],
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    pub prefix_len: u8,
    pub _pad: [u8; 2],
}

impl Cidr {
    pub const fn zeroed() -> Self {
        Self {
            addr: [0; 16],
            mask: [0; 16],
            family: 0,
            prefix_len: 0,
            _pad: [0; 2],
        }
    }

    /// `addr`/`prefix_len` with the mask filled in.
    pub fn new(family: u8, addr: [u8; 16], prefix_len: u8) -> Self {
        let mut mask = [0u8; 16];
        let mut bits = prefix_len as usize;
        for m in mask.iter_mut() {
            *m = if bits >= 8 { 0xff } else { !(0xffu8 >> bits) };
            bits = bits.saturating_sub(8);
        }
        Self {
            addr,
            mask,
            family,
            prefix_len,
            _pad: [0; 2],
        }
    }

    /// Does `addr` (network-order bytes of `family`) fall inside this CIDR?
    /// Branch-free over the bytes: the verifier walks it once.
    #[inline(always)]
    pub fn contains(&self, family: u8, addr: &[u8; 16]) -> bool {
        let mut diff = 0u8;
        let mut i = 0;
        while i < 16 {
            diff |= (addr[i] ^ self.addr[i]) & self.mask[i];
            i += 1;
        }
        diff == 0 && family == self.family
    }
}

/// What the kernel side lets through to userspace. Zero/empty fields match all.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter {
    /// Host-order ports; a packet matches if its source or destination is one.
    pub ports: [u16; MAX_PORTS],
    pub hosts: [Cidr; MAX_HOSTS],
    pub n_ports: u32,
    pub n_hosts: u32,
    /// Netns inode number, 0 for any.
    pub netns: u32,
    /// Ingress (or, for locally sent packets, egress) ifindex, 0 for any.
    pub ifindex: u32,
    /// A packet matches if `tcp_flags & tcp_flags_any != 0`; 0 matches all.
    pub tcp_flags_any: u8,
    pub _pad: [u8; 3],
    /// Emit 1 in this many matched packets (per CPU: the 1st, N+1th, ...);
    /// 0 or 1 emits all. The others are counted in `Counters::sampled_out`.
    pub sample_every: u32,
}

impl Filter {
    pub const fn zeroed() -> Self {
        Self {
            ports: [0; MAX_PORTS],
            hosts: [Cidr::zeroed(); MAX_HOSTS],
            n_ports: 0,
            n_hosts: 0,
            netns: 0,
            ifindex: 0,
            tcp_flags_any: 0,
            _pad: [0; 3],
            sample_every: 0,
        }
    }
}

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;

/// `EventHeader.kind` values.
pub const EVENT_DROP: u32 = 1;

/// First bytes of every record on the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    pub kind: u32,
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
}

/// A TCP packet freed by `kfree_skb` with a drop reason.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropEvent {
    pub header: EventHeader,
    /// Return address in the function that freed the skb.
    pub location: u64,
    /// Raw `enum skb_drop_reason` value; `ABSENT` when the kernel gives none.
    pub reason: u32,
    pub netns: u32,
    pub ifindex: u32,
    pub mark: u32,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Host order.
    pub sport: u16,
    pub dport: u16,
    pub family: u8,
    pub tcp_flags: u8,
    pub _pad: [u8; 2],
    /// 1 when `fib` holds this CPU's ring of recent IPv4 route lookups as
    /// it was at the drop (`FibRecent`); userspace picks the packet's own.
    /// Copied whole, not searched: a search loop in the kernel cost the
    /// verifier hundreds of thousands of instructions.
    pub fib_valid: u32,
    /// `FibRecent::next` at the copy: the oldest entry's slot.
    pub fib_next: u32,
    pub fib: [FibLookup; FIB_RECENT],
    pub ct: CtInfo,
    /// What `fib_validate_source` returned for this packet (the last call
    /// on this CPU, for this skb, within `FIB_WINDOW_NS` of the drop;
    /// fexit/kretprobe rung): 0 or -errno.
    pub src_check_ret: i32,
    /// 1 when `src_check_ret` is this packet's.
    pub src_check_seen: u32,
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

/// `EventHeader.kind` of a handshake packet leaving a device.
pub const EVENT_EGRESS: u32 = 2;

/// A handshake packet (SYN, SYN-ACK or RST) handed to a device for
/// transmission (`net:net_dev_queue`), with its conntrack entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketEvent {
    pub header: EventHeader,
    pub netns: u32,
    pub ifindex: u32,
    pub mark: u32,
    pub _pad0: u32,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub family: u8,
    pub tcp_flags: u8,
    pub _pad: [u8; 2],
    pub ct: CtInfo,
}

/// Entries of the per-CPU `COUNTERS` map: drops, and egress handshake packets.
pub const COUNTERS_KEY: u32 = 0;
pub const EGRESS_COUNTERS_KEY: u32 = 1;
/// Netfilter verdict records (nf.rs).
pub const NF_VERDICT_COUNTERS_KEY: u32 = 2;
pub const COUNTERS_KEYS: u32 = 3;

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

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are repr(C), made of integers and arrays, with
    // explicit padding fields: every bit pattern is valid.
    unsafe impl aya::Pod for Offsets {}
    unsafe impl aya::Pod for KfreeSkbArgs {}
    unsafe impl aya::Pod for Cidr {}
    unsafe impl aya::Pod for Filter {}
    unsafe impl aya::Pod for EventHeader {}
    unsafe impl aya::Pod for DropEvent {}
    unsafe impl aya::Pod for Counters {}
    unsafe impl aya::Pod for FibLookupArgs {}
    unsafe impl aya::Pod for FibLookup {}
    unsafe impl aya::Pod for FibRecent {}
    unsafe impl aya::Pod for CtTuple {}
    unsafe impl aya::Pod for CtInfo {}
    unsafe impl aya::Pod for PacketEvent {}
    unsafe impl aya::Pod for SrcCheck {}
    unsafe impl aya::Pod for MonitorConfig {}
    unsafe impl aya::Pod for AggKey {}
    unsafe impl aya::Pod for LimiterState {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut out = [0; 16];
        out[..4].copy_from_slice(&a);
        out
    }

    fn cidr(a: [u8; 4], len: u8) -> Cidr {
        Cidr::new(AF_INET, v4(a), len)
    }

    #[test]
    fn cidr_contains() {
        let c = cidr([10, 1, 2, 0], 23);
        assert!(c.contains(AF_INET, &v4([10, 1, 3, 255])));
        assert!(c.contains(AF_INET, &v4([10, 1, 2, 0])));
        assert!(!c.contains(AF_INET, &v4([10, 1, 4, 0])));
        assert!(!c.contains(AF_INET6, &v4([10, 1, 2, 0])));
        assert!(cidr([0, 0, 0, 0], 0).contains(AF_INET, &v4([1, 2, 3, 4])));
        let host = cidr([192, 0, 2, 7], 32);
        assert!(host.contains(AF_INET, &v4([192, 0, 2, 7])));
        assert!(!host.contains(AF_INET, &v4([192, 0, 2, 6])));
    }

    #[test]
    fn layouts_have_no_hidden_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<Offsets>(), 32 * 4);
        assert_eq!(size_of::<FibLookup>(), 56);
        assert_eq!(size_of::<FibRecent>(), 8 + 56 * FIB_RECENT);
        assert_eq!(size_of::<Cidr>(), 36);
        assert_eq!(
            size_of::<Filter>(),
            2 * MAX_PORTS + 36 * MAX_HOSTS + 16 + 4 + 4
        );
        assert_eq!(
            core::mem::offset_of!(Filter, sample_every),
            2 * MAX_PORTS + 36 * MAX_HOSTS + 16 + 4
        );
        assert_eq!(size_of::<EventHeader>(), 16);
        assert_eq!(
            size_of::<DropEvent>(),
            16 + 8 + 16 + 32 + 8 + 8 + 56 * FIB_RECENT + 96 + 8
        );
        assert_eq!(size_of::<CtTuple>(), 40);
        assert_eq!(size_of::<CtInfo>(), 96);
        assert_eq!(size_of::<PacketEvent>(), 16 + 16 + 32 + 8 + 96);
        assert_eq!(size_of::<Counters>(), 40);
        assert_eq!(size_of::<MonitorConfig>(), 8);
        assert_eq!(size_of::<AggKey>(), 16);
        assert_eq!(size_of::<LimiterState>(), 16);
    }

    #[test]
    fn service_ports() {
        // SYN: the destination; SYN-ACK: the source; else the lower.
        assert_eq!(service_port(TCP_SYN, 40000, 80), 80);
        assert_eq!(service_port(TCP_SYN | TCP_ACK, 80, 40000), 80);
        assert_eq!(service_port(TCP_SYN | TCP_ECE | TCP_CWR, 40000, 8080), 8080);
        assert_eq!(service_port(TCP_RST | TCP_ACK, 40000, 443), 443);
        assert_eq!(service_port(TCP_ACK, 22, 51000), 22);
    }
}
