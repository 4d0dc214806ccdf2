//! A namespace's routing state as netlink reports it: links, addresses,
//! routes, policy rules, and the IPv4 conf sysctls that decide reverse-path
//! and martian drops. Plain data: `context` fills it, `diagnosis` reads it.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub master: Option<u32>,
    /// `veth`, `bridge`, `dummy`, ... (IFLA_INFO_KIND).
    pub kind: Option<String>,
    pub up: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Addr {
    pub index: u32,
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub label: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub table: u32,
    pub family: u8,
    pub dst: Option<IpAddr>,
    pub dst_len: u8,
    /// RTN_UNICAST = 1, RTN_LOCAL = 2, RTN_BROADCAST = 3, RTN_BLACKHOLE = 6,
    /// RTN_UNREACHABLE = 7, RTN_PROHIBIT = 8, ...
    pub kind: u8,
    pub scope: u8,
    pub oif: Option<u32>,
    pub gateway: Option<IpAddr>,
    pub prefsrc: Option<IpAddr>,
    pub priority: u32,
    /// Next hops of a multipath route: (oif, gateway).
    pub nexthops: Vec<(u32, Option<IpAddr>)>,
}

pub const RTN_UNICAST: u8 = 1;
pub const RTN_LOCAL: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub family: u8,
    pub priority: u32,
    pub table: u32,
    /// FR_ACT_TO_TBL = 1, GOTO = 2, NOP = 3, BLACKHOLE = 6, UNREACHABLE = 7, PROHIBIT = 8.
    pub action: u8,
    pub src: Option<(IpAddr, u8)>,
    pub dst: Option<(IpAddr, u8)>,
    pub fwmark: Option<u32>,
    pub fwmask: Option<u32>,
    pub iifname: Option<String>,
    pub oifname: Option<String>,
    pub invert: bool,
    pub goto: Option<u32>,
}

pub const FR_ACT_TO_TBL: u8 = 1;

/// Everything routing-related in one namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tables {
    pub links: Vec<Link>,
    /// IPv4 and IPv6 addresses (compare with an address of the same family).
    pub addrs: Vec<Addr>,
    /// IPv4 routes.
    pub routes: Vec<Route>,
    /// IPv4 policy rules.
    pub rules: Vec<Rule>,
    /// IPv6 policy rules (`ip -6 rule`): the IPv6 reverse-path evidence.
    pub rules6: Vec<Rule>,
    /// IPv6 routes of every table (`ip -6 route show table all`).
    pub routes6: Vec<Route>,
}

impl Tables {
    pub fn link(&self, index: u32) -> Option<&Link> {
        self.links.iter().find(|l| l.index == index)
    }

    pub fn link_name(&self, index: u32) -> String {
        self.link(index)
            .map_or_else(|| format!("if{index}"), |l| l.name.clone())
    }
}

/// Values of net.ipv4.conf.<dev>.* (None: not readable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conf {
    pub rp_filter: Option<u32>,
    pub src_valid_mark: Option<u32>,
    pub accept_local: Option<u32>,
    pub route_localnet: Option<u32>,
}

/// conf/all and every interface's conf in one namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confs {
    pub all: Conf,
    pub devs: HashMap<String, Conf>,
    /// net.bridge.bridge-nf-call-iptables (absent without br_netfilter).
    pub bridge_nf_call_iptables: Option<u32>,
    /// net.bridge.bridge-nf-call-ip6tables: the same switch for IPv6.
    pub bridge_nf_call_ip6tables: Option<u32>,
}

impl Confs {
    pub fn dev(&self, dev: &str) -> Conf {
        self.devs.get(dev).copied().unwrap_or_default()
    }

    /// rp_filter in force on `dev`: the kernel takes max(all, dev)
    /// (IN_DEV_MAXCONF, include/linux/inetdevice.h).
    pub fn rp_filter(&self, dev: &str) -> u32 {
        self.all
            .rp_filter
            .unwrap_or(0)
            .max(self.dev(dev).rp_filter.unwrap_or(0))
    }

    /// Boolean settings are all || dev (IN_DEV_ORCONF): src_valid_mark,
    /// accept_local, route_localnet.
    pub fn or(&self, dev: &str, get: impl Fn(&Conf) -> Option<u32>) -> bool {
        get(&self.all).unwrap_or(0) != 0 || get(&self.dev(dev)).unwrap_or(0) != 0
    }
}

/// A namespace's routing state at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetnsContext {
    pub tables: Tables,
    pub confs: Confs,
    /// Changes whenever anything above is read again.
    pub generation: u64,
}

// The kernel's answer to a route query (context::route_query), as `ip
// route get` asks it.

/// One RTM_GETROUTE request. `None` fields are left out of the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteQuery {
    pub dst: IpAddr,
    pub src: Option<IpAddr>,
    /// Input interface: the kernel then routes a packet arriving there (the
    /// input path, with its own source validation), not a lookup from lo.
    pub iif: Option<u32>,
    pub oif: Option<u32>,
    pub mark: Option<u32>,
    /// The TOS byte (DSCP << 2).
    pub tos: u8,
    pub uid: Option<u32>,
    pub ip_proto: Option<u8>,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    /// RTM_F_FIB_MATCH: answer with the matching route entry.
    pub fib_match: bool,
}

/// `rtm_type` (include/uapi/linux/rtnetlink.h, RTN_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteType {
    Unspec,
    Unicast,
    Local,
    Broadcast,
    Anycast,
    Multicast,
    Blackhole,
    Unreachable,
    Prohibit,
    Throw,
    Nat,
    Xresolve,
    Other(u8),
}

/// A next hop of the matched entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteNextHop {
    pub oif: u32,
    pub gateway: Option<IpAddr>,
    /// RTNH_F_* (1 dead, 2 pervasive, 4 onlink, 8 offload, 16 linkdown).
    pub flags: u8,
}

/// The kernel's answer to a route query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteAnswer {
    pub family: u8,
    /// The table the lookup ended in (RTM_F_LOOKUP_TABLE).
    pub table: u32,
    pub kind: RouteType,
    pub scope: u8,
    /// The matched prefix with RTM_F_FIB_MATCH (None/0 for a default
    /// route); the queried address with its full length otherwise.
    pub dst: Option<IpAddr>,
    pub dst_len: u8,
    /// The result's device (one next hop), else the first next hop's.
    pub oif: Option<u32>,
    pub gateway: Option<IpAddr>,
    pub prefsrc: Option<IpAddr>,
    pub priority: Option<u32>,
    /// Every next hop of a multipath entry (empty for a single one).
    pub nexthops: Vec<RouteNextHop>,
    /// A nexthop object (`ip nexthop`), when the route uses one.
    pub nh_id: Option<u32>,
    /// rtm_flags of the answer (RTM_F_*).
    pub flags: u32,
}

/// What the kernel answered: a route, or the error its lookup returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum RouteLookup {
    Found(RouteAnswer),
    /// errno (positive), e.g. ENETUNREACH: no route; EHOSTUNREACH: an
    /// unreachable route; EACCES: prohibit; EINVAL: blackhole or bad query.
    Failed {
        errno: i32,
        name: String,
    },
}

impl RouteType {
    pub fn from_raw(t: u8) -> Self {
        use RouteType::*;
        match t {
            0 => Unspec,
            1 => Unicast,
            2 => Local,
            3 => Broadcast,
            4 => Anycast,
            5 => Multicast,
            6 => Blackhole,
            7 => Unreachable,
            8 => Prohibit,
            9 => Throw,
            10 => Nat,
            11 => Xresolve,
            n => Other(n),
        }
    }
}

impl RouteAnswer {
    /// Every device the entry can send through (all next hops), as the
    /// kernel's strict check walks them (`fib_info_nh_uses_dev`).
    pub fn devices(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.nexthops.iter().map(|n| n.oif).collect();
        if v.is_empty() {
            v.extend(self.oif);
        }
        v
    }
}

impl RouteQuery {
    /// `ip route get DST`.
    pub fn get(dst: IpAddr) -> Self {
        RouteQuery {
            dst,
            src: None,
            iif: None,
            oif: None,
            mark: None,
            tos: 0,
            uid: None,
            ip_proto: None,
            sport: None,
            dport: None,
            fib_match: false,
        }
    }

    /// The IPv4 reverse-path lookup `__fib_validate_source` makes for a
    /// packet `pkt_src -> pkt_dst` (see the module comment): the addresses
    /// swapped, from lo, with the packet's mark only when src_valid_mark is in
    /// force, and for TCP/UDP the ports swapped. `l3mdev`: the VRF master of
    /// the input device, if any (the kernel's `flowi4_l3mdev`; as oif it puts
    /// the lookup in the VRF's domain, `l3mdev_update_flow`).
    pub fn reverse_path_v4(
        pkt_src: Ipv4Addr,
        pkt_dst: Ipv4Addr,
        mark: u32,
        src_valid_mark: bool,
        tos: u8,
        l3mdev: Option<u32>,
    ) -> Self {
        RouteQuery {
            src: Some(pkt_dst.into()),
            oif: l3mdev,
            mark: Some(if src_valid_mark { mark } else { 0 }),
            tos,
            uid: Some(0),
            fib_match: true,
            ..Self::get(pkt_src.into())
        }
    }

    /// The IPv6 reverse lookup of `-m rpfilter` (strict unless `loose`) for a
    /// packet `pkt_src -> pkt_dst` that came in on `in_dev`; `mark`: the
    /// packet's mark with `--validmark`. For nft `fib saddr . iif oif` pass
    /// loose = true (no oif preference) and compare the answer with in_dev.
    pub fn reverse_path_v6(
        pkt_src: Ipv6Addr,
        pkt_dst: Ipv6Addr,
        in_dev: u32,
        mark: Option<u32>,
        loose: bool,
    ) -> Self {
        let link_local = pkt_src.segments()[0] & 0xffc0 == 0xfe80;
        let unicast_dst = !pkt_dst.is_multicast() && !pkt_dst.is_unspecified();
        RouteQuery {
            src: unicast_dst.then_some(pkt_dst.into()),
            oif: (link_local || !loose).then_some(in_dev),
            mark: Some(mark.unwrap_or(0)),
            uid: Some(0),
            fib_match: true,
            ..Self::get(pkt_src.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confs(all: u32, eth1: u32) -> Confs {
        let mut c = Confs::default();
        c.all.rp_filter = Some(all);
        c.devs.insert(
            "eth1".into(),
            Conf {
                rp_filter: Some(eth1),
                accept_local: Some(1),
                ..Conf::default()
            },
        );
        c
    }

    #[test]
    fn effective_values() {
        assert_eq!(confs(1, 0).rp_filter("eth1"), 1);
        assert_eq!(confs(0, 2).rp_filter("eth1"), 2);
        assert_eq!(confs(1, 2).rp_filter("eth1"), 2);
        assert_eq!(confs(2, 1).rp_filter("eth1"), 2);
        assert_eq!(confs(1, 0).rp_filter("unknown"), 1);
        assert!(confs(0, 0).or("eth1", |c| c.accept_local));
        assert!(!confs(0, 0).or("eth0", |c| c.accept_local));
    }
}
