//! ctnetlink messages (events and lookup replies) into owned values.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::model::packet::{Ct, CtEvent, CtSeen, Destroyed, Tuple};

// uapi: linux/netlink.h, linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h,
// nf_conntrack_common.h (ABI, stable across kernels).
pub const NLMSG_ERROR: u16 = 2;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLA_F_NESTED: u16 = 0x8000;
pub const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub const IPCTNL_MSG_CT_NEW: u16 = 0;
pub const IPCTNL_MSG_CT_GET: u16 = 1;
pub const IPCTNL_MSG_CT_DELETE: u16 = 2;
pub const NFNLGRP_CONNTRACK_NEW: u32 = 1;
pub const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;
pub const CTA_TUPLE_ORIG: u16 = 1;
pub const CTA_TUPLE_REPLY: u16 = 2;
pub const CTA_STATUS: u16 = 3;
pub const CTA_PROTOINFO: u16 = 4;
pub const CTA_TIMEOUT: u16 = 7;
pub const CTA_MARK: u16 = 8;
pub const CTA_ZONE: u16 = 18;
pub const CTA_TUPLE_IP: u16 = 1;
pub const CTA_TUPLE_PROTO: u16 = 2;
pub const CTA_IP_V4_SRC: u16 = 1;
pub const CTA_IP_V4_DST: u16 = 2;
pub const CTA_IP_V6_SRC: u16 = 3;
pub const CTA_IP_V6_DST: u16 = 4;
pub const CTA_PROTO_NUM: u16 = 1;
pub const CTA_PROTO_SRC_PORT: u16 = 2;
pub const CTA_PROTO_DST_PORT: u16 = 3;
pub const CTA_PROTOINFO_TCP: u16 = 1;
pub const CTA_PROTOINFO_TCP_STATE: u16 = 1;
/// `enum ip_conntrack_status` bits, for a kernel whose BTF does not name
/// them.
pub const IPS_SEEN_REPLY: u32 = 1 << 1;
pub const IPS_SRC_NAT: u32 = 1 << 4;
pub const IPS_DST_NAT: u32 = 1 << 5;
pub const NLMSG_HDRLEN: usize = 16;
/// nlmsghdr + nfgenmsg: where a ctnetlink message's attributes start.
pub const ATTRS_AT: usize = NLMSG_HDRLEN + 4;
pub const NLA_TYPE_MASK: u16 = 0x3fff;
pub const IPPROTO_TCP: u8 = 6;

/// `(NFNL_SUBSYS_CTNETLINK << 8) | msg`: a ctnetlink nlmsg_type.
pub const fn ct_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | msg
}

/// `enum tcp_conntrack` names, for the evidence.
pub fn tcp_state_name(s: u8) -> &'static str {
    match s {
        0 => "NONE",
        1 => "SYN_SENT",
        2 => "SYN_RECV",
        3 => "ESTABLISHED",
        4 => "FIN_WAIT",
        5 => "CLOSE_WAIT",
        6 => "LAST_ACK",
        7 => "TIME_WAIT",
        8 => "CLOSE",
        9 => "SYN_SENT2",
        _ => "?",
    }
}

/// One netlink message of a datagram.
#[derive(Clone, Copy, Debug)]
pub struct Msg<'a> {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    /// What follows the 16-byte nlmsghdr.
    pub body: &'a [u8],
}

impl Msg<'_> {
    /// The ctnetlink attributes (after the nfgenmsg), if the body has them.
    pub fn attrs(&self) -> Option<&[u8]> {
        self.body.get(ATTRS_AT - NLMSG_HDRLEN..)
    }

    /// For NLMSG_ERROR: the error, 0 or a negative errno.
    pub fn error(&self) -> Option<i32> {
        (self.ty == NLMSG_ERROR)
            .then(|| Some(i32::from_ne_bytes(self.body.get(..4)?.try_into().ok()?)))
            .flatten()
    }
}

/// The messages of a datagram read from a netlink socket; stops at the
/// first malformed header.
pub fn messages(mut buf: &[u8]) -> impl Iterator<Item = Msg<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(buf[..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let m = Msg {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes(buf[8..12].try_into().ok()?),
            body: &buf[NLMSG_HDRLEN..len],
        };
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some(m)
    })
}

/// Attributes of one nesting level: (type, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((ty, payload))
    })
}

fn find(b: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(b).find(|(t, _)| *t == ty).map(|(_, p)| p)
}

fn be16(p: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(p.get(..2)?.try_into().ok()?))
}

fn be32(p: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(..4)?.try_into().ok()?))
}

/// A tuple attribute, if it is TCP.
fn tuple(b: &[u8]) -> Option<Tuple> {
    let ip = find(b, CTA_TUPLE_IP)?;
    let proto = find(b, CTA_TUPLE_PROTO)?;
    if find(proto, CTA_PROTO_NUM)?.first() != Some(&IPPROTO_TCP) {
        return None;
    }
    let v4 = |t| -> Option<IpAddr> {
        let o: [u8; 4] = find(ip, t)?.get(..4)?.try_into().ok()?;
        Some(Ipv4Addr::from(o).into())
    };
    let v6 = |t| -> Option<IpAddr> {
        let o: [u8; 16] = find(ip, t)?.get(..16)?.try_into().ok()?;
        Some(Ipv6Addr::from(o).into())
    };
    let src = v4(CTA_IP_V4_SRC).or_else(|| v6(CTA_IP_V6_SRC))?;
    let dst = v4(CTA_IP_V4_DST).or_else(|| v6(CTA_IP_V6_DST))?;
    Some(Tuple {
        src: SocketAddr::new(src, be16(find(proto, CTA_PROTO_SRC_PORT)?)?),
        dst: SocketAddr::new(dst, be16(find(proto, CTA_PROTO_DST_PORT)?)?),
    })
}

/// A TCP entry from a ctnetlink message's attributes (an event, or the
/// answer to a GET): both tuples, status, mark, zone, TCP state, timeout.
pub fn entry(a: &[u8], netns: u32) -> Option<CtSeen> {
    let orig = find(a, CTA_TUPLE_ORIG).and_then(tuple)?;
    let reply = find(a, CTA_TUPLE_REPLY).and_then(tuple)?;
    let tcp_state = find(a, CTA_PROTOINFO)
        .and_then(|p| find(p, CTA_PROTOINFO_TCP))
        .and_then(|t| find(t, CTA_PROTOINFO_TCP_STATE))
        .and_then(|s| s.first().copied());
    Some(CtSeen {
        netns,
        ct: Ct {
            orig,
            reply,
            status: find(a, CTA_STATUS).and_then(be32).unwrap_or(0),
            mark: find(a, CTA_MARK).and_then(be32).unwrap_or(0),
            zone: find(a, CTA_ZONE).and_then(be16).unwrap_or(0),
            ctinfo: 0,
        },
        tcp_state,
        timeout_s: find(a, CTA_TIMEOUT).and_then(be32),
    })
}

/// The TCP events in a datagram read from an event socket: DELETE messages
/// (NFNLGRP_CONNTRACK_DESTROY) and NEW messages flagged CREATE|EXCL
/// (NFNLGRP_CONNTRACK_NEW; an update is NEW without them). Anything else
/// is skipped.
pub fn parse(buf: &[u8], netns: u32) -> Vec<CtEvent> {
    let created = NLM_F_CREATE | NLM_F_EXCL;
    messages(buf)
        .filter_map(|m| {
            let seen = entry(m.attrs()?, netns)?;
            if m.ty == ct_type(IPCTNL_MSG_CT_DELETE) {
                Some(CtEvent::Destroyed(Destroyed {
                    netns,
                    ct: seen.ct,
                    tcp_state: seen.tcp_state,
                }))
            } else if m.ty == ct_type(IPCTNL_MSG_CT_NEW) && m.flags & created == created {
                Some(CtEvent::New(seen))
            } else {
                None
            }
        })
        .collect()
}
