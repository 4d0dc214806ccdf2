//! `kdrop record` on a real drop lab, the lab torn down, then `kdrop
//! explain` as an unprivileged user: the same records, byte for byte in
//! JSON and in text, and the loss before them.
use std::{
    net::{Ipv4Addr, SocketAddr},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use integration_tests::{kdrop_bin, ns_name, reason_for, send_syn, Kdrop, Pair, Record};
use kdrop::lab::rp_filter::RpFilter;

fn topo(test: &str, net: u8) -> RpFilter {
    RpFilter {
        prefix: ns_name(&format!("{test}-")),
        client_ip: Ipv4Addr::new(192, 0, 2, net),
        pod_ip: Ipv4Addr::new(10, net, 7, 9),
        port: 5432,
        node_primary: Ipv4Addr::new(10, net, 6, 5),
        node_secondary: Ipv4Addr::new(10, net, 7, 5),
        primary_if: "ens4".into(),
        secondary_if: "ens6".into(),
    }
}

/// A directory everyone may read, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(ns_name(test));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `kdrop explain BUNDLE ARGS` as nobody, with no capabilities.
fn explain_unprivileged(bundle: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
    ])
    .arg(kdrop_bin())
    .arg("explain")
    .arg(bundle)
    .args(args);
    let out = cmd.output().expect("running setpriv");
    assert!(
        out.status.success(),
        "explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Lines of stdout until `want` accepts one (bounded), all kept.
fn lines_until(k: &Kdrop, what: &str, want: impl Fn(&Record) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(line) = k.next_line(left) else { break };
        let v = Record::parse(&line);
        seen.push(line);
        if want(&v) {
            return seen;
        }
    }
    panic!("no event for {what}; saw {seen:?}")
}

/// Text lines of stdout until one contains `has` (bounded), all kept.
fn text_until(k: &Kdrop, what: &str, has: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(line) = k.next_line(left) else { break };
        let done = line.contains(has);
        seen.push(line);
        if done {
            return seen;
        }
    }
    panic!("no line for {what}; saw {seen:?}")
}

#[test]
fn rp_filter_recorded_then_explained_unprivileged_after_teardown() {
    let t = topo("rec1", 151);
    let scratch = Scratch::new("rec1");
    let bundle = scratch.0.join("incident.kdrop");
    let pcap = scratch.0.join("incident.pcapng");
    let lab = t.build().unwrap();
    let names = [
        lab.client.name.clone(),
        lab.node.name.clone(),
        lab.vpc.name.clone(),
    ];
    let k = Kdrop::start(&[
        "record",
        "-o",
        bundle.to_str().unwrap(),
        "--pcap",
        pcap.to_str().unwrap(),
        "--json",
        "--netns",
        &lab.node.name,
        "-p",
        "5432",
    ]);
    let src = SocketAddr::from((t.client_ip, 40100));
    let dst = SocketAddr::from((t.pod_ip, t.port));
    let syn = send_syn(&lab.client, src, dst);
    // The first SYN's drop, then its retransmission's with the kernel's
    // own route lookups (the route probe armed in between).
    let mut live = lines_until(&k, "the rp_filter drop", |e| e.sport == 40100);
    live.extend(lines_until(&k, "the retransmission", |e| {
        e.sport == 40100 && !e.route_lookups.is_empty()
    }));
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{:?}", done.stderr);
    live.extend(done.stdout.iter().cloned());
    let counts = done.counts();
    assert!(
        done.stderr
            .iter()
            .any(|l| l.starts_with("kdrop: recorded ")),
        "{:?}",
        done.stderr
    );
    // The node is gone before anything is explained.
    drop(syn);
    drop(lab);
    for n in &names {
        assert!(!netns_exists(n), "{n} still exists");
    }

    let out = explain_unprivileged(&bundle, &["--json"]);
    let replayed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(replayed, live, "explain --json differs from the live run");
    // And they are the findings the lab provokes (not only equal).
    let first = Record::parse(&replayed[0]);
    assert_eq!(first.reason.as_deref(), reason_for("IP_RPFILTER"));
    assert_eq!(first.finding().cause, "rp_filter_strict", "{first}");
    assert_eq!(first.netns_name.as_deref(), Some(names[1].as_str()));
    assert_eq!(first.ifname, "ens6");
    assert_eq!(first.saddr, "192.0.2.151");

    // Loss first, with the live run's own counters.
    let err = String::from_utf8(out.stderr).unwrap();
    let loss = format!(
        "kdrop:   drops: {} matched, {} recorded, {} lost (ring full), {} sampled out, 0 capped",
        counts.matched, counts.emitted, counts.lost, counts.sampled_out
    );
    assert!(err.contains(&loss), "{err}");
    assert!(
        err.lines()
            .nth(1)
            .is_some_and(|l| l.ends_with("matched records never reached the bundle")),
        "{err}"
    );
    let summary = format!("kdrop: {} events in ", live.len());
    assert!(err.contains(&summary), "{err}");

    // Text too: what the records say, as the live run would print them.
    let text = explain_unprivileged(&bundle, &[]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("rp_filter"), "{text}");
    assert!(text.contains("192.0.2.151:40100"), "{text}");

    // The packets, as Wireshark's reader sees them: one per drop record,
    // the headers the kernel copied, the reason and cause in the comment.
    let drops: Vec<Record> = live
        .iter()
        .map(|l| Record::parse(l))
        .filter(|e| e.kind == "drop")
        .collect();
    let fields = tshark(
        &pcap,
        &[
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "frame.interface_name",
            "-e",
            "ip.src",
            "-e",
            "ip.dst",
            "-e",
            "tcp.srcport",
            "-e",
            "tcp.flags.syn",
            "-e",
            "frame.comment",
        ],
    );
    let rows: Vec<&str> = fields.lines().collect();
    assert_eq!(rows.len(), drops.len(), "{fields}");
    let ens6 = format!("{}/ens6", names[1]);
    for row in &rows {
        let cols: Vec<&str> = row.split('|').collect();
        assert_eq!(
            cols[..4],
            [ens6.as_str(), "192.0.2.151", "10.151.7.9", "40100"],
            "{row}"
        );
        assert!(cols[4] == "1" || cols[4] == "True", "{row}");
        assert!(
            cols[5].starts_with("IP_RPFILTER at ") || !kernel_has_reasons(),
            "{row}"
        );
        assert!(
            cols[5].contains("rp_filter_strict: strict reverse-path filter on ens6"),
            "{row}"
        );
    }
    let info = tshark(&pcap, &["-V", "-c", "1"]);
    assert!(info.contains("Raw IP"), "{info}");

    // The same packets again from the bundle alone, written by nobody.
    let theirs = scratch.0.join("nobody");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let again = theirs.join("again.pcapng");
    let out = explain_unprivileged(&bundle, &["--json", "--pcap", again.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().lines().count(),
        live.len()
    );
    let all = [
        "-T",
        "fields",
        "-e",
        "frame.interface_name",
        "-e",
        "frame.time_epoch",
        "-e",
        "frame.len",
        "-e",
        "frame.comment",
        "-e",
        "tcp.seq_raw",
    ];
    assert_eq!(tshark(&again, &all), tshark(&pcap, &all));
}

fn kernel_has_reasons() -> bool {
    reason_for("IP_RPFILTER").is_some()
}

/// `tshark -r FILE ARGS`, its stdout.
fn tshark(file: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
        .expect("running tshark (cargo xtask bootstrap installs it)");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A rule's drop: the netfilter snapshots around it are in the bundle, and
/// the text output comes back byte for byte.
/// An iptables-legacy DROP of `port` in the server's namespace, and
/// `kdrop record` (text) of that port there into `bundle`.
fn record_a_dropped_port(p: &Pair, bundle: &Path, port: u16) -> Kdrop {
    let port = port.to_string();
    p.server
        .exec(
            "iptables-legacy",
            &["-A", "INPUT", "-p", "tcp", "--dport", &port, "-j", "DROP"],
        )
        .unwrap();
    Kdrop::start(&[
        "record",
        "-o",
        bundle.to_str().unwrap(),
        "--netns",
        &p.server.name,
        "-p",
        &port,
    ])
}

#[test]
fn netfilter_rule_recorded_in_text_then_explained() {
    let p = Pair::new("recnf", 152);
    let scratch = Scratch::new("recnf");
    let bundle = scratch.0.join("nf.kdrop");
    let rule = "-A INPUT -p tcp -m tcp --dport 6201 -j DROP";
    let server = p.server.name.clone();
    let k = record_a_dropped_port(&p, &bundle, 6201);
    let (src, dst) = (p.client_v4(42201), p.server_v4(6201));
    let syn = send_syn(&p.client, src, dst);
    let mut live = text_until(&k, "the rule's drop", rule);
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{:?}", done.stderr);
    live.extend(done.stdout.iter().cloned());
    drop(syn);
    drop(p);
    assert!(!netns_exists(&server));

    let text = explain_unprivileged(&bundle, &[]);
    let replayed: Vec<String> = String::from_utf8(text.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(replayed, live, "explain differs from the live run");
    // The rule and its counters, from the snapshots the bundle kept.
    let json = explain_unprivileged(&bundle, &["--json"]);
    let stdout = String::from_utf8(json.stdout).unwrap();
    let first = Record::parse(stdout.lines().next().unwrap());
    assert_eq!(
        first.reason.as_deref(),
        reason_for("NETFILTER_DROP"),
        "{first}"
    );
    assert_eq!(first.netfilter().rule.as_deref(), Some(rule), "{first}");
    assert_eq!(
        first.netfilter().backend.as_deref(),
        Some("iptables-legacy"),
        "{first}"
    );
    assert_eq!(first.finding().cause, "netfilter_rule", "{first}");
    let before = first.netfilter().packets_before.unwrap();
    let after = first.netfilter().packets_after.unwrap();
    assert!(after > before, "{first}");
}

/// One finding repeated over 11 s, each time by a new connection: printed
/// in full, then one line while it repeats within 10 s of that print, then
/// in full again. `explain` replays the run in milliseconds and still
/// prints the same lines: the window runs on the records' own times.
#[test]
fn repeats_over_more_than_10_s_folded_the_same_when_explained() {
    let p = Pair::new("recrep", 153);
    let scratch = Scratch::new("recrep");
    let bundle = scratch.0.join("rep.kdrop");
    let server = p.server.name.clone();
    let k = record_a_dropped_port(&p, &bundle, 6301);
    let start = Instant::now();
    let mut live = Vec::new();
    // The print, a repeat 5 s later (folded), one 11 s later (past the
    // window): the spacing in time is what is tested.
    for (port, at) in [(42301, 0), (42302, 5), (42303, 11)] {
        let due = start + Duration::from_secs(at);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let src = p.client_v4(port);
        let syn = send_syn(&p.client, src, p.server_v4(6301));
        live.extend(text_until(&k, "the drop", &format!(" {src} -> ")));
        // Closed unanswered: no retransmission in the way.
        drop(syn);
    }
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{:?}", done.stderr);
    live.extend(done.stdout.iter().cloned());
    drop(p);
    assert!(!netns_exists(&server));

    let full = live
        .iter()
        .filter(|l| l.starts_with("  why: ") && l.ends_with(" [netfilter_rule]"))
        .count();
    let folded = live
        .iter()
        .filter(|l| l.ends_with("  (the same finding: [netfilter_rule] above)"))
        .count();
    assert!(full >= 2 && folded >= 1, "{live:#?}");
    let text = explain_unprivileged(&bundle, &[]);
    let replayed: Vec<String> = String::from_utf8(text.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(replayed, live, "explain differs from the live run");
}

#[test]
fn explain_refuses_what_is_not_a_bundle() {
    let scratch = Scratch::new("rec2");
    let junk = scratch.0.join("junk");
    std::fs::write(&junk, b"not gzip at all").unwrap();
    let out = Command::new(kdrop_bin())
        .arg("explain")
        .arg(&junk)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("not a kdrop bundle"), "{err}");
    let missing = Command::new(kdrop_bin())
        .args(["explain", "/nonexistent/bundle"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
}
