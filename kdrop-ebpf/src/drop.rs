//! The drop path: a packet freed by `kfree_skb` with a reason.
use aya_ebpf::helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns};
use kdrop_common::{
    DropEvent, EventHeader, Filter, KfreeSkbArgs, ABSENT, AF_INET, COUNTERS_KEY, EVENT_DROP,
    MAX_HOSTS, MAX_PORTS,
};

use crate::{
    config::{filter, offsets, COUNTERS, EVENTS},
    fib,
    skb::{self, Tcp},
};

#[inline(always)]
pub fn on_kfree_skb(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> i32 {
    let _ = try_kfree_skb(skb, location, reason, args);
    0
}

#[inline(always)]
fn try_kfree_skb(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> Option<()> {
    let reason = reason as u32;
    // Older kernels also report frees that are not drops through this
    // tracepoint; newer ones route them to consume_skb.
    if args.consumed != ABSENT && reason == args.consumed {
        return None;
    }
    let o = offsets();
    let tcp = skb::parse_tcp(skb, &o)?;
    let f = filter();
    if !matches_packet(f, &tcp) {
        return None;
    }
    let (netns, ifindex) = skb::netns_and_ifindex(skb, &o);
    if (f.netns != 0 && f.netns != netns) || (f.ifindex != 0 && f.ifindex != ifindex) {
        return None;
    }
    let counters = COUNTERS.get_ptr_mut(COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    let Some(mut entry) = EVENTS.reserve::<DropEvent>(0) else {
        counters.lost += 1;
        return None;
    };
    // Filled in place: the event is too large for the 512-byte BPF stack.
    // SAFETY: the reservation is sizeof(DropEvent) bytes, written before submit.
    let e = unsafe { &mut *entry.as_mut_ptr() };
    let now = unsafe { bpf_ktime_get_ns() };
    e.header = EventHeader {
        kind: EVENT_DROP,
        // SAFETY: plain helper call.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: now,
    };
    e.location = location;
    e.reason = if args.reason == ABSENT {
        ABSENT
    } else {
        reason
    };
    e.netns = netns;
    e.ifindex = ifindex;
    e.mark = skb::read(skb, o.skb_mark).unwrap_or(0);
    e.saddr = tcp.saddr;
    e.daddr = tcp.daddr;
    e.sport = tcp.sport;
    e.dport = tcp.dport;
    e.family = tcp.family;
    e.tcp_flags = tcp.tcp_flags;
    e._pad = [0; 2];
    e._pad2 = 0;
    e.n_fib = if tcp.family == AF_INET {
        let s = [tcp.saddr[0], tcp.saddr[1], tcp.saddr[2], tcp.saddr[3]];
        let d = [tcp.daddr[0], tcp.daddr[1], tcp.daddr[2], tcp.daddr[3]];
        fib::lookups_for(&s, &d, netns, now, &mut e.fib)
    } else {
        0
    };
    entry.submit(0);
    counters.emitted += 1;
    Some(())
}

/// Flags, ports and addresses: everything that needs only the headers.
#[inline(always)]
fn matches_packet(f: &Filter, t: &Tcp) -> bool {
    if f.tcp_flags_any != 0 && t.tcp_flags & f.tcp_flags_any == 0 {
        return false;
    }
    if f.n_ports != 0 {
        let mut hit = false;
        let mut i = 0;
        while i < MAX_PORTS {
            if (i as u32) < f.n_ports && (f.ports[i] == t.sport || f.ports[i] == t.dport) {
                hit = true;
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
        while i < MAX_HOSTS {
            if (i as u32) < f.n_hosts
                && (f.hosts[i].contains(t.family, &t.saddr)
                    || f.hosts[i].contains(t.family, &t.daddr))
            {
                hit = true;
            }
            i += 1;
        }
        if !hit {
            return false;
        }
    }
    true
}
