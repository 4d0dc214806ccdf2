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

/// How a program reads kernel memory: one `sk_buff` and the objects it
/// points to (device, socket, namespace).
pub trait Reader {
    /// A member of the skb.
    fn skb<T: Copy>(&self, off: u32) -> Result<T, i32>;
    /// A member of another kernel object reached from the skb.
    fn at<T: Copy>(&self, base: u64, off: u32) -> Result<T, i32>;
}

/// tp_btf: the skb argument is a BTF-typed pointer (PTR_TO_BTF_ID, since
/// Linux 5.5: btf_ctx_access in
/// https://github.com/torvalds/linux/blob/v5.5/kernel/bpf/btf.c), so members
/// of it and of the structs it points to are plain loads, checked by the
/// verifier against the kernel's BTF (the offsets come from that BTF) and
/// made fault-safe (BPF_PROBE_MEM). A helper call costs tens of nanoseconds
/// here, a load about one, and the program runs for every drop on the node,
/// matched or not. Pointers to non-structs (`head`) load as plain numbers:
/// packet bytes still need `bpf_probe_read_kernel`.
pub struct Direct {
    pub skb: u64,
}

impl Reader for Direct {
    #[inline(always)]
    fn skb<T: Copy>(&self, off: u32) -> Result<T, i32> {
        self.at(self.skb, off)
    }

    #[inline(always)]
    fn at<T: Copy>(&self, base: u64, off: u32) -> Result<T, i32> {
        if base == 0 || off == ABSENT {
            return Err(-1);
        }
        // SAFETY: the verifier turns this into a fault-safe load
        // (PTR_TO_BTF_ID) after checking it against the member at `off`.
        Ok(unsafe { core::ptr::read_volatile((base + u64::from(off)) as *const T) })
    }
}

/// Bytes of `struct sk_buff` read in one helper call.
const WINDOW: usize = 64;

/// raw_tp and tracepoint: arguments are plain numbers, so everything goes
/// through `bpf_probe_read_kernel`. The skb members read on every call
/// (protocol, network_header, head, skb_iif, mark) are fetched with one call
/// instead of one each; members outside the window are read one by one.
pub struct Probe {
    skb: u64,
    base: u32,
    buf: [u8; WINDOW],
    ok: bool,
}

impl Probe {
    #[inline(always)]
    pub fn new(skb: u64, o: &Offsets) -> Self {
        // The offsets are load-time constants: the verifier folds all this.
        let mut base = o.skb_protocol;
        for off in [o.skb_network_header, o.skb_head, o.skb_iif, o.skb_mark] {
            if off < base {
                base = off;
            }
        }
        let mut v = Probe {
            skb,
            base,
            buf: [0; WINDOW],
            ok: false,
        };
        if let Ok(buf) = read::<[u8; WINDOW]>(skb, base) {
            v.buf = buf;
            v.ok = true;
        }
        v
    }
}

impl Reader for Probe {
    #[inline(always)]
    fn skb<T: Copy>(&self, off: u32) -> Result<T, i32> {
        if self.ok && off != ABSENT && off >= self.base {
            let at = (off - self.base) as usize;
            if at + core::mem::size_of::<T>() <= WINDOW {
                // SAFETY: in bounds of buf, checked just above.
                return Ok(unsafe { core::ptr::read_unaligned(self.buf.as_ptr().add(at).cast()) });
            }
        }
        read(self.skb, off)
    }

    #[inline(always)]
    fn at<T: Copy>(&self, base: u64, off: u32) -> Result<T, i32> {
        read(base, off)
    }
}

pub struct Tcp {
    pub family: u8,
    pub tcp_flags: u8,
    pub sport: u16,
    pub dport: u16,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// An IPv4 header without options and the first 14 bytes of TCP (ports,
/// sequence, ack, data offset, flags): the common case in one read.
const V4_FAST: usize = 20 + 14;

/// The TCP/IP headers of `skb`, or `None` if it is not TCP over IPv4/IPv6.
/// The IP header is found through `network_header`, which every path that
/// can drop an IP packet has set; the TCP header is located from the IP
/// header itself because `transport_header` is unset on early drops.
#[inline(always)]
pub fn parse_tcp<R: Reader>(r: &R, o: &Offsets) -> Option<Tcp> {
    let proto = u16::from_be(r.skb::<u16>(o.skb_protocol).ok()?);
    // Locally built packets can be freed before ip_output sets protocol.
    if proto != ETH_P_IP && proto != ETH_P_IPV6 && proto != 0 {
        return None;
    }
    let head: u64 = r.skb(o.skb_head).ok()?;
    let nh_off: u16 = r.skb(o.skb_network_header).ok()?;
    if head == 0 || nh_off == u16::MAX {
        return None;
    }
    let nh = head + u64::from(nh_off);
    let hdr: [u8; V4_FAST] = read(nh, 0).ok()?;
    match hdr[0] >> 4 {
        4 if proto != ETH_P_IPV6 => parse_v4(nh, &hdr),
        6 if proto != ETH_P_IP => parse_v6(nh),
        _ => None,
    }
}

#[inline(always)]
fn parse_v4(nh: u64, hdr: &[u8; V4_FAST]) -> Option<Tcp> {
    let ihl = u64::from(hdr[0] & 0x0f) * 4;
    if ihl < 20 {
        return None;
    }
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
    if ihl == 20 {
        let mut th = [0u8; 14];
        th.copy_from_slice(&hdr[20..]);
        set_ports(&th, &mut t);
    } else {
        set_ports(&read(nh + ihl, 0).ok()?, &mut t);
    }
    Some(t)
}

#[inline(always)]
fn parse_v6(nh: u64) -> Option<Tcp> {
    // The IPv6 header and the first 14 bytes of TCP behind it.
    let hdr: [u8; 54] = read(nh, 0).ok()?;
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
    let mut th = [0u8; 14];
    th.copy_from_slice(&hdr[40..]);
    set_ports(&th, &mut t);
    Some(t)
}

#[inline(always)]
fn set_ports(th: &[u8; 14], t: &mut Tcp) {
    t.sport = u16::from_be_bytes([th[0], th[1]]);
    t.dport = u16::from_be_bytes([th[2], th[3]]);
    t.tcp_flags = th[13];
}

/// The netns inode and the interface of `skb`: the device's namespace, or the
/// socket's when the device is gone; the ifindex it arrived on, or the one it
/// is leaving by for locally sent packets.
#[inline(always)]
pub fn netns_and_ifindex<R: Reader>(r: &R, o: &Offsets) -> (u32, u32) {
    let dev: u64 = r.skb(o.skb_dev).unwrap_or(0);
    let mut net: u64 = r.at(dev, o.dev_net).unwrap_or(0);
    if net == 0 {
        let sk: u64 = r.skb(o.skb_sk).unwrap_or(0);
        net = r.at(sk, o.sk_net).unwrap_or(0);
    }
    let inum: u32 = r.at(net, o.net_inum).unwrap_or(0);
    let mut ifindex: u32 = r.skb(o.skb_iif).unwrap_or(0);
    if ifindex == 0 {
        ifindex = r.at(dev, o.dev_ifindex).unwrap_or(0);
    }
    (inum, ifindex)
}
