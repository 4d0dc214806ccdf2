//! The drop path: a packet freed by `kfree_skb` with a reason.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
};
use kdrop_common::{
    service_port, Counters, DropEvent, EventHeader, KfreeSkbArgs, RoutedDropEvent, ABSENT, AF_INET,
    COUNTERS_KEY, EVENT_DROP, EVENT_DROP_ROUTED,
};

use crate::{
    config::{evidence, filter, offsets, COUNTERS, EVENTS, LAST_WAKEUP},
    ct, fib,
    filter::{admit, admitted, identity, Admitted, SLOT_DROP},
    head, monitor,
    skb::{self, Load},
    srccheck,
};

#[inline(always)]
pub fn on_kfree_skb<L: Load>(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> i32 {
    let _ = try_kfree_skb::<L>(skb, location, reason, args);
    0
}

#[inline(always)]
fn try_kfree_skb<L: Load>(skb: u64, location: u64, reason: u64, args: &KfreeSkbArgs) -> Option<()> {
    let has_reason = args.reason != ABSENT;
    let reason = if has_reason { reason as u32 } else { ABSENT };
    // Older kernels also report frees that are not drops through this
    // tracepoint; newer ones route them to consume_skb.
    if args.consumed != ABSENT && reason == args.consumed {
        return None;
    }
    let a = admitted(SLOT_DROP)?;
    // The final ACK refused by a full accept queue is a handshake packet
    // though it carries no SYN.
    if !admit::<L>(skb, filter().drop_flags(reason), a) {
        return None;
    }
    let counters = COUNTERS.get_ptr_mut(COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    // Monitor mode: count every matched drop (a no-op when MONITOR is
    // zero, i.e. live tracing).
    let port = service_port(a.tcp.tcp_flags, a.tcp.sport, a.tcp.dport);
    monitor::aggregate(reason, a.netns, a.ifindex, port);
    if !picked(counters) {
        return None;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if evidence().capture_head != 0 {
        // Before the drop record: the reader has it when the drop comes.
        // SAFETY: plain helper call.
        head::capture::<L>(skb, now, unsafe { bpf_get_smp_processor_id() });
    }
    // Route lookups only for drops they can explain, only IPv4, and only
    // when the route-lookup probe is armed (its ring holds a recent one).
    let routed =
        a.tcp.family == AF_INET && evidence().wants_routes(reason, has_reason) && fib::fresh(now);
    if routed {
        let Some(mut entry) = EVENTS.reserve::<RoutedDropEvent>(0) else {
            counters.lost += 1;
            return None;
        };
        // Filled in place: the record is too large for the BPF stack.
        // SAFETY: the reservation is sizeof(RoutedDropEvent) bytes, all
        // written before submit.
        let e = unsafe { &mut *entry.as_mut_ptr() };
        let at = At {
            kind: EVENT_DROP_ROUTED,
            now,
            skb,
            location,
            reason,
        };
        fill::<L>(&mut e.drop, a, &at);
        e.drop.fib_next = fib::copy_recent(&mut e.fib).unwrap_or(u32::MAX);
        entry.submit(wakeup_flags(now));
    } else {
        let Some(mut entry) = EVENTS.reserve::<DropEvent>(0) else {
            counters.lost += 1;
            return None;
        };
        // SAFETY: as above, sizeof(DropEvent) bytes.
        let e = unsafe { &mut *entry.as_mut_ptr() };
        let at = At {
            kind: EVENT_DROP,
            now,
            skb,
            location,
            reason,
        };
        fill::<L>(e, a, &at);
        e.fib_next = u32::MAX;
        entry.submit(wakeup_flags(now));
    }
    counters.emitted += 1;
    Some(())
}

/// Sampling (1 in N per CPU) and monitor mode's per-second cap: does this
/// matched drop become a record? Refusals are counted.
#[inline(always)]
fn picked(counters: &mut Counters) -> bool {
    let f = filter();
    // The 1st, N+1th, 2N+1th... match. `emitted + lost + capped` counts the
    // picks so far, so the next one is due at match picks * N + 1 (a
    // multiply, not a 64-bit division per packet). The split stays exact
    // without an atomic: the counters are per CPU.
    if f.sample_every > 1
        && counters.matched - 1
            != (counters.emitted + counters.lost + counters.capped) * u64::from(f.sample_every)
    {
        counters.sampled_out += 1;
        return false;
    }
    if !monitor::admit() {
        counters.capped += 1;
        return false;
    }
    true
}

/// The drop as the tracepoint gave it, for `fill` (BPF functions take at
/// most five arguments).
struct At {
    kind: u32,
    now: u64,
    skb: u64,
    location: u64,
    reason: u32,
}

/// Everything of a drop record but the route lookups.
// A BPF subprogram: one copy for both record kinds.
#[inline(never)]
fn fill<L: Load>(e: &mut DropEvent, a: &Admitted, at: &At) {
    let o = offsets();
    e.header = EventHeader {
        kind: at.kind,
        // SAFETY: plain helper call.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: at.now,
    };
    identity(a, L::load(at.skb, o.skb_mark).unwrap_or(0), &mut e.pkt);
    e.location = at.location;
    e.reason = at.reason;
    let check = srccheck::recent(at.now, at.skb);
    e.src_check_ret = check.unwrap_or(0);
    e.src_check_seen = u32::from(check.is_some());
    ct::read_ct::<L>(at.skb, o, &mut e.ct);
    // Zeroed first: a reservation holds an older record's bytes.
    e.src_mac = [0; 6];
    e.src_mac_seen = u8::from(skb::source_mac::<L>(at.skb, o, &mut e.src_mac));
    e._pad = 0;
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
