//! Every netfilter repair kdrop writes, applied as a user would: kdrop
//! traces the port, the test takes `fix` (or `fix_or`) from its JSON, runs
//! each command as printed, and then the connection whose SYN was dropped
//! completes on its own retransmission (the same tuple) and a new one
//! connects. The oracle is the kernel's handshake, not kdrop. Each repair
//! kind (kdrop::diagnosis::netfilter::fixes::FixKind) names its test here.
use std::{
    net::SocketAddr,
    os::fd::{AsRawFd as _, OwnedFd},
    time::Duration,
};

use integration_tests::{
    bound, connect_within, listen,
    nf::{ipt, nft, Backend, BrNetfilter},
    ns_name, pair_addresses, reason_for, run_fix, send_syn, veth, Kdrop, Ns, Pair, Record,
};
use kdrop::diagnosis::netfilter::fixes::FixKind;

/// How long a repaired handshake may take on the client's own
/// retransmissions (1 s, 3 s, 7 s, 15 s after the first SYN).
const RETRY: Duration = Duration::from_secs(12);
/// A new connection through a repaired path is immediate; one that still
/// fails is given a client's usual short patience.
const NEW: Duration = Duration::from_secs(3);

fn is_drop(e: &Record, src: &SocketAddr, dst: &SocketAddr) -> bool {
    e.kind == "drop" && e.is_tuple(src, dst)
}

/// kdrop's netfilter drop of `src -> dst`.
fn drop_of(k: &Kdrop, src: SocketAddr, dst: SocketAddr) -> Record {
    let e = k.expect_record("the netfilter drop", |e| is_drop(e, &src, &dst));
    assert_eq!(e.reason.as_deref(), reason_for("NETFILTER_DROP"), "{e}");
    e
}

/// Runs every command, as printed, and returns their kinds.
fn apply(cmds: &[String]) -> Vec<FixKind> {
    assert!(!cmds.is_empty(), "no repair to apply");
    cmds.iter()
        .map(|c| {
            run_fix(c);
            FixKind::of(c).unwrap_or_else(|| panic!("`{c}` is of no known kind"))
        })
        .collect()
}

/// Whether the non-blocking connect on `fd` completes within `timeout`:
/// the handshake its own retransmissions carry, same tuple.
fn completes(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = bound(timeout).as_millis() as libc::c_int;
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, ms) } != 1 {
        return false;
    }
    let mut err: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err/len are valid out-parameters for SO_ERROR.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&raw mut err).cast(),
            &mut len,
        )
    };
    r == 0 && err == 0
}

/// One client's view: its address and the server's, per family.
struct Ends {
    client: SocketAddr,
    server: SocketAddr,
}

impl Ends {
    /// The same client address on another port.
    fn client_at(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.client.ip(), port)
    }
}

/// kdrop tracing the port in the node's namespace, started after the
/// ruleset is in place, as a user starts it on a node that fails now: its
/// first counters are then this ruleset's (a ruleset reloaded under a
/// running kdrop resets counters between its snapshots).
fn trace(node: &Ns, port: u16) -> Kdrop {
    Kdrop::start(&["--json", "--netns", &node.name, "--port", &port.to_string()])
}

/// Which packet of the handshake the lab drops.
#[derive(Clone, Copy)]
enum Leg {
    Syn,
    SynAck,
}

/// The handshake `from -> to` loses its `leg`; the repair kdrop writes
/// (`pick` takes it from the event) is applied; the same socket then
/// connects, and so does a new one. Returns the kinds applied.
fn repaired(
    node: &Ns,
    client: &Ns,
    (from, to): (SocketAddr, SocketAddr),
    leg: Leg,
    pick: impl Fn(&Record) -> Vec<String>,
) -> Vec<FixKind> {
    let k = trace(node, to.port());
    let syn = send_syn(client, from, to);
    let e = match leg {
        Leg::Syn => drop_of(&k, from, to),
        Leg::SynAck => drop_of(&k, to, from),
    };
    let kinds = apply(&pick(&e));
    assert!(completes(&syn, RETRY), "{from} -> {to} after {e}");
    let again = SocketAddr::new(from.ip(), from.port() + 1);
    connect_within(client, again, to, NEW)
        .unwrap_or_else(|err| panic!("new connection {again} -> {to}: {err}; after {e}"));
    k.stop(libc::SIGINT);
    kinds
}

fn fix(e: &Record) -> Vec<String> {
    e.finding().fix.clone()
}

fn first_or(e: &Record) -> Vec<String> {
    e.finding().fix_or[0].clone()
}

/// A DROP rule for the port behind unrelated rules, in INPUT of the server.
fn rule_lab(ns: &Ns, b: Backend, port: u16) {
    for v6 in [false, true] {
        ipt(ns, b, v6, "-F INPUT");
        ipt(ns, b, v6, "-A INPUT -p tcp --dport 22 -j ACCEPT");
        let other = if v6 { "2001:db8::/32" } else { "192.0.2.0/24" };
        ipt(ns, b, v6, &format!("-A INPUT -s {other} -j DROP"));
        ipt(
            ns,
            b,
            v6,
            &format!("-A INPUT -p tcp --dport {port} -j DROP"),
        );
    }
}

/// An iptables rule's drop: the ACCEPT kdrop inserts before it, then (the
/// rule restored) the rule's deletion, over IPv4 and IPv6.
fn rule_fixes(b: Backend, net: u8) {
    const PORT: u16 = 6233;
    let p = Pair::new(&format!("fxr{}", b.tag()), net);
    let ends = [
        Ends {
            client: p.client_v4(0),
            server: p.server_v4(PORT),
        },
        Ends {
            client: p.client_v6(0),
            server: p.server_v6(PORT),
        },
    ];
    let _l: Vec<_> = ends.iter().map(|e| listen(&p.server, e.server)).collect();
    for (i, end) in ends.iter().enumerate() {
        let base = 43000 + 10 * i as u16;
        rule_lab(&p.server, b, PORT);
        let kinds = repaired(
            &p.server,
            &p.client,
            (end.client_at(base), end.server),
            Leg::Syn,
            fix,
        );
        assert_eq!(kinds, [FixKind::IptablesAcceptBeforeRule]);
        rule_lab(&p.server, b, PORT);
        let from = end.client_at(base + 5);
        let kinds = repaired(&p.server, &p.client, (from, end.server), Leg::Syn, first_or);
        assert_eq!(kinds, [FixKind::IptablesDeleteRule]);
    }
}

#[test]
fn rule_fixes_legacy() {
    rule_fixes(Backend::Legacy, 233);
}

#[test]
fn rule_fixes_nft() {
    rule_fixes(Backend::Nft, 234);
}

/// A native nftables rule's drop: the accept inserted at its position, then
/// (the table loaded again) the rule deleted by handle.
#[test]
fn nft_rule_fixes() {
    let p = Pair::new("fxnr", 235);
    let table = "table inet kdfx {
        chain input {
            type filter hook input priority filter; policy accept;
            tcp dport 22 accept
            ip saddr 192.0.2.0/24 drop
            tcp dport 6235 counter drop
        }
    }";
    let reload = || {
        let _ = p.server.exec("nft", &["delete", "table", "inet", "kdfx"]);
        nft(&p.server, "fxnr", table);
    };
    let ends = [
        Ends {
            client: p.client_v4(0),
            server: p.server_v4(6235),
        },
        Ends {
            client: p.client_v6(0),
            server: p.server_v6(6235),
        },
    ];
    let _l: Vec<_> = ends.iter().map(|e| listen(&p.server, e.server)).collect();
    for (i, end) in ends.iter().enumerate() {
        let base = 43100 + 10 * i as u16;
        reload();
        let kinds = repaired(
            &p.server,
            &p.client,
            (end.client_at(base), end.server),
            Leg::Syn,
            fix,
        );
        assert_eq!(kinds, [FixKind::NftAcceptBeforeRule]);
        reload();
        let from = end.client_at(base + 5);
        let kinds = repaired(&p.server, &p.client, (from, end.server), Leg::Syn, first_or);
        assert_eq!(kinds, [FixKind::NftDeleteRule]);
    }
}

/// A rule on the client that drops TCP from the server: the SYN leaves, its
/// SYN-ACK is dropped on the way in. kdrop's repair accepts the replies of
/// the client's own connections before the rule (an ACCEPT for the
/// client's port would help no other connection); then, the rule restored,
/// its deletion.
fn reply_rule_fixes(b: Backend, net: u8) {
    const PORT: u16 = 6239;
    let p = Pair::new(&format!("fxy{}", b.tag()), net);
    let lab = || {
        for (v6, server) in [(false, p.server_v4(0)), (true, p.server_v6(0))] {
            ipt(&p.client, b, v6, "-F INPUT");
            ipt(
                &p.client,
                b,
                v6,
                &format!("-A INPUT -p tcp -s {} -j DROP", server.ip()),
            );
        }
    };
    let ends = [
        (p.client_v4(0), p.server_v4(PORT)),
        (p.client_v6(0), p.server_v6(PORT)),
    ];
    let _l: Vec<_> = ends.iter().map(|(_, s)| listen(&p.server, *s)).collect();
    for (i, (client, server)) in ends.into_iter().enumerate() {
        let at = |port: u16| SocketAddr::new(client.ip(), port);
        let base = 43400 + 10 * i as u16;
        lab();
        let tuple = (at(base), server);
        let kinds = repaired(&p.client, &p.client, tuple, Leg::SynAck, fix);
        assert_eq!(kinds, [FixKind::IptablesAcceptEstablished]);
        lab();
        let tuple = (at(base + 5), server);
        let kinds = repaired(&p.client, &p.client, tuple, Leg::SynAck, first_or);
        assert_eq!(kinds, [FixKind::IptablesDeleteRule]);
    }
}

#[test]
fn reply_rule_fixes_legacy() {
    reply_rule_fixes(Backend::Legacy, 239);
}

#[test]
fn reply_rule_fixes_nft() {
    reply_rule_fixes(Backend::Nft, 240);
}

/// The same with a native nftables rule: the state accept inserted at the
/// rule's position.
#[test]
fn nft_reply_rule_fixes() {
    let p = Pair::new("fxny", 241);
    let table = "table inet kdfx {
        chain input {
            type filter hook input priority filter; policy accept;
            ip saddr 10.241.0.2 meta l4proto tcp counter drop
            ip6 saddr fd00:241::2 meta l4proto tcp counter drop
        }
    }";
    let ends = [
        (p.client_v4(0), p.server_v4(6241)),
        (p.client_v6(0), p.server_v6(6241)),
    ];
    let _l: Vec<_> = ends.iter().map(|(_, s)| listen(&p.server, *s)).collect();
    for (i, (client, server)) in ends.into_iter().enumerate() {
        let _ = p.client.exec("nft", &["delete", "table", "inet", "kdfx"]);
        nft(&p.client, "fxny", table);
        let from = SocketAddr::new(client.ip(), 43500 + 10 * i as u16);
        let kinds = repaired(&p.client, &p.client, (from, server), Leg::SynAck, fix);
        assert_eq!(kinds, [FixKind::NftAcceptEstablished]);
    }
}

/// Client and server on two ports of a bridge in a third namespace (the
/// node), whose bridged IP packets meet iptables and nftables
/// (bridge-nf-call-iptables=1, Docker's setting).
struct Bridge {
    _brnf: BrNetfilter,
    client: Ns,
    server: Ns,
    node: Ns,
    net: u8,
}

impl Bridge {
    fn new(tag: &str, net: u8) -> Self {
        let brnf = BrNetfilter::ensure();
        let client = Ns::new(&ns_name(&format!("{tag}-c"))).unwrap();
        let server = Ns::new(&ns_name(&format!("{tag}-s"))).unwrap();
        let node = Ns::new(&ns_name(&format!("{tag}-b"))).unwrap();
        veth(
            &client,
            "c0",
            "02:00:00:00:e9:01",
            &node,
            "bp0",
            "02:00:00:00:e9:02",
        )
        .unwrap();
        veth(
            &server,
            "s0",
            "02:00:00:00:e9:03",
            &node,
            "bp1",
            "02:00:00:00:e9:04",
        )
        .unwrap();
        node.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        for port in ["bp0", "bp1"] {
            node.ip(&["link", "set", port, "master", "br0"]).unwrap();
        }
        node.ip(&["link", "set", "br0", "up"]).unwrap();
        // Per namespace once br_netfilter is loaded: set here, gone with it.
        for key in ["bridge-nf-call-iptables", "bridge-nf-call-ip6tables"] {
            node.sysctl(&format!("net/bridge/{key}"), "1").unwrap();
        }
        pair_addresses(&client, &server, net);
        Bridge {
            _brnf: brnf,
            client,
            server,
            node,
            net,
        }
    }

    fn ends(&self, port: u16) -> [Ends; 2] {
        let n = self.net;
        [
            Ends {
                client: format!("10.{n}.0.1:0").parse().unwrap(),
                server: format!("10.{n}.0.2:{port}").parse().unwrap(),
            },
            Ends {
                client: format!("[fd00:{n}::1]:0").parse().unwrap(),
                server: format!("[fd00:{n}::2]:{port}").parse().unwrap(),
            },
        ]
    }
}

/// Docker's FORWARD: policy DROP, an ACCEPT for another port, neighbour
/// discovery let through (it crosses FORWARD too), nothing for replies.
fn docker_forward(ns: &Ns, b: Backend) {
    for v6 in [false, true] {
        ipt(ns, b, v6, "-F FORWARD");
        ipt(ns, b, v6, "-P FORWARD DROP");
        ipt(ns, b, v6, "-A FORWARD -p tcp --dport 22 -j ACCEPT");
    }
    ipt(ns, b, true, "-A FORWARD -p ipv6-icmp -j ACCEPT");
}

/// The case: FORWARD policy DROP on a bridge. The ACCEPT for the
/// service alone (kdrop's old repair) lets the SYN through and the SYN-ACK
/// meets the same policy: the connection still fails, and kdrop then names
/// the SYN-ACK's drop with the replies' ACCEPT, which completes it. kdrop's
/// whole repair, applied at once on a fresh chain, connects at once.
fn forward_policy_fix_on_bridge(b: Backend, net: u8) {
    const PORT: u16 = 6236;
    let br = Bridge::new(&format!("fxb{}", b.tag()), net);
    let ends = br.ends(PORT);
    let _l: Vec<_> = ends.iter().map(|e| listen(&br.server, e.server)).collect();
    for (i, end) in ends.iter().enumerate() {
        let base = 43200 + 10 * i as u16;
        docker_forward(&br.node, b);
        half_fix_fails(&br, end, base);
        // The whole repair at once, on a fresh chain.
        docker_forward(&br.node, b);
        let kinds = repaired(
            &br.node,
            &br.client,
            (end.client_at(base + 5), end.server),
            Leg::Syn,
            fix,
        );
        assert_eq!(
            kinds,
            [
                FixKind::IptablesAcceptEstablished,
                FixKind::IptablesAcceptAtPolicy
            ]
        );
    }
}

/// The service's ACCEPT alone: the SYN passes, its SYN-ACK is dropped by
/// the policy and a new connection fails; kdrop's repair for the SYN-ACK
/// then completes the first handshake and a new one.
fn half_fix_fails(br: &Bridge, end: &Ends, base: u16) {
    let k = trace(&br.node, end.server.port());
    let from = end.client_at(base);
    let syn = send_syn(&br.client, from, end.server);
    let e = drop_of(&k, from, end.server);
    assert_eq!(e.netfilter().dropped_by, "policy", "{e}");
    let half: Vec<String> = fix(&e)
        .into_iter()
        .filter(|c| FixKind::of(c) == Some(FixKind::IptablesAcceptAtPolicy))
        .collect();
    assert_eq!(apply(&half), [FixKind::IptablesAcceptAtPolicy]);
    // Its first SYN-ACK may meet a snapshot from before the change: the
    // first one kdrop names.
    let reply = k.expect_record("the SYN-ACK's drop by the policy", |r| {
        is_drop(r, &end.server, &from)
            && r.netfilter
                .as_ref()
                .is_some_and(|n| n.dropped_by == "policy")
    });
    assert_eq!(reply.tcp_flags, "SYN|ACK", "{reply}");
    let fresh = end.client_at(base + 1);
    assert!(
        connect_within(&br.client, fresh, end.server, NEW).is_err(),
        "{fresh} connected with the service's ACCEPT alone"
    );
    assert_eq!(apply(&fix(&reply)), [FixKind::IptablesAcceptEstablished]);
    assert!(completes(&syn, RETRY), "{from} after {reply}");
    connect_within(&br.client, end.client_at(base + 2), end.server, NEW)
        .unwrap_or_else(|err| panic!("new connection after {reply}: {err}"));
    k.stop(libc::SIGINT);
}

#[test]
fn forward_policy_fix_on_bridge_legacy() {
    forward_policy_fix_on_bridge(Backend::Legacy, 236);
}

#[test]
fn forward_policy_fix_on_bridge_nft() {
    forward_policy_fix_on_bridge(Backend::Nft, 237);
}

/// The raw table's PREROUTING with policy DROP on the bridge: it runs
/// before conntrack, so no conntrack state can let the replies through;
/// kdrop accepts the service's replies by address and port there, and the
/// service, last in the chain.
fn raw_policy_fix_on_bridge(b: Backend, net: u8) {
    const PORT: u16 = 6242;
    let br = Bridge::new(&format!("fxw{}", b.tag()), net);
    let ends = br.ends(PORT);
    let _l: Vec<_> = ends.iter().map(|e| listen(&br.server, e.server)).collect();
    for (i, end) in ends.iter().enumerate() {
        for v6 in [false, true] {
            ipt(&br.node, b, v6, "-t raw -F PREROUTING");
            ipt(&br.node, b, v6, "-t raw -P PREROUTING DROP");
            ipt(
                &br.node,
                b,
                v6,
                "-t raw -A PREROUTING -p tcp --dport 22 -j ACCEPT",
            );
        }
        ipt(
            &br.node,
            b,
            true,
            "-t raw -A PREROUTING -p ipv6-icmp -j ACCEPT",
        );
        let from = end.client_at(43600 + 10 * i as u16);
        let kinds = repaired(&br.node, &br.client, (from, end.server), Leg::Syn, fix);
        assert_eq!(
            kinds,
            [
                FixKind::IptablesAcceptReplies,
                FixKind::IptablesAcceptAtPolicy
            ]
        );
    }
}

#[test]
fn raw_policy_fix_on_bridge_legacy() {
    raw_policy_fix_on_bridge(Backend::Legacy, 242);
}

#[test]
fn raw_policy_fix_on_bridge_nft() {
    raw_policy_fix_on_bridge(Backend::Nft, 243);
}

/// The same with a native nftables chain at the raw priority.
#[test]
fn nft_raw_policy_fix() {
    let br = Bridge::new("fxnw", 246);
    let table = "table inet kdfx {
        chain pre {
            type filter hook prerouting priority raw; policy drop;
            tcp dport 22 accept
            meta l4proto ipv6-icmp accept
        }
    }";
    let ends = br.ends(6246);
    let _l: Vec<_> = ends.iter().map(|e| listen(&br.server, e.server)).collect();
    for (i, end) in ends.iter().enumerate() {
        let _ = br.node.exec("nft", &["delete", "table", "inet", "kdfx"]);
        nft(&br.node, "fxnw", table);
        let from = end.client_at(43700 + 10 * i as u16);
        let kinds = repaired(&br.node, &br.client, (from, end.server), Leg::Syn, fix);
        assert_eq!(
            kinds,
            [FixKind::NftAcceptReplies, FixKind::NftAcceptAtPolicy]
        );
    }
}

/// A native nftables forward chain with policy drop on the bridge, and a
/// later rule that drops what the server sends the client: the replies'
/// accept must come first in the chain (appended, it would come after that
/// rule), the service's accept after everything.
#[test]
fn nft_forward_policy_fix() {
    let br = Bridge::new("fxnb", 238);
    let n = br.net;
    let table = format!(
        "table inet kdfx {{
            chain forward {{
                type filter hook forward priority filter; policy drop;
                tcp dport 22 accept
                meta l4proto ipv6-icmp accept
                ip saddr 10.{n}.0.2 ip daddr 10.{n}.0.1 counter drop
                ip6 saddr fd00:{n}::2 ip6 daddr fd00:{n}::1 counter drop
            }}
        }}"
    );
    let ends = br.ends(6238);
    let _l: Vec<_> = ends.iter().map(|e| listen(&br.server, e.server)).collect();
    for (i, end) in ends.iter().enumerate() {
        let _ = br.node.exec("nft", &["delete", "table", "inet", "kdfx"]);
        nft(&br.node, "fxnb", &table);
        let from = end.client_at(43300 + 10 * i as u16);
        let kinds = repaired(&br.node, &br.client, (from, end.server), Leg::Syn, fix);
        assert_eq!(
            kinds,
            [FixKind::NftAcceptEstablished, FixKind::NftAcceptAtPolicy]
        );
    }
}
