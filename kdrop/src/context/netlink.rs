//! A small rtnetlink client: dumps of links, addresses, routes and policy
//! rules, and a socket subscribed to their change notifications. Parsing is
//! pure (bytes in, structs out), so it is unit-tested without a kernel. Message layouts: include/uapi/linux/{netlink,rtnetlink,if_link,
//! if_addr,fib_rules}.h (stable UAPI).
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{bail, Context as _, Result};

use crate::model::routing::{Addr, Link, Route, Rule, Tables};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_DUMP: u16 = 0x300;

pub const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
pub const RTM_NEWRULE: u16 = 32;
const RTM_GETRULE: u16 = 34;

const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_LABEL: u16 = 3;

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_PREFSRC: u16 = 7;
const RTA_MULTIPATH: u16 = 9;
const RTA_TABLE: u16 = 15;

const FRA_DST: u16 = 1;
const FRA_SRC: u16 = 2;
const FRA_IIFNAME: u16 = 3;
const FRA_GOTO: u16 = 4;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const FRA_OIFNAME: u16 = 17;
const FIB_RULE_INVERT: u32 = 0x2;

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

/// Notification groups to watch (rtnetlink.h `enum rtnetlink_groups`).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV4_RULE: u32 = 8;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;
/// rp_filter changes are announced here; the other conf values are not.
const RTNLGRP_IPV4_NETCONF: u32 = 24;

/// The legacy bind mask for those groups: group n is bit n-1.
pub const GROUPS: u32 = {
    let groups = [
        RTNLGRP_LINK,
        RTNLGRP_IPV4_IFADDR,
        RTNLGRP_IPV4_ROUTE,
        RTNLGRP_IPV4_RULE,
        RTNLGRP_IPV6_IFADDR,
        RTNLGRP_IPV6_ROUTE,
        RTNLGRP_IPV4_NETCONF,
    ];
    let mut mask = 0;
    let mut i = 0;
    while i < groups.len() {
        mask |= 1 << (groups[i] - 1);
        i += 1;
    }
    mask
};

/// Iterates `(type, payload)` of the netlink messages in `buf`.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
        let ty = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
        if len < NLMSG_HDRLEN || len > rest.len() {
            return None;
        }
        let payload = &rest[NLMSG_HDRLEN..len];
        rest = &rest[align(len).min(rest.len())..];
        Some((ty, payload))
    })
}

pub fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// Iterates `(type, value)` of route attributes.
pub fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes(rest[0..2].try_into().unwrap()) as usize;
        // NLA_F_NESTED and NLA_F_NET_BYTEORDER live in the top bits.
        let ty = u16::from_ne_bytes(rest[2..4].try_into().unwrap()) & 0x3fff;
        if len < 4 || len > rest.len() {
            return None;
        }
        let value = &rest[4..len];
        rest = &rest[align(len).min(rest.len())..];
        Some((ty, value))
    })
}

pub fn u32_of(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

pub fn str_of(v: &[u8]) -> String {
    let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

pub fn ip_of(family: u8, v: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(v.get(..4)?).ok()?,
        ))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(v.get(..16)?).ok()?,
        ))),
        _ => None,
    }
}

/// Appends one attribute (header, value, padding) to a request body.
pub fn put_attr(buf: &mut Vec<u8>, ty: u16, value: &[u8]) {
    buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(align(buf.len()), 0);
}

pub fn parse_link(p: &[u8]) -> Option<Link> {
    // struct ifinfomsg: family u8, pad u8, type u16, index i32, flags u32, change u32.
    let index = u32_of(p.get(4..8)?)?;
    let flags = u32_of(p.get(8..12)?)?;
    let mut link = Link {
        index,
        name: String::new(),
        master: None,
        kind: None,
        up: flags & 1 != 0,
    };
    for (ty, v) in attrs(p.get(16..)?) {
        match ty {
            IFLA_IFNAME => link.name = str_of(v),
            IFLA_MASTER => link.master = u32_of(v),
            IFLA_LINKINFO => {
                link.kind = attrs(v)
                    .find(|(t, _)| *t == IFLA_INFO_KIND)
                    .map(|(_, k)| str_of(k))
            }
            _ => {}
        }
    }
    Some(link)
}

pub fn parse_addr(p: &[u8]) -> Option<Addr> {
    // struct ifaddrmsg: family u8, prefixlen u8, flags u8, scope u8, index u32.
    let family = *p.first()?;
    let prefix_len = *p.get(1)?;
    let index = u32_of(p.get(4..8)?)?;
    let (mut local, mut address, mut label) = (None, None, None);
    for (ty, v) in attrs(p.get(8..)?) {
        match ty {
            IFA_LOCAL => local = ip_of(family, v),
            IFA_ADDRESS => address = ip_of(family, v),
            IFA_LABEL => label = Some(str_of(v)),
            _ => {}
        }
    }
    Some(Addr {
        index,
        // IFA_LOCAL is the interface's own address on point-to-point links.
        addr: local.or(address)?,
        prefix_len,
        label,
    })
}

pub fn parse_route(p: &[u8]) -> Option<Route> {
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type; flags u32.
    let family = *p.first()?;
    let mut r = Route {
        table: u32::from(*p.get(4)?),
        family,
        dst: None,
        dst_len: *p.get(1)?,
        kind: *p.get(7)?,
        scope: *p.get(6)?,
        oif: None,
        gateway: None,
        prefsrc: None,
        priority: 0,
        nexthops: Vec::new(),
    };
    for (ty, v) in attrs(p.get(12..)?) {
        match ty {
            RTA_DST => r.dst = ip_of(family, v),
            RTA_OIF => r.oif = u32_of(v),
            RTA_GATEWAY => r.gateway = ip_of(family, v),
            RTA_PREFSRC => r.prefsrc = ip_of(family, v),
            RTA_PRIORITY => r.priority = u32_of(v).unwrap_or(0),
            RTA_TABLE => r.table = u32_of(v).unwrap_or(r.table),
            RTA_MULTIPATH => r.nexthops = parse_nexthops(family, v),
            _ => {}
        }
    }
    Some(r)
}

/// `struct rtnexthop` entries: len u16, flags u8, hops u8, ifindex i32, then attributes.
fn parse_nexthops(family: u8, mut v: &[u8]) -> Vec<(u32, Option<IpAddr>)> {
    let mut out = Vec::new();
    while v.len() >= 8 {
        let len = u16::from_ne_bytes([v[0], v[1]]) as usize;
        if len < 8 || len > v.len() {
            break;
        }
        let ifindex = u32::from_ne_bytes(v[4..8].try_into().unwrap());
        let gw = attrs(&v[8..len])
            .find(|(t, _)| *t == RTA_GATEWAY)
            .and_then(|(_, g)| ip_of(family, g));
        out.push((ifindex, gw));
        v = &v[align(len).min(v.len())..];
    }
    out
}

pub fn parse_rule(p: &[u8]) -> Option<Rule> {
    // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action; flags u32.
    let family = *p.first()?;
    let (dst_len, src_len) = (*p.get(1)?, *p.get(2)?);
    let flags = u32_of(p.get(8..12)?)?;
    let mut r = Rule {
        family,
        priority: 0,
        table: u32::from(*p.get(4)?),
        action: *p.get(7)?,
        src: None,
        dst: None,
        fwmark: None,
        fwmask: None,
        iifname: None,
        oifname: None,
        invert: flags & FIB_RULE_INVERT != 0,
        goto: None,
    };
    for (ty, v) in attrs(p.get(12..)?) {
        match ty {
            FRA_SRC => r.src = ip_of(family, v).map(|a| (a, src_len)),
            FRA_DST => r.dst = ip_of(family, v).map(|a| (a, dst_len)),
            FRA_IIFNAME => r.iifname = Some(str_of(v)),
            FRA_OIFNAME => r.oifname = Some(str_of(v)),
            FRA_PRIORITY => r.priority = u32_of(v).unwrap_or(0),
            FRA_FWMARK => r.fwmark = u32_of(v),
            FRA_FWMASK => r.fwmask = u32_of(v),
            FRA_TABLE => r.table = u32_of(v).unwrap_or(r.table),
            FRA_GOTO => r.goto = u32_of(v),
            _ => {}
        }
    }
    Some(r)
}

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::routing::{FR_ACT_TO_TBL, RTN_UNICAST};

    /// Builds netlink messages the way the kernel lays them out.
    pub fn msg(ty: u16, hdr: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = hdr.to_vec();
        for (t, v) in attrs {
            let len = 4 + v.len();
            body.extend_from_slice(&(len as u16).to_ne_bytes());
            body.extend_from_slice(&t.to_ne_bytes());
            body.extend_from_slice(v);
            body.resize(align(body.len()), 0);
        }
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&body);
        m
    }

    #[test]
    fn parses_link_addr_route_rule() {
        let mut ifi = [0u8; 16];
        ifi[4..8].copy_from_slice(&3u32.to_ne_bytes());
        ifi[8..12].copy_from_slice(&1u32.to_ne_bytes());
        let mut kind = Vec::new();
        kind.extend_from_slice(&9u16.to_ne_bytes());
        kind.extend_from_slice(&IFLA_INFO_KIND.to_ne_bytes());
        kind.extend_from_slice(b"veth\0");
        kind.resize(12, 0);
        let link = msg(
            RTM_NEWLINK,
            &ifi,
            &[
                (IFLA_IFNAME, b"eth1\0"),
                (IFLA_MASTER, &7u32.to_ne_bytes()),
                (IFLA_LINKINFO, &kind),
            ],
        );
        let mut addr_hdr = [0u8; 8];
        addr_hdr[0] = AF_INET;
        addr_hdr[1] = 24;
        addr_hdr[4..8].copy_from_slice(&3u32.to_ne_bytes());
        let addr = msg(
            RTM_NEWADDR,
            &addr_hdr,
            &[(IFA_LOCAL, &[10, 0, 2, 10]), (IFA_LABEL, b"eth1\0")],
        );
        let mut rt = [0u8; 12];
        rt[0] = AF_INET;
        rt[4] = 254;
        rt[7] = RTN_UNICAST;
        let route = msg(
            RTM_NEWROUTE,
            &rt,
            &[
                (RTA_GATEWAY, &[10, 0, 1, 1]),
                (RTA_OIF, &2u32.to_ne_bytes()),
                (RTA_TABLE, &254u32.to_ne_bytes()),
            ],
        );
        let mut fr = [0u8; 12];
        fr[0] = AF_INET;
        fr[4] = 254;
        fr[7] = FR_ACT_TO_TBL;
        let rule = msg(
            RTM_NEWRULE,
            &fr,
            &[
                (FRA_PRIORITY, &1024u32.to_ne_bytes()),
                (FRA_FWMARK, &0x80u32.to_ne_bytes()),
                (FRA_FWMASK, &0x80u32.to_ne_bytes()),
            ],
        );
        let all = [link, addr, route, rule].concat();
        let msgs: Vec<_> = messages(&all).collect();
        assert_eq!(msgs.len(), 4);
        let l = parse_link(msgs[0].1).unwrap();
        assert_eq!(
            (l.index, l.name.as_str(), l.master, l.up),
            (3, "eth1", Some(7), true)
        );
        assert_eq!(l.kind.as_deref(), Some("veth"));
        let a = parse_addr(msgs[1].1).unwrap();
        assert_eq!(a.addr, "10.0.2.10".parse::<IpAddr>().unwrap());
        assert_eq!((a.prefix_len, a.index), (24, 3));
        let r = parse_route(msgs[2].1).unwrap();
        assert_eq!((r.table, r.dst, r.dst_len, r.oif), (254, None, 0, Some(2)));
        assert_eq!(r.gateway, Some("10.0.1.1".parse().unwrap()));
        let ru = parse_rule(msgs[3].1).unwrap();
        assert_eq!(
            (ru.priority, ru.table, ru.fwmark, ru.fwmask),
            (1024, 254, Some(0x80), Some(0x80))
        );
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            for (_, p) in messages(&junk) {
                let _ = (parse_link(p), parse_addr(p), parse_route(p), parse_rule(p));
            }
            let _ = (
                parse_link(&junk),
                parse_addr(&junk),
                parse_route(&junk),
                parse_rule(&junk),
            );
            let _ = parse_nexthops(AF_INET, &junk);
        }
        // A length field pointing past the end stops the walk.
        let mut m = msg(RTM_NEWLINK, &[0; 16], &[]);
        m[0] = 200;
        assert_eq!(messages(&m).count(), 0);
    }

    #[test]
    fn dumps_this_namespace() {
        let t = dump_tables().unwrap();
        assert!(t.links.iter().any(|l| l.index == 1 && l.name == "lo"));
        assert!(t.rules.iter().any(|r| r.priority == 0 && r.table == 255));
        assert!(t.routes.iter().any(|r| r.table == 255));
    }
}
