//! Conntrack entries that die without ever seeing a reply, from ctnetlink
//! destroy events (NFNLGRP_CONNTRACK_DESTROY) read in the traced
//! namespaces.
//!
//! # Filtering in the kernel
//! Each socket carries a classic BPF filter (SO_ATTACH_FILTER) that runs
//! on every destroy message before it is queued: it finds attributes with
//! the SKF_AD_NLATTR / SKF_AD_NLATTR_NEST ancillary loads
//! (bpf_skb_get_nlattr{,_nest},
//! https://github.com/torvalds/linux/blob/v6.18/net/core/filter.c) and
//! passes only TCP entries whose CTA_STATUS lacks IPS_SEEN_REPLY and, with
//! `--port`, one of whose four ports (original and reply, source and
//! destination: the service and the backend port) is asked for.
//! What it cannot filter: `--host` (kdrop leaves the CIDR test to
//! userspace rather than unroll address masks for both families),
//! `--iface` (a conntrack entry has no interface), and whether kdrop
//! followed the handshake (userspace state): those happen in userspace.
//!
//! # nf_conntrack_events
//! Destroy events exist only for entries that carry the event cache
//! extension. With `net.netfilter.nf_conntrack_events=2` (the default since
//! 6.0) the kernel adds it to new entries once someone listens
//! (nf_ct_ecache_ext_add,
//! https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_ecache.c):
//! entries created before kdrop subscribed die silently. With 0, none are
//! reported. kdrop reads the sysctl in each namespace and says so; it
//! never changes it.
use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    task::Poll,
};

use anyhow::{Context as _, Result};
use tokio::io::unix::AsyncFd;

pub mod cbpf;
pub mod parse;

use self::{
    cbpf::{attach, filter_program},
    parse::{parse, NFNLGRP_CONNTRACK_DESTROY, RCVBUF},
};
use super::netns::{in_netns, Netns};
use crate::model::packet::Destroyed;

fn socket_here(prog: &[libc::sock_filter]) -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("netlink socket");
    }
    // SAFETY: fd was just returned by socket(2).
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let set = |level, opt, v: libc::c_int| {
        // SAFETY: an int option on our own socket.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                opt,
                (&raw const v).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    // Best effort: the default buffer holds fewer messages.
    set(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF);
    // The filter first, so that nothing unfiltered is ever queued.
    attach(&fd, prog).context("SO_ATTACH_FILTER")?;
    // Bound, so that the kernel assigns a port id: broadcasts skip sockets
    // whose port id equals the sender's, and the kernel's is 0
    // (do_one_broadcast,
    // https://github.com/torvalds/linux/blob/v6.18/net/netlink/af_netlink.c).
    // SAFETY: a zeroed sockaddr_nl is valid (nl_pid 0: the kernel picks).
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: sa is a valid sockaddr_nl for the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sa).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("binding the netlink socket");
    }
    if set(
        libc::SOL_NETLINK,
        libc::NETLINK_ADD_MEMBERSHIP,
        NFNLGRP_CONNTRACK_DESTROY as libc::c_int,
    ) != 0
    {
        return Err(std::io::Error::last_os_error())
            .context("joining NFNLGRP_CONNTRACK_DESTROY (is nf_conntrack_netlink available?)");
    }
    Ok(fd)
}

struct Listener {
    fd: AsyncFd<OwnedFd>,
    netns: u32,
}

/// Destroy-event sockets in the followed namespaces.
#[derive(Default)]
pub struct CtEvents {
    listeners: Vec<Listener>,
    /// Messages that passed the kernel filter and were read.
    pub received: u64,
    /// Times the socket buffer overflowed (ENOBUFS): events were lost.
    pub overruns: u64,
    /// What could not be followed, and why (for `kdrop: without ...`).
    pub notes: Vec<String>,
}

/// Namespaces followed at most (one socket each).
pub const MAX_NAMESPACES: usize = 64;

impl CtEvents {
    /// Listens in each of `namespaces` (up to MAX_NAMESPACES). Problems in
    /// a namespace the user named are told one by one; in namespaces found
    /// by a scan (they come and go) they are counted in one line.
    pub fn open(namespaces: &[Netns], ports: &[u16], seen_reply: u32, named: bool) -> Self {
        let prog = filter_program(ports, seen_reply);
        let mut me = CtEvents::default();
        let (mut off, mut failed) = (Vec::new(), 0usize);
        for ns in namespaces.iter().take(MAX_NAMESPACES) {
            let p = prog.clone();
            let name = ns.name.clone().unwrap_or_else(|| ns.inode.to_string());
            let opened = in_netns(&ns.path, move || {
                let events = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_events")
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                (socket_here(&p), events)
            });
            let problem = match opened {
                Ok((Ok(fd), events)) => {
                    if events == Some(0) {
                        off.push(name.clone());
                    }
                    // SAFETY: the AsyncFd owns the fd and lives in the
                    // Listener, so the fd stays open while registered.
                    match unsafe { AsyncFd::register(fd) } {
                        Ok(fd) => {
                            me.listeners.push(Listener {
                                fd,
                                netns: ns.inode,
                            });
                            None
                        }
                        Err(e) => Some(e.to_string()),
                    }
                }
                Ok((Err(e), _)) | Err(e) => Some(format!("{e:#}")),
            };
            if let Some(e) = problem {
                log::debug!("conntrack destroy events in netns {name}: {e}");
                failed += 1;
                if named {
                    me.notes
                        .push(format!("conntrack destroy events in netns {name}: {e}"));
                }
            }
        }
        if !off.is_empty() {
            me.notes.push(format!(
                "conntrack destroy events in netns {}: net.netfilter.nf_conntrack_events=0 there (kdrop does not change it; 2, the default, reports entries created while kdrop listens)",
                off.join(", ")
            ));
        }
        if failed > 0 && !named {
            me.notes.push(format!(
                "conntrack destroy events in {failed} namespaces that could not be joined (gone, or no nf_conntrack_netlink)"
            ));
        }
        if namespaces.len() > MAX_NAMESPACES {
            me.notes.push(format!(
                "conntrack destroy events in {} more namespaces (kdrop follows at most {MAX_NAMESPACES}; use --netns)",
                namespaces.len() - MAX_NAMESPACES
            ));
        }
        me
    }

    pub fn len(&self) -> usize {
        self.listeners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.listeners.is_empty()
    }

    /// Waits until a socket is readable, then reads all of them.
    pub async fn next(&mut self) -> Vec<Destroyed> {
        loop {
            std::future::poll_fn(|cx| {
                let mut any = false;
                for l in &self.listeners {
                    if let Poll::Ready(Ok(mut g)) = l.fd.poll_read_ready(cx) {
                        g.clear_ready();
                        any = true;
                    }
                }
                if any {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            let out = self.read_all();
            if !out.is_empty() {
                return out;
            }
        }
    }

    /// Whatever is queued now, without waiting.
    pub fn read_all(&mut self) -> Vec<Destroyed> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        for l in &self.listeners {
            loop {
                // SAFETY: buf is valid for its length.
                let n = unsafe {
                    libc::recv(
                        l.fd.get_ref().as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                    )
                };
                if n < 0 {
                    match std::io::Error::last_os_error().raw_os_error() {
                        Some(libc::ENOBUFS) => {
                            self.overruns += 1;
                            continue;
                        }
                        Some(libc::EINTR) => continue,
                        _ => break,
                    }
                }
                if n == 0 {
                    break;
                }
                let got = parse(&buf[..n as usize], l.netns);
                log::debug!(
                    "conntrack destroy message of {n} bytes in netns {}: {got:?}",
                    l.netns
                );
                self.received += got.len() as u64;
                out.extend(got);
            }
        }
        out
    }
}

/// For tests: sends `msgs` through a socketpair whose reader carries
/// `prog`, returning the ones the kernel let through.
#[cfg(test)]
fn through_filter(prog: &[libc::sock_filter], msgs: &[Vec<u8>]) -> Result<Vec<usize>> {
    let mut sv = [0; 2];
    // SAFETY: sv receives two fds.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, sv.as_mut_ptr()) } != 0 {
        return Err(anyhow::anyhow!(
            "socketpair: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: both fds are ours.
    let (tx, rx) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    attach(&rx, prog)?;
    for (i, m) in msgs.iter().enumerate() {
        // The index rides in the sequence number.
        let mut m = m.clone();
        m[8..12].copy_from_slice(&(i as u32).to_ne_bytes());
        // SAFETY: m is valid for its length.
        unsafe { libc::send(tx.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe {
            libc::recv(
                rx.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            break;
        }
        got.push(u32::from_ne_bytes(buf[8..12].try_into().unwrap()) as usize);
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::parse::*;
    use super::*;

    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(((4 + payload.len()) as u16).to_ne_bytes());
        v.extend(ty.to_ne_bytes());
        v.extend(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(ty | 0x8000, &parts.concat())
    }

    fn tuple_attr(
        ty: u16,
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        proto: u8,
    ) -> Vec<u8> {
        nested(
            ty,
            &[
                nested(
                    CTA_TUPLE_IP,
                    &[nla(CTA_IP_V4_SRC, &src), nla(CTA_IP_V4_DST, &dst)],
                ),
                nested(
                    CTA_TUPLE_PROTO,
                    &[
                        nla(CTA_PROTO_NUM, &[proto]),
                        nla(CTA_PROTO_SRC_PORT, &sport.to_be_bytes()),
                        nla(CTA_PROTO_DST_PORT, &dport.to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    /// A destroy message as ctnetlink_conntrack_event builds one: client
    /// 172.16.0.50:45008 -> VIP 10.0.58.158:8005, DNAT'd to 10.0.0.13:8005.
    fn destroy(status: u32, proto: u8, msg_type: u16) -> Vec<u8> {
        let attrs = [
            tuple_attr(
                CTA_TUPLE_ORIG,
                [172, 16, 0, 50],
                45008,
                [10, 0, 58, 158],
                8005,
                proto,
            ),
            tuple_attr(
                CTA_TUPLE_REPLY,
                [10, 0, 0, 13],
                8005,
                [172, 16, 0, 50],
                45008,
                proto,
            ),
            nla(CTA_ZONE, &0u16.to_be_bytes()),
            nla(CTA_STATUS, &status.to_be_bytes()),
            nested(
                CTA_PROTOINFO,
                &[nested(
                    CTA_PROTOINFO_TCP,
                    &[nla(CTA_PROTOINFO_TCP_STATE, &[1])],
                )],
            ),
            nla(CTA_MARK, &7u32.to_be_bytes()),
        ]
        .concat();
        let mut m = Vec::new();
        m.extend(((ATTRS_AT + attrs.len()) as u32).to_ne_bytes());
        m.extend(msg_type.to_ne_bytes());
        m.extend(0u16.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend([libc::AF_INET as u8, 0, 0, 0]);
        m.extend(attrs);
        m
    }

    const DEL: u16 = 0x0102;
    const CONFIRMED_DNAT: u32 = (1 << 3) | (1 << 5);

    #[test]
    fn parses_a_destroy_message() {
        let mut two = destroy(CONFIRMED_DNAT, IPPROTO_TCP, DEL);
        two.extend(destroy(CONFIRMED_DNAT | IPS_SEEN_REPLY, 17, DEL));
        let d = parse(&two, 9);
        assert_eq!(d.len(), 1, "UDP is skipped");
        assert_eq!(d[0].netns, 9);
        assert_eq!(d[0].ct.orig.src.to_string(), "172.16.0.50:45008");
        assert_eq!(d[0].ct.orig.dst.to_string(), "10.0.58.158:8005");
        assert_eq!(d[0].ct.reply.src.to_string(), "10.0.0.13:8005");
        assert_eq!(d[0].ct.status, CONFIRMED_DNAT);
        assert_eq!(d[0].ct.mark, 7);
        assert_eq!(d[0].tcp_state, Some(1));
        assert_eq!(tcp_state_name(1), "SYN_SENT");
        // Not a DELETE, or cut short: nothing, and no panic.
        assert!(parse(&destroy(CONFIRMED_DNAT, IPPROTO_TCP, 0x0100), 9).is_empty());
        let m = destroy(CONFIRMED_DNAT, IPPROTO_TCP, DEL);
        for cut in 0..m.len() {
            let _ = parse(&m[..cut], 9);
        }
    }

    /// The filter runs in this kernel: the messages are sent through a
    /// socketpair whose receiving end carries it.
    #[test]
    fn the_kernel_filter_passes_only_unreplied_tcp_on_the_ports_asked_for() {
        let msgs = [
            destroy(CONFIRMED_DNAT, IPPROTO_TCP, DEL), // 0: passes
            destroy(CONFIRMED_DNAT | IPS_SEEN_REPLY, IPPROTO_TCP, DEL), // 1: answered
            destroy(CONFIRMED_DNAT, 17, DEL),          // 2: UDP
            destroy(CONFIRMED_DNAT, IPPROTO_TCP, 0x0100), // 3: a NEW event
        ];
        let any = filter_program(&[], IPS_SEEN_REPLY);
        assert_eq!(through_filter(&any, &msgs).unwrap(), [0]);
        // The service port, the backend port (reply source), the client port.
        for port in [8005, 45008] {
            let f = filter_program(&[1, port, 2], IPS_SEEN_REPLY);
            assert_eq!(through_filter(&f, &msgs).unwrap(), [0], "port {port}");
        }
        let other = filter_program(&[80, 443], IPS_SEEN_REPLY);
        assert!(through_filter(&other, &msgs).unwrap().is_empty());
        // Sixteen ports: far jumps still resolve.
        let many: Vec<u16> = (1..=15).chain([8005]).collect();
        let f = filter_program(&many, IPS_SEEN_REPLY);
        assert!(f.len() > 64);
        assert_eq!(through_filter(&f, &msgs).unwrap(), [0]);
    }
}
