//! Route queries, as `ip route get`: one RTM_GETROUTE request (not a dump)
//! for IPv4 or IPv6, answered by the kernel's own FIB lookup in the calling
//! thread's network namespace. With RTM_F_FIB_MATCH the answer is the route
//! entry that matched (prefix, table, every next hop), not the cached result.
//!
//! Reproducing a reverse-path check: the kernel's lookup is not the one a
//! packet's own route takes. What it asks, and the query that asks the same:
//!
//! - IPv4 rp_filter, `__fib_validate_source`
//!   (https://github.com/torvalds/linux/blob/v6.18/net/ipv4/fib_frontend.c):
//!   `fl4.daddr = packet saddr`, `fl4.saddr = packet daddr`,
//!   `flowi4_iif = LOOPBACK_IFINDEX` (the `oif` argument is 0 on input),
//!   `flowi4_oif = 0`, `flowi4_l3mdev = l3mdev master of the input device`,
//!   `flowi4_mark = skb->mark` only when src_valid_mark, the packet's DSCP,
//!   uid 0, and proto/ports swapped when a rule selects on them
//!   (`fib4_rules_early_flow_dissect`). Strict mode passes when any next hop
//!   of the matched entry uses the input device (`fib_info_nh_uses_dev`), so
//!   the query asks for the entry (RTM_F_FIB_MATCH) and reports every next hop.
//!   `inet_rtm_getroute` without RTA_IIF sets `flowi4_iif = LOOPBACK_IFINDEX`
//!   and does an output lookup with the same fields
//!   (https://github.com/torvalds/linux/blob/v6.18/net/ipv4/route.c):
//!   [`RouteQuery::reverse_path_v4`]. One difference: an output lookup
//!   refuses a source that is not a local address (`ip_route_output_key_hash_rcu`
//!   answers ENETUNREACH), which the packet's daddr is not for a forwarded
//!   packet; [`reverse_lookup_v4`] then leaves the source out and says so in
//!   the query it returns.
//! - IPv6 `-m rpfilter`, `rpfilter_lookup_reverse6`
//!   (https://github.com/torvalds/linux/blob/v6.18/net/ipv6/netfilter/ip6t_rpfilter.c):
//!   `flowi6_iif = LOOPBACK_IFINDEX`, daddr = packet saddr, saddr = packet
//!   daddr when unicast, mark with `--validmark`, `flowi6_oif = input device`
//!   in strict mode (a preference, no RT6_LOOKUP_F_IFACE unless the source is
//!   link-local), then `ip6_route_lookup`; the check passes when the result's
//!   device is the input device (or in loose mode, any route). nft `fib saddr
//!   . iif oif` (https://github.com/torvalds/linux/blob/v6.18/net/ipv6/netfilter/nft_fib_ipv6.c)
//!   looks up without an oif preference and compares the result's device
//!   with iif. `inet6_rtm_getroute` without RTA_IIF runs `ip6_route_output`,
//!   which also sets `flowi6_iif = LOOPBACK_IFINDEX` and the same flags for a
//!   query with a source (https://github.com/torvalds/linux/blob/v6.18/net/ipv6/route.c):
//!   [`RouteQuery::reverse_path_v6`]. It selects among equal routes through
//!   `ip6_pol_route` rather than `ip6_pol_route_lookup`; they differ only in
//!   router-reachability preference between several default routes.
use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use anyhow::{bail, Result};

use super::{
    netlink::{attrs, ip_of, put_attr, u32_of, Socket, AF_INET, AF_INET6},
    netns::in_netns,
};
use crate::model::routing::{RouteAnswer, RouteLookup, RouteNextHop, RouteQuery, RouteType};

const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_IIF: u16 = 3;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_PREFSRC: u16 = 7;
const RTA_MULTIPATH: u16 = 9;
const RTA_TABLE: u16 = 15;
const RTA_MARK: u16 = 16;
const RTA_VIA: u16 = 18;
const RTA_UID: u16 = 25;
const RTA_IP_PROTO: u16 = 27;
const RTA_SPORT: u16 = 28;
const RTA_DPORT: u16 = 29;
const RTA_NH_ID: u16 = 30;
const RTM_GETROUTE: u16 = 26;
pub const RTM_F_LOOKUP_TABLE: u32 = 0x1000;
pub const RTM_F_FIB_MATCH: u32 = 0x2000;

/// The request body (rtmsg and attributes) for `q`.
pub fn request_body(q: &RouteQuery) -> Result<Vec<u8>> {
    let (family, len) = match q.dst {
        IpAddr::V4(_) => (AF_INET, 32u8),
        IpAddr::V6(_) => (AF_INET6, 128u8),
    };
    if q.src.is_some_and(|s| s.is_ipv4() != q.dst.is_ipv4()) {
        bail!("route query: source and destination of different families");
    }
    let ip = |a: &IpAddr| match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    };
    let mut flags = RTM_F_LOOKUP_TABLE;
    if q.fib_match {
        flags |= RTM_F_FIB_MATCH;
    }
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type; flags u32.
    let mut b = vec![family, len, q.src.map_or(0, |_| len), q.tos, 0, 0, 0, 0];
    b.extend_from_slice(&flags.to_ne_bytes());
    put_attr(&mut b, RTA_DST, &ip(&q.dst));
    if let Some(s) = &q.src {
        put_attr(&mut b, RTA_SRC, &ip(s));
    }
    for (ty, v) in [
        (RTA_IIF, q.iif),
        (RTA_OIF, q.oif),
        (RTA_MARK, q.mark),
        (RTA_UID, q.uid),
    ] {
        if let Some(v) = v {
            put_attr(&mut b, ty, &v.to_ne_bytes());
        }
    }
    if let Some(p) = q.ip_proto {
        put_attr(&mut b, RTA_IP_PROTO, &[p]);
    }
    // Ports are in network byte order (nla_get_be16).
    if let Some(p) = q.sport {
        put_attr(&mut b, RTA_SPORT, &p.to_be_bytes());
    }
    if let Some(p) = q.dport {
        put_attr(&mut b, RTA_DPORT, &p.to_be_bytes());
    }
    Ok(b)
}

/// Parses an RTM_NEWROUTE answer (rtmsg and attributes).
pub fn parse_answer(p: &[u8]) -> Option<RouteAnswer> {
    let family = *p.first()?;
    if family != AF_INET && family != AF_INET6 {
        return None;
    }
    let mut a = RouteAnswer {
        family,
        dst_len: *p.get(1)?,
        table: u32::from(*p.get(4)?),
        scope: *p.get(6)?,
        kind: RouteType::from_raw(*p.get(7)?),
        flags: u32_of(p.get(8..12)?)?,
        dst: None,
        oif: None,
        gateway: None,
        prefsrc: None,
        priority: None,
        nexthops: Vec::new(),
        nh_id: None,
    };
    for (ty, v) in attrs(p.get(12..)?) {
        match ty {
            RTA_DST => a.dst = ip_of(family, v),
            RTA_OIF => a.oif = u32_of(v),
            RTA_GATEWAY => a.gateway = ip_of(family, v),
            RTA_VIA => a.gateway = via(v),
            RTA_PREFSRC => a.prefsrc = ip_of(family, v),
            RTA_PRIORITY => a.priority = u32_of(v),
            RTA_TABLE => a.table = u32_of(v).unwrap_or(a.table),
            RTA_MULTIPATH => a.nexthops = nexthops(family, v),
            RTA_NH_ID => a.nh_id = u32_of(v),
            _ => {}
        }
    }
    if a.oif.is_none() {
        a.oif = a.nexthops.first().map(|n| n.oif);
    }
    Some(a)
}

/// RTA_VIA: `struct rtvia` (family u16, address): IPv4 routes via IPv6.
fn via(v: &[u8]) -> Option<IpAddr> {
    let fam = u16::from_ne_bytes(v.get(..2)?.try_into().ok()?);
    ip_of(u8::try_from(fam).ok()?, v.get(2..)?)
}

/// `struct rtnexthop` entries: len u16, flags u8, hops u8, ifindex i32, attributes.
fn nexthops(family: u8, mut v: &[u8]) -> Vec<RouteNextHop> {
    let mut out = Vec::new();
    while v.len() >= 8 {
        let len = usize::from(u16::from_ne_bytes([v[0], v[1]]));
        if len < 8 || len > v.len() {
            break;
        }
        let gateway = attrs(&v[8..len]).find_map(|(t, g)| match t {
            RTA_GATEWAY => ip_of(family, g),
            RTA_VIA => via(g),
            _ => None,
        });
        out.push(RouteNextHop {
            oif: u32_of(&v[4..8]).unwrap_or(0),
            gateway,
            flags: v[2],
        });
        v = &v[super::netlink::align(len).min(v.len())..];
    }
    out
}

/// A short name for the errnos route lookups answer with.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::ENETUNREACH => "ENETUNREACH",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EINVAL => "EINVAL",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENODEV => "ENODEV",
        libc::ESRCH => "ESRCH",
        libc::EAGAIN => "EAGAIN",
        libc::ENOENT => "ENOENT",
        libc::EXDEV => "EXDEV",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

/// Asks the kernel of the calling thread's namespace.
pub fn query(q: &RouteQuery) -> Result<RouteLookup> {
    let body = request_body(q)?;
    let sock = Socket::open(0, false)?;
    match sock.request(RTM_GETROUTE, 0, &body)? {
        Err(errno) => Ok(RouteLookup::Failed {
            errno,
            name: errno_name(errno),
        }),
        Ok(msgs) => {
            let Some(p) = msgs.first() else {
                bail!("route query: empty answer");
            };
            match parse_answer(p) {
                Some(a) => Ok(RouteLookup::Found(a)),
                None => bail!("route query: unparsable answer ({} bytes)", p.len()),
            }
        }
    }
}

/// `query` inside the namespace at `netns`.
pub fn query_in(netns: &Path, q: &RouteQuery) -> Result<RouteLookup> {
    let q = q.clone();
    in_netns(netns, move || query(&q))?
}

/// The IPv4 reverse-path lookup for a packet `pkt_src -> pkt_dst`, run in
/// the calling thread's namespace: [`RouteQuery::reverse_path_v4`], without
/// the source when `pkt_dst` is not a local address (a forwarded packet: an
/// output lookup refuses a foreign source; rules selecting `from` cannot
/// then be matched as the kernel matched them). Returns the query asked.
pub fn reverse_lookup_v4(
    pkt_src: Ipv4Addr,
    pkt_dst: Ipv4Addr,
    mark: u32,
    src_valid_mark: bool,
    tos: u8,
    l3mdev: Option<u32>,
) -> Result<(RouteQuery, RouteLookup)> {
    let mut q = RouteQuery::reverse_path_v4(pkt_src, pkt_dst, mark, src_valid_mark, tos, l3mdev);
    let local = matches!(
        query(&RouteQuery::get(pkt_dst.into()))?,
        RouteLookup::Found(RouteAnswer {
            kind: RouteType::Local,
            ..
        })
    );
    if !local {
        q.src = None;
    }
    let r = query(&q)?;
    Ok((q, r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::netlink::{messages, tests::msg, RTM_NEWROUTE};
    use std::net::Ipv6Addr;

    #[test]
    fn request_carries_every_field() {
        let mut q = RouteQuery::reverse_path_v4(
            "192.0.2.7".parse().unwrap(),
            "10.0.2.20".parse().unwrap(),
            0x80,
            true,
            0,
            None,
        );
        q.ip_proto = Some(6);
        q.sport = Some(8080);
        let b = request_body(&q).unwrap();
        assert_eq!(&b[..4], &[AF_INET, 32, 32, 0]);
        let flags = u32_of(&b[8..12]).unwrap();
        assert_eq!(flags, RTM_F_LOOKUP_TABLE | RTM_F_FIB_MATCH);
        let got: Vec<(u16, Vec<u8>)> = attrs(&b[12..]).map(|(t, v)| (t, v.to_vec())).collect();
        assert!(got.contains(&(RTA_DST, vec![192, 0, 2, 7])));
        assert!(got.contains(&(RTA_SRC, vec![10, 0, 2, 20])));
        assert!(got.contains(&(RTA_MARK, 0x80u32.to_ne_bytes().to_vec())));
        assert!(got.contains(&(RTA_SPORT, vec![0x1f, 0x90])));
        assert!(got.contains(&(RTA_IP_PROTO, vec![6])));
        assert!(!got.iter().any(|(t, _)| *t == RTA_IIF || *t == RTA_OIF));
        // Without src_valid_mark the kernel looks up with mark 0.
        let q = RouteQuery::reverse_path_v4(
            "192.0.2.7".parse().unwrap(),
            "10.0.2.20".parse().unwrap(),
            0x80,
            false,
            0,
            None,
        );
        assert_eq!(q.mark, Some(0));
        let mut bad = RouteQuery::get("10.0.0.1".parse().unwrap());
        bad.src = Some("::1".parse().unwrap());
        assert!(request_body(&bad).is_err());
    }

    #[test]
    fn v6_reverse_path_follows_rpfilter() {
        let src: Ipv6Addr = "fd00:1::1".parse().unwrap();
        let dst: Ipv6Addr = "fd00:2::2".parse().unwrap();
        let strict = RouteQuery::reverse_path_v6(src, dst, 3, None, false);
        assert_eq!((strict.dst, strict.src), (src.into(), Some(dst.into())));
        assert_eq!(strict.oif, Some(3));
        assert_eq!(
            RouteQuery::reverse_path_v6(src, dst, 3, None, true).oif,
            None
        );
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        assert_eq!(
            RouteQuery::reverse_path_v6(ll, dst, 3, None, true).oif,
            Some(3)
        );
        let mc: Ipv6Addr = "ff02::1".parse().unwrap();
        assert_eq!(
            RouteQuery::reverse_path_v6(src, mc, 3, None, false).src,
            None
        );
    }

    #[test]
    fn parses_fib_match_answer_with_multipath() {
        let mut rt = [0u8; 12];
        rt[0] = AF_INET;
        rt[1] = 24;
        rt[4] = 254;
        rt[7] = 1;
        rt[8..12].copy_from_slice(&RTM_F_FIB_MATCH.to_ne_bytes());
        let mut mp = Vec::new();
        for (idx, gw) in [(2u32, [10, 0, 1, 1]), (3, [10, 0, 2, 1])] {
            let mut nh = vec![16, 0, 0, 0];
            nh.extend_from_slice(&idx.to_ne_bytes());
            nh.extend_from_slice(&8u16.to_ne_bytes());
            nh.extend_from_slice(&RTA_GATEWAY.to_ne_bytes());
            nh.extend_from_slice(&gw);
            mp.extend_from_slice(&nh);
        }
        let m = msg(
            RTM_NEWROUTE,
            &rt,
            &[
                (RTA_TABLE, &2u32.to_ne_bytes()),
                (RTA_DST, &[198, 51, 100, 0]),
                (RTA_MULTIPATH, &mp),
            ],
        );
        let (_, p) = messages(&m).next().unwrap();
        let a = parse_answer(p).unwrap();
        assert_eq!((a.table, a.kind, a.dst_len), (2, RouteType::Unicast, 24));
        assert_eq!(a.dst, Some("198.51.100.0".parse().unwrap()));
        assert_eq!(a.devices(), vec![2, 3]);
        assert_eq!(a.oif, Some(2));
        assert_eq!(a.nexthops[1].gateway, Some("10.0.2.1".parse().unwrap()));
    }

    #[test]
    fn garbage_is_none_never_a_panic() {
        for len in 0..80 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 53 + 7) as u8).collect();
            let _ = parse_answer(&junk);
            let _ = nexthops(AF_INET6, &junk);
            let _ = via(&junk);
            let mut j = junk.clone();
            if let Some(f) = j.first_mut() {
                *f = AF_INET;
            }
            let _ = parse_answer(&j);
        }
        assert_eq!(parse_answer(&[AF_INET, 0, 0]), None);
        assert_eq!(errno_name(libc::ENETUNREACH), "ENETUNREACH");
        assert_eq!(errno_name(9999), "errno 9999");
    }

    #[test]
    fn asks_this_namespace() {
        let r = query(&RouteQuery::get("127.0.0.1".parse().unwrap())).unwrap();
        let RouteLookup::Found(a) = r else {
            panic!("{r:?}")
        };
        // The table is 254 or 255: without custom rules the kernel keeps
        // local and main merged in one trie (fib_trie.c, fib_unmerge).
        assert_eq!((a.kind, a.oif), (RouteType::Local, Some(1)));
        let mut q = RouteQuery::get("127.0.0.2".parse().unwrap());
        q.fib_match = true;
        let RouteLookup::Found(a) = query(&q).unwrap() else {
            panic!()
        };
        assert_eq!((a.dst, a.dst_len), (Some("127.0.0.0".parse().unwrap()), 8));
    }
}
