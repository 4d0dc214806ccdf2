//! The CRI calls the kubelet makes to run a pod (RunPodSandbox,
//! CreateContainer, StartContainer, and StopPodSandbox/RemovePodSandbox to
//! end it), with the request fields the kubelet fills
//! (pkg/kubelet/kuberuntime/kuberuntime_sandbox.go and
//! kuberuntime_container.go in kubernetes v1.30), over containerd's socket.
use std::{collections::HashMap, path::Path};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    runtime_service_client::RuntimeServiceClient, Capability, ContainerConfig, ContainerMetadata,
    ContainerStatusRequest, CreateContainerRequest, ImageSpec, Int64Value, KeyValue,
    LinuxContainerConfig, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, ListPodSandboxRequest, Mount, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// What the kubelet knows of a pod when it asks for its sandbox.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: Vec<(String, String)>,
    pub host_network: bool,
    pub host_pid: bool,
}

/// One container of a pod, as the kubelet passes it to CreateContainer.
#[derive(Clone, Debug, Default)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// (host path, container path, read-only, HostToContainer propagation)
    pub mounts: Vec<(String, String, bool, bool)>,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub readonly_rootfs: bool,
    /// `allowPrivilegeEscalation: false` (the kubelet's default when unset
    /// is to allow it).
    pub no_new_privs: bool,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
}

/// A running pod: its sandbox id and the config the kubelet keeps to pass
/// with every CreateContainer.
pub struct Pod {
    pub id: String,
    pub spec: PodSpec,
    config: PodSandboxConfig,
}

pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    logs: std::path::PathBuf,
    cgroup_root: String,
}

impl Cri {
    pub fn connect(socket: &Path, logs: &Path, cgroup_root: &str) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = socket.to_path_buf();
        let channel = rt
            .block_on(
                // The URI is a placeholder: the connector dials the socket.
                Endpoint::try_from("http://[::]:50051")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let socket = socket.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                tokio::net::UnixStream::connect(socket).await?,
                            ))
                        }
                    })),
            )
            .expect("connecting to containerd's CRI socket");
        Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
            logs: logs.to_path_buf(),
            cgroup_root: cgroup_root.to_string(),
        }
    }

    /// RunPodSandbox as the kubelet asks for it (cgroupfs driver).
    pub fn run_pod(&mut self, spec: &PodSpec) -> Pod {
        let mut labels: HashMap<String, String> = spec.labels.iter().cloned().collect();
        labels.insert("io.kubernetes.pod.name".into(), spec.name.clone());
        labels.insert("io.kubernetes.pod.namespace".into(), spec.namespace.clone());
        labels.insert("io.kubernetes.pod.uid".into(), spec.uid.clone());
        let log_directory = self
            .logs
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        std::fs::create_dir_all(&log_directory).unwrap();
        let mode = |node: bool, otherwise: NamespaceMode| {
            if node {
                NamespaceMode::Node as i32
            } else {
                otherwise as i32
            }
        };
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            // The kubelet names only pods of their own network (and UTS)
            // namespace; a host-network pod keeps the node's hostname.
            hostname: if spec.host_network {
                String::new()
            } else {
                spec.name.clone()
            },
            log_directory: log_directory.display().to_string(),
            labels,
            annotations: HashMap::from([("kubernetes.io/config.source".into(), "api".into())]),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/kubepods/besteffort/pod{}", self.cgroup_root, spec.uid),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: mode(spec.host_network, NamespaceMode::Pod),
                        pid: mode(spec.host_pid, NamespaceMode::Container),
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = self
            .rt
            .block_on(self.client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }))
            .unwrap_or_else(|e| panic!("RunPodSandbox {}/{}: {e}", spec.namespace, spec.name))
            .into_inner()
            .pod_sandbox_id;
        Pod {
            id,
            spec: spec.clone(),
            config,
        }
    }

    /// CreateContainer then StartContainer; the container's id.
    pub fn start_container(&mut self, pod: &Pod, c: &ContainerSpec) -> String {
        let labels = HashMap::from([
            ("io.kubernetes.container.name".to_string(), c.name.clone()),
            ("io.kubernetes.pod.name".into(), pod.spec.name.clone()),
            (
                "io.kubernetes.pod.namespace".into(),
                pod.spec.namespace.clone(),
            ),
            ("io.kubernetes.pod.uid".into(), pod.spec.uid.clone()),
        ]);
        let ns = &pod.spec;
        let security = LinuxContainerSecurityContext {
            capabilities: Some(Capability {
                add_capabilities: c.cap_add.clone(),
                drop_capabilities: c.cap_drop.clone(),
                add_ambient_capabilities: Vec::new(),
            }),
            // The container's namespaces are the pod's (the kubelet repeats
            // the sandbox's options here).
            namespace_options: pod
                .config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.namespace_options.clone()),
            run_as_user: c.run_as_user.map(|value| Int64Value { value }),
            run_as_group: c.run_as_group.map(|value| Int64Value { value }),
            readonly_rootfs: c.readonly_rootfs,
            no_new_privs: c.no_new_privs,
            // The kubelet's defaults for a container that is not privileged.
            masked_paths: [
                "/proc/asound",
                "/proc/acpi",
                "/proc/kcore",
                "/proc/keys",
                "/proc/latency_stats",
                "/proc/timer_list",
                "/proc/timer_stats",
                "/proc/sched_debug",
                "/proc/scsi",
                "/sys/firmware",
            ]
            .map(String::from)
            .to_vec(),
            readonly_paths: [
                "/proc/bus",
                "/proc/fs",
                "/proc/irq",
                "/proc/sys",
                "/proc/sysrq-trigger",
            ]
            .map(String::from)
            .to_vec(),
            ..Default::default()
        };
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: c.image.clone(),
                ..Default::default()
            }),
            command: c.command.clone(),
            args: c.args.clone(),
            envs: c
                .env
                .iter()
                .map(|(key, value)| KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            mounts: c
                .mounts
                .iter()
                .map(|(host, container, ro, host_to_container)| Mount {
                    container_path: container.clone(),
                    host_path: host.clone(),
                    readonly: *ro,
                    propagation: if *host_to_container {
                        k8s_cri::v1::MountPropagation::PropagationHostToContainer as i32
                    } else {
                        k8s_cri::v1::MountPropagation::PropagationPrivate as i32
                    },
                    ..Default::default()
                })
                .collect(),
            labels,
            annotations: HashMap::new(),
            log_path: format!("{}/0.log", c.name),
            linux: Some(LinuxContainerConfig {
                resources: None,
                security_context: Some(security),
            }),
            ..Default::default()
        };
        let id = self
            .rt
            .block_on(self.client.create_container(CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            }))
            .unwrap_or_else(|e| {
                panic!(
                    "CreateContainer {} in {}/{}: {e}",
                    c.name, ns.namespace, ns.name
                )
            })
            .into_inner()
            .container_id;
        self.rt
            .block_on(self.client.start_container(StartContainerRequest {
                container_id: id.clone(),
            }))
            .unwrap_or_else(|e| panic!("StartContainer {}: {e}", c.name));
        id
    }

    /// PodSandboxStatus: the pod's metadata and IP as containerd recorded
    /// them, and its verbose info (the sandbox's pid, its runtime spec).
    pub fn pod_status(&mut self, id: &str) -> (PodSandboxMetadata, String, serde_json::Value) {
        let r = self
            .rt
            .block_on(self.client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            }))
            .unwrap_or_else(|e| panic!("PodSandboxStatus {id}: {e}"))
            .into_inner();
        let status = r.status.expect("a sandbox status");
        let info = r
            .info
            .get("info")
            .map(|s| serde_json::from_str(s).expect("verbose info is JSON"))
            .unwrap_or_default();
        (
            status.metadata.expect("sandbox metadata"),
            status.network.map(|n| n.ip).unwrap_or_default(),
            info,
        )
    }

    /// The pid of a container's first process (ContainerStatus' verbose
    /// info).
    pub fn container_pid(&mut self, id: &str) -> u32 {
        let r = self
            .rt
            .block_on(self.client.container_status(ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            }))
            .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
            .into_inner();
        let info: serde_json::Value =
            serde_json::from_str(r.info.get("info").expect("verbose info")).unwrap();
        info["pid"].as_u64().expect("a pid") as u32
    }

    /// Whether the container's process is still running.
    pub fn container_running(&mut self, id: &str) -> bool {
        let r = self
            .rt
            .block_on(self.client.container_status(ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            }))
            .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
            .into_inner();
        r.status
            .is_some_and(|s| s.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
    }

    /// Where the runtime writes a container's output (CRI log format).
    pub fn log_path(&self, pod: &Pod, container: &str) -> std::path::PathBuf {
        self.logs
            .join(format!(
                "{}_{}_{}",
                pod.spec.namespace, pod.spec.name, pod.spec.uid
            ))
            .join(container)
            .join("0.log")
    }

    /// ContainerStatus: the container's name as containerd recorded it.
    pub fn container_name(&mut self, id: &str) -> String {
        let r = self
            .rt
            .block_on(self.client.container_status(ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            }))
            .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
            .into_inner();
        r.status
            .and_then(|s| s.metadata)
            .map(|m| m.name)
            .expect("container metadata")
    }

    pub fn pod_ids(&mut self) -> Vec<String> {
        self.rt
            .block_on(
                self.client
                    .list_pod_sandbox(ListPodSandboxRequest { filter: None }),
            )
            .map(|r| r.into_inner().items.into_iter().map(|p| p.id).collect())
            .unwrap_or_default()
    }

    /// StopPodSandbox (its containers are killed, CNI DEL tears its
    /// network down) then RemovePodSandbox.
    pub fn stop_and_remove_pod(&mut self, id: &str) {
        let stop = self
            .rt
            .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }));
        if let Err(e) = stop {
            eprintln!("StopPodSandbox {id}: {e}");
        }
        let rm = self
            .rt
            .block_on(self.client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }));
        if let Err(e) = rm {
            eprintln!("RemovePodSandbox {id}: {e}");
        }
    }
}

/// A pod as a Deployment's ReplicaSet names one, with one container.
pub fn cart_pod(cri: &mut Cri) -> (Pod, String) {
    let pod = cri.run_pod(&PodSpec {
        namespace: "shop".into(),
        name: "cart-7d9f5c8b6-x2kqp".into(),
        uid: "5b0e8f3a-2c1d-4e6f-9a7b-1c2d3e4f5a6b".into(),
        labels: vec![("app".into(), "cart".into())],
        host_network: false,
        host_pid: false,
    });
    let id = cri.start_container(
        &pod,
        &ContainerSpec {
            name: "cart".into(),
            image: crate::containerd::BUSYBOX_IMAGE.into(),
            args: vec!["sleep".into(), "600".into()],
            ..Default::default()
        },
    );
    (pod, id)
}

/// What containerd recorded of the pod: `namespace/name` and the
/// container's name (read back through CRI, not taken from the request),
/// its IP from the CNI and the inode of the network namespace it pinned.
pub struct Recorded {
    pub pod: String,
    pub container: String,
    pub ip: String,
    pub netns: u32,
    /// Where containerd pinned it (/var/run/netns/cni-...).
    pub netns_path: std::path::PathBuf,
}

pub fn recorded(cri: &mut Cri, pod: &Pod, container_id: &str) -> Recorded {
    let (meta, ip, info) = cri.pod_status(&pod.id);
    let path = info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .expect("the sandbox's runtime spec in PodSandboxStatus' verbose info")
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .expect("a pinned network namespace")
        .to_string();
    Recorded {
        pod: format!("{}/{}", meta.namespace, meta.name),
        container: cri.container_name(container_id),
        ip,
        netns: kdrop::context::netns::inode_of(Path::new(&path)).unwrap(),
        netns_path: path.into(),
    }
}

/// Removes `root` (a kubelet --cgroup-root of a test) from every cgroup
/// hierarchy, deepest directories first; runc removes the containers' own.
/// Processes still in it (a pod whose shim died with its containerd) are
/// the test's: they are killed first.
pub fn remove_cgroups(root: &str) {
    let rel = root.trim_start_matches('/');
    let mut dirs = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        collect_dirs(&h.path().join(rel), &mut dirs);
    }
    let procs = |dirs: &[std::path::PathBuf]| -> Vec<i32> {
        dirs.iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = procs(&dirs);
        if left.is_empty() || std::time::Instant::now() > deadline {
            break;
        }
        for pid in left {
            // SAFETY: kill(2) of a process in this test's own cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in dirs {
        let _ = std::fs::remove_dir(&d);
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_path_buf());
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&e.path(), out);
        }
    }
}
