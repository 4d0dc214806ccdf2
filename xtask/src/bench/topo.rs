//! The bench's two namespaces: a client that floods, a node that drops the
//! SYNs with an iptables rule (whose counter is the independent count).
//! Removed when the guard drops, also on error and panic.
use std::{net::Ipv4Addr, path::PathBuf, process::Command, time::Duration};

use anyhow::{bail, Context as _, Result};

pub const PORT: u16 = 8080;
/// A port the flood never uses: a filter on it matches nothing.
pub const OTHER_PORT: u16 = 9;
const CLIENT_MAC: [u8; 6] = [0x02, 0x6b, 0x62, 0, 0, 0x01];
const NODE_MAC: [u8; 6] = [0x02, 0x6b, 0x62, 0, 0, 0x02];
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 1);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 2);
pub const NODE_IF: &str = "eth0";

fn mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs a command, failing with its stderr; returns stdout.
pub fn sh(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub struct Topo {
    pub client: String,
    pub node: String,
}

impl Topo {
    pub fn new() -> Result<Self> {
        remove_stale();
        let pid = std::process::id();
        let topo = Topo {
            client: format!("kdb{pid}-client"),
            node: format!("kdb{pid}-node"),
        };
        // The guard exists before the namespaces: it removes whatever of
        // them was made.
        for ns in [&topo.client, &topo.node] {
            sh("ip", &["netns", "add", ns])?;
        }
        topo.build()?;
        Ok(topo)
    }

    fn build(&self) -> Result<()> {
        let (c, n) = (self.client.as_str(), self.node.as_str());
        sh(
            "ip",
            &[
                "link",
                "add",
                "c0",
                "address",
                &mac(&CLIENT_MAC),
                "netns",
                c,
                "type",
                "veth",
                "peer",
                "name",
                NODE_IF,
                "address",
                &mac(&NODE_MAC),
                "netns",
                n,
            ],
        )?;
        for (ns, dev) in [(c, "c0"), (n, NODE_IF), (n, "lo"), (c, "lo")] {
            sh("ip", &["-n", ns, "link", "set", dev, "up"])?;
        }
        sh(
            "ip",
            &[
                "-n",
                c,
                "addr",
                "add",
                &format!("{CLIENT_IP}/24"),
                "dev",
                "c0",
            ],
        )?;
        sh(
            "ip",
            &[
                "-n",
                n,
                "addr",
                "add",
                &format!("{NODE_IP}/24"),
                "dev",
                NODE_IF,
            ],
        )?;
        // A new namespace may inherit the host's conf/all: pin rp_filter off
        // so that only the iptables rule drops.
        self.exec(
            n,
            "sysctl",
            &[
                "-qw",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.conf.eth0.rp_filter=0",
            ],
        )?;
        let port = PORT.to_string();
        self.exec(
            n,
            "iptables",
            &[
                "-w", "-A", "INPUT", "-p", "tcp", "--syn", "--dport", &port, "-j", "DROP",
            ],
        )?;
        Ok(())
    }

    fn exec(&self, ns: &str, cmd: &str, args: &[&str]) -> Result<String> {
        let mut all = vec!["netns", "exec", ns, cmd];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    /// Packets the node's DROP rule has counted so far.
    pub fn dropped(&self) -> Result<u64> {
        let out = self.exec(&self.node, "iptables", &["-w", "-nvxL", "INPUT"])?;
        out.lines()
            .find(|l| l.contains("DROP"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no DROP rule counter in {out:?}"))
    }

    /// A flood from the client to the node's dropped port, bounded by both.
    pub fn flood(&self, secs: f64, count: u64, cpu: Option<usize>) -> Result<synflood::Sent> {
        let f = synflood::Flood {
            ifname: "c0".into(),
            src_mac: CLIENT_MAC,
            dst_mac: NODE_MAC,
            src: CLIENT_IP,
            dst: NODE_IP,
            dport: PORT,
            sport_base: 1024,
            sport_span: 60000,
            count,
            duration: Duration::from_secs_f64(secs),
            cpu,
        };
        f.run_in(&PathBuf::from("/run/netns").join(&self.client))
            .context("flooding")
    }
}

/// Namespaces of earlier benches that were killed (SIGKILL gives no chance
/// to clean up): `kdb<pid>-...` whose pid is gone.
pub fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in dir
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
    {
        let Some(pid) = name
            .strip_prefix("kdb")
            .and_then(|r| r.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("xtask: removing netns {name}, left by an earlier bench");
            let _ = sh("ip", &["netns", "del", &name]);
        }
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for ns in [&self.client, &self.node] {
            if !PathBuf::from("/run/netns").join(ns).exists() {
                continue;
            }
            if let Err(e) = sh("ip", &["netns", "del", ns]) {
                eprintln!("xtask: removing netns {ns}: {e:#}");
            }
        }
    }
}
