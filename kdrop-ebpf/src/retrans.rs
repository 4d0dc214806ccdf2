//! A local socket retransmitting its SYN (`tcp:tcp_retransmit_skb` with the
//! socket in SYN-SENT) or its SYN-ACK (`tcp:tcp_retransmit_synack`): the
//! handshake is in trouble. These fire only then, never for healthy
//! traffic, so they stay attached. The client's end is followed from here
//! on, in the kernel, before the retransmission crosses the node: what
//! answers it (an un-NAT'd SYN-ACK, a RST) passes the filter even when its
//! ports are not the ones asked for. Arguments as of v6.18
//! (https://github.com/torvalds/linux/blob/v6.18/include/trace/events/tcp.h):
//! `tcp_retransmit_skb(const struct sock *sk, const struct sk_buff *skb,
//! int err)`, `tcp_retransmit_synack(const struct sock *sk, const struct
//! request_sock *req)`; positions come from BTF.
use aya_ebpf::helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns};
use kdrop_common::{
    CtInfo, Endpoint, EventHeader, Offsets, PacketEvent, PacketId, ABSENT, AF_INET, AF_INET6,
    EVENT_RETRANS, RETRANS_COUNTERS_KEY, TCP_ACK, TCP_SYN,
};

use crate::{
    config::{filter, offsets, COUNTERS, EVENTS},
    drop::wakeup_flags,
    filter::{flags_match, follow, matches_tuple},
    skb::Load,
};

/// `TCP_SYN_SENT` in `enum` of include/net/tcp_states.h (stable since 2.6).
const TCP_SYN_SENT: u8 = 2;

/// A SYN retransmitted by the client socket `sk`.
#[inline(always)]
pub fn on_retransmit_skb<L: Load>(sk: u64) -> i32 {
    let o = offsets();
    if o.sk_common == ABSENT || o.skc_state == ABSENT {
        return 0;
    }
    let state: u8 = L::load(sk, o.sk_common.wrapping_add(o.skc_state)).unwrap_or(0);
    if state != TCP_SYN_SENT {
        return 0;
    }
    // The client's end is the socket's local one.
    let _ = try_retransmit::<L>(sk, o.sk_common, TCP_SYN, true);
    0
}

/// A SYN-ACK retransmitted for the request socket `req` (the server's view:
/// its local end is the server's).
#[inline(always)]
pub fn on_retransmit_synack<L: Load>(req: u64) -> i32 {
    let o = offsets();
    if o.req_common == ABSENT {
        return 0;
    }
    let _ = try_retransmit::<L>(req, o.req_common, TCP_SYN | TCP_ACK, false);
    0
}

/// The socket's ends from its `struct sock_common` at `base + common`.
#[inline(always)]
fn ends<L: Load>(base: u64, common: u32, o: &Offsets, out: &mut PacketId) -> Option<()> {
    let at = |off: u32| common.wrapping_add(off);
    let family: u16 = L::load(base, at(o.skc_family))?;
    match family as u8 {
        AF_INET => {
            let local: [u8; 4] = L::load(base, at(o.skc_rcv_saddr))?;
            let remote: [u8; 4] = L::load(base, at(o.skc_daddr))?;
            out.saddr = [0; 16];
            out.daddr = [0; 16];
            out.saddr[..4].copy_from_slice(&local);
            out.daddr[..4].copy_from_slice(&remote);
            out.family = AF_INET;
        }
        AF_INET6 => {
            out.saddr = L::load(base, at(o.skc_v6_rcv_saddr))?;
            out.daddr = L::load(base, at(o.skc_v6_daddr))?;
            out.family = AF_INET6;
        }
        _ => return None,
    }
    out.sport = L::load(base, at(o.skc_num))?;
    out.dport = u16::from_be(L::load(base, at(o.skc_dport))?);
    let net: u64 = L::load(base, at(o.skc_net)).unwrap_or(0);
    out.netns = L::load(net, o.net_inum).unwrap_or(0);
    Some(())
}

// A BPF subprogram: one copy for both tracepoints and both rungs.
#[inline(never)]
fn try_retransmit<L: Load>(base: u64, common: u32, flags: u8, client_is_local: bool) -> Option<()> {
    let o = offsets();
    let f = filter();
    // No interface here: a trace scoped to one leaves these out.
    if f.ifindex != 0 || !flags_match(f.tcp_flags_any, flags) {
        return None;
    }
    let mut pkt = PacketId::zeroed();
    ends::<L>(base, common, o, &mut pkt)?;
    pkt.tcp_flags = flags;
    if f.netns != 0 && f.netns != pkt.netns {
        return None;
    }
    let ports = (u32::from(pkt.sport) << 16) | u32::from(pkt.dport);
    if !matches_tuple(f, pkt.family, &pkt.saddr, &pkt.daddr, ports) {
        return None;
    }
    // SAFETY: plain helper calls.
    let now = unsafe { bpf_ktime_get_ns() };
    let client = if client_is_local {
        Endpoint::new(pkt.family, &pkt.saddr, pkt.sport)
    } else {
        Endpoint::new(pkt.family, &pkt.daddr, pkt.dport)
    };
    follow(&client, now);
    let counters = COUNTERS.get_ptr_mut(RETRANS_COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    let Some(mut entry) = EVENTS.reserve::<PacketEvent>(0) else {
        counters.lost += 1;
        return None;
    };
    // SAFETY: the reservation is sizeof(PacketEvent) bytes, written before submit.
    let e = unsafe { &mut *entry.as_mut_ptr() };
    e.header = EventHeader {
        kind: EVENT_RETRANS,
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: now,
    };
    e.pkt = pkt;
    e.ct = CtInfo::zeroed();
    entry.submit(wakeup_flags(now));
    counters.emitted += 1;
    Some(())
}
