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

/// Bytes of `struct nf_conntrack_tuple` read at once: its members end at
/// byte 39 (`dst.protonum` at 38 in every layout since 4.x; 6.18:
/// https://github.com/torvalds/linux/blob/v6.18/include/net/netfilter/nf_conntrack_tuple.h).
const TUPLE: u32 = 40;

/// A tuple in one helper call when its members lie in the first `TUPLE`
/// bytes (always so far), one call each otherwise: this runs for every
/// NAT'd drop the filter did not match by its own addresses. The offsets
/// are load-time constants, so the verifier keeps one branch.
#[inline(always)]
fn read_tuple(t: u64, o: &Offsets, out: &mut CtTuple) {
    let fits = |off: u32, size: u32| off.saturating_add(size) <= TUPLE;
    if !(fits(o.tuple_src_addr, 16)
        && fits(o.tuple_dst_addr, 16)
        && fits(o.tuple_src_port, 2)
        && fits(o.tuple_dst_port, 2)
        && fits(o.tuple_protonum, 1))
    {
        out.saddr = read(t, o.tuple_src_addr).unwrap_or([0; 16]);
        out.daddr = read(t, o.tuple_dst_addr).unwrap_or([0; 16]);
        out.sport = u16::from_be(read(t, o.tuple_src_port).unwrap_or(0));
        out.dport = u16::from_be(read(t, o.tuple_dst_port).unwrap_or(0));
        out.protonum = read(t, o.tuple_protonum).unwrap_or(0);
        return;
    }
    let w: [u8; TUPLE as usize] = read(t, 0).unwrap_or([0; TUPLE as usize]);
    // `get`, not indexing: no panic path for the verifier to refuse.
    let at = |off: u32, len: usize| w.get(off as usize..off as usize + len);
    if let Some(a) = at(o.tuple_src_addr, 16) {
        out.saddr.copy_from_slice(a);
    }
    if let Some(a) = at(o.tuple_dst_addr, 16) {
        out.daddr.copy_from_slice(a);
    }
    let port = |off: u32| at(off, 2).map_or(0, |p| u16::from_be_bytes([p[0], p[1]]));
    out.sport = port(o.tuple_src_port);
    out.dport = port(o.tuple_dst_port);
    out.protonum = at(o.tuple_protonum, 1).map_or(0, |p| p[0]);
}
