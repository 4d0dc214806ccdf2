//! A small rtnetlink client: dumps of links, addresses, routes and policy
//! rules, and a socket subscribed to their change notifications. The
//! messages' parsing is the core's (`kdrop_core::parse::rtnetlink`, pure,
//! unit-tested without a kernel). Message layouts: include/uapi/linux/{netlink,rtnetlink,if_link,
//! if_addr,fib_rules}.h (stable UAPI).
use std::{
    collections::HashMap,
    io,
    net::IpAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{bail, Context as _, Result};

pub use kdrop_core::parse::rtnetlink::*;

use crate::model::{netfilter::Iface, routing::Tables};

/// An rtnetlink socket in the calling thread's network namespace.
pub struct Socket {
    fd: OwnedFd,
}

impl Socket {
    /// `groups`: notification groups to join (0 for a plain request socket).
    pub fn open(groups: u32, nonblocking: bool) -> Result<Self> {
        Self::open_protocol(libc::NETLINK_ROUTE, groups, nonblocking)
    }

    /// A socket of another netlink family (e.g. NETLINK_SOCK_DIAG).
    pub fn open_protocol(protocol: i32, groups: u32, nonblocking: bool) -> Result<Self> {
        let mut ty = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
        if nonblocking {
            ty |= libc::SOCK_NONBLOCK;
        }
        // SAFETY: plain socket(2); the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, ty, protocol) };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("netlink socket");
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed sockaddr_nl is valid; we set family and groups.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = groups;
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sa).cast(),
                size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error()).context("netlink bind");
        }
        Ok(Socket { fd })
    }

    /// Sends a dump request of `ty` with a zeroed `hdr_len`-byte family header.
    pub fn dump(&self, ty: u16, family: u8, hdr_len: usize) -> Result<Vec<Vec<u8>>> {
        let mut hdr = vec![0u8; hdr_len];
        if let Some(f) = hdr.first_mut() {
            *f = family;
        }
        self.request(ty, NLM_F_DUMP, &hdr)?
            .map_err(io::Error::from_raw_os_error)
            .context("netlink dump")
    }

    /// Sends one request (`body`: family header and attributes; NLM_F_REQUEST
    /// is added) and collects the payloads of the answer: every message up
    /// to NLMSG_DONE for a dump, the one reply otherwise. A refusal by the
    /// kernel is `Ok(Err(errno))`, for callers to whom the errno is the answer.
    pub fn request(
        &self,
        ty: u16,
        flags: u16,
        body: &[u8],
    ) -> Result<std::result::Result<Vec<Vec<u8>>, i32>> {
        let mut req = vec![0u8; NLMSG_HDRLEN];
        let len = (NLMSG_HDRLEN + body.len()) as u32;
        req[0..4].copy_from_slice(&len.to_ne_bytes());
        req[4..6].copy_from_slice(&ty.to_ne_bytes());
        req[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        req[8..12].copy_from_slice(&1u32.to_ne_bytes());
        req.extend_from_slice(body);
        // SAFETY: req is a valid buffer.
        let rc = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error()).context("netlink send");
        }
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        // The payloads of every message up to NLMSG_DONE, which can share a
        // datagram with the last of them.
        let mut all = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.recv(&mut buf)?;
            if n == 0 {
                bail!("netlink closed");
            }
            for (t, payload) in messages(&buf[..n]) {
                match t {
                    NLMSG_DONE => return Ok(Ok(all)),
                    NLMSG_ERROR => {
                        let errno = payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                            .unwrap_or(0);
                        if errno != 0 {
                            return Ok(Err(-errno));
                        }
                        if !dump {
                            return Ok(Ok(all));
                        }
                    }
                    _ => {
                        all.push(payload.to_vec());
                        if !dump {
                            return Ok(Ok(all));
                        }
                    }
                }
            }
        }
    }

    pub fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        // SAFETY: buf is a valid writable buffer.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error()).context("netlink recv");
        }
        Ok(n as usize)
    }

    /// Reads everything pending; true if anything (or an overrun) was there.
    pub fn drain(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            // SAFETY: buf is a valid writable buffer.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                any = true;
                continue;
            }
            // ENOBUFS: notifications were lost, so something changed.
            let e = io::Error::last_os_error();
            return any || (n < 0 && e.raw_os_error() == Some(libc::ENOBUFS));
        }
    }
}

/// Links, addresses, routes and rules (IPv4 and IPv6) of the calling
/// thread's namespace (run it inside the namespace).
pub fn dump_tables() -> Result<Tables> {
    let s = Socket::open(0, false)?;
    let parse = |ty: u16, hdr: usize, family: u8| s.dump(ty, family, hdr);
    Ok(Tables {
        links: parse(RTM_GETLINK, 16, 0)?
            .iter()
            .filter_map(|p| parse_link(p))
            .collect(),
        addrs: parse(RTM_GETADDR, 8, AF_INET)?
            .iter()
            .chain(parse(RTM_GETADDR, 8, AF_INET6)?.iter())
            .filter_map(|p| parse_addr(p))
            .collect(),
        routes: parse(RTM_GETROUTE, 12, AF_INET)?
            .iter()
            .filter_map(|p| parse_route(p))
            .collect(),
        rules: parse(RTM_GETRULE, 12, AF_INET)?
            .iter()
            .filter_map(|p| parse_rule(p))
            .collect(),
        rules6: parse(RTM_GETRULE, 12, AF_INET6)?
            .iter()
            .filter_map(|p| parse_rule(p))
            .collect(),
        routes6: parse(RTM_GETROUTE, 12, AF_INET6)?
            .iter()
            .filter_map(|p| parse_route(p))
            .collect(),
    })
}

/// Every link of the calling thread's namespace with its master's name and
/// its addresses: a netfilter snapshot's interfaces (bridge ports, local
/// addresses), read where `ip -j addr show` was run for each snapshot.
pub fn ifaces() -> Result<Vec<Iface>> {
    let s = Socket::open(0, false)?;
    let links: Vec<_> = s
        .dump(RTM_GETLINK, 0, 16)?
        .iter()
        .filter_map(|p| parse_link(p))
        .collect();
    // By link: a node with hundreds of pods has as many veths.
    let mut addrs: HashMap<u32, Vec<IpAddr>> = HashMap::new();
    for family in [AF_INET, AF_INET6] {
        for a in s
            .dump(RTM_GETADDR, family, 8)?
            .iter()
            .filter_map(|p| parse_addr(p))
        {
            addrs.entry(a.index).or_default().push(a.addr);
        }
    }
    let names: HashMap<u32, &str> = links.iter().map(|l| (l.index, l.name.as_str())).collect();
    Ok(links
        .iter()
        .map(|l| Iface {
            index: l.index,
            name: l.name.clone(),
            master: l.master.and_then(|m| names.get(&m)).map(|m| m.to_string()),
            addrs: addrs.remove(&l.index).unwrap_or_default(),
        })
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The kernel gives every namespace `lo` at index 1; this test's has
    /// 127.0.0.1 on it (a namespace of its own would start it down and
    /// bare).
    #[test]
    fn ifaces_of_this_namespace() {
        let Ok(ifaces) = ifaces() else {
            eprintln!("SKIP ifaces_of_this_namespace: no rtnetlink here");
            return;
        };
        let lo = ifaces.iter().find(|i| i.index == 1).expect("no link 1");
        assert_eq!(lo.name, "lo");
        assert_eq!(lo.master, None);
        assert!(lo.addrs.contains(&"127.0.0.1".parse().unwrap()), "{lo:?}");
    }

    pub use kdrop_core::parse::rtnetlink::message as msg;

    #[test]
    fn dumps_this_namespace() {
        let t = dump_tables().unwrap();
        assert!(t.links.iter().any(|l| l.index == 1 && l.name == "lo"));
        assert!(t.rules.iter().any(|r| r.priority == 0 && r.table == 255));
        assert!(t.routes.iter().any(|r| r.table == 255));
    }
}
