//! Handshake packets leaving a device (`net:net_dev_queue`, called from
//! `__dev_queue_xmit` with the skb; as of v6.18:
//! https://github.com/torvalds/linux/blob/v6.18/include/trace/events/net.h#L89).
//! Userspace follows each handshake with them: a DNAT'd SYN sent again and
//! again with no answer, a SYN whose reply tuple later shows up un-NAT'd.
//! Every packet the node sends passes here, so this point is armed only
//! while a handshake is being followed.
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_RING_SIZE},
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
};
use kdrop_common::{EventHeader, PacketEvent, EGRESS_COUNTERS_KEY, EVENT_EGRESS, TCP_RST, TCP_SYN};

use crate::{
    config::{offsets, COUNTERS, EVENTS},
    ct,
    drop::wakeup_flags,
    filter::{admit, admitted, identity, SLOT_EGRESS},
    monitor,
    skb::Load,
};

#[inline(always)]
pub fn on_net_dev_queue<L: Load>(skb: u64) -> i32 {
    let _ = try_net_dev_queue::<L>(skb);
    0
}

#[inline(always)]
fn try_net_dev_queue<L: Load>(skb: u64) -> Option<()> {
    // The handshake and its refusal, whatever --all-flags says for drops.
    let a = admitted(SLOT_EGRESS)?;
    if !admit::<L>(skb, TCP_SYN | TCP_RST, a) {
        return None;
    }
    let counters = COUNTERS.get_ptr_mut(EGRESS_COUNTERS_KEY)?;
    // SAFETY: per-CPU slot; nothing else on this CPU writes it meanwhile.
    let counters = unsafe { &mut *counters };
    counters.matched += 1;
    if !monitor::admit_egress() {
        counters.capped += 1;
        return None;
    }
    // Drops first: followed packets leave half the ring to them. A healthy
    // churn on the traced port (588,646 followed in 48 s in CI) filled it
    // and its drops were lost; the packets shed here are counted lost.
    // bpf_ringbuf_query: v5.8+.
    if EVENTS.query(u64::from(BPF_RB_AVAIL_DATA)) > EVENTS.query(u64::from(BPF_RB_RING_SIZE)) / 2 {
        counters.lost += 1;
        return None;
    }
    let Some(mut entry) = EVENTS.reserve::<PacketEvent>(0) else {
        counters.lost += 1;
        return None;
    };
    // SAFETY: the reservation is sizeof(PacketEvent) bytes, written before submit.
    let e = unsafe { &mut *entry.as_mut_ptr() };
    let o = offsets();
    // SAFETY: plain helper calls.
    let now = unsafe { bpf_ktime_get_ns() };
    e.header = EventHeader {
        kind: EVENT_EGRESS,
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: now,
    };
    identity(a, L::load(skb, o.skb_mark).unwrap_or(0), &mut e.pkt);
    // The filter took the interface it came in on (`skb_iif`, like drops);
    // the record says where it leaves.
    let dev: u64 = L::load(skb, o.skb_dev).unwrap_or(0);
    e.pkt.ifindex = L::load(dev, o.dev_ifindex).unwrap_or(0);
    ct::read_ct::<L>(skb, o, &mut e.ct);
    entry.submit(wakeup_flags(now));
    counters.emitted += 1;
    Some(())
}
