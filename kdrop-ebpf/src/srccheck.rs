//! The return code of `fib_validate_source` (net/ipv4/fib_frontend.c): on
//! kernels whose `kfree_skb` names no specific reason, -EXDEV still says
//! "reverse-path filter" and -EINVAL "martian source". It returns on the
//! same CPU, in the same softirq, just before the drop; the drop picks the
//! last one up. Signature as of v6.18 (8 arguments, returns int):
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/fib_frontend.c#L429
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use kdrop_common::{SrcCheck, FIB_WINDOW_NS};

#[map]
static SRC_CHECKS: PerCpuArray<SrcCheck> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn on_return(ret: i32) {
    if let Some(slot) = SRC_CHECKS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, written only by this CPU.
        let slot = unsafe { &mut *slot };
        slot.ts_ns = unsafe { bpf_ktime_get_ns() };
        slot.ret = ret;
    }
}

/// This CPU's last return, if recent enough to be the dropped packet's.
#[inline(always)]
pub fn recent(now: u64) -> Option<i32> {
    let slot = SRC_CHECKS.get_ptr(0)?;
    // SAFETY: per-CPU slot; read only.
    let slot = unsafe { &*slot };
    (slot.ts_ns != 0 && now.wrapping_sub(slot.ts_ns) < FIB_WINDOW_NS).then_some(slot.ret)
}
