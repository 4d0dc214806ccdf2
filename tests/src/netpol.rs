//! The network policy tests' shared ground (calico.rs, kube_router.rs):
//! pods run by the real containerd through CRI, a ruleset restored in the
//! node as the engine writes it, and the NetworkPolicy kdrop proposes,
//! checked against Kubernetes' schema and read back as YAML.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::{
    containerd::{Containerd, BUSYBOX_IMAGE},
    cri::{recorded, ContainerSpec, Cri, PodSpec, Recorded},
    Record,
};

/// A pod as the kubelet runs it (labels as it passes them to
/// RunPodSandbox), with one busybox container sleeping.
pub fn pod(cri: &mut Cri, ns: &str, name: &str, uid: &str, labels: &[(&str, &str)]) -> Recorded {
    let app = labels[0].1;
    let p = cri.run_pod(&PodSpec {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        host_network: false,
        host_pid: false,
    });
    let id = cri.start_container(
        &p,
        &ContainerSpec {
            name: app.into(),
            image: BUSYBOX_IMAGE.into(),
            args: vec!["sleep".into(), "600".into()],
            ..Default::default()
        },
    );
    recorded(cri, &p, &id)
}

/// Runs a command, panics with its stderr if it fails, gives its stdout.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The host side of a pod's veth: `eth0@ifN` in the pod names its peer's
/// index in the node.
pub fn host_veth(ctd: &Containerd, pod_netns: &Path) -> String {
    let pin = pod_netns.file_name().unwrap().to_str().unwrap();
    let eth0 = sh(&["ip", "-n", pin, "-o", "link", "show", "eth0"]);
    let peer = eth0
        .split_once("@if")
        .and_then(|(_, r)| r.split(':').next())
        .expect("eth0@ifN");
    let node = sh(&["ip", "-n", &ctd.node.name, "-o", "link"]);
    node.lines()
        .find(|l| l.starts_with(&format!("{peer}: ")))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|n| n.split('@').next())
        .expect("the pod's peer in the node")
        .to_string()
}

/// `iptables-restore --noflush` of `text` in the node.
pub fn restore(ctd: &Containerd, text: &str, file: &Path) {
    std::fs::write(file, text).unwrap();
    let f = file.display().to_string();
    ctd.node
        .exec("iptables-restore", &["--noflush", &f])
        .unwrap_or_else(|e| panic!("iptables-restore {f}: {e:#}\n{text}"));
}

fn venv_tool(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.tools/venv/bin")
        .join(name)
}

/// The NetworkPolicy in kdrop's notes, validated against Kubernetes'
/// schema for it (strict: no unknown field).
pub fn validated_policy(e: &Record, dir: &Path) -> String {
    let note = e.finding().fix_notes.first().map_or("", String::as_str);
    let yaml = note
        .split_once(":\n")
        .map(|(_, y)| y.to_string())
        .unwrap_or_else(|| panic!("no NetworkPolicy in {note}"));
    let file = dir.join("policy.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let out = Command::new(venv_tool("kubernetes-validate"))
        .args(["--strict", "--no-warn"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate (cargo xtask bootstrap)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{yaml}");
    assert!(
        text.contains(" passed for resource networkpolicy/"),
        "{text}"
    );
    yaml
}

/// `matchLabels` of exactly these labels.
pub fn match_labels(labels: &[(&str, &str)]) -> Value {
    let m: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    serde_json::json!({ "matchLabels": m })
}

/// The policy's selectors: the pods it applies to (spec.podSelector) and
/// its one peer (`from` or `to`: namespaceSelector and podSelector).
pub fn selectors(yaml: &str, rule: &str, peer: &str) -> (Value, Value) {
    let v: Value = serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let spec = &v["spec"];
    let peers = &spec[rule][0][peer];
    assert_eq!(peers.as_array().map(Vec::len), Some(1), "{yaml}");
    (spec["podSelector"].clone(), peers[0].clone())
}

/// The policy's `metadata.name`.
pub fn policy_name(yaml: &str) -> String {
    let v: Value = serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The peer entry that selects a pod of `ns` with `labels`, exactly.
pub fn pod_peer(ns: &str, labels: &[(&str, &str)]) -> Value {
    serde_json::json!({
        "namespaceSelector": match_labels(&[("kubernetes.io/metadata.name", ns)]),
        "podSelector": match_labels(labels),
    })
}

/// kdrop's NetworkPolicy for record `e`, validated, checked against the
/// test's own pods: in `ns`, for `direction` (`ingress`/`egress`) and
/// `port`, selecting the pods labelled `protected` and one peer, the pods
/// of `peer_ns` labelled `peer`. Returns its YAML.
pub fn policy_allowing(
    e: &Record,
    dir: &Path,
    (ns, direction, port): (&str, &str, u16),
    protected: &[(&str, &str)],
    (peer_ns, peer): (&str, &[(&str, &str)]),
) -> String {
    let yaml = validated_policy(e, dir);
    assert!(yaml.contains(&format!("  namespace: \"{ns}\"\n")), "{yaml}");
    let kind = if direction == "ingress" {
        "Ingress"
    } else {
        "Egress"
    };
    assert!(yaml.contains(&format!("  - {kind}\n")), "{yaml}");
    assert!(yaml.contains(&format!("      port: {port}\n")), "{yaml}");
    let key = if direction == "ingress" { "from" } else { "to" };
    let (applies_to, other) = selectors(&yaml, direction, key);
    assert_eq!(applies_to, match_labels(protected), "{yaml}");
    assert_eq!(other, pod_peer(peer_ns, peer), "{yaml}");
    yaml
}
