//! `--pcap`: the first bytes of a dropped packet, from its network header,
//! copied into the ring just before its drop record. Only for drops that
//! become records (admitted and sampled in), so a flood of filtered-out
//! packets pays nothing (issue 12).
use aya_ebpf::{bindings::BPF_RB_NO_WAKEUP, helpers::bpf_probe_read_kernel_buf};
use kdrop_common::{EventHeader, HeadEvent, EVENT_HEAD};

use crate::{
    config::{offsets, EVENTS},
    skb::Load,
};

/// Copies `HEAD_BYTES` from `head + network_header` (offsets from BTF,
/// kernel/facts.rs). The head buffer extends past any TCP packet's first
/// 128 bytes (skb_shared_info follows it), so the copy stays inside the
/// allocation; userspace cuts it to the IP header's total length. No wakeup:
/// the drop record right behind it wakes the reader.
// A BPF subprogram: its own stack frame.
#[inline(never)]
pub fn capture<L: Load>(skb: u64, now: u64, cpu: u32) {
    let Some((_, head, nh_off)) = L::skb_members(skb, offsets()) else {
        return;
    };
    if head == 0 || nh_off == u16::MAX {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<HeadEvent>(0) else {
        return;
    };
    // SAFETY: the reservation is sizeof(HeadEvent) bytes, all written
    // (header here, bytes by the helper) before submit.
    let e = unsafe { &mut *entry.as_mut_ptr() };
    e.header = EventHeader {
        kind: EVENT_HEAD,
        cpu,
        ts_ns: now,
    };
    let nh = head + u64::from(nh_off);
    // SAFETY: bpf_probe_read_kernel tolerates any address and fails cleanly.
    if unsafe { bpf_probe_read_kernel_buf(nh as *const u8, &mut e.bytes) }.is_err() {
        entry.discard(0);
        return;
    }
    entry.submit(BPF_RB_NO_WAKEUP as u64);
}
