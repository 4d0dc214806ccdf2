//! The whole suite's record: `cargo xtask vm` without `--test`, `--ci` or a
//! filter (the whole suite) writes one line per kernel it passed on into
//! `tests/vm-whole-suite.txt`, with a digest of the kernel-facing files it
//! ran; `cargo xtask test` compares that digest with the tree's and names
//! the kernels whose record no longer covers the kernel-facing code.
//!
//! The digest is git's hash of `git ls-tree -r HEAD` over `KERNEL_FACING`:
//! the files' contents, not the commit, so a rebase that leaves them alone
//! keeps the record, and committing the record file itself changes nothing.
use std::{fs, path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::root;

/// What the kernel sees or answers differently from one version to the
/// next: a change here can pass on the host and fail on another kernel.
pub const KERNEL_FACING: &[(&str, &str)] = &[
    (
        "kdrop-ebpf",
        "the programs the verifier of each kernel loads",
    ),
    (
        "kdrop-common",
        "the records and maps shared with the programs",
    ),
    ("kdrop/build.rs", "how the programs are built and embedded"),
    (
        "kdrop/src/probes",
        "loading and the rung ladder of each point",
    ),
    (
        "kdrop/src/kernel",
        "BTF, kallsyms and tracefs as each kernel has them",
    ),
    (
        "kdrop/src/check.rs",
        "`kdrop check`: what each kernel offers",
    ),
    (
        "kdrop/src/context/bpf_progs.rs",
        "bpf(2) queries whose attributes differ by version",
    ),
    ("kdrop/src/context/ctevents", "ctnetlink events"),
    ("kdrop-core/src/kernel", "reasons and layouts read from BTF"),
    ("kdrop-core/src/event", "decoding what the programs write"),
    (
        "tests/src/oracle.rs",
        "what the tests expect of each kernel",
    ),
    ("tests/src/allowed_skips.rs", "the skips each kernel allows"),
];

/// The record file, relative to the workspace.
pub const FILE: &str = "tests/vm-whole-suite.txt";

const HEADER: &str = "\
# Written by `cargo xtask vm` (the whole suite: no --test, --ci or filter)
# for each kernel it passed on; `cargo xtask test` says which kernels' lines
# no longer match the kernel-facing files (xtask/src/vm/record.rs).
# kernel digest commit seconds closing-line
";

/// One kernel's line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `Kernel::label`: `6.1`, `6.1-arm64`.
    pub kernel: String,
    /// The kernel-facing files' digest when it passed.
    pub digest: String,
    /// HEAD then (short), for people: the digest is what counts.
    pub commit: String,
    pub seconds: u64,
    /// `vm 6.1 6.1.0-50-amd64: 143 passed, 0 failed, 0 skipped`.
    pub closing: String,
}

impl Entry {
    fn line(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.kernel, self.digest, self.commit, self.seconds, self.closing
        )
    }
}

pub fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.splitn(5, ' ');
            Some(Entry {
                kernel: w.next()?.into(),
                digest: w.next()?.into(),
                commit: w.next()?.into(),
                seconds: w.next()?.parse().ok()?,
                closing: w.next()?.into(),
            })
        })
        .collect()
}

/// The file with `e` in place of that kernel's line, kernels in order.
pub fn render(mut entries: Vec<Entry>, e: Entry) -> String {
    entries.retain(|x| x.kernel != e.kernel);
    entries.push(e);
    entries.sort_by(|a, b| a.kernel.cmp(&b.kernel));
    let mut s = HEADER.to_string();
    for e in &entries {
        s.push_str(&e.line());
        s.push('\n');
    }
    s
}

/// The tree's kernel-facing files: their digest at HEAD, or why there is
/// none to trust (changes not committed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tree {
    Clean { digest: String, commit: String },
    Uncommitted(Vec<String>),
}

/// What `cargo xtask test` says of each kernel in `kernels`.
pub fn verdicts(entries: &[Entry], tree: &Tree, kernels: &[&str]) -> Vec<(bool, String)> {
    kernels
        .iter()
        .map(|k| {
            let e = entries.iter().find(|e| e.kernel == *k);
            match (e, tree) {
                (None, _) => (
                    false,
                    format!(
                        "no whole-suite run recorded for {k} in {FILE}: run `cargo xtask vm \
                         --all` and commit the file"
                    ),
                ),
                (Some(e), Tree::Uncommitted(files)) => (
                    false,
                    format!(
                        "{k}: kernel-facing files changed and not committed ({}): the whole \
                         suite last passed at {} ({} s: {})",
                        files.join(", "),
                        e.commit,
                        e.seconds,
                        e.closing
                    ),
                ),
                (Some(e), Tree::Clean { digest, .. }) if *digest == e.digest => (
                    true,
                    format!(
                        "{k}: the whole suite passed on these kernel-facing files (at {}, {} s: \
                         {})",
                        e.commit, e.seconds, e.closing
                    ),
                ),
                (Some(e), Tree::Clean { .. }) => (
                    false,
                    format!(
                        "{k}: kernel-facing files changed since the whole suite last passed \
                         (at {}, {} s: {}): run `cargo xtask vm --kernel {k}` and commit {FILE}",
                        e.commit, e.seconds, e.closing
                    ),
                ),
            }
        })
        .collect()
}

fn git(args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root())
        .output()
        .with_context(|| format!("running git {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn paths() -> Vec<&'static str> {
    KERNEL_FACING.iter().map(|(p, _)| *p).collect()
}

/// The kernel-facing files of the work tree, read through git.
pub fn tree() -> Result<Tree> {
    let mut status = vec!["status", "--porcelain", "--"];
    status.extend(paths());
    let changed: Vec<String> = git(&status)?
        .lines()
        .filter_map(|l| l.get(3..))
        .map(String::from)
        .collect();
    if !changed.is_empty() {
        return Ok(Tree::Uncommitted(changed));
    }
    let mut ls = vec!["ls-tree", "-r", "HEAD", "--"];
    ls.extend(paths());
    let listing = git(&ls)?;
    let mut hash = Command::new("git")
        .args(["hash-object", "--stdin"])
        .current_dir(root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running git hash-object")?;
    {
        use std::io::Write as _;
        hash.stdin.take().unwrap().write_all(listing.as_bytes())?;
    }
    let out = hash.wait_with_output()?;
    Ok(Tree::Clean {
        digest: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        commit: git(&["rev-parse", "--short", "HEAD"])?.trim().to_string(),
    })
}

fn file() -> PathBuf {
    root().join(FILE)
}

/// Records a kernel's passing whole-suite run, if the kernel-facing files
/// it ran are the committed ones, unchanged since `before` (the run's
/// start).
pub fn write(before: &Tree, kernel: &str, seconds: u64, closing: &str) -> Result<()> {
    let now = tree()?;
    let Tree::Clean { digest, .. } = &now else {
        eprintln!("xtask vm: not recording {kernel} in {FILE}: kernel-facing files uncommitted");
        return Ok(());
    };
    // The files, not the commit: committing something else meanwhile
    // leaves what ran as it was.
    // The commit the run built and ran, not the one at its end.
    let commit = match before {
        Tree::Clean { digest: d, commit } if d == digest => commit,
        _ => {
            eprintln!(
                "xtask vm: not recording {kernel} in {FILE}: kernel-facing files changed during \
                 the run"
            );
            return Ok(());
        }
    };
    let entries = parse(&fs::read_to_string(file()).unwrap_or_default());
    let e = Entry {
        kernel: kernel.into(),
        digest: digest.clone(),
        commit: commit.clone(),
        seconds,
        closing: closing.into(),
    };
    fs::write(file(), render(entries, e))?;
    eprintln!("xtask vm: recorded {kernel} in {FILE} (commit it)");
    Ok(())
}

/// `cargo xtask test`'s lines about the whole suite on `kernels`: printed,
/// not failed on (see the README's "Tested kernels").
pub fn check(kernels: &[&str]) -> Vec<String> {
    let entries = parse(&fs::read_to_string(file()).unwrap_or_default());
    match tree() {
        Ok(t) => verdicts(&entries, &t, kernels)
            .into_iter()
            .map(|(ok, line)| {
                format!(
                    "xtask: whole suite {} {line}",
                    if ok { "current:" } else { "STALE:" }
                )
            })
            .collect(),
        Err(e) => vec![format!("xtask: whole suite unknown: {e:#}")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kernel: &str, digest: &str) -> Entry {
        Entry {
            kernel: kernel.into(),
            digest: digest.into(),
            commit: "abc1234".into(),
            seconds: 1200,
            closing: format!("vm {kernel} r: 140 passed, 0 failed, 3 skipped"),
        }
    }

    #[test]
    fn renders_and_parses_one_line_per_kernel() {
        let s = render(vec![entry("6.12", "d1")], entry("6.1", "d0"));
        let s = render(parse(&s), entry("6.12", "d2"));
        assert!(s.starts_with("# Written by"));
        assert_eq!(parse(&s), [entry("6.1", "d0"), entry("6.12", "d2")]);
        assert!(s.contains("\n6.1 d0 abc1234 1200 vm 6.1 r: 140 passed, 0 failed, 3 skipped\n"));
        assert!(parse("6.1 d0 abc1234 notanumber x").is_empty());
    }

    #[test]
    fn a_kernel_is_current_only_while_its_digest_matches() {
        let entries = [entry("6.1", "d0"), entry("6.12", "d1")];
        let clean = Tree::Clean {
            digest: "d0".into(),
            commit: "def5678".into(),
        };
        let v = verdicts(&entries, &clean, &["5.10", "6.1", "6.12"]);
        let ok: Vec<bool> = v.iter().map(|(ok, _)| *ok).collect();
        assert_eq!(ok, [false, true, false]);
        assert!(v[0].1.starts_with("no whole-suite run recorded for 5.10"));
        assert!(v[1].1.contains("(at abc1234, 1200 s: vm 6.1 r: 140 passed"));
        assert!(v[2]
            .1
            .starts_with("6.12: kernel-facing files changed since"));
        let dirty = Tree::Uncommitted(vec!["kdrop-ebpf/src/drop.rs".into()]);
        let v = verdicts(&entries, &dirty, &["6.1"]);
        assert!(!v[0].0);
        assert!(v[0].1.contains("not committed (kdrop-ebpf/src/drop.rs)"));
    }

    #[test]
    fn kernel_facing_paths_exist() {
        for (p, why) in KERNEL_FACING {
            assert!(root().join(p).exists(), "{p} ({why}) is gone");
        }
    }
}
