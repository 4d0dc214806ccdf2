//! One snapshot of a namespace's netfilter state: the rulesets with their
//! counters (iptables-legacy-save -c, iptables-nft-save -c, nft -j list
//! ruleset), conntrack's statistics and the interfaces, all read from inside
//! the namespace: the tools run as children of a thread that has joined it
//! (a child inherits its thread's namespace). Read-only: nothing here
//! changes a ruleset, and legacy iptables is only asked about when the
//! namespace already has legacy tables (asking would not create one, but
//! kdrop does not even try).
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{mpsc, Arc},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use super::{conntrack::read_conntrack, iptables_save, nft_json};
use crate::{
    context::{netlink, netns::in_netns},
    model::netfilter::{Backend, Family, Snapshot, Table},
};

/// A tool that has not answered in this long is killed; kdrop reports the
/// drop without attribution rather than stall.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(5);
/// The same at start, where only the start waits: the rules read then are
/// the first drop's "before" and the node ports followed all session. In
/// 5.10's guest under TCG, two tests at once, 5 s was not enough and
/// kube-proxy's node ports went unfollowed.
pub const START_TOOL_TIMEOUT: Duration = Duration::from_secs(15);
/// The binaries found on this host.
#[derive(Clone, Debug, Default)]
pub struct Tools {
    pub legacy4: Option<PathBuf>,
    pub legacy6: Option<PathBuf>,
    pub nft_save4: Option<PathBuf>,
    pub nft_save6: Option<PathBuf>,
    pub nft: Option<PathBuf>,
}

pub fn which(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// `iptables-legacy-save`, or a plain `iptables-save` that is that backend
/// (`iptables-save v1.8.9 (legacy)`).
fn save_tool(prefix: &str, backend: &str, marker: &str) -> Option<PathBuf> {
    which(&format!("{prefix}-{backend}-save")).or_else(|| {
        let plain = which(&format!("{prefix}-save"))?;
        let out = Command::new(&plain).arg("--version").output().ok()?;
        String::from_utf8_lossy(&out.stdout)
            .contains(marker)
            .then_some(plain)
    })
}

impl Tools {
    pub fn find() -> Self {
        Tools {
            legacy4: save_tool("iptables", "legacy", "(legacy)"),
            legacy6: save_tool("ip6tables", "legacy", "(legacy)"),
            nft_save4: save_tool("iptables", "nft", "(nf_tables)"),
            nft_save6: save_tool("ip6tables", "nft", "(nf_tables)"),
            nft: which("nft"),
        }
    }
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs a tool to completion (bounded by TOOL_TIMEOUT), returning stdout.
pub fn run(bin: &Path, args: &[&str]) -> Result<String> {
    run_within(bin, args, TOOL_TIMEOUT)
}

/// `run`, bounded by `timeout`.
fn run_within(bin: &Path, args: &[&str], timeout: Duration) -> Result<String> {
    let child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(timeout) {
        Ok(out) => out?,
        Err(_) => {
            // SAFETY: kill(2) on our own child, still unreaped (the waiting
            // thread reaps it after this).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            bail!("{} did not answer within {timeout:?}", bin.display());
        }
    };
    if !out.status.success() {
        bail!(
            "{} {} failed: {}",
            bin.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("output is not UTF-8")
}

pub fn tool_name(bin: &Path) -> String {
    bin.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `iptables-legacy-save -c`: how the evidence names a source.
fn source_of(bin: &Path) -> String {
    format!("{} -c", tool_name(bin))
}

/// Reads everything, in the calling thread's namespace, each tool
/// bounded by `timeout`.
fn read_here(tools: &Tools, timeout: Duration) -> Snapshot {
    let run = |bin: &Path, args: &[&str]| run_within(bin, args, timeout);
    let started_ns = monotonic_ns();
    let mut snap = Snapshot {
        started_ns,
        ..Snapshot::default()
    };
    // Legacy tables exist in this namespace only if listed here.
    for (names, tool, family) in [
        ("ip_tables_names", &tools.legacy4, Family::Ip),
        ("ip6_tables_names", &tools.legacy6, Family::Ip6),
    ] {
        let listed =
            std::fs::read_to_string(format!("/proc/thread-self/net/{names}")).unwrap_or_default();
        if listed.trim().is_empty() {
            continue;
        }
        let Some(bin) = tool else {
            snap.problems.push(format!(
                "legacy {names} present but no legacy save tool installed"
            ));
            continue;
        };
        let source = source_of(bin);
        match run(bin, &["-c"]).and_then(|t| {
            iptables_save::parse_save(&t, Backend::IptablesLegacy, family, &source)
                .map_err(anyhow::Error::msg)
        }) {
            Ok(t) => snap.tables.extend(t),
            Err(e) => snap.problems.push(format!("{e:#}")),
        }
    }
    let mut nft_tables = Vec::new();
    match &tools.nft {
        Some(bin) => match run(bin, &["-j", "list", "ruleset"])
            .and_then(|t| nft_json::parse_ruleset(&t).map_err(anyhow::Error::msg))
        {
            Ok(t) => nft_tables = t,
            Err(e) => snap.problems.push(format!("{e:#}")),
        },
        None => snap.problems.push("nft is not installed".into()),
    }
    for (family, tool) in [
        (Family::Ip, &tools.nft_save4),
        (Family::Ip6, &tools.nft_save6),
    ] {
        let wanted = nft_tables
            .iter()
            .any(|t| t.family == family && nft_json::looks_like_xtables(t));
        let Some(bin) = tool.as_ref().filter(|_| wanted) else {
            continue;
        };
        match run(bin, &["-c"]).and_then(|t| {
            iptables_save::parse_save(&t, Backend::IptablesNft, family, &source_of(bin))
                .map_err(anyhow::Error::msg)
        }) {
            Ok(saved) => replace_xtables(&mut nft_tables, saved),
            Err(e) => snap.problems.push(format!("{e:#}")),
        }
    }
    snap.tables.extend(nft_tables);
    snap.conntrack = read_conntrack();
    match netlink::ifaces() {
        Ok(ifaces) => snap.ifaces = ifaces,
        Err(e) => snap.problems.push(format!("{e:#}")),
    }
    snap.finished_ns = monotonic_ns();
    snap
}

/// Puts iptables-nft's own view of its tables (rule specs, policy counters)
/// in place of nft's, where both describe the same chains.
fn replace_xtables(nft_tables: &mut [Table], saved: Vec<Table>) {
    for s in saved {
        let Some(slot) = nft_tables
            .iter_mut()
            .find(|t| t.family == s.family && t.name == s.name && nft_json::looks_like_xtables(t))
        else {
            continue;
        };
        let same_chains = slot
            .chains
            .iter()
            .all(|c| s.chains.iter().any(|x| x.name == c.name));
        if same_chains {
            *slot = s;
        }
    }
}

/// Takes a snapshot inside the namespace at `path`.
pub fn snapshot(path: &Path, tools: &Arc<Tools>, timeout: Duration) -> Result<Snapshot> {
    let tools = Arc::clone(tools);
    in_netns(path, move || read_here(&tools, timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xtables_replacement_needs_the_same_chains() {
        let nft_json = r#"{"nftables": [{"table": {"family": "ip", "name": "filter"}},
            {"chain": {"family": "ip", "table": "filter", "name": "INPUT", "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
            {"table": {"family": "ip", "name": "nat"}},
            {"chain": {"family": "ip", "table": "nat", "name": "POSTROUTING", "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
            {"chain": {"family": "ip", "table": "nat", "name": "mine", "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}}]}"#;
        let mut tables = nft_json::parse_ruleset(nft_json).unwrap();
        let saved = iptables_save::parse_save(
            "*filter\n:INPUT DROP [3:180]\nCOMMIT\n*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n",
            Backend::IptablesNft,
            Family::Ip,
            "iptables-nft-save -c",
        )
        .unwrap();
        replace_xtables(&mut tables, saved);
        assert_eq!(tables[0].backend, Backend::IptablesNft);
        assert_eq!(
            tables[0].chains[0].base.as_ref().unwrap().policy_packets,
            Some(3)
        );
        assert_eq!(
            tables[1].backend,
            Backend::Nftables,
            "nat has a chain iptables-nft does not know"
        );
    }

    #[test]
    fn sources_name_the_tool() {
        let a = source_of(Path::new("/usr/sbin/iptables-legacy-save"));
        assert_eq!(a, "iptables-legacy-save -c");
    }

    #[test]
    fn tools_time_out_and_fail_cleanly() {
        assert!(run(Path::new("/bin/false"), &[]).is_err());
        assert_eq!(run(Path::new("/bin/echo"), &["hi"]).unwrap(), "hi\n");
        assert!(run(Path::new("/nonexistent/tool"), &[]).is_err());
    }
}
