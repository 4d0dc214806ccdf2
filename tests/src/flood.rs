//! Floods for the accounting and torture tests: SYNs from a `Pair`'s client
//! to a port its server drops with an iptables rule, whose counter is the
//! count kdrop's must equal.
use std::time::Duration;

use crate::Pair;

/// The MACs `Pair::new` gives its veth ends.
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const SERVER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

impl Pair {
    /// Makes the server drop every SYN to `port` (iptables, filter INPUT).
    pub fn drop_syns_to(&self, port: u16) {
        self.server
            .exec(
                "iptables",
                &[
                    "-w",
                    "-A",
                    "INPUT",
                    "-p",
                    "tcp",
                    "--syn",
                    "--dport",
                    &port.to_string(),
                    "-j",
                    "DROP",
                ],
            )
            .expect("adding the DROP rule");
    }

    /// Packets the server's DROP rule has counted.
    pub fn dropped(&self) -> u64 {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.server.name])
            .args(["iptables", "-w", "-nvxL", "INPUT"])
            .output()
            .expect("running iptables");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find(|l| l.contains("DROP"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no DROP counter in {text}"))
    }

    /// A SYN flood from the client to the server's `port`, stopping after
    /// `count` packets or `duration`, whichever comes first.
    pub fn flood(&self, port: u16, count: u64, duration: Duration) -> synflood::Sent {
        let net = self.net;
        let f = synflood::Flood {
            ifname: "c0".into(),
            src_mac: CLIENT_MAC,
            dst_mac: SERVER_MAC,
            src: std::net::Ipv4Addr::new(10, net, 0, 1),
            dst: std::net::Ipv4Addr::new(10, net, 0, 2),
            dport: port,
            sport_base: 1024,
            sport_span: 60000,
            count,
            duration,
            cpu: None,
        };
        f.run_in(&self.client.path()).expect("flooding")
    }
}
