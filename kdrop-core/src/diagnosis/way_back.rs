//! The next hop of a repair route back to a client through the device its
//! packet came in by. A reverse-path repair routes the client's address out
//! of the input device; an on-link route (`dev <iif>` alone) is right only
//! for a client on that link. For one behind a router the node would
//! resolve the client's own address there and nobody answers: Linux answers
//! ARP and neighbour solicitations only for its own addresses, proxy ARP/NDP
//! aside (`arp_process`,
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/arp.c; `ndisc_recv_ns`,
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv6/ndisc.c), so the
//! route needs `via <router>`.
//!
//! Who sent the packet is knowable: its Ethernet source address (copied in
//! the kernel for drop records) is a neighbour entry on the input device,
//! left there when that host resolved the node's own address to send to it
//! (`arp_process` calls `neigh_event_ns` for the requester; `ndisc_recv_ns`
//! creates a STALE entry for the solicitor, whose solicitation for a
//! packet it forwards comes from its link-local address: `ndisc_send_ns`
//! without a source takes it, same files). Checked on 6.18 in the tests'
//! namespaces. Pure: the MAC, the entries and the tables in, the next hop
//! and why out.
use std::net::IpAddr;

use super::{netfilter::matching::in_prefix, routes::RT_TABLE_LOCAL};
use crate::model::{
    neighbour::Neighbour,
    packet::mac_text,
    routing::{Route, Tables, RTN_UNICAST},
};

/// Who handed the dropped packet to the node.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sender<'a> {
    /// The Ethernet source address it arrived with, if it had one.
    pub mac: Option<[u8; 6]>,
    /// The input device's neighbour entries with that address; None when
    /// they could not be read (or there was no MAC to look for).
    pub neighbours: Option<&'a [Neighbour]>,
}

/// The next hop the repair route needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hop {
    /// The client is on the input device's link: `dev <iif>` alone.
    OnLink,
    /// Through a router on that link; `onlink` when its address is outside
    /// every prefix of the device: the kernel refuses such a gateway
    /// without the flag ("Nexthop has invalid gateway"; `fib_check_nh`,
    /// https://github.com/torvalds/linux/blob/v6.18/net/ipv4/fib_semantics.c;
    /// `ip6_validate_gw`,
    /// https://github.com/torvalds/linux/blob/v6.18/net/ipv6/route.c; both
    /// checked with `ip route add` on 6.18), an IPv6 link-local one excepted.
    Via { gw: IpAddr, onlink: bool },
    /// kdrop cannot tell: the route goes to `fix_notes`, not `fix`.
    Unknown,
}

/// The next hop and the evidence line that says how it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WayBack {
    pub hop: Hop,
    pub evidence: String,
}

impl WayBack {
    /// ` via G dev IIF[ onlink]` or ` dev IIF`: the part of an `ip route
    /// add` after the destination; None when the hop is unknown.
    pub fn route_args(&self, iif: &str) -> Option<String> {
        match &self.hop {
            Hop::OnLink => Some(format!(" dev {iif}")),
            Hop::Via { gw, onlink } => Some(format!(
                " via {gw} dev {iif}{}",
                if *onlink { " onlink" } else { "" }
            )),
            Hop::Unknown => None,
        }
    }

    /// The repair route's command (`route` writes it around ` via G dev
    /// IIF`) when the hop is known; else, for the notes, its two shapes and
    /// where to find the router (`neigh`: the command listing neighbours).
    pub fn command(
        &self,
        iif: &str,
        route: impl Fn(&str) -> String,
        neigh: &str,
    ) -> Result<String, String> {
        match self.route_args(iif) {
            Some(args) => Ok(route(&args)),
            None => Err(format!(
                "kdrop could not see the next hop (evidence above): behind a router on {iif}, \
                 `{}` with the router the client's packets come from (`{neigh}`); only if the \
                 client is on {iif}'s link, `{}`",
                route(&format!(" via <router> dev {iif}")),
                route(&format!(" dev {iif}"))
            )),
        }
    }
}

/// The next hop back to `client` through device `iif`: from the neighbour
/// the packet came from; else from the node's own route to the client
/// through `iif` when it names a gateway (in its tables, else `asked`: the
/// gateway of the kernel's answer for a route to the client out of `iif`);
/// else on-link when the client is inside a prefix of an address of `iif`;
/// else unknown.
pub fn decide(
    client: IpAddr,
    iif: u32,
    sender: &Sender,
    asked: Option<IpAddr>,
    t: &Tables,
) -> WayBack {
    let dev = t.link_name(iif);
    let unseen = match from_sender(client, iif, sender, t, &dev) {
        Ok(w) => return w,
        Err(unseen) => unseen,
    };
    if let Some(gw) = own_gateway(t, client, iif).or(asked) {
        return WayBack {
            // The node already routes through it on this device: the
            // kernel took it as a gateway there.
            hop: Hop::Via { gw, onlink: false },
            evidence: format!(
                "{unseen}; the node's own route to {client} through {dev} goes via {gw}"
            ),
        };
    }
    if let Some(prefix) = connected_prefix(t, iif, client) {
        return WayBack {
            hop: Hop::OnLink,
            evidence: format!(
                "{unseen}; {client} is inside {dev}'s prefix {prefix}: on {dev}'s link"
            ),
        };
    }
    WayBack {
        hop: Hop::Unknown,
        evidence: format!(
            "{unseen}, and {client} is outside every prefix of {dev}: kdrop cannot tell whether \
             it is on {dev}'s link or behind a router there"
        ),
    }
}

/// The hop the sender's neighbour entry gives, or why it gives none.
fn from_sender(
    client: IpAddr,
    iif: u32,
    s: &Sender,
    t: &Tables,
    dev: &str,
) -> Result<WayBack, String> {
    let Some(mac) = s.mac else {
        return Err("the drop carried no source MAC".into());
    };
    let mac = mac_text(&mac);
    let Some(entries) = s.neighbours else {
        return Err(format!(
            "the packet came from {mac}, but {dev}'s neighbour table could not be read"
        ));
    };
    let same: Vec<&Neighbour> = entries
        .iter()
        .filter(|n| {
            n.ifindex == iif
                && n.lladdr.as_deref() == Some(mac.as_str())
                && n.dst.is_ipv4() == client.is_ipv4()
        })
        .collect();
    if same.iter().any(|n| n.dst == client) {
        return Ok(WayBack {
            hop: Hop::OnLink,
            evidence: format!(
                "the packet came from {mac} = {client} on {dev}: the client itself, on {dev}'s \
                 link"
            ),
        });
    }
    let Some(router) = pick_router(&same, t, iif) else {
        return Err(format!(
            "the packet came from {mac}, which no {} neighbour entry on {dev} has",
            if client.is_ipv4() { "IPv4" } else { "IPv6" }
        ));
    };
    Ok(WayBack {
        hop: Hop::Via {
            gw: router.dst,
            onlink: !router_reachable(t, iif, router.dst),
        },
        evidence: format!(
            "the packet came from {mac} = {} on {dev} ({}), a router: the client is not on \
             {dev}'s link",
            router.dst,
            router.state_text()
        ),
    })
}

/// The address to route through among the sender's entries: one inside a
/// prefix of the device first (the kernel takes it as a gateway as it
/// is), then an IPv6 link-local one (always on the link named with `dev`),
/// then any.
fn pick_router<'a>(same: &[&'a Neighbour], t: &Tables, iif: u32) -> Option<&'a Neighbour> {
    let link_local =
        |a: &IpAddr| matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
    same.iter()
        .find(|n| !link_local(&n.dst) && connected(t, iif, n.dst))
        .or_else(|| same.iter().find(|n| link_local(&n.dst)))
        .or_else(|| same.first())
        .copied()
}

/// Does the kernel accept `gw` as a gateway on `iif` without `onlink`: an
/// IPv6 link-local address, or one inside a prefix of the device.
fn router_reachable(t: &Tables, iif: u32, gw: IpAddr) -> bool {
    matches!(gw, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80) || connected(t, iif, gw)
}

fn connected(t: &Tables, iif: u32, a: IpAddr) -> bool {
    connected_prefix(t, iif, a).is_some()
}

/// `10.231.2.0/24`: the prefix of an address of device `iif` that holds
/// `a`, if any.
fn connected_prefix(t: &Tables, iif: u32, a: IpAddr) -> Option<String> {
    let host = |x: &IpAddr| if x.is_ipv4() { 32 } else { 128 };
    t.addrs
        .iter()
        .filter(|x| x.index == iif && x.addr.is_ipv4() == a.is_ipv4())
        // A host address (/32, /128) is the node's own, no link's prefix.
        .filter(|x| x.prefix_len < host(&x.addr))
        .find(|x| in_prefix(a, x.addr, x.prefix_len) == Some(true))
        .map(|x| format!("{}/{}", network(x.addr, x.prefix_len), x.prefix_len))
}

fn network(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(v4) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// The node's own route towards `client` that can leave by `iif` (the
/// longest prefix among the unicast routes of every table that use it):
/// `Some(gateway)`, `Some(None)` for on-link, `None` when there is none.
pub fn own_route(t: &Tables, client: IpAddr, iif: u32) -> Option<Option<IpAddr>> {
    let routes: &[Route] = if client.is_ipv4() {
        &t.routes
    } else {
        &t.routes6
    };
    routes
        .iter()
        .filter(|r| r.table != RT_TABLE_LOCAL && r.kind == RTN_UNICAST)
        .filter(|r| r.oif == Some(iif) || r.nexthops.iter().any(|(o, _)| *o == iif))
        .filter(|r| match r.dst {
            None => r.dst_len == 0,
            Some(net) => in_prefix(client, net, r.dst_len) == Some(true),
        })
        .max_by(|a, b| a.dst_len.cmp(&b.dst_len).then(b.priority.cmp(&a.priority)))
        .map(|r| {
            r.nexthops
                .iter()
                .find(|(o, _)| *o == iif)
                .map_or(r.gateway, |(_, g)| *g)
        })
}

/// The gateway of the node's own route to `client` through `iif`, if it
/// has one (an on-link own route says nothing kdrop could check).
fn own_gateway(t: &Tables, client: IpAddr, iif: u32) -> Option<IpAddr> {
    own_route(t, client, iif).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        neighbour::{NUD_PERMANENT, NUD_STALE},
        routing::{Addr, Link},
    };

    const MAC: [u8; 6] = [2, 0, 0, 0, 0xe7, 3];

    fn tables() -> Tables {
        let link = |index, name: &str| Link {
            index,
            name: name.into(),
            master: None,
            kind: Some("veth".into()),
            up: true,
        };
        let addr = |index, a: &str, prefix_len| Addr {
            index,
            addr: a.parse().unwrap(),
            prefix_len,
            label: None,
        };
        Tables {
            links: vec![link(1, "lo"), link(2, "eth0"), link(3, "eth1")],
            addrs: vec![
                addr(2, "10.231.1.2", 24),
                addr(3, "10.231.2.2", 24),
                addr(3, "10.231.9.9", 32),
                addr(3, "fd00:231:2::2", 64),
                addr(3, "fe80::e7:4", 64),
            ],
            ..Tables::default()
        }
    }

    fn neigh(dst: &str, ifindex: u32, mac: &str, state: u16) -> Neighbour {
        Neighbour {
            dst: dst.parse().unwrap(),
            ifindex,
            dev: "eth1".into(),
            state,
            lladdr: Some(mac.into()),
            router: false,
            probes: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sender(n: &[Neighbour]) -> Sender<'_> {
        Sender {
            mac: Some(MAC),
            neighbours: Some(n),
        }
    }

    #[test]
    fn a_router_neighbour_gives_the_gateway() {
        let t = tables();
        let n = [
            // Another host on the link, and the router on eth0: not it.
            neigh("10.231.2.7", 3, "02:00:00:00:e7:07", NUD_STALE),
            neigh("10.231.1.3", 2, "02:00:00:00:e7:03", NUD_STALE),
            neigh("10.231.2.1", 3, "02:00:00:00:e7:03", NUD_STALE),
        ];
        let w = decide(ip("10.232.0.2"), 3, &sender(&n), None, &t);
        assert_eq!(
            w.hop,
            Hop::Via {
                gw: ip("10.231.2.1"),
                onlink: false
            }
        );
        assert_eq!(
            w.evidence,
            "the packet came from 02:00:00:00:e7:03 = 10.231.2.1 on eth1 (STALE), a router: the \
             client is not on eth1's link"
        );
        assert_eq!(
            w.route_args("eth1").as_deref(),
            Some(" via 10.231.2.1 dev eth1")
        );
    }

    /// IPv6: the router's address in the link's prefix first, its
    /// link-local one otherwise; IPv4 entries of the same MAC do not count.
    #[test]
    fn an_ipv6_router_is_named_by_the_address_the_kernel_takes() {
        let t = tables();
        let mac = "02:00:00:00:e7:03";
        let ll = neigh("fe80::e7:3", 3, mac, NUD_STALE);
        let global = neigh("fd00:231:2::1", 3, mac, NUD_STALE);
        let v4 = neigh("10.231.2.1", 3, mac, NUD_STALE);
        let client = ip("fd00:232::2");
        let n = [v4.clone(), ll.clone(), global];
        let w = decide(client, 3, &sender(&n), None, &t);
        assert_eq!(
            w.route_args("eth1").as_deref(),
            Some(" via fd00:231:2::1 dev eth1")
        );
        let n = [v4, ll];
        let w = decide(client, 3, &sender(&n), None, &t);
        assert_eq!(
            w.route_args("eth1").as_deref(),
            Some(" via fe80::e7:3 dev eth1")
        );
        // A router known only by an address outside eth1's prefixes: the
        // kernel takes it as a gateway only with `onlink`.
        let n = [neigh("10.77.0.1", 3, mac, NUD_STALE)];
        let w = decide(ip("10.232.0.2"), 3, &sender(&n), None, &t);
        assert_eq!(
            w.route_args("eth1").as_deref(),
            Some(" via 10.77.0.1 dev eth1 onlink")
        );
    }

    #[test]
    fn the_client_as_the_neighbour_is_on_the_link() {
        let t = tables();
        // Outside eth1's prefixes, but its own entry has the packet's MAC.
        let n = [
            neigh("fd00:61:9::1", 3, "02:00:00:00:e7:03", NUD_PERMANENT),
            neigh("fe80::e7:3", 3, "02:00:00:00:e7:03", NUD_STALE),
        ];
        let w = decide(ip("fd00:61:9::1"), 3, &sender(&n), None, &t);
        assert_eq!(w.hop, Hop::OnLink);
        assert_eq!(
            w.evidence,
            "the packet came from 02:00:00:00:e7:03 = fd00:61:9::1 on eth1: the client itself, \
             on eth1's link"
        );
        assert_eq!(w.route_args("eth1").as_deref(), Some(" dev eth1"));
    }

    /// Without the neighbour: on-link only inside a prefix of the device
    /// (never its host addresses), else unknown, saying what was missing.
    #[test]
    fn unknown_without_the_neighbour_unless_the_prefix_says() {
        let t = tables();
        let none = Sender::default();
        let w = decide(ip("10.231.2.50"), 3, &none, None, &t);
        assert_eq!(w.hop, Hop::OnLink);
        assert_eq!(
            w.evidence,
            "the drop carried no source MAC; 10.231.2.50 is inside eth1's prefix 10.231.2.0/24: \
             on eth1's link"
        );
        let w = decide(ip("10.232.0.2"), 3, &none, None, &t);
        assert_eq!(w.hop, Hop::Unknown);
        assert_eq!(w.route_args("eth1"), None);
        assert_eq!(
            w.evidence,
            "the drop carried no source MAC, and 10.232.0.2 is outside every prefix of eth1: \
             kdrop cannot tell whether it is on eth1's link or behind a router there"
        );
        assert_eq!(
            decide(ip("10.231.9.9"), 3, &none, None, &t).hop,
            Hop::Unknown
        );
        // A MAC no entry has (the router resolved the node statically).
        let other = [neigh("10.231.2.1", 3, "02:00:00:00:e7:99", NUD_STALE)];
        let w = decide(ip("10.232.0.2"), 3, &sender(&other), None, &t);
        assert_eq!(w.hop, Hop::Unknown);
        assert!(
            w.evidence.starts_with(
                "the packet came from 02:00:00:00:e7:03, which no IPv4 neighbour entry on eth1 \
                 has, and"
            ),
            "{}",
            w.evidence
        );
        let unread = Sender {
            mac: Some(MAC),
            neighbours: None,
        };
        assert!(decide(ip("fd00:232::2"), 3, &unread, None, &t)
            .evidence
            .starts_with(
            "the packet came from 02:00:00:00:e7:03, but eth1's neighbour table could not be read"
        ));
    }

    /// The node's own route through the device, when it names a gateway,
    /// stands in for a neighbour kdrop did not see.
    #[test]
    fn the_nodes_own_gateway_through_the_device_stands_in() {
        let mut t = tables();
        t.routes.push(Route {
            table: 2,
            family: 2,
            dst: None,
            dst_len: 0,
            kind: RTN_UNICAST,
            scope: 0,
            oif: Some(3),
            gateway: Some(ip("10.231.2.1")),
            prefsrc: None,
            priority: 0,
            nexthops: vec![],
        });
        let w = decide(ip("10.232.0.2"), 3, &Sender::default(), None, &t);
        assert_eq!(
            w.route_args("eth1").as_deref(),
            Some(" via 10.231.2.1 dev eth1")
        );
        assert_eq!(
            w.evidence,
            "the drop carried no source MAC; the node's own route to 10.232.0.2 through eth1 \
             goes via 10.231.2.1"
        );
    }
}
