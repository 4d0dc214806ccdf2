//! Which pod (or container) a network namespace belongs to, from what the
//! node exposes: the processes in the namespace (/proc/PID/ns/net), their
//! cgroup paths (/proc/PID/cgroup), and the container runtime's OCI bundle
//! annotations when they are readable. Cached; the netns inode remains the
//! fallback label.
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt as _,
    path::Path,
    time::{Duration, Instant},
};

/// A container as its cgroup path names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRef {
    /// Kubernetes pod UID with dashes, when the path is under kubepods.
    pub pod_uid: Option<String>,
    /// The 64-hex container id (the pod sandbox's, for the pause process).
    pub container_id: Option<String>,
    /// `containerd`, `cri-o`, `docker`, or None when the path does not say.
    pub runtime: Option<&'static str>,
}

/// Parses one cgroup path (the part after `0::` or `N:controllers:`), in
/// the shapes the kubelet's cgroupfs and systemd drivers and the container
/// runtimes produce.
pub fn parse_cgroup_path(path: &str) -> Option<CgroupRef> {
    let mut pod_uid = None;
    let mut container_id = None;
    let mut runtime = None;
    let mut kube = false;
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if seg.starts_with("kubepods") {
            kube = true;
            // systemd: kubepods-burstable-pod<uid_with_underscores>.slice
            if let Some(i) = seg.find("-pod") {
                let uid = seg[i + 4..].trim_end_matches(".slice").replace('_', "-");
                if is_uid(&uid) {
                    pod_uid = Some(uid);
                }
            }
            continue;
        }
        // cgroupfs: pod<uid>
        if kube {
            if let Some(uid) = seg.strip_prefix("pod").filter(|u| is_uid(u)) {
                pod_uid = Some(uid.to_string());
                continue;
            }
        }
        let (rt, rest) = if let Some(r) = seg.strip_prefix("cri-containerd-") {
            (Some("containerd"), r)
        } else if let Some(r) = seg.strip_prefix("crio-") {
            (Some("cri-o"), r)
        } else if let Some(r) = seg.strip_prefix("docker-") {
            (Some("docker"), r)
        } else {
            (None, seg)
        };
        let id = rest.trim_end_matches(".scope");
        if is_container_id(id) {
            container_id = Some(id.to_string());
            runtime = rt.or(runtime);
        } else if seg == "docker" {
            // cgroupfs docker: /docker/<id>
            runtime = Some("docker");
        }
    }
    if pod_uid.is_none() && container_id.is_none() {
        return None;
    }
    Some(CgroupRef {
        pod_uid,
        container_id,
        runtime,
    })
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The cgroup path of a process from /proc/PID/cgroup: the unified (v2)
/// line, else the first v1 line that names a container.
pub fn cgroup_of(proc_cgroup: &str) -> Option<CgroupRef> {
    let paths = proc_cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2).map(|p| (l.starts_with("0::"), p)));
    let (v2, v1): (Vec<_>, Vec<_>) = paths.partition(|(v2, _)| *v2);
    v2.into_iter()
        .chain(v1)
        .find_map(|(_, p)| parse_cgroup_path(p))
}

/// Pod namespace and name from an OCI bundle's `config.json` annotations:
/// containerd's CRI plugin and CRI-O write them for every container.
pub fn pod_from_annotations(config_json: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(config_json).ok()?;
    let a = v.get("annotations")?;
    let get = |k: &str| a.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let ns = get("io.kubernetes.cri.sandbox-namespace")
        .or_else(|| get("io.kubernetes.pod.namespace"))?;
    let name = get("io.kubernetes.cri.sandbox-name").or_else(|| get("io.kubernetes.pod.name"))?;
    Some((ns, name))
}

/// Where containerd (k8s.io namespace) and CRI-O keep a running container's
/// OCI bundle.
fn bundle_configs(id: &str) -> [String; 2] {
    [
        format!("/run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json"),
        format!("/run/containers/storage/overlay-containers/{id}/userdata/config.json"),
    ]
}

/// The `pod` label of a namespace: `namespace/name` when the runtime's
/// metadata says, else the pod UID, else `container/<id12>` for a
/// container outside Kubernetes, else empty (the host, or unknown).
pub fn label(r: &CgroupRef, meta: Option<(String, String)>) -> String {
    if let Some((ns, name)) = meta {
        return format!("{ns}/{name}");
    }
    if let Some(uid) = &r.pod_uid {
        return uid.clone();
    }
    match &r.container_id {
        Some(id) => format!("container/{}", &id[..12]),
        None => String::new(),
    }
}

/// netns inode → pod label, cached; misses are re-examined after a while
/// (a pod's first process may start after its first drop).
#[derive(Debug, Default)]
pub struct Pods {
    cache: HashMap<u32, (String, Instant)>,
}

const RETRY_MISS: Duration = Duration::from_secs(30);

impl Pods {
    pub fn label(&mut self, netns: u32) -> String {
        if let Some((l, at)) = self.cache.get(&netns) {
            if !l.is_empty() || at.elapsed() < RETRY_MISS {
                return l.clone();
            }
        }
        let l = find(netns).unwrap_or_default();
        self.cache.insert(netns, (l.clone(), Instant::now()));
        l
    }
}

/// The first process in `netns` whose cgroup names a container.
fn find(netns: u32) -> Option<String> {
    for p in fs::read_dir("/proc").ok()?.flatten() {
        let name = p.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let ns = Path::new("/proc").join(pid).join("ns/net");
        if fs::metadata(&ns).map(|m| m.ino() as u32).ok() != Some(netns) {
            continue;
        }
        let Ok(cg) = fs::read_to_string(Path::new("/proc").join(pid).join("cgroup")) else {
            continue;
        };
        let Some(r) = cgroup_of(&cg) else { continue };
        let meta = r.container_id.as_deref().and_then(|id| {
            bundle_configs(id)
                .iter()
                .find_map(|p| fs::read_to_string(p).ok())
                .and_then(|c| pod_from_annotations(&c))
        });
        return Some(label(&r, meta));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f3c5a8e-1234-4abc-9def-0123456789ab";
    const ID: &str = "4f1a9c2be7d04a55b6e0c3d2a1f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a291";

    fn parsed(path: &str) -> CgroupRef {
        parse_cgroup_path(path).unwrap_or_else(|| panic!("{path} not parsed"))
    }

    #[test]
    fn cgroupfs_driver() {
        // containerd / docker (kubelet cgroupfs driver, v1 and v2 alike).
        for qos in ["burstable/", "besteffort/", ""] {
            let r = parsed(&format!("/kubepods/{qos}pod{UID}/{ID}"));
            assert_eq!(r.pod_uid.as_deref(), Some(UID));
            assert_eq!(r.container_id.as_deref(), Some(ID));
            assert_eq!(r.runtime, None);
        }
        // CRI-O with cgroupfs.
        let r = parsed(&format!("/kubepods/burstable/pod{UID}/crio-{ID}"));
        assert_eq!(
            (r.pod_uid.as_deref(), r.runtime),
            (Some(UID), Some("cri-o"))
        );
    }

    #[test]
    fn systemd_driver() {
        let u = UID.replace('-', "_");
        let cases = [
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"),
                "containerd",
            ),
            (
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{ID}.scope"),
                "cri-o",
            ),
            (
                format!("/kubepods.slice/kubepods-pod{u}.slice/docker-{ID}.scope"),
                "docker",
            ),
        ];
        for (path, rt) in cases {
            let r = parsed(&path);
            assert_eq!(r.pod_uid.as_deref(), Some(UID), "{path}");
            assert_eq!(r.container_id.as_deref(), Some(ID), "{path}");
            assert_eq!(r.runtime, Some(rt), "{path}");
        }
        // The pod's slice itself (no container yet): the UID alone.
        let r = parsed(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
        ));
        assert_eq!((r.pod_uid.as_deref(), r.container_id), (Some(UID), None));
    }

    #[test]
    fn plain_containers_and_host() {
        let r = parsed(&format!("/docker/{ID}"));
        assert_eq!((r.pod_uid, r.runtime), (None, Some("docker")));
        let r = parsed(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(r.container_id.as_deref(), Some(ID));
        assert_eq!(label(&r, None), format!("container/{}", &ID[..12]));
        for host in [
            "/",
            "/init.scope",
            "/user.slice/user-0.slice/session-1.scope",
            "",
        ] {
            assert_eq!(parse_cgroup_path(host), None, "{host}");
        }
        // Not a pod UID, not a container id.
        assert_eq!(parse_cgroup_path("/kubepods/burstable/podnope/abc"), None);
    }

    #[test]
    fn proc_cgroup_files() {
        let v2 = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
        assert_eq!(cgroup_of(&v2).unwrap().pod_uid.as_deref(), Some(UID));
        let v1 = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        assert_eq!(cgroup_of(&v1).unwrap().container_id.as_deref(), Some(ID));
        assert_eq!(cgroup_of("0::/init.scope\n"), None);
    }

    #[test]
    fn annotations_name_the_pod() {
        let containerd = r#"{"ociVersion":"1.1.0","annotations":{"io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri.sandbox-name":"web-7d4b9c","io.kubernetes.cri.sandbox-namespace":"shop"}}"#;
        assert_eq!(
            pod_from_annotations(containerd),
            Some(("shop".into(), "web-7d4b9c".into()))
        );
        let crio = r#"{"annotations":{"io.kubernetes.pod.name":"db-0","io.kubernetes.pod.namespace":"data"}}"#;
        assert_eq!(
            pod_from_annotations(crio),
            Some(("data".into(), "db-0".into()))
        );
        assert_eq!(pod_from_annotations(r#"{"annotations":{}}"#), None);
        assert_eq!(pod_from_annotations("not json"), None);
        let r = parsed(&format!("/kubepods/pod{UID}/{ID}"));
        assert_eq!(label(&r, Some(("shop".into(), "web".into()))), "shop/web");
        assert_eq!(label(&r, None), UID);
    }
}
