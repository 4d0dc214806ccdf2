//! rtnetlink messages: links, addresses, routes and policy rules, parsed
//! (bytes in, structs out; the shell's `context::netlink` holds the
//! socket). Message layouts: include/uapi/linux/{netlink,rtnetlink,if_link,
//! if_addr,fib_rules}.h (stable UAPI).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::routing::{Addr, Link, Route, Rule};

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_DUMP: u16 = 0x300;

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_GETROUTE: u16 = 26;
pub const RTM_NEWRULE: u16 = 32;
pub const RTM_GETRULE: u16 = 34;

pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_MASTER: u16 = 10;
pub const IFLA_LINKINFO: u16 = 18;
pub const IFLA_INFO_KIND: u16 = 1;

pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;
pub const IFA_LABEL: u16 = 3;

pub const RTA_DST: u16 = 1;
pub const RTA_OIF: u16 = 4;
pub const RTA_GATEWAY: u16 = 5;
pub const RTA_PRIORITY: u16 = 6;
pub const RTA_PREFSRC: u16 = 7;
pub const RTA_MULTIPATH: u16 = 9;
pub const RTA_TABLE: u16 = 15;

pub const FRA_DST: u16 = 1;
pub const FRA_SRC: u16 = 2;
pub const FRA_IIFNAME: u16 = 3;
pub const FRA_GOTO: u16 = 4;
pub const FRA_PRIORITY: u16 = 6;
pub const FRA_FWMARK: u16 = 10;
pub const FRA_TABLE: u16 = 15;
pub const FRA_FWMASK: u16 = 16;
pub const FRA_OIFNAME: u16 = 17;
pub const FIB_RULE_INVERT: u32 = 0x2;

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

/// Notification groups to watch (rtnetlink.h `enum rtnetlink_groups`).
pub const RTNLGRP_LINK: u32 = 1;
pub const RTNLGRP_IPV4_IFADDR: u32 = 5;
pub const RTNLGRP_IPV4_ROUTE: u32 = 7;
pub const RTNLGRP_IPV4_RULE: u32 = 8;
pub const RTNLGRP_IPV6_IFADDR: u32 = 9;
pub const RTNLGRP_IPV6_ROUTE: u32 = 11;
/// rp_filter changes are announced here; the other conf values are not.
pub const RTNLGRP_IPV4_NETCONF: u32 = 24;

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

/// Builds a netlink message the way the kernel lays it out (for tests
/// of the parsers here and of the shell's readers).
pub fn message(ty: u16, hdr: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::{message as msg, *};
    use crate::model::routing::{FR_ACT_TO_TBL, RTN_UNICAST};

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
}
