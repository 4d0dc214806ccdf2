//! Incident 1 (../shared/INCIDENTS.md): strict rp_filter drops a SYN that
//! arrives on a secondary interface because the way back to the client is
//! via the primary one.
//!
//! ```text
//!  client ns                  node ns                         vpc ns
//!  c0 <client_ip> ---veth--- eth1 (secondary) <pod_ip>
//!                            eth0 (primary) ------veth------ gw (default route)
//! ```
//! The client reaches the pod address on eth1 (an NLB preserving client IPs);
//! the node's route back to the client is its default route, via eth0.
use std::net::Ipv4Addr;

use anyhow::Result;

use super::netlab::{veth, Ns};

#[derive(Clone, Debug)]
pub struct RpFilter {
    /// Namespace names start with this.
    pub prefix: String,
    pub client_ip: Ipv4Addr,
    pub pod_ip: Ipv4Addr,
    /// Node address on the primary network (/24); the gateway is `.1`.
    pub node_primary: Ipv4Addr,
    /// Node address on the secondary network (/24).
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
            node_primary: Ipv4Addr::new(10, 0, 1, 10),
            node_secondary: Ipv4Addr::new(10, 0, 2, 10),
            primary_if: "eth0".into(),
            secondary_if: "eth1".into(),
        }
    }

    pub fn build(&self) -> Result<RpFilterLab> {
        let client = Ns::new(&format!("{}client", self.prefix))?;
        let node = Ns::new(&format!("{}node", self.prefix))?;
        let vpc = Ns::new(&format!("{}vpc", self.prefix))?;
        let (pri, sec) = (self.primary_if.as_str(), self.secondary_if.as_str());
        let gw = with_last(self.node_primary, 1);
        let node_sec_mac = "02:6b:64:00:00:02";

        veth(
            &node,
            pri,
            "02:6b:64:00:00:01",
            &vpc,
            "gw",
            "02:6b:64:00:00:11",
        )?;
        veth(&node, sec, node_sec_mac, &client, "c0", "02:6b:64:00:00:12")?;

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

        client.ip(&[
            "addr",
            "add",
            &format!("{}/32", self.client_ip),
            "dev",
            "c0",
        ])?;
        let pod = self.pod_ip.to_string();
        client.ip(&["route", "add", &pod, "dev", "c0", "scope", "link"])?;
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
        Ok(RpFilterLab { client, node, vpc })
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
