//! Listener queues (context::listeners, context::procs) read from a real
//! namespace: a listener that never accepts overflows, another whose clients
//! never send the final ACK fills its SYN queue; `ss`, /proc/net/netstat and
//! sysctl (run inside the namespace) are the oracles.
use std::{
    net::SocketAddr,
    os::fd::OwnedFd,
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::{
    bound, in_ns, listen_backlog, send_syn, ss_listen_queues, wait_until, Kdrop, Ns, Pair, Record,
};
use kdrop::context::{
    listeners::{listener_for, snapshot_in},
    procs::{Held, Holders},
};

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
#[test]
fn full_accept_queue_and_syn_queue_as_ss_and_netstat_see_them() {
    let p = Pair::new("lq1", 181);
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
    // Another test of this binary spawning a command forks a child that
    // holds copies of every descriptor until it execs (comm still the test
    // thread's name): a true owner for that instant, and this process's.
    let me = std::process::id();
    let forked_from_me = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
            st.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                == Some(me.to_string().as_str())
        })
    };
    assert!(owners.iter().any(|o| o.pid == me), "{owners:?}");
    assert!(
        owners.iter().all(|o| o.pid == me || forked_from_me(o.pid)),
        "{owners:?}"
    );
    let owners: Vec<_> = owners.into_iter().filter(|o| o.pid == me).collect();
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(owners[0].comm, comm.trim_end());
    drop(clients);
}

#[test]
fn ipv6_wildcard_listener_takes_ipv4_too() {
    let p = Pair::new("lq2", 182);
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

/// A listener of backlog 1 at `at` in the pair's server that never accepts,
/// its accept queue filled by two completed handshakes (as `ss` shows);
/// returns it and the clients holding those connections.
fn full_listener(p: &Pair, at: SocketAddr, first_sport: u16) -> (OwnedFd, Vec<OwnedFd>) {
    let l = listen_backlog(&p.server, at, 1);
    let mut held = Vec::new();
    for i in 0..2u16 {
        held.push(send_syn(&p.client, p.client_v4(first_sport + i), at));
        let n = u32::from(i) + 1;
        wait_until("a handshake completing", || {
            ss_listen_queues(&p.server, at).0 == n
        });
    }
    (l, held)
}

/// A client in the other namespace connects to the full listener with a
/// 3 s timeout (non-blocking connect, polled; the kernel retransmits its
/// SYN meanwhile); returns when it gave up.
fn refused_client(p: &Pair, src: SocketAddr, dst: SocketAddr) -> std::thread::JoinHandle<bool> {
    let client = p.client.path();
    std::thread::spawn(move || {
        let fd = integration_tests::send_syn_at(&client, src, dst);
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 3000) };
        n > 0
    })
}

/// What every listen watch record of the full listener says, checked
/// against `ss`, netstat and this process (the oracles outside kdrop).
fn assert_listen_overflow(p: &Pair, e: &Record, at: SocketAddr) {
    assert_eq!(e.kind, "listen_overflow", "{e}");
    assert_eq!(e.netns_name.as_deref(), Some(p.server.name.as_str()), "{e}");
    assert_eq!(e.daddr, at.ip().to_string());
    assert_eq!(e.dport, at.port());
    assert_eq!(e.sport, 0);
    assert!(e.handshake.is_none(), "folded into a handshake: {e}");
    let f = e.finding();
    assert_eq!(f.cause, "listen_overflow", "{e}");
    let (q, b) = ss_listen_queues(&p.server, at);
    assert_eq!((q, b), (2, 1));
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    let owner = format!("{} (pid {})", comm.trim_end(), std::process::id());
    assert_eq!(
        f.summary,
        format!(
            "accept queue of {owner} on {at} is full: {q}/{b} waiting; it is not calling \
             accept() fast enough"
        )
    );
    let ev: Vec<&str> = f.evidence.iter().map(String::as_str).collect();
    assert!(
        ev[0].starts_with("TcpExt +") && ev[0].contains(" ListenOverflows"),
        "{ev:?}"
    );
    assert_eq!(
        ev[1],
        format!(
            "listener {at} in netns {}: accept queue {q} waiting, backlog {b} (the kernel \
             refuses when more than {b} wait), SYN queue 0 request sockets",
            p.server.name
        )
    );
    assert!(ev[2].starts_with(&format!("owner: {owner}: ")), "{ev:?}");
    let overflows = netstat(&p.server, "ListenOverflows");
    let shown: u64 = ev
        .last()
        .unwrap()
        .strip_prefix("TcpExt ListenOverflows ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{ev:?}"));
    assert!(
        shown >= 1 && shown <= overflows,
        "{shown} vs netstat {overflows}"
    );
}

/// The listen_overflow record of `k` (a JSON line on stdout, as printed),
/// with how long after the client's first SYN it came.
fn first_listen_overflow(k: &Kdrop, sent: Instant) -> (String, Record, Duration) {
    let deadline = Instant::now() + bound(Duration::from_secs(5));
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(line) = k.next_line(left) else { break };
        let e = Record::parse(&line);
        if e.kind == "listen_overflow" {
            let after = sent.elapsed();
            eprintln!("{after:?} after the first SYN: {line}");
            return (line, e, after);
        }
        seen.push(line);
    }
    panic!("no listen_overflow record; saw {seen:?}")
}

/// Traced by port alone: the client is local (another namespace), but the
/// record comes from the server's counters, before the client gives up.
#[test]
fn listen_overflow_from_the_counters_traced_by_port() {
    let p = Pair::new("lw1", 183);
    let at = p.server_v4(5011);
    let (_l, _held) = full_listener(&p, at, 43000);
    let k = Kdrop::start(&["--json", "--port", "5011"]);
    let sent = Instant::now();
    let client = refused_client(&p, p.client_v4(43010), at);
    let (_, e, after) = first_listen_overflow(&k, sent);
    assert!(after < bound(Duration::from_millis(2500)), "{after:?}");
    assert_listen_overflow(&p, &e, at);
    assert!(!client.join().unwrap(), "the refused client connected");
}

/// Traced in the server's namespace only (as when the client is another
/// host: no local retransmission), and recorded: `explain` gives the same
/// lines, byte for byte.
#[test]
fn listen_overflow_from_the_listeners_namespace_alone_recorded() {
    let p = Pair::new("lw2", 184);
    let at = p.server_v4(5012);
    let (_l, _held) = full_listener(&p, at, 43100);
    let dir = std::env::temp_dir().join(format!("kdrop-lw2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bundle = dir.join("listen.kdrop");
    let k = Kdrop::start(&[
        "record",
        "-o",
        bundle.to_str().unwrap(),
        "--json",
        "--netns",
        &p.server.name,
        "--port",
        "5012",
    ]);
    let sent = Instant::now();
    let client = refused_client(&p, p.client_v4(43110), at);
    let (first, e, after) = first_listen_overflow(&k, sent);
    assert!(after < bound(Duration::from_millis(2500)), "{after:?}");
    assert_listen_overflow(&p, &e, at);
    assert!(!client.join().unwrap(), "the refused client connected");
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{:?}", done.stderr);
    let explained = Command::new(integration_tests::kdrop_bin())
        .args(["explain", bundle.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(explained.status.success(), "{explained:?}");
    // The live lines: the one read above, then the rest printed until exit.
    let live: Vec<&str> = std::iter::once(first.as_str())
        .chain(done.stdout.iter().map(String::as_str))
        .collect();
    let replayed: Vec<&str> = std::str::from_utf8(&explained.stdout)
        .unwrap()
        .lines()
        .collect();
    assert_eq!(replayed, live);
}

/// Monitor mode: the refusals as a metric with the listener's labels, and
/// the finding among the JSON lines.
#[test]
fn listen_overflow_in_monitor_metrics_and_events() {
    use integration_tests::scrape::{http_get, metrics_addr, scrape_until, value};
    let p = Pair::new("lw3", 185);
    let at = p.server_v4(5013);
    let (_l, _held) = full_listener(&p, at, 43200);
    let out = std::env::temp_dir().join(format!("kdrop-lw3-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let k = Kdrop::start(&[
        "monitor",
        "--netns",
        &p.server.name,
        "-p",
        "5013",
        "--listen",
        "127.0.0.1:0",
        "--output",
        out.to_str().unwrap(),
    ]);
    let addr = metrics_addr(&k);
    let before = netstat(&p.server, "ListenOverflows");
    let client = refused_client(&p, p.client_v4(43210), at);
    let labels = [
        ("netns", p.server.name.as_str()),
        ("pod", ""),
        ("port", "5013"),
        ("queue", "accept"),
    ];
    let m = scrape_until(
        || http_get(addr, "/metrics"),
        "the refused SYN counted",
        |m| value(m, "kdrop_listen_overflows_total", &labels).is_some_and(|v| v >= 1),
    );
    let counted = value(&m, "kdrop_listen_overflows_total", &labels).unwrap();
    assert!(
        counted <= netstat(&p.server, "ListenOverflows") - before,
        "{counted}\n{m}"
    );
    assert!(!client.join().unwrap(), "the refused client connected");
    // The client's 3 s: its retransmissions were refused and counted too.
    let after = netstat(&p.server, "ListenOverflows") - before;
    scrape_until(
        || http_get(addr, "/metrics"),
        "every refusal counted",
        |m| value(m, "kdrop_listen_overflows_total", &labels) == Some(after),
    );
    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let e = text
        .lines()
        .map(Record::parse)
        .find(|e| e.kind == "listen_overflow")
        .unwrap_or_else(|| panic!("no listen_overflow line in {text}"));
    assert_eq!(e.finding().cause, "listen_overflow");
    assert_eq!(e.dport, 5013);
    assert_eq!(e.netns_name.as_deref(), Some(p.server.name.as_str()));
}

/// A SYN queue full with SYN cookies off (clients that never send the final
/// ACK), traced in the listener's namespace: `syn_queue_overflow`, with the
/// request sockets `ss` counts and TCPReqQFullDrop as netstat shows it.
#[test]
fn syn_queue_overflow_from_the_counters() {
    let p = Pair::new("lw4", 186);
    p.server.sysctl("net/ipv4/tcp_syncookies", "0").unwrap();
    let at = p.server_v4(5014);
    let _l = listen_backlog(&p.server, at, 2);
    in_ns(
        &p.client,
        &[
            "iptables",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "--dport",
            "5014",
            "--tcp-flags",
            "SYN,ACK,RST,FIN",
            "ACK",
            "-j",
            "DROP",
        ],
    );
    let before = netstat(&p.server, "TCPReqQFullDrop");
    let k = Kdrop::start(&["--json", "--netns", &p.server.name, "--port", "5014"]);
    let sent = Instant::now();
    let clients: Vec<OwnedFd> = (0..6)
        .map(|i| send_syn(&p.client, p.client_v4(43300 + i), at))
        .collect();
    let (_, e, after) = first_listen_overflow(&k, sent);
    assert!(after < bound(Duration::from_millis(2500)), "{after:?}");
    assert_eq!(e.finding().cause, "syn_queue_overflow", "{e}");
    assert_eq!((e.daddr.as_str(), e.dport), ("10.186.0.2", 5014));
    let dropped = netstat(&p.server, "TCPReqQFullDrop") - before;
    assert!(dropped >= 1, "netstat shows no TCPReqQFullDrop");
    let (sq, b) = (
        ss_syn_recv(&p.server, 5014),
        ss_listen_queues(&p.server, at).1,
    );
    assert_eq!(b, 2);
    let f = e.finding();
    let summary = f.summary.as_str();
    assert!(
        summary.contains(&format!(
            "on {at} is full ({sq}/{b}) and SYN cookies are off: "
        )),
        "{summary} (ss: {sq} SYN-RECV, backlog {b})"
    );
    let ev0 = f.evidence[0].as_str();
    assert!(ev0.contains(" TCPReqQFullDrop in the last "), "{ev0}");
    assert_eq!(
        f.evidence[1],
        format!(
            "listener {at} in netns {}: SYN queue {sq} request sockets, backlog {b} (it bounds \
             the SYN queue too: 6.18 refuses SYNs when more than {b} wait), accept queue 0 waiting",
            p.server.name
        )
    );
    drop(clients);
}
