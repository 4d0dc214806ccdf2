//! Calico's network policy, iptables and nftables dataplanes, on two pods containerd
//! ran through CRI: their host veths made Calico's (renamed `cali*`, off
//! the bridge, a /32 route each, proxy ARP: pod-to-pod traffic is routed
//! by the node, FORWARD -i cali... -o cali...), the filter table in the
//! shape Felix renders it (tests/fixtures/calico/two-pods.rules.in; its
//! nftables table, two-pods.nft.in: the same chains). kdrop,
//! told only the service's port, names the pods as kubectl does, the
//! direction, port, tier and chain, and writes a NetworkPolicy that passes
//! Kubernetes' schema (kubernetes-validate --strict) and selects both pods
//! by the labels the test gave them (containerd's bundles hold none: kdrop
//! asks its CRI, found through the shims); Felix's rendering of that
//! policy lets a new connection through.
use std::{net::SocketAddr, path::Path, process::Command, sync::Mutex, time::Duration};

use integration_tests::{
    containerd::Containerd,
    cri::Recorded,
    netpol::{host_veth, pod, policy_allowing, restore, sh},
    scrape::{http_get, metrics_addr, scrape_until, value},
    send_syn_at, wait_connected, Kdrop, Record,
};
use kdrop::context::netns::in_netns;
use serde_json::Value;

const DB_IF: &str = "calid8e0b7a1c42";
const CART_IF: &str = "cali5f3a9e6b210";
const RULES: &str = include_str!("../fixtures/calico/two-pods.rules.in");
const NFT_RULES: &str = include_str!("../fixtures/calico/two-pods.nft.in");

/// Felix's two dataplanes, each test on the same pods and policies.
#[derive(Clone, Copy, PartialEq)]
enum Dataplane {
    Iptables,
    Nftables,
}

impl Dataplane {
    /// A chain as the dataplane lists it: Felix's nftables table prefixes
    /// its chains with their layer.
    fn chain(self, felix: &str) -> String {
        match self {
            Dataplane::Iptables => felix.to_string(),
            Dataplane::Nftables => format!("filter-{felix}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dataplane::Iptables => "iptables",
            Dataplane::Nftables => "nftables",
        }
    }
}

/// The pods' labels, as the kubelet passes them to RunPodSandbox: the
/// oracle for the policy's selectors.
const DB_LABELS: &[(&str, &str)] = &[("app", "db")];
const CART_LABELS: &[(&str, &str)] = &[("app", "cart")];

/// What Calico's CNI plugin makes of a pod's host veth: named `cali*`,
/// no bridge, a /32 route to the pod, proxy ARP for everything else.
fn calico_veth(ctd: &Containerd, veth: &str, name: &str, ip: &str) {
    let n = ctd.node.name.as_str();
    for args in [
        vec!["link", "set", veth, "nomaster"],
        vec!["link", "set", veth, "down"],
        vec!["link", "set", veth, "name", name],
        vec!["link", "set", name, "up"],
    ] {
        let mut all = vec!["ip", "-n", n];
        all.extend(args);
        sh(&all);
    }
    ctd.node
        .sysctl(&format!("net/ipv4/conf/{name}/proxy_arp"), "1")
        .unwrap();
    sh(&[
        "ip",
        "-n",
        n,
        "route",
        "add",
        &format!("{ip}/32"),
        "dev",
        name,
    ]);
}

fn rules(db: &Recorded, cart: &Recorded, allow: &str) -> String {
    RULES
        .replace("{DB_INGRESS_ALLOW}", allow)
        .replace("{DB_IF}", DB_IF)
        .replace("{CART_IF}", CART_IF)
        .replace("{DB_IP}", &db.ip)
        .replace("{CART_IP}", &cart.ip)
        .replace("{DB}", &db.pod)
        .replace("{CART}", &cart.pod)
}

fn nft_rules(db: &Recorded, cart: &Recorded, allow: &str) -> String {
    NFT_RULES
        .replace("{DB_INGRESS_ALLOW}", allow)
        .replace("{DB_IF}", DB_IF)
        .replace("{CART_IF}", CART_IF)
        .replace("{DB_IP}", &db.ip)
        .replace("{CART_IP}", &cart.ip)
}

/// `nft -f` of `text` in the node, replacing Felix's whole table.
fn nft_load(ctd: &Containerd, text: &str, file: &Path) {
    let text = format!("table ip calico\ndelete table ip calico\n{text}");
    std::fs::write(file, &text).unwrap();
    let f = file.display().to_string();
    ctd.node
        .exec("nft", &["-f", &f])
        .unwrap_or_else(|e| panic!("nft -f {f}: {e:#}\n{text}"));
}

#[test]
fn calico_iptables_policy_denials_in_kubernetes_terms() {
    denials_in_kubernetes_terms(Dataplane::Iptables);
}

#[test]
fn calico_nftables_policy_denials_in_kubernetes_terms() {
    denials_in_kubernetes_terms(Dataplane::Nftables);
}

/// One at a time: each kdrop traces every namespace on these ports, and
/// both use the same ports, pods' addresses and source ports.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn denials_in_kubernetes_terms(dp: Dataplane) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ctd = Containerd::start(&format!("calico-{}", dp.name()));
    ctd.import_test_images();
    let mut cri = ctd.cri();
    let db = pod(
        &mut cri,
        "kdt-db",
        "db-0",
        "3c1e9a4b-7d2f-4e8a-b5c6-0a1b2c3d4e5f",
        DB_LABELS,
    );
    let cart = pod(
        &mut cri,
        "kdt-shop",
        "cart-5d8c7b9f4-q7xkz",
        "9f8e7d6c-5b4a-4c3d-8e2f-1a0b9c8d7e6f",
        CART_LABELS,
    );
    let db_veth = host_veth(&ctd, &db.netns_path);
    let cart_veth = host_veth(&ctd, &cart.netns_path);
    calico_veth(&ctd, &db_veth, DB_IF, &db.ip);
    calico_veth(&ctd, &cart_veth, CART_IF, &cart.ip);
    ctd.node.sysctl("net/ipv4/ip_forward", "1").unwrap();
    for k in ["all", "default", DB_IF, CART_IF] {
        ctd.node
            .sysctl(&format!("net/ipv4/conf/{k}/rp_filter"), "0")
            .unwrap();
    }
    match dp {
        Dataplane::Iptables => restore(&ctd, &rules(&db, &cart, ""), &ctd.dir.join("felix.rules")),
        Dataplane::Nftables => {
            nft_load(&ctd, &nft_rules(&db, &cart, ""), &ctd.dir.join("felix.nft"))
        }
    }

    let listeners: Vec<_> = [5432u16, 5433, 5434]
        .iter()
        .map(|p| {
            let a: SocketAddr = format!("{}:{p}", db.ip).parse().unwrap();
            in_netns(&db.netns_path, move || std::net::TcpListener::bind(a))
                .unwrap()
                .unwrap()
        })
        .collect();

    let state = ctd.state().display().to_string();
    let env = [("KDROP_RUNTIME_DIRS", state.as_str())];
    let k = Kdrop::start_env(&["--json", "-p", "5432", "-p", "5433", "-p", "5434"], &env);
    // The same session recorded: explained after the pods and the node
    // are gone, from the bundle's answers alone.
    let bundle = std::env::temp_dir().join(format!("kdrop-calico-{}.kdrop", std::process::id()));
    let bundle_arg = bundle.display().to_string();
    let rec = Kdrop::start_env(&["record", "-o", &bundle_arg, "-p", "5432"], &env);
    // And monitored: the denials counted per protected pod and direction.
    let mon = Kdrop::start_env(
        &[
            "monitor",
            "-p",
            "5432",
            "-p",
            "5433",
            "-p",
            "5434",
            "--listen",
            "127.0.0.1:0",
        ],
        &env,
    );
    let mon_addr = metrics_addr(&mon);
    let syn = |sport: u16, dport: u16| {
        let src: SocketAddr = format!("{}:{sport}", cart.ip).parse().unwrap();
        let dst: SocketAddr = format!("{}:{dport}", db.ip).parse().unwrap();
        send_syn_at(&cart.netns_path, src, dst)
    };
    let denied = |what: &str, sport: u16| {
        k.expect_record(what, |e| {
            e.sport == sport && e.cause() == "network_policy_denied"
        })
    };

    // No policy of tier default allows cart → db-0:5432 (ingress).
    let s = syn(41001, 5432);
    let e = denied("the end of tier default", 41001);
    // Closed once seen: its retransmission a second later would be dropped
    // while the next test's drop moves another endpoint chain's counters,
    // and without the kernel's verdict probes (none on this host) kdrop
    // attributes from counters, not simulating the marks Calico sets along
    // the path (README, Calico): the test checks one drop at a time.
    drop(s);
    assert_eq!(e.policy().dataplane, dp.name(), "{e}");
    assert_eq!(e.policy().verdict, "no_policy_allowed", "{e}");
    assert_eq!(e.policy().direction, "ingress", "{e}");
    assert_eq!(
        e.policy().protected_pod.as_deref(),
        Some(db.pod.as_str()),
        "{e}"
    );
    assert_eq!(
        e.policy().peer_pod.as_deref(),
        Some(cart.pod.as_str()),
        "{e}"
    );
    assert_eq!(e.policy().port, 5432, "{e}");
    assert_eq!(e.policy().protocol, "TCP", "{e}");
    assert_eq!(e.policy().tier.as_deref(), Some("default"), "{e}");
    assert_eq!(
        e.policy().chain,
        dp.chain(&format!("cali-tw-{DB_IF}")).as_str(),
        "{e}"
    );
    assert_eq!(e.policy().interface.as_deref(), Some(DB_IF), "{e}");
    assert_eq!(
        e.policy().evaluated[0],
        format!(
            "KubernetesNetworkPolicy kdt-db/allow-monitoring ({})",
            dp.chain("cali-pi-_3lTDF2a_ZC7H2weaLbk")
        )
        .as_str(),
        "{e}"
    );
    assert!(e.finding().fix.is_empty(), "{e}");
    let summary = e.finding().summary.as_str();
    assert!(
        summary.starts_with(&format!(
            "pod {} → pod {}: Calico network policy, ingress of pod {} from pod {}: no policy \
             of tier default",
            cart.pod, db.pod, db.pod, cart.pod
        )),
        "{summary}"
    );
    // containerd's bundles give no labels, its CRI does: the policy
    // selects both pods by them, and says it allows exactly this.
    let notes = e.finding().fix_notes.join("\n");
    assert!(!notes.contains("labels"), "{notes}");
    let note = e.finding().fix_notes.first().map_or("", String::as_str);
    assert!(
        note.starts_with(
            "apply this NetworkPolicy (kubectl apply -f -) to allow exactly this connection:\n"
        ),
        "{notes}"
    );
    let inspect = e.finding().inspect.join("\n");
    assert!(
        inspect.contains("kubectl get networkpolicy -n kdt-db"),
        "{inspect}"
    );
    policy_allowing(
        &e,
        &ctd.dir,
        ("kdt-db", "ingress", 5432),
        DB_LABELS,
        ("kdt-shop", CART_LABELS),
    );
    let first = e.clone();

    // A deny rule of tier security's policy, for 5433.
    let s = syn(41002, 5433);
    let e = denied("the explicit deny", 41002);
    drop(s);
    assert_eq!(e.policy().verdict, "denied_by_rule", "{e}");
    assert_eq!(e.policy().direction, "ingress", "{e}");
    assert_eq!(e.policy().tier.as_deref(), Some("security"), "{e}");
    assert_eq!(
        e.policy().chain,
        dp.chain("cali-pi-_cS5Lb0y8WoQRLr489lA").as_str(),
        "{e}"
    );
    assert_eq!(
        e.policy().policy.as_deref(),
        Some("NetworkPolicy kdt-db/security.deny-kdt-shop"),
        "{e}"
    );
    assert_eq!(
        e.policy().endpoint_chain,
        dp.chain(&format!("cali-tw-{DB_IF}")).as_str(),
        "{e}"
    );
    policy_allowing(
        &e,
        &ctd.dir,
        ("kdt-db", "ingress", 5433),
        DB_LABELS,
        ("kdt-shop", CART_LABELS),
    );

    // cart's own egress policy allows db-0 on 5432 and 5433 only.
    let s = syn(41003, 5434);
    let e = denied("the end of cart's egress tier", 41003);
    drop(s);
    assert_eq!(e.policy().verdict, "no_policy_allowed", "{e}");
    assert_eq!(e.policy().direction, "egress", "{e}");
    assert_eq!(
        e.policy().protected_pod.as_deref(),
        Some(cart.pod.as_str()),
        "{e}"
    );
    assert_eq!(e.policy().peer_pod.as_deref(), Some(db.pod.as_str()), "{e}");
    assert_eq!(
        e.policy().chain,
        dp.chain(&format!("cali-fw-{CART_IF}")).as_str(),
        "{e}"
    );
    policy_allowing(
        &e,
        &ctd.dir,
        ("kdt-shop", "egress", 5434),
        CART_LABELS,
        ("kdt-db", DB_LABELS),
    );

    // The monitor's series, one per protected pod, direction, port,
    // verdict and policy, as the test built them.
    let want = [
        (db.pod.as_str(), "ingress", "5432", "no_policy_allowed", ""),
        (
            db.pod.as_str(),
            "ingress",
            "5433",
            "denied_by_rule",
            "NetworkPolicy kdt-db/security.deny-kdt-shop",
        ),
        (cart.pod.as_str(), "egress", "5434", "no_policy_allowed", ""),
    ];
    let series =
        |m: &str, (pod, direction, port, verdict, policy): (&str, &str, &str, &str, &str)| {
            value(
                m,
                "kdrop_network_policy_denials_total",
                &[
                    ("pod", pod),
                    ("direction", direction),
                    ("port", port),
                    ("verdict", verdict),
                    ("policy", policy),
                ],
            )
        };
    let m = scrape_until(
        || http_get(mon_addr, "/metrics"),
        "the three denials",
        |m| want.iter().all(|w| series(m, *w).is_some()),
    );
    let n = m
        .lines()
        .filter(|l| l.starts_with("kdrop_network_policy_denials_total{"))
        .count();
    assert_eq!(n, want.len(), "{m}");

    // The first policy applied: Felix renders it in tier default after
    // allow-monitoring (same order, names sorted), on the endpoints its
    // podSelector (app: db in kdt-db) selects, db-0's, its peer selector's
    // ipset (app: cart in kdt-shop) written as cart's address. A new
    // connection goes through.
    match dp {
        Dataplane::Iptables => render_allow_iptables(&ctd, &db, &cart),
        Dataplane::Nftables => render_allow_nftables(&ctd, &db, &cart),
    }
    let s = syn(41004, 5432);
    wait_connected(&s, Duration::from_secs(3))
        .expect("a new connection once the NetworkPolicy's allow is rendered");
    let (_conn, _) = listeners[0].accept().unwrap();

    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    let done = rec.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    // Every series counts sampled denials, and the monitor wrote each one.
    let done = mon.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    for w in want {
        let (pod, direction, port, ..) = w;
        let lines = done
            .records()
            .iter()
            .filter(|e| {
                e.network_policy.as_ref().is_some_and(|p| {
                    p.protected_pod.as_deref() == Some(pod)
                        && p.direction == direction
                        && p.port.to_string() == port
                })
            })
            .count() as u64;
        let counted = series(&m, w).unwrap();
        assert!(
            counted >= 1 && lines >= counted,
            "{w:?}: {counted} counted, {lines} written"
        );
    }
    drop(listeners);
    let (db_pod, cart_pod) = (db.pod.clone(), cart.pod.clone());
    drop(cri);
    drop(ctd);
    let out = Command::new(integration_tests::kdrop_bin())
        .args(["explain", &bundle_arg, "--json"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&bundle);
    assert!(out.status.success(), "{out:?}");
    let replayed: Vec<Record> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| Record::from_value(&v))
        .collect();
    let e = replayed
        .iter()
        .find(|e| e.sport == 41001 && e.cause() == "network_policy_denied")
        .unwrap_or_else(|| panic!("the denial in the bundle: {replayed:?}"));
    assert_eq!(e.policy().verdict, "no_policy_allowed", "{e}");
    assert_eq!(
        e.policy().protected_pod.as_deref(),
        Some(db_pod.as_str()),
        "{e}"
    );
    assert_eq!(
        e.policy().peer_pod.as_deref(),
        Some(cart_pod.as_str()),
        "{e}"
    );
    assert_eq!(e.policy().tier.as_deref(), Some("default"), "{e}");
    // The labels came from the bundle's answers: the same policy, the same
    // notes, word for word.
    let scratch = std::env::temp_dir().join(format!("kdrop-calico-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    policy_allowing(
        e,
        &scratch,
        ("kdt-db", "ingress", 5432),
        DB_LABELS,
        ("kdt-shop", CART_LABELS),
    );
    let _ = std::fs::remove_dir_all(&scratch);
    assert_eq!(e.finding().fix_notes, first.finding().fix_notes, "{e}");
}

/// kdrop's first policy as Felix's iptables dataplane renders it: a policy
/// chain, and the endpoint chain rewritten with its jump.
fn render_allow_iptables(ctd: &Containerd, db: &Recorded, cart: &Recorded) {
    let allow = format!(
        "-A cali-tw-{DB_IF} -m comment --comment \"cali:kD7rPq2sXv9wYz0A\" -m mark --mark \
         0x0/0x20000 -j cali-pi-kdrop-allow\n-A cali-tw-{DB_IF} -m comment --comment \
         \"cali:Lm3nB5vC7xZ9aQ1w\" -m comment --comment \"Return if policy accepted\" -m mark \
         --mark 0x10000/0x10000 -j RETURN\n"
    );
    let chain = format!(
        "*filter\n:cali-pi-kdrop-allow - [0:0]\n-A cali-pi-kdrop-allow -m comment --comment \
         \"cali:Pq8rS2tU4vW6xY8z\" -m comment --comment \"KubernetesNetworkPolicy \
         kdt-db/kdrop-allow ingress\" -p tcp -s {}/32 -m multiport --dports 5432 -j MARK \
         --set-xmark 0x10000/0x10000\n-A cali-pi-kdrop-allow -m comment --comment \
         \"cali:Hj4kL6mN8pQ0rS2t\" -m mark --mark 0x10000/0x10000 -j RETURN\nCOMMIT\n",
        cart.ip
    );
    restore(ctd, &chain, &ctd.dir.join("felix-allow-chain.rules"));
    // Only the endpoint chain again, as Felix rewrites one chain.
    let tw: String = rules(db, cart, &allow)
        .lines()
        .filter(|l| {
            l.starts_with(&format!("-A cali-tw-{DB_IF} ")) || l.starts_with("*") || *l == "COMMIT"
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let tw = tw.replacen(
        "*filter\n",
        &format!("*filter\n:cali-tw-{DB_IF} - [0:0]\n"),
        1,
    );
    restore(ctd, &tw, &ctd.dir.join("felix-tw.rules"));
}

/// The same in Felix's nftables table (felix/nftables renderer: a counter on
/// every rule, one `cali:<hash>; ...` comment), the table loaded again.
fn render_allow_nftables(ctd: &Containerd, db: &Recorded, cart: &Recorded) {
    let allow = "meta mark & 0x20000 == 0 counter jump filter-cali-pi-kdrop-allow comment \
         \"cali:kD7rPq2sXv9wYz0A;\"\n\t\tmeta mark & 0x10000 == 0x10000 counter return comment \
         \"cali:Lm3nB5vC7xZ9aQ1w; Return if policy accepted\"\n\t\t";
    let chain = format!(
        "table ip calico {{\n\tchain filter-cali-pi-kdrop-allow {{\n\t\tmeta l4proto tcp ip saddr \
         {}/32 tcp dport 5432 counter meta mark set mark or 0x10000 comment \
         \"cali:Pq8rS2tU4vW6xY8z; KubernetesNetworkPolicy kdt-db/kdrop-allow ingress\"\n\t\tmeta \
         mark & 0x10000 == 0x10000 counter return comment \"cali:Hj4kL6mN8pQ0rS2t;\"\n\t}}\n}}\n",
        cart.ip
    );
    let text = chain + &nft_rules(db, cart, allow);
    nft_load(ctd, &text, &ctd.dir.join("felix-allow.nft"));
}
