//! Conntrack entries as ctnetlink announces them, read in the traced
//! namespaces: NAT'd TCP entries when they are confirmed
//! (NFNLGRP_CONNTRACK_NEW), and entries that die without ever seeing a
//! reply (NFNLGRP_CONNTRACK_DESTROY). One socket per namespace joins both
//! groups.
//!
//! # What the kernel sends
//! ctnetlink_conntrack_event
//! (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_netlink.c)
//! sends IPCTNL_MSG_CT_DELETE to the destroy group, and IPCTNL_MSG_CT_NEW
//! with NLM_F_CREATE|NLM_F_EXCL to the new group (an update is
//! IPCTNL_MSG_CT_NEW without those flags, to another group). A NEW event
//! carries both tuples, CTA_STATUS and CTA_TIMEOUT; the TCP state only when
//! IPCT_PROTOINFO is among the events (it is for a SYN's entry on 6.18;
//! the parser takes it as optional). It is delivered from the cached
//! events when the entry is confirmed (nf_conntrack_confirm calls
//! nf_ct_deliver_cached_events,
//! https://github.com/torvalds/linux/blob/v6.18/include/net/netfilter/nf_conntrack_core.h),
//! at the last hook the first packet passes (POSTROUTING for a forwarded
//! or local SYN, LOCAL_IN for a delivered one), so DNAT (PREROUTING or
//! OUTPUT) and SNAT (POSTROUTING, before confirmation) are already in its
//! status. A SYN dropped before that hook leaves no NEW event.
//!
//! # Filtering in the kernel
//! Each socket carries a classic BPF filter (SO_ATTACH_FILTER) that runs
//! on every message before it is queued: it finds attributes with
//! the SKF_AD_NLATTR / SKF_AD_NLATTR_NEST ancillary loads
//! (bpf_skb_get_nlattr{,_nest},
//! https://github.com/torvalds/linux/blob/v6.18/net/core/filter.c) and
//! passes only TCP entries whose CTA_STATUS lacks IPS_SEEN_REPLY (for NEW
//! messages: and has a NAT bit) and, with `--port`, one of whose four
//! ports (original and reply, source and destination: the service and the
//! backend port) is asked for. The status bits are parameters
//! ([`StatusBits`]: from BTF, the uapi values as fallback).
//! What it cannot filter: `--host` (kdrop leaves the CIDR test to
//! userspace rather than unroll address masks for both families),
//! `--iface` (a conntrack entry has no interface), and whether kdrop
//! followed the handshake (userspace state): those happen in userspace.
//!
//! # Cost
//! With a listener on the new group, the kernel builds a message for every
//! entry confirmed in that namespace and runs the filter on it, whatever
//! the filter decides (without one, ctnetlink_conntrack_event returns at
//! nfnetlink_has_listeners); any listener also gives new entries the event
//! cache extension (below). Both are paid per connection, not per drop: a
//! TCP connection churn in a namespace with conntrack pays them on every
//! handshake.
//!
//! # nf_conntrack_events
//! Events exist only for entries that carry the event cache extension.
//! With `net.netfilter.nf_conntrack_events=2` (the default since 6.0) the
//! kernel adds it to new entries once someone listens
//! (nf_ct_ecache_ext_add,
//! https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_ecache.c):
//! entries created before kdrop subscribed die silently. With 0, none are
//! reported. kdrop reads the sysctl in each namespace and says so; it
//! never changes it.
// Without the runtime (the fuzz build) only the parser and the filter
// are used.
#![cfg_attr(not(feature = "runtime"), allow(dead_code, unused_imports))]

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    task::Poll,
};

use anyhow::{Context as _, Result};
#[cfg(feature = "runtime")]
use tokio::io::unix::AsyncFd;

pub mod cbpf;
// The messages' parser is the core's (no I/O there).
pub use kdrop_core::parse::ctnetlink as parse;

/// Event messages are small (~200-300 bytes); this holds a burst.
const RCVBUF: libc::c_int = 4 << 20;

use self::{
    cbpf::{attach, filter_program},
    parse::{
        parse, IPS_DST_NAT, IPS_SEEN_REPLY, IPS_SRC_NAT, NFNLGRP_CONNTRACK_DESTROY,
        NFNLGRP_CONNTRACK_NEW,
    },
};
use super::netns::{in_netns, Netns};
use crate::{kernel::facts::CtNames, model::packet::CtEvent};

/// The `enum ip_conntrack_status` bits the kernel filter tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusBits {
    /// An answered entry: never passes.
    pub seen_reply: u32,
    /// Any of these makes a NEW event pass (DST_NAT, SRC_NAT); 0: none does.
    pub nat: u32,
}

impl StatusBits {
    /// The uapi values (nf_conntrack_common.h).
    pub const UAPI: StatusBits = StatusBits {
        seen_reply: IPS_SEEN_REPLY,
        nat: IPS_DST_NAT | IPS_SRC_NAT,
    };

    /// The bits as this kernel's BTF names them, each falling back to its
    /// uapi value.
    pub fn from_names(names: &CtNames) -> Self {
        let bit = |n: &str, uapi: u32| names.bit(n).unwrap_or(uapi);
        StatusBits {
            seen_reply: bit("SEEN_REPLY", IPS_SEEN_REPLY),
            nat: bit("DST_NAT", IPS_DST_NAT) | bit("SRC_NAT", IPS_SRC_NAT),
        }
    }
}

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
    for group in [NFNLGRP_CONNTRACK_DESTROY, NFNLGRP_CONNTRACK_NEW] {
        membership(&fd, group, true).with_context(|| {
            format!(
                "joining {} (is nf_conntrack_netlink available?)",
                group_name(group)
            )
        })?;
    }
    Ok(fd)
}

fn group_name(group: u32) -> &'static str {
    match group {
        NFNLGRP_CONNTRACK_NEW => "NFNLGRP_CONNTRACK_NEW",
        _ => "NFNLGRP_CONNTRACK_DESTROY",
    }
}

/// Joins or leaves a multicast group. The group belongs to the socket's
/// namespace, whichever namespace the calling thread is in.
fn membership(fd: &OwnedFd, group: u32, join: bool) -> std::io::Result<()> {
    let opt = if join {
        libc::NETLINK_ADD_MEMBERSHIP
    } else {
        libc::NETLINK_DROP_MEMBERSHIP
    };
    let g = group as libc::c_int;
    // SAFETY: an int option on our own socket.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            opt,
            (&raw const g).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(feature = "runtime")]
struct Listener {
    fd: AsyncFd<OwnedFd>,
    netns: u32,
}

/// Event sockets in the followed namespaces.
#[cfg(feature = "runtime")]
#[derive(Default)]
pub struct CtEvents {
    listeners: Vec<Listener>,
    /// NEW events that passed the kernel filter and were read.
    pub received_new: u64,
    /// Destroy events that passed the kernel filter and were read.
    pub received_destroyed: u64,
    /// Times the socket buffer overflowed (ENOBUFS): events were lost.
    pub overruns: u64,
    /// What could not be followed, and why (for `kdrop: without ...`).
    pub notes: Vec<String>,
}

/// Namespaces followed at most (one socket each).
pub const MAX_NAMESPACES: usize = 64;

#[cfg(feature = "runtime")]
impl CtEvents {
    /// Listens in each of `namespaces` (up to MAX_NAMESPACES). Problems in
    /// a namespace the user named are told one by one; in namespaces found
    /// by a scan (they come and go) they are counted in one line.
    pub fn open(namespaces: &[Netns], ports: &[u16], bits: StatusBits, named: bool) -> Self {
        let prog = filter_program(ports, bits);
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
                log::debug!("conntrack events in netns {name}: {e}");
                failed += 1;
                if named {
                    me.notes
                        .push(format!("conntrack events in netns {name}: {e}"));
                }
            }
        }
        if !off.is_empty() {
            me.notes.push(format!(
                "conntrack events in netns {}: net.netfilter.nf_conntrack_events=0 there (kdrop does not change it; 2, the default, reports entries created while kdrop listens)",
                off.join(", ")
            ));
        }
        if failed > 0 && !named {
            me.notes.push(format!(
                "conntrack events in {failed} namespaces that could not be joined (gone, or no nf_conntrack_netlink)"
            ));
        }
        if namespaces.len() > MAX_NAMESPACES {
            me.notes.push(format!(
                "conntrack events in {} more namespaces (kdrop follows at most {MAX_NAMESPACES}; use --netns)",
                namespaces.len() - MAX_NAMESPACES
            ));
        }
        me
    }

    /// Joins (`true`, as `open` leaves them) or leaves the new group on
    /// every socket: NEW events cost the kernel a message per confirmed
    /// entry in each namespace listened to, so they can be armed only while
    /// they are needed. Destroy events are not affected.
    pub fn set_new(&mut self, on: bool) -> Result<()> {
        for l in &self.listeners {
            membership(l.fd.get_ref(), NFNLGRP_CONNTRACK_NEW, on).with_context(|| {
                format!(
                    "{} {} in netns {}",
                    if on { "joining" } else { "leaving" },
                    group_name(NFNLGRP_CONNTRACK_NEW),
                    l.netns
                )
            })?;
        }
        Ok(())
    }

    /// Events read, both kinds.
    pub fn received(&self) -> u64 {
        self.received_new + self.received_destroyed
    }

    /// Namespaces listened to.
    pub fn len(&self) -> usize {
        self.listeners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.listeners.is_empty()
    }

    /// Waits until a socket is readable, then reads all of them.
    pub async fn next(&mut self) -> Vec<CtEvent> {
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
    pub fn read_all(&mut self) -> Vec<CtEvent> {
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
                    "conntrack message of {n} bytes in netns {}: {got:?}",
                    l.netns
                );
                for e in &got {
                    match e {
                        CtEvent::New(_) => self.received_new += 1,
                        CtEvent::Destroyed(_) => self.received_destroyed += 1,
                    }
                }
                out.extend(got);
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests;
