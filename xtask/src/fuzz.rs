//! `cargo xtask fuzz`: the fuzz targets in fuzz/ (cargo-fuzz, libFuzzer),
//! each for a bounded time. On demand, not in CI: the sanitizer build of
//! kdrop and its dependencies alone takes minutes on two cores.
use std::process::Command;

use anyhow::Result;

use crate::{bootstrap, root, run};

pub const TARGETS: &[&str] = &["decode", "btf"];

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// Seconds per target.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// Only this target (decode: ring buffer records; btf: the BTF parser).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    target: Option<String>,
}

fn have_cargo_fuzz() -> bool {
    Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn run_all(o: &Opts) -> Result<()> {
    // kdrop's build.rs builds the eBPF object: it needs bpf-linker.
    bootstrap::run()?;
    if !have_cargo_fuzz() {
        run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let tc = bootstrap::ebpf_toolchain();
    for t in TARGETS
        .iter()
        .filter(|t| o.target.as_deref().is_none_or(|x| x == **t))
    {
        let corpus = root().join("fuzz/corpus").join(t);
        std::fs::create_dir_all(&corpus)?;
        let mut cmd = Command::new("rustup");
        // libFuzzer needs nightly (-Z sanitizer); without nightly, stable
        // with RUSTC_BOOTSTRAP does the same.
        cmd.args(["run", tc.name(), "cargo", "fuzz", "run", t])
            .arg(&corpus)
            .args(["--", &format!("-max_total_time={}", o.secs)]);
        if tc.needs_bootstrap() {
            cmd.env("RUSTC_BOOTSTRAP", "1");
        }
        run(&mut cmd)?;
    }
    Ok(())
}
