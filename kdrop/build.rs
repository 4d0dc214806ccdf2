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
    aya_build::build_ebpf([package], toolchain)
}
