//! What the kernel side lets through to userspace: the user's filter, and
//! the connections followed across NAT and namespaces.
use crate::{AF_INET, AF_INET6};

/// Highest number of `--port` values the kernel filter holds.
pub const MAX_PORTS: usize = 16;
/// Highest number of `--host` CIDRs the kernel filter holds.
pub const MAX_HOSTS: usize = 4;
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
    /// A drop with this raw reason is a handshake packet whatever its
    /// flags: TCP_LISTEN_OVERFLOW frees the client's final ACK (a bare
    /// ACK). `ABSENT`: none (no reasons, or the kernel lacks it).
    pub final_ack_reason: u32,
}

impl Filter {
    /// The flags test for a drop with raw reason `reason`: none for the
    /// final ACK's reason, else `tcp_flags_any`. One compare, made before
    /// any header is read.
    #[inline(always)]
    pub fn drop_flags(&self, reason: u32) -> u8 {
        // Before 5.17 kfree_skb has no reason (ABSENT), and before 6.15 no
        // TCP_LISTEN_OVERFLOW (ABSENT too): ABSENT == ABSENT must not admit
        // every drop whatever its flags (seen on Debian 5.10).
        if self.final_ack_reason != crate::ABSENT && reason == self.final_ack_reason {
            0
        } else {
            self.tcp_flags_any
        }
    }

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
            final_ack_reason: crate::ABSENT,
        }
    }
}

/// One end of a TCP connection. A followed connection is known by its
/// client's end (address and ephemeral port), which NAT on the far side
/// does not change: every packet to or from it is the connection's, in any
/// namespace of the node.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Network order; IPv4 in the first 4 bytes, the rest zero.
    pub addr: [u8; 16],
    /// Host order.
    pub port: u16,
    pub family: u8,
    pub _pad: u8,
}

impl Endpoint {
    #[inline(always)]
    pub fn new(family: u8, addr: &[u8; 16], port: u16) -> Self {
        let mut a = [0u8; 16];
        if family == AF_INET6 {
            a = *addr;
        } else {
            a[0] = addr[0];
            a[1] = addr[1];
            a[2] = addr[2];
            a[3] = addr[3];
        }
        Self {
            addr: a,
            port,
            family: if family == AF_INET6 {
                AF_INET6
            } else {
                AF_INET
            },
            _pad: 0,
        }
    }
}

/// Entries the `FOLLOW` map holds at most; inserts past it fail and are
/// counted (`FollowStats::full`).
pub const FOLLOW_MAX_ENTRIES: u32 = 4096;

/// A followed endpoint: why and since when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowValue {
    /// `bpf_ktime_get_ns()` of the insert (userspace expires old ones).
    pub since_ns: u64,
    /// `FOLLOW_BY_*`.
    pub by: u32,
    pub _pad: u32,
}

/// Inserted by the kernel when a local socket retransmitted a SYN.
pub const FOLLOW_BY_RETRANS: u32 = 1;
/// Inserted by userspace (a conntrack entry, a drop).
pub const FOLLOW_BY_USER: u32 = 2;

/// Per-CPU accounting of the followed connections.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowStats {
    /// Packets admitted because an end was followed (the user's filter
    /// alone would have rejected them).
    pub admitted: u64,
    /// Endpoints the kernel inserted.
    pub inserted: u64,
    /// Inserts refused because the map was full.
    pub full: u64,
}

/// What a drop record carries besides the packet: load-time constants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// Bit `r` set: a drop with raw reason `r` (< 256) is explained with
    /// route lookups, so its record carries the CPU's recent ones (names
    /// from `enum skb_drop_reason`: IP_RPFILTER, IP_LOCAL_SOURCE, ...).
    pub route_reasons: [u32; 8],
    /// 1: also for drops without a reason (kernels before 5.17).
    pub route_without_reason: u32,
    /// 1: each emitted drop is preceded by a [`crate::HeadEvent`] with its
    /// first bytes (`--pcap`); 0: no copy, no cost.
    pub capture_head: u32,
}

impl Evidence {
    pub const fn zeroed() -> Self {
        Self {
            route_reasons: [0; 8],
            route_without_reason: 0,
            capture_head: 0,
        }
    }

    /// Does a drop with this raw reason want route lookups?
    #[inline(always)]
    pub fn wants_routes(&self, reason: u32, has_reason: bool) -> bool {
        if !has_reason {
            return self.route_without_reason != 0;
        }
        if reason >= 256 {
            return false;
        }
        // Constant offsets only: older verifiers (6.1) lose the bound of a
        // computed index into a map value and refuse the load.
        let r = &self.route_reasons;
        let word = match reason >> 5 {
            0 => r[0],
            1 => r[1],
            2 => r[2],
            3 => r[3],
            4 => r[4],
            5 => r[5],
            6 => r[6],
            _ => r[7],
        };
        word & (1 << (reason & 31)) != 0
    }

    /// Sets the bit of `reason` (userspace).
    pub fn add(&mut self, reason: u32) {
        if reason < 256 {
            self.route_reasons[(reason >> 5) as usize] |= 1 << (reason & 31);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ABSENT;

    #[test]
    fn the_final_ack_is_admitted_only_where_the_kernel_names_it() {
        let mut f = Filter::zeroed();
        // SYN only.
        f.tcp_flags_any = 0x02;
        // 6.15+: TCP_LISTEN_OVERFLOW exists (any value).
        f.final_ack_reason = 77;
        assert_eq!(f.drop_flags(77), 0);
        assert_eq!(f.drop_flags(5), 0x02);
        // 5.10: no reason argument (ABSENT) and no such reason (ABSENT).
        f.final_ack_reason = ABSENT;
        assert_eq!(f.drop_flags(ABSENT), 0x02);
        assert_eq!(f.drop_flags(5), 0x02);
    }
}
