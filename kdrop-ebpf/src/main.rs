//! kdrop's kernel programs. Entry points are thin: they pull their arguments
//! out of the context the attach type gives and call `try_*` functions.
#![no_std]
#![no_main]

mod config;
mod ct;
mod drop;
mod egress;
mod fib;
mod filter;
mod head;
mod monitor;
mod nfverdict;
mod retrans;
mod skb;
mod srccheck;

use aya_ebpf::{
    macros::{btf_tracepoint, fexit, kprobe, kretprobe, raw_tracepoint, tracepoint},
    programs::{
        BtfTracePointContext, FExitContext, ProbeContext, RawTracePointContext, RetProbeContext,
        TracePointContext,
    },
};
use kdrop_common::{
    nf::{NF_FN_CONNTRACK_IN, NF_FN_IPT_DO_TABLE, NF_FN_NAT, NF_FN_NFT_DO_CHAIN},
    ABSENT,
};

use crate::{
    config::{fib_args, kfree_skb_args, kfree_skb_fields, retrans_args},
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

/// `tcp:tcp_retransmit_skb` as tp_btf (see retrans.rs for the arguments).
#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb_btf(ctx: BtfTracePointContext) -> i32 {
    retrans::on_retransmit_skb::<Direct>(arg_at(retrans_args().skb_sk, |n| ctx.arg(n)))
}

/// The same as a raw tracepoint.
#[raw_tracepoint(tracepoint = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb_raw(ctx: RawTracePointContext) -> i32 {
    retrans::on_retransmit_skb::<Probe>(arg_at(retrans_args().skb_sk, |n| ctx.arg(n)))
}

/// `tcp:tcp_retransmit_synack` as tp_btf.
#[btf_tracepoint(function = "tcp_retransmit_synack")]
pub fn tcp_retransmit_synack_btf(ctx: BtfTracePointContext) -> i32 {
    retrans::on_retransmit_synack::<Direct>(arg_at(retrans_args().synack_req, |n| ctx.arg(n)))
}

/// The same as a raw tracepoint.
#[raw_tracepoint(tracepoint = "tcp_retransmit_synack")]
pub fn tcp_retransmit_synack_raw(ctx: RawTracePointContext) -> i32 {
    retrans::on_retransmit_synack::<Probe>(arg_at(retrans_args().synack_req, |n| ctx.arg(n)))
}

/// `sock:inet_sock_set_state` as tp_btf: `(sk, oldstate, newstate)`, the
/// positions userspace checks against BTF before loading (constant indexes:
/// three `arg_at`s here compiled to ctx pointer arithmetic, which the
/// verifier refuses).
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state_btf(ctx: BtfTracePointContext) -> i32 {
    retrans::on_set_state::<Direct>(ctx.arg(0), ctx.arg(1), ctx.arg(2))
}

/// The same as a raw tracepoint.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn inet_sock_set_state_raw(ctx: RawTracePointContext) -> i32 {
    retrans::on_set_state::<Probe>(ctx.arg(0), ctx.arg(1), ctx.arg(2))
}

/// `fib_validate_source`'s return code through fexit (kernels whose
/// trampolines take its 8 arguments; 6.1 takes 6 and refuses it).
#[fexit(function = "fib_validate_source")]
pub fn fib_validate_source_fexit(ctx: FExitContext) -> i32 {
    srccheck::on_return(ctx.arg(0), ctx.ret::<i32>().unwrap_or(0));
    0
}

/// The kretprobe rung (kernels with kprobes): this kprobe saves the skb
/// (first argument) for the kretprobe.
#[kprobe]
pub fn fib_validate_source_kprobe(ctx: ProbeContext) -> u32 {
    srccheck::on_entry(ctx.arg::<u64>(0).unwrap_or(0));
    0
}

/// The return code, for the skb the kprobe saved.
#[kretprobe]
pub fn fib_validate_source_kretprobe(ctx: RetProbeContext) -> u32 {
    srccheck::on_kretprobe(ctx.ret::<i64>() as i32);
    0
}

// Netfilter verdicts (nfverdict.rs). Each function has three programs: an
// fexit (arguments and return value in one place; the return value is the
// argument after the last, so the argument count is part of the program and
// userspace checks it against BTF), and a kprobe saving the arguments for a
// kretprobe that reads the return value. Signatures, unchanged from v5.10 to
// v6.18 except ipt_do_table (reordered in v5.16; userspace takes the order
// from BTF):
// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_core.c (nf_conntrack_in(skb, state))
// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_core.c (nf_nat_inet_fn(priv, skb, state))
// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_tables_core.c (nft_do_chain(pkt, priv))
// https://github.com/torvalds/linux/blob/v6.18/net/ipv4/netfilter/ip_tables.c (ipt_do_table(priv, skb, state))
// https://github.com/torvalds/linux/blob/v5.10/net/ipv4/netfilter/ip_tables.c (ipt_do_table(skb, state, table))

#[inline(always)]
fn nf_fexit<const N: usize>(ctx: &FExitContext, func: u8) -> i32 {
    // The return value follows the N arguments in the trampoline's context.
    let verdict: u64 = ctx.arg(N);
    if !nfverdict::is_drop(verdict as u32) {
        return 0;
    }
    let a0: u64 = if N > 0 { ctx.arg(0) } else { 0 };
    let a1: u64 = if N > 1 { ctx.arg(1) } else { 0 };
    let a2: u64 = if N > 2 { ctx.arg(2) } else { 0 };
    nfverdict::on_drop_verdict(u32::from(func), verdict as u32, a0, a1, a2)
}

#[inline(always)]
fn nf_kprobe(ctx: &ProbeContext, func: u8) -> u32 {
    let a = |n| ctx.arg::<u64>(n).unwrap_or(0);
    nfverdict::save_args(func, [a(0), a(1), a(2)]);
    0
}

#[inline(always)]
fn nf_kretprobe(ctx: &RetProbeContext, func: u8) -> u32 {
    // Popped whatever the verdict, to keep the stack in step with the calls.
    let Some([a0, a1, a2]) = nfverdict::take_args(func) else {
        return 0;
    };
    let verdict = ctx.ret::<u64>() as u32;
    if nfverdict::is_drop(verdict) {
        nfverdict::on_drop_verdict(u32::from(func), verdict, a0, a1, a2);
    }
    0
}

#[fexit(function = "nf_conntrack_in")]
pub fn nf_conntrack_in_fexit(ctx: FExitContext) -> i32 {
    nf_fexit::<2>(&ctx, NF_FN_CONNTRACK_IN)
}

#[kprobe]
pub fn nf_conntrack_in_kprobe(ctx: ProbeContext) -> u32 {
    nf_kprobe(&ctx, NF_FN_CONNTRACK_IN)
}

#[kretprobe]
pub fn nf_conntrack_in_kretprobe(ctx: RetProbeContext) -> u32 {
    nf_kretprobe(&ctx, NF_FN_CONNTRACK_IN)
}

#[fexit(function = "nf_nat_inet_fn")]
pub fn nf_nat_inet_fn_fexit(ctx: FExitContext) -> i32 {
    nf_fexit::<3>(&ctx, NF_FN_NAT)
}

#[kprobe]
pub fn nf_nat_inet_fn_kprobe(ctx: ProbeContext) -> u32 {
    nf_kprobe(&ctx, NF_FN_NAT)
}

#[kretprobe]
pub fn nf_nat_inet_fn_kretprobe(ctx: RetProbeContext) -> u32 {
    nf_kretprobe(&ctx, NF_FN_NAT)
}

#[fexit(function = "nft_do_chain")]
pub fn nft_do_chain_fexit(ctx: FExitContext) -> i32 {
    nf_fexit::<2>(&ctx, NF_FN_NFT_DO_CHAIN)
}

#[kprobe]
pub fn nft_do_chain_kprobe(ctx: ProbeContext) -> u32 {
    nf_kprobe(&ctx, NF_FN_NFT_DO_CHAIN)
}

#[kretprobe]
pub fn nft_do_chain_kretprobe(ctx: RetProbeContext) -> u32 {
    nf_kretprobe(&ctx, NF_FN_NFT_DO_CHAIN)
}

#[fexit(function = "ipt_do_table")]
pub fn ipt_do_table_fexit(ctx: FExitContext) -> i32 {
    nf_fexit::<3>(&ctx, NF_FN_IPT_DO_TABLE)
}

#[kprobe]
pub fn ipt_do_table_kprobe(ctx: ProbeContext) -> u32 {
    nf_kprobe(&ctx, NF_FN_IPT_DO_TABLE)
}

#[kretprobe]
pub fn ipt_do_table_kretprobe(ctx: RetProbeContext) -> u32 {
    nf_kretprobe(&ctx, NF_FN_IPT_DO_TABLE)
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
