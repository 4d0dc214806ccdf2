//! The drop path: a packet freed by `kfree_skb` with a reason.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
};
use kdrop_common::{
    service_port, Cidr, DropEvent, EventHeader, Filter, KfreeSkbArgs, Offsets, ABSENT, AF_INET,
    COUNTERS_KEY, EVENT_DROP, MAX_HOSTS, MAX_PORTS,
};

use crate::{
    config::{filter, offsets, COUNTERS, CT_SCRATCH, EVENTS, LAST_WAKEUP},
    ct, fib, monitor,
    skb::{self, Load, Tcp},
    srccheck,
};

#[inline(always)]
pub fn on_kfree_skb<L: Load>(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> i32 {
    let _ = try_kfree_skb::<L>(skb, location, reason, args);
    0
}

#[inline(always)]
fn try_kfree_skb<L: Load>(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> Option<()> {
    let reason = reason as u32;
    let reason_or_absent = if args.reason == ABSENT {
        ABSENT
    } else {
        reason
    };
    // Older kernels also report frees that are not drops through this
    // tracepoint; newer ones route them to consume_skb.
    if args.consumed != ABSENT && reason == args.consumed {
        return None;
    }
    let o = offsets();
    let tcp = skb::parse_tcp::<L>(skb, o)?;
    let f = filter();
    if !flags_match(f.tcp_flags_any, tcp.tcp_flags) {
        return None;
    }
    if !matches_packet::<L>(f, &tcp, skb, o) {
        return None;
    }
    let (netns, ifindex) = skb::netns_and_ifindex::<L>(skb, o);
    if (f.netns != 0 && f.netns != netns) || (f.ifindex != 0 && f.ifindex != ifindex) {
        return None;
    }
    let counters = COUNTERS.get_ptr_mut(COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    // Monitor mode: count every matched drop (a no-op when MONITOR is
    // zero, i.e. live tracing).
    let port = service_port(tcp.tcp_flags, tcp.sport, tcp.dport);
    monitor::aggregate(reason_or_absent, netns, ifindex, port);
    // 1 in N per CPU: the 1st, N+1th, 2N+1th... match. `emitted + lost +
    // capped` counts the picks so far, so the next one is due at match
    // picks * N + 1 (a multiply, not a 64-bit division per packet). The
    // split stays exact without an atomic: the counters are per CPU.
    if f.sample_every > 1
        && counters.matched - 1
            != (counters.emitted + counters.lost + counters.capped) * u64::from(f.sample_every)
    {
        counters.sampled_out += 1;
        return None;
    }
    // Monitor mode's per-second cap on detailed events.
    if !monitor::admit() {
        counters.capped += 1;
        return None;
    }
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
    e.reason = reason_or_absent;
    e.netns = netns;
    e.ifindex = ifindex;
    e.mark = L::load(skb, o.skb_mark).unwrap_or(0);
    e.saddr = tcp.saddr;
    e.daddr = tcp.daddr;
    e.sport = tcp.sport;
    e.dport = tcp.dport;
    e.family = tcp.family;
    e.tcp_flags = tcp.tcp_flags;
    e._pad = [0; 2];
    // Route lookups are IPv4 only; userspace ignores `fib` unless valid.
    let fib_next = if tcp.family == AF_INET {
        fib::copy_recent(&mut e.fib)
    } else {
        None
    };
    e.fib_valid = u32::from(fib_next.is_some());
    e.fib_next = fib_next.unwrap_or(0);
    ct::read_ct::<L>(skb, o, &mut e.ct);
    let check = srccheck::recent(now, skb);
    e.src_check_ret = check.unwrap_or(0);
    e.src_check_seen = u32::from(check.is_some());
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
pub fn wakeup_flags(now: u64) -> u64 {
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

/// `any == 0` matches every packet.
#[inline(always)]
pub fn flags_match(any: u8, flags: u8) -> bool {
    any == 0 || flags & any != 0
}

/// Ports and addresses, of the packet or else of its conntrack entry's
/// original direction: `--port`/`--host` also match what the client used
/// before NAT (a service port, a VIP). The entry is only read for packets
/// that do not match by themselves.
// A BPF subprogram: its own stack frame keeps the caller under 512 bytes.
#[inline(never)]
pub fn matches_packet<L: Load>(f: &Filter, t: &Tcp, skb: u64, o: &Offsets) -> bool {
    if f.n_ports == 0 && f.n_hosts == 0 {
        return true;
    }
    let ports = (u32::from(t.sport) << 16) | u32::from(t.dport);
    if matches_tuple(f, t.family, &t.saddr, &t.daddr, ports) {
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

/// One direction's addresses and ports (`sport << 16 | dport`: BPF
/// functions take at most 5 arguments). Loops stop at the first hit and at
/// the configured count, which keeps the verifier's path count small.
#[inline(never)]
fn matches_tuple(f: &Filter, family: u8, saddr: &[u8; 16], daddr: &[u8; 16], ports: u32) -> bool {
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
