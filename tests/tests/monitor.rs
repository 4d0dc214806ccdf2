//! `kdrop monitor`: the kernel's counts on /metrics equal the drops a test
//! provokes, a real Prometheus scrapes them, sampling and the per-second cap
//! hold under a burst, the endpoint stays on loopback unless told otherwise.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::fd::OwnedFd,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    expected_cause, expected_reason_label, kdrop_bin, ns_name, reason_for, send_raw_tcp, send_syn,
    syn_segment, Kdrop, Ns, Pair, Record, EVENT_TIMEOUT,
};
use kdrop::context::netns::in_netns;

/// kdrop started inside `ns` (`ip netns exec` execs it: same process).
fn start_in(ns: &Ns, args: &[&str]) -> Kdrop {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name])
        .arg(kdrop_bin())
        .args(args);
    Kdrop::start_command(cmd)
}

/// One GET, `Connection: close`; the body and the status line.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    Ok((status, body.to_string()))
}

/// A GET made from inside a namespace (its loopback is its own).
fn http_get_in(ns: &Ns, addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let path = path.to_string();
    in_netns(&ns.path(), move || http_get(addr, &path)).unwrap()
}

/// The metrics address from the readiness line.
fn metrics_addr(k: &Kdrop) -> SocketAddr {
    let line = k
        .stderr_seen
        .iter()
        .find(|l| l.starts_with("kdrop: tracing"))
        .unwrap();
    let rest = line.split("http://").nth(1).unwrap();
    rest.split("/metrics").next().unwrap().parse().unwrap()
}

/// The value of the one sample whose name and labels contain all of `want`.
fn value(metrics: &str, name: &str, want: &[(&str, &str)]) -> Option<u64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .find(|l| {
            want.iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
}

fn events(metrics: &str, state: &str) -> u64 {
    value(metrics, "kdrop_events_total", &[("state", state)]).unwrap()
}

/// Scrapes until `done` accepts the text (bounded): counters move as the
/// kernel frees the packets, there is no other signal to wait on.
fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(addr, "/metrics").unwrap();
        assert!(status.contains("200"), "{status}");
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{what} never shown:\n{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `n` SYNs to a closed port of the pair's server, each a NO_SOCKET drop
/// (the server answers with a RST, the client does not retransmit).
fn closed_port_syns(p: &Pair, first_sport: u16, port: u16, n: u16) -> Vec<OwnedFd> {
    (0..n)
        .map(|i| send_syn(&p.client, p.client_v4(first_sport + i), p.server_v4(port)))
        .collect()
}

/// No SYN of a burst may wait for (or be dropped by) address resolution.
fn pin_neighbour(p: &Pair) {
    let server = p.server_v4(0).ip().to_string();
    p.client
        .ip(&[
            "neigh",
            "replace",
            &server,
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "c0",
            "nud",
            "permanent",
        ])
        .unwrap();
}

fn check_accounting(m: &str) {
    assert_eq!(
        events(m, "matched"),
        events(m, "emitted") + events(m, "lost") + events(m, "sampled_out") + events(m, "capped"),
        "{m}"
    );
    for name in [
        "kdrop_handshake_packets_total",
        "kdrop_retransmissions_total",
        "kdrop_netfilter_verdicts_total",
    ] {
        let c = |state| value(m, name, &[("state", state)]).unwrap();
        assert_eq!(c("matched"), c("emitted") + c("lost") + c("capped"), "{m}");
    }
    // The followed connections' map is accounted even when nothing used it.
    for state in ["inserted", "map_full", "admitted"] {
        assert!(
            value(m, "kdrop_followed_connections_total", &[("state", state)]).is_some(),
            "{m}"
        );
    }
}

#[test]
fn metrics_equal_the_provoked_drops() {
    let p = Pair::new("mon", 141);
    let out = std::env::temp_dir().join(format!("kdrop-mon-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let k = Kdrop::start(&[
        "monitor",
        "--netns",
        &p.server.name,
        "-p",
        "5601",
        "--listen",
        "127.0.0.1:0",
        "--events-per-sec",
        "0",
        "--output",
        out.to_str().unwrap(),
    ]);
    let addr = metrics_addr(&k);
    let mut socks = closed_port_syns(&p, 46001, 5601, 5);
    socks.push(send_syn(&p.client, p.client_v6(46010), p.server_v6(5601)));
    let m = scrape_until(addr, "6 matched drops", |m| events(m, "emitted") == 6);
    let labels = [
        ("reason", expected_reason_label("NO_SOCKET")),
        ("netns", p.server.name.as_str()),
        ("pod", ""),
        ("ifname", "s0"),
        ("port", "5601"),
    ];
    assert_eq!(value(&m, "kdrop_drops_total", &labels), Some(6), "{m}");
    assert_eq!(events(&m, "matched"), 6);
    assert_eq!(events(&m, "sampled_out") + events(&m, "capped"), 0);
    check_accounting(&m);
    assert_eq!(
        value(
            &m,
            "kdrop_probe_attached",
            &[("point", "skb:kfree_skb"), ("rung", "tp_btf")]
        ),
        Some(1),
        "{m}"
    );
    // Findings come from the events, which the monitor writes as they come.
    let m = scrape_until(addr, "6 findings", |m| {
        value(
            m,
            "kdrop_findings_total",
            &[("cause", expected_cause("no_socket"))],
        ) == Some(6)
    });
    assert_eq!(value(&m, "kdrop_drops_total", &labels), Some(6));
    let (status, _) = http_get(addr, "/").unwrap();
    assert!(status.contains("404"), "{status}");

    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    assert!(
        done.stderr
            .iter()
            .any(|l| l.contains("matched 6, emitted 6, lost 0, sampled out 0, capped 0")),
        "{done:?}"
    );
    let lines: Vec<Record> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(Record::parse)
        .collect();
    let _ = std::fs::remove_file(&out);
    assert_eq!(lines.len(), 6, "{lines:?}");
    assert!(lines
        .iter()
        .all(|e| e.reason.as_deref() == reason_for("NO_SOCKET")
            && e.cause() == expected_cause("no_socket")));
}

#[test]
fn sampling_and_cap_hold_under_a_burst() {
    let p = Pair::new("burst", 142);
    pin_neighbour(&p);
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    // 1 in 4, per CPU: the first drop on each CPU, then every fourth.
    let k = Kdrop::start(&[
        "monitor",
        "--netns",
        &p.server.name,
        "-p",
        "5602",
        "--listen",
        "127.0.0.1:0",
        "--sample",
        "4",
        "--events-per-sec",
        "0",
    ]);
    let addr = metrics_addr(&k);
    let _socks = closed_port_syns(&p, 47001, 5602, 40);
    let m = scrape_until(addr, "40 matched drops", |m| events(m, "matched") == 40);
    check_accounting(&m);
    let emitted = events(&m, "emitted");
    eprintln!("1 in 4 of 40 drops on {cpus} CPUs: {emitted} events");
    assert!((10..=10 + cpus).contains(&emitted), "{m}");
    assert_eq!(events(&m, "sampled_out"), 40 - emitted, "{m}");
    // Every drop is in the metrics, sampled or not.
    let labels = [
        ("reason", expected_reason_label("NO_SOCKET")),
        ("port", "5602"),
    ];
    assert_eq!(value(&m, "kdrop_drops_total", &labels), Some(40), "{m}");
    drop(k);

    // A burst against a cap of 5 events per second per CPU.
    let k = Kdrop::start(&[
        "monitor",
        "--netns",
        &p.server.name,
        "-p",
        "5603",
        "--listen",
        "127.0.0.1:0",
        "--events-per-sec",
        "5",
    ]);
    let addr = metrics_addr(&k);
    let started = Instant::now();
    let _socks = closed_port_syns(&p, 48001, 5603, 200);
    let m = scrape_until(addr, "200 matched drops", |m| events(m, "matched") == 200);
    let secs = started.elapsed().as_secs() + 1;
    check_accounting(&m);
    let emitted = events(&m, "emitted");
    eprintln!("cap 5/s/CPU, 200 drops in {secs}s on {cpus} CPUs: {emitted} events");
    // One second of burst, then 5 per second, on each CPU.
    assert!(
        emitted <= 5 * cpus * (secs + 1),
        "{emitted} in {secs}s: {m}"
    );
    assert!(emitted >= 5, "{m}");
    assert_eq!(events(&m, "capped"), 200 - emitted, "{m}");
    let labels = [
        ("reason", expected_reason_label("NO_SOCKET")),
        ("port", "5603"),
    ];
    assert_eq!(value(&m, "kdrop_drops_total", &labels), Some(200), "{m}");
    // The server's 200 RSTs leaving s0 go through their own bucket.
    let hs = |state| value(&m, "kdrop_handshake_packets_total", &[("state", state)]).unwrap();
    eprintln!(
        "RSTs leaving: matched {}, emitted {}, capped {}",
        hs("matched"),
        hs("emitted"),
        hs("capped")
    );
    assert!(hs("emitted") <= 5 * cpus * (secs + 1), "{m}");
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    assert_eq!(done.stdout.len() as u64, emitted, "{done:?}");
}

#[test]
fn endpoint_is_on_loopback_by_default() {
    // kdrop in a namespace of its own: the default port is free there, and
    // the namespace has a non-loopback address to try.
    let ns = Ns::new(&ns_name("mon-lo")).unwrap();
    let peer = Ns::new(&ns_name("mon-lo-peer")).unwrap();
    integration_tests::veth(
        &ns,
        "m0",
        "02:00:00:00:01:01",
        &peer,
        "m1",
        "02:00:00:00:01:02",
    )
    .unwrap();
    ns.ip(&["addr", "add", "10.143.0.1/24", "dev", "m0"])
        .unwrap();
    let k = start_in(&ns, &["monitor", "-p", "5604"]);
    assert_eq!(metrics_addr(&k), "127.0.0.1:9464".parse().unwrap());
    let (status, body) = http_get_in(&ns, "127.0.0.1:9464".parse().unwrap(), "/metrics").unwrap();
    assert!(
        status.contains("200") && body.contains("kdrop_events_total"),
        "{status}"
    );
    let refused = http_get_in(&ns, "10.143.0.1:9464".parse().unwrap(), "/metrics");
    assert_eq!(
        refused.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
    drop(k);

    // Told otherwise, it listens there.
    let k = start_in(
        &ns,
        &["monitor", "-p", "5604", "--listen", "10.143.0.1:9464"],
    );
    let (status, _) = http_get_in(&ns, "10.143.0.1:9464".parse().unwrap(), "/metrics").unwrap();
    assert!(status.contains("200"), "{status}");
    drop(k);
}

#[test]
fn sigterm_leaves_no_program_link_or_map() {
    let k = Kdrop::start(&["monitor", "-p", "5608", "--listen", "127.0.0.1:0"]);
    let objects = integration_tests::bpf_objects_of(k.pid());
    assert!(
        objects.iter().any(|(what, _)| *what == "map"),
        "{objects:?}"
    );
    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    for (what, id) in objects {
        // Freed when the last reference goes, which can trail the exit:
        // bounded polling, there is no event to wait on.
        let gone = (0..200).any(|_| {
            let exists = integration_tests::bpf_object_exists(what, id);
            if exists {
                std::thread::sleep(Duration::from_millis(10));
            }
            !exists
        });
        assert!(gone, "{what} {id} still exists after kdrop monitor exited");
    }
}

#[test]
fn bad_listen_address_is_one_line_exit_2() {
    for args in [
        &["monitor", "--listen", "nope"][..],
        &["monitor", "--listen", "192.0.2.1:9464"],
        &["monitor", "--sample-every", "0"],
        &["monitor", "--output", "/nonexistent-kdrop-dir/events.jsonl"],
        &["monitor", "--netns", "no-such-netns-kdrop"],
    ] {
        let done = Kdrop::spawn(args, &[]).wait(Duration::from_secs(20));
        assert_eq!(done.status.code(), Some(2), "{args:?}: {done:?}");
        assert_eq!(done.stderr.len(), 1, "{args:?}: {done:?}");
        assert!(done.stderr[0].starts_with("kdrop: "), "{done:?}");
    }
}

/// A Prometheus server (Debian's package), in its own directory and
/// namespace, killed and removed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
}

impl Prometheus {
    fn start(ns: &Ns, target: SocketAddr, listen: SocketAddr) -> Self {
        let dir = std::env::temp_dir().join(format!("kdrop-prom-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
                 - job_name: kdrop\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "prometheus"])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus (Debian package prometheus)");
        Prometheus { child, dir }
    }

    /// Runs an instant query until `want` accepts its value (bounded: the
    /// server needs to start and scrape once or twice; scaled, as 5.10's
    /// TCG guest took longer than 30 s to).
    fn query_until(ns: &Ns, api: SocketAddr, q: &str, want: impl Fn(f64) -> bool) -> f64 {
        let path = format!("/api/v1/query?query={}", urlencode(q));
        let deadline = Instant::now() + integration_tests::bound(Duration::from_secs(30));
        let mut last = String::new();
        loop {
            if let Ok((status, body)) = http_get_in(ns, api, &path) {
                if status.contains("200") {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let value = v["data"]["result"][0]["value"][1]
                        .as_str()
                        .and_then(|s| s.parse::<f64>().ok());
                    if let Some(x) = value.filter(|x| want(*x)) {
                        return x;
                    }
                }
                last = body;
            }
            assert!(Instant::now() < deadline, "query {q}: {last}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn prometheus_scrapes_the_provoked_drops() {
    let p = Pair::new("prom", 144);
    // kdrop and Prometheus share a namespace of their own: fixed loopback
    // ports that nothing else on the machine can hold.
    let home = Ns::new(&ns_name("prom-home")).unwrap();
    let k = start_in(&home, &["monitor", "--netns", &p.server.name, "-p", "5605"]);
    let target: SocketAddr = "127.0.0.1:9464".parse().unwrap();
    let api: SocketAddr = "127.0.0.1:9090".parse().unwrap();
    let _prom = Prometheus::start(&home, target, api);
    let _socks = closed_port_syns(&p, 49001, 5605, 7);

    Prometheus::query_until(&home, api, "up{job=\"kdrop\"}", |v| v == 1.0);
    let drops = Prometheus::query_until(
        &home,
        api,
        &format!(
            "sum(kdrop_drops_total{{reason=\"{}\",port=\"5605\",ifname=\"s0\"}})",
            expected_reason_label("NO_SOCKET")
        ),
        |v| v >= 7.0,
    );
    assert_eq!(drops, 7.0);
    let causes = Prometheus::query_until(
        &home,
        api,
        &format!(
            "kdrop_findings_total{{cause=\"{}\"}}",
            expected_cause("no_socket")
        ),
        |v| v >= 7.0,
    );
    assert_eq!(causes, 7.0);
    Prometheus::query_until(
        &home,
        api,
        "kdrop_probe_attached{point=\"skb:kfree_skb\",rung=\"tp_btf\"}",
        |v| v == 1.0,
    );
    // The exposition passes promtool's own checks.
    let (_, body) = http_get_in(&home, target, "/metrics").unwrap();
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
}

/// A process in a namespace, placed in a cgroup shaped like the kubelet's
/// (cgroupfs driver, v1 pids hierarchy here): the pod a drop belongs to.
struct FakePod {
    child: Child,
    created: Vec<PathBuf>,
}

impl FakePod {
    fn start(ns: &Ns, uid: &str, container: &str) -> Self {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "sleep", "60"])
            .spawn()
            .unwrap();
        let root = [
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup",
        ]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists())
        .expect("a cgroup hierarchy");
        let mut created = Vec::new();
        let mut dir = root;
        for part in [
            "kubepods".to_string(),
            "besteffort".to_string(),
            format!("pod{uid}"),
            container.to_string(),
        ] {
            dir = dir.join(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap();
                created.push(dir.clone());
            }
        }
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        FakePod { child, created }
    }
}

impl Drop for FakePod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for d in self.created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[test]
fn drops_are_attributed_to_the_pod_of_their_namespace() {
    let p = Pair::new("pod", 146);
    let uid = format!("{:08x}-1234-4abc-9def-0123456789ab", std::process::id());
    let container = "4f1a9c2be7d04a55b6e0c3d2a1f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a291";
    let _pod = FakePod::start(&p.server, &uid, container);
    let k = Kdrop::start(&[
        "monitor",
        "--netns",
        &p.server.name,
        "-p",
        "5607",
        "--listen",
        "127.0.0.1:0",
    ]);
    let addr = metrics_addr(&k);
    let _socks = closed_port_syns(&p, 46601, 5607, 2);
    let m = scrape_until(addr, "2 drops", |m| events(m, "matched") == 2);
    assert_eq!(
        value(
            &m,
            "kdrop_drops_total",
            &[
                ("pod", uid.as_str()),
                ("port", "5607"),
                ("reason", expected_reason_label("NO_SOCKET"))
            ]
        ),
        Some(2),
        "{m}"
    );
}

/// One SYN from the client to each of `keys` closed server ports: as many
/// distinct aggregation keys.
fn syns_to_distinct_ports(p: &Pair, keys: u16, first_sport: u16) {
    let (src, dst) = (p.client_v4(0), p.server_v4(0));
    in_netns(&p.client.path(), move || {
        for i in 0..keys {
            let src = SocketAddr::new(src.ip(), first_sport + i);
            let dst = SocketAddr::new(dst.ip(), 20000 + i);
            // The socket goes at once (fds are limited); its SYN is sent.
            drop(syn_here(src, dst).unwrap_or_else(|e| panic!("SYN {src} -> {dst}: {e}")));
        }
    })
    .unwrap();
}

/// kdrop_drops_total's series and their sum.
fn drop_series(m: &str) -> (usize, u64) {
    let series: Vec<u64> = m
        .lines()
        .filter(|l| l.starts_with("kdrop_drops_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    (series.len(), series.iter().sum())
}

#[test]
fn bounded_map_and_series_cap_overflow_explicitly() {
    // More distinct (reason, netns, ifindex, port) keys than the kernel map
    // holds (4096), one drop each.
    const KEYS: u16 = 4100;
    const MAP_KEYS: u64 = 4096;
    let p = Pair::new("ovf", 147);
    // No SYN may wait for (or be dropped by) address resolution.
    p.client
        .ip(&[
            "neigh",
            "replace",
            "10.147.0.2",
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "c0",
            "nud",
            "permanent",
        ])
        .unwrap();
    let overflow = [("reason", "overflow"), ("port", "overflow")];
    for (first_sport, max_series, want_series, want_overflow) in [
        // The kernel map's bound alone: its overflow key.
        (
            30000,
            5000,
            MAP_KEYS as usize + 1,
            u64::from(KEYS) - MAP_KEYS,
        ),
        // The series cap: 99 own series, the rest in the overflow one.
        (40000, 100, 100, u64::from(KEYS) - 99),
    ] {
        let k = Kdrop::start(&[
            "monitor",
            "--netns",
            &p.server.name,
            "--listen",
            "127.0.0.1:0",
            "--events-per-sec",
            "1",
            "--max-series",
            &max_series.to_string(),
        ]);
        let addr = metrics_addr(&k);
        syns_to_distinct_ports(&p, KEYS, first_sport);
        let m = scrape_until(addr, "every drop", |m| {
            events(m, "matched") == u64::from(KEYS)
        });
        check_accounting(&m);
        // Nothing lost to the bounds: every drop is in some series.
        let (n, total) = drop_series(&m);
        assert_eq!(total, u64::from(KEYS), "--max-series {max_series}");
        assert_eq!(n, want_series, "--max-series {max_series}");
        assert_eq!(
            value(&m, "kdrop_drops_total", &overflow),
            Some(want_overflow),
            "--max-series {max_series}"
        );
    }
}

/// A SYN from the calling thread's namespace (see `send_syn`).
fn syn_here(src: SocketAddr, dst: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::{FromRawFd as _, IntoRawFd as _};
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        panic!("IPv4 only")
    };
    // SAFETY: plain socket calls on an fd owned right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    assert!(fd >= 0);
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let sin = |a: std::net::SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let (ss, ds) = (sin(s), sin(d));
    if unsafe { libc::bind(fd, (&raw const ss).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    unsafe { libc::connect(fd, (&raw const ds).cast(), len) };
    // SAFETY: the fd is a socket we own.
    Ok(unsafe { std::net::TcpStream::from_raw_fd(owned.into_raw_fd()) })
}

/// `Tcp: InCsumErrors` of `/proc/net/snmp` in `ns` (thread-self: /proc/net
/// is the main thread's namespace, not the one this thread entered).
fn tcp_csum_errors(ns: &Ns) -> u64 {
    let snmp = in_netns(&ns.path(), || {
        std::fs::read_to_string("/proc/thread-self/net/snmp")
    })
    .unwrap()
    .unwrap();
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap(), tcp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "InCsumErrors")
        .expect("InCsumErrors in /proc/net/snmp");
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// A SYN from `src` to `dst` with a wrong TCP checksum, sent from a raw
/// socket in `ns` (the kernel writes the IP header).
fn bad_checksum_syn(ns: &Ns, src: std::net::SocketAddrV4, dst: std::net::SocketAddrV4) {
    let mut tcp = syn_segment(src, dst, 0x1000_0000);
    let right = u16::from_be_bytes([tcp[16], tcp[17]]);
    tcp[16..18].copy_from_slice(&right.wrapping_add(1).to_be_bytes());
    send_raw_tcp(ns, src, dst, &tcp);
}

/// The exit drain is the tracing mode's: a drop kdrop holds back (no
/// finding of its own: a bad checksum, held in case its handshake's
/// verdict follows) when the monitor is told to stop must still be
/// written, not lost with the held queue.
#[test]
fn monitor_writes_a_held_record_at_exit() {
    let p = Pair::new("monheld", 147);
    let out = std::env::temp_dir().join(format!("kdrop-monheld-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let k = Kdrop::start(&[
        "monitor",
        "--netns",
        &p.server.name,
        "-p",
        "5607",
        "--listen",
        "127.0.0.1:0",
        "--events-per-sec",
        "0",
        "--output",
        out.to_str().unwrap(),
    ]);
    let lines = || -> Vec<Record> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(Record::parse)
            .collect()
    };
    // A first drop in the namespace, written at once (a refused SYN has a
    // finding of its own): kdrop has read what it needs of this namespace,
    // so the next record is not slowed past its hold.
    let _first = send_syn(&p.client, p.client_v4(46600), p.server_v4(5607));
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while lines().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first drop was never written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (std::net::SocketAddr::V4(src), std::net::SocketAddr::V4(dst)) =
        (p.client_v4(46601), p.server_v4(5607))
    else {
        unreachable!()
    };
    let before = tcp_csum_errors(&p.server);
    bad_checksum_syn(&p.client, src, dst);
    // Stop as soon as the kernel has dropped it: well inside the hold.
    let deadline = Instant::now() + Duration::from_secs(5);
    while tcp_csum_errors(&p.server) == before {
        assert!(Instant::now() < deadline, "the bad SYN was never dropped");
        std::thread::sleep(Duration::from_millis(2));
    }
    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    let lines = lines();
    let _ = std::fs::remove_file(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let e = &lines[1];
    assert_eq!(e.sport, 46601, "{e}");
    assert_eq!(e.dport, 5607, "{e}");
    assert_eq!(e.tcp_flags, "SYN", "{e}");
    assert_eq!(e.reason.as_deref(), reason_for("TCP_CSUM"), "{e}");
    assert!(e.location.starts_with("tcp_v4_rcv"), "{e}");
}
