//! Builds kdrop-ebpf for the BPF target and leaves the object in OUT_DIR, where
//! `include_bytes_aligned!` embeds it into the kdrop binary.
use std::process::Command;

use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // `cargo xtask fuzz` builds the library's parsers with sanitizers; its
    // targets never load a program, so they link an empty object instead of
    // a second eBPF build (a minute on two cores).
    println!("cargo:rerun-if-env-changed=KDROP_NO_EBPF");
    if std::env::var_os("KDROP_NO_EBPF").is_some() {
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        std::fs::write(out.join("kdrop"), [])?;
        return Ok(());
    }
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
    let shared = out_dir
        .ancestors()
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map(|target| target.join("kdrop-ebpf"));
    let Some(shared) = shared else {
        return aya_build::build_ebpf([package], toolchain);
    };
    std::fs::create_dir_all(&shared)?;
    // SAFETY: build scripts are single-threaded here.
    unsafe { std::env::set_var("OUT_DIR", &shared) };
    aya_build::build_ebpf([package], toolchain)?;
    std::fs::copy(shared.join("kdrop"), out_dir.join("kdrop"))?;
    Ok(())
}
