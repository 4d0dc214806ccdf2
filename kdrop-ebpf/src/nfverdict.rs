//! Netfilter verdicts: when `nf_conntrack_in`, `nf_nat_inet_fn`,
//! `nft_do_chain` or `ipt_do_table` returns NF_DROP for a TCP packet the
//! filter matches, one record with the packet, the hook and (for the rule
//! walkers) the table and chain. `nf_hook_slow` frees the packet right after
//! (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/core.c#L619),
//! on the same CPU: userspace pairs the record with that drop. Everything
//! else returns after one comparison of the verdict.
use aya_ebpf::helpers::{
    bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes,
};
use kdrop_common::{
    nf::{
        NfVerdictEvent, NF_ARG_DEPTH, NF_ARG_STALE_NS, NF_DROP, NF_FNS, NF_NAME_LEN, NF_UNKNOWN,
        NF_VERDICT_MASK,
    },
    EventHeader, ABSENT, NF_VERDICT_COUNTERS_KEY,
};

use crate::{
    config::{filter, nf_probes, offsets, COUNTERS, EVENTS, NF_ARGS},
    drop::wakeup_flags,
    filter::{admit, admitted, identity, SLOT_VERDICT},
    skb::{read, Probe},
};

#[inline(always)]
pub fn is_drop(verdict: u32) -> bool {
    verdict & NF_VERDICT_MASK == NF_DROP
}

/// kprobe rung: the arguments of a call, for its kretprobe. A kprobe or
/// kretprobe the kernel skipped (a BPF program already running on this CPU)
/// leaves the stack out of step; entries older than any call lasts are
/// dropped, which puts it back in step.
#[inline(always)]
pub fn save_args(func: u8, args: [u64; 3]) {
    let Some(st) = NF_ARGS.get_ptr_mut(u32::from(func)) else {
        return;
    };
    // SAFETY: per-CPU slot; calls on this CPU nest, they do not interleave.
    let st = unsafe { &mut *st };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // Indexes are masked as well as compared: the 6.1 verifier does not
    // carry the comparison's bound to the access ("unbounded memory access").
    if st.depth != 0 {
        let top = st.depth.wrapping_sub(1) as usize;
        let stale = top >= NF_ARG_DEPTH
            || now.wrapping_sub(st.slots[top & (NF_ARG_DEPTH - 1)][3]) > NF_ARG_STALE_NS;
        if stale {
            st.depth = 0;
        }
    }
    let d = st.depth as usize;
    if d < NF_ARG_DEPTH {
        st.slots[d & (NF_ARG_DEPTH - 1)] = [args[0], args[1], args[2], now];
    }
    st.depth = st.depth.wrapping_add(1);
}

/// kretprobe rung: the arguments its kprobe saved for the call returning.
#[inline(always)]
pub fn take_args(func: u8) -> Option<[u64; 3]> {
    let st = NF_ARGS.get_ptr_mut(u32::from(func))?;
    // SAFETY: as in save_args.
    let st = unsafe { &mut *st };
    if st.depth == 0 {
        return None;
    }
    st.depth -= 1;
    let d = st.depth as usize;
    if d >= NF_ARG_DEPTH {
        return None;
    }
    let s = st.slots[d & (NF_ARG_DEPTH - 1)];
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    (now.wrapping_sub(s[3]) <= NF_ARG_STALE_NS).then_some([s[0], s[1], s[2]])
}

#[inline(always)]
fn pick(i: u32, a0: u64, a1: u64, a2: u64) -> u64 {
    match i {
        0 => a0,
        1 => a1,
        2 => a2,
        _ => 0,
    }
}

/// `func` returned NF_DROP with arguments `a0..a2`: record it if the packet
/// is one the filter wants.
// A BPF subprogram: one copy for every function and rung.
#[inline(never)]
pub fn on_drop_verdict(func: u32, verdict: u32, a0: u64, a1: u64, a2: u64) -> i32 {
    let _ = try_drop_verdict(func, verdict, a0, a1, a2);
    0
}

#[inline(always)]
fn try_drop_verdict(func: u32, verdict: u32, a0: u64, a1: u64, a2: u64) -> Option<()> {
    let p = nf_probes();
    // Constant offsets into .rodata, for the same reason as above.
    let fa = match func {
        0 => &p.args[0],
        1 => &p.args[1],
        2 => &p.args[2],
        3 => &p.args[3],
        _ => return None,
    };
    let mut skb = pick(fa.skb, a0, a1, a2);
    let mut state = pick(fa.state, a0, a1, a2);
    if fa.pkt != ABSENT {
        let pkt = pick(fa.pkt, a0, a1, a2);
        skb = read(pkt, p.pkt_skb).unwrap_or(0);
        state = read(pkt, p.pkt_state).unwrap_or(0);
    }
    let privp = pick(fa.priv_, a0, a1, a2);
    let o = offsets();
    // Arguments saved by the entry kprobe are plain numbers: helper reads.
    let a = admitted(SLOT_VERDICT)?;
    if !admit::<Probe>(skb, filter().tcp_flags_any, a) {
        return None;
    }
    let counters = COUNTERS.get_ptr_mut(NF_VERDICT_COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    let Some(mut entry) = EVENTS.reserve::<NfVerdictEvent>(0) else {
        counters.lost += 1;
        return None;
    };
    // SAFETY: the reservation is sizeof(NfVerdictEvent) bytes, all written
    // before submit.
    let e = unsafe { &mut *entry.as_mut_ptr() };
    let now = unsafe { bpf_ktime_get_ns() };
    e.header = EventHeader {
        kind: kdrop_common::nf::EVENT_NF_VERDICT,
        // SAFETY: plain helper call.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: now,
    };
    e.verdict = verdict;
    identity(a, read(skb, o.skb_mark).unwrap_or(0), &mut e.pkt);
    e.func = func as u8;
    e.hook = read(state, p.state_hook).unwrap_or(NF_UNKNOWN);
    e.pf = read(state, p.state_pf).unwrap_or(NF_UNKNOWN);
    e._pad = 0;
    e.table = [0; NF_NAME_LEN];
    e.chain = [0; NF_NAME_LEN];
    if privp != 0 {
        names(p, func, privp, e);
    }
    entry.submit(wakeup_flags(now));
    counters.emitted += 1;
    Some(())
}

/// Table and chain names: `xt_table.name` (an array) for ipt_do_table,
/// `nft_chain.name` and `nft_chain.table->name` (pointers) for nft_do_chain.
#[inline(always)]
fn names(p: &kdrop_common::nf::NfProbes, func: u32, privp: u64, e: &mut NfVerdictEvent) {
    if func == u32::from(kdrop_common::nf::NF_FN_IPT_DO_TABLE) && p.xt_table_name != ABSENT {
        // SAFETY: the helper faults cleanly on a bad address.
        let _ = unsafe {
            bpf_probe_read_kernel_str_bytes(
                (privp + u64::from(p.xt_table_name)) as *const u8,
                &mut e.table,
            )
        };
    } else if func == u32::from(kdrop_common::nf::NF_FN_NFT_DO_CHAIN) {
        let name: u64 = read(privp, p.chain_name).unwrap_or(0);
        if name != 0 {
            // SAFETY: as above.
            let _ = unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, &mut e.chain) };
        }
        let table: u64 = read(privp, p.chain_table).unwrap_or(0);
        let tname: u64 = read(table, p.nft_table_name).unwrap_or(0);
        if tname != 0 {
            // SAFETY: as above.
            let _ = unsafe { bpf_probe_read_kernel_str_bytes(tname as *const u8, &mut e.table) };
        }
    }
}

const _: () = assert!(NF_FNS == 4);
