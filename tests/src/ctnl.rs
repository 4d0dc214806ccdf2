//! Deleting one conntrack entry the moment it is created, over ctnetlink
//! from the test process: `conntrack -D` in a loop is an exec per try, and
//! under TCG with a dozen tests at once one try outlasted kdrop's 1.5 s
//! overdue check. Messages as in include/uapi/linux/netfilter/nfnetlink.h
//! and nfnetlink_conntrack.h (stable since 2.6.14).
use std::{
    net::SocketAddrV4,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use kdrop::context::netns::in_netns;

use crate::{bound, Ns};

const NETLINK_NETFILTER: i32 = 12;
/// NF_NETLINK_CONNTRACK_NEW: the group of confirmed new entries.
const GROUP_NEW: u32 = 1;
const SUBSYS_CTNETLINK: u16 = 1;
const MSG_DELETE: u16 = (SUBSYS_CTNETLINK << 8) | 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLA_F_NESTED: u16 = 1 << 15;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// Ctnetlink sockets in one namespace: one told of every new entry, one to
/// delete with.
pub struct CtDeleter {
    events: OwnedFd,
    requests: OwnedFd,
}

fn socket(groups: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket calls on an fd owned right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = groups;
    let len = size_of::<libc::sockaddr_nl>() as u32;
    if unsafe { libc::bind(fd, (&raw const sa).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(owned)
}

fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    out.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// IPCTNL_MSG_CT_DELETE of the TCP entry whose original tuple is
/// `src -> dst`.
fn delete_request(src: SocketAddrV4, dst: SocketAddrV4) -> Vec<u8> {
    let mut ip = Vec::new();
    attr(&mut ip, CTA_IP_V4_SRC, &src.ip().octets());
    attr(&mut ip, CTA_IP_V4_DST, &dst.ip().octets());
    let mut proto = Vec::new();
    attr(&mut proto, CTA_PROTO_NUM, &[libc::IPPROTO_TCP as u8]);
    attr(&mut proto, CTA_PROTO_SRC_PORT, &src.port().to_be_bytes());
    attr(&mut proto, CTA_PROTO_DST_PORT, &dst.port().to_be_bytes());
    let mut tuple = Vec::new();
    attr(&mut tuple, CTA_TUPLE_IP | NLA_F_NESTED, &ip);
    attr(&mut tuple, CTA_TUPLE_PROTO | NLA_F_NESTED, &proto);
    // nfgenmsg: AF_INET, NFNETLINK_V0, res_id 0.
    let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
    attr(&mut body, CTA_TUPLE_ORIG | NLA_F_NESTED, &tuple);
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&MSG_DELETE.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel's
    msg.extend_from_slice(&body);
    msg
}

/// Waits up to `timeout` for `fd` to be readable.
fn readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one pollfd, ours.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: recv into our buffer, at most its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

impl CtDeleter {
    /// Listening in `ns` from now on: open it before sending what creates
    /// the entry.
    pub fn new(ns: &Ns) -> Self {
        let (events, requests) = in_netns(&ns.path(), || -> std::io::Result<_> {
            Ok((socket(GROUP_NEW)?, socket(0)?))
        })
        .expect("entering the namespace")
        .expect("ctnetlink sockets");
        Self { events, requests }
    }

    /// Deletes the TCP entry `src -> dst` (its original tuple) as soon as
    /// it exists: at each new entry the namespace announces, until the
    /// delete finds it. Panics after `timeout` (scaled).
    pub fn delete_when_created(&self, src: SocketAddrV4, dst: SocketAddrV4, timeout: Duration) {
        let deadline = Instant::now() + bound(timeout);
        let request = delete_request(src, dst);
        let mut buf = vec![0u8; 65536];
        loop {
            // The entry may be confirmed before this socket heard of it
            // (or the group overran): try once per wake-up either way.
            // SAFETY: send of our own buffer on our socket.
            let sent = unsafe {
                libc::send(
                    self.requests.as_raw_fd(),
                    request.as_ptr().cast(),
                    request.len(),
                    0,
                )
            };
            assert_eq!(sent, request.len() as isize, "ctnetlink delete: send");
            let n = recv(&self.requests, &mut buf).expect("ctnetlink delete: ack");
            // NLMSG_ERROR: errno (0 is the ack of a delete that found it).
            let kind = (n >= 20).then(|| u16::from_ne_bytes([buf[4], buf[5]]));
            assert_eq!(
                kind,
                Some(libc::NLMSG_ERROR as u16),
                "ctnetlink delete: ack"
            );
            let err = i32::from_ne_bytes(buf[16..20].try_into().unwrap());
            match -err {
                0 => return,
                libc::ENOENT => {}
                e => panic!(
                    "ctnetlink delete of {src} -> {dst}: {}",
                    std::io::Error::from_raw_os_error(e)
                ),
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no conntrack entry {src} -> {dst} within {timeout:?}"));
            if readable(&self.events, left) {
                // Only a wake-up: which entry is new does not matter (the
                // delete says whether it was ours), nor ENOBUFS (lost events).
                let _ = recv(&self.events, &mut buf);
            }
        }
    }
}
