//! Reading a TCP packet's addresses, ports and flags out of a `struct sk_buff`
//! with member offsets from BTF.
use aya_ebpf::helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_buf};
use kdrop_common::{handshake_isn, Offsets, ABSENT, AF_INET, AF_INET6};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;

/// Reads a `T` at `base + off`; fails on a NULL base or an absent member.
#[inline(always)]
pub fn read<T>(base: u64, off: u32) -> Result<T, i32> {
    if base == 0 || off == ABSENT {
        return Err(-1);
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address and fails cleanly.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const T) }
}

/// How a program reads the kernel objects its arguments point to.
pub trait Load {
    /// The `T` at `base + off`; `None` for a NULL base or an absent member.
    fn load<T: Copy>(base: u64, off: u32) -> Option<T>;

    /// `(protocol, head, network_header)` of `skb`, read on every call.
    #[inline(always)]
    fn skb_members(skb: u64, o: &Offsets) -> Option<(u16, u64, u16)> {
        Some((
            Self::load(skb, o.skb_protocol)?,
            Self::load(skb, o.skb_head)?,
            Self::load(skb, o.skb_network_header)?,
        ))
    }
}

/// Any address, through `bpf_probe_read_kernel`: raw_tp and tracepoint,
/// whose arguments are plain numbers to the verifier.
pub struct Probe;

impl Load for Probe {
    #[inline(always)]
    fn load<T: Copy>(base: u64, off: u32) -> Option<T> {
        read(base, off).ok()
    }

    #[inline(always)]
    fn skb_members(skb: u64, o: &Offsets) -> Option<(u16, u64, u16)> {
        skb_members_at_once(skb, o)
    }
}

/// tp_btf: arguments are BTF-typed pointers, so a member of what they point
/// to (and of the structs reached through its pointer members) is a plain
/// load the verifier checks against the kernel's BTF and makes fault-safe
/// (PTR_TO_BTF_ID, since 5.5). A helper call costs tens of nanoseconds, a
/// load about one, and these programs run for every packet routed or
/// dropped on the node. Only for members, at BTF offsets, of their size.
pub struct Direct;

impl Load for Direct {
    #[inline(always)]
    fn load<T: Copy>(base: u64, off: u32) -> Option<T> {
        if base == 0 || off == ABSENT {
            return None;
        }
        // SAFETY: checked by the verifier as described above.
        Some(unsafe { core::ptr::read_volatile((base + u64::from(off)) as *const T) })
    }
}

// C layout: the addresses at offsets 16 and 32, 8-aligned (zero16).
#[repr(C)]
pub struct Tcp {
    pub family: u8,
    pub tcp_flags: u8,
    pub sport: u16,
    pub dport: u16,
    /// Where the TCP header is: its sequence numbers are read only for
    /// packets the filter admits (see `isn`); reading them here cost
    /// parse_tcp 80 bytes of stack, past 5.10's combined limit.
    pub th: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// The TCP/IP headers of `skb` into `out`; false if it is not TCP over
/// IPv4/IPv6. Written in place, not returned: returned by value the packet
/// was copied through two more frames (the 6.1 verifier's 512-byte limit
/// on the combined stack counts each).
/// The IP header is found through `network_header`, which every path that
/// can drop an IP packet has set; the TCP header is located from the IP
/// header itself because `transport_header` is unset on early drops.
// A BPF subprogram: its own stack frame keeps the caller under 512 bytes.
#[inline(never)]
pub fn parse_tcp<L: Load>(skb: u64, o: &Offsets, out: &mut Tcp) -> bool {
    parse_tcp_into::<L>(skb, o, out).is_some()
}

#[inline(always)]
fn parse_tcp_into<L: Load>(skb: u64, o: &Offsets, out: &mut Tcp) -> Option<()> {
    let (proto, head, nh_off) = L::skb_members(skb, o)?;
    let proto = u16::from_be(proto);
    // Locally built packets can be freed before ip_output sets protocol.
    if proto != ETH_P_IP && proto != ETH_P_IPV6 && proto != 0 {
        return None;
    }
    if head == 0 || nh_off == u16::MAX {
        return None;
    }
    let nh = head + u64::from(nh_off);
    // The IP and TCP headers in one helper call (`head` is a byte pointer,
    // not a struct the verifier could check loads against): an IPv6
    // header and the TCP header's first 14 bytes, which also covers IPv4
    // without options. The skb's head buffer extends well past a
    // handshake packet's headers (skb_shared_info follows it).
    let h: [u8; HDRS] = read(nh, 0).ok()?;
    match h[0] >> 4 {
        4 if proto != ETH_P_IPV6 => parse_v4(nh, &h, out),
        6 if proto != ETH_P_IP => parse_v6(nh, &h, out),
        _ => None,
    }
}

/// Bytes of `struct sk_buff` read at once for `protocol`, `head` and
/// `network_header` (12 bytes apart in 6.18's layout, between `protocol` at
/// 180 and `head` at 192: https://github.com/torvalds/linux/blob/v6.18/include/linux/skbuff.h#L1047).
const WINDOW: u32 = 32;

/// `(protocol, head, network_header)` of `skb` through helper calls: one
/// when the three lie within `WINDOW` bytes, as in every layout since 4.x;
/// one each otherwise. The offsets are load-time constants: the verifier
/// keeps one branch.
#[inline(always)]
fn skb_members_at_once(skb: u64, o: &Offsets) -> Option<(u16, u64, u16)> {
    let (p, h, n) = (o.skb_protocol, o.skb_head, o.skb_network_header);
    let lo = p.min(h).min(n);
    let spread = |off: u32, size: u32| off.saturating_add(size).saturating_sub(lo);
    if spread(p, 2).max(spread(h, 8)).max(spread(n, 2)) > WINDOW {
        return Some((read(skb, p).ok()?, read(skb, h).ok()?, read(skb, n).ok()?));
    }
    let w: [u8; WINDOW as usize] = read(skb, lo).ok()?;
    // `get`, not indexing: no panic path (the verifier refuses the code a
    // panic leaves behind), and the offsets are in range by the check above.
    let bytes = |off: u32, len: usize| w.get((off - lo) as usize..(off - lo) as usize + len);
    Some((
        u16::from_ne_bytes(bytes(p, 2)?.try_into().ok()?),
        u64::from_ne_bytes(bytes(h, 8)?.try_into().ok()?),
        u16::from_ne_bytes(bytes(n, 2)?.try_into().ok()?),
    ))
}

/// IPv6 header + the TCP header up to its flags.
const HDRS: usize = 40 + 14;

#[inline(always)]
fn parse_v4(nh: u64, h: &[u8; HDRS], t: &mut Tcp) -> Option<()> {
    let ihl = usize::from(h[0] & 0x0f) * 4;
    if ihl < 20 || h[9] != IPPROTO_TCP {
        return None;
    }
    // A fragment other than the first carries no TCP header.
    if u16::from_be_bytes([h[6], h[7]]) & 0x1fff != 0 {
        return None;
    }
    t.family = AF_INET;
    zero16(&mut t.saddr);
    zero16(&mut t.daddr);
    t.saddr[..4].copy_from_slice(&h[12..16]);
    t.daddr[..4].copy_from_slice(&h[16..20]);
    t.th = nh + ihl as u64;
    if ihl == 20 {
        set_ports(&h[20..34], t);
    } else {
        // IP options: one more read.
        let th: [u8; 14] = read(nh + ihl as u64, 0).ok()?;
        set_ports(&th, t);
    }
    Some(())
}

#[inline(always)]
fn parse_v6(nh: u64, h: &[u8; HDRS], t: &mut Tcp) -> Option<()> {
    // Extension headers are not walked: handshake packets carry none.
    if h[6] != IPPROTO_TCP {
        return None;
    }
    t.family = AF_INET6;
    t.saddr.copy_from_slice(&h[8..24]);
    t.daddr.copy_from_slice(&h[24..40]);
    t.th = nh + 40;
    set_ports(&h[40..54], t);
    Some(())
}

const _: () = assert!(
    core::mem::offset_of!(Tcp, saddr) % 8 == 0 && core::mem::offset_of!(Tcp, daddr) % 8 == 0
);

/// Two 8-byte stores. `= [0; 16]` became a call to compiler-builtins'
/// byte-by-byte `memset` (~80 instructions run for each address, on every
/// IPv4 packet the filter looks at); volatile stores are not merged into
/// one. `a` is 8-aligned: a `Tcp` address (see the assertion above) in a
/// map value or on the stack, both 8-aligned.
#[inline(always)]
fn zero16(a: &mut [u8; 16]) {
    let p = a.as_mut_ptr().cast::<u64>();
    // SAFETY: 16 bytes, 8-aligned as said above.
    unsafe {
        core::ptr::write_volatile(p, 0);
        core::ptr::write_volatile(p.add(1), 0);
    }
}

/// Ports and flags from the TCP header's first 14 bytes.
#[inline(always)]
fn set_ports(th: &[u8], t: &mut Tcp) {
    t.sport = u16::from_be_bytes([th[0], th[1]]);
    t.dport = u16::from_be_bytes([th[2], th[3]]);
    t.tcp_flags = th[13];
}

impl Tcp {
    /// kdrop_common::handshake_isn of the header: one more read, for an
    /// admitted packet (0 if it fails).
    #[inline(always)]
    pub fn isn(&self) -> u32 {
        let Ok([s0, s1, s2, s3, a0, a1, a2, a3]) = read::<[u8; 8]>(self.th, 4) else {
            return 0;
        };
        handshake_isn(
            self.tcp_flags,
            u32::from_be_bytes([s0, s1, s2, s3]),
            u32::from_be_bytes([a0, a1, a2, a3]),
        )
    }
}

/// An Ethernet header's length: destination, source, EtherType.
const ETH_HLEN: u16 = 14;
/// `skb->mac_header` when no link-layer header was set
/// (`skb_mac_header_was_set`, https://github.com/torvalds/linux/blob/v6.18/include/linux/skbuff.h).
const UNSET: u16 = u16::MAX;

/// The Ethernet source address `skb` arrived with, into `out`: the
/// neighbour that sent it. False when the packet has none: sent by this
/// host, or from a device without an Ethernet header (a tunnel's
/// `mac_header` equals its `network_header`). The 6 bytes go straight into
/// `out` (the ring record), not through the stack.
// A BPF subprogram: the drop path's frames stay as they were.
#[inline(never)]
pub fn source_mac<L: Load>(skb: u64, o: &Offsets, out: &mut [u8; 6]) -> bool {
    let Some(head) = L::load::<u64>(skb, o.skb_head) else {
        return false;
    };
    let (Some(mac), Some(nh)) = (
        L::load::<u16>(skb, o.skb_mac_header),
        L::load::<u16>(skb, o.skb_network_header),
    ) else {
        return false;
    };
    if head == 0 || mac == UNSET || nh == UNSET || nh < mac.saturating_add(ETH_HLEN) {
        return false;
    }
    // h_source follows the 6-byte h_dest (include/uapi/linux/if_ether.h).
    let src = head + u64::from(mac) + 6;
    // SAFETY: bpf_probe_read_kernel tolerates any address and fails cleanly.
    unsafe { bpf_probe_read_kernel_buf(src as *const u8, out) }.is_ok()
}

/// The netns inode and the interface of `skb`: the device's namespace, or the
/// socket's when the device is gone; the ifindex it arrived on, or the one it
/// is leaving by for locally sent packets.
#[inline(always)]
pub fn netns_and_ifindex<L: Load>(skb: u64, o: &Offsets) -> (u32, u32) {
    let dev: u64 = L::load(skb, o.skb_dev).unwrap_or(0);
    let mut net: u64 = L::load(dev, o.dev_net).unwrap_or(0);
    if net == 0 {
        let sk: u64 = L::load(skb, o.skb_sk).unwrap_or(0);
        net = L::load(sk, o.sk_net).unwrap_or(0);
    }
    let inum: u32 = L::load(net, o.net_inum).unwrap_or(0);
    let mut ifindex: u32 = L::load(skb, o.skb_iif).unwrap_or(0);
    if ifindex == 0 {
        ifindex = L::load(dev, o.dev_ifindex).unwrap_or(0);
    }
    (inum, ifindex)
}
