//! Static (musl) builds of kdrop for each architecture it ships for,
//! cross-built on this x86_64 machine with what rustup (the target's std)
//! and Debian (the target's C linker, `gcc-aarch64-linux-gnu`) provide.
//! kdrop/build.rs builds the eBPF object for the same architecture:
//! aya-build passes `bpf_target_arch` from kdrop's target, which is what
//! the kprobe programs read `pt_regs` with.
use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::{bootstrap, cargo, root, run};

/// A target kdrop is released for.
pub struct Target {
    pub triple: &'static str,
    /// The OCI platform architecture of its image.
    pub oci_arch: &'static str,
    /// The C linker and the Debian package that has it, when the host's
    /// own does not link for it.
    pub linker: Option<(&'static str, &'static str)>,
}

pub const TARGETS: &[Target] = &[
    Target {
        triple: "x86_64-unknown-linux-musl",
        oci_arch: "amd64",
        linker: None,
    },
    Target {
        triple: "aarch64-unknown-linux-musl",
        oci_arch: "arm64",
        linker: Some(("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")),
    },
];

/// The target named by its triple or its OCI architecture.
pub fn target(name: &str) -> Result<&'static Target> {
    match TARGETS
        .iter()
        .find(|t| t.triple == name || t.oci_arch == name)
    {
        Some(t) => Ok(t),
        None => bail!(
            "unknown target {name}: one of {}",
            TARGETS
                .iter()
                .map(|t| format!("{} ({})", t.triple, t.oci_arch))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Where `build` leaves the binary.
pub fn bin(t: &Target) -> PathBuf {
    root().join(format!("target/{}/release/kdrop", t.triple))
}

/// rustup's std for the target and the linker from Debian, if missing.
pub fn prepare(t: &Target) -> Result<()> {
    bootstrap::rust_target(t.triple)?;
    if let Some((linker, package)) = t.linker {
        bootstrap::apt_install(&[(linker, package)])?;
    }
    Ok(())
}

/// The release binary for `t`, with its eBPF programs embedded.
pub fn build(t: &Target) -> Result<PathBuf> {
    prepare(t)?;
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--package",
        "kdrop",
        "--target",
        t.triple,
    ]);
    linker_env(t, &mut cmd);
    run(&mut cmd)?;
    let bin = bin(t);
    check_arch(t, &bin)?;
    Ok(bin)
}

/// Points cargo at `t`'s C linker (unless the environment already names
/// one): also for the integration tests an arm64 guest runs.
pub fn linker_env(t: &Target, cmd: &mut std::process::Command) {
    if let Some((linker, _)) = t.linker {
        let var = format!(
            "CARGO_TARGET_{}_LINKER",
            t.triple.to_ascii_uppercase().replace('-', "_")
        );
        if std::env::var_os(&var).is_none() {
            cmd.env(var, linker);
        }
    }
}

/// The ELF header's machine, so a build that silently took the host's
/// target cannot ship as another architecture's.
fn check_arch(t: &Target, bin: &std::path::Path) -> Result<()> {
    let head = std::fs::read(bin).map(|b| b.get(..20).map(<[u8]>::to_vec))?;
    let machine = head.map(|h| u16::from_le_bytes([h[18], h[19]]));
    // EM_X86_64 = 62, EM_AARCH64 = 183 (include/uapi/linux/elf-em.h).
    let want = match t.oci_arch {
        "amd64" => 62,
        _ => 183,
    };
    if machine != Some(want) {
        bail!(
            "{}: ELF machine {machine:?}, want {want} for {}",
            bin.display(),
            t.triple
        );
    }
    Ok(())
}
