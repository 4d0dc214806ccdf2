//! Per-interface IPv4 settings that decide reverse-path and martian drops,
//! read from /proc/sys as the calling thread's namespace sees them.
use std::fs;

use crate::model::routing::{Conf, Confs};

fn read_u32(path: &str) -> Option<u32> {
    fs::read_to_string(path)
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

/// net.ipv4.conf.<dev>.*
pub fn read_conf(dev: &str) -> Conf {
    let get = |key: &str| read_u32(&format!("/proc/sys/net/ipv4/conf/{dev}/{key}"));
    Conf {
        rp_filter: get("rp_filter"),
        src_valid_mark: get("src_valid_mark"),
        accept_local: get("accept_local"),
        route_localnet: get("route_localnet"),
    }
}

/// conf/all, each of `devs`, and the bridge's call-iptables switches.
pub fn read_confs<'a>(devs: impl IntoIterator<Item = &'a str>) -> Confs {
    Confs {
        all: read_conf("all"),
        devs: devs
            .into_iter()
            .map(|d| (d.to_string(), read_conf(d)))
            .collect(),
        bridge_nf_call_iptables: read_u32("/proc/sys/net/bridge/bridge-nf-call-iptables"),
        bridge_nf_call_ip6tables: read_u32("/proc/sys/net/bridge/bridge-nf-call-ip6tables"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_namespace() {
        let c = read_confs(["lo"]);
        assert!(c.all.rp_filter.is_some());
        assert!(c.dev("lo").accept_local.is_some());
    }
}
