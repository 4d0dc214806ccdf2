//! kdrop's kernel programs. Entry points are thin: they pull their arguments
//! out of the context the attach type gives and call `try_*` functions.
#![no_std]
#![no_main]

mod config;
mod ct;
mod drop;
mod egress;
mod fib;
mod monitor;
mod skb;
mod srccheck;

use aya_ebpf::{
    macros::{btf_tracepoint, fexit, kretprobe, raw_tracepoint, tracepoint},
    programs::{
        BtfTracePointContext, FExitContext, RawTracePointContext, RetProbeContext,
        TracePointContext,
    },
};
use kdrop_common::ABSENT;

use crate::{
    config::{fib_args, kfree_skb_args, kfree_skb_fields},
    skb::{Direct, Probe},
};

/// `skb:kfree_skb` as tp_btf: arguments are the `TP_PROTO` ones,
/// `(struct sk_buff *skb, void *location, enum skb_drop_reason reason, ...)`
/// since 5.17 (https://github.com/torvalds/linux/blob/v5.17/include/trace/events/skb.h#L14).
/// Indexes come from BTF; ctx reads must be constant, hence `arg_at`.
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_btf(ctx: BtfTracePointContext) -> i32 {
    let args = kfree_skb_args();
    let skb: u64 = arg_at(args.skb, |n| ctx.arg(n));
    let location: u64 = arg_at(args.location, |n| ctx.arg(n));
    let reason: u64 = arg_at(args.reason, |n| ctx.arg(n));
    drop::on_kfree_skb::<Direct>(skb, location, reason, &args)
}

/// The same tracepoint as a raw tracepoint (kernels without tp_btf).
#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn kfree_skb_raw(ctx: RawTracePointContext) -> i32 {
    let args = kfree_skb_args();
    let skb: u64 = arg_at(args.skb, |n| ctx.arg(n));
    let location: u64 = arg_at(args.location, |n| ctx.arg(n));
    let reason: u64 = arg_at(args.reason, |n| ctx.arg(n));
    drop::on_kfree_skb::<Probe>(skb, location, reason, &args)
}

/// The classic tracepoint: arguments are fields of the trace record at the
/// byte offsets its `format` file gives.
#[tracepoint(category = "skb", name = "kfree_skb")]
pub fn kfree_skb_tp(ctx: TracePointContext) -> i32 {
    let args = kfree_skb_fields();
    let skb: u64 = record_at(&ctx, args.skb, 8);
    let location: u64 = record_at(&ctx, args.location, 8);
    let reason: u64 = record_at(&ctx, args.reason, 4);
    drop::on_kfree_skb::<Probe>(skb, location, reason, &args)
}

/// `fib:fib_table_lookup` as tp_btf: `(u32 tb_id, const struct flowi4 *flp,
/// const struct fib_nh_common *nhc, int err)` since 5.3
/// (https://github.com/torvalds/linux/blob/v6.18/include/trace/events/fib.h#L14).
#[btf_tracepoint(function = "fib_table_lookup")]
pub fn fib_table_lookup_btf(ctx: BtfTracePointContext) -> i32 {
    let a = fib_args();
    fib::on_fib_table_lookup::<Direct>(
        arg_at(a.tb_id, |n| ctx.arg(n)),
        arg_at(a.flp, |n| ctx.arg(n)),
        arg_at(a.nhc, |n| ctx.arg(n)),
        arg_at(a.err, |n| ctx.arg(n)),
    )
}

/// The same as a raw tracepoint.
#[raw_tracepoint(tracepoint = "fib_table_lookup")]
pub fn fib_table_lookup_raw(ctx: RawTracePointContext) -> i32 {
    let a = fib_args();
    fib::on_fib_table_lookup::<Probe>(
        arg_at(a.tb_id, |n| ctx.arg(n)),
        arg_at(a.flp, |n| ctx.arg(n)),
        arg_at(a.nhc, |n| ctx.arg(n)),
        arg_at(a.err, |n| ctx.arg(n)),
    )
}

/// `net:net_dev_queue` as tp_btf: `(struct sk_buff *skb)`.
#[btf_tracepoint(function = "net_dev_queue")]
pub fn net_dev_queue_btf(ctx: BtfTracePointContext) -> i32 {
    egress::on_net_dev_queue::<Direct>(ctx.arg(0))
}

/// The same as a raw tracepoint.
#[raw_tracepoint(tracepoint = "net_dev_queue")]
pub fn net_dev_queue_raw(ctx: RawTracePointContext) -> i32 {
    egress::on_net_dev_queue::<Probe>(ctx.arg(0))
}

/// `fib_validate_source`'s return code through fexit (kernels whose
/// trampolines take its 8 arguments; 6.1 takes 6 and refuses it).
#[fexit(function = "fib_validate_source")]
pub fn fib_validate_source_fexit(ctx: FExitContext) -> i32 {
    srccheck::on_return(ctx.ret::<i32>().unwrap_or(0));
    0
}

/// The same through a kretprobe (kernels with kprobes).
#[kretprobe]
pub fn fib_validate_source_kretprobe(ctx: RetProbeContext) -> u32 {
    srccheck::on_return(ctx.ret::<i64>() as i32);
    0
}

/// Reads argument `n` with a constant index: the verifier refuses variable
/// ctx offsets, and prunes the branches a frozen global rules out.
#[inline(always)]
fn arg_at(n: u32, arg: impl Fn(usize) -> u64) -> u64 {
    match n {
        0 => arg(0),
        1 => arg(1),
        2 => arg(2),
        3 => arg(3),
        4 => arg(4),
        _ => u64::from(ABSENT),
    }
}

#[inline(always)]
fn record_at(ctx: &TracePointContext, offset: u32, size: u32) -> u64 {
    if offset == ABSENT {
        return u64::from(ABSENT);
    }
    // SAFETY: the offset comes from the tracepoint's own format file.
    let r = if size == 4 {
        unsafe { ctx.read_at::<u32>(offset as usize) }.map(u64::from)
    } else {
        unsafe { ctx.read_at::<u64>(offset as usize) }
    };
    r.unwrap_or(u64::from(ABSENT))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
