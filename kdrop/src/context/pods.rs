//! Which pod (and containers) a network namespace belongs to, from what
//! the node records: the container runtime's OCI bundles (bundles.rs: the
//! pod sandbox that pinned the namespace, its containers), else a process
//! in the namespace (/proc/PID/ns/net) and its cgroup path
//! (/proc/PID/cgroup). And which pod an address is, from the addresses of
//! the namespaces the sandboxes pinned (pod_addrs.rs). Cached; the netns
//! inode remains the fallback label.
use std::{
    collections::HashMap,
    fs,
    net::IpAddr,
    os::unix::fs::MetadataExt as _,
    path::Path,
    time::{Duration, Instant},
};

use super::{
    bundles::{self, Bundle, Bundles},
    cri::{self, Cri},
    pod_addrs,
};
use crate::model::pod::{Labels, Pod, PodId};

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
    bundles::parse("", config_json)?.pod
}

/// The pod a cgroup path names: `namespace/name` when the runtime's
/// metadata says, else the pod UID, else `container/<id12>` for a
/// container outside Kubernetes; None for the host.
pub fn pod_of_cgroup(r: &CgroupRef, meta: Option<(String, String)>) -> Option<PodId> {
    if let Some((namespace, name)) = meta {
        return Some(PodId::Named { namespace, name });
    }
    if let Some(uid) = &r.pod_uid {
        return Some(PodId::Uid(uid.clone()));
    }
    r.container_id
        .as_ref()
        .map(|id| PodId::Container(id[..12].to_string()))
}

/// The pod a sandbox's record names, with the containers recorded in it.
fn pod_of_sandbox(all: &[Bundle], s: &Bundle) -> Option<Pod> {
    let id = match (&s.pod, &s.pod_uid) {
        (Some((namespace, name)), _) => PodId::Named {
            namespace: namespace.clone(),
            name: name.clone(),
        },
        (None, Some(uid)) => PodId::Uid(uid.clone()),
        (None, None) => return None,
    };
    let containers = s
        .sandbox_id
        .as_deref()
        .and_then(|id| bundles::containers_of(all, id));
    Some(Pod {
        id,
        containers,
        labels: s.labels.clone(),
    })
}

/// The pods of the node, from the runtimes' records, cached: by network
/// namespace (a flood of drops from one namespace costs one lookup) and by
/// address. Misses are looked at again after a while (a pod's sandbox may
/// be recorded after its first drop), answers after a longer one (a
/// namespace inode or an address can be reused once its pod is gone).
#[derive(Debug)]
pub struct Pods {
    cache: HashMap<u32, (Option<Pod>, Instant)>,
    bundles: Bundles,
    /// kdrop's own namespace: the node's, for the DaemonSet (hostNetwork).
    /// Its drops are the node's even though kdrop's pod shares it.
    own_netns: Option<u32>,
    /// kdrop's own container, if it runs in one: a namespace whose
    /// processes are in it is not a pod's (a test or CI container's own
    /// namespaces).
    own_container: Option<String>,
    /// The addresses of every pod's namespace, when they were read and
    /// what the runtimes' directories looked like then.
    addrs: HashMap<IpAddr, Pod>,
    addrs_read: Option<Instant>,
    addrs_stamp: Vec<Option<(u64, u64, i64, i64)>>,
    /// When the directories were last looked at for a miss.
    stamp_checked: Option<Instant>,
    /// The runtimes' sandboxes as their CRI last listed them.
    cri: Cri,
}

const RETRY_MISS: Duration = Duration::from_secs(30);
const RECHECK_HIT: Duration = Duration::from_secs(300);
const MAX_CACHED: usize = 4096;
/// An address no pod had is looked for again at once when a container
/// came or went since, else after this (a pod's address may come after its
/// sandbox); all of them are read again after `ADDRS_STALE`.
const ADDRS_RETRY: Duration = Duration::from_secs(5);
const ADDRS_STALE: Duration = Duration::from_secs(60);
/// A flood of drops to addresses no pod has looks at the runtimes'
/// directories this often, not once per drop.
const STAMP_EVERY: Duration = Duration::from_millis(100);

impl Default for Pods {
    fn default() -> Self {
        Self::new(Bundles::default())
    }
}

impl Pods {
    pub fn new(bundles: Bundles) -> Self {
        let own_cgroup = fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|c| cgroup_of(&c));
        Self {
            cache: HashMap::new(),
            bundles,
            own_netns: bundles::netns_inode(Path::new("/proc/self/ns/net")),
            own_container: own_cgroup.and_then(|c| c.container_id),
            addrs: HashMap::new(),
            addrs_read: None,
            addrs_stamp: Vec::new(),
            stamp_checked: None,
            cri: Cri::default(),
        }
    }

    /// Lists the pods' sandboxes now, on a thread of its own, for the
    /// first finding that needs their labels (see Cri::ask_ahead).
    pub fn ask_labels_ahead(&mut self) {
        let dirs = self.bundles.dirs().to_vec();
        self.cri.ask_ahead(Box::new(move || {
            let mut bundles = Bundles::new(dirs);
            let all = bundles.scan();
            cri::ask_all(cri::sockets(bundles.dirs(), &all).0)
        }));
    }

    /// The pod's labels from its runtime over CRI (their bundles gave
    /// none), or why not.
    pub fn labels(&mut self, pod: &PodId) -> Result<Labels, String> {
        let bundles = &mut self.bundles;
        self.cri.labels(pod, || {
            let all = bundles.scan();
            cri::sockets(bundles.dirs(), &all)
        })
    }

    /// The pod whose network namespace this is.
    pub fn of_netns(&mut self, netns: u32) -> Option<Pod> {
        if let Some((p, at)) = self.cache.get(&netns) {
            let keep = if p.is_some() { RECHECK_HIT } else { RETRY_MISS };
            if at.elapsed() < keep {
                return p.clone();
            }
        }
        let p = if Some(netns) == self.own_netns {
            None
        } else {
            self.find(netns)
        };
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(netns, (p.clone(), Instant::now()));
        p
    }

    /// The pod whose network namespace has `addr`, among the pods the
    /// runtimes recorded (a sandbox's pinned namespace, read through its
    /// first process: the pid the runtime wrote, else one found in it).
    pub fn of_addr(&mut self, addr: IpAddr) -> Option<Pod> {
        let age = self.addrs_read.map(|at| at.elapsed());
        let found = self.addrs.get(&addr).cloned();
        let reread = match (&found, age) {
            (_, None) => true,
            (Some(_), Some(age)) => age >= ADDRS_STALE,
            (None, Some(age)) => age >= ADDRS_RETRY || self.containers_changed(),
        };
        if !reread {
            return found;
        }
        self.read_addrs();
        self.addrs.get(&addr).cloned()
    }

    /// Did a container come or go since the addresses were read? A few
    /// stat(2)s, at most every `STAMP_EVERY`.
    fn containers_changed(&mut self) -> bool {
        if self
            .stamp_checked
            .is_some_and(|at| at.elapsed() < STAMP_EVERY)
        {
            return false;
        }
        self.stamp_checked = Some(Instant::now());
        self.bundles.stamp() != self.addrs_stamp
    }

    fn read_addrs(&mut self) {
        self.addrs_stamp = self.bundles.stamp();
        let all = self.bundles.scan();
        self.addrs.clear();
        for s in all.iter().filter(|b| b.sandbox) {
            let Some(netns) = s.netns.as_deref().and_then(bundles::netns_inode) else {
                continue;
            };
            if Some(netns) == self.own_netns {
                continue;
            }
            let Some(pod) = pod_of_sandbox(&all, s) else {
                continue;
            };
            let Some(pid) = bundles::pid_of(s).or_else(|| pids_in(netns).next()) else {
                continue;
            };
            for a in pod_addrs::of_pid(pid) {
                self.addrs.insert(a, pod.clone());
            }
        }
        self.addrs_read = Some(Instant::now());
    }

    /// First the runtimes' own records (the sandbox that pinned this
    /// namespace); else a process in it, by its cgroup path.
    fn find(&mut self, netns: u32) -> Option<Pod> {
        let all = self.bundles.scan();
        if let Some(s) = bundles::sandbox_of_netns(&all, netns) {
            return pod_of_sandbox(&all, s);
        }
        let r = self.process_in(netns)?;
        let own = r
            .container_id
            .as_deref()
            .and_then(|id| all.iter().find(|b| b.id == id));
        let sandbox = own.and_then(|b| {
            let id = b.sandbox_id.as_deref()?;
            all.iter().find(|s| s.sandbox && s.id == id)
        });
        match sandbox {
            Some(s) => pod_of_sandbox(&all, s),
            None => Some(Pod {
                id: pod_of_cgroup(&r, own.and_then(|b| b.pod.clone()))?,
                containers: own.and_then(|b| b.container.clone()),
                labels: None,
            }),
        }
    }

    /// The cgroup of the first process in `netns` whose cgroup names a
    /// container other than kdrop's own.
    fn process_in(&self, netns: u32) -> Option<CgroupRef> {
        pids_in(netns).find_map(|pid| {
            let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            cgroup_of(&cg)
                .filter(|r| self.own_container.is_none() || r.container_id != self.own_container)
        })
    }
}

/// The processes in `netns` (reading /proc/PID/ns/net of another user's
/// process needs CAP_SYS_PTRACE: without it only kdrop's own are seen).
fn pids_in(netns: u32) -> impl Iterator<Item = u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(move |pid| {
            fs::metadata(format!("/proc/{pid}/ns/net"))
                .map(|m| m.ino() as u32)
                .ok()
                == Some(netns)
        })
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
        assert_eq!(
            pod_of_cgroup(&r, None),
            Some(PodId::Container(ID[..12].into()))
        );
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
        let named = Pod {
            id: pod_of_cgroup(&r, Some(("shop".into(), "web".into()))).unwrap(),
            containers: None,
            labels: None,
        };
        assert_eq!(
            (named.label(), named.phrase()),
            ("shop/web".into(), "pod shop/web".into())
        );
        assert_eq!(pod_of_cgroup(&r, None), Some(PodId::Uid(UID.into())));
    }
}
