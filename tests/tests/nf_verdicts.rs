//! The kernel's own netfilter verdicts (fexit/kretprobe on nf_conntrack_in,
//! nf_nat_inet_fn, nft_do_chain, ipt_do_table) on real drops: each test
//! runs where the oracle (tests/src/oracle.rs) says its point attaches, and
//! fails if kdrop check did not attach it; it skips, visibly, only where
//! tests/src/allowed_skips.rs allows (this host: no kprobes, no fexit; 5.10:
//! no module BTF for nftables).
use std::{
    net::SocketAddr,
    os::fd::{AsRawFd as _, OwnedFd},
    sync::Mutex,
};

use integration_tests::{
    inode, nf::nft, oracle, reason_for, return_rung_or_skip, send_syn, skip, Kdrop, Ns, Pair,
    Record,
};
use kdrop::context::netns::in_netns;

/// One at a time: the conntrack test shrinks the global nf_conntrack_max.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The first drop arms the verdict probes (kdrop pays for them only while a
/// netfilter drop asks): its record names the rule from the counters; the
/// retransmitted SYN's drop carries the kernel's own verdict.
fn with_verdict(k: &Kdrop, what: &str, src: &SocketAddr, dst: &SocketAddr) -> Record {
    let first = k.expect_record(what, |e| e.is_tuple(src, dst));
    let method = first.netfilter.as_ref().map_or("", |n| n.method.as_str());
    // A packet nft_do_chain frees itself (Debian's 6.12) never has an
    // NF_DROP verdict: the caller skips on its location, no retransmission
    // would carry more.
    let freed_inside = first.location.starts_with("nft_do_chain+");
    if method.starts_with("kernel verdict") || freed_inside {
        return first;
    }
    k.expect_record(
        &format!("{what}, retransmitted, with the kernel's verdict"),
        |e| {
            e.is_tuple(src, dst)
                && e.netfilter
                    .as_ref()
                    .is_some_and(|n| n.method.starts_with("kernel verdict"))
        },
    )
}

fn evidence(e: &Record) -> Vec<String> {
    e.netfilter().evidence.clone()
}

#[test]
fn ipt_do_table_verdict_confirms_the_counted_rule() {
    let Some(rung) = return_rung_or_skip("ipt_do_table_verdict", "ipt_do_table") else {
        return;
    };
    let _g = serial();
    let p = Pair::new("vipt", 91);
    p.server
        .exec(
            "iptables-legacy",
            &["-A", "INPUT", "-p", "tcp", "--dport", "6201", "-j", "DROP"],
        )
        .unwrap();
    let k = Kdrop::start(&["--json", "--netns", &p.server.name, "-p", "6201"]);
    let (src, dst) = (p.client_v4(42201), p.server_v4(6201));
    let _syn = send_syn(&p.client, src, dst);
    let e = with_verdict(&k, "the iptables drop", &src, &dst);
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"), "{e}");
    let nf = e.netfilter();
    assert_eq!(
        nf.method,
        format!(
            "kernel verdict ({rung} on ipt_do_table) + rule counters (iptables-legacy-save -c)"
        ),
        "{e}"
    );
    assert_eq!(
        nf.rule.as_deref(),
        Some("-A INPUT -p tcp -m tcp --dport 6201 -j DROP"),
        "{e}"
    );
    assert_eq!(nf.hook.as_deref(), Some("INPUT"), "{e}");
    let ev = evidence(&e);
    assert!(
        ev[0].starts_with("kernel: ipt_do_table returned NF_DROP for this packet (")
            && ev[0].contains("hook INPUT"),
        "{ev:?}"
    );
    // The table's name needs struct xt_table from module BTF (not on 5.10).
    if oracle::kernel().module_btf {
        assert!(ev[0].contains("table filter"), "{ev:?}");
    }
    assert_eq!(e.finding().cause, "netfilter_rule", "{e}");
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    // The verdict records are accounted like drops (the SYN may have been
    // sent again meanwhile: at least one).
    let line = done
        .stderr
        .iter()
        .find_map(|l| l.strip_prefix("kdrop: netfilter drop verdicts followed: "))
        .unwrap_or_else(|| panic!("no verdict counters: {:?}", done.stderr));
    let n: Vec<u64> = line
        .split(", ")
        .map(|f| f.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(n[0] >= 1 && n[0] == n[1] + n[2], "{line}");
}

#[test]
fn nft_do_chain_verdict_names_table_chain_and_hook() {
    let Some(rung) = return_rung_or_skip("nft_do_chain_verdict", "nft_do_chain") else {
        return;
    };
    let _g = serial();
    let p = Pair::new("vnft", 92);
    nft(
        &p.server,
        "vnft",
        "table inet kdv {\n chain input {\n type filter hook input priority 0; policy accept;\n \
         tcp dport 6202 drop\n }\n}\n",
    );
    let k = Kdrop::start(&["--json", "--netns", &p.server.name, "-p", "6202"]);
    for (src, dst) in [
        (p.client_v4(42202), p.server_v4(6202)),
        (p.client_v6(42203), p.server_v6(6202)),
    ] {
        let _syn = send_syn(&p.client, src, dst);
        let e = with_verdict(&k, "the nftables drop", &src, &dst);
        assert_eq!(e.netns, inode(&p.server), "{e}");
        let nf = e.netfilter();
        assert_eq!(nf.table.as_deref(), Some("kdv"), "{e}");
        assert_eq!(nf.chain.as_deref(), Some("input"), "{e}");
        assert_eq!(nf.rule.as_deref(), Some("tcp dport 6202 drop"), "{e}");
        // Debian's 6.12 frees the packet inside nft_do_chain (the drop's
        // location) and returns NF_STOLEN: no NF_DROP verdict to record.
        if e.location.starts_with("nft_do_chain+") {
            skip(
                "nft_do_chain_verdict",
                "nft-frees-inside",
                &format!("nft_do_chain freed the packet itself: no NF_DROP verdict ({e})"),
            );
            assert_eq!(nf.method, "ruleset evaluation (nft -j list ruleset)", "{e}");
            continue;
        }
        assert_eq!(
            nf.method,
            format!("kernel verdict ({rung} on nft_do_chain) + ruleset evaluation (nft -j list ruleset)"),
            "{e}"
        );
        let ev = evidence(&e);
        assert!(
            ev[0].starts_with(
                "kernel: nft_do_chain returned NF_DROP for this packet (table kdv, chain input, hook INPUT, via "
            ),
            "{ev:?}"
        );
        assert_eq!(e.finding().cause, "netfilter_rule", "{e}");
    }
    k.stop(libc::SIGINT);
}

/// Restores the global nf_conntrack_max (writable from the initial
/// namespace only) however the test ends.
struct ConntrackMax(String);

const CT_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

impl ConntrackMax {
    fn set(v: u64) -> Self {
        let old = std::fs::read_to_string(CT_MAX).unwrap();
        std::fs::write(CT_MAX, v.to_string()).unwrap();
        ConntrackMax(old.trim().to_string())
    }
}

impl Drop for ConntrackMax {
    fn drop(&mut self) {
        let _ = std::fs::write(CT_MAX, &self.0);
    }
}

/// A completed handshake held open (an established, assured entry: one
/// conntrack cannot evict to make room).
fn established(ns: &Ns, src: SocketAddr, dst: SocketAddr) -> OwnedFd {
    let fd = send_syn(ns, src, dst);
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(n, 1, "no handshake {src} -> {dst}");
    fd
}

/// The table is full: conntrack itself refuses the SYN (nf_conntrack_in
/// returns NF_DROP), which no rule counter would show.
#[test]
fn conntrack_table_full_is_conntracks_own_verdict() {
    let Some(rung) = return_rung_or_skip("conntrack_table_full", "nf_conntrack_in") else {
        return;
    };
    let _g = serial();
    let p = Pair::new("vct", 94);
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
    let server = p.server_v4(6205);
    let listener = in_netns(&p.server.path(), move || {
        std::net::TcpListener::bind(server)
    })
    .unwrap()
    .unwrap();
    let _held = established(&p.client, p.client_v4(42205), server);
    let count: u64 = in_netns(&p.server.path(), || {
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
    })
    .unwrap()
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert!(count >= 1, "the held connection has no entry");
    let k = Kdrop::start(&["--json", "--netns", &p.server.name, "-p", "6205"]);
    let _max = ConntrackMax::set(count);
    let src = p.client_v4(42206);
    let _syn = send_syn(&p.client, src, server);
    let e = with_verdict(&k, "the SYN conntrack refused", &src, &server);
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"), "{e}");
    let nf = e.netfilter();
    assert_eq!(nf.dropped_by, "conntrack", "{e}");
    assert_eq!(
        nf.method,
        format!("kernel verdict ({rung} on nf_conntrack_in)"),
        "{e}"
    );
    assert_eq!(nf.hook.as_deref(), Some("PREROUTING"), "{e}");
    let ev = evidence(&e);
    assert!(
        ev[0].starts_with(
            "kernel: nf_conntrack_in returned NF_DROP for this packet (hook PREROUTING"
        ),
        "{ev:?}"
    );
    // The handshake's verdict: the table the test filled (its first drop
    // said so from conntrack's statistics; this one adds the kernel's own
    // verdict as evidence).
    assert_eq!(e.finding().cause, "conntrack_table_full", "{e}");
    drop(_max);
    k.stop(libc::SIGINT);
    drop(listener);
}
