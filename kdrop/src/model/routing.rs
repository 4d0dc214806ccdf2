//! A namespace's routing state as netlink reports it: links, addresses,
//! routes, policy rules, and the IPv4 conf sysctls that decide reverse-path
//! and martian drops. Plain data: `context` fills it, `diagnosis` reads it.
use std::{collections::HashMap, net::IpAddr};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub master: Option<u32>,
    /// `veth`, `bridge`, `dummy`, ... (IFLA_INFO_KIND).
    pub kind: Option<String>,
    pub up: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addr {
    pub index: u32,
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub label: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
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

#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub links: Vec<Link>,
    pub addrs: Vec<Addr>,
    pub routes: Vec<Route>,
    pub rules: Vec<Rule>,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conf {
    pub rp_filter: Option<u32>,
    pub src_valid_mark: Option<u32>,
    pub accept_local: Option<u32>,
    pub route_localnet: Option<u32>,
}

/// conf/all and every interface's conf in one namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Confs {
    pub all: Conf,
    pub devs: HashMap<String, Conf>,
    /// net.bridge.bridge-nf-call-iptables (absent without br_netfilter).
    pub bridge_nf_call_iptables: Option<u32>,
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetnsContext {
    pub tables: Tables,
    pub confs: Confs,
    /// Changes whenever anything above is read again.
    pub generation: u64,
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
