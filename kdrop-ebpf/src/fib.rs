//! Route lookups: every IPv4 FIB table lookup is remembered per CPU so that a
//! drop can carry the lookups the kernel did for that very packet (e.g. the
//! reverse-path check of `fib_validate_source`). This is the kernel's own
//! routing evidence on kernels where fexit/kretprobe are not allowed.
use core::mem::size_of;

use aya_ebpf::helpers::{bpf_ktime_get_ns, generated};
use kdrop_common::{FibLookup, Offsets, FIB_RECENT, FIB_WINDOW_NS};

use crate::{
    config::{offsets, FIB_LOOKUPS},
    skb::Load,
};

/// `fib_table_lookup(tb_id, flp, nhc, err)`, the tracepoint in
/// net/ipv4/fib_trie.c (args as of v6.18:
/// https://github.com/torvalds/linux/blob/v6.18/include/trace/events/fib.h#L14).
/// It runs for every IPv4 route lookup on the node: `L` is `Direct` for
/// tp_btf (plain loads), `Probe` for raw_tp.
#[inline(always)]
pub fn on_fib_table_lookup<L: Load>(tb_id: u64, flp: u64, nhc: u64, err: u64) -> i32 {
    let _ = try_fib_table_lookup::<L>(tb_id, flp, nhc, err);
    0
}

#[inline(always)]
fn try_fib_table_lookup<L: Load>(tb_id: u64, flp: u64, nhc: u64, err: u64) -> Option<()> {
    let o = offsets();
    let recent = FIB_LOOKUPS.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot, written only by this CPU.
    let recent = unsafe { &mut *recent };
    let slot = (recent.next as usize) & (FIB_RECENT - 1);
    recent.next = recent.next.wrapping_add(1);
    let e = &mut recent.entries[slot];
    e.ts_ns = unsafe { bpf_ktime_get_ns() };
    e.tb_id = tb_id as u32;
    e.err = err as i32;
    e.iif = L::load(flp, o.fl4_iif).unwrap_or(0);
    e.oif = L::load(flp, o.fl4_oif).unwrap_or(0);
    e.mark = L::load(flp, o.fl4_mark).unwrap_or(0);
    e.saddr = L::load(flp, o.fl4_saddr).unwrap_or([0; 4]);
    e.daddr = L::load(flp, o.fl4_daddr).unwrap_or([0; 4]);
    e.netns = 0;
    fill_result::<L>(e, nhc, o);
    Some(())
}

#[inline(always)]
fn fill_result<L: Load>(e: &mut FibLookup, nhc: u64, o: &Offsets) {
    let dev: u64 = L::load(nhc, o.nhc_dev).unwrap_or(0);
    e.res_ifindex = L::load(dev, o.dev_ifindex).unwrap_or(0);
    let net: u64 = L::load(dev, o.dev_net).unwrap_or(0);
    e.netns = L::load(net, o.net_inum).unwrap_or(0);
    e.gw = L::load(nhc, o.nhc_gw).unwrap_or([0; 4]);
    e.gw_family = L::load(nhc, o.nhc_gw_family).unwrap_or(0);
    e.scope = L::load(nhc, o.nhc_scope).unwrap_or(0);
}

/// Did this CPU record a route lookup within `FIB_WINDOW_NS` of `now`? Not
/// when the probe is disarmed: a drop then carries no stale ring.
#[inline(always)]
pub fn fresh(now: u64) -> bool {
    let Some(recent) = FIB_LOOKUPS.get_ptr(0) else {
        return false;
    };
    // SAFETY: per-CPU slot of this CPU; read only.
    let recent = unsafe { &*recent };
    let last = recent.next.wrapping_sub(1) as usize & (FIB_RECENT - 1);
    let ts = recent.entries.get(last).map_or(0, |e| e.ts_ns);
    ts != 0 && now.wrapping_sub(ts) < FIB_WINDOW_NS
}

/// Copies this CPU's whole ring of recent lookups into `out` and returns
/// its cursor (the oldest slot). One helper call, no loop: userspace picks
/// the packet's own lookups (see `kdrop::event::route_lookups`).
#[inline(always)]
pub fn copy_recent(out: &mut [FibLookup; FIB_RECENT]) -> Option<u32> {
    let recent = FIB_LOOKUPS.get_ptr(0)?;
    // SAFETY: a per-CPU map value of this CPU; bpf_probe_read_kernel copies
    // it in one go and fails cleanly.
    unsafe {
        let src = &raw const (*recent).entries;
        let ret = generated::bpf_probe_read_kernel(
            out.as_mut_ptr().cast(),
            size_of::<[FibLookup; FIB_RECENT]>() as u32,
            src.cast(),
        );
        (ret == 0).then_some((*recent).next)
    }
}
