//! Is the healthy traffic healthy? The kernel's own counters in each of the
//! workload's namespaces, read before and after every run (baselines
//! included): every counter that moves when the stack drops or refuses a
//! packet must stay still. No tracer is involved, so the check is the same
//! for every variant.
//!
//! Read from a thread that joins the namespace (/proc/thread-self/net is
//! the thread's namespace's view), not by spawning `nstat` per namespace.
use std::{collections::BTreeMap, fs, os::fd::AsRawFd as _, path::Path};

use anyhow::{bail, Context as _, Result};

/// `/proc/net/snmp` and `/proc/net/netstat` counters that count packets the
/// kernel dropped or refused, or connections that failed, in
/// include/uapi/linux/snmp.h terms (v6.18). Each must not move during a
/// healthy run.
const DROPS: &[&str] = &[
    "Ip.InHdrErrors",
    "Ip.InAddrErrors",
    "Ip.InUnknownProtos",
    "Ip.InDiscards",
    "Ip.OutDiscards",
    "Ip.OutNoRoutes",
    "Ip.ReasmFails",
    "Ip.FragFails",
    "IpExt.InNoRoutes",
    "IpExt.InTruncatedPkts",
    "IpExt.InCsumErrors",
    "Icmp.OutDestUnreachs",
    "Udp.InErrors",
    "Udp.NoPorts",
    "Udp.RcvbufErrors",
    "Udp.SndbufErrors",
    "Udp.InCsumErrors",
    "Udp.MemErrors",
    "Tcp.AttemptFails",
    "Tcp.EstabResets",
    "Tcp.InErrs",
    "Tcp.OutRsts",
    "Tcp.InCsumErrors",
    "TcpExt.ListenOverflows",
    "TcpExt.ListenDrops",
    "TcpExt.TCPBacklogDrop",
    "TcpExt.TCPRcvQDrop",
    "TcpExt.TCPZeroWindowDrop",
    "TcpExt.PFMemallocDrop",
    "TcpExt.TCPMinTTLDrop",
    "TcpExt.TCPDeferAcceptDrop",
    "TcpExt.TCPReqQFullDrop",
    "TcpExt.TCPOFODrop",
    "TcpExt.LockDroppedIcmps",
    "TcpExt.TCPAbortOnData",
    "TcpExt.TCPAbortOnMemory",
    "TcpExt.TCPAbortOnTimeout",
    "TcpExt.TCPAbortFailed",
];
/// A drop that no counter above sees (a netfilter verdict, say) shows in
/// TCP as a retransmission. So does a tail-loss probe sent while the
/// receiver waited for the CPU, which the receiver then answers with a
/// DSACK (it had the segment): retransmissions beyond the DSACKed ones are
/// losses.
pub const RETRANS: &str = "Tcp.RetransSegs";
const DSACKED: &str = "TcpExt.TCPDSACKRecvSegs";

/// Counters of one moment, keyed `namespace/Group.Name` (and
/// `namespace/dev.IFACE.rx_drop` and the like for /proc/net/dev).
#[derive(Clone, Debug, Default)]
pub struct Counters(BTreeMap<String, u64>);

impl Counters {
    pub fn read(namespaces: &[&str]) -> Result<Self> {
        let mut all = BTreeMap::new();
        for ns in namespaces {
            let files = read_in(ns, &["snmp", "netstat", "dev"])?;
            for (k, v) in parse_snmp(&files[0])
                .into_iter()
                .chain(parse_snmp(&files[1]))
            {
                all.insert(format!("{ns}/{k}"), v);
            }
            for (k, v) in parse_dev(&files[2]) {
                all.insert(format!("{ns}/{k}"), v);
            }
        }
        Ok(Counters(all))
    }

    /// The drop counters that moved since `before`, as `ns/name +N`, and
    /// retransmissions no DSACK showed spurious.
    pub fn drops_since(&self, before: &Counters) -> Vec<String> {
        let (retrans, dsacked) = (self.moved(before, RETRANS), self.moved(before, DSACKED));
        let lost = (retrans > dsacked)
            .then(|| format!("{RETRANS} +{retrans} of which {DSACKED} +{dsacked}: segments lost"));
        self.0
            .iter()
            .filter(|(k, _)| {
                let name = k.split_once('/').map_or(k.as_str(), |(_, n)| n);
                DROPS.contains(&name) || name.starts_with("dev.")
            })
            .filter_map(|(k, v)| {
                let d = v.saturating_sub(before.0.get(k).copied().unwrap_or(0));
                (d > 0).then(|| format!("{k} +{d}"))
            })
            .chain(lost)
            .collect()
    }

    /// How far `name` moved since `before`, over every namespace.
    pub fn moved(&self, before: &Counters, name: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.split_once('/').is_some_and(|(_, n)| n == name))
            .map(|(k, v)| v.saturating_sub(before.0.get(k).copied().unwrap_or(0)))
            .sum()
    }
}

/// /proc/thread-self/net/FILE for each of `files`, read inside `ns`.
fn read_in(ns: &str, files: &[&str]) -> Result<Vec<String>> {
    let path = Path::new("/run/netns").join(ns);
    let files: Vec<String> = files.iter().map(|f| f.to_string()).collect();
    std::thread::spawn(move || -> Result<Vec<String>> {
        let f = fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: setns on this thread only; the fd is valid for the call.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!(
                "setns {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        files
            .iter()
            .map(|n| {
                fs::read_to_string(format!("/proc/thread-self/net/{n}"))
                    .with_context(|| format!("reading /proc/net/{n} in {}", path.display()))
            })
            .collect()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("counter reader panicked"))?
}

/// `Group: Name1 Name2 ...` / `Group: v1 v2 ...` line pairs.
fn parse_snmp(text: &str) -> Vec<(String, u64)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let (Some((group, names)), Some((_, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse::<u64>() {
                out.push((format!("{group}.{n}"), v));
            }
        }
    }
    out
}

/// /proc/net/dev: receive and transmit errors and drops per interface.
/// rx drop includes the per-CPU backlog's overflow: `enqueue_to_backlog`
/// counts it on the receiving device
/// (https://github.com/torvalds/linux/blob/v6.18/net/core/dev.c).
fn parse_dev(text: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for line in text.lines().skip(2) {
        let Some((iface, rest)) = line.split_once(':') else {
            continue;
        };
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // rx: bytes packets errs drop ...; tx starts at field 8.
        for (name, i) in [
            ("rx_errs", 2),
            ("rx_drop", 3),
            ("tx_errs", 10),
            ("tx_drop", 11),
        ] {
            if let Some(v) = f.get(i) {
                out.push((format!("dev.{}.{name}", iface.trim()), *v));
            }
        }
    }
    out
}

/// CPU seconds the ksoftirqd threads of `cpus` have used: softirq work
/// the kernel deferred to them is missing from the workload threads' own
/// CPU time, so a large share would bias the CPU-time figures.
pub fn softirqd_secs(cpus: &[usize]) -> f64 {
    let Ok(dir) = fs::read_dir("/proc") else {
        return 0.0;
    };
    let names: Vec<String> = cpus.iter().map(|c| format!("ksoftirqd/{c}")).collect();
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| names.iter().any(|n| n == c.trim()))
        })
        .filter_map(|pid| pid.parse::<u32>().ok())
        .map(super::tools::cpu_of)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters() {
        let snmp = "Ip: Forwarding InDiscards\nIp: 1 3\nUdp: InDatagrams RcvbufErrors\nUdp: 10 2\n";
        assert_eq!(
            parse_snmp(snmp),
            vec![
                ("Ip.Forwarding".into(), 1),
                ("Ip.InDiscards".into(), 3),
                ("Udp.InDatagrams".into(), 10),
                ("Udp.RcvbufErrors".into(), 2),
            ]
        );
        let dev = "Inter-|   Receive  |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    r0: 100 2 0 5 0 0 0 0 200 3 1 7 0 0 0 0\n";
        let d = parse_dev(dev);
        assert!(d.contains(&("dev.r0.rx_drop".into(), 5)));
        assert!(d.contains(&("dev.r0.tx_errs".into(), 1)));
        assert!(d.contains(&("dev.r0.tx_drop".into(), 7)));
        let before = Counters(
            [
                ("n/Ip.InDiscards".to_string(), 3),
                ("n/Tcp.RetransSegs".into(), 1),
            ]
            .into_iter()
            .collect(),
        );
        let after = Counters(
            [
                ("n/Ip.InDiscards".to_string(), 5),
                ("n/Tcp.RetransSegs".into(), 4),
            ]
            .into_iter()
            .collect(),
        );
        assert_eq!(
            after.drops_since(&before),
            vec![
                "n/Ip.InDiscards +2",
                "Tcp.RetransSegs +3 of which TcpExt.TCPDSACKRecvSegs +0: segments lost"
            ]
        );
        assert_eq!(after.moved(&before, RETRANS), 3);
        // Retransmissions the receiver DSACKed were not losses.
        let mut spurious = after.clone();
        spurious.0.insert("n/TcpExt.TCPDSACKRecvSegs".into(), 3);
        assert_eq!(spurious.drops_since(&before), vec!["n/Ip.InDiscards +2"]);
    }
}
