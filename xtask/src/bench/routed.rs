//! The healthy workloads' three namespaces: a client, a router that
//! forwards (ip_forward=1) and a server, joined by two veth pairs. Nothing
//! here drops: no filter rule, rp_filter off, static neighbour entries (no
//! ARP, so no packet waits in an unresolved queue), a wide port range and
//! TIME_WAIT reuse for the churning client, and an accept queue far deeper
//! than the client's window. Removed when the guard drops, also on error
//! and panic.
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context as _, Result};
use synflood::healthy::{self, Done, Ends};

use super::topo::sh;

/// The server's port for every workload (UDP for h1, TCP for h2 and h3):
/// not 8080, which the integration tests and labs other people run on this
/// machine use (kdrop variants without --netns would count their drops).
pub const PORT: u16 = 18080;
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 252, 1, 1);
const ROUTER_IN: Ipv4Addr = Ipv4Addr::new(10, 252, 1, 2);
const ROUTER_OUT: Ipv4Addr = Ipv4Addr::new(10, 252, 2, 1);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 252, 2, 2);

/// Interface names, each with its MAC: client side, router's two, server.
const LINKS: [(&str, [u8; 6]); 4] = [
    ("c0", [0x02, 0x6b, 0x62, 1, 0, 1]),
    ("r0", [0x02, 0x6b, 0x62, 1, 0, 2]),
    ("r1", [0x02, 0x6b, 0x62, 2, 0, 1]),
    ("s0", [0x02, 0x6b, 0x62, 2, 0, 2]),
];

fn mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A healthy workload, with its size per unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// 64-byte UDP payloads.
    Udp,
    /// Connect, write 1 byte, close.
    Churn,
    /// One TCP stream, 64 KiB writes.
    Stream,
}

pub struct Routed {
    pub client: String,
    pub router: String,
    pub server: String,
}

impl Routed {
    pub fn new() -> Result<Self> {
        super::topo::remove_stale();
        let pid = std::process::id();
        let r = Routed {
            client: format!("kdb{pid}-hclient"),
            router: format!("kdb{pid}-router"),
            server: format!("kdb{pid}-server"),
        };
        // The guard exists before the namespaces: it removes whatever of
        // them was made.
        for ns in r.all() {
            sh("ip", &["netns", "add", ns])?;
        }
        r.build().context("building client -> router -> server")?;
        Ok(r)
    }

    pub fn all(&self) -> [&str; 3] {
        [&self.client, &self.router, &self.server]
    }

    pub fn path(ns: &str) -> PathBuf {
        PathBuf::from("/run/netns").join(ns)
    }

    fn build(&self) -> Result<()> {
        let (c, r, s) = (
            self.client.as_str(),
            self.router.as_str(),
            self.server.as_str(),
        );
        let [(c0, c0m), (r0, r0m), (r1, r1m), (s0, s0m)] = LINKS;
        for (a, am, ans, b, bm, bns) in [(c0, c0m, c, r0, r0m, r), (s0, s0m, s, r1, r1m, r)] {
            sh(
                "ip",
                &[
                    "link",
                    "add",
                    a,
                    "address",
                    &mac(&am),
                    "netns",
                    ans,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    b,
                    "address",
                    &mac(&bm),
                    "netns",
                    bns,
                ],
            )?;
        }
        for (ns, dev) in [(c, c0), (r, r0), (r, r1), (s, s0)] {
            // A new namespace may copy the host's conf/all: pin what could
            // drop (rp_filter), and keep IPv6's own chatter (DAD, router
            // solicitations) off the measured links.
            sysctl(
                ns,
                &[
                    "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0",
                    &format!("net.ipv4.conf.{dev}.rp_filter=0"),
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ],
            )?;
        }
        for (ns, dev, addr) in [
            (c, c0, CLIENT_IP),
            (r, r0, ROUTER_IN),
            (r, r1, ROUTER_OUT),
            (s, s0, SERVER_IP),
        ] {
            sh(
                "ip",
                &["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev],
            )?;
            sh("ip", &["-n", ns, "link", "set", dev, "up"])?;
        }
        for ns in [c, r, s] {
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        sh(
            "ip",
            &[
                "-n",
                c,
                "route",
                "add",
                "default",
                "via",
                &ROUTER_IN.to_string(),
            ],
        )?;
        sh(
            "ip",
            &[
                "-n",
                s,
                "route",
                "add",
                "default",
                "via",
                &ROUTER_OUT.to_string(),
            ],
        )?;
        // Every neighbour known up front: no ARP, no packet queued on an
        // unresolved entry (a burst beyond its queue would be dropped).
        for (ns, dev, ip, m) in [
            (c, c0, ROUTER_IN, r0m),
            (r, r0, CLIENT_IP, c0m),
            (r, r1, SERVER_IP, s0m),
            (s, s0, ROUTER_OUT, r1m),
        ] {
            sh(
                "ip",
                &[
                    "-n",
                    ns,
                    "neigh",
                    "replace",
                    &ip.to_string(),
                    "lladdr",
                    &mac(&m),
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ],
            )?;
        }
        sysctl(r, &["net.ipv4.ip_forward=1"])?;
        // Every stream starts the same: no metrics (ssthresh, cwnd) kept
        // from the previous connection to the same address.
        for ns in [c, s] {
            sysctl(ns, &["net.ipv4.tcp_no_metrics_save=1"])?;
        }
        // The churning client closes first and keeps TIME_WAIT: reuse it
        // (1 s after its last timestamp, `tcp_twsk_unique`,
        // https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_ipv4.c)
        // across 64k source ports.
        sysctl(
            c,
            &[
                "net.ipv4.tcp_tw_reuse=1",
                "net.ipv4.ip_local_port_range=1024 65535",
            ],
        )?;
        sysctl(
            s,
            &[
                "net.core.somaxconn=8192",
                "net.ipv4.tcp_max_syn_backlog=8192",
            ],
        )?;
        Ok(())
    }

    /// One bounded run of `w` from the client to the server, both threads
    /// pinned to `cpu`: every softirq of the workload then runs there too,
    /// in one backlog. With the server on another CPU, its ACKs release
    /// data from that CPU's softirq while the client's own writes go
    /// through CPU `cpu`'s backlog: two queues into one veth reorder a
    /// TCP stream (a few hundred spurious fast retransmits in 2 s, DSACKs
    /// and TCPOFOQueue counted, here).
    pub fn run(&self, w: Work, secs: f64, count: u64, cpu: usize) -> Result<Done> {
        let e = Ends {
            client_ns: Self::path(&self.client),
            server_ns: Self::path(&self.server),
            server: SocketAddrV4::new(SERVER_IP, PORT),
            client_cpu: Some(cpu),
            server_cpu: Some(cpu),
            count,
            duration: Duration::from_secs_f64(secs),
        };
        let done = match w {
            Work::Udp => healthy::run(&e, healthy::Udp { payload: 64 }, 1024),
            Work::Churn => healthy::run(&e, healthy::Churn { write: 1 }, 256),
            Work::Stream => healthy::run(&e, healthy::Stream { chunk: 64 << 10 }, u64::MAX),
        };
        done.with_context(|| format!("{w:?} workload"))
    }
}

fn sysctl(ns: &str, kv: &[&str]) -> Result<()> {
    let mut args = vec!["netns", "exec", ns, "sysctl", "-qw"];
    args.extend_from_slice(kv);
    sh("ip", &args).map(|_| ())
}

impl Drop for Routed {
    fn drop(&mut self) {
        for ns in self.all() {
            if !Self::path(ns).exists() {
                continue;
            }
            if let Err(e) = sh("ip", &["netns", "del", ns]) {
                eprintln!("xtask: removing netns {ns}: {e:#}");
            }
        }
    }
}
