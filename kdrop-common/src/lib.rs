//! Types shared by the eBPF programs and userspace.
//!
//! Everything here crosses the kernel/user boundary byte for byte: `#[repr(C)]`,
//! integers and arrays only, padding spelled out, no bools or enums. Userspace
//! gets `aya::Pod` impls with the `user` feature.
#![no_std]

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
    pub _pad: u32,
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
            _pad: 0,
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

/// An address or CIDR in the kernel filter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// Network-order address bytes; IPv4 uses the first 4.
    pub addr: [u8; 16],
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    pub prefix_len: u8,
    pub _pad: [u8; 2],
}

impl Cidr {
    pub const fn zeroed() -> Self {
        Self {
            addr: [0; 16],
            family: 0,
            prefix_len: 0,
            _pad: [0; 2],
        }
    }

    /// Does `addr` (network-order bytes of `family`) fall inside this CIDR?
    #[inline(always)]
    pub fn contains(&self, family: u8, addr: &[u8; 16]) -> bool {
        if family != self.family {
            return false;
        }
        let mut bits = self.prefix_len as usize;
        let mut i = 0;
        // Bounded by 16 so the verifier sees a fixed trip count.
        while i < 16 {
            if bits == 0 {
                return true;
            }
            let mask: u8 = if bits >= 8 {
                0xff
            } else {
                0xffu8 << (8 - bits)
            };
            if (addr[i] ^ self.addr[i]) & mask != 0 {
                return false;
            }
            bits = bits.saturating_sub(8);
            i += 1;
        }
        true
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
}

/// Index of the single entry of the per-CPU `COUNTERS` map.
pub const COUNTERS_KEY: u32 = 0;

/// Per-CPU counters. `matched == emitted + lost + sampled_out` on every CPU,
/// always.
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
}

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
        Cidr {
            addr: v4(a),
            family: AF_INET,
            prefix_len: len,
            _pad: [0; 2],
        }
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
        assert_eq!(size_of::<Offsets>(), 12 * 4);
        assert_eq!(size_of::<Cidr>(), 20);
        assert_eq!(
            size_of::<Filter>(),
            2 * MAX_PORTS + 20 * MAX_HOSTS + 16 + 4 + 4
        );
        assert_eq!(
            core::mem::offset_of!(Filter, sample_every),
            2 * MAX_PORTS + 20 * MAX_HOSTS + 16 + 4
        );
        assert_eq!(size_of::<EventHeader>(), 16);
        assert_eq!(size_of::<DropEvent>(), 16 + 8 + 16 + 32 + 8);
        assert_eq!(size_of::<Counters>(), 32);
    }
}
