//! Incident 1 (../shared/INCIDENTS.md, seeds/000): strict rp_filter drops a
//! SYN that arrives on a secondary interface because the reverse-path lookup
//! for the client goes out of the primary one.
//!
//! ```text
//!  client ns                       node ns                        vpc ns
//!  c0 <client_ip>, <sec_gw> ---veth--- eth1 (secondary) <pod_ip>
//!                                      eth0 (primary) ---veth--- gw (default route)
//! ```
//! As on an EKS node with several ENIs: table 2 routes out of eth1 (default
//! via the secondary subnet's gateway), `from <pod_ip> lookup 2` (1536),
//! `fwmark 0x80/0x80 lookup main` (1024), CONNMARK restoring the mark in
//! mangle PREROUTING, src_valid_mark=1, rp_filter=1. The client's SYN to the
//! pod carries mark 0x80 (the CNI's NodePort marking also matches it), so the
//! reverse lookup takes rule 1024 to main, whose way back is eth0: dropped.
use std::net::Ipv4Addr;

use anyhow::Result;

use super::netlab::{veth, Ns};

#[derive(Clone, Debug)]
pub struct RpFilter {
    /// Namespace names start with this.
    pub prefix: String,
    pub client_ip: Ipv4Addr,
    pub pod_ip: Ipv4Addr,
    pub port: u16,
    /// Node address on the primary network (/24); the gateway is `.1`.
    pub node_primary: Ipv4Addr,
    /// Node address on the secondary network (/24); its gateway, `.1`, is
    /// the client side (the load balancer's subnet).
    pub node_secondary: Ipv4Addr,
    pub primary_if: String,
    pub secondary_if: String,
}

impl RpFilter {
    /// The built-in lab's addresses (documentation and private ranges, inside
    /// namespaces only).
    pub fn lab(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            client_ip: Ipv4Addr::new(198, 51, 100, 7),
            pod_ip: Ipv4Addr::new(10, 0, 2, 20),
            port: 8080,
            node_primary: Ipv4Addr::new(10, 0, 1, 10),
            node_secondary: Ipv4Addr::new(10, 0, 2, 10),
            primary_if: "eth0".into(),
            secondary_if: "eth1".into(),
        }
    }

    pub fn build(&self) -> Result<RpFilterLab> {
        let lab = RpFilterLab {
            client: Ns::new(&format!("{}client", self.prefix))?,
            node: Ns::new(&format!("{}node", self.prefix))?,
            vpc: Ns::new(&format!("{}vpc", self.prefix))?,
        };
        let (client, node, vpc) = (&lab.client, &lab.node, &lab.vpc);
        let (pri, sec) = (self.primary_if.as_str(), self.secondary_if.as_str());
        let gw = with_last(self.node_primary, 1);
        let sec_gw = with_last(self.node_secondary, 1);
        let node_sec_mac = "02:6b:64:00:00:02";

        veth(
            node,
            pri,
            "02:6b:64:00:00:01",
            vpc,
            "gw",
            "02:6b:64:00:00:11",
        )?;
        veth(node, sec, node_sec_mac, client, "c0", "02:6b:64:00:00:12")?;

        vpc.ip(&["addr", "add", &format!("{gw}/24"), "dev", "gw"])?;
        node.ip(&[
            "addr",
            "add",
            &format!("{}/24", self.node_primary),
            "dev",
            pri,
        ])?;
        node.ip(&[
            "addr",
            "add",
            &format!("{}/24", self.node_secondary),
            "dev",
            sec,
        ])?;
        node.ip(&["addr", "add", &format!("{}/32", self.pod_ip), "dev", sec])?;
        node.ip(&[
            "route",
            "add",
            "default",
            "via",
            &gw.to_string(),
            "dev",
            pri,
        ])?;
        // The secondary ENI's table and the CNI's rules.
        node.ip(&[
            "route",
            "add",
            "default",
            "via",
            &sec_gw.to_string(),
            "dev",
            sec,
            "table",
            "2",
        ])?;
        node.ip(&[
            "rule",
            "add",
            "fwmark",
            "0x80/0x80",
            "lookup",
            "main",
            "priority",
            "1024",
        ])?;
        let pod = self.pod_ip.to_string();
        node.ip(&[
            "rule", "add", "from", &pod, "lookup", "2", "priority", "1536",
        ])?;
        let port = self.port.to_string();
        node.exec(
            "iptables",
            &[
                "-t",
                "mangle",
                "-A",
                "PREROUTING",
                "-i",
                sec,
                "-p",
                "tcp",
                "--dport",
                &port,
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
                "-j",
                "CONNMARK",
                "--set-xmark",
                "0x80/0x80",
            ],
        )?;
        node.exec(
            "iptables",
            &[
                "-t",
                "mangle",
                "-A",
                "PREROUTING",
                "-j",
                "CONNMARK",
                "--restore-mark",
                "--nfmask",
                "0x80",
                "--ctmask",
                "0x80",
            ],
        )?;

        client.ip(&["addr", "add", &format!("{sec_gw}/24"), "dev", "c0"])?;
        client.ip(&[
            "addr",
            "add",
            &format!("{}/32", self.client_ip),
            "dev",
            "c0",
        ])?;
        // Connections to the pod come from the client address, as through a
        // load balancer preserving client IPs.
        let src = self.client_ip.to_string();
        client.ip(&["route", "add", &pod, "dev", "c0", "src", &src])?;
        // The node would ignore the client's ARP for the same reason it drops
        // the SYN (rp_filter applies to ARP): pin the neighbour instead.
        client.ip(&[
            "neigh",
            "replace",
            &pod,
            "lladdr",
            node_sec_mac,
            "dev",
            "c0",
            "nud",
            "permanent",
        ])?;

        node.sysctl("net/ipv4/conf/all/rp_filter", "1")?;
        node.sysctl(&format!("net/ipv4/conf/{sec}/rp_filter"), "1")?;
        node.sysctl("net/ipv4/conf/all/src_valid_mark", "1")?;
        Ok(lab)
    }
}

fn with_last(a: Ipv4Addr, last: u8) -> Ipv4Addr {
    let [x, y, z, _] = a.octets();
    Ipv4Addr::new(x, y, z, last)
}

/// The built namespaces; dropping it tears everything down.
pub struct RpFilterLab {
    pub client: Ns,
    pub node: Ns,
    pub vpc: Ns,
}
