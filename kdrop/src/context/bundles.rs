//! What the container runtime recorded of each running container: the OCI
//! bundle (`config.json`) containerd's CRI plugin and CRI-O write for every
//! container, pod sandboxes included, with the pod's and the container's
//! names in its annotations and, for a sandbox, the path of the network
//! namespace the runtime pinned for the pod (/var/run/netns/cni-..., which
//! any user may stat: no ptrace of the pod's processes is needed).
use std::{
    collections::{BTreeMap, HashMap},
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::model::pod::Labels;

/// One container (or pod sandbox) as its runtime recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub id: String,
    /// The pod's sandbox (pause) container rather than one of its own.
    pub sandbox: bool,
    pub sandbox_id: Option<String>,
    /// (namespace, name) of the pod.
    pub pod: Option<(String, String)>,
    pub pod_uid: Option<String>,
    /// The container's name in the pod spec (None for the sandbox).
    pub container: Option<String>,
    /// The pod's labels, when the runtime recorded them in the bundle
    /// (CRI-O does; containerd gives them over CRI only, cri.rs).
    pub labels: Option<Labels>,
    /// The network namespace the OCI spec joins, when given by path.
    pub netns: Option<PathBuf>,
    /// Where the runtime wrote the pid of the container's first process
    /// (set by [`Bundles::scan`], which knows the layout).
    pub pid_file: Option<PathBuf>,
}

/// Annotation keys: containerd's CRI plugin
/// (https://github.com/containerd/containerd/blob/v1.6.20/pkg/cri/annotations/annotations.go)
/// first, then CRI-O's, which copies the kubelet's labels into the
/// annotations and adds its own (cri-o's server/sandbox_run_linux.go,
/// runSandbox, and pkg/annotations).
const TYPE: [&str; 2] = [
    "io.kubernetes.cri.container-type",
    "io.kubernetes.cri-o.ContainerType",
];
const SANDBOX_ID: [&str; 2] = [
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri-o.SandboxID",
];
const POD_NAMESPACE: [&str; 2] = [
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
];
const POD_NAME: [&str; 2] = ["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"];
const POD_UID: [&str; 2] = ["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"];
const CONTAINER_NAME: [&str; 2] = [
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
];

/// CRI-O's copy of the pod's labels, as the kubelet passed them (a JSON
/// object in one annotation).
const LABELS: &str = "io.kubernetes.cri-o.Labels";

/// The labels the kubelet adds to every sandbox's for the runtime (its
/// `newPodLabels`, pkg/kubelet/kuberuntime/labels.go; CRI-O's bundle and
/// ListPodSandbox give them back with the pod's): not the pod's own,
/// `kubectl get pod --show-labels` does not show them and no selector
/// matches on them.
const KUBELET_LABELS: [&str; 3] = [
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.uid",
];

/// The pod's own labels among those the kubelet gave its sandbox.
pub fn own_labels(all: impl IntoIterator<Item = (String, String)>) -> Labels {
    all.into_iter()
        .filter(|(k, _)| !KUBELET_LABELS.contains(&k.as_str()))
        .collect()
}

fn labels_of(annotations: &serde_json::Value) -> Option<Labels> {
    let raw = annotations.get(LABELS)?.as_str()?;
    let all: BTreeMap<String, String> = serde_json::from_str(raw).ok()?;
    Some(own_labels(all))
}

/// Parses a bundle's config.json; None when it is not JSON or carries no
/// CRI annotations (a container outside Kubernetes).
pub fn parse(id: &str, config_json: &str) -> Option<Bundle> {
    let v: serde_json::Value = serde_json::from_str(config_json).ok()?;
    let a = v.get("annotations")?;
    let get = |keys: [&str; 2]| {
        keys.iter()
            .find_map(|k| a.get(*k).and_then(|x| x.as_str()))
            .map(str::to_string)
    };
    let kind = get(TYPE);
    let pod = get(POD_NAMESPACE).zip(get(POD_NAME));
    if kind.is_none() && pod.is_none() {
        return None;
    }
    let sandbox = kind.as_deref() == Some("sandbox");
    let netns = v["linux"]["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .map(PathBuf::from);
    Some(Bundle {
        id: id.to_string(),
        sandbox,
        sandbox_id: get(SANDBOX_ID),
        pod,
        pod_uid: get(POD_UID),
        container: if sandbox { None } else { get(CONTAINER_NAME) },
        labels: labels_of(a),
        netns,
        pid_file: None,
    })
}

/// Where runtimes keep their state: `KDROP_RUNTIME_DIRS` (colon-separated,
/// e.g. a containerd started with another `state`), then containerd's,
/// k3s's and CRI-O's defaults.
pub fn runtime_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("KDROP_RUNTIME_DIRS")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "/run/containerd",
            "/run/k3s/containerd",
            "/run/containers/storage",
        ]
        .map(PathBuf::from),
    );
    dirs
}

/// The directories holding one bundle per container id under a runtime's
/// state directory, and where the config and the pid file are in each:
/// containerd's v2 task bundles in its CRI namespace (`k8s.io`; the runc
/// shim writes `init.pid` there, containerd v1.6 pkg/process/init.go),
/// CRI-O's `userdata` (conmon's `--container-pidfile`, `pidfile`; no
/// Debian package to run it here).
fn layouts(dir: &Path) -> [(PathBuf, &'static str, &'static str); 2] {
    [
        (
            dir.join("io.containerd.runtime.v2.task/k8s.io"),
            "config.json",
            "init.pid",
        ),
        (
            dir.join("overlay-containers"),
            "userdata/config.json",
            "userdata/pidfile",
        ),
    ]
}

/// The inode of a network namespace file. Runtimes record the pin as
/// /var/run/netns/...; a container image may have /run but no /var/run.
pub fn netns_inode(path: &Path) -> Option<u32> {
    let direct = fs::metadata(path).ok();
    let meta = direct.or_else(|| {
        let rest = path.strip_prefix("/var/run").ok()?;
        fs::metadata(Path::new("/run").join(rest)).ok()
    })?;
    Some(meta.ino() as u32)
}

/// The bundles present now, each config parsed once for the container's
/// life (a bundle's config does not change while it runs).
#[derive(Debug)]
pub struct Bundles {
    dirs: Vec<PathBuf>,
    parsed: HashMap<PathBuf, Option<Bundle>>,
}

impl Default for Bundles {
    fn default() -> Self {
        Self::new(runtime_dirs())
    }
}

impl Bundles {
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        Self {
            dirs,
            parsed: HashMap::new(),
        }
    }

    /// The runtimes' state directories this reads.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// What the runtimes' bundle directories look like now (each one's
    /// device, inode and modification time, or nothing): it changes when a
    /// container comes or goes.
    pub fn stamp(&self) -> Vec<Option<(u64, u64, i64, i64)>> {
        self.dirs
            .iter()
            .flat_map(|d| layouts(d).map(|(parent, _, _)| parent))
            .map(|p| {
                let m = fs::metadata(p).ok()?;
                Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
            })
            .collect()
    }

    /// Lists every runtime's bundles (reading the configs of new ones).
    /// Listing needs read access to the runtime's state (0711 and 0700
    /// directories, root's): kdrop as root, or CAP_DAC_READ_SEARCH.
    pub fn scan(&mut self) -> Vec<Bundle> {
        let mut present = Vec::new();
        for dir in &self.dirs {
            for (parent, config, pid) in layouts(dir) {
                let Ok(entries) = fs::read_dir(&parent) else {
                    continue;
                };
                for e in entries.flatten() {
                    present.push((e.path().join(config), e.path().join(pid), e.file_name()));
                }
            }
        }
        self.parsed
            .retain(|path, _| present.iter().any(|(p, _, _)| p == path));
        let mut out = Vec::new();
        for (path, pid_file, id) in present {
            let b = self.parsed.entry(path.clone()).or_insert_with(|| {
                let id = id.to_string_lossy();
                let b = fs::read_to_string(&path).ok().and_then(|c| parse(&id, &c));
                b.map(|b| Bundle {
                    pid_file: Some(pid_file),
                    ..b
                })
            });
            out.extend(b.clone());
        }
        out
    }
}

/// The pid a runtime wrote for a container (its first process).
pub fn pid_of(b: &Bundle) -> Option<u32> {
    fs::read_to_string(b.pid_file.as_ref()?)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The sandbox among `bundles` whose network namespace is `netns`.
pub fn sandbox_of_netns(bundles: &[Bundle], netns: u32) -> Option<&Bundle> {
    bundles
        .iter()
        .filter(|b| b.sandbox)
        .find(|b| b.netns.as_deref().and_then(netns_inode) == Some(netns))
}

/// The names of a pod's own containers (not its sandbox), sorted, joined
/// with `,`; None when it has none running.
pub fn containers_of(bundles: &[Bundle], sandbox_id: &str) -> Option<String> {
    let mut names: Vec<&str> = bundles
        .iter()
        .filter(|b| !b.sandbox && b.sandbox_id.as_deref() == Some(sandbox_id))
        .filter_map(|b| b.container.as_deref())
        .collect();
    names.sort_unstable();
    names.dedup();
    (!names.is_empty()).then(|| names.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Annotations as containerd 1.6.20's CRI plugin wrote them for a pod
    // run through CRI on this machine (tests/tests/pods.rs runs the real one).
    const CONTAINERD_SANDBOX: &str = r#"{"ociVersion":"1.0.2-dev","annotations":{"io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri.sandbox-id":"0f4c09c1c2b2921a79b0ea9a1c814cc74087c92cfb5235067ed314d98892a514","io.kubernetes.cri.sandbox-log-directory":"/var/log/pods/shop_cart-7d9f5c8b6-x2kqp_5b0e8f3a-2c1d-4e6f-9a7b-1c2d3e4f5a6b","io.kubernetes.cri.sandbox-name":"cart-7d9f5c8b6-x2kqp","io.kubernetes.cri.sandbox-namespace":"shop","io.kubernetes.cri.sandbox-uid":"5b0e8f3a-2c1d-4e6f-9a7b-1c2d3e4f5a6b"},"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network","path":"/var/run/netns/cni-70360a39-8856-b9e2-a4ef-d45873a678bc"}]}}"#;
    const CONTAINERD_CONTAINER: &str = r#"{"annotations":{"io.kubernetes.cri.container-name":"cart","io.kubernetes.cri.container-type":"container","io.kubernetes.cri.image-name":"localhost/kdrop-test/busybox:1","io.kubernetes.cri.sandbox-id":"0f4c09c1c2b2921a79b0ea9a1c814cc74087c92cfb5235067ed314d98892a514","io.kubernetes.cri.sandbox-name":"cart-7d9f5c8b6-x2kqp","io.kubernetes.cri.sandbox-namespace":"shop","io.kubernetes.cri.sandbox-uid":"5b0e8f3a-2c1d-4e6f-9a7b-1c2d3e4f5a6b"},"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/proc/23242/ns/net"}]}}"#;
    // CRI-O (no Debian package here to run): its own keys plus the
    // kubelet's labels, as server/sandbox_run_linux.go adds them.
    const CRIO_SANDBOX: &str = r#"{"annotations":{"io.kubernetes.cri-o.ContainerType":"sandbox","io.kubernetes.cri-o.SandboxID":"aa11","io.kubernetes.cri-o.Namespace":"data","io.kubernetes.pod.name":"db-0","io.kubernetes.pod.namespace":"data","io.kubernetes.pod.uid":"0f3c5a8e-1234-4abc-9def-0123456789ab"},"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/5c7e1f0a-1b2c-4d3e-8f9a-0b1c2d3e4f5a"}]}}"#;
    const CRIO_CONTAINER: &str = r#"{"annotations":{"io.kubernetes.cri-o.ContainerType":"container","io.kubernetes.cri-o.SandboxID":"aa11","io.kubernetes.container.name":"postgres","io.kubernetes.pod.name":"db-0","io.kubernetes.pod.namespace":"data"}}"#;

    #[test]
    fn containerd_bundles() {
        let s = parse("0f4c", CONTAINERD_SANDBOX).unwrap();
        assert!(s.sandbox);
        assert_eq!(s.pod, Some(("shop".into(), "cart-7d9f5c8b6-x2kqp".into())));
        assert_eq!(
            s.pod_uid.as_deref(),
            Some("5b0e8f3a-2c1d-4e6f-9a7b-1c2d3e4f5a6b")
        );
        assert_eq!(s.container, None);
        assert_eq!(
            s.netns.as_deref(),
            Some(Path::new(
                "/var/run/netns/cni-70360a39-8856-b9e2-a4ef-d45873a678bc"
            ))
        );
        let c = parse("6e15", CONTAINERD_CONTAINER).unwrap();
        assert!(!c.sandbox);
        assert_eq!(c.container.as_deref(), Some("cart"));
        assert_eq!(c.sandbox_id, s.sandbox_id);
        let all = [s.clone(), c];
        assert_eq!(
            containers_of(&all, s.sandbox_id.as_deref().unwrap()).as_deref(),
            Some("cart")
        );
        assert_eq!(containers_of(&all, "other"), None);
    }

    #[test]
    fn crio_labels() {
        let labelled = CRIO_SANDBOX.replace(
            r#""annotations":{"#,
            r#""annotations":{"io.kubernetes.cri-o.Labels":"{\"app\":\"db\",\"io.kubernetes.pod.name\":\"db-0\",\"io.kubernetes.pod.namespace\":\"data\",\"io.kubernetes.pod.uid\":\"0f3c5a8e\",\"tier\":\"true\"}","#,
        );
        let s = parse("aa11", &labelled).unwrap();
        let want: BTreeMap<String, String> = [("app", "db"), ("tier", "true")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        assert_eq!(s.labels, Some(want));
        // containerd's bundles carry none; a broken annotation is none.
        assert_eq!(parse("aa11", CRIO_SANDBOX).unwrap().labels, None);
        let broken = CRIO_SANDBOX.replace(
            r#""annotations":{"#,
            r#""annotations":{"io.kubernetes.cri-o.Labels":"{not json","#,
        );
        assert_eq!(parse("aa11", &broken).unwrap().labels, None);
    }

    #[test]
    fn crio_bundles() {
        let s = parse("aa11", CRIO_SANDBOX).unwrap();
        assert!(s.sandbox);
        assert_eq!(s.pod, Some(("data".into(), "db-0".into())));
        assert_eq!(s.sandbox_id.as_deref(), Some("aa11"));
        let c = parse("bb22", CRIO_CONTAINER).unwrap();
        let side = parse(
            "cc33",
            &CRIO_CONTAINER.replace("\"postgres\"", "\"metrics\""),
        )
        .unwrap();
        assert_eq!(
            containers_of(&[s, side, c], "aa11").as_deref(),
            Some("metrics,postgres")
        );
    }

    #[test]
    fn not_kubernetes() {
        assert_eq!(parse("x", r#"{"annotations":{}}"#), None);
        assert_eq!(parse("x", r#"{"ociVersion":"1.0.2"}"#), None);
        assert_eq!(parse("x", "not json"), None);
    }

    #[test]
    fn finds_the_sandbox_of_a_namespace_on_disk() {
        // A runtime state directory as containerd lays it out, whose
        // sandbox "pins" this process's own network namespace.
        let dir = std::env::temp_dir().join(format!("kdrop-bundles-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap();
        let task = dir.join("io.containerd.runtime.v2.task/k8s.io");
        for (id, config) in [
            (
                "0f4c",
                CONTAINERD_SANDBOX.replace(
                    "/var/run/netns/cni-70360a39-8856-b9e2-a4ef-d45873a678bc",
                    "/proc/self/ns/net",
                ),
            ),
            ("6e15", CONTAINERD_CONTAINER.to_string()),
        ] {
            fs::create_dir_all(task.join(id)).unwrap();
            fs::write(task.join(id).join("config.json"), config).unwrap();
        }
        let mut bundles = Bundles::new(vec![dir.clone()]);
        let all = bundles.scan();
        assert_eq!(all.len(), 2);
        let s = sandbox_of_netns(&all, own).expect("the sandbox of this netns");
        assert_eq!(s.id, "0f4c");
        assert_eq!(pid_of(s), None);
        fs::write(task.join("0f4c/init.pid"), "4242").unwrap();
        assert_eq!(pid_of(s), Some(4242));
        assert!(sandbox_of_netns(&all, own.wrapping_add(1)).is_none());
        // A container gone is forgotten.
        fs::remove_dir_all(task.join("6e15")).unwrap();
        assert_eq!(bundles.scan().len(), 1);
        let _ = fs::remove_dir_all(&dir);
    }
}
