//! A containerd of the test's own (Debian's package), with its CRI plugin:
//! config, root, state, socket and CNI configuration in a temporary
//! directory, running in a network namespace that plays the node (the CNI
//! bridge and the pods' veths live there, never in the host's). Everything it
//! started is stopped and removed on drop, also when the test failed.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use crate::{bound, cri::Cri, ns_name, Ns};

/// The sandbox ("pause") image every pod starts with, built from busybox.
pub const PAUSE_IMAGE: &str = "localhost/kdrop-test/pause:1";
/// An application image: busybox, to run `sleep` or `nc` in a pod.
pub const BUSYBOX_IMAGE: &str = "localhost/kdrop-test/busybox:1";
/// The pods' network, inside the node namespace (CNI bridge `cni0`).
pub const POD_SUBNET: &str = "10.244.7.0/24";
/// The node's address on that bridge (the CNI bridge plugin's gateway).
pub const NODE_POD_GW: &str = "10.244.7.1";

pub struct Containerd {
    pub dir: PathBuf,
    /// containerd's network namespace: the node the pods are on.
    pub node: Ns,
    /// Where the kubelet's cgroupfs driver would put `kubepods` (its
    /// --cgroup-root), unique to this test: removed afterwards.
    pub cgroup_root: String,
    child: Option<Child>,
    log: Receiver<String>,
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Containerd {
    pub fn start(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kdrop-ctd-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cni/conf")).unwrap();
        // A shared mount of its own, as / is on a systemd node: the CRI
        // plugin refuses a HostToContainer mount (the DaemonSet's of the
        // runtime's state) from a private one, and / is private here.
        run(Command::new("mount").arg("--bind").arg(&dir).arg(&dir));
        run(Command::new("mount").arg("--make-shared").arg(&dir));
        let node = Ns::new(&ns_name(&format!("{test}-node"))).unwrap();
        let cgroup_root = format!("/kdt{}-{test}", std::process::id());
        let d = dir.display();
        // Only the CRI plugin's needs; nothing outside `dir` but the shim's
        // socket (containerd 1.6 keeps it under /run/containerd/s, named by
        // a hash of this socket's path, removed when the shim exits) and
        // the pods' network namespaces (/run/netns/cni-*, removed with the
        // pods), both as the kubelet's own containerd would.
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.overlayfs"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # This machine's root lacks CAP_SYS_RESOURCE: runc cannot set the
  # sandbox's oom_score_adj of -998 (EACCES); keep containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/runc"
        SystemdCgroup = false
"#
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        // What a CNI such as flannel's bridge mode installs on a node.
        let cni = format!(
            r#"{{"cniVersion": "1.0.0", "name": "kdrop-test", "plugins": [{{"type": "bridge", "bridge": "cni0", "isDefaultGateway": true, "ipMasq": false, "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{POD_SUBNET}", "gateway": "{NODE_POD_GW}"}}]], "dataDir": "{d}/cni/ipam"}}}}]}}"#
        );
        std::fs::write(dir.join("cni/conf/10-kdrop-test.conflist"), cni).unwrap();
        // nsenter joins the node's network namespace only: containerd's
        // mounts (the pods' namespace pins) must stay in the host's mount
        // namespace, where kdrop and the kubelet see them.
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", node.path().display()))
            .arg("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting containerd (Debian package containerd)");
        let log = crate::line_reader(child.stderr.take().unwrap());
        let c = Containerd {
            dir,
            node,
            cgroup_root,
            child: Some(child),
            log,
        };
        c.wait_booted();
        c
    }

    /// containerd says so once every plugin (CRI included) is serving.
    fn wait_booted(&self) {
        let limit = bound(Duration::from_secs(30));
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.log.recv_timeout(left) {
                Ok(l) if l.contains("containerd successfully booted") => return,
                Ok(l) => seen.push(l),
                Err(_) => break,
            }
        }
        panic!("containerd not up within {limit:?}:\n{}", seen.join("\n"));
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// containerd's state directory: where the running containers' OCI
    /// bundles are (`io.containerd.runtime.v2.task/k8s.io/<id>`).
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub fn cri(&self) -> Cri {
        Cri::connect(&self.socket(), &self.dir.join("pods"), &self.cgroup_root)
    }

    /// Imports an OCI archive into the CRI plugin's namespace (k8s.io), as
    /// `ctr images import` does for a node without a registry.
    pub fn import(&self, archive: &Path) {
        run(Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args([
                "-n",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                "native",
            ])
            .arg(archive));
    }

    /// The sandbox and busybox images, built with buildah from Debian's
    /// static busybox (`FROM scratch`: nothing is pulled) and imported.
    pub fn import_test_images(&self) {
        let ctx = self.dir.join("images");
        std::fs::create_dir_all(&ctx).unwrap();
        std::fs::copy("/bin/busybox", ctx.join("busybox"))
            .expect("/bin/busybox (Debian package busybox-static)");
        // A pause process: PID 1 of the sandbox, holding its namespaces.
        // The CRI plugin kills it with SIGKILL when the pod stops.
        for (name, entry) in [
            (PAUSE_IMAGE, r#"["/bin/busybox", "sleep", "2147483647"]"#),
            (BUSYBOX_IMAGE, r#"["/bin/busybox"]"#),
        ] {
            let file = ctx.join("Containerfile");
            std::fs::write(
                &file,
                format!("FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT {entry}\n"),
            )
            .unwrap();
            let archive = ctx.join(format!("{}.tar", name.replace(['/', ':'], "_")));
            run(buildah(&self.dir, &["build", "-q", "-f"], &[&file])
                .args(["-t", name])
                .arg(&ctx));
            run(buildah(&self.dir, &["push", "-q", name], &[])
                .arg(format!("oci-archive:{}:{name}", archive.display())));
            self.import(&archive);
        }
    }

    fn stop_pods(&self) {
        let Ok(mut cri) = std::panic::catch_unwind(|| self.cri()) else {
            return;
        };
        for id in cri.pod_ids() {
            cri.stop_and_remove_pod(&id);
        }
    }
}

impl Containerd {
    /// The network namespace paths of this containerd's pod sandboxes, from
    /// their OCI bundles.
    fn netns_pins(&self) -> Vec<PathBuf> {
        let dir = self.state().join("io.containerd.runtime.v2.task/k8s.io");
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("config.json")).ok())
            .filter_map(|c| serde_json::from_str::<serde_json::Value>(&c).ok())
            .filter_map(|v| {
                v["linux"]["namespaces"]
                    .as_array()?
                    .iter()
                    .find(|n| n["type"] == "network")?["path"]
                    .as_str()
                    .filter(|p| p.contains("/netns/"))
                    .map(PathBuf::from)
            })
            .collect()
    }
}

/// buildah with a storage of the test's own (vfs: no overlay mounts to
/// leave behind), under `dir`.
pub fn buildah(dir: &Path, args: &[&str], paths: &[&Path]) -> Command {
    let mut cmd = Command::new("buildah");
    cmd.arg("--root")
        .arg(dir.join("buildah/storage"))
        .arg("--runroot")
        .arg(dir.join("buildah/run"))
        .args(["--storage-driver", "vfs"])
        .args(args)
        .args(paths);
    cmd
}

/// Processes whose command line contains `needle` (containerd's shims name
/// their containerd's socket in theirs).
fn pids_with(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // The namespaces containerd pinned for its pods: RemovePodSandbox
        // removes them, unless containerd died first.
        let pins = self.netns_pins();
        if std::thread::panicking() {
            // What containerd said is what explains a failed CRI call.
            let said: Vec<String> = self.log.try_iter().collect();
            eprintln!("containerd's log:\n{}", said.join("\n"));
        }
        // Pods first, through CRI, as the kubelet would: their processes,
        // network namespaces (CNI DEL), mounts and cgroups go with them.
        self.stop_pods();
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Shims outlive containerd by design; after a failure one may hold
        // a pod still. They are ours: their command line names our socket.
        for pid in pids_with(&self.socket().display().to_string()) {
            // SAFETY: kill(2) of a shim this containerd started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for m in mounts_under(&self.dir) {
            // SAFETY: a path from mountinfo, under our own directory.
            let c = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        for pin in pins.iter().filter(|p| p.exists()) {
            // SAFETY: a netns pin under /run/netns this containerd made.
            let c = std::ffi::CString::new(pin.as_os_str().as_encoded_bytes()).unwrap();
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            let _ = std::fs::remove_file(pin);
        }
        crate::cri::remove_cgroups(&self.cgroup_root);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
