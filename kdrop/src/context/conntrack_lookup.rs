//! One conntrack entry by tuple, asked of a namespace's table through
//! ctnetlink: an IPCTNL_MSG_CT_GET request, one answer (the entry, or an
//! error), no dump and no `conntrack` binary.
//!
//! ctnetlink_get_conntrack
//! (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_netlink.c)
//! parses CTA_TUPLE_ORIG, else CTA_TUPLE_REPLY (nested CTA_TUPLE_IP and
//! CTA_TUPLE_PROTO, the family from nfgenmsg), looks it up with
//! nf_conntrack_find_get in the zone of CTA_ZONE (the default zone
//! without it), and answers with ctnetlink_fill_info (an
//! IPCTNL_MSG_CT_NEW message: both tuples, status, timeout, TCP state,
//! mark, zone) or -ENOENT. The hash holds both directions of every entry,
//! so the kernel finds the tuple on either side; one entry at most holds a
//! tuple in a zone. The answer is kept only when the tuple is on the side
//! asked for.
use std::{
    net::SocketAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{bail, Context as _, Result};

use super::{
    ctevents::parse::{
        ct_type, entry, messages, ATTRS_AT, CTA_IP_V4_DST, CTA_IP_V4_SRC, CTA_IP_V6_DST,
        CTA_IP_V6_SRC, CTA_PROTO_DST_PORT, CTA_PROTO_NUM, CTA_PROTO_SRC_PORT, CTA_TUPLE_IP,
        CTA_TUPLE_ORIG, CTA_TUPLE_PROTO, CTA_TUPLE_REPLY, CTA_ZONE, IPCTNL_MSG_CT_GET,
        IPCTNL_MSG_CT_NEW, IPPROTO_TCP, NLA_F_NESTED, NLM_F_REQUEST,
    },
    netns::{in_netns, Netns},
};
use crate::model::packet::{CtSeen, Tuple};

/// Which tuple of the entry the one asked for is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Side {
    /// As the first packet went (client to service).
    Orig,
    /// As the answer comes (backend to client, after NAT).
    Reply,
}

/// The TCP entry of `ns`'s conntrack table, in `zone` (0: the default),
/// whose `side` tuple is `tuple`; `Ok(None)` when there is none.
pub fn lookup(ns: &Netns, side: Side, tuple: &Tuple, zone: u16) -> Result<Option<CtSeen>> {
    let req = request(side, tuple, zone, SEQ)?;
    let answer = in_netns(&ns.path, move || round_trip(&req))?
        .with_context(|| format!("conntrack lookup of {} -> {}", tuple.src, tuple.dst))?;
    let found = match answer {
        Answer::Entry(attrs) => entry(&attrs, ns.inode),
        Answer::NotFound => None,
    };
    Ok(found.filter(|e| match side {
        Side::Orig => e.ct.orig == *tuple,
        Side::Reply => e.ct.reply == *tuple,
    }))
}

/// The TCP entries of `ns`'s table whose original source is `client` (its
/// address and port), at most `MAX_FROM`: a dump the kernel filters
/// (CTA_FILTER with CTA_FILTER_ORIG_FLAGS, v5.9+: ctnetlink_alloc_filter and
/// ctnetlink_filter_match_tuple,
/// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_netlink.c),
/// so only the client's entries cross to userspace, whatever the table's
/// size. For what a node forwarded from one client end to wherever it went.
pub fn from_client(ns: &Netns, client: SocketAddr) -> Result<Vec<CtSeen>> {
    let req = dump_request(client, SEQ);
    let inode = ns.inode;
    let attrs = in_netns(&ns.path, move || dump(&req))?
        .with_context(|| format!("conntrack entries from {client}"))?;
    Ok(attrs
        .iter()
        .filter_map(|a| entry(a, inode))
        .filter(|e| e.ct.orig.src == client)
        .take(MAX_FROM)
        .collect())
}

/// Entries from one client end kept at most (one port rarely has more than
/// a few).
const MAX_FROM: usize = 16;

/// CTA_FILTER's nested attributes and flags (uapi
/// linux/netfilter/nfnetlink_conntrack.h, v5.9+).
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_FLAG_CTA_IP_SRC: u32 = 1 << 0;
const CTA_FILTER_FLAG_CTA_PROTO_NUM: u32 = 1 << 3;
const CTA_FILTER_FLAG_CTA_PROTO_SRC_PORT: u32 = 1 << 4;
/// NLM_F_ROOT | NLM_F_MATCH.
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_DONE: u16 = 3;

/// The dump request: the original tuple's source address, protocol and
/// source port, and the flags that make the kernel compare only those.
fn dump_request(client: SocketAddr, seq: u32) -> Vec<u8> {
    let (family, src, key) = match client.ip() {
        std::net::IpAddr::V4(a) => (libc::AF_INET, a.octets().to_vec(), CTA_IP_V4_SRC),
        std::net::IpAddr::V6(a) => (libc::AF_INET6, a.octets().to_vec(), CTA_IP_V6_SRC),
    };
    let mut m = vec![0u8; ATTRS_AT];
    m[4..6].copy_from_slice(&ct_type(IPCTNL_MSG_CT_GET).to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m[16] = family as u8;
    nest(&mut m, CTA_TUPLE_ORIG, |m| {
        nest(m, CTA_TUPLE_IP, |m| nla(m, key, &src));
        nest(m, CTA_TUPLE_PROTO, |m| {
            nla(m, CTA_PROTO_NUM, &[IPPROTO_TCP]);
            nla(m, CTA_PROTO_SRC_PORT, &client.port().to_be_bytes());
        });
    });
    // The kernel's IPv6 address test is inverted (`!ipv6_addr_cmp(...)`
    // rejects an equal address in ctnetlink_filter_match_tuple, v5.9 to
    // v6.18 at least): for IPv6 it filters by port, the address is
    // compared here (`from_client`).
    let by_address = if client.is_ipv4() {
        CTA_FILTER_FLAG_CTA_IP_SRC
    } else {
        0
    };
    let flags = by_address | CTA_FILTER_FLAG_CTA_PROTO_NUM | CTA_FILTER_FLAG_CTA_PROTO_SRC_PORT;
    // A host-order u32 (nla_get_u32).
    nest(&mut m, CTA_FILTER, |m| {
        nla(m, CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes())
    });
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
    m
}

/// The sequence number of the request: the socket is new, and carries
/// nothing else.
const SEQ: u32 = 1;

fn nla(out: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    out.extend(((4 + payload.len()) as u16).to_ne_bytes());
    out.extend(ty.to_ne_bytes());
    out.extend(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

fn nest(out: &mut Vec<u8>, ty: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend([0u8; 4]);
    inner(out);
    let len = (out.len() - at) as u16;
    out[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    out[at + 2..at + 4].copy_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
}

/// The GET request: nlmsghdr, nfgenmsg (family, NFNETLINK_V0, res_id 0),
/// the tuple, and the zone when it is not the default one.
fn request(side: Side, t: &Tuple, zone: u16, seq: u32) -> Result<Vec<u8>> {
    let (family, src, dst, (ks, kd)) = match (t.src.ip(), t.dst.ip()) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => (
            libc::AF_INET,
            s.octets().to_vec(),
            d.octets().to_vec(),
            (CTA_IP_V4_SRC, CTA_IP_V4_DST),
        ),
        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => (
            libc::AF_INET6,
            s.octets().to_vec(),
            d.octets().to_vec(),
            (CTA_IP_V6_SRC, CTA_IP_V6_DST),
        ),
        _ => bail!("tuple {} -> {} mixes address families", t.src, t.dst),
    };
    let mut m = vec![0u8; ATTRS_AT];
    m[4..6].copy_from_slice(&ct_type(IPCTNL_MSG_CT_GET).to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m[16] = family as u8;
    let which = match side {
        Side::Orig => CTA_TUPLE_ORIG,
        Side::Reply => CTA_TUPLE_REPLY,
    };
    nest(&mut m, which, |m| {
        nest(m, CTA_TUPLE_IP, |m| {
            nla(m, ks, &src);
            nla(m, kd, &dst);
        });
        nest(m, CTA_TUPLE_PROTO, |m| {
            nla(m, CTA_PROTO_NUM, &[IPPROTO_TCP]);
            nla(m, CTA_PROTO_SRC_PORT, &t.src.port().to_be_bytes());
            nla(m, CTA_PROTO_DST_PORT, &t.dst.port().to_be_bytes());
        });
    });
    if zone != 0 {
        nla(&mut m, CTA_ZONE, &zone.to_be_bytes());
    }
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
    Ok(m)
}

enum Answer {
    /// The entry's attributes.
    Entry(Vec<u8>),
    NotFound,
}

/// Sends `req` to ctnetlink from the calling thread's namespace and reads
/// its answer. Without NLM_F_ACK the kernel sends the entry alone, or an
/// NLMSG_ERROR.
fn round_trip(req: &[u8]) -> Result<Answer> {
    let fd = sent(req)?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = received(&fd, &mut buf)?;
        for m in messages(&buf[..n]).filter(|m| m.seq == SEQ) {
            match m.error() {
                Some(e) if e == -libc::ENOENT => return Ok(Answer::NotFound),
                Some(0) => continue,
                Some(e) => {
                    return Err(std::io::Error::from_raw_os_error(-e)).context(
                        "ctnetlink refused the lookup (is nf_conntrack_netlink available?)",
                    )
                }
                None if m.ty == ct_type(IPCTNL_MSG_CT_NEW) => {
                    return Ok(Answer::Entry(m.attrs().unwrap_or_default().to_vec()))
                }
                None => {}
            }
        }
    }
}

/// Sends the dump request `req`; the attributes of every entry it lists,
/// until NLMSG_DONE.
fn dump(req: &[u8]) -> Result<Vec<Vec<u8>>> {
    let fd = sent(req)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let n = received(&fd, &mut buf)?;
        for m in messages(&buf[..n]).filter(|m| m.seq == SEQ) {
            match m.error() {
                Some(0) => {}
                Some(e) => {
                    return Err(std::io::Error::from_raw_os_error(-e))
                        .context("ctnetlink refused the filtered dump (CTA_FILTER needs 5.9+)")
                }
                None if m.ty == NLMSG_DONE => return Ok(out),
                None if m.ty == ct_type(IPCTNL_MSG_CT_NEW) => {
                    out.push(m.attrs().unwrap_or_default().to_vec());
                }
                None => {}
            }
        }
    }
}

/// Reads one datagram into `buf`; its length.
fn received(fd: &OwnedFd, buf: &mut [u8]) -> Result<usize> {
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("reading the ctnetlink answer");
        }
    }
}

/// A new ctnetlink socket with `req` sent on it.
fn sent(req: &[u8]) -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("netlink socket");
    }
    // SAFETY: fd was just returned by socket(2).
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The kernel answers at once; the bound only guards against a hang.
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: a timeval option on our own socket.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    // Unbound and unconnected: netlink sends to the kernel (port id 0).
    // SAFETY: req is valid for its length.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if n != req.len() as isize {
        return Err(std::io::Error::last_os_error()).context("sending the ctnetlink request");
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ctevents::tests::{nla as attr, tuple_attr};

    #[test]
    fn the_request_is_a_get_with_the_tuple_nested_as_ctnetlink_parses_it() {
        let t = Tuple {
            src: "10.0.0.13:8005".parse().unwrap(),
            dst: "172.16.0.50:45008".parse().unwrap(),
        };
        let m = request(Side::Reply, &t, 0, 7).unwrap();
        // Built independently by the tests' message builder.
        let mut want = Vec::new();
        want.extend(0u32.to_ne_bytes());
        want.extend(((1u16 << 8) | 1).to_ne_bytes());
        want.extend(1u16.to_ne_bytes());
        want.extend(7u32.to_ne_bytes());
        want.extend(0u32.to_ne_bytes());
        want.extend([libc::AF_INET as u8, 0, 0, 0]);
        want.extend(tuple_attr(2, t.src, t.dst, 6));
        let len = want.len() as u32;
        want[..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(m, want);
        // Zone 3, IPv6, the original side.
        let t6 = Tuple {
            src: "[fd00:1::1]:40000".parse().unwrap(),
            dst: "[fd00:1::100]:80".parse().unwrap(),
        };
        let m = request(Side::Orig, &t6, 3, 1).unwrap();
        assert_eq!(m[16], libc::AF_INET6 as u8);
        let mut tail = tuple_attr(1, t6.src, t6.dst, 6);
        tail.extend(attr(18, &3u16.to_be_bytes()));
        assert!(m.ends_with(&tail));
        assert_eq!(
            u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize,
            m.len()
        );
        let mixed = Tuple {
            src: t.src,
            dst: t6.dst,
        };
        assert!(request(Side::Orig, &mixed, 0, 1).is_err());
    }
}
