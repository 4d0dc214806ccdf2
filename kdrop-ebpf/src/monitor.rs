//! Monitor mode on the drop path: every matched drop is counted in the
//! bounded `AGGREGATE` map; only a sample of them (`Filter::sample_every`,
//! as in live tracing), under a per-second cap, becomes a detailed event.
//! Both are decided before the ring buffer is touched, so a flood costs a
//! hash update per packet, not an event.
use aya_ebpf::helpers::bpf_ktime_get_ns;
use kdrop_common::{AggKey, LIMITER_DROP, LIMITER_EGRESS};

use crate::config::{monitor, AGGREGATE, LIMITER};

const NS_PER_SEC: u64 = 1_000_000_000;
/// `BPF_NOEXIST`: insert only, another CPU may have just created the key.
const BPF_NOEXIST: u64 = 1;

/// Counts one drop under its key, or under `AggKey::OVERFLOW` when the map
/// is full.
// A BPF subprogram: its own stack frame keeps the caller under 512 bytes.
#[inline(never)]
pub fn aggregate(reason: u32, netns: u32, ifindex: u32, port: u16) {
    if monitor().aggregate == 0 {
        return;
    }
    let key = AggKey {
        reason,
        netns,
        ifindex,
        port,
        overflow: 0,
    };
    if add_one(&key) {
        return;
    }
    // Per-CPU values: the insert sets this CPU's slot and zeroes the others.
    if AGGREGATE.insert(key, 1, BPF_NOEXIST).is_ok() || add_one(&key) {
        return;
    }
    add_one(&AggKey::OVERFLOW);
}

#[inline(always)]
fn add_one(key: &AggKey) -> bool {
    match AGGREGATE.get_ptr_mut(key) {
        Some(v) => {
            // SAFETY: this CPU's slot; no other program run writes it meanwhile.
            unsafe { *v = (*v).wrapping_add(1) };
            true
        }
        None => false,
    }
}

/// May this sampled, matched drop become a detailed event? Takes a token
/// from the per-CPU bucket; the caller counts a refusal as `capped`.
#[inline(never)]
pub fn admit() -> bool {
    admit_in(LIMITER_DROP)
}

/// The same cap (its own bucket) for handshake packets leaving devices.
#[inline(never)]
pub fn admit_egress() -> bool {
    admit_in(LIMITER_EGRESS)
}

#[inline(always)]
fn admit_in(slot: u32) -> bool {
    let m = monitor();
    if m.events_per_sec == 0 {
        return true;
    }
    let Some(st) = LIMITER.get_ptr_mut(slot) else {
        return true;
    };
    // SAFETY: per-CPU slot, used by one program run at a time.
    let st = unsafe { &mut *st };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // checked_*: no panic path for the verifier to trip on.
    let cost = NS_PER_SEC
        .checked_div(u64::from(m.events_per_sec))
        .unwrap_or(0);
    let mut credit = st.credit_ns.saturating_add(now.saturating_sub(st.last_ns));
    if credit > NS_PER_SEC {
        credit = NS_PER_SEC;
    }
    st.last_ns = now;
    if credit < cost {
        st.credit_ns = credit;
        return false;
    }
    st.credit_ns = credit - cost;
    true
}
