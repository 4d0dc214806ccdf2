//! Builds kdrop-ebpf for the BPF target and leaves the object in OUT_DIR, where
//! `include_bytes_aligned!` embeds it into the kdrop binary.

// Without the runtime (`cargo xtask fuzz`: the parsers, built with
// sanitizers) nothing embeds the object: no eBPF build, no aya-build.
#[cfg(not(feature = "runtime"))]
fn main() {}

#[cfg(feature = "runtime")]
fn main() -> anyhow::Result<()> {
    use std::process::Command;

    use aya_build::{Package, Toolchain};

    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../kdrop-ebpf");
    let package = Package {
        name: "kdrop-ebpf",
        root_dir: root,
        ..Default::default()
    };
    // Nightly is how the eBPF side gets `-Z build-std`. Without it, stable
    // can do the same with RUSTC_BOOTSTRAP, set here for the inner build only.
    let has_nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let toolchain = if has_nightly {
        Toolchain::Nightly
    } else {
        // SAFETY: build scripts are single-threaded here.
        unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
        Toolchain::Custom("stable")
    };
    // One eBPF build for every profile and target of kdrop: aya-build keeps
    // its cargo target under OUT_DIR, so clippy, the release build, the
    // static (musl) build and the tests' debug build each compiled core for
    // BPF and the programs again (about a minute each on two cores). Under
    // the workspace's target directory the inner build, always the same
    // (release, bpfel, same flags), is done once and then only checked.
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let Some(shared) = shared_dir(&out_dir) else {
        return aya_build::build_ebpf([package], toolchain);
    };
    std::fs::create_dir_all(&shared)?;
    // SAFETY: build scripts are single-threaded here.
    unsafe { std::env::set_var("OUT_DIR", &shared) };
    aya_build::build_ebpf([package], toolchain)?;
    std::fs::copy(shared.join("kdrop"), out_dir.join("kdrop"))?;
    Ok(())
}

#[cfg(feature = "runtime")]
/// `<target-dir>/kdrop-ebpf`: the target directory is the first ancestor of
/// OUT_DIR that cargo tagged, or the one above it when that is the
/// per-triple directory of a `--target` build (the static musl build would
/// otherwise compile the programs a second time, a minute on two cores).
fn shared_dir(out_dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let tagged = |d: &std::path::Path| d.join("CACHEDIR.TAG").is_file();
    let mut target = out_dir.ancestors().find(|d| tagged(d))?;
    let triple = std::env::var("TARGET").ok();
    if let Some(parent) = target.parent() {
        if triple.is_some_and(|t| target.ends_with(t)) && tagged(parent) {
            target = parent;
        }
    }
    // Per architecture: the programs read kprobe arguments from that
    // architecture's pt_regs (aya-build passes `bpf_target_arch` from
    // kdrop's target), so an aarch64 build must not take x86_64's object.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").ok()?;
    Some(target.join(format!("kdrop-ebpf-{arch}")))
}
