//! Causes named from the listener's and the device's side, traced with the
//! service's port only: a listener that never calls accept() (backlog 1),
//! a backlog capped by net.core.somaxconn (repaired by the sysctl kdrop
//! prints), a final ACK refused by a full accept queue, and a tc clsact
//! ingress filter that drops the SYN (repaired by the `tc filter del` kdrop
//! prints). The test's own listen() calls, sysctls, `tc filter show` and
//! /proc/self are the oracles.
use std::{
    net::SocketAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, IntoRawFd as _, OwnedFd},
    process::Command,
    time::Duration,
};

use integration_tests::{
    assert_kinds, connect_from, in_ns, kernel_has_drop_reasons, kernel_reason, listen, reason_for,
    record::Record, run_fix, send_syn, skip, wait_until, Kdrop, Ns, Pair,
};
use kdrop::context::in_netns;
use kdrop::diagnosis::fix_kinds::Kind;

/// A listener in `ns` with listen(2)'s `backlog`, never accepting.
fn listen_backlog(ns: &Ns, addr: SocketAddr, backlog: i32) -> OwnedFd {
    in_netns(&ns.path(), move || {
        let fd = std::net::TcpListener::bind(addr).unwrap().into_raw_fd();
        // SAFETY: fd is a listening socket we own; listen(2) again sets
        // sk_max_ack_backlog to min(backlog, somaxconn).
        assert_eq!(unsafe { libc::listen(fd, backlog) }, 0);
        unsafe { OwnedFd::from_raw_fd(fd) }
    })
    .unwrap()
}

/// Accepts one waiting connection (non-blocking listener not needed: one
/// is known to wait).
fn accept_one(l: &OwnedFd) {
    // SAFETY: a listening socket; null address arguments are allowed.
    let fd = unsafe { libc::accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(fd >= 0, "accept: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor we own.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
}

/// `ss -ltnH`'s Recv-Q of the listener on `local`.
fn accept_queue(ns: &Ns, local: SocketAddr) -> u32 {
    in_ns(ns, &["ss", "-ltnH"])
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some(local.to_string().as_str()))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// This process as kdrop should name the listener's owner.
fn me() -> (String, u32) {
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    (comm.trim_end().to_string(), std::process::id())
}

/// Fills a backlog-1 listener: two completed handshakes wait (the kernel
/// refuses when more than the backlog wait).
fn fill(p: &Pair, at: SocketAddr, first_port: u16) -> Vec<OwnedFd> {
    (0..2)
        .map(|i| {
            let fd = send_syn(&p.client, p.client_v4(first_port + i), at);
            wait_until("a handshake completing", || {
                accept_queue(&p.server, at) == u32::from(i) + 1
            });
            fd
        })
        .collect()
}

/// The "unanswered" record of the client's port.
fn unanswered(k: &Kdrop, sport: u16) -> Record {
    k.expect_record_within("the unanswered SYN", Duration::from_secs(20), |e| {
        e.kind == "unanswered" && e.sport == sport
    })
}

#[test]
fn a_listener_that_never_accepts_is_named_with_its_queue() {
    let p = Pair::new("lovf", 191);
    p.server.sysctl("net/core/somaxconn", "4096").unwrap();
    let at = p.server_v4(7191);
    let l = listen_backlog(&p.server, at, 1);
    let k = Kdrop::start(&["--json", "--port", "7191"]);
    let _held = fill(&p, at, 41001);
    let _syn = send_syn(&p.client, p.client_v4(41003), at);
    let e = unanswered(&k, 41003);
    assert_eq!(
        (e.saddr.as_str(), e.daddr.as_str(), e.dport),
        ("10.191.0.1", "10.191.0.2", 7191),
        "{e}"
    );
    let f = e.finding();
    let (comm, pid) = me();
    assert_eq!(f.cause, "listen_overflow", "{e}");
    assert_eq!(
        f.summary,
        format!(
            "accept queue of {comm} (pid {pid}) on 10.191.0.2:7191 is full: 2/1 waiting; it is \
             not calling accept() fast enough"
        )
    );
    let ev = f.evidence.clone();
    assert!(
        ev[0].starts_with("SYN 10.191.0.1:41003 -> 10.191.0.2:7191: ")
            && ev[0].contains("only the counters below show it"),
        "{ev:?}"
    );
    assert_eq!(
        ev[1],
        format!(
            "listener 10.191.0.2:7191 in netns {}: accept queue 2 waiting, backlog 1 (the \
             kernel refuses when more than 1 wait), SYN queue 0 request sockets",
            p.server.name
        )
    );
    assert!(
        ev[2].starts_with(&format!("owner: {comm} (pid {pid}): ")),
        "{ev:?}"
    );
    assert!(ev[3].starts_with("net.core.somaxconn = 4096, "), "{ev:?}");
    assert!(ev[4].starts_with("TcpExt ListenOverflows "), "{ev:?}");
    // The app chose backlog 1: nothing on the node repairs it.
    assert!(f.fix.clone().is_empty(), "{e}");
    assert!(f.fix_notes.clone()[0].starts_with(&format!(
        "{comm} (pid {pid}) asked listen() for a backlog of 1 (net.core.somaxconn is 4096)"
    )));
    k.stop(libc::SIGINT);
    // The note's repair: the application accepts; a new connection works.
    accept_one(&l);
    accept_one(&l);
    connect_from(&p.client, p.client_v4(41004), at).expect("after accepting");
}

#[test]
fn a_backlog_capped_by_somaxconn_is_repaired_by_the_sysctl() {
    let p = Pair::new("lsmx", 192);
    p.server.sysctl("net/core/somaxconn", "1").unwrap();
    let at = p.server_v4(7192);
    // The application asks for 64; the kernel keeps min(64, somaxconn) = 1.
    let l = listen_backlog(&p.server, at, 64);
    let k = Kdrop::start(&["--json", "--port", "7192"]);
    let _held = fill(&p, at, 41011);
    let _syn = send_syn(&p.client, p.client_v4(41013), at);
    let e = unanswered(&k, 41013);
    let f = e.finding();
    let (comm, pid) = me();
    assert_eq!(f.cause, "listen_overflow", "{e}");
    assert_eq!(
        f.summary,
        format!(
            "accept queue of {comm} (pid {pid}) on 10.192.0.2:7192 is full: 2/1 waiting; it is \
             not calling accept() fast enough"
        )
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        vec![format!(
            "ip netns exec {} sysctl -w net.core.somaxconn=4096",
            p.server.name
        )]
    );
    let notes = f.fix_notes.clone();
    assert!(
        notes[1].contains(&format!("until {comm} (pid {pid}) calls listen() again")),
        "{notes:?}"
    );
    k.stop(libc::SIGINT);
    assert_kinds(&fix, &[Kind::Somaxconn]);
    for cmd in &fix {
        run_fix(cmd);
    }
    assert_eq!(
        in_ns(&p.server, &["sysctl", "-n", "net.core.somaxconn"]).trim(),
        "4096"
    );
    // The note: the application calls listen() again (a restart), asking
    // for its 64; the queue now has room for a new connection.
    // SAFETY: the listening socket we own.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 64) }, 0);
    connect_from(&p.client, p.client_v4(41014), at).expect("after the fix");
}

#[test]
fn a_final_ack_refused_by_a_full_queue_is_a_handshake_packet() {
    let p = Pair::new("lack", 194);
    p.server.sysctl("net/core/somaxconn", "4096").unwrap();
    let at = p.server_v4(7194);
    // Backlog 2, not 1: the request queue must hold two requests on every
    // kernel. v5.10's `inet_csk_reqsk_queue_is_full` is `qlen >=
    // sk_max_ack_backlog` (include/net/inet_connection_sock.h), so Debian's
    // 5.10 takes only one request behind a backlog-1 listener and answers
    // the second SYN with a cookie (no request in SYN-RECV: the setup
    // below never saw two); the Debian 6.1 and 6.12 kernels take
    // backlog + 1. The accept queue is full only when more than the
    // backlog wait (`sk_acceptq_is_full`: `>`), on all of them.
    let _l = listen_backlog(&p.server, at, 2);
    let k = Kdrop::start(&["--json", "--port", "7194"]);
    // Two connections wait for accept(): room for one more.
    let _waiting: Vec<OwnedFd> = [41019, 41020]
        .into_iter()
        .map(|port| send_syn(&p.client, p.client_v4(port), at))
        .collect();
    wait_until("the first two handshakes", || {
        accept_queue(&p.server, at) == 2
    });
    // The client's final ACKs are held back until two requests wait.
    let block = [
        "iptables",
        "-I",
        "OUTPUT",
        "-p",
        "tcp",
        "--dport",
        "7194",
        "--tcp-flags",
        "SYN,ACK,RST,FIN",
        "ACK",
        "-j",
        "DROP",
    ];
    in_ns(&p.client, &block);
    let syns: Vec<OwnedFd> = (0..2)
        .map(|i| send_syn(&p.client, p.client_v4(41021 + i), at))
        .collect();
    wait_until("two requests in SYN-RECV", || {
        in_ns(&p.server, &["ss", "-tnH", "state", "syn-recv"])
            .lines()
            .count()
            == 2
    });
    // The SYN-ACKs' retransmissions now get ACKs through: one fits (3
    // waiting), the other is refused.
    let mut unblock = block;
    unblock[1] = "-D";
    in_ns(&p.client, &unblock);
    // The clients believe they are connected: data from them completes the
    // handshakes too (no wait for the SYN-ACKs' retransmission timers).
    for s in &syns {
        // SAFETY: a connected socket we own; one byte from a static buffer.
        unsafe { libc::send(s.as_raw_fd(), b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    }
    // Before 6.15 the kernel has no reason for it: tcp_v4_rcv frees the
    // refused final ACK as NOT_SPECIFIED (`discard_and_relse` after
    // tcp_check_req's `listen_overflow`, v6.14 net/ipv4/tcp_ipv4.c), like
    // much else there, and ListenOverflows moves: kdrop's listen watch
    // names the listener from that counter (kind listen_overflow).
    let by_reason = kernel_reason("TCP_LISTEN_OVERFLOW").is_some();
    let e = k.expect_record_within("the refused final ACK", Duration::from_secs(15), |e| {
        if by_reason {
            e.kind == "drop" && e.reason.as_deref() == Some("TCP_LISTEN_OVERFLOW")
        } else {
            e.kind == "listen_overflow"
        }
    });
    if by_reason {
        // The bare final ACK, or the first data segment that carries it.
        let flags = e.tcp_flags.as_str();
        assert!(flags.contains("ACK") && !flags.contains("SYN"), "{e}");
    }
    assert_eq!(e.netns_name.as_deref(), Some(p.server.name.as_str()), "{e}");
    assert_eq!((e.daddr.as_str(), e.dport), ("10.194.0.2", 7194));
    let f = e.finding();
    assert_eq!(f.cause, "listen_overflow", "{e}");
    let (comm, pid) = me();
    assert_eq!(
        f.summary,
        format!(
            "accept queue of {comm} (pid {pid}) on 10.194.0.2:7194 is full: 3/2 waiting; it is \
             not calling accept() fast enough"
        )
    );
    let ev = f.evidence.clone();
    if by_reason {
        assert!(
            ev[0].starts_with("kernel drop reason TCP_LISTEN_OVERFLOW at "),
            "{ev:?}"
        );
    } else {
        assert!(
            ev[0].starts_with("TcpExt +") && ev[0].contains(" ListenOverflows"),
            "{ev:?}"
        );
    }
    let fin = k.stop(libc::SIGINT);
    // No RST of these clients is called a refused SYN-ACK.
    let events = fin.records();
    assert!(
        !events.iter().any(|e| e
            .finding
            .as_ref()
            .is_some_and(|f| f.cause == "syn_ack_reset")),
        "{events:?}"
    );
}

/// `tc filter show dev DEV ingress`'s handle of the filter at `pref`.
fn tc_handle(ns: &Ns, dev: &str, pref: u16) -> String {
    let text = Command::new("tc")
        .args(["-n", &ns.name, "filter", "show", "dev", dev, "ingress"])
        .output()
        .unwrap()
        .stdout;
    let text = String::from_utf8(text).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(&format!(" pref {pref} ")) && l.contains(" handle "))
        .unwrap_or_else(|| panic!("no filter at pref {pref}:\n{text}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    w[w.iter().position(|x| *x == "handle").unwrap() + 1].to_string()
}

/// Drops IPv4 TCP segments with SYN set and ACK clear (classic BPF over
/// the Ethernet header), else TC_ACT_UNSPEC (see drop_programs.rs).
const DROP_SYN: &str = "12,40 0 0 12,21 0 8 2048,48 0 0 23,21 0 6 6,40 0 0 20,69 4 0 8191,\
177 0 0 14,80 0 0 27,84 0 0 18,21 1 0 2,6 0 0 4294967295,6 0 0 2";

#[test]
fn a_tc_ingress_filter_dropping_the_syn_is_named_and_deleted() {
    if !kernel_has_drop_reasons() {
        skip(
            "a_tc_ingress_filter_dropping_the_syn_is_named_and_deleted",
            "no-drop-reasons",
            "the cause is told from the kernel's drop reason",
        );
        return;
    }
    let p = Pair::new("tcin", 193);
    let ns = p.server.name.clone();
    let at = p.server_v4(7193);
    let _srv = listen(&p.server, at);
    let tc = |args: &[&str]| {
        let out = Command::new("tc")
            .args(["-n", &ns])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "tc {args:?}: {out:?}");
    };
    tc(&["qdisc", "add", "dev", "s0", "clsact"]);
    tc(&[
        "filter", "add", "dev", "s0", "ingress", "pref", "10", "protocol", "ip", "bpf", "da",
        "bytecode", DROP_SYN,
    ]);
    let handle = tc_handle(&p.server, "s0", 10);
    let k = Kdrop::start(&["--json", "--port", "7193"]);
    let _syn = send_syn(&p.client, p.client_v4(41093), at);
    let e = k.expect_record_within("the SYN's drop", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.sport == 41093
    });
    assert_eq!(e.reason.as_deref(), reason_for("TC_INGRESS"), "{e}");
    assert_eq!(
        (e.netns_name.as_deref(), e.ifname.as_str()),
        (Some(ns.as_str()), "s0")
    );
    assert_eq!(
        (e.saddr.as_str(), e.daddr.as_str(), e.dport),
        ("10.193.0.1", "10.193.0.2", 7193)
    );
    // It died before routing: no route lookup of another packet rides along.
    assert!(e.route_lookups.is_empty(), "{e}");
    let f = e.finding();
    assert_eq!(f.cause, "tc_filter", "{e}");
    assert_eq!(
        f.summary,
        format!(
            "SYN 10.193.0.1:41093 -> 10.193.0.2:7193 dropped by the tc ingress filter on s0 in \
             netns {ns}: pref 10 bpf handle {handle}"
        )
    );
    let ev = f.evidence.clone();
    assert!(
        ev[1].starts_with(&format!(
            "tc ingress on s0: filter protocol ip pref 10 bpf chain 0 handle {handle}"
        )) && ev[1].contains("direct-action")
            && ev[1].contains(&format!("bytecode '{DROP_SYN}'")),
        "{ev:?}"
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        vec![format!(
            "ip netns exec {ns} tc filter del dev s0 ingress protocol ip pref 10 handle {handle} bpf"
        )]
    );
    k.stop(libc::SIGINT);
    assert_kinds(&fix, &[Kind::TcFilterDelete]);
    for cmd in &fix {
        run_fix(cmd);
    }
    connect_from(&p.client, p.client_v4(41094), at).expect("after the fix");
}

#[test]
fn a_duplicate_syn_joins_the_verdict_of_the_lost_syn_ack() {
    if !kernel_has_drop_reasons() {
        skip(
            "a_duplicate_syn_joins_the_verdict_of_the_lost_syn_ack",
            "no-drop-reasons",
            "the cause is told from the kernel's drop reason",
        );
        return;
    }
    let p = Pair::new("dsyn", 197);
    let at = p.server_v4(7197);
    let _srv = listen(&p.server, at);
    // The client never gets the SYN-ACK: it repeats its SYN while the
    // server's request socket waits.
    in_ns(
        &p.client,
        &[
            "iptables",
            "-I",
            "INPUT",
            "-p",
            "tcp",
            "--sport",
            "7197",
            "--tcp-flags",
            "SYN,ACK",
            "SYN,ACK",
            "-j",
            "DROP",
        ],
    );
    let k = Kdrop::start(&["--json", "--port", "7197"]);
    let _syn = send_syn(&p.client, p.client_v4(41097), at);
    let e = k.expect_record_within("the repeated SYN", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.tcp_flags == "SYN" && e.sport == 41097
    });
    assert_eq!(e.reason.as_deref(), Some("NOT_SPECIFIED"), "{e}");
    assert_eq!(e.netns_name.as_deref(), Some(p.server.name.as_str()), "{e}");
    let f = e.finding();
    // The handshake's verdict is the rule that drops the SYN-ACK; the
    // repeated SYN adds what it shows.
    assert_eq!(f.cause, "netfilter_rule", "{e}");
    let ev = f.evidence.clone();
    assert!(
        ev.contains(
            &"this packet of the same handshake, by itself: SYN 10.197.0.1:41097 -> \
              10.197.0.2:7197 repeated while the server's SYN-ACK for it was outstanding: the \
              server resent its SYN-ACK, so the SYN-ACK or the client's final ACK is being lost \
              on the way [duplicate_syn]"
                .to_string()
        ),
        "{ev:?}"
    );
    k.stop(libc::SIGINT);
}

/// Loads `r0 = ret; exit` as a program of `prog_type` named `name`
/// (BPF_PROG_LOAD, include/uapi/linux/bpf.h), as drop_programs.rs does.
fn load_prog(prog_type: u32, name: &str, ret: i32) -> OwnedFd {
    let mut insns = vec![0xb7u8, 0, 0, 0];
    insns.extend_from_slice(&ret.to_le_bytes());
    insns.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    let license = std::ffi::CString::new("GPL").unwrap();
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&prog_type.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..48 + name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: attr is valid for its length; the pointers outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_mut_ptr(), attr.len()) };
    assert!(
        fd >= 0,
        "loading {name}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// A private bpffs, unmounted on drop.
struct Bpffs(std::path::PathBuf);

impl Bpffs {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("kdt{}-causes-bpffs", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "bpf", "bpf", dir.to_str().unwrap()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting bpffs");
        Bpffs(dir)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn an_xdp_program_dropping_the_syn_is_named_and_detached() {
    if !kernel_has_drop_reasons() {
        skip(
            "an_xdp_program_dropping_the_syn_is_named_and_detached",
            "no-drop-reasons",
            "the cause is told from the kernel's drop reason",
        );
        return;
    }
    let p = Pair::new("xdpd", 198);
    let ns = p.server.name.clone();
    let at = p.server_v4(7198);
    let _srv = listen(&p.server, at);
    // XDP drops ARP too: the neighbours are known in advance.
    p.client
        .ip(&[
            "neigh",
            "replace",
            "10.198.0.2",
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "c0",
            "nud",
            "permanent",
        ])
        .unwrap();
    p.server
        .ip(&[
            "neigh",
            "replace",
            "10.198.0.1",
            "lladdr",
            "02:00:00:00:00:01",
            "dev",
            "s0",
            "nud",
            "permanent",
        ])
        .unwrap();
    let fs = Bpffs::new();
    let prog = load_prog(6, "kdt_xdp_drop", 1); // XDP_DROP
    let pin = fs.0.join("kdt_xdp_drop");
    let c = std::ffi::CString::new(pin.to_str().unwrap()).unwrap();
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    // SAFETY: BPF_OBJ_PIN with a valid attr.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, 6, attr.as_mut_ptr(), attr.len()) };
    assert_eq!(rc, 0, "pin: {}", std::io::Error::last_os_error());
    p.server
        .ip(&[
            "link",
            "set",
            "dev",
            "s0",
            "xdpgeneric",
            "pinned",
            pin.to_str().unwrap(),
        ])
        .unwrap();
    // The oracle for the program's id: bpftool.
    let shown: serde_json::Value = serde_json::from_slice(
        &Command::new("bpftool")
            .args(["-j", "prog", "show", "pinned", pin.to_str().unwrap()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let id = shown["id"].as_u64().unwrap();
    let k = Kdrop::start(&["--json", "--port", "7198"]);
    let _syn = send_syn(&p.client, p.client_v4(41098), at);
    let e = k.expect_record_within("the SYN's drop", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.sport == 41098
    });
    // Generic XDP frees it with plain kfree_skb (NOT_SPECIFIED on 6.18)
    // in do_xdp_generic; the place says XDP.
    assert!(e.location.starts_with("do_xdp_generic+"), "{e}");
    assert_eq!(
        (e.netns_name.as_deref(), e.ifname.as_str()),
        (Some(ns.as_str()), "s0")
    );
    let f = e.finding();
    assert_eq!(f.cause, "xdp_program", "{e}");
    assert_eq!(
        f.summary,
        format!(
            "SYN 10.198.0.1:41098 -> 10.198.0.2:7198 dropped by the XDP program on s0 in netns \
             {ns}: kdt_xdp_drop id {id}"
        )
    );
    let ev = f.evidence.clone();
    assert!(
        ev[1].starts_with(&format!(
            "XDP (generic) on s0: BPF program id {id} (xdp) name kdt_xdp_drop tag "
        )),
        "{ev:?}"
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        vec![format!(
            "ip netns exec {ns} ip link set dev s0 xdpgeneric off"
        )]
    );
    k.stop(libc::SIGINT);
    assert_kinds(&fix, &[Kind::XdpDetach]);
    for cmd in &fix {
        run_fix(cmd);
    }
    connect_from(&p.client, p.client_v4(41099), at).expect("after the fix");
}

/// A cgroup of the test's own under the cgroup2 mount, removed on drop.
struct Cgroup(std::path::PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs python3 `code` in the client namespace from a process that joined
/// `cg` first (its sockets belong to that cgroup).
fn in_cgroup(cg: &Cgroup, ns: &Ns, code: &str) -> std::process::Child {
    Command::new("sh")
        .args([
            "-c",
            &format!(
                "echo $$ > {}/cgroup.procs && exec ip netns exec {} python3 -c '{code}'",
                cg.0.display(),
                ns.name
            ),
        ])
        .spawn()
        .unwrap()
}

#[test]
fn a_cgroup_egress_program_is_named_and_detached() {
    if !kernel_has_drop_reasons() {
        skip(
            "a_cgroup_egress_program_is_named_and_detached",
            "no-drop-reasons",
            "the cause is told from the kernel's drop reason",
        );
        return;
    }
    let p = Pair::new("cgde", 199);
    let at = p.server_v4(7199);
    let _srv = listen(&p.server, at);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = kdrop::context::bpf_progs::cgroup2_mount(&info).expect("cgroup2 mounted");
    let cg = Cgroup(root.join(format!("kdt{}-cg", std::process::id())));
    std::fs::create_dir_all(&cg.0).unwrap();
    let prog = load_prog(8, "kdt_cg_drop", 0); // cgroup_skb: 0 drops
    let dir = std::fs::File::open(&cg.0).unwrap();
    let mut attr = [0u8; 32];
    attr[0..4].copy_from_slice(&(dir.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&1u32.to_ne_bytes()); // BPF_CGROUP_INET_EGRESS
                                                      // SAFETY: BPF_PROG_ATTACH with a valid attr.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, 8, attr.as_mut_ptr(), attr.len()) };
    assert_eq!(rc, 0, "attach: {}", std::io::Error::last_os_error());
    let cg_path = cg.0.display().to_string();
    let shown: serde_json::Value = serde_json::from_slice(
        &Command::new("bpftool")
            .args(["-j", "cgroup", "show", &cg_path])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let id = shown[0]["id"].as_u64().expect("bpftool shows the program");
    let k = Kdrop::start(&["--json", "--port", "7199"]);
    let mut client = in_cgroup(
        &cg,
        &p.client,
        "import socket,time\ns=socket.socket()\ns.bind((\"10.199.0.1\",41199))\n\
         s.setblocking(False)\ntry: s.connect((\"10.199.0.2\",7199))\nexcept OSError: pass\n\
         time.sleep(4)",
    );
    let pid = client.id();
    let e = k.expect_record_within("the SYN's drop", Duration::from_secs(10), |e| {
        e.kind == "drop" && e.sport == 41199
    });
    assert_eq!(e.reason.as_deref(), Some("BPF_CGROUP_EGRESS"), "{e}");
    let f = e.finding();
    assert_eq!(f.cause, "bpf_cgroup", "{e}");
    assert_eq!(
        f.summary,
        format!(
            "SYN 10.199.0.1:41199 -> 10.199.0.2:7199 dropped by the cgroup egress BPF program \
             of python3 (pid {pid}): kdt_cg_drop id {id} on {cg_path}"
        )
    );
    let fix = f.fix.clone();
    assert_eq!(
        fix,
        vec![format!("bpftool cgroup detach {cg_path} egress id {id}")]
    );
    k.stop(libc::SIGINT);
    let _ = client.kill();
    let _ = client.wait();
    assert_kinds(&fix, &[Kind::CgroupDetach]);
    for cmd in &fix {
        run_fix(cmd);
    }
    let ok = in_cgroup(
        &cg,
        &p.client,
        "import socket\nsocket.create_connection((\"10.199.0.2\",7199),timeout=3)",
    )
    .wait()
    .unwrap();
    assert!(ok.success(), "a new connection after the fix");
}
