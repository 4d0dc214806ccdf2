//! Cilium's policy drop, where Cilium itself cannot run: two pods the real
//! containerd runs through CRI, and on the client pod's host veth a
//! stand-in for Cilium's `cil_from_container` (tests/src/cilium.rs: a tcx
//! program that drops SYNs to one port and counts them in a map named and
//! shaped as Cilium's `cilium_metrics`, with Cilium's reason for a policy
//! drop, 133, egress). kdrop, told only the port, names the program, reads
//! Cilium's reason from that map (bpftool's dump of it is the oracle for
//! the count), names both pods as kubectl does and the direction, and
//! writes a NetworkPolicy that passes Kubernetes' schema and selects both
//! pods by the labels the test gave them. The repair is a Kubernetes object
//! (Cilium regenerates the endpoint's program from the policies): the test
//! checks the object, not a connection.
use std::{net::SocketAddr, process::Command};

use integration_tests::{
    cilium::{CiliumStandIn, EGRESS, POLICY_DENIED},
    containerd::Containerd,
    kernel_has_drop_reasons,
    netpol::{host_veth, pod, policy_allowing},
    reason_for, send_syn_at, skip, Kdrop,
};
use serde_json::Value;

const DB_LABELS: &[(&str, &str)] = &[("app", "db")];
const CART_LABELS: &[(&str, &str)] = &[("app", "cart")];

/// The packets the map counts for (reason, direction), per bpftool: each
/// CPU's `count`, the value's first 8 bytes, little-endian as on the host.
fn bpftool_count(map_id: u32, reason: u8, dir: u8) -> u64 {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "id", &map_id.to_string()])
        .output()
        .expect("bpftool");
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let byte =
        |x: &Value| u8::from_str_radix(x.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            let k = e["key"].as_array().unwrap();
            byte(&k[0]) == reason && byte(&k[1]) & 3 == dir
        })
        .flat_map(|e| e["values"].as_array().unwrap().clone())
        .map(|c| {
            let b: Vec<u8> = c["value"].as_array().unwrap()[..8]
                .iter()
                .map(byte)
                .collect();
            u64::from_le_bytes(b.try_into().unwrap())
        })
        .sum()
}

fn map_id(map: &std::os::fd::OwnedFd) -> u32 {
    let path = format!("/proc/self/fdinfo/{}", std::os::fd::AsRawFd::as_raw_fd(map));
    let info = std::fs::read_to_string(path).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("map_id:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn cilium_policy_drop_in_kubernetes_terms() {
    cilium_policy_drop(true);
}

/// Cilium attaching by cls_bpf, as it does before tcx (6.6) or with
/// `--enable-tcx=false`.
#[test]
fn cilium_policy_drop_by_a_tc_filter_in_kubernetes_terms() {
    cilium_policy_drop(false);
}

/// Both tests' pods have the same addresses and kdrop traces port 5432 in
/// every namespace: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cilium_policy_drop(tcx: bool) {
    // The program's drop is told from the kernel's reason (TC_INGRESS and
    // the like, 5.17+): 5.10's whole suite saw `no_reason` here, as kdrop
    // does not guess.
    if !kernel_has_drop_reasons() {
        let test = if tcx {
            "cilium_policy_drop_in_kubernetes_terms"
        } else {
            "cilium_policy_drop_by_a_tc_filter_in_kubernetes_terms"
        };
        skip(
            test,
            "no-drop-reasons",
            "the cause is told from the kernel's drop reason",
        );
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ctd = Containerd::start(if tcx { "cilium" } else { "cilium-tc" });
    ctd.import_test_images();
    let mut cri = ctd.cri();
    let db = pod(
        &mut cri,
        "kdt-db",
        "db-0",
        "2d4f6a8c-0e1f-4a3b-9c5d-7e9f1a3b5c7d",
        DB_LABELS,
    );
    let cart = pod(
        &mut cri,
        "kdt-shop",
        "cart-5d8c7b9f4-q7xkz",
        "8b0c2d4e-6f7a-4b9c-8d1e-3f5a7b9c1d2e",
        CART_LABELS,
    );
    let cart_veth = host_veth(&ctd, &cart.netns_path);
    let cil = if tcx {
        CiliumStandIn::attach(&ctd.node.path(), &cart_veth, 5432)
    } else {
        CiliumStandIn::attach_by_tc(&ctd.node.path(), &cart_veth, 5432)
    };
    let map = map_id(&cil.map);

    let state = ctd.state().display().to_string();
    let env = [("KDROP_RUNTIME_DIRS", state.as_str())];
    let k = Kdrop::start_env(&["--json", "-p", "5432"], &env);
    let syn = |sport: u16| {
        let src: SocketAddr = format!("{}:{sport}", cart.ip).parse().unwrap();
        let dst: SocketAddr = format!("{}:5432", db.ip).parse().unwrap();
        send_syn_at(&cart.netns_path, src, dst)
    };
    let denied = |what: &str, sport: u16| {
        k.expect_record(what, |e| {
            e.sport == sport && e.cause() == "network_policy_denied"
        })
    };

    let s = syn(43001);
    let e = denied("cart's egress, Cilium's first count", 43001);
    drop(s);
    assert_eq!(e.reason.as_deref(), reason_for("TC_INGRESS"), "{e}");
    assert_eq!(e.policy().engine, "cilium", "{e}");
    assert_eq!(e.policy().dataplane, "ebpf", "{e}");
    assert_eq!(e.policy().verdict, "no_policy_allowed", "{e}");
    assert_eq!(e.policy().direction, "egress", "{e}");
    assert_eq!(
        e.policy().protected_pod.as_deref(),
        Some(cart.pod.as_str()),
        "{e}"
    );
    assert_eq!(e.policy().peer_pod.as_deref(), Some(db.pod.as_str()), "{e}");
    assert_eq!(e.policy().port, 5432, "{e}");
    assert_eq!(e.policy().chain, "cil_from_contai", "{e}");
    assert_eq!(
        e.policy().interface.as_deref(),
        Some(cart_veth.as_str()),
        "{e}"
    );
    let summary = e.finding().summary.as_str();
    assert!(
        summary.contains(&format!(
            "Cilium network policy, egress of pod {} to pod {}: Cilium dropped TCP port 5432 as \
             POLICY_DENIED ({POLICY_DENIED})",
            cart.pod, db.pod
        )),
        "{summary}"
    );
    let evidence = e.finding().evidence.join("\n");
    assert!(
        evidence.contains(&format!("Cilium's metrics map (map {map}) counts")),
        "{evidence}"
    );
    assert!(
        evidence.contains("its only drop reason so far"),
        "{evidence}"
    );
    assert!(e.finding().fix.is_empty(), "{e}");
    let inspect = e.finding().inspect.join("\n");
    assert!(
        inspect.contains(&format!(
            "hubble observe --verdict DROPPED --from-pod {}",
            cart.pod
        )),
        "{inspect}"
    );
    policy_allowing(
        &e,
        &ctd.dir,
        ("kdt-shop", "egress", 5432),
        CART_LABELS,
        ("kdt-db", DB_LABELS),
    );

    // Another connection: the count grew since kdrop's read, to what
    // bpftool reads from the map.
    let s = syn(43002);
    let e = denied("cart's egress again", 43002);
    drop(s);
    let counted = bpftool_count(map, POLICY_DENIED, EGRESS);
    let evidence = e.finding().evidence.join("\n");
    assert!(
        evidence.contains("POLICY_DENIED egress went from "),
        "{evidence}"
    );
    let to: u64 = evidence
        .split(" went from ")
        .nth(1)
        .and_then(|r| r.split(" to ").nth(1))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{evidence}"));
    assert!(to >= 2 && to <= counted, "{to} of {counted}: {evidence}");

    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
    drop(cil);
    drop(cri);
    drop(ctd);
}
