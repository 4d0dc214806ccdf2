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
//! request_sock *req)`; positions come from BTF. And a client socket
//! leaving SYN-SENT for CLOSE (`sock:inet_sock_set_state(const struct sock
//! *sk, const int oldstate, const int newstate)`, v4.16+, include/trace/
//! events/sock.h): a connect() given up after one transmission or two,
//! before any retransmission count could tell.
use aya_ebpf::helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns};
use kdrop_common::{
    AbandonEvent, CtInfo, Endpoint, EventHeader, Offsets, PacketEvent, PacketId, ABSENT, AF_INET,
    AF_INET6, EVENT_ABANDON, EVENT_RETRANS, RETRANS_COUNTERS_KEY, TCP_ACK, TCP_SYN,
};

use crate::{
    config::{filter, offsets, COUNTERS, EVENTS},
    drop::wakeup_flags,
    filter::{flags_match, follow, matches_tuple},
    skb::{read, Load},
};

/// `TCP_SYN_SENT` and `TCP_CLOSE` in the `enum` of include/net/tcp_states.h
/// (stable since 2.6; UAPI values, mirrored by `BPF_TCP_*`).
const TCP_SYN_SENT: u8 = 2;
const TCP_CLOSE: u8 = 7;

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
    // The client's end is the socket's local one; the SYN's sequence number
    // is snd_una while SYN-SENT.
    let _ = try_retransmit::<L>(sk, o.sk_common, TCP_SYN, o.tcp_snd_una, true);
    0
}

/// A SYN-ACK retransmitted for the request socket `req` (the server's view:
/// its local end is the server's; `rcv_isn` is the client's ISN).
#[inline(always)]
pub fn on_retransmit_synack<L: Load>(req: u64) -> i32 {
    let o = offsets();
    if o.req_common == ABSENT {
        return 0;
    }
    let _ = try_retransmit::<L>(req, o.req_common, TCP_SYN | TCP_ACK, o.req_rcv_isn, false);
    0
}

/// `sock:inet_sock_set_state`: a client socket leaving SYN-SENT for CLOSE
/// ended its connect() without a connection. Every TCP state change of the
/// node passes here; all but this one return after two compares.
#[inline(always)]
pub fn on_set_state<L: Load>(sk: u64, old: u64, new: u64) -> i32 {
    if old != u64::from(TCP_SYN_SENT) || new != u64::from(TCP_CLOSE) {
        return 0;
    }
    let _ = try_abandon::<L>(sk);
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

/// The socket as a packet of `flags` (its ends, the handshake's ISN at
/// `base + isn_off`), if the filter takes it.
// A BPF subprogram: one copy for every socket tracepoint and rung.
#[inline(never)]
fn admit_socket<L: Load>(
    base: u64,
    common: u32,
    flags: u8,
    isn_off: u32,
    pkt: &mut PacketId,
) -> bool {
    let o = offsets();
    let f = filter();
    // No interface here: a trace scoped to one leaves these out.
    if f.ifindex != 0 || !flags_match(f.tcp_flags_any, flags) {
        return false;
    }
    if ends::<L>(base, common, o, pkt).is_none() {
        return false;
    }
    pkt.tcp_flags = flags;
    // Past `struct sock` (in tcp_sock, tcp_request_sock): tp_btf's typed
    // loads stop at the pointer's own type, so a helper reads it.
    pkt.isn = read(base, isn_off).unwrap_or(0);
    if f.netns != 0 && f.netns != pkt.netns {
        return false;
    }
    let ports = (u32::from(pkt.sport) << 16) | u32::from(pkt.dport);
    matches_tuple(f, pkt.family, &pkt.saddr, &pkt.daddr, ports)
}

// A BPF subprogram: one copy for both tracepoints and both rungs.
#[inline(never)]
fn try_retransmit<L: Load>(
    base: u64,
    common: u32,
    flags: u8,
    isn_off: u32,
    client_is_local: bool,
) -> Option<()> {
    let mut pkt = PacketId::zeroed();
    if !admit_socket::<L>(base, common, flags, isn_off, &mut pkt) {
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

#[inline(never)]
fn try_abandon<L: Load>(sk: u64) -> Option<()> {
    let o = offsets();
    if o.sk_common == ABSENT {
        return None;
    }
    let mut pkt = PacketId::zeroed();
    if !admit_socket::<L>(sk, o.sk_common, TCP_SYN, o.tcp_snd_una, &mut pkt) {
        return None;
    }
    let counters = COUNTERS.get_ptr_mut(RETRANS_COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    let Some(mut entry) = EVENTS.reserve::<AbandonEvent>(0) else {
        counters.lost += 1;
        return None;
    };
    // SAFETY: plain helper calls.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: the reservation is sizeof(AbandonEvent) bytes, written before submit.
    let e = unsafe { &mut *entry.as_mut_ptr() };
    e.header = EventHeader {
        kind: EVENT_ABANDON,
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: now,
    };
    e.pkt = pkt;
    e.err = L::load(sk, o.sk_err).unwrap_or(0);
    e.retransmits = read::<u8>(sk, o.icsk_retransmits).map_or(ABSENT, u32::from);
    entry.submit(wakeup_flags(now));
    counters.emitted += 1;
    Some(())
}
