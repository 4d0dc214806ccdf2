//! Load-time configuration: globals userspace fills in before loading (they
//! land in .rodata, so the verifier sees them as constants).
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use kdrop_common::{
    nf::{NfArgStack, NfProbes, NF_FNS},
    AggKey, Counters, CtTuple, Endpoint, Evidence, FibLookupArgs, FibRecent, Filter, FollowStats,
    FollowValue, KfreeSkbArgs, LimiterState, MonitorConfig, Offsets, RetransArgs,
    AGGREGATE_MAX_ENTRIES, COUNTERS_KEYS, FOLLOW_MAX_ENTRIES, LIMITERS,
};

use crate::filter::Admitted;

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

/// Argument indexes of `fib:fib_table_lookup` for tp_btf and raw_tp.
#[unsafe(no_mangle)]
static FIB_ARGS: FibLookupArgs = FibLookupArgs::zeroed();

/// Which drops carry route lookups.
#[unsafe(no_mangle)]
static EVIDENCE: Evidence = Evidence::zeroed();

/// Argument positions of the TCP retransmission tracepoints.
#[unsafe(no_mangle)]
static RETRANS_ARGS: RetransArgs = RetransArgs::zeroed();

/// Followed connections, by their client's end (filter.rs).
#[map]
pub static FOLLOW: HashMap<Endpoint, FollowValue> =
    HashMap::with_max_entries(FOLLOW_MAX_ENTRIES, 0);

/// How many endpoints are followed (a hint kept by userspace, raised by
/// kernel inserts): with none, a packet costs no map lookup.
#[map]
pub static FOLLOW_LIVE: Array<u64> = Array::with_max_entries(1, 0);

#[map]
pub static FOLLOW_STATS: PerCpuArray<FollowStats> = PerCpuArray::with_max_entries(1, 0);

/// Userspace sets the size (`--ring-size`); this is the default.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// The last IPv4 route lookups on each CPU, for drops to pick up theirs.
#[map]
pub static FIB_LOOKUPS: PerCpuArray<FibRecent> = PerCpuArray::with_max_entries(1, 0);

/// Scratch space for a conntrack entry's original tuple while filtering:
/// too big for the BPF stack next to everything else.
#[map]
pub static CT_SCRATCH: PerCpuArray<CtTuple> = PerCpuArray::with_max_entries(1, 0);

/// The packet each program is filtering (filter::admitted).
#[map]
pub static ADMITTED: PerCpuArray<Admitted> = PerCpuArray::with_max_entries(3, 0);

/// When each CPU last let a record wake the reader (see drop::wakeup_flags).
#[map]
pub static LAST_WAKEUP: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(COUNTERS_KEYS, 0);

/// Argument positions and offsets for the netfilter verdict programs.
#[unsafe(no_mangle)]
static NF_PROBES: NfProbes = NfProbes::zeroed();

/// Kretprobe rung: each function's arguments saved by its kprobe, per CPU.
#[map]
pub static NF_ARGS: PerCpuArray<NfArgStack> = PerCpuArray::with_max_entries(NF_FNS as u32, 0);

/// Monitor mode: aggregation on, sampling and the per-second cap.
#[unsafe(no_mangle)]
static MONITOR: MonitorConfig = MonitorConfig::zeroed();

/// Monitor mode: matched drops counted by (reason, netns, ifindex, port).
/// Bounded; userspace inserts `AggKey::OVERFLOW` for what does not fit.
#[map]
pub static AGGREGATE: PerCpuHashMap<AggKey, u64> =
    PerCpuHashMap::with_max_entries(AGGREGATE_MAX_ENTRIES + 1, 0);

/// Monitor mode: the sampler's and the token bucket's per-CPU state.
#[map]
pub static LIMITER: PerCpuArray<LimiterState> = PerCpuArray::with_max_entries(LIMITERS, 0);

// Volatile reads so the compiler does not fold the zeroed initialisers.
#[inline(always)]
pub fn offsets() -> &'static Offsets {
    // A reference into .rodata, not a copy: 128 bytes less of BPF stack in
    // every program (5.10 refused the drop path's combined stack of 608).
    unsafe { &*core::ptr::read_volatile(&&raw const OFFSETS) }
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
pub fn fib_args() -> FibLookupArgs {
    unsafe { core::ptr::read_volatile(&raw const FIB_ARGS) }
}

#[inline(always)]
pub fn filter() -> &'static Filter {
    // A reference into .rodata: fields are read on use, not copied to the stack.
    unsafe { &*core::ptr::read_volatile(&&raw const FILTER) }
}

#[inline(always)]
pub fn monitor() -> &'static MonitorConfig {
    unsafe { &*core::ptr::read_volatile(&&raw const MONITOR) }
}

#[inline(always)]
pub fn nf_probes() -> &'static NfProbes {
    unsafe { &*core::ptr::read_volatile(&&raw const NF_PROBES) }
}

#[inline(always)]
pub fn evidence() -> &'static Evidence {
    unsafe { &*core::ptr::read_volatile(&&raw const EVIDENCE) }
}

#[inline(always)]
pub fn retrans_args() -> RetransArgs {
    unsafe { core::ptr::read_volatile(&raw const RETRANS_ARGS) }
}
