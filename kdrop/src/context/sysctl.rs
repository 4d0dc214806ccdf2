//! Per-interface IPv4 settings that decide reverse-path and martian drops,
//! read from /proc/sys as the calling thread's namespace sees them.
use std::{collections::HashMap, fs};

/// Values of net.ipv4.conf.<dev>.* (None: not readable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conf {
    pub rp_filter: Option<u32>,
    pub src_valid_mark: Option<u32>,
    pub accept_local: Option<u32>,
    pub route_localnet: Option<u32>,
}

impl Conf {
    pub fn read(dev: &str) -> Self {
        let get = |key: &str| {
            fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{dev}/{key}"))
                .ok()
                .and_then(|v| v.trim().parse().ok())
        };
        Conf {
            rp_filter: get("rp_filter"),
            src_valid_mark: get("src_valid_mark"),
            accept_local: get("accept_local"),
            route_localnet: get("route_localnet"),
        }
    }
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
    pub fn read<'a>(devs: impl IntoIterator<Item = &'a str>) -> Self {
        Confs {
            all: Conf::read("all"),
            devs: devs
                .into_iter()
                .map(|d| (d.to_string(), Conf::read(d)))
                .collect(),
            bridge_nf_call_iptables: fs::read_to_string(
                "/proc/sys/net/bridge/bridge-nf-call-iptables",
            )
            .ok()
            .and_then(|v| v.trim().parse().ok()),
        }
    }

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

    #[test]
    fn reads_this_namespace() {
        let c = Confs::read(["lo"]);
        assert!(c.all.rp_filter.is_some());
        assert!(c.dev("lo").accept_local.is_some());
    }
}
