//! Handshake packets leaving a device (`net:net_dev_queue`, called from
//! `__dev_queue_xmit` with the skb; as of v6.18:
//! https://github.com/torvalds/linux/blob/v6.18/include/trace/events/net.h#L89).
//! Userspace follows each handshake with them: a DNAT'd SYN sent again and
//! again with no answer, a SYN whose reply tuple later shows up un-NAT'd.
use aya_ebpf::helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns};
use kdrop_common::{EventHeader, PacketEvent, EGRESS_COUNTERS_KEY, EVENT_EGRESS, TCP_RST, TCP_SYN};

use crate::{
    config::{filter, offsets, COUNTERS, EVENTS},
    ct,
    drop::{flags_match, matches_packet, wakeup_flags},
    monitor,
    skb::{self, Load},
};

#[inline(always)]
pub fn on_net_dev_queue<L: Load>(skb: u64) -> i32 {
    let _ = try_net_dev_queue::<L>(skb);
    0
}

#[inline(always)]
fn try_net_dev_queue<L: Load>(skb: u64) -> Option<()> {
    let o = offsets();
    let tcp = skb::parse_tcp::<L>(skb, o)?;
    // The handshake and its refusal, whatever --all-flags says for drops.
    if !flags_match(TCP_SYN | TCP_RST, tcp.tcp_flags) {
        return None;
    }
    let f = filter();
    if !matches_packet::<L>(f, &tcp, skb, o) {
        return None;
    }
    let dev: u64 = L::load(skb, o.skb_dev)?;
    let net: u64 = L::load(dev, o.dev_net).unwrap_or(0);
    let netns: u32 = L::load(net, o.net_inum).unwrap_or(0);
    if f.netns != 0 && f.netns != netns {
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
    let Some(mut entry) = EVENTS.reserve::<PacketEvent>(0) else {
        counters.lost += 1;
        return None;
    };
    // SAFETY: the reservation is sizeof(PacketEvent) bytes, written before submit.
    let e = unsafe { &mut *entry.as_mut_ptr() };
    e.header = EventHeader {
        kind: EVENT_EGRESS,
        // SAFETY: plain helper calls.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: unsafe { bpf_ktime_get_ns() },
    };
    e.netns = netns;
    e.ifindex = L::load(dev, o.dev_ifindex).unwrap_or(0);
    e.mark = L::load(skb, o.skb_mark).unwrap_or(0);
    e._pad0 = 0;
    e.saddr = tcp.saddr;
    e.daddr = tcp.daddr;
    e.sport = tcp.sport;
    e.dport = tcp.dport;
    e.family = tcp.family;
    e.tcp_flags = tcp.tcp_flags;
    e._pad = [0; 2];
    ct::read_ct::<L>(skb, o, &mut e.ct);
    entry.submit(wakeup_flags(e.header.ts_ns));
    counters.emitted += 1;
    Some(())
}
