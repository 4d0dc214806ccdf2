//! Route queries (context::route_query) against the kernel's own answers:
//! the reverse-path lookup fib_validate_source makes for a real SYN in
//! incident 1's namespaces, and the one ip6t_rpfilter makes for an IPv6
//! SYN, seen through the `fib:fib_table_lookup` / `fib6:fib6_table_lookup`
//! tracepoints by bpftrace (an independent observer), and `ip route get`.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::{Child, Command, Stdio},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use integration_tests::{bound, line_reader, ns_name, send_syn, veth, Ns};
use kdrop::{
    context::{
        netns::ifindex as ifindex_of,
        netns::{ifname, in_netns},
        route_query::{self, reverse_lookup_v4},
    },
    lab::rp_filter::RpFilter,
    model::routing::{RouteLookup, RouteQuery, RouteType},
};

/// bpftrace printing every IPv4 FIB table lookup; killed on drop.
struct FibTrace {
    child: Child,
    lines: Receiver<String>,
    /// The types header its program includes.
    types: std::path::PathBuf,
}

/// How bpftrace reads the tracepoint's device name. Before v6.0 it is a
/// `__dynamic_array` (5.10's format: `__data_loc char[] name`), which
/// bpftrace 0.17 prints as the offset word unless asked for `str()`; from
/// v6.0 (include/trace/events/fib.h, fib6.h: "tracing/ipv4/ipv6: Use static
/// array for name field in fib*_lookup_table event") it is a `char[16]`,
/// and bpftrace refuses `str()` of it.
fn name_expr(tp: &str) -> &'static str {
    let (system, event) = tp.split_once(':').unwrap();
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(format!(
            "mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; \
             cat /sys/kernel/tracing/events/{system}/{event}/format"
        ))
        .output()
        .expect("reading the tracepoint's format");
    let format = String::from_utf8_lossy(&out.stdout);
    assert!(
        format.contains(" name;") || format.contains(" name["),
        "{tp}'s format has no name field: {format}"
    );
    if format.contains("__data_loc char[] name;") {
        "str(args->name)"
    } else {
        "args->name"
    }
}

/// One `fib:fib_table_lookup` record.
#[derive(Debug, Clone, PartialEq)]
struct Lookup {
    table: u32,
    err: i32,
    iif: i32,
    oif: i32,
    src: String,
    dst: String,
    dev: String,
}

impl FibTrace {
    /// Starts bpftrace (tracefs mounted in a private mount namespace) and
    /// waits until it reports a lookup the test makes in `ns`: then it is
    /// attached.
    fn start(ns: &Ns, marker: IpAddr) -> Self {
        let tp = if marker.is_ipv4() {
            "fib:fib_table_lookup"
        } else {
            "fib6:fib6_table_lookup"
        };
        // 5.10's tracepoint formats name the kernel's own types (u32, u8),
        // which the struct bpftrace generates from them cannot (5.10's
        // whole suite: "definitions.h: unknown type name 'u32'"): defined
        // for it in a header the program includes first.
        // One per trace: the tests run side by side in one process, and
        // each trace removes its own when it ends.
        static TRACES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = TRACES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let types =
            std::env::temp_dir().join(format!("kdrop-fib-types-{}-{n}.h", std::process::id()));
        std::fs::write(
            &types,
            "typedef unsigned char u8;\ntypedef unsigned short u16;\n\
             typedef unsigned int u32;\ntypedef int s32;\n",
        )
        .unwrap();
        let name = name_expr(tp);
        let prog = format!(
            "#include \"{}\"\n{}",
            types.display(),
            format_args!(
                r#"tracepoint:{tp} {{ printf("L %u %d %d %d %s %s %s\n", args->tb_id, args->err, args->iif, args->oif, ntop(args->src), ntop(args->dst), {name}); }}"#
            )
        );
        let mut child = Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg(format!(
                "mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; exec bpftrace -e '{prog}'"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running bpftrace (apt-get install bpftrace)");
        // What bpftrace says, for a failure to attach (5.10's whole suite
        // failed here without it).
        let errs = line_reader(child.stderr.take().unwrap());
        let lines = line_reader(child.stdout.take().unwrap());
        let t = FibTrace {
            child,
            lines,
            types,
        };
        let deadline = Instant::now() + bound(Duration::from_secs(30));
        let m = marker.to_string();
        loop {
            ns.ip(&["route", "get", &m]).unwrap_or_default();
            if t.wait_for(Duration::from_millis(200), |l| l.dst == m)
                .is_some()
            {
                return t;
            }
            if Instant::now() >= deadline {
                let said: Vec<String> = errs.try_iter().collect();
                panic!("bpftrace did not attach; it said: {said:#?}");
            }
        }
    }

    /// The first lookup `want` accepts within `timeout`.
    fn wait_for(&self, timeout: Duration, want: impl Fn(&Lookup) -> bool) -> Option<Lookup> {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let line = self.lines.recv_timeout(left).ok()?;
            if let Some(l) = parse(&line) {
                if want(&l) {
                    return Some(l);
                }
            }
        }
        None
    }
}

impl Drop for FibTrace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.types);
    }
}

fn parse(line: &str) -> Option<Lookup> {
    let f: Vec<&str> = line.strip_prefix("L ")?.split(' ').collect();
    Some(Lookup {
        table: f.first()?.parse().ok()?,
        err: f.get(1)?.parse().ok()?,
        iif: f.get(2)?.parse().ok()?,
        oif: f.get(3)?.parse().ok()?,
        src: f.get(4)?.to_string(),
        dst: f.get(5)?.to_string(),
        dev: f.get(6).unwrap_or(&"").to_string(),
    })
}

fn topo(test: &str, net: u8) -> RpFilter {
    RpFilter {
        prefix: ns_name(&format!("{test}-")),
        client_ip: Ipv4Addr::new(198, 18, net, 7),
        pod_ip: Ipv4Addr::new(10, net, 7, 9),
        port: 5432,
        node_primary: Ipv4Addr::new(10, net, 6, 5),
        node_secondary: Ipv4Addr::new(10, net, 7, 5),
        primary_if: "ens4".into(),
        secondary_if: "ens6".into(),
    }
}

/// The device and table our reverse query answers, inside `ns`.
fn our_reverse(ns: &Ns, t: &RpFilter, mark: u32, src_valid_mark: bool) -> (String, u32) {
    let (client, pod) = (t.client_ip, t.pod_ip);
    in_netns(&ns.path(), move || {
        let (q, r) = reverse_lookup_v4(client, pod, mark, src_valid_mark, 0, None).unwrap();
        assert_eq!(q.src, Some(IpAddr::V4(pod)), "the pod address is local");
        let RouteLookup::Found(a) = r else {
            panic!("no route: {r:?}")
        };
        assert_eq!(a.kind, RouteType::Unicast);
        (ifname(a.oif.unwrap()).unwrap(), a.table)
    })
    .unwrap()
}

/// `ip route get` in `ns`, as text (stdout and stderr), failing the test
/// unless ip's exit status says `ok`.
fn ip_route_get_expecting(ns: &Ns, args: &[&str], ok: bool) -> String {
    let mut all = vec!["-n", &ns.name, "route", "get"];
    all.extend_from_slice(args);
    let out = Command::new("ip").args(&all).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.success(), ok, "ip {all:?}: {text}");
    text
}

/// `ip route get` in `ns` that must succeed, as text.
fn ip_route_get(ns: &Ns, args: &[&str]) -> String {
    ip_route_get_expecting(ns, args, true)
}

fn word_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut w = text.split_whitespace();
    w.find(|x| *x == key)?;
    w.next()
}

#[test]
fn reverse_query_matches_the_kernels_rp_filter_lookup() {
    let t = topo("rq1", 154);
    let lab = t.build().unwrap();
    let trace = FibTrace::start(&lab.node, Ipv4Addr::new(198, 18, 154, 250).into());
    let (client, pod) = (t.client_ip.to_string(), t.pod_ip.to_string());
    // The reverse lookup: iif lo, from the pod address to the client.
    let reverse = |l: &Lookup| l.dst == client && l.src == pod && l.iif == 1 && l.err == 0;

    // Mark 0x80 (CONNMARK) with src_valid_mark=1: rule 1024 sends the
    // lookup to main, out of ens4, and the SYN (in on ens6) is dropped.
    let _syn = send_syn(
        &lab.client,
        SocketAddr::from((t.client_ip, 40100)),
        SocketAddr::from((t.pod_ip, t.port)),
    );
    let kernel = trace
        .wait_for(bound(Duration::from_secs(10)), reverse)
        .expect("the kernel's reverse lookup");
    assert_eq!(kernel.oif, 0, "{kernel:?}");
    let (dev, table) = our_reverse(&lab.node, &t, 0x80, true);
    assert_eq!((dev.as_str(), table), (kernel.dev.as_str(), kernel.table));
    assert_eq!(dev, "ens4");
    let ip = ip_route_get(
        &lab.node,
        &["fibmatch", &client, "from", &pod, "mark", "0x80"],
    );
    assert_eq!(word_after(&ip, "dev"), Some("ens4"), "{ip}");

    // src_valid_mark=0: the kernel looks up with mark 0, rule 1536 (from
    // the pod) picks table 2, out of ens6: the SYN passes.
    lab.node
        .sysctl("net/ipv4/conf/all/src_valid_mark", "0")
        .unwrap();
    let _syn = send_syn(
        &lab.client,
        SocketAddr::from((t.client_ip, 40101)),
        SocketAddr::from((t.pod_ip, t.port)),
    );
    let kernel = trace
        .wait_for(bound(Duration::from_secs(10)), |l| {
            reverse(l) && l.dev == "ens6"
        })
        .expect("the kernel's reverse lookup without the mark");
    let (dev, table) = our_reverse(&lab.node, &t, 0x80, false);
    assert_eq!((dev.as_str(), table), (kernel.dev.as_str(), kernel.table));
    assert_eq!(table, 2);
}

/// A namespace with a veth for route tests without traffic.
fn lone_ns(test: &str) -> Ns {
    let ns = Ns::new(&ns_name(test)).unwrap();
    ns.ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"])
        .unwrap();
    for d in ["v0", "v1"] {
        ns.ip(&["link", "set", d, "up"]).unwrap();
    }
    ns.ip(&["addr", "add", "10.155.0.1/24", "dev", "v0"])
        .unwrap();
    ns.ip(&["addr", "add", "fd00:155::1/64", "dev", "v0", "nodad"])
        .unwrap();
    ns
}

fn ask(ns: &Ns, q: RouteQuery) -> RouteLookup {
    route_query::query_in(&ns.path(), &q).unwrap()
}

#[test]
fn errors_and_route_types_are_the_kernels() {
    let ns = lone_ns("rq2");
    for (kind, prefix) in [
        ("unreachable", "10.156.1.0/24"),
        ("prohibit", "10.156.2.0/24"),
        ("blackhole", "10.156.3.0/24"),
    ] {
        ns.ip(&["route", "add", kind, prefix]).unwrap();
    }
    // No route at all, then each reject type: the errno ip prints.
    for (dst, errno, text) in [
        ("10.159.0.1", libc::ENETUNREACH, "Network is unreachable"),
        ("10.156.1.1", libc::EHOSTUNREACH, "No route to host"),
        ("10.156.2.1", libc::EACCES, "Permission denied"),
        ("10.156.3.1", libc::EINVAL, "Invalid argument"),
    ] {
        let ip = ip_route_get_expecting(&ns, &[dst], false);
        assert!(ip.contains(text), "ip route get {dst}: {ip}");
        let r = ask(&ns, RouteQuery::get(dst.parse().unwrap()));
        let RouteLookup::Failed { errno: e, .. } = r else {
            panic!("{dst}: {r:?}")
        };
        assert_eq!(e, errno, "{dst}");
    }
    // FIB match names the entry: prefix and table as `ip route get fibmatch`.
    ns.ip(&[
        "route",
        "add",
        "10.157.0.0/16",
        "via",
        "10.155.0.9",
        "table",
        "7",
    ])
    .unwrap();
    ns.ip(&["rule", "add", "to", "10.157.0.0/16", "lookup", "7"])
        .unwrap();
    let ip = ip_route_get(&ns, &["fibmatch", "10.157.3.4"]);
    assert!(
        ip.starts_with("10.157.0.0/16 via 10.155.0.9 dev v0 table 7"),
        "{ip}"
    );
    let mut q = RouteQuery::get("10.157.3.4".parse().unwrap());
    q.fib_match = true;
    let RouteLookup::Found(a) = ask(&ns, q) else {
        panic!()
    };
    assert_eq!(
        (a.dst, a.dst_len, a.table, a.gateway),
        (
            Some("10.157.0.0".parse().unwrap()),
            16,
            7,
            Some("10.155.0.9".parse().unwrap())
        )
    );
    let v0 = in_netns(&ns.path(), || kdrop::context::netns::ifindex("v0")).unwrap();
    assert_eq!(a.oif, v0);
    // IPv6: a route through a gateway, as `ip -6 route get fibmatch`.
    ns.ip(&["-6", "route", "add", "fd00:158::/48", "via", "fd00:155::9"])
        .unwrap();
    let ip = ip_route_get(&ns, &["fibmatch", "fd00:158::1"]);
    assert!(
        ip.starts_with("fd00:158::/48 via fd00:155::9 dev v0"),
        "{ip}"
    );
    let mut q = RouteQuery::get("fd00:158::1".parse().unwrap());
    q.fib_match = true;
    let RouteLookup::Found(a) = ask(&ns, q) else {
        panic!()
    };
    assert_eq!(
        (a.dst, a.dst_len, a.table, a.gateway, a.oif),
        (
            Some("fd00:158::".parse().unwrap()),
            48,
            254,
            Some("fd00:155::9".parse().unwrap()),
            v0
        )
    );
    let r = ask(&ns, RouteQuery::get("fd00:159::1".parse().unwrap()));
    assert!(
        matches!(r, RouteLookup::Failed { errno, .. } if errno == libc::ENETUNREACH),
        "{r:?}: {}",
        ip_route_get_expecting(&ns, &["fd00:159::1"], false)
    );
}

/// ip6tables `-m rpfilter --invert -j DROP` on a node whose way back to the
/// client is another interface: the kernel's reverse lookup (seen by the
/// fib6 tracepoint) and our query agree, before and after a policy route
/// that sends the way back out of the input interface.
#[test]
fn v6_reverse_query_matches_ip6t_rpfilter_lookup() {
    let node = Ns::new(&ns_name("rq3-node")).unwrap();
    let client = Ns::new(&ns_name("rq3-client")).unwrap();
    let up = Ns::new(&ns_name("rq3-up")).unwrap();
    veth(
        &node,
        "ens4",
        "02:00:00:00:c3:01",
        &up,
        "gw",
        "02:00:00:00:c3:11",
    )
    .unwrap();
    veth(
        &node,
        "ens6",
        "02:00:00:00:c3:02",
        &client,
        "c0",
        "02:00:00:00:c3:12",
    )
    .unwrap();
    let (pod, cli) = ("fd00:156:b::9", "2001:db8:63::7");
    for (ns, args) in [
        (
            &node,
            vec![
                "-6",
                "addr",
                "add",
                "fd00:156:a::5/64",
                "dev",
                "ens4",
                "nodad",
            ],
        ),
        (
            &node,
            vec![
                "-6",
                "addr",
                "add",
                &format!("{pod}/128"),
                "dev",
                "ens6",
                "nodad",
            ],
        ),
        (
            &node,
            vec![
                "-6",
                "route",
                "add",
                "default",
                "via",
                "fd00:156:a::1",
                "dev",
                "ens4",
            ],
        ),
        (
            &client,
            vec![
                "-6",
                "addr",
                "add",
                &format!("{cli}/128"),
                "dev",
                "c0",
                "nodad",
            ],
        ),
        (
            &client,
            vec!["-6", "route", "add", pod, "dev", "c0", "src", cli],
        ),
        (
            &client,
            vec![
                "-6",
                "neigh",
                "replace",
                pod,
                "lladdr",
                "02:00:00:00:c3:02",
                "dev",
                "c0",
                "nud",
                "permanent",
            ],
        ),
    ] {
        ns.ip(&args).unwrap();
    }
    node.exec(
        "ip6tables",
        &[
            "-t",
            "raw",
            "-A",
            "PREROUTING",
            "-p",
            "tcp",
            "-m",
            "rpfilter",
            "--invert",
            "-j",
            "DROP",
        ],
    )
    .unwrap();
    let trace = FibTrace::start(&node, "2001:db8:63::250".parse().unwrap());
    let ens6 = in_netns(&node.path(), || ifindex_of("ens6"))
        .unwrap()
        .unwrap();
    let reverse = |l: &Lookup| l.dst == cli && l.src == pod && l.iif == 1 && l.oif == ens6 as i32;
    let ours = || {
        let q = RouteQuery::reverse_path_v6(
            cli.parse().unwrap(),
            pod.parse().unwrap(),
            ens6,
            None,
            false,
        );
        let RouteLookup::Found(a) = route_query::query_in(&node.path(), &q).unwrap() else {
            panic!("no route back")
        };
        let dev = in_netns(&node.path(), move || ifname(a.oif.unwrap()))
            .unwrap()
            .unwrap();
        (dev, a.table)
    };
    let dst: SocketAddr = format!("[{pod}]:5432").parse().unwrap();
    let _syn = send_syn(&client, format!("[{cli}]:40200").parse().unwrap(), dst);
    let kernel = trace
        .wait_for(bound(Duration::from_secs(10)), |l| reverse(l) && l.err == 0)
        .expect("the kernel's rpfilter lookup");
    let (dev, table) = ours();
    assert_eq!((dev.as_str(), table), (kernel.dev.as_str(), kernel.table));
    assert_eq!(dev, "ens4");

    // A way back through ens6 for the pod's replies: the check now passes.
    node.ip(&[
        "-6",
        "route",
        "add",
        "2001:db8:63::/64",
        "dev",
        "ens6",
        "table",
        "2",
    ])
    .unwrap();
    node.ip(&[
        "-6", "rule", "add", "from", pod, "lookup", "2", "priority", "100",
    ])
    .unwrap();
    let _syn = send_syn(&client, format!("[{cli}]:40201").parse().unwrap(), dst);
    let kernel = trace
        .wait_for(bound(Duration::from_secs(10)), |l| {
            reverse(l) && l.dev == "ens6"
        })
        .expect("the kernel's rpfilter lookup through table 2");
    let (dev, table) = ours();
    assert_eq!((dev.as_str(), table), (kernel.dev.as_str(), kernel.table));
    assert_eq!(table, 2);
}
