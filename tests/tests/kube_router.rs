//! kube-router's network policy (its iptables and nftables dataplanes,
//! v2.11) on two
//! pods containerd ran through CRI on the node's CNI bridge: bridged
//! traffic meets iptables through br_netfilter, as on a kube-router node
//! (kube-bridge). The filter table and ipsets are the ones kube-router's
//! full sync restores for two NetworkPolicies
//! (tests/fixtures/kube-router/two-pods.rules.in). kdrop, told only the
//! ports, names the protected pod as kubectl does, the refused pod, the
//! direction and the pod chain that rejected, and writes a NetworkPolicy
//! that passes Kubernetes' schema; kube-router's rendering of that policy
//! (its chain and ipsets, their members chosen by the policy's own
//! selectors among the test's pods) lets a new connection through. The
//! client's own socket is the outside oracle of the REJECT: refused.
use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use integration_tests::{
    containerd::Containerd,
    cri::Recorded,
    netpol::{pod, policy_allowing, policy_name, restore, selectors},
    nf::BrNetfilter,
    send_syn_at, wait_connected, Kdrop,
};
use kdrop::context::netns::in_netns;
use serde_json::Value;

const RULES: &str = include_str!("../fixtures/kube-router/two-pods.rules.in");
const NFT_RULES: &str = include_str!("../fixtures/kube-router/two-pods.nft.in");
const NFT_TABLE: &str = "ip kube-router-filter-ipv4";

/// kube-router's two dataplanes (iptables, and nftables since v2.11), each
/// test on the same pods and policies.
#[derive(Clone, Copy, PartialEq)]
enum Dataplane {
    Iptables,
    Nftables,
}

impl Dataplane {
    fn name(self) -> &'static str {
        match self {
            Dataplane::Iptables => "iptables",
            Dataplane::Nftables => "nftables",
        }
    }
}

/// One at a time: each kdrop traces every namespace on these ports, and
/// both use the same ports, pods' addresses and source ports.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
const DB_LABELS: &[(&str, &str)] = &[("app", "db")];
const CART_LABELS: &[(&str, &str)] = &[("app", "cart")];
const DB_FW: &str = "KUBE-POD-FW-6WMES3SVBEOJXPF5";
const CART_FW: &str = "KUBE-POD-FW-7ILXE6PIDWSDKH4E";

/// The ipsets of the fixture's policies: (name, members).
fn sets<'a>(db: &'a Recorded, cart: &'a Recorded) -> [(&'static str, Vec<&'a str>); 4] {
    [
        // kdt-db/allow-api: its ingress rule 0's peers (app: api, none
        // runs), the pods it selects.
        ("KUBE-SRC-SXD6RONN7YUGKWM2", vec![]),
        ("KUBE-DST-RR5XEHC46KAM472P", vec![&db.ip]),
        // kdt-shop/cart-egress: the pods it selects, its egress rule 0's.
        ("KUBE-SRC-FTO5VINYCOA7X7LU", vec![&cart.ip]),
        ("KUBE-DST-PA7NLHYK3V5I5Y6J", vec![&db.ip]),
    ]
}

fn ipset(ctd: &Containerd, name: &str, members: &[&str]) {
    // kube-router's sets: hash:ip with timeout 0 (utils/ipset.go).
    ctd.node
        .exec("ipset", &["create", name, "hash:ip", "timeout", "0"])
        .unwrap();
    for m in members {
        ctd.node
            .exec("ipset", &["add", name, m, "timeout", "0"])
            .unwrap();
    }
}

fn rules(db: &Recorded, cart: &Recorded, chain: &str, jump: &str) -> String {
    RULES
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .replace("{ALLOW_CHAIN}", chain)
        .replace("{ALLOW_JUMP}", jump)
        .replace("{DB_IP}", &db.ip)
        .replace("{CART_IP}", &cart.ip)
}

/// A test pod as a selector sees it.
struct Selectable<'a> {
    namespace: &'a str,
    labels: &'a [(&'a str, &'a str)],
    ip: &'a str,
}

/// Does `selector` (`{matchLabels: {...}}` or `{}`) select `labels`?
fn selects(selector: &Value, labels: &BTreeMap<&str, &str>) -> bool {
    selector["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .all(|(k, v)| labels.get(k.as_str()).copied() == v.as_str())
        })
        .unwrap_or(true)
}

/// The members kube-router would put in the policy's sets: the pods of its
/// namespace its podSelector selects, and the pods its one `from` peer
/// (namespaceSelector by `kubernetes.io/metadata.name`, podSelector)
/// selects.
fn members<'a>(yaml: &str, pods: &[Selectable<'a>]) -> (Vec<&'a str>, Vec<&'a str>) {
    let v: Value = serde_yaml_ng::from_str(yaml).unwrap();
    let ns = v["metadata"]["namespace"].as_str().unwrap();
    let (applies_to, from) = selectors(yaml, "ingress", "from");
    fn labels<'a>(p: &Selectable<'a>) -> BTreeMap<&'a str, &'a str> {
        p.labels.iter().copied().collect()
    }
    let targets = pods
        .iter()
        .filter(|p| p.namespace == ns && selects(&applies_to, &labels(p)))
        .map(|p| p.ip)
        .collect();
    let peers = pods
        .iter()
        .filter(|p| {
            let ns_labels = BTreeMap::from([("kubernetes.io/metadata.name", p.namespace)]);
            selects(&from["namespaceSelector"], &ns_labels)
                && selects(&from["podSelector"], &labels(p))
        })
        .map(|p| p.ip)
        .collect();
    (targets, peers)
}

fn nft_rules(db: &Recorded, cart: &Recorded, sets: &str, chain: &str, jump: &str) -> String {
    NFT_RULES
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .replace("{ALLOW_SETS}", sets)
        .replace("{ALLOW_CHAIN}", chain)
        .replace("{ALLOW_JUMP}", jump)
        .replace("{DB_IP}", &db.ip)
        .replace("{CART_IP}", &cart.ip)
}

/// `nft -f` of `text` in the node, replacing kube-router's whole table.
fn nft_load(ctd: &Containerd, text: &str, file: &std::path::Path) {
    let text = format!("table {NFT_TABLE}\ndelete table {NFT_TABLE}\n{text}");
    std::fs::write(file, &text).unwrap();
    let f = file.display().to_string();
    ctd.node
        .exec("nft", &["-f", &f])
        .unwrap_or_else(|e| panic!("nft -f {f}: {e:#}\n{text}"));
}

/// The node's table as kube-router's full sync leaves it: iptables rules
/// and ipsets, or its nftables table with named sets.
fn load(dp: Dataplane, ctd: &Containerd, db: &Recorded, cart: &Recorded) {
    match dp {
        Dataplane::Iptables => {
            for (name, members) in sets(db, cart) {
                ipset(ctd, name, &members);
            }
            restore(
                ctd,
                &rules(db, cart, "", ""),
                &ctd.dir.join("kube-router.rules"),
            );
        }
        Dataplane::Nftables => nft_load(
            ctd,
            &nft_rules(db, cart, "", "", ""),
            &ctd.dir.join("kube-router.nft"),
        ),
    }
}

/// kdrop's policy `name` as kube-router's next sync renders it (policy.go,
/// npc_nftables.go: a chain for the policy, its rule 0's peers and the
/// pods it selects as sets, a jump from each selected pod's chain). The
/// chain and set names are kube-router's hashes of this name.
fn render_allow(
    dp: Dataplane,
    ctd: &Containerd,
    (db, cart): (&Recorded, &Recorded),
    name: &str,
    (targets, peers): (&[&str], &[&str]),
) {
    let (chain, src, dst) = (
        "KUBE-NWPLCY-LMF5O4HXPP73WXLM",
        "KUBE-SRC-X6BZQBCF5QGK2E2X",
        "KUBE-DST-PZNYWMJW3EUGD6RB",
    );
    match dp {
        Dataplane::Iptables => {
            ipset(ctd, src, peers);
            ipset(ctd, dst, targets);
            let spec = format!(
                "-A {chain} -m comment --comment \"kdt-db/{name} ingress pods\" -m set \
                 --match-set {src} src -m set --match-set {dst} dst -p tcp --dport 5432"
            );
            let allow_chain = format!(
                ":{chain} - [0:0]\n{spec} -j MARK --set-xmark 0x10000/0x10000\n{spec} -m mark \
                 --mark 0x10000/0x10000 -j RETURN"
            );
            // From the chain of each pod the policy selects.
            let jumps: String = targets
                .iter()
                .map(|ip| {
                    let fw = if *ip == db.ip { DB_FW } else { CART_FW };
                    format!(
                        "-I {fw} 1 -d {ip} -m comment --comment \"kdt-db/{name} policy\" -j \
                         {chain}\n"
                    )
                })
                .collect();
            restore(
                ctd,
                &rules(db, cart, &allow_chain, &jumps),
                &ctd.dir.join("kube-router-allow.rules"),
            );
        }
        Dataplane::Nftables => {
            let set = |n: &str, members: &[&str]| {
                let elements = if members.is_empty() {
                    String::new()
                } else {
                    format!("\t\telements = {{ {} }}\n", members.join(", "))
                };
                format!(
                    "\tset {n} {{\n\t\ttype ipv4_addr\n\t\tcomment \"netpol set\"\n{elements}\t}}\n"
                )
            };
            let sets = set(src, peers) + &set(dst, targets);
            let allow_chain = format!(
                "\tchain {chain} {{\n\t\tip saddr @{src} ip daddr @{dst} tcp dport 5432 counter \
                 meta mark set meta mark or 0x10000 return comment \"kdt-db/{name} ingress \
                 pods\"\n\t}}"
            );
            // The fixture holds a place for db-0's chain only.
            assert_eq!(targets, [db.ip.as_str()]);
            let jump = format!(
                "\t\tip daddr {} counter jump {chain} comment \"kdt-db/{name} policy\"",
                db.ip
            );
            nft_load(
                ctd,
                &nft_rules(db, cart, &sets, &allow_chain, &jump),
                &ctd.dir.join("kube-router-allow.nft"),
            );
        }
    }
}

#[test]
fn kube_router_iptables_policy_denials_in_kubernetes_terms() {
    denials_in_kubernetes_terms(Dataplane::Iptables);
}

#[test]
fn kube_router_nftables_policy_denials_in_kubernetes_terms() {
    denials_in_kubernetes_terms(Dataplane::Nftables);
}

fn denials_in_kubernetes_terms(dp: Dataplane) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let _br = BrNetfilter::ensure();
    let ctd = Containerd::start(&format!("kuberouter-{}", dp.name()));
    ctd.import_test_images();
    let mut cri = ctd.cri();
    let db = pod(
        &mut cri,
        "kdt-db",
        "db-0",
        "7a2b9c4d-1e3f-4a5b-8c6d-2e4f6a8b0c1d",
        DB_LABELS,
    );
    let cart = pod(
        &mut cri,
        "kdt-shop",
        "cart-5d8c7b9f4-q7xkz",
        "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9",
        CART_LABELS,
    );
    // Bridged pod-to-pod traffic through iptables, as kube-router needs.
    ctd.node
        .sysctl("net/bridge/bridge-nf-call-iptables", "1")
        .unwrap();
    load(dp, &ctd, &db, &cart);
    let listeners: Vec<_> = [5432u16, 5433]
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
    let k = Kdrop::start_env(&["--json", "-p", "5432", "-p", "5433"], &env);
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
    // REJECT answers the SYN with an ICMP port unreachable: the client's
    // connect fails at once, refused.
    let refused = |s: &std::os::fd::OwnedFd| {
        let err = wait_connected(s, Duration::from_secs(3)).expect_err("a rejected connect");
        assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED), "{err}");
    };

    // kdt-db/allow-api allows 5432 only from app: api pods: db-0's ingress.
    let s = syn(42001, 5432);
    refused(&s);
    let e = denied("db-0's ingress", 42001);
    drop(s);
    assert_eq!(e.policy().engine, "kube-router", "{e}");
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
    assert_eq!(e.policy().protected_addr, db.ip.as_str(), "{e}");
    assert_eq!(e.policy().port, 5432, "{e}");
    assert_eq!(e.policy().chain, DB_FW, "{e}");
    assert_eq!(
        e.policy().evaluated,
        ["NetworkPolicy kdt-db/allow-api (KUBE-NWPLCY-JTIYZ5XDNABE3YNF)"],
        "{e}"
    );
    assert_eq!(e.netfilter().chain.as_deref(), Some(DB_FW), "{e}");
    assert!(e.finding().fix.is_empty(), "{e}");
    let summary = e.finding().summary.as_str();
    assert!(
        summary.contains(&format!(
            "kube-router network policy, ingress of pod {} from pod {}: no NetworkPolicy that \
             selects it allows TCP port 5432",
            db.pod, cart.pod
        )),
        "{summary}"
    );
    let inspect = e.finding().inspect.join("\n");
    assert!(
        inspect.contains("kubectl describe networkpolicy -n kdt-db allow-api"),
        "{inspect}"
    );
    let yaml = policy_allowing(
        &e,
        &ctd.dir,
        ("kdt-db", "ingress", 5432),
        DB_LABELS,
        ("kdt-shop", CART_LABELS),
    );

    // kdt-shop/cart-egress allows cart only 5432 to db: cart's egress, on
    // 5433 (which allow-api lets any pod reach).
    let s = syn(42002, 5433);
    refused(&s);
    let e = denied("cart's egress", 42002);
    drop(s);
    assert_eq!(e.policy().direction, "egress", "{e}");
    assert_eq!(
        e.policy().protected_pod.as_deref(),
        Some(cart.pod.as_str()),
        "{e}"
    );
    assert_eq!(e.policy().peer_pod.as_deref(), Some(db.pod.as_str()), "{e}");
    assert_eq!(e.policy().port, 5433, "{e}");
    assert_eq!(e.policy().chain, CART_FW, "{e}");
    assert_eq!(
        e.policy().evaluated,
        ["NetworkPolicy kdt-shop/cart-egress (KUBE-NWPLCY-7BEPHQCNUM5BJEMH)"],
        "{e}"
    );
    policy_allowing(
        &e,
        &ctd.dir,
        ("kdt-shop", "egress", 5433),
        CART_LABELS,
        ("kdt-db", DB_LABELS),
    );

    // The first policy applied, as kube-router's next sync renders it.
    let name = policy_name(&yaml);
    assert_eq!(name, "kdrop-allow-cart-5d8c7b9f4-q7xkz-to-db-0-5432");
    let pods = [
        Selectable {
            namespace: "kdt-db",
            labels: DB_LABELS,
            ip: &db.ip,
        },
        Selectable {
            namespace: "kdt-shop",
            labels: CART_LABELS,
            ip: &cart.ip,
        },
    ];
    let (targets, peers) = members(&yaml, &pods);
    render_allow(dp, &ctd, (&db, &cart), &name, (&targets, &peers));
    let s = syn(42003, 5432);
    wait_connected(&s, Duration::from_secs(3))
        .expect("a new connection once kube-router renders the NetworkPolicy");
    let (_conn, _) = listeners[0].accept().unwrap();
    // The egress denial is another policy's: still refused.
    let s = syn(42004, 5433);
    refused(&s);

    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    drop(listeners);
    drop(cri);
    drop(ctd);
}
