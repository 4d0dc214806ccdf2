//! The drop path: a packet freed by `kfree_skb` with a reason.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
};
use kdrop_common::{
    DropEvent, EventHeader, Filter, KfreeSkbArgs, ABSENT, COUNTERS_KEY, EVENT_DROP, MAX_HOSTS,
    MAX_PORTS,
};

use crate::{
    config::{filter, offsets, COUNTERS, EVENTS, LAST_WAKEUP},
    skb::{self, Direct, Probe, Reader, Tcp},
};

/// tp_btf: `skb` is a BTF-typed pointer (plain loads).
#[inline(always)]
pub fn on_kfree_skb_btf(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> i32 {
    let _ = try_kfree_skb(&Direct { skb }, location, reason, args);
    0
}

/// raw_tp and tracepoint: `skb` is a number (helper reads).
#[inline(always)]
pub fn on_kfree_skb(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> i32 {
    let _ = try_kfree_skb(&Probe::new(skb, &offsets()), location, reason, args);
    0
}

#[inline(always)]
fn try_kfree_skb<R: Reader>(r: &R, location: u64, reason: u64, args: &KfreeSkbArgs) -> Option<()> {
    let reason = reason as u32;
    // Older kernels also report frees that are not drops through this
    // tracepoint; newer ones route them to consume_skb.
    if args.consumed != ABSENT && reason == args.consumed {
        return None;
    }
    let o = offsets();
    let tcp = skb::parse_tcp(r, &o)?;
    let f = filter();
    if !matches_packet(f, &tcp) {
        return None;
    }
    let (netns, ifindex) = skb::netns_and_ifindex(r, &o);
    if (f.netns != 0 && f.netns != netns) || (f.ifindex != 0 && f.ifindex != ifindex) {
        return None;
    }
    let counters = COUNTERS.get_ptr_mut(COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    // 1 in N per CPU: the 1st, N+1th, 2N+1th... match. `emitted + lost`
    // counts the picks so far, so the next one is due at match
    // picks * N + 1 (a multiply, not a 64-bit division per packet). The
    // split stays exact without an atomic: the counters are per CPU.
    if f.sample_every > 1
        && counters.matched - 1 != (counters.emitted + counters.lost) * u64::from(f.sample_every)
    {
        counters.sampled_out += 1;
        return None;
    }
    let Some(mut entry) = EVENTS.reserve::<DropEvent>(0) else {
        counters.lost += 1;
        return None;
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    entry.write(DropEvent {
        header: EventHeader {
            kind: EVENT_DROP,
            // SAFETY: plain helper call.
            cpu: unsafe { bpf_get_smp_processor_id() },
            ts_ns: now,
        },
        location,
        reason: if args.reason == ABSENT {
            ABSENT
        } else {
            reason
        },
        netns,
        ifindex,
        mark: r.skb(o.skb_mark).unwrap_or(0),
        saddr: tcp.saddr,
        daddr: tcp.daddr,
        sport: tcp.sport,
        dport: tcp.dport,
        family: tcp.family,
        tcp_flags: tcp.tcp_flags,
        _pad: [0; 2],
    });
    entry.submit(wakeup_flags(now));
    counters.emitted += 1;
    Some(())
}

/// Least time between two records of one CPU that may wake the reader.
const WAKEUP_EVERY_NS: u64 = 1_000_000;

/// Waking the reader costs the dropping CPU an irq_work IPI, several
/// microseconds in a VM: at 1 event in 100 of a flood that was most of
/// kdrop's cost (bpf_ringbuf_commit wakes whenever the reader had caught up,
/// https://github.com/torvalds/linux/blob/v6.18/kernel/bpf/ringbuf.c). So a
/// CPU lets a record wake the reader at most once a millisecond; the first
/// drop after a quiet spell still wakes it at once, and the reader looks
/// for records that did not wake it on a short timer of its own.
#[inline(always)]
fn wakeup_flags(now: u64) -> u64 {
    let Some(last) = LAST_WAKEUP.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let last = unsafe { &mut *last };
    if now.wrapping_sub(*last) >= WAKEUP_EVERY_NS {
        *last = now;
        // Default: wake if the reader had caught up.
        0
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
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
