//! The filter every program applies, cheapest test first: where the packet
//! is (netns, interface: plain loads under tp_btf, and only when the filter
//! names them), then its headers (one helper call, the protocol checked
//! before the TCP header), its flags, its addresses and ports, the
//! connections followed, and only then its conntrack entry.
use kdrop_common::{
    Cidr, Endpoint, Filter, FollowValue, Offsets, PacketId, FOLLOW_BY_RETRANS, MAX_HOSTS, MAX_PORTS,
};

use crate::{
    config::{filter, offsets, ADMITTED, CT_SCRATCH, FOLLOW, FOLLOW_LIVE, FOLLOW_STATS},
    ct,
    skb::{self, Load, Tcp},
};

/// A packet the filter let through, and where it was.
pub struct Admitted {
    pub tcp: Tcp,
    pub netns: u32,
    pub ifindex: u32,
}

/// `any == 0` matches every packet.
#[inline(always)]
pub fn flags_match(any: u8, flags: u8) -> bool {
    any == 0 || flags & any != 0
}

/// Each program's own `Admitted` (a program can interrupt another on its
/// CPU, a softirq's drop during a send, but not itself: the kernel skips a
/// program already running there, `prog->active`).
pub const SLOT_DROP: u32 = 0;
pub const SLOT_EGRESS: u32 = 1;
pub const SLOT_VERDICT: u32 = 2;

/// The program's per-CPU `Admitted`. Not on the stack, where zeroing it was
/// a call to compiler-builtins' byte-by-byte `memset` (46 bytes, ~230
/// instructions run per drop: a third of the filter's cost when it matches
/// nothing, under the flood bench's perf profile); `admit` writes every
/// field before anything reads it.
#[inline(always)]
pub fn admitted(slot: u32) -> Option<&'static mut Admitted> {
    let a = ADMITTED.get_ptr_mut(slot)?;
    // SAFETY: this program's slot on this CPU (see SLOT_DROP).
    Some(unsafe { &mut *a })
}

/// The filter for `skb`, filling `a` on the way; `flags_any` is the TCP
/// flags test of this program (handshake packets for drops, SYN|RST at
/// egress). `a` is the caller's, filled in place (see skb::parse_tcp).
#[inline(always)]
pub fn admit<L: Load>(skb: u64, flags_any: u8, a: &mut Admitted) -> bool {
    let o = offsets();
    let f = filter();
    let scoped = f.netns != 0 || f.ifindex != 0;
    if scoped {
        (a.netns, a.ifindex) = skb::netns_and_ifindex::<L>(skb, o);
        if (f.netns != 0 && f.netns != a.netns) || (f.ifindex != 0 && f.ifindex != a.ifindex) {
            return false;
        }
    }
    if !skb::parse_tcp::<L>(skb, o, &mut a.tcp) || !flags_match(flags_any, a.tcp.tcp_flags) {
        return false;
    }
    if !matches_packet::<L>(f, &a.tcp, skb, o) {
        return false;
    }
    if !scoped {
        (a.netns, a.ifindex) = skb::netns_and_ifindex::<L>(skb, o);
    }
    true
}

/// The packet's identity for its record.
#[inline(always)]
pub fn identity(a: &Admitted, mark: u32, out: &mut PacketId) {
    out.netns = a.netns;
    out.ifindex = a.ifindex;
    out.mark = mark;
    out.isn = a.tcp.isn();
    out.saddr = a.tcp.saddr;
    out.daddr = a.tcp.daddr;
    out.sport = a.tcp.sport;
    out.dport = a.tcp.dport;
    out.family = a.tcp.family;
    out.tcp_flags = a.tcp.tcp_flags;
    out._pad = [0; 2];
}

/// Ports and addresses of the packet; else one of its ends is followed;
/// else those of its conntrack entry's original direction: `--port`/`--host`
/// also match what the client used before NAT (a service port, a VIP). The
/// entry is only read for packets that do not match by themselves.
// A BPF subprogram: its own stack frame keeps the caller under 512 bytes.
#[inline(never)]
fn matches_packet<L: Load>(f: &Filter, t: &Tcp, skb: u64, o: &Offsets) -> bool {
    if f.n_ports == 0 && f.n_hosts == 0 {
        return true;
    }
    let ports = (u32::from(t.sport) << 16) | u32::from(t.dport);
    if matches_tuple(f, t.family, &t.saddr, &t.daddr, ports) {
        return true;
    }
    if followed(t) {
        return true;
    }
    let Some(orig) = CT_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU scratch slot, used by one program run at a time.
    let orig = unsafe { &mut *orig };
    if !ct::read_orig::<L>(skb, o, orig) {
        return false;
    }
    let ports = (u32::from(orig.sport) << 16) | u32::from(orig.dport);
    matches_tuple(f, t.family, &orig.saddr, &orig.daddr, ports)
}

/// Is either end of the packet a followed connection's client end?
// A BPF subprogram: the two keys live in its own frame.
#[inline(never)]
fn followed(t: &Tcp) -> bool {
    let live = FOLLOW_LIVE.get(0).copied().unwrap_or(0);
    if live == 0 {
        return false;
    }
    let src = Endpoint::new(t.family, &t.saddr, t.sport);
    let dst = Endpoint::new(t.family, &t.daddr, t.dport);
    // SAFETY: the values are read only to test for presence.
    let hit = unsafe { FOLLOW.get(src).is_some() || FOLLOW.get(dst).is_some() };
    if hit {
        if let Some(s) = FOLLOW_STATS.get_ptr_mut(0) {
            // SAFETY: per-CPU slot.
            unsafe { (*s).admitted += 1 };
        }
    }
    hit
}

/// Follows the connection whose client end this is, from now on.
#[inline(always)]
pub fn follow(e: &Endpoint, now: u64) {
    let v = FollowValue {
        since_ns: now,
        by: FOLLOW_BY_RETRANS,
        _pad: 0,
    };
    let Some(s) = FOLLOW_STATS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot.
    let s = unsafe { &mut *s };
    if FOLLOW.insert(e, v, 0).is_ok() {
        s.inserted += 1;
        // A hint, not a count: userspace recounts on its sweep.
        if let Some(live) = FOLLOW_LIVE.get_ptr_mut(0) {
            // SAFETY: a plain store; a racing userspace recount only delays
            // the next lookup until its own next sweep.
            unsafe {
                if *live == 0 {
                    *live = 1;
                }
            }
        }
    } else {
        s.full += 1;
    }
}

/// One direction's addresses and ports (`sport << 16 | dport`: BPF
/// functions take at most 5 arguments). Loops stop at the first hit and at
/// the configured count, which keeps the verifier's path count small.
#[inline(never)]
pub fn matches_tuple(
    f: &Filter,
    family: u8,
    saddr: &[u8; 16],
    daddr: &[u8; 16],
    ports: u32,
) -> bool {
    let (sport, dport) = ((ports >> 16) as u16, ports as u16);
    if f.n_ports != 0 {
        let mut hit = false;
        let mut i = 0;
        while i < MAX_PORTS && (i as u32) < f.n_ports {
            let p = f.ports[i];
            if p == sport || p == dport {
                hit = true;
                break;
            }
            i += 1;
        }
        if !hit {
            return false;
        }
    }
    if f.n_hosts != 0 {
        let mut hit = false;
        let mut i = 0;
        while i < MAX_HOSTS && (i as u32) < f.n_hosts {
            let h = &f.hosts[i];
            if in_cidr(h, family, saddr) || in_cidr(h, family, daddr) {
                hit = true;
                break;
            }
            i += 1;
        }
        if !hit {
            return false;
        }
    }
    true
}

/// One subprogram for every address test keeps each frame small.
#[inline(never)]
fn in_cidr(c: &Cidr, family: u8, addr: &[u8; 16]) -> bool {
    c.contains(family, addr)
}
