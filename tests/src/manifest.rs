//! deploy/'s manifests read as the kubelet reads a pod: the DaemonSet's pod
//! template turned into the CRI requests the kubelet would make for it
//! (what a field means for the runtime follows
//! pkg/kubelet/kuberuntime/kuberuntime_container_linux.go and
//! security_context.go, kubernetes v1.30).
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cri::{ContainerSpec, PodSpec};

pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// One YAML document as JSON values.
pub fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The image the kustomization's `images:` maps the DaemonSet's name to.
pub fn kustomized_image(name: &str) -> String {
    let k = yaml(&deploy_dir().join("base/kustomization.yaml"));
    let entry = k["images"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("kustomization.yaml maps no image {name}"));
    let new_name = entry["newName"].as_str().unwrap_or(name);
    match entry["newTag"].as_str() {
        Some(tag) => format!("{new_name}:{tag}"),
        None => new_name.to_string(),
    }
}

/// `$(VAR)` references in a container's args, expanded as the kubelet does.
fn expand(s: &str, env: &[(String, String)]) -> String {
    env.iter()
        .fold(s.to_string(), |s, (k, v)| s.replace(&format!("$({k})"), v))
}

/// The DaemonSet's pod and its one container, as CRI requests.
/// `node_ip` is what `status.hostIP` resolves to; `host_paths` maps a
/// hostPath the node keeps elsewhere (the test's containerd state) to
/// where it is.
pub fn daemonset_pod(
    pod: (&str, &str, &str),
    node_ip: &str,
    host_paths: &[(&str, &str)],
) -> (PodSpec, ContainerSpec) {
    let ds = yaml(&deploy_dir().join("base/daemonset.yaml"));
    assert_eq!(ds["kind"], "DaemonSet");
    let template = &ds["spec"]["template"];
    let spec = &template["spec"];
    let labels = template["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let pod_spec = PodSpec {
        namespace: pod.0.into(),
        name: pod.1.into(),
        uid: pod.2.into(),
        labels,
        host_network: spec["hostNetwork"] == true,
        host_pid: spec["hostPID"] == true,
    };
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "one container in the DaemonSet");
    let c = &containers[0];
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
                (Value::String(v), _) => v.clone(),
                (_, Value::String(f)) if f == "status.hostIP" => node_ip.to_string(),
                other => panic!("env {name}: {other:?} not known to this test"),
            };
            (name, value)
        })
        .collect();
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| expand(s.as_str().unwrap(), &env))
            .collect()
    };
    let volumes = spec["volumes"].as_array().expect("volumes");
    let mounts = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let name = &m["name"];
            let volume = volumes
                .iter()
                .find(|v| &v["name"] == name)
                .unwrap_or_else(|| panic!("no volume {name}"));
            let path = volume["hostPath"]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("volume {name}: only hostPath is known to this test"));
            let host = host_paths
                .iter()
                .find(|(from, _)| *from == path)
                .map_or(path, |(_, to)| *to);
            (
                host.to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
                m["readOnly"] == true,
                m["mountPropagation"] == "HostToContainer",
            )
        })
        .collect();
    let sc = &c["securityContext"];
    let caps = |k: &str| -> Vec<String> {
        sc["capabilities"][k]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let image_name = c["image"].as_str().expect("image");
    let container = ContainerSpec {
        name: c["name"].as_str().unwrap().into(),
        image: kustomized_image(image_name),
        command: strs(&c["command"]),
        args: strs(&c["args"]),
        env: env.clone(),
        mounts,
        run_as_user: sc["runAsUser"].as_i64(),
        run_as_group: sc["runAsGroup"].as_i64(),
        readonly_rootfs: sc["readOnlyRootFilesystem"] == true,
        // allowPrivilegeEscalation unset means allowed.
        no_new_privs: sc["allowPrivilegeEscalation"] == false,
        cap_add: caps("add"),
        cap_drop: caps("drop"),
    };
    (pod_spec, container)
}
