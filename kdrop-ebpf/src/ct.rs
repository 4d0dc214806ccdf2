//! The conntrack entry a packet carries: `skb->_nfct` is a `struct nf_conn *`
//! with the packet's `enum ip_conntrack_info` in its low 3 bits
//! (NFCT_INFOMASK, include/linux/skbuff.h; as of v6.18:
//! https://github.com/torvalds/linux/blob/v6.18/include/linux/skbuff.h#L5050).
use kdrop_common::{CtInfo, CtTuple, Offsets, ABSENT};

use crate::skb::{read, Load};

const NFCT_INFOMASK: u64 = 7;

// A BPF subprogram: its own stack frame keeps the caller under 512 bytes.
#[inline(never)]
pub fn read_ct<L: Load>(skb: u64, o: &Offsets, out: &mut CtInfo) {
    out.present = 0;
    if o.ct_tuple == ABSENT {
        return;
    }
    // `_nfct` is an integer to the verifier: the entry is read with helpers.
    let nfct: u64 = L::load(skb, o.skb_nfct).unwrap_or(0);
    let ct = nfct & !NFCT_INFOMASK;
    if ct == 0 {
        return;
    }
    out.ctinfo = (nfct & NFCT_INFOMASK) as u8;
    let orig = ct + u64::from(o.ct_tuple);
    read_tuple(orig, o, &mut out.orig);
    read_tuple(orig + u64::from(o.ct_tuplehash_size), o, &mut out.reply);
    // The status word is an unsigned long; its low 32 bits hold every bit.
    out.status = read::<u64>(ct, o.ct_status).unwrap_or(0) as u32;
    out.mark = read(ct, o.ct_mark).unwrap_or(0);
    out.zone = read(ct, o.ct_zone).unwrap_or(0);
    out.present = 1;
}

/// The original-direction tuple of the packet's conntrack entry, if any:
/// what the client sent before NAT.
// A BPF subprogram: its own stack frame keeps the caller under 512 bytes.
#[inline(never)]
pub fn read_orig<L: Load>(skb: u64, o: &Offsets, out: &mut CtTuple) -> bool {
    if o.ct_tuple == ABSENT {
        return false;
    }
    let nfct: u64 = L::load(skb, o.skb_nfct).unwrap_or(0);
    let ct = nfct & !NFCT_INFOMASK;
    if ct == 0 {
        return false;
    }
    read_tuple(ct + u64::from(o.ct_tuple), o, out);
    true
}

#[inline(always)]
fn read_tuple(t: u64, o: &Offsets, out: &mut CtTuple) {
    out.saddr = read(t, o.tuple_src_addr).unwrap_or([0; 16]);
    out.daddr = read(t, o.tuple_dst_addr).unwrap_or([0; 16]);
    out.sport = u16::from_be(read(t, o.tuple_src_port).unwrap_or(0));
    out.dport = u16::from_be(read(t, o.tuple_dst_port).unwrap_or(0));
    out.protonum = read(t, o.tuple_protonum).unwrap_or(0);
}
