//! The return code of `fib_validate_source` (net/ipv4/fib_frontend.c): on
//! kernels whose `kfree_skb` names no specific reason, -EXDEV still says
//! "reverse-path filter" and -EINVAL "martian source". It returns on the
//! same CPU, in the same softirq, just before the drop; the drop picks the
//! last one up if it was for the same skb (under load, or with slow CPUs,
//! another packet's check can be the CPU's last one). Signature as of v6.18 (8 arguments, returns int):
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/fib_frontend.c#L429
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use kdrop_common::{SrcCheck, FIB_WINDOW_NS};

#[map]
static SRC_CHECKS: PerCpuArray<SrcCheck> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn on_return(skb: u64, ret: i32) {
    if let Some(slot) = SRC_CHECKS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, written only by this CPU.
        let slot = unsafe { &mut *slot };
        slot.ts_ns = unsafe { bpf_ktime_get_ns() };
        slot.skb = skb;
        slot.ret = ret;
    }
}

/// kprobe rung: the call's skb, for `on_kretprobe`. The call runs in
/// softirq context and does not nest on one CPU.
#[inline(always)]
pub fn on_entry(skb: u64) {
    if let Some(slot) = SRC_CHECKS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, written only by this CPU.
        unsafe { (*slot).entry_skb = skb };
    }
}

/// kretprobe rung: the return of the call `on_entry` saw.
#[inline(always)]
pub fn on_kretprobe(ret: i32) {
    let skb = match SRC_CHECKS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, written only by this CPU.
        Some(slot) => unsafe { core::mem::replace(&mut (*slot).entry_skb, 0) },
        None => return,
    };
    on_return(skb, ret);
}

/// This CPU's last return, if it was for `skb` and recent enough to be this
/// packet's (not an earlier packet's whose skb was reused).
#[inline(always)]
pub fn recent(now: u64, skb: u64) -> Option<i32> {
    let slot = SRC_CHECKS.get_ptr(0)?;
    // SAFETY: per-CPU slot; read only.
    let slot = unsafe { &*slot };
    (slot.ts_ns != 0 && slot.skb == skb && now.wrapping_sub(slot.ts_ns) < FIB_WINDOW_NS)
        .then_some(slot.ret)
}
