//! Reading a TCP packet's addresses, ports and flags out of a `struct sk_buff`
//! with member offsets from BTF.
use aya_ebpf::helpers::bpf_probe_read_kernel;
use kdrop_common::{Offsets, ABSENT, AF_INET, AF_INET6};

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

pub struct Tcp {
    pub family: u8,
    pub tcp_flags: u8,
    pub sport: u16,
    pub dport: u16,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// The TCP/IP headers of `skb`, or `None` if it is not TCP over IPv4/IPv6.
/// The IP header is found through `network_header`, which every path that
/// can drop an IP packet has set; the TCP header is located from the IP
/// header itself because `transport_header` is unset on early drops.
// A BPF subprogram: its own stack frame keeps the caller under 512 bytes.
#[inline(never)]
pub fn parse_tcp(skb: u64, o: &Offsets) -> Option<Tcp> {
    let proto = u16::from_be(read::<u16>(skb, o.skb_protocol).ok()?);
    // Locally built packets can be freed before ip_output sets protocol.
    if proto != ETH_P_IP && proto != ETH_P_IPV6 && proto != 0 {
        return None;
    }
    let head: u64 = read(skb, o.skb_head).ok()?;
    let nh_off: u16 = read(skb, o.skb_network_header).ok()?;
    if head == 0 || nh_off == u16::MAX {
        return None;
    }
    let nh = head + u64::from(nh_off);
    let first: u8 = read(nh, 0).ok()?;
    match first >> 4 {
        4 if proto != ETH_P_IPV6 => parse_v4(nh, first),
        6 if proto != ETH_P_IP => parse_v6(nh),
        _ => None,
    }
}

#[inline(always)]
fn parse_v4(nh: u64, first: u8) -> Option<Tcp> {
    let ihl = u64::from(first & 0x0f) * 4;
    if ihl < 20 {
        return None;
    }
    let hdr: [u8; 20] = read(nh, 0).ok()?;
    if hdr[9] != IPPROTO_TCP {
        return None;
    }
    // A fragment other than the first carries no TCP header.
    if u16::from_be_bytes([hdr[6], hdr[7]]) & 0x1fff != 0 {
        return None;
    }
    let mut t = Tcp {
        family: AF_INET,
        tcp_flags: 0,
        sport: 0,
        dport: 0,
        saddr: [0; 16],
        daddr: [0; 16],
    };
    t.saddr[..4].copy_from_slice(&hdr[12..16]);
    t.daddr[..4].copy_from_slice(&hdr[16..20]);
    read_ports(nh + ihl, &mut t)?;
    Some(t)
}

#[inline(always)]
fn parse_v6(nh: u64) -> Option<Tcp> {
    let hdr: [u8; 40] = read(nh, 0).ok()?;
    // Extension headers are not walked: handshake packets carry none.
    if hdr[6] != IPPROTO_TCP {
        return None;
    }
    let mut t = Tcp {
        family: AF_INET6,
        tcp_flags: 0,
        sport: 0,
        dport: 0,
        saddr: [0; 16],
        daddr: [0; 16],
    };
    t.saddr.copy_from_slice(&hdr[8..24]);
    t.daddr.copy_from_slice(&hdr[24..40]);
    read_ports(nh + 40, &mut t)?;
    Some(t)
}

#[inline(always)]
fn read_ports(th: u64, t: &mut Tcp) -> Option<()> {
    // Ports, sequence, ack, data offset, flags: the first 14 bytes.
    let hdr: [u8; 14] = read(th, 0).ok()?;
    t.sport = u16::from_be_bytes([hdr[0], hdr[1]]);
    t.dport = u16::from_be_bytes([hdr[2], hdr[3]]);
    t.tcp_flags = hdr[13];
    Some(())
}

/// The netns inode and the interface of `skb`: the device's namespace, or the
/// socket's when the device is gone; the ifindex it arrived on, or the one it
/// is leaving by for locally sent packets.
#[inline(always)]
pub fn netns_and_ifindex(skb: u64, o: &Offsets) -> (u32, u32) {
    let dev: u64 = read(skb, o.skb_dev).unwrap_or(0);
    let mut net: u64 = read(dev, o.dev_net).unwrap_or(0);
    if net == 0 {
        let sk: u64 = read(skb, o.skb_sk).unwrap_or(0);
        net = read(sk, o.sk_net).unwrap_or(0);
    }
    let inum: u32 = read(net, o.net_inum).unwrap_or(0);
    let mut ifindex: u32 = read(skb, o.skb_iif).unwrap_or(0);
    if ifindex == 0 {
        ifindex = read(dev, o.dev_ifindex).unwrap_or(0);
    }
    (inum, ifindex)
}
