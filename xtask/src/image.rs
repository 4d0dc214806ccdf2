//! `cargo xtask image`: the container image of deploy/Containerfile, built
//! with buildah (Debian's package) `FROM scratch` around the static (musl)
//! release binary, which carries the DaemonSet's capabilities (and
//! SYS_RESOURCE, for kernels before 5.11) as permitted file capabilities.
//! Also written as an OCI archive, target/image/kdrop.oci.tar, which the
//! image test (tests/tests/image.rs) imports into its containerd.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{
    bootstrap,
    cross::{self, Target, TARGETS},
    root, run,
};

pub const MUSL: &str = "x86_64-unknown-linux-musl";
/// The name deploy/base/kustomization.yaml's `images:` maps `kdrop` to until the
/// user sets their registry.
pub const DEFAULT_TAG: &str = "localhost/kdrop:latest";

#[derive(clap::Args)]
pub struct Opts {
    /// Image name to build, e.g. registry.example.com/kdrop:0.1.0.
    #[arg(long, default_value = DEFAULT_TAG)]
    pub tag: String,
    /// Architectures of the manifest list, `amd64` and/or `arm64`
    /// (repeatable; default: both).
    #[arg(long = "arch", value_name = "ARCH")]
    pub arches: Vec<String>,
}

impl Opts {
    /// The targets asked for, every one by default.
    pub fn targets(&self) -> Result<Vec<&'static Target>> {
        if self.arches.is_empty() {
            return Ok(TARGETS.iter().collect());
        }
        self.arches.iter().map(|a| cross::target(a)).collect()
    }
}

pub fn archive() -> PathBuf {
    root().join("target/image/kdrop.oci.tar")
}

/// Where `build_static` leaves the binary. `cargo xtask test` runs its
/// suites on this one, the binary the image ships.
pub fn static_bin() -> PathBuf {
    root().join(format!("target/{MUSL}/release/kdrop"))
}

/// `add: ["BPF", ...]` of deploy/base/daemonset.yaml: the capabilities the
/// binary gets, so the image and the manifest cannot drift apart.
pub fn manifest_caps() -> Result<Vec<String>> {
    let path = root().join("deploy/base/daemonset.yaml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("add:"))
        .with_context(|| format!("no capabilities `add:` line in {}", path.display()))?;
    let caps: Vec<String> = line
        .trim_start_matches("add:")
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|s| !s.is_empty())
        .map(|s| format!("cap_{}", s.to_ascii_lowercase()))
        .collect();
    if caps.is_empty() {
        bail!("{}: an empty capabilities list", path.display());
    }
    Ok(caps)
}

/// buildah on the machine's own storage (`storage: None`: the image is
/// there for `buildah push`), or on a private one (CI: nothing left in
/// /var/lib/containers).
fn buildah(storage: Option<&Path>) -> Command {
    let mut cmd = Command::new("buildah");
    if let Some(dir) = storage {
        cmd.arg("--root")
            .arg(dir.join("root"))
            .arg("--runroot")
            .arg(dir.join("run"))
            .args(["--storage-driver", "vfs"]);
    }
    cmd
}

/// One image per target, each `FROM scratch` around that target's static
/// binary (no RUN step: nothing is emulated), gathered in the manifest
/// list `tag`, written with every platform to the OCI archive.
pub fn build(tag: &str, targets: &[&Target], storage: Option<&Path>) -> Result<()> {
    bootstrap::run()?;
    // A list or image left under this name by an earlier build.
    for what in [&["manifest", "rm"][..], &["rmi", "--force"][..]] {
        let _ = buildah(storage).args(what).arg(tag).output();
    }
    run(buildah(storage).args(["manifest", "create", tag]))?;
    for t in targets {
        let bin = cross::build(t)?;
        let ctx = root().join(format!("target/image/context-{}", t.oci_arch));
        let _ = fs::remove_dir_all(&ctx);
        fs::create_dir_all(&ctx)?;
        let staged = ctx.join("kdrop");
        fs::copy(&bin, &staged).with_context(|| format!("copying {}", bin.display()))?;
        // Kubernetes gives a non-root container process no capabilities of
        // its own: they come from the file (security.capability, which
        // buildah keeps in the layer). Permitted only, kdrop makes them
        // effective (kdrop/src/startup.rs): so the file may also permit
        // SYS_RESOURCE, which kernels before 5.11 need for RLIMIT_MEMLOCK
        // and only their pods are granted (the manifest's comment); with
        // the effective bit, a pod not granted one would fail to exec.
        let mut caps = manifest_caps()?;
        if !caps.iter().any(|c| c == "cap_sys_resource") {
            caps.push("cap_sys_resource".into());
        }
        run(Command::new("setcap")
            .arg(format!("{}=p", caps.join(",")))
            .arg(&staged))?;
        run(buildah(storage)
            .args(["build", "--quiet", "--platform"])
            .arg(format!("linux/{}", t.oci_arch))
            .args(["--manifest", tag, "--file"])
            .arg(root().join("deploy/Containerfile"))
            .arg(&ctx))?;
    }
    let archive = archive();
    let _ = fs::remove_file(&archive);
    run(buildah(storage)
        .args(["manifest", "push", "--all", "--quiet", tag])
        .arg(format!("oci-archive:{}:{tag}", archive.display())))?;
    let arches: Vec<&str> = targets.iter().map(|t| t.oci_arch).collect();
    eprintln!(
        "xtask: built the manifest list {tag} ({}) and {}; push it with `buildah manifest push --all {tag} docker://{tag}`",
        arches.join(", "),
        archive.display()
    );
    Ok(())
}

/// For `cargo xtask test`: the image of the default name in a private
/// storage under target/, for the image test.
pub fn build_for_tests() -> Result<()> {
    let storage = root().join("target/image/storage");
    let targets: Vec<&Target> = TARGETS.iter().collect();
    let r = build(DEFAULT_TAG, &targets, Some(&storage));
    // The archive is what the tests use; vfs layers are whole copies.
    let _ = Command::new("buildah")
        .arg("--root")
        .arg(storage.join("root"))
        .arg("--runroot")
        .arg(storage.join("run"))
        .args(["--storage-driver", "vfs", "rmi", "--all", "--force"])
        .output();
    r
}
