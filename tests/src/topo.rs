//! Namespaces a test owns: unique names and a client/server pair.
use std::net::SocketAddr;

use crate::*;

/// A namespace name unique to this test process and test.
pub fn ns_name(test: &str) -> String {
    format!("kdt{}-{test}", std::process::id())
}

/// The namespace of `role` in `test` (`node`, `a`, ...).
pub fn role_ns(test: &str, role: &str) -> Ns {
    Ns::new(&ns_name(&format!("{test}-{role}"))).unwrap()
}

/// `ip -6 ARGS` (split on spaces) in `ns`.
pub fn ip6(ns: &Ns, args: &str) {
    let mut a = vec!["-6"];
    a.extend(args.split(' '));
    ns.ip(&a).unwrap_or_else(|e| panic!("ip {args}: {e:#}"));
}

/// Pods on the node's bridge cni0 (`net`.1/24, `net` the first three
/// octets), each behind a veth (pod side eth0 with MAC
/// 02:00:00:00:`mac`:<last>, node side veth<last> with 02:00:00:00:`mac`+1:<last>,
/// a port of cni0), at `net`.<last>/24 with the bridge as default gateway.
pub fn pods_on_bridge(node: &Ns, net: &str, pods: &[(&Ns, u8)], mac: u8) {
    node.ip(&["link", "add", "cni0", "type", "bridge"]).unwrap();
    node.ip(&["link", "set", "cni0", "up"]).unwrap();
    node.ip(&["addr", "add", &format!("{net}.1/24"), "dev", "cni0"])
        .unwrap();
    for (pod, last) in pods {
        let port = format!("veth{last}");
        veth(
            pod,
            "eth0",
            &format!("02:00:00:00:{mac:02x}:{last:02x}"),
            node,
            &port,
            &format!("02:00:00:00:{:02x}:{last:02x}", mac + 1),
        )
        .unwrap();
        node.ip(&["link", "set", &port, "master", "cni0"]).unwrap();
        pod.ip(&["addr", "add", &format!("{net}.{last}/24"), "dev", "eth0"])
            .unwrap();
        pod.ip(&["route", "add", "default", "via", &format!("{net}.1")])
            .unwrap();
    }
}

/// Pair's addressing on c0 and s0: IPv4 10.<net>.0.1/.2 and IPv6
/// fd00:<net>::1/::2 (no DAD, so the addresses are usable at once).
pub fn pair_addresses(client: &Ns, server: &Ns, net: u8) {
    for (ns, dev, last) in [(client, "c0", 1), (server, "s0", 2)] {
        ns.ip(&["addr", "add", &format!("10.{net}.0.{last}/24"), "dev", dev])
            .unwrap();
        ns.ip(&[
            "addr",
            "add",
            &format!("fd00:{net}::{last}/64"),
            "dev",
            dev,
            "nodad",
        ])
        .unwrap();
    }
}

/// Two namespaces joined by a veth: `client` (c0) and `server` (s0), with
/// IPv4 10.<net>.0.1/.2 and IPv6 fd00:<net>::1/::2.
pub struct Pair {
    pub client: Ns,
    pub server: Ns,
    pub net: u8,
}

impl Pair {
    pub fn new(test: &str, net: u8) -> Self {
        let client = Ns::new(&ns_name(&format!("{test}-c"))).unwrap();
        let server = Ns::new(&ns_name(&format!("{test}-s"))).unwrap();
        veth(
            &client,
            "c0",
            "02:00:00:00:00:01",
            &server,
            "s0",
            "02:00:00:00:00:02",
        )
        .unwrap();
        pair_addresses(&client, &server, net);
        Pair {
            client,
            server,
            net,
        }
    }

    pub fn client_v4(&self, port: u16) -> SocketAddr {
        format!("10.{}.0.1:{port}", self.net).parse().unwrap()
    }

    pub fn server_v4(&self, port: u16) -> SocketAddr {
        format!("10.{}.0.2:{port}", self.net).parse().unwrap()
    }

    pub fn client_v6(&self, port: u16) -> SocketAddr {
        format!("[fd00:{}::1]:{port}", self.net).parse().unwrap()
    }

    pub fn server_v6(&self, port: u16) -> SocketAddr {
        format!("[fd00:{}::2]:{port}", self.net).parse().unwrap()
    }
}
