//! A full conntrack table: the server namespace's entries are at the
//! global nf_conntrack_max and none can be evicted (the held connections
//! are established, so assured: `early_drop` evicts unassured entries
//! only, `__nf_conntrack_alloc`,
//! https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_core.c),
//! so conntrack refuses the SYN's entry. kdrop, traced with the service's
//! port only, names it (`conntrack_table_full`) and prints the sysctls that
//! double the limit and the hash table; applied as printed, the dropped
//! SYN's retransmission and a new connection complete. The connections are
//! the oracle.
//!
//! The limit and the hash table are global: writable from the initial
//! namespace only (inside one, `sysctl -w net.netfilter.nf_conntrack_max`
//! answers EINVAL on 6.18), the count per namespace. The test puts both
//! back however it ends, and runs alone in the VM guest (xtask's `ALONE`),
//! as nf_verdicts does: another test's namespace with as many entries
//! would meet the full table meanwhile.
use std::{
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use integration_tests::{
    assert_kinds, connect_from, listen, reason_for, run_fix, send_syn, wait_connected,
    wait_retransmitted, Kdrop, Ns, Pair,
};
use kdrop::{context::netns::in_netns, diagnosis::fix_kinds::Kind};

const MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const BUCKETS: &str = "/proc/sys/net/netfilter/nf_conntrack_buckets";

/// Global sysctls, put back as they were however the test ends.
struct Restore(Vec<(&'static str, String)>);

impl Restore {
    fn save(paths: &[&'static str]) -> Self {
        Restore(paths.iter().map(|p| (*p, read(p).to_string())).collect())
    }

    fn old(&self, path: &str) -> u64 {
        let (_, v) = self.0.iter().find(|(p, _)| *p == path).unwrap();
        v.parse().unwrap()
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        for (p, v) in &self.0 {
            let _ = std::fs::write(p, v);
        }
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// The namespace's own entry count.
fn count(ns: &Ns) -> u64 {
    in_netns(&ns.path(), || {
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
    })
    .unwrap()
    .unwrap()
    .trim()
    .parse()
    .unwrap()
}

#[test]
fn a_full_table_is_repaired_by_kdrops_sysctls() {
    let p = Pair::new("cttf", 251);
    // A conntrack match makes the namespace track connections.
    p.server
        .exec(
            "iptables-legacy",
            &[
                "-A",
                "INPUT",
                "-m",
                "conntrack",
                "--ctstate",
                "NEW,ESTABLISHED",
                "-j",
                "ACCEPT",
            ],
        )
        .unwrap();
    let at = p.server_v4(7251);
    let _l = listen(&p.server, at);
    // Two held connections: doubled, the limit then leaves room for the
    // dropped SYN's retransmission and a new connection.
    let held: Vec<OwnedFd> = [42251, 42252]
        .into_iter()
        .map(|port| {
            let fd = send_syn(&p.client, p.client_v4(port), at);
            wait_connected(&fd, Duration::from_secs(5)).expect("a held connection");
            fd
        })
        .collect();
    let n = count(&p.server);
    assert!(n >= 2, "the held connections have {n} entries");
    let saved = Restore::save(&[MAX, BUCKETS]);
    let k = Kdrop::start(&["--json", "--port", "7251"]);
    std::fs::write(MAX, n.to_string()).unwrap();
    let src = p.client_v4(42253);
    let sent = Instant::now();
    let syn = send_syn(&p.client, src, at);
    // The first drop arms what attributes it (netfilter's counters around
    // the drop): a retransmission's drop names the table.
    let e = k.expect_record_within("the SYN conntrack refused", Duration::from_secs(10), |e| {
        e.kind == "drop"
            && e.sport == 42253
            && e.finding.as_ref().is_some_and(|f| f.cause != "netfilter")
    });
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"), "{e}");
    assert_eq!(e.cause(), "conntrack_table_full", "{e}");
    let fix = e.finding().fix.clone();
    assert_eq!(
        fix,
        [
            format!("sysctl -w net.netfilter.nf_conntrack_max={}", n * 2),
            format!(
                "sysctl -w net.netfilter.nf_conntrack_buckets={}",
                saved.old(BUCKETS) * 2
            ),
        ]
    );
    k.stop(libc::SIGINT);
    assert_kinds(&fix, &[Kind::ConntrackMax, Kind::ConntrackBuckets]);
    for cmd in &fix {
        run_fix(cmd);
    }
    assert_eq!(read(MAX), (n * 2).to_string());
    // The finding is about the table, and the dropped SYN's own socket
    // retransmits (1 s, 3 s): its tuple completes, then a new one.
    wait_retransmitted(&syn, sent).expect("the dropped SYN's retransmission");
    connect_from(&p.client, p.client_v4(42254), at).expect("a new connection after the fix");
    drop(held);
    drop(saved);
}
