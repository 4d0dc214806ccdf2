//! `cargo xtask image`: the container image of deploy/Containerfile, built
//! with buildah (Debian's package) `FROM scratch` around the static (musl)
//! release binary, which carries the DaemonSet's capabilities as file
//! capabilities. Also written as an OCI archive, target/image/kdrop.oci.tar,
//! which the image test (tests/tests/image.rs) imports into its containerd.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{bootstrap, cargo, root, run};

pub const MUSL: &str = "x86_64-unknown-linux-musl";
/// The name deploy/base/kustomization.yaml's `images:` maps `kdrop` to until the
/// user sets their registry.
pub const DEFAULT_TAG: &str = "localhost/kdrop:latest";

#[derive(clap::Args)]
pub struct Opts {
    /// Image name to build, e.g. registry.example.com/kdrop:0.1.0.
    #[arg(long, default_value = DEFAULT_TAG)]
    pub tag: String,
}

pub fn archive() -> PathBuf {
    root().join("target/image/kdrop.oci.tar")
}

/// The static binary: kdrop/build.rs builds and embeds the eBPF object
/// whatever the host target.
fn build_static() -> Result<PathBuf> {
    run(cargo().args(["build", "--release", "--package", "kdrop", "--target", MUSL]))?;
    Ok(static_bin())
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

pub fn build(tag: &str, storage: Option<&Path>) -> Result<()> {
    bootstrap::run()?;
    let bin = build_static()?;
    let ctx = root().join("target/image/context");
    let _ = fs::remove_dir_all(&ctx);
    fs::create_dir_all(&ctx)?;
    let staged = ctx.join("kdrop");
    fs::copy(&bin, &staged).with_context(|| format!("copying {}", bin.display()))?;
    // Kubernetes gives a non-root container process no capabilities of
    // its own: they come from the file (security.capability, which
    // buildah keeps in the layer).
    run(Command::new("setcap")
        .arg(format!("{}+ep", manifest_caps()?.join(",")))
        .arg(&staged))?;
    run(buildah(storage)
        .args(["build", "--quiet", "--file"])
        .arg(root().join("deploy/Containerfile"))
        .args(["--tag", tag])
        .arg(&ctx))?;
    let archive = archive();
    let _ = fs::remove_file(&archive);
    run(buildah(storage)
        .args(["push", "--quiet", tag])
        .arg(format!("oci-archive:{}:{tag}", archive.display())))?;
    eprintln!(
        "xtask: built image {tag} (and {}); push it with `buildah push {tag}`",
        archive.display()
    );
    Ok(())
}

/// For `cargo xtask test`: the image of the default name in a private
/// storage under target/, for the image test.
pub fn build_for_tests() -> Result<()> {
    let storage = root().join("target/image/storage");
    let r = build(DEFAULT_TAG, Some(&storage));
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
