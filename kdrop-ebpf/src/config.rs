//! Load-time configuration: globals userspace fills in before loading (they
//! land in .rodata, so the verifier sees them as constants).
use aya_ebpf::{
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use kdrop_common::{Counters, Filter, KfreeSkbArgs, Offsets};

#[unsafe(no_mangle)]
static OFFSETS: Offsets = Offsets::zeroed();

/// Argument indexes for tp_btf and raw_tp.
#[unsafe(no_mangle)]
static KFREE_SKB_ARGS: KfreeSkbArgs = KfreeSkbArgs::zeroed();

/// Record offsets for the classic tracepoint.
#[unsafe(no_mangle)]
static KFREE_SKB_FIELDS: KfreeSkbArgs = KfreeSkbArgs::zeroed();

#[unsafe(no_mangle)]
static FILTER: Filter = Filter::zeroed();

/// Userspace sets the size (`--ring-size`); this is the default.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
pub static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: when (bpf_ktime_get_ns) a record last was allowed to wake the
/// reader.
#[map]
pub static LAST_WAKEUP: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

// Volatile reads so the compiler does not fold the zeroed initialisers.
#[inline(always)]
pub fn offsets() -> Offsets {
    unsafe { core::ptr::read_volatile(&raw const OFFSETS) }
}

#[inline(always)]
pub fn kfree_skb_args() -> KfreeSkbArgs {
    unsafe { core::ptr::read_volatile(&raw const KFREE_SKB_ARGS) }
}

#[inline(always)]
pub fn kfree_skb_fields() -> KfreeSkbArgs {
    unsafe { core::ptr::read_volatile(&raw const KFREE_SKB_FIELDS) }
}

#[inline(always)]
pub fn filter() -> &'static Filter {
    // A reference into .rodata: fields are read on use, not copied to the stack.
    unsafe { &*core::ptr::read_volatile(&&raw const FILTER) }
}
