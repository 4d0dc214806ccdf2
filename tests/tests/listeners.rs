//! Listener queues (context::listeners, context::procs) read from a real
//! namespace: a listener that never accepts overflows, another whose clients
//! never send the final ACK fills its SYN queue; `ss`, /proc/net/netstat and
//! sysctl (run inside the namespace) are the oracles.
use std::{
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::{bound, listen_backlog, send_syn, Ns, Pair};
use kdrop::context::{
    listeners::{listener_for, snapshot_in},
    procs::{Held, Holders},
};

/// Output of a command run inside `ns`.
fn in_ns(ns: &Ns, cmd: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(cmd)
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `ss -ltn`'s Recv-Q and Send-Q for the listener on `local` (as ss
/// writes it: `*:PORT` for a dual-stack wildcard).
fn ss_listen_queues(ns: &Ns, local: impl ToString) -> (u32, u32) {
    let (text, local) = (in_ns(ns, &["ss", "-ltnH"]), local.to_string());
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some(local.as_str()))
        .unwrap_or_else(|| panic!("ss shows no listener on {local}:\n{text}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[1].parse().unwrap(), f[2].parse().unwrap())
}

/// `ss`'s count of SYN-RECV sockets on local port `port`.
fn ss_syn_recv(ns: &Ns, port: u16) -> u32 {
    let filter = format!("( sport = :{port} )");
    in_ns(ns, &["ss", "-tnH", "state", "syn-recv", &filter])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count() as u32
}

/// TcpExt.<name> as the namespace's /proc/net/netstat says (read by cat
/// inside the namespace).
fn netstat(ns: &Ns, name: &str) -> u64 {
    let text = in_ns(ns, &["cat", "/proc/net/netstat"]);
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let i = names.split_whitespace().position(|n| n == name).unwrap();
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// Polls (bounded) until `cond` holds: a counter moving has no event to wait on.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + bound(Duration::from_secs(10));
    while !cond() {
        assert!(Instant::now() < deadline, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn full_accept_queue_and_syn_queue_as_ss_and_netstat_see_them() {
    let p = Pair::new("lq1", 171);
    p.server
        .sysctl("net/core/somaxconn", "77")
        .and(p.server.sysctl("net/ipv4/tcp_max_syn_backlog", "99"))
        .and(p.server.sysctl("net/ipv4/tcp_syncookies", "0"))
        .unwrap();
    let (full_at, synq_at) = (p.server_v4(5001), p.server_v4(5002));
    let _full = listen_backlog(&p.server, full_at, 1);
    let _synq = listen_backlog(&p.server, synq_at, 16);
    // The client never sends the final ACK to 5002: its SYN_RECV requests stay.
    in_ns(
        &p.client,
        &[
            "iptables",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "--dport",
            "5002",
            "--tcp-flags",
            "SYN,ACK,RST,FIN",
            "ACK",
            "-j",
            "DROP",
        ],
    );
    let before = netstat(&p.server, "ListenOverflows");

    let mut clients = Vec::new();
    for i in 0..4 {
        clients.push(send_syn(&p.client, p.client_v4(41000 + i), full_at));
        // One at a time: the next SYN meets the queue the last one left.
        let n = (i + 1).min(2) as u32;
        if i < 2 {
            wait_until("a handshake completing", || {
                ss_listen_queues(&p.server, full_at).0 == n
            });
        }
    }
    wait_until("ListenOverflows moving", || {
        netstat(&p.server, "ListenOverflows") > before
    });
    for i in 0..3 {
        clients.push(send_syn(&p.client, p.client_v4(42000 + i), synq_at));
    }
    wait_until("three SYN_RECV requests", || {
        ss_syn_recv(&p.server, 5002) == 3
    });

    let snap = snapshot_in(&p.server.path()).unwrap();
    let full = listener_for(&snap.listeners, full_at).expect("the full listener");
    assert_eq!(full.local, full_at);
    // The kernel counts a backlog of 1 as full at 2 waiting.
    assert_eq!((full.accept_queue, full.accept_backlog), (2, 1));
    assert_eq!(
        (full.accept_queue, full.accept_backlog),
        ss_listen_queues(&p.server, full_at)
    );
    assert!(full.accept_queue_full());
    assert_eq!(full.syn_queue, ss_syn_recv(&p.server, 5001));
    let synq = listener_for(&snap.listeners, synq_at).expect("the second listener");
    assert_eq!(synq.syn_queue, 3);
    assert_eq!(
        (synq.accept_queue, synq.accept_backlog),
        ss_listen_queues(&p.server, synq_at)
    );
    assert!(!synq.accept_queue_full());
    // Counters and sysctls are the namespace's own.
    let overflows = snap.counters.listen_overflows.unwrap();
    assert!(overflows > before, "{overflows} after {before}");
    assert!(overflows <= netstat(&p.server, "ListenOverflows"));
    assert!(snap.counters.listen_drops.unwrap() >= overflows);
    assert_eq!(snap.sysctls.somaxconn, Some(77));
    assert_eq!(snap.sysctls.tcp_max_syn_backlog, Some(99));
    assert_eq!(snap.sysctls.tcp_syncookies, Some(0));
    let oracle = |k: &str| {
        in_ns(&p.server, &["sysctl", "-n", k])
            .trim()
            .parse::<u32>()
            .ok()
    };
    assert_eq!(snap.sysctls.somaxconn, oracle("net.core.somaxconn"));

    // The owner: this test process.
    let mut holders = Holders::new();
    let owners = holders.lookup(Held::Socket(full.inode));
    assert_eq!(
        owners.iter().map(|o| o.pid).collect::<Vec<_>>(),
        vec![std::process::id()],
        "{owners:?}"
    );
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(owners[0].comm, comm.trim_end());
    drop(clients);
}

#[test]
fn ipv6_wildcard_listener_takes_ipv4_too() {
    let p = Pair::new("lq2", 172);
    let any6: SocketAddr = "[::]:5003".parse().unwrap();
    let _l = listen_backlog(&p.server, any6, 8);
    let snap = snapshot_in(&p.server.path()).unwrap();
    let l = listener_for(&snap.listeners, p.server_v4(5003)).expect("dual-stack listener");
    assert_eq!(l.local, any6);
    assert_eq!(
        (l.accept_queue, l.accept_backlog),
        ss_listen_queues(&p.server, "*:5003")
    );
    assert_eq!(l.accept_backlog, 8);
    assert!(listener_for(&snap.listeners, p.server_v6(5003)).is_some());
    assert!(listener_for(&snap.listeners, p.server_v6(5004)).is_none());
}
