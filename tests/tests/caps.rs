//! kdrop as a non-root user holding exactly the capabilities of
//! deploy/base/daemonset.yaml, granted the way the container image grants them
//! (file capabilities, bounding set limited to the list), traces a drop.
use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use integration_tests::{
    caps::{cap_bit, memlock, status_hex},
    inode, kdrop_bin, send_syn, Kdrop, Pair,
};

/// `add: ["BPF", "PERFMON", ...]` of the manifest's container.
fn manifest_caps() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/daemonset.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("add:"))
        .expect("capabilities add: in the manifest");
    line.trim_start_matches("add:")
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|s| !s.is_empty())
        .map(|s| s.to_ascii_lowercase())
        .collect()
}

/// A copy of the binary with file capabilities, removed on drop.
struct CapBinary(PathBuf);

impl Drop for CapBinary {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A copy of kdrop with the image's file capabilities: the manifest's list
/// and SYS_RESOURCE, permitted only (`cargo xtask image`, xtask/src/image.rs).
fn image_binary(caps: &[String]) -> CapBinary {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let bin =
        CapBinary(std::env::temp_dir().join(format!("kdrop-caps-{}-{n}", std::process::id())));
    std::fs::copy(kdrop_bin(), &bin.0).unwrap();
    std::fs::set_permissions(&bin.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file_caps = caps
        .iter()
        .chain(std::iter::once(&"sys_resource".to_string()))
        .map(|c| format!("cap_{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new("setcap")
        .arg(format!("{file_caps}=p"))
        .arg(&bin.0)
        .output()
        .expect("running setcap (libcap2-bin)");
    assert!(out.status.success(), "{out:?}");
    bin
}

/// kdrop run as the DaemonSet's container runs it: user 65534, no
/// inheritable capabilities, the bounding set `bounding` (the runtime's
/// list), RLIMIT_MEMLOCK at a container's 64 KiB; monitoring `p`'s server.
fn as_container(bin: &CapBinary, bounding: &[String], p: &Pair) -> Command {
    let bounding = format!(
        "--bounding-set=-all,{}",
        bounding
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut cmd = Command::new("prlimit");
    cmd.arg("--memlock=65536:65536")
        .arg("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            &bounding,
        ])
        .arg(&bin.0)
        .args([
            "monitor",
            "--netns",
            &p.server.name,
            "-p",
            "5606",
            "--listen",
            "127.0.0.1:0",
        ]);
    cmd
}

/// Provokes a NO_SOCKET drop in `p` and checks kdrop names it.
fn names_a_drop(k: Kdrop, p: &Pair, sport: u16) {
    let src = p.client_v4(sport);
    let dst = p.server_v4(5606);
    let _syn = send_syn(&p.client, src, dst);
    let e = k.expect_record("the NO_SOCKET drop", |e| e.sport == sport);
    assert_eq!(
        e.reason.as_deref(),
        integration_tests::reason_for("NO_SOCKET")
    );
    assert_eq!(e.netns, inode(&p.server));
    assert_eq!(e.dport, 5606);
    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
}

/// The DaemonSet as shipped: the file permits SYS_RESOURCE too, the
/// container's bounding set lacks it. The exec must not fail (it would,
/// with the file's effective bit), and kdrop must hold exactly the list,
/// effective (the file makes them permitted only: kdrop raises them).
#[test]
fn manifest_capabilities_are_enough_to_trace_as_non_root() {
    let caps = manifest_caps();
    assert!(caps.contains(&"bpf".to_string()), "{caps:?}");
    assert!(!caps.contains(&"sys_admin".to_string()), "{caps:?}");
    assert!(!caps.contains(&"sys_resource".to_string()), "{caps:?}");
    let bin = image_binary(&caps);
    let p = Pair::new("caps", 65);
    let mut cmd = as_container(&bin, &caps, &p);
    if !integration_tests::kernel_at_least(5, 11) {
        // Maps are charged to RLIMIT_MEMLOCK before 5.11: kdrop must say
        // what to grant, in one line, and fail.
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.contains("RLIMIT_MEMLOCK at 64 KiB") && last.contains("CAP_SYS_RESOURCE"),
            "{stderr}"
        );
        println!("kernel before 5.11: kdrop names RLIMIT_MEMLOCK and CAP_SYS_RESOURCE");
        return;
    }
    let k = Kdrop::start_command(cmd);
    let status = std::fs::read_to_string(format!("/proc/{}/status", k.pid())).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l[4..].trim().starts_with("65534")),
        "{status}"
    );
    let want: u64 = caps.iter().map(|c| cap_bit(c)).sum();
    assert_eq!(status_hex(&status, "CapEff:"), want, "{status}");
    assert_eq!(status_hex(&status, "CapPrm:"), want, "{status}");
    names_a_drop(k, &p, 46501);
}

/// SYS_RESOURCE added to the manifest's list, as the README says for
/// kernels before 5.11, with no new image: kdrop lifts RLIMIT_MEMLOCK and
/// traces there. The runtime can only grant what its own bounding set
/// holds (this test's; a host's root may lack SYS_RESOURCE): kdrop's limit
/// must be what that allows, unlimited with it, the hard limit without.
#[test]
fn sys_resource_in_the_manifest_lifts_the_memlock_limit() {
    let mut caps = manifest_caps();
    caps.push("sys_resource".into());
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let grantable = status_hex(&own, "CapBnd:") & cap_bit("sys_resource") != 0;
    let bin = image_binary(&caps[..caps.len() - 1]);
    let p = Pair::new("caps-ml", 66);
    let bounding: Vec<String> = caps
        .iter()
        .filter(|c| grantable || c.as_str() != "sys_resource")
        .cloned()
        .collect();
    let cmd = as_container(&bin, &bounding, &p);
    if !grantable && !integration_tests::kernel_at_least(5, 11) {
        panic!("SYS_RESOURCE is not in this test's bounding set: it cannot be granted here");
    }
    let k = Kdrop::start_command(cmd);
    let memlock = memlock(k.pid());
    let want = if grantable {
        ["unlimited", "unlimited"]
    } else {
        ["65536", "65536"]
    };
    assert_eq!(memlock, want, "grantable: {grantable}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", k.pid())).unwrap();
    let eff: u64 = bounding.iter().map(|c| cap_bit(c)).sum();
    assert_eq!(status_hex(&status, "CapEff:"), eff, "{status}");
    println!("SYS_RESOURCE grantable here: {grantable}; RLIMIT_MEMLOCK {memlock:?}");
    names_a_drop(k, &p, 46502);
}

/// What the README promises about the manifest: host network and PID
/// namespace, a non-root user, every capability dropped but the list,
/// read-only host mounts.
#[test]
fn manifest_keeps_its_promises() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/daemonset.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for want in [
        "hostNetwork: true",
        "hostPID: true",
        "runAsUser: 65534",
        "runAsNonRoot: true",
        "readOnlyRootFilesystem: true",
        "drop: [\"ALL\"]",
        "mountPath: /sys/kernel/btf",
        "mountPath: /run/netns",
    ] {
        assert!(lines.contains(&want), "manifest lacks {want:?}");
    }
    // Every mount is read-only.
    let mounts = lines.iter().filter(|l| l.starts_with("mountPath:")).count();
    let ro = lines.iter().filter(|l| **l == "readOnly: true").count();
    assert_eq!(mounts, ro, "a writable mount in the manifest");
    assert!(!text.contains("privileged: true"));
}
