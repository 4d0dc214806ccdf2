//! Neighbour (ARP / NDP) entries of a network namespace: an RTM_GETNEIGH
//! dump, as `ip neigh show`, and the entry for one (device, next hop).
//! Message layout: `struct ndmsg` and NDA_* (include/uapi/linux/neighbour.h);
//! NUD_* state bits as `ip neigh` names them.
use std::{net::IpAddr, path::Path};

use anyhow::Result;

use super::{
    netlink::{attrs, ip_of, u32_of, Socket, AF_INET, AF_INET6, NLM_F_DUMP},
    netns::{ifname, in_netns},
};

pub use crate::model::neighbour::*;
use crate::model::packet::mac_text;

const RTM_GETNEIGH: u16 = 30;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NDA_PROBES: u16 = 4;
const NTF_ROUTER: u8 = 0x80;

/// Parses one RTM_NEWNEIGH payload; `dev` is left empty (the caller names it
/// inside the namespace).
pub fn parse_neigh(p: &[u8]) -> Option<Neighbour> {
    // struct ndmsg: family u8, pad u8, pad u16, ifindex i32, state u16, flags u8, type u8.
    let family = *p.first()?;
    if family != AF_INET && family != AF_INET6 {
        return None;
    }
    let ifindex = u32_of(p.get(4..8)?)?;
    let state = u16::from_ne_bytes(p.get(8..10)?.try_into().ok()?);
    let flags = *p.get(10)?;
    let (mut dst, mut lladdr, mut probes) = (None, None, None);
    for (ty, v) in attrs(p.get(12..)?) {
        match ty {
            NDA_DST => dst = ip_of(family, v),
            NDA_LLADDR if !v.is_empty() => lladdr = Some(mac_text(v)),
            NDA_PROBES => probes = u32_of(v),
            _ => {}
        }
    }
    Some(Neighbour {
        dst: dst?,
        ifindex,
        dev: String::new(),
        state,
        lladdr,
        router: flags & NTF_ROUTER != 0,
        probes,
    })
}

/// Every IPv4 and IPv6 neighbour of the calling thread's namespace.
pub fn dump() -> Result<Vec<Neighbour>> {
    let sock = Socket::open(0, false)?;
    let mut out: Vec<Neighbour> = sock
        .request(RTM_GETNEIGH, NLM_F_DUMP, &[0u8; 12])?
        .map_err(std::io::Error::from_raw_os_error)?
        .iter()
        .filter_map(|p| parse_neigh(p))
        .collect();
    for n in &mut out {
        n.dev = ifname(n.ifindex).unwrap_or_else(|| format!("if{}", n.ifindex));
    }
    Ok(out)
}

/// `dump` inside the namespace at `netns`.
pub fn dump_in(netns: &Path) -> Result<Vec<Neighbour>> {
    in_netns(netns, dump)?
}

/// The entry for next hop `addr` on device `ifindex`.
pub fn lookup(neighbours: &[Neighbour], ifindex: u32, addr: IpAddr) -> Option<&Neighbour> {
    neighbours
        .iter()
        .find(|n| n.ifindex == ifindex && n.dst == addr)
}

/// The entries on device `ifindex` whose link-layer address is `lladdr`.
pub fn with_lladdr(neighbours: Vec<Neighbour>, ifindex: u32, lladdr: &[u8]) -> Vec<Neighbour> {
    let mac = mac_text(lladdr);
    neighbours
        .into_iter()
        .filter(|n| n.ifindex == ifindex && n.lladdr.as_deref() == Some(mac.as_str()))
        .collect()
}

/// The entry for (`ifindex`, `addr`) in the namespace at `netns`, if any.
pub fn lookup_in(netns: &Path, ifindex: u32, addr: IpAddr) -> Result<Option<Neighbour>> {
    Ok(lookup(&dump_in(netns)?, ifindex, addr).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::netlink::{messages, tests::msg};

    fn ndmsg(family: u8, ifindex: u32, state: u16, flags: u8) -> [u8; 12] {
        let mut h = [0u8; 12];
        h[0] = family;
        h[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        h[8..10].copy_from_slice(&state.to_ne_bytes());
        h[10] = flags;
        h
    }

    #[test]
    fn parses_entries_and_names_states() {
        let failed = msg(
            28,
            &ndmsg(AF_INET, 3, NUD_FAILED, 0),
            &[(NDA_DST, &[10, 0, 1, 3]), (NDA_PROBES, &3u32.to_ne_bytes())],
        );
        let reach = msg(
            28,
            &ndmsg(AF_INET6, 2, NUD_REACHABLE, NTF_ROUTER),
            &[
                (
                    NDA_DST,
                    &"fe80::1".parse::<std::net::Ipv6Addr>().unwrap().octets(),
                ),
                (NDA_LLADDR, &[2, 0, 0, 0, 0, 0x1f]),
            ],
        );
        let all = [failed, reach].concat();
        let n: Vec<Neighbour> = messages(&all).filter_map(|(_, p)| parse_neigh(p)).collect();
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].dst, "10.0.1.3".parse::<IpAddr>().unwrap());
        assert!(n[0].failed() && !n[0].incomplete());
        assert_eq!((n[0].lladdr.as_deref(), n[0].probes), (None, Some(3)));
        assert_eq!(n[1].lladdr.as_deref(), Some("02:00:00:00:00:1f"));
        assert!(n[1].router);
        assert_eq!(n[1].state_text(), "REACHABLE");
        assert_eq!(state_names(0), vec!["NONE"]);
        assert_eq!(
            state_names(NUD_NOARP | NUD_PERMANENT),
            vec!["NOARP", "PERMANENT"]
        );
        assert_eq!(lookup(&n, 3, "10.0.1.3".parse().unwrap()), Some(&n[0]));
        assert_eq!(lookup(&n, 2, "10.0.1.3".parse().unwrap()), None);
        assert_eq!(
            with_lladdr(n.clone(), 2, &[2, 0, 0, 0, 0, 0x1f]),
            [n[1].clone()]
        );
        assert_eq!(with_lladdr(n.clone(), 3, &[2, 0, 0, 0, 0, 0x1f]), []);
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 29 + 3) as u8).collect();
            let _ = parse_neigh(&junk);
            let mut j = junk.clone();
            if let Some(f) = j.first_mut() {
                *f = AF_INET;
            }
            let _ = parse_neigh(&j);
        }
        // No NDA_DST: not an entry.
        let m = msg(28, &ndmsg(AF_INET, 1, NUD_STALE, 0), &[]);
        assert_eq!(parse_neigh(messages(&m).next().unwrap().1), None);
    }

    #[test]
    fn dumps_this_namespace() {
        assert!(dump().is_ok());
    }
}
