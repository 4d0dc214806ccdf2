//! Starting, stopping and refusing: signals leave nothing behind, limits stop
//! kdrop by themselves, bad input is one line and exit code 2.
use std::time::Duration;

use integration_tests::{assert_released, bpf_objects_of, send_syn, Kdrop, Pair};

fn leaves_nothing_after(signal: i32) {
    let k = Kdrop::start(&["--port", "5599"]);
    let objects = bpf_objects_of(k.pid());
    for kind in ["prog", "link", "map"] {
        assert!(
            objects.iter().any(|(k, _)| *k == kind),
            "kdrop holds no {kind}: {objects:?}"
        );
    }
    let done = k.stop(signal);
    assert!(done.status.success(), "{done:?}");
    assert!(
        done.stderr.iter().any(|l| l.contains("(matched ")),
        "{done:?}"
    );
    assert_released(&objects);
}

#[test]
fn sigint_leaves_no_program_or_link() {
    leaves_nothing_after(libc::SIGINT);
}

#[test]
fn sigterm_leaves_no_program_or_link() {
    leaves_nothing_after(libc::SIGTERM);
}

#[test]
fn count_stops_after_n_events() {
    let p = Pair::new("count", 45);
    let k = Kdrop::start(&[
        "--json",
        "--netns",
        &p.server.name,
        "-p",
        "5506",
        "--count",
        "2",
    ]);
    let mut socks = Vec::new();
    for port in 43001..43004 {
        socks.push(send_syn(&p.client, p.client_v4(port), p.server_v4(5506)));
    }
    let done = k.wait(Duration::from_secs(10));
    assert!(done.status.success(), "{done:?}");
    assert_eq!(done.records().len(), 2, "{done:?}");
    assert_eq!(done.counts().received, 2);
}

#[test]
fn duration_stops_by_itself() {
    // Its own quiet namespace: the kernel is shared with other runs whose
    // drops could match a port alone.
    let ns = integration_tests::Ns::new(&integration_tests::ns_name("dur")).unwrap();
    let k = Kdrop::start(&["--duration", "0.3", "--port", "5507", "--netns", &ns.name]);
    let done = k.wait(Duration::from_secs(10));
    assert!(done.status.success(), "{done:?}");
    assert_eq!(
        done.counts(),
        integration_tests::Counts {
            received: 0,
            matched: 0,
            emitted: 0,
            lost: 0,
            sampled_out: 0,
        }
    );
}

/// A namespace that forwards hides what is not NAT'd there: kdrop says so
/// at start, and only there.
#[test]
fn a_forwarding_namespace_says_what_it_does_not_follow() {
    let ns = integration_tests::Ns::new(&integration_tests::ns_name("fwd")).unwrap();
    let without = |forward: &str| {
        ns.sysctl("net/ipv4/ip_forward", forward).unwrap();
        let k = Kdrop::start(&["--duration", "0.3", "--port", "5508", "--netns", &ns.name]);
        let done = k.wait(Duration::from_secs(10));
        assert!(done.status.success(), "{done:?}");
        done.stderr
            .iter()
            .any(|l| l.starts_with("kdrop: without forwarded handshakes not NAT'd here"))
    };
    assert!(without("1"));
    assert!(!without("0"));
}

/// Runs kdrop to completion and returns (exit code, stderr lines).
fn refused(args: &[&str], env: &[(&str, &str)]) -> (i32, Vec<String>) {
    let done = Kdrop::spawn(args, env).wait(Duration::from_secs(10));
    (done.status.code().unwrap_or(-1), done.stderr)
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["--port", "http"], "not a port"),
        (&["--port", "70000"], "not a port"),
        (&["--host", "10.0.0.0/40"], "bad prefix length"),
        (&["--host", "example.com"], "not an address or CIDR"),
        (
            &["--netns", "kdrop-no-such-netns"],
            "unknown netns kdrop-no-such-netns",
        ),
        (&["--netns", "/etc/hostname"], "is not a network namespace"),
        (&["--iface", "nosuch0"], "unknown interface nosuch0"),
        (&["--duration", "soon"], "not a number of seconds"),
        (&["--count", "-1"], "'-1'"),
        (&["--ring-size", "3"], "ring size"),
        (&["--frobnicate"], "unexpected argument"),
        // Every flag, given garbage (torture, issue 3).
        (&["--port="], "not a port"),
        (&["--host="], "not an address or CIDR"),
        (&["--netns="], "is not a network namespace"),
        (&["--iface="], "unknown interface"),
        (
            &["--iface", "eth0", "--netns", "kdrop-no-such"],
            "unknown netns",
        ),
        (&["--json=yes"], "unexpected value 'yes'"),
        (&["--all-flags=1"], "unexpected value '1'"),
        (&["--duration", "inf"], "positive number of seconds"),
        (&["--count", "many"], "'many'"),
        (&["--ring-size", "big"], "not a size in KiB"),
        (&["--sample", "0"], "sample must be a whole number"),
        (&["--sample", "1/100"], "sample must be a whole number"),
        (&["--sample", "4294967296"], "sample must be a whole number"),
    ];
    for (args, want) in cases {
        let (code, stderr) = refused(args, &[]);
        assert_eq!(code, 2, "{args:?}: {stderr:?}");
        assert_eq!(stderr.len(), 1, "{args:?}: {stderr:?}");
        assert!(stderr[0].starts_with("kdrop: "), "{args:?}: {stderr:?}");
        assert!(stderr[0].contains(want), "{args:?}: {stderr:?}");
    }
}

#[test]
fn unknown_forced_rung_is_exit_2() {
    let (code, stderr) = refused(&["--port", "1"], &[("KDROP_RUNG", "kprobe")]);
    assert_eq!(code, 2, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    assert!(
        stderr[0].contains("KDROP_RUNG=kprobe: not a rung"),
        "{stderr:?}"
    );
}

#[test]
fn missing_btf_is_exit_2() {
    let (code, stderr) = refused(&["--port", "1"], &[("KDROP_BTF", "/nonexistent/vmlinux")]);
    assert_eq!(code, 2, "{stderr:?}");
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    assert!(
        stderr[0].contains("no kernel BTF at /nonexistent/vmlinux"),
        "{stderr:?}"
    );
}

#[test]
fn not_root_is_exit_2() {
    let bin = integration_tests::kdrop_bin();
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&bin)
        .args(["--port", "1"])
        .output()
        .expect("running setpriv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("kdrop: needs root"), "{stderr}");
}

#[test]
fn check_reports_the_chosen_rung() {
    let out = std::process::Command::new(integration_tests::kdrop_bin())
        .arg("check")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // This host and the VM kernels (5.10, 6.1, 6.12) allow tp_btf
    // (../shared/notes/kernel.md).
    assert!(
        stdout.contains("skb:kfree_skb (drop path): using tp_btf"),
        "{stdout}"
    );
    let reasons = if integration_tests::kernel_has_drop_reasons() {
        "drop reasons in enum skb_drop_reason"
    } else {
        "no enum skb_drop_reason (drop reasons need 5.17+)"
    };
    assert!(stdout.contains(reasons), "{stdout}");
}

/// Runs `kdrop <args>` with its stdout's reader gone (`kdrop check |
/// head -0`), after `then` (given kdrop's stderr lines so far, once it
/// says `until`); its exit status and stderr.
fn with_closed_stdout(
    args: &[&str],
    until: Option<&str>,
    then: impl FnOnce(),
) -> (std::process::ExitStatus, String) {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(integration_tests::kdrop_bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    if let Some(until) = until {
        while !seen.lines().any(|l| l.starts_with(until)) {
            assert!(stderr.read_line(&mut seen).unwrap() > 0, "{seen}");
        }
    }
    then();
    // kdrop's stderr ends when it exits; past the test's bound it is
    // killed (before it is reaped: the pid is still ours).
    let pid = child.id() as i32;
    let (done, exited) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        let limit = integration_tests::bound(Duration::from_secs(20));
        if exited.recv_timeout(limit).is_err() {
            // SAFETY: kill(2) of our child, not yet waited for.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let _ = std::io::Read::read_to_string(&mut stderr, &mut seen);
    let _ = done.send(());
    guard.join().unwrap();
    let status = child.wait().unwrap();
    (status, seen)
}

#[test]
fn a_closed_stdout_ends_every_mode_quietly() {
    // check: on to its verdict, its exit code.
    let (status, stderr) = with_closed_stdout(&["check"], None, || {});
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    // trace: the first record it cannot write ends it, with its summary.
    let p = Pair::new("closed", 46);
    let args = ["--netns", &p.server.name, "-p", "5508"];
    let (status, stderr) = with_closed_stdout(&args, Some("kdrop: tracing"), || {
        let _syn = send_syn(&p.client, p.client_v4(43010), p.server_v4(5508));
    });
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(stderr.contains("(matched "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // lab: the fix is still proven, everything torn down.
    let (status, stderr) = with_closed_stdout(&["lab", "rp-filter"], None, || {});
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(stderr.contains("the handshake now completes"), "{stderr}");
    assert!(stderr.contains("lab torn down"), "{stderr}");
}

#[test]
fn lab_catches_the_rp_filter_drop_and_cleans_up() {
    let out = std::process::Command::new(integration_tests::kdrop_bin())
        .args(["lab", "rp-filter", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let e = integration_tests::Record::parse(String::from_utf8_lossy(&out.stdout).trim_end());
    assert_eq!(
        e.reason.as_deref(),
        integration_tests::reason_for("IP_RPFILTER")
    );
    assert_eq!(e.saddr, "198.51.100.7");
    assert_eq!(e.daddr, "10.0.2.20");
    assert_eq!(e.dport, 8080);
    assert_eq!(e.ifname, "eth1");
    let ns = e.netns_name.as_deref().unwrap();
    assert!(
        !std::path::Path::new("/run/netns").join(ns).exists(),
        "{ns} left behind"
    );
}
