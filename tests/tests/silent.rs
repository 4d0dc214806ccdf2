//! Handshakes that die without a drop, with clients that give up as real
//! ones do: after 3 s (two transmissions) or 1 s (one). The client's socket
//! leaving SYN-SENT is the last word kdrop gets from it; the verdict must
//! come then, not after a third transmission that never happens.
//! Oracles: `ss` and /proc/net/netstat in the listener's namespace, the
//! client's own connect() result.
use std::{net::SocketAddr, process::Command, time::Duration, time::Instant};

use integration_tests::{connect_within, listen_backlog, Kdrop, Ns, Pair};

/// `ss -ltn`'s Recv-Q and Send-Q (waiting, backlog) for the listener on
/// `local`, inside `ns`.
fn ss_listen_queues(ns: &Ns, local: SocketAddr) -> (u64, u64) {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, "ss", "-ltnH"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some(local.to_string().as_str()))
        .unwrap_or_else(|| panic!("ss shows no listener on {local}:\n{text}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[1].parse().unwrap(), f[2].parse().unwrap())
}

/// A listener of backlog 1 on `server` that never accepts, its accept queue
/// filled by two completed connections from the client (ports 42001-2).
fn full_listener(p: &Pair, server: SocketAddr) -> std::os::fd::OwnedFd {
    let l = listen_backlog(&p.server, server, 1);
    for port in [42001, 42002] {
        connect_within(&p.client, p.client_v4(port), server, Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("filling the queue from :{port}: {e}"));
    }
    // The kernel's test: more waiting than the backlog (sk_acceptq_is_full).
    assert_eq!(ss_listen_queues(&p.server, server), (2, 1));
    l
}

/// A client that gives up after `timeout` on a listener whose accept queue
/// is full: kdrop names the listener's overflow for that handshake, right
/// after the client gives up.
fn given_up_on_a_full_listener(name: &str, net: u8, timeout: Duration, sport: u16) {
    let p = Pair::new(name, net);
    let server = p.server_v4(7000);
    let _l = full_listener(&p, server);
    let k = Kdrop::start(&["--port", "7000", "--json"]);
    let client = p.client_v4(sport);
    let t0 = Instant::now();
    let err = connect_within(&p.client, client, server, timeout).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    let gave_up = t0.elapsed();
    let e = k.expect_event_within("the handshake's verdict", Duration::from_secs(3), |e| {
        e["saddr"] == client.ip().to_string() && e["sport"] == sport
    });
    let verdict_after = t0.elapsed() - gave_up;
    assert!(
        verdict_after < Duration::from_secs(2),
        "verdict {verdict_after:?} after the client gave up"
    );
    assert_eq!(e["kind"], "unanswered", "{e:#}");
    assert_eq!(e["daddr"], server.ip().to_string());
    assert_eq!(e["dport"], 7000);
    let f = &e["finding"];
    assert_eq!(f["cause"], "listen_overflow", "{e:#}");
    let (waiting, backlog) = ss_listen_queues(&p.server, server);
    let summary = f["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("is full: {waiting}/{backlog} waiting")),
        "{summary}"
    );
    let ev: Vec<&str> = f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let sent = ev[0];
    assert!(
        sent.contains("then the client's connect() ended in SYN-SENT: the application closed it"),
        "{sent}"
    );
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
}

#[test]
fn a_client_giving_up_after_3s_on_a_full_accept_queue_gets_its_verdict() {
    given_up_on_a_full_listener("sd3", 211, Duration::from_secs(3), 42011);
}

#[test]
fn a_client_giving_up_after_1s_on_a_full_accept_queue_gets_its_verdict() {
    given_up_on_a_full_listener("sd1", 212, Duration::from_millis(1000), 42012);
}
