//! kdrop as a non-root user holding exactly the capabilities of
//! deploy/base/daemonset.yaml, granted the way the container image grants them
//! (file capabilities, bounding set limited to the list), traces a drop.
use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use integration_tests::{inode, kdrop_bin, send_syn, Kdrop, Pair};

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

#[test]
fn manifest_capabilities_are_enough_to_trace_as_non_root() {
    let caps = manifest_caps();
    assert!(caps.contains(&"bpf".to_string()), "{caps:?}");
    assert!(!caps.contains(&"sys_admin".to_string()), "{caps:?}");
    let bin = CapBinary(std::env::temp_dir().join(format!("kdrop-caps-{}", std::process::id())));
    std::fs::copy(kdrop_bin(), &bin.0).unwrap();
    std::fs::set_permissions(&bin.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file_caps = caps
        .iter()
        .map(|c| format!("cap_{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new("setcap")
        .arg(format!("{file_caps}+ep"))
        .arg(&bin.0)
        .output()
        .expect("running setcap (libcap2-bin)");
    assert!(out.status.success(), "{out:?}");

    let p = Pair::new("caps", 65);
    let bounding = format!(
        "--bounding-set=-all,{}",
        caps.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut cmd = Command::new("setpriv");
    cmd.args([
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
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap()
    };
    assert!(field("Uid:").starts_with("65534"), "{status}");
    // Exactly the manifest's capabilities, effective.
    let want: u64 = caps
        .iter()
        .map(|c| match c.as_str() {
            "dac_read_search" => 1 << 2,
            "net_admin" => 1 << 12,
            "sys_admin" => 1 << 21,
            "perfmon" => 1 << 38,
            "bpf" => 1 << 39,
            other => panic!("capability {other} not known to this test"),
        })
        .sum();
    assert_eq!(
        u64::from_str_radix(&field("CapEff:"), 16).unwrap(),
        want,
        "{status}"
    );

    let src = p.client_v4(46501);
    let dst = p.server_v4(5606);
    let _syn = send_syn(&p.client, src, dst);
    let e = k.expect_record("the NO_SOCKET drop", |e| e.sport == 46501);
    assert_eq!(
        e.reason.as_deref(),
        integration_tests::reason_for("NO_SOCKET")
    );
    assert_eq!(e.netns, inode(&p.server));
    assert_eq!(e.dport, 5606);
    let done = k.stop(libc::SIGTERM);
    assert!(done.status.success(), "{done:?}");
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
