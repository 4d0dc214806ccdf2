//! Real drops provoked in namespaces, reported with exact tuples and reasons.
use std::net::Ipv4Addr;

use integration_tests::{
    attachable_rungs, expected_cause, expected_reason, expected_rp_filter_cause, inode, kdrop_bin,
    ns_name, reason_for, send_syn, Kdrop, Pair,
};
use kdrop::lab::rp_filter::RpFilter;

/// Incident 1 with addresses, names and ports the lab does not use.
#[test]
fn rp_filter_drop_is_ip_rpfilter_with_exact_tuple() {
    let topo = RpFilter {
        prefix: ns_name("rpf-"),
        client_ip: Ipv4Addr::new(203, 0, 113, 44),
        pod_ip: Ipv4Addr::new(10, 31, 7, 9),
        port: 3306,
        node_primary: Ipv4Addr::new(10, 31, 6, 5),
        node_secondary: Ipv4Addr::new(10, 31, 7, 5),
        primary_if: "ens4".into(),
        secondary_if: "ens6".into(),
    };
    let lab = topo.build().unwrap();
    let k = Kdrop::start(&["--json", "--port", "3306", "--netns", &lab.node.name]);
    let src = "203.0.113.44:41001".parse().unwrap();
    let dst = "10.31.7.9:3306".parse().unwrap();
    let _syn = send_syn(&lab.client, src, dst);

    let e = k.expect_record("the rp_filter drop", |e| e.is_tuple(&src, &dst));
    assert_eq!(e.kind, "drop");
    assert_eq!(e.reason.as_deref(), reason_for("IP_RPFILTER"));
    assert_eq!(e.tcp_flags, "SYN");
    assert_eq!(e.family, "ipv4");
    assert_eq!(e.ifname, "ens6");
    assert_eq!(e.netns, inode(&lab.node));
    assert_eq!(e.netns_name.as_deref(), Some(lab.node.name.as_str()));
    assert!(e.location.starts_with("ip_rcv_finish"), "{e}");
    assert_eq!(e.finding().cause, expected_rp_filter_cause());
    assert!(e.ts.as_str().ends_with('Z'));

    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    let c = done.counts();
    assert!(c.matched >= 1);
    assert_eq!(c.matched, c.emitted + c.lost, "{c:?}");
    assert_eq!(c.received, c.emitted, "{c:?}");
    let summary = format!(
        "kdrop:   {}",
        expected_reason("IP_RPFILTER").as_str().unwrap_or("unknown")
    );
    assert!(
        done.stderr.iter().any(|l| l.starts_with(&summary)),
        "{:?}",
        done.stderr
    );
}

#[test]
fn syn_to_closed_port_is_no_socket_v4_and_v6() {
    let p = Pair::new("nosock", 41);
    let k = Kdrop::start(&["--json", "--netns", &p.server.name, "--port", "5501"]);
    for (src, dst) in [
        (p.client_v4(42001), p.server_v4(5501)),
        (p.client_v6(42002), p.server_v6(5501)),
    ] {
        let _syn = send_syn(&p.client, src, dst);
        let e = k.expect_record("the NO_SOCKET drop", |e| e.is_tuple(&src, &dst));
        assert_eq!(e.reason.as_deref(), reason_for("NO_SOCKET"));
        assert_eq!(e.tcp_flags, "SYN");
        assert_eq!(e.family, if src.is_ipv4() { "ipv4" } else { "ipv6" });
        assert_eq!(e.ifname, "s0");
        assert_eq!(e.netns, inode(&p.server));
        assert_eq!(e.finding().cause, expected_cause("no_socket"));
    }
    let c = k.stop(libc::SIGTERM).counts();
    assert_eq!(c.matched, c.emitted + c.lost, "{c:?}");
    assert!(c.received >= 2, "{c:?}");
}

#[test]
fn iptables_drop_in_input_is_netfilter_drop() {
    let p = Pair::new("nfdrop", 42);
    p.server
        .exec(
            "iptables",
            &["-A", "INPUT", "-p", "tcp", "--dport", "5502", "-j", "DROP"],
        )
        .unwrap();
    let k = Kdrop::start(&["--json", "--netns", &p.server.name, "-p", "5502"]);
    let (src, dst) = (p.client_v4(42003), p.server_v4(5502));
    let _syn = send_syn(&p.client, src, dst);
    let e = k.expect_record("the netfilter drop", |e| e.is_tuple(&src, &dst));
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"));
    assert_eq!(e.ifname, "s0");
    assert_eq!(e.netns, inode(&p.server));
    // Also without drop reasons (5.10): nf_hook_slow frees only on NF_DROP,
    // and the rule walker's verdict, where its probe attached, says so too.
    assert_eq!(e.finding().cause, "netfilter_rule", "{e}");
    assert_eq!(
        e.netfilter().rule.as_deref(),
        Some("-A INPUT -p tcp -m tcp --dport 5502 -j DROP")
    );
    k.stop(libc::SIGINT);
}

/// Filters that do not match the drop see nothing (not even in the kernel's
/// matched counter); the same filters loosened to match do see it.
#[test]
fn filters_that_do_not_match_see_nothing() {
    let p = Pair::new("filt", 43);
    let (src, dst) = (p.client_v4(42004), p.server_v4(5503));
    let server = p.server.name.as_str();
    let client = p.client.name.as_str();
    let matching = [
        Kdrop::start(&["--json", "--netns", server, "--port", "5503"]),
        Kdrop::start(&[
            "--json",
            "--netns",
            server,
            "--iface",
            "s0",
            "--host",
            "10.43.0.0/24",
        ]),
        Kdrop::start(&["--json", "--port", "42004"]),
    ];
    let missing = [
        Kdrop::start(&["--json", "--netns", server, "--port", "5504"]),
        Kdrop::start(&["--json", "--netns", server, "--host", "10.44.0.0/16"]),
        Kdrop::start(&["--json", "--netns", server, "--host", "fd00:43::1"]),
        Kdrop::start(&["--json", "--netns", server, "--iface", "lo"]),
        Kdrop::start(&["--json", "--netns", client, "--port", "5503"]),
    ];
    let _syn = send_syn(&p.client, src, dst);
    for k in &matching {
        k.expect_record("the drop, through a matching filter", |e| {
            e.is_tuple(&src, &dst)
        });
    }
    // The kernel counts synchronously at the drop: once a matching tracer has
    // the event, a non-matching one would have counted it too.
    for k in missing {
        let done = k.stop(libc::SIGINT);
        let c = done.counts();
        assert_eq!(c.matched, 0, "{:?}", done.stderr);
        assert!(done.stdout.is_empty(), "{:?}", done.stdout);
    }
}

/// A non-handshake packet is not reported unless --all-flags.
#[test]
fn non_handshake_drops_need_all_flags() {
    let p = Pair::new("flags", 44);
    // The handshake completes up to the client's final ACK, which INPUT drops.
    p.server
        .exec(
            "iptables",
            &[
                "-A", "INPUT", "-p", "tcp", "--dport", "5505", "!", "--syn", "-j", "DROP",
            ],
        )
        .unwrap();
    let listener = kdrop::context::netns::in_netns(&p.server.path(), || {
        std::net::TcpListener::bind("10.44.0.2:5505")
    })
    .unwrap()
    .unwrap();
    let handshake_only = Kdrop::start(&["--json", "--netns", &p.server.name, "-p", "5505"]);
    let all = Kdrop::start(&[
        "--json",
        "--netns",
        &p.server.name,
        "-p",
        "5505",
        "--all-flags",
    ]);
    let (src, dst) = (p.client_v4(42005), p.server_v4(5505));
    let _syn = send_syn(&p.client, src, dst);
    let e = all.expect_record("the dropped ACK", |e| e.is_tuple(&src, &dst));
    assert_eq!(e.tcp_flags, "ACK");
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"));
    assert_eq!(handshake_only.stop(libc::SIGINT).counts().matched, 0);
    drop(listener);
}

/// Each rung `kdrop check` can attach here (KDROP_RUNG picks one) reports the
/// same drop with the same facts: tp_btf and raw_tp on this host, all three
/// on the VM kernels (`cargo xtask vm`), where tracefs is mounted.
#[test]
fn every_attachable_rung_reports_the_drop() {
    let rungs = attachable_rungs();
    // Every rung the oracle says this kernel allows must have attached.
    for want in integration_tests::oracle::kernel().kfree_skb_rungs {
        assert!(rungs.iter().any(|r| r == want), "{want} missing: {rungs:?}");
    }
    let p = Pair::new("rungs", 165);
    for (i, rung) in rungs.iter().enumerate() {
        let k = Kdrop::start_env(
            &["--json", "--netns", &p.server.name, "-p", "5508"],
            &[("KDROP_RUNG", rung)],
        );
        let ready = k.stderr_seen.last().unwrap();
        assert!(ready.contains(&format!("via {rung}")), "{ready}");
        let (src, dst) = (p.client_v4(42010 + i as u16), p.server_v4(5508));
        let _syn = send_syn(&p.client, src, dst);
        let e = k.expect_record(&format!("the drop via {rung}"), |e| e.is_tuple(&src, &dst));
        assert_eq!(e.reason.as_deref(), reason_for("NO_SOCKET"), "{rung}: {e}");
        assert_eq!(e.tcp_flags, "SYN", "{rung}: {e}");
        assert_eq!(e.ifname, "s0", "{rung}: {e}");
        assert_eq!(e.netns, inode(&p.server), "{rung}: {e}");
        assert!(e.location.starts_with("tcp_v4_rcv"), "{rung}: {e}");
        let c = k.stop(libc::SIGINT).counts();
        assert_eq!(c.matched, c.emitted + c.lost, "{rung}: {c:?}");
    }
}

/// Where tracefs is not mounted (this machine; here a private mount namespace
/// without it, so the machine's own mounts stay as they are) and only the
/// classic tracepoint may be used, kdrop mounts tracefs and reports the drop.
#[test]
fn tracepoint_rung_mounts_tracefs_when_needed() {
    let p = Pair::new("tracefs", 166);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "umount -l /sys/kernel/debug 2>/dev/null; umount -l /sys/kernel/tracing 2>/dev/null; \
             ! [ -e /sys/kernel/tracing/events ] || { echo 'tracefs still mounted' >&2; exit 1; }; \
             exec \"$0\" \"$@\"",
        )
        .arg(kdrop_bin())
        .args(["--json", "--netns", &p.server.name, "-p", "5509"])
        .env("KDROP_RUNG", "tracepoint")
        .env("KDROP_LOG", "info");
    let k = Kdrop::start_command(cmd);
    let seen = k.stderr_seen.join("\n");
    assert!(
        seen.contains("mounted tracefs at /sys/kernel/tracing"),
        "{seen}"
    );
    assert!(seen.contains("via tracepoint"), "{seen}");
    let (src, dst) = (p.client_v4(42020), p.server_v4(5509));
    let _syn = send_syn(&p.client, src, dst);
    let e = k.expect_record("the drop via the tracepoint", |e| e.is_tuple(&src, &dst));
    assert_eq!(e.reason.as_deref(), reason_for("NO_SOCKET"), "{e}");
    assert_eq!(e.ifname, "s0", "{e}");
    assert!(e.location.starts_with("tcp_v4_rcv"), "{e}");
    k.stop(libc::SIGINT);
}
