//! ctnetlink as kdrop's context layer reads it, against the kernel of this
//! machine: NEW events of a DNAT'd, forwarded handshake (incident 5's
//! first half) through the kernel filter, lookups of the entry by tuple,
//! and destroy events on the same sockets. The conntrack tool
//! (libnetfilter_conntrack) is the independent oracle for what the table
//! holds.
use std::{
    collections::VecDeque,
    net::SocketAddr,
    os::fd::OwnedFd,
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::{
    bound, in_ns, ns_name, rule_packets_of, send_syn, veth, Ns, EVENT_TIMEOUT,
};
use kdrop::{
    context::{
        conntrack_lookup::{from_client, lookup, Side},
        ctevents::{CtEvents, StatusBits},
        netfilter::conntrack::reply_holder,
        Netns,
    },
    kernel::{btf_file, facts::CtNames},
    model::packet::{CtEvent, Tuple},
};

// uapi nf_conntrack_common.h: enum ip_conntrack_status (ABI).
const IPS_SEEN_REPLY: u32 = 1 << 1;
const IPS_DST_NAT: u32 = 1 << 5;

/// client -> router (DNAT in PREROUTING, forwards) -> server, which drops
/// every TCP packet: the handshake stays unanswered, as in incident 5.
struct Lab {
    client: Ns,
    router: Ns,
    server: Ns,
    net: u8,
    v6: bool,
}

impl Lab {
    fn new(test: &str, net: u8, v6: bool) -> Self {
        let l = Lab {
            client: Ns::new(&ns_name(&format!("{test}-c"))).unwrap(),
            router: Ns::new(&ns_name(&format!("{test}-r"))).unwrap(),
            server: Ns::new(&ns_name(&format!("{test}-s"))).unwrap(),
            net,
            v6,
        };
        veth(
            &l.client,
            "c0",
            "02:00:00:00:71:01",
            &l.router,
            "r0",
            "02:00:00:00:71:02",
        )
        .unwrap();
        veth(
            &l.server,
            "s0",
            "02:00:00:00:71:03",
            &l.router,
            "r1",
            "02:00:00:00:71:04",
        )
        .unwrap();
        let n = net;
        for (ns, dev, v4, v6) in [
            (
                &l.client,
                "c0",
                format!("10.{n}.1.1/24"),
                format!("fd00:{n}:1::1/64"),
            ),
            (
                &l.router,
                "r0",
                format!("10.{n}.1.254/24"),
                format!("fd00:{n}:1::fe/64"),
            ),
            (
                &l.router,
                "r1",
                format!("10.{n}.2.254/24"),
                format!("fd00:{n}:2::fe/64"),
            ),
            (
                &l.server,
                "s0",
                format!("10.{n}.2.2/24"),
                format!("fd00:{n}:2::2/64"),
            ),
        ] {
            ns.ip(&["addr", "add", &v4, "dev", dev]).unwrap();
            ns.ip(&["addr", "add", &v6, "dev", dev, "nodad"]).unwrap();
        }
        for (ns, side) in [(&l.client, 1), (&l.server, 2)] {
            ns.ip(&[
                "route",
                "add",
                "default",
                "via",
                &format!("10.{n}.{side}.254"),
            ])
            .unwrap();
            ns.ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &format!("fd00:{n}:{side}::fe"),
            ])
            .unwrap();
        }
        l.router.sysctl("net/ipv4/ip_forward", "1").unwrap();
        l.router
            .sysctl("net/ipv6/conf/all/forwarding", "1")
            .unwrap();
        // VIP:80 -> server:8080; VIP:81 -> server:8081, which FORWARD drops
        // (the SYN never reaches POSTROUTING, so its entry is never
        // confirmed).
        for port in [80, 81] {
            l.iptables(
                &l.router,
                &[
                    "-t",
                    "nat",
                    "-A",
                    "PREROUTING",
                    "-d",
                    &l.vip(port).ip().to_string(),
                    "-p",
                    "tcp",
                    "--dport",
                    &port.to_string(),
                    "-j",
                    "DNAT",
                    "--to-destination",
                    &l.server(8000 + port).to_string(),
                ],
            );
        }
        l.iptables(
            &l.router,
            &[
                "-A", "FORWARD", "-p", "tcp", "--dport", "8081", "-j", "DROP",
            ],
        );
        l.iptables(&l.server, &["-A", "INPUT", "-p", "tcp", "-j", "DROP"]);
        l
    }

    fn iptables(&self, ns: &Ns, args: &[&str]) {
        ns.exec(if self.v6 { "ip6tables" } else { "iptables" }, args)
            .unwrap();
    }

    fn addr(&self, v4: String, v6: String, port: u16) -> SocketAddr {
        if self.v6 {
            format!("[{v6}]:{port}").parse().unwrap()
        } else {
            format!("{v4}:{port}").parse().unwrap()
        }
    }

    fn client(&self, port: u16) -> SocketAddr {
        let n = self.net;
        self.addr(format!("10.{n}.1.1"), format!("fd00:{n}:1::1"), port)
    }

    fn vip(&self, port: u16) -> SocketAddr {
        let n = self.net;
        self.addr(format!("10.{n}.9.100"), format!("fd00:{n}:9::100"), port)
    }

    fn server(&self, port: u16) -> SocketAddr {
        let n = self.net;
        self.addr(format!("10.{n}.2.2"), format!("fd00:{n}:2::2"), port)
    }

    fn router_netns(&self) -> Netns {
        Netns {
            inode: self.router.inode().unwrap(),
            path: self.router.path(),
            name: Some(self.router.name.clone()),
        }
    }

    /// The router's TCP entries as `conntrack -L ARGS` lists them.
    fn conntrack(&self, args: &[&str]) -> Vec<Listed> {
        let family = if self.v6 { "ipv6" } else { "ipv4" };
        let list = ["conntrack", "-L", "-f", family, "-p", "tcp"];
        in_ns(&self.router, &[&list[..], args].concat())
            .lines()
            .map(Listed::parse)
            .collect()
    }

    /// Packets the router's FORWARD drop rule has matched.
    fn forward_drops(&self) -> u64 {
        let tool = if self.v6 { "ip6tables" } else { "iptables" };
        rule_packets_of(&self.router, tool, "FORWARD", "DROP")
    }
}

/// One line of `conntrack -L`: `tcp 6 117 SYN_SENT src= dst= sport= dport=
/// [UNREPLIED] src= dst= sport= dport= mark=0 use=1`.
#[derive(Debug)]
struct Listed {
    timeout: u32,
    state: String,
    orig: Tuple,
    reply: Tuple,
    unreplied: bool,
    mark: u32,
}

impl Listed {
    fn parse(line: &str) -> Listed {
        let toks: Vec<&str> = line.split_whitespace().collect();
        let all = |key: &str| -> Vec<&str> {
            toks.iter()
                .filter_map(|t| t.strip_prefix(key)?.strip_prefix('='))
                .collect()
        };
        let (src, dst, sport, dport) = (all("src"), all("dst"), all("sport"), all("dport"));
        let sa = |ip: &str, port: &str| -> SocketAddr {
            SocketAddr::new(ip.parse().unwrap(), port.parse().unwrap())
        };
        let tuple = |i: usize| Tuple {
            src: sa(src[i], sport[i]),
            dst: sa(dst[i], dport[i]),
        };
        Listed {
            timeout: toks[2].parse().unwrap(),
            state: toks[3].to_string(),
            orig: tuple(0),
            reply: tuple(1),
            unreplied: line.contains("[UNREPLIED]"),
            mark: all("mark")[0].parse().unwrap(),
        }
    }
}

/// Polls `done` until it holds, within `EVENT_TIMEOUT`: the kernel's
/// tables have no event to wait on from outside.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let end = Instant::now() + bound(EVENT_TIMEOUT);
    while !done() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The event sockets and what they have read but not handed out yet.
struct Events {
    rt: tokio::runtime::Runtime,
    ev: CtEvents,
    queued: VecDeque<CtEvent>,
}

impl Events {
    fn open(ns: &Netns, ports: &[u16]) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let btf = btf_file::read(std::path::Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        let bits = StatusBits::from_names(&CtNames::from_btf(&btf));
        let ev = {
            let _in_runtime = rt.enter();
            CtEvents::open(std::slice::from_ref(ns), ports, bits, true)
        };
        assert_eq!(ev.len(), 1, "not listening: {:?}", ev.notes);
        assert!(ev.notes.is_empty(), "{:?}", ev.notes);
        Events {
            rt,
            ev,
            queued: VecDeque::new(),
        }
    }

    fn next(&mut self) -> CtEvent {
        if let Some(e) = self.queued.pop_front() {
            return e;
        }
        let ev = &mut self.ev;
        let got = self
            .rt
            .block_on(async { tokio::time::timeout(bound(EVENT_TIMEOUT), ev.next()).await })
            .expect("no conntrack event in time");
        self.queued.extend(got);
        self.queued.pop_front().unwrap()
    }

    /// Everything read or queued on the socket now.
    fn pending(&mut self) -> Vec<CtEvent> {
        let mut all: Vec<CtEvent> = self.queued.drain(..).collect();
        all.extend(self.ev.read_all());
        all
    }
}

fn syn(lab: &Lab, src: SocketAddr, dst: SocketAddr) -> OwnedFd {
    send_syn(&lab.client, src, dst)
}

fn dnat_handshake_seen_and_found(test: &str, net: u8, v6: bool) {
    let lab = Lab::new(test, net, v6);
    let router = lab.router_netns();
    let mut events = Events::open(&router, &[80, 81]);

    // A DNAT'd SYN dropped in FORWARD: its entry is never confirmed, so no
    // NEW event and no entry in the table.
    let dropped = syn(&lab, lab.client(40081), lab.vip(81));
    wait_for("the FORWARD drop", || lab.forward_drops() >= 1);
    assert!(lab.conntrack(&["--orig-port-dst", "81"]).is_empty());

    // A SYN forwarded without NAT, to the filter's port: confirmed, but
    // not NAT'd, so the filter keeps its NEW event out.
    let plain = syn(&lab, lab.client(40080), lab.server(80));
    wait_for("the plain SYN's entry", || {
        lab.conntrack(&["--orig-port-src", "40080"]).len() == 1
    });

    // The DNAT'd SYN.
    let client = lab.client(40000);
    let dnatted = syn(&lab, client, lab.vip(80));
    let first = events.next();
    let CtEvent::New(new) = &first else {
        panic!("expected the DNAT'd SYN's NEW event first, got {first:?}")
    };
    let listed = lab.conntrack(&["--orig-port-src", "40000"]);
    let [oracle] = listed.as_slice() else {
        panic!("conntrack -L: {listed:?}")
    };
    assert_eq!(new.netns, router.inode);
    assert_eq!(new.ct.orig, oracle.orig);
    assert_eq!(new.ct.reply, oracle.reply);
    assert_eq!(
        (new.ct.orig.src, new.ct.orig.dst, new.ct.reply.src),
        (client, lab.vip(80), lab.server(8080))
    );
    assert_ne!(
        new.ct.status & IPS_DST_NAT,
        0,
        "status {:#x}",
        new.ct.status
    );
    assert_eq!(new.ct.status & IPS_SEEN_REPLY, 0);
    assert!(oracle.unreplied);
    // conntrack's own DST_NAT filter agrees that this one, and only it, is DNAT'd.
    let dnat_listed = lab.conntrack(&["--dst-nat"]);
    assert_eq!(dnat_listed.len(), 1, "{dnat_listed:?}");
    assert_eq!(dnat_listed[0].orig, new.ct.orig);
    // Nothing else came through: not the plain SYN's entry, not the
    // dropped one's (both happened before, and events are queued in order).
    assert_eq!(events.pending(), [], "only the DNAT'd entry passes");

    // Lookups, by the tuples the oracle lists.
    let found = lookup(&router, Side::Reply, &oracle.reply, 0)
        .unwrap()
        .expect("the entry, by its reply tuple");
    let after = lab.conntrack(&["--orig-port-src", "40000"]);
    assert_eq!((found.ct.orig, found.ct.reply), (oracle.orig, oracle.reply));
    assert_eq!(found.ct.mark, oracle.mark);
    assert_eq!(found.ct.zone, 0);
    assert_eq!(found.ct.status & IPS_SEEN_REPLY == 0, oracle.unreplied);
    assert_ne!(found.ct.status & IPS_DST_NAT, 0);
    assert_eq!(found.netns, router.inode);
    let state = found.tcp_state.expect("the TCP state");
    assert_eq!(
        kdrop::context::ctevents::parse::tcp_state_name(state),
        oracle.state
    );
    let timeout = found.timeout_s.expect("the timeout");
    assert!(
        (after[0].timeout..=oracle.timeout).contains(&timeout),
        "timeout {timeout}: conntrack -L said {} then {}",
        oracle.timeout,
        after[0].timeout
    );
    let by_orig = lookup(&router, Side::Orig, &oracle.orig, 0).unwrap();
    assert_eq!(by_orig.map(|e| e.ct), Some(found.ct));
    // The reply tuple is not any entry's original tuple; an unknown tuple
    // is no entry.
    assert_eq!(lookup(&router, Side::Orig, &oracle.reply, 0).unwrap(), None);
    let unknown = Tuple {
        src: lab.client(40001),
        dst: lab.vip(80),
    };
    assert_eq!(lookup(&router, Side::Orig, &unknown, 0).unwrap(), None);
    // The un-NAT'd entry is there too, without DST_NAT.
    let plain_listed = lab.conntrack(&["--orig-port-src", "40080"]);
    let plain_found = lookup(&router, Side::Reply, &plain_listed[0].reply, 0)
        .unwrap()
        .expect("the plain entry");
    assert_eq!(plain_found.ct.status & IPS_DST_NAT, 0);
    // Entries by their client's end, from a dump the kernel filters: each
    // client port's own, whatever else the table holds.
    let from = |c: SocketAddr| {
        from_client(&router, c)
            .unwrap()
            .into_iter()
            .map(|e| (e.ct.orig, e.ct.reply, e.netns))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        from(lab.client(40080)),
        [(plain_listed[0].orig, plain_listed[0].reply, router.inode)]
    );
    assert_eq!(from(client), [(oracle.orig, oracle.reply, router.inode)]);
    assert_eq!(from(lab.client(40009)), []);
    // reply_holder keeps the text it had from `conntrack -L`.
    assert_eq!(
        reply_holder(&router, &oracle.reply).as_deref(),
        Some(
            format!(
                "orig {} -> {}, state {}, unreplied",
                oracle.orig.src, oracle.orig.dst, oracle.state
            )
            .as_str()
        )
    );

    // Disarmed, the sockets hear of no new entry; armed again, they do.
    events.ev.set_new(false).unwrap();
    let unheard = syn(&lab, lab.client(40002), lab.vip(80));
    wait_for("the entry made while disarmed", || {
        lab.conntrack(&["--orig-port-src", "40002"]).len() == 1
    });
    events.ev.set_new(true).unwrap();
    let heard = syn(&lab, lab.client(40003), lab.vip(80));
    let next = events.next();
    let CtEvent::New(again) = &next else {
        panic!("expected a NEW event, got {next:?}")
    };
    assert_eq!(again.ct.orig.src, lab.client(40003), "{next:?}");
    assert_eq!(events.pending(), []);

    // The same socket reports the entry's death (no retransmission may
    // recreate it: the client's sockets close first).
    drop((dropped, plain, dnatted, unheard, heard));
    let family = if v6 { "ipv6" } else { "ipv4" };
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.router.name,
            "conntrack",
            "-D",
            "-f",
            family,
        ])
        .args(["-p", "tcp", "--orig-src", &client.ip().to_string()])
        .args(["--orig-port-src", "40000"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let died = events.next();
    let CtEvent::Destroyed(d) = &died else {
        panic!("expected the destroy event, got {died:?}")
    };
    assert_eq!((d.ct.orig, d.ct.reply), (oracle.orig, oracle.reply));
    assert_eq!(d.netns, router.inode);
    assert_eq!(events.ev.received_new, 2);
    assert_eq!(events.ev.received_destroyed, 1);
    assert_eq!(events.ev.overruns, 0);
}

#[test]
fn a_dnatted_syn_is_announced_and_found_by_its_reply_tuple_ipv4() {
    dnat_handshake_seen_and_found("ctnl4", 168, false);
}

#[test]
fn a_dnatted_syn_is_announced_and_found_by_its_reply_tuple_ipv6() {
    dnat_handshake_seen_and_found("ctnl6", 169, true);
}

/// kdrop reads net.netfilter.nf_conntrack_events in each namespace, says
/// when it is 0 (no events), and never changes it.
#[test]
fn nf_conntrack_events_off_is_told_and_left_alone() {
    let off = Ns::new(&ns_name("ctnl-off")).unwrap();
    let on = Ns::new(&ns_name("ctnl-on")).unwrap();
    for ns in [&off, &on] {
        // A conntrack match registers conntrack's hooks in the namespace
        // (and loads the module, whose sysctls are per namespace).
        ns.exec(
            "iptables",
            &[
                "-A",
                "INPUT",
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
                "-j",
                "DROP",
            ],
        )
        .unwrap();
    }
    off.sysctl("net/netfilter/nf_conntrack_events", "0")
        .unwrap();
    let netns = |ns: &Ns| Netns {
        inode: ns.inode().unwrap(),
        path: ns.path(),
        name: Some(ns.name.clone()),
    };
    let gone = Netns {
        inode: 1,
        path: "/run/netns/kdrop-test-no-such-namespace".into(),
        name: Some("kdrop-test-no-such-namespace".into()),
    };
    let read = |ns: &Ns| {
        in_ns(ns, &["sysctl", "-n", "net.netfilter.nf_conntrack_events"])
            .trim()
            .to_string()
    };
    let on_before = read(&on);
    assert_ne!(on_before, "0");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in_runtime = rt.enter();
    let ev = CtEvents::open(
        &[netns(&off), netns(&on), gone],
        &[],
        StatusBits::UAPI,
        true,
    );
    assert_eq!(ev.len(), 2, "{:?}", ev.notes);
    let notes = ev.notes.join("\n");
    assert_eq!(ev.notes.len(), 2, "{notes}");
    assert!(
        ev.notes.iter().any(|n| n.contains(&off.name)
            && n.contains("nf_conntrack_events=0")
            && !n.contains(&on.name)),
        "{notes}"
    );
    assert!(
        ev.notes
            .iter()
            .any(|n| n.contains("kdrop-test-no-such-namespace")),
        "{notes}"
    );
    assert_eq!(read(&off), "0", "kdrop must not change it");
    assert_eq!(read(&on), on_before);
}
