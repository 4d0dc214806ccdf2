//! What a guest runs: kdrop and the test executables built for its
//! architecture, copied where the guest reads them, and the tests of each
//! executable a subset names (checked on the host before any boot).
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

use crate::root;

/// Copies kdrop and the test executables to `dir` (`.cache/vm/bin` for
/// x86_64): the guest reads them over 9p for minutes, and a build on the
/// host meanwhile would replace them under it (a 5.10 guest's kdrop died in
/// ld.so that way).
pub(super) fn snapshot(
    dir: &Path,
    kdrop: &Path,
    tests: &[(String, PathBuf)],
) -> Result<(PathBuf, Vec<(String, PathBuf)>)> {
    let dir = dir.to_path_buf();
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = |from: &Path, name: &str| -> Result<PathBuf> {
        let to = dir.join(name);
        fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        Ok(to)
    };
    let kdrop = copy(kdrop, "kdrop")?;
    let tests = tests
        .iter()
        .map(|(name, exe)| Ok((name.clone(), copy(exe, &format!("test-{name}"))?)))
        .collect::<Result<_>>()?;
    Ok((kdrop, tests))
}

/// The integration test executables, built as `cargo xtask test` builds them
/// (same profile, so CI reuses what the host run compiled); for another
/// architecture, cross-built static for `target` (its std and linker as
/// `cargo xtask build --target` has them).
pub(super) fn test_executables(
    only: &[String],
    target: Option<&crate::cross::Target>,
) -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = crate::cargo();
    cmd.args(["test", "--no-run", "--package", "integration-tests"])
        .args(["--message-format", "json-render-diagnostics"]);
    if let Some(t) = target {
        crate::cross::prepare(t)?;
        cmd.args(["--target", t.triple]);
        crate::cross::linker_env(t, &mut cmd);
        // Only the files the guest runs: nothing else shares this build,
        // and each static executable takes its own link.
        let mut files = only.to_vec();
        files.sort();
        files.dedup();
        for f in &files {
            cmd.args(["--test", f]);
        }
    }
    let out = cmd
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .context("building the integration tests")?;
    if !out.status.success() {
        bail!("building the integration tests failed: {}", out.status);
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let target = &msg["target"];
        let is_test_file = target["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if msg["reason"] != "compiler-artifact" || !is_test_file {
            continue;
        }
        if let (Some(name), Some(exe)) = (target["name"].as_str(), msg["executable"].as_str()) {
            exes.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    exes.sort();
    for want in only {
        if !exes.iter().any(|(n, _)| n == want) {
            let known: Vec<&str> = exes.iter().map(|(n, _)| n.as_str()).collect();
            bail!(
                "no integration test file {want} (have: {})",
                known.join(", ")
            );
        }
    }
    if !only.is_empty() {
        exes.retain(|(n, _)| only.contains(n));
    }
    if exes.is_empty() {
        bail!("cargo built no integration test executable");
    }
    Ok(exes)
}

/// `drops::syn_to_closed_port` → (`drops`, Some(name)); `drops` → (`drops`, None).
pub(super) fn split_spec(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once("::") {
        Some((file, name)) => (file, Some(name)),
        None => (spec, None),
    }
}

/// One test executable to run in a guest, and the tests of it to run
/// (`--exact` names; empty: all of them).
pub struct Planned {
    pub file: String,
    pub exe: PathBuf,
    pub names: Vec<String>,
}

/// Groups `specs` by file, in the executables' order. A named test must
/// exist (`--list` on the host, through `runner` for another architecture's
/// executable): a renamed test would otherwise be "filtered out" in the
/// guest and the subset would shrink unseen.
pub(super) fn plan(
    exes: &[(String, PathBuf)],
    specs: &[String],
    runner: Option<&Path>,
) -> Result<Vec<Planned>> {
    let mut out: Vec<Planned> = Vec::new();
    for (file, exe) in exes {
        let mine: Vec<Option<&str>> = specs
            .iter()
            .map(|s| split_spec(s))
            .filter(|(f, _)| f == file)
            .map(|(_, n)| n)
            .collect();
        if mine.is_empty() && !specs.is_empty() {
            continue;
        }
        let names: Vec<String> = if mine.contains(&None) {
            Vec::new()
        } else {
            mine.iter().flatten().map(|n| n.to_string()).collect()
        };
        if !names.is_empty() {
            let mut list = match runner {
                Some(r) => {
                    let mut c = Command::new(r);
                    c.arg(exe);
                    c
                }
                None => Command::new(exe),
            };
            let listed = list
                .args(["--list", "--format", "terse"])
                .output()
                .with_context(|| format!("listing the tests of {}", exe.display()))?;
            let listed = String::from_utf8_lossy(&listed.stdout);
            for n in &names {
                if !listed.lines().any(|l| l == format!("{n}: test")) {
                    bail!("the VM subset names {file}::{n}, which {file}.rs does not have");
                }
            }
        }
        out.push(Planned {
            file: file.clone(),
            exe: exe.clone(),
            names,
        });
    }
    Ok(out)
}
