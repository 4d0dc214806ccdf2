//! Reading a namespace's netfilter state for `netfilter::attribute`: the
//! rulesets with their counters (iptables-legacy-save -c, iptables-nft-save
//! -c, nft -j list ruleset), conntrack's statistics and the interfaces, all
//! read from inside the namespace: the tools run as children of a thread
//! that has joined it (a child inherits its thread's namespace). Read-only:
//! nothing here changes a ruleset, and legacy iptables is only asked about
//! when the namespace already has legacy tables (asking would not create
//! one, but kdrop does not even try).
//!
//! A per-namespace history of snapshots gives each drop a "before" (taken at
//! startup for the traced namespace, or after an earlier drop) and an
//! "after" (taken when the event is read, or shared by every event of a
//! batch that happened before it).
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{mpsc, Arc},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use super::netns::{in_netns, Netns};
use crate::{
    event::Drop,
    netfilter::{
        self, attribution::Dropped, iptables, nft, Attribution, Backend, ConntrackStats, Family,
        Iface, Snapshot, Table,
    },
    verdict::{NfFn, Verdict},
};

/// A tool that has not answered in this long is killed; kdrop reports the
/// drop without attribution rather than stall.
const TOOL_TIMEOUT: Duration = Duration::from_secs(5);
/// Snapshots kept per namespace (before, after, and one spare for events
/// read out of order across a batch).
const HISTORY: usize = 3;
/// Namespaces remembered (a kube-proxy ruleset can hold tens of thousands of
/// rules); the least recently used is forgotten.
const MAX_NAMESPACES: usize = 64;

/// The binaries found on this host.
#[derive(Clone, Debug, Default)]
pub struct Tools {
    pub legacy4: Option<PathBuf>,
    pub legacy6: Option<PathBuf>,
    pub nft_save4: Option<PathBuf>,
    pub nft_save6: Option<PathBuf>,
    pub nft: Option<PathBuf>,
    pub ip: Option<PathBuf>,
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
            ip: which("ip"),
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs a tool to completion (bounded by TOOL_TIMEOUT), returning stdout.
fn run(bin: &Path, args: &[&str]) -> Result<String> {
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
    let out = match rx.recv_timeout(TOOL_TIMEOUT) {
        Ok(out) => out?,
        Err(_) => {
            // SAFETY: kill(2) on our own child, still unreaped (the waiting
            // thread reaps it after this).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            bail!("{} did not answer within {TOOL_TIMEOUT:?}", bin.display());
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

fn tool_name(bin: &Path) -> String {
    bin.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `iptables-legacy-save -c`: how the evidence names a source.
fn source_of(bin: &Path) -> String {
    format!("{} -c", tool_name(bin))
}

/// Reads everything, in the calling thread's namespace.
fn read_here(tools: &Tools) -> Snapshot {
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
            iptables::parse_save(&t, Backend::IptablesLegacy, family, &source)
                .map_err(anyhow::Error::msg)
        }) {
            Ok(t) => snap.tables.extend(t),
            Err(e) => snap.problems.push(format!("{e:#}")),
        }
    }
    let mut nft_tables = Vec::new();
    match &tools.nft {
        Some(bin) => match run(bin, &["-j", "list", "ruleset"])
            .and_then(|t| nft::parse_ruleset(&t).map_err(anyhow::Error::msg))
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
            .any(|t| t.family == family && nft::looks_like_xtables(t));
        let Some(bin) = tool.as_ref().filter(|_| wanted) else {
            continue;
        };
        match run(bin, &["-c"]).and_then(|t| {
            iptables::parse_save(&t, Backend::IptablesNft, family, &source_of(bin))
                .map_err(anyhow::Error::msg)
        }) {
            Ok(saved) => replace_xtables(&mut nft_tables, saved),
            Err(e) => snap.problems.push(format!("{e:#}")),
        }
    }
    snap.tables.extend(nft_tables);
    snap.conntrack = read_conntrack();
    if let Some(ip) = &tools.ip {
        match run(ip, &["-j", "addr", "show"]) {
            Ok(text) => snap.ifaces = parse_ip_addr(&text),
            Err(e) => snap.problems.push(format!("{e:#}")),
        }
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
            .find(|t| t.family == s.family && t.name == s.name && nft::looks_like_xtables(t))
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

fn read_conntrack() -> Option<ConntrackStats> {
    let text = std::fs::read_to_string("/proc/thread-self/net/stat/nf_conntrack").ok()?;
    let mut stats = parse_conntrack_stat(&text)?;
    let num = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    // Network sysctls answer for the opening thread's namespace.
    stats.count = num("/proc/sys/net/netfilter/nf_conntrack_count");
    stats.max = num("/proc/sys/net/netfilter/nf_conntrack_max");
    stats.buckets = num("/proc/sys/net/netfilter/nf_conntrack_buckets");
    Some(stats)
}

/// `/proc/net/stat/nf_conntrack`: a header of column names, then one row of
/// hex numbers per CPU.
pub fn parse_conntrack_stat(text: &str) -> Option<ConntrackStats> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let mut s = ConntrackStats::default();
    for row in lines {
        for (name, v) in header.iter().zip(row.split_whitespace()) {
            let v = u64::from_str_radix(v, 16).ok()?;
            match *name {
                "drop" => s.drop += v,
                "insert_failed" => s.insert_failed += v,
                "early_drop" => s.early_drop += v,
                "invalid" => s.invalid += v,
                // ct_cpu_seq_show prints st->chaintoolong under this name
                // (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_standalone.c).
                "chainlength" => s.chaintoolong += v,
                "clashres" => s.clash_resolve += v,
                _ => {}
            }
        }
    }
    Some(s)
}

/// `ip -j addr show`: names, bridge masters, local addresses.
pub fn parse_ip_addr(json: &str) -> Vec<Iface> {
    let Ok(Value::Array(links)) = serde_json::from_str::<Value>(json) else {
        return Vec::new();
    };
    links
        .iter()
        .filter_map(|l| {
            Some(Iface {
                index: u32::try_from(l.get("ifindex")?.as_u64()?).ok()?,
                name: l.get("ifname")?.as_str()?.to_string(),
                master: l.get("master").and_then(Value::as_str).map(String::from),
                addrs: l
                    .get("addr_info")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.get("local")?.as_str()?.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// The entry of the namespace at `path` whose reply tuple is `reply`
/// (`conntrack -L` filtered on it), as `orig A -> B, state S`: who holds
/// the tuple a clashing entry wanted.
pub fn reply_holder(path: &Path, reply: &crate::event::Tuple) -> Option<String> {
    let bin = which("conntrack")?;
    let family = if reply.src.is_ipv4() { "ipv4" } else { "ipv6" };
    let args: Vec<String> = [
        "-L",
        "-f",
        family,
        "-p",
        "tcp",
        "--reply-src",
        &reply.src.ip().to_string(),
        "--reply-port-src",
        &reply.src.port().to_string(),
        "--reply-dst",
        &reply.dst.ip().to_string(),
        "--reply-port-dst",
        &reply.dst.port().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let text = in_netns(path, move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&bin, &args)
    })
    .ok()?
    .ok()?;
    text.lines().find_map(parse_conntrack_line)
}

/// `tcp 6 117 SYN_SENT src=A dst=B sport=1 dport=2 [UNREPLIED] src=...`
/// → `orig A:1 -> B:2, state SYN_SENT`.
pub fn parse_conntrack_line(line: &str) -> Option<String> {
    let toks: Vec<&str> = line.split_whitespace().collect();
    let state = toks.get(3).filter(|t| !t.contains('='));
    let kv = |key: &str| {
        toks.iter()
            .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
    };
    let host = |h: &str| {
        if h.contains(':') {
            format!("[{h}]")
        } else {
            h.to_string()
        }
    };
    let mut out = format!(
        "orig {}:{} -> {}:{}",
        host(kv("src")?),
        kv("sport")?,
        host(kv("dst")?),
        kv("dport")?
    );
    if let Some(s) = state {
        out.push_str(&format!(", state {s}"));
    }
    if line.contains("[UNREPLIED]") {
        out.push_str(", unreplied");
    }
    Some(out)
}

/// Takes a snapshot inside the namespace at `path`.
pub fn snapshot(path: &Path, tools: &Arc<Tools>) -> Result<Snapshot> {
    let tools = Arc::clone(tools);
    in_netns(path, move || read_here(&tools))
}

/// Snapshots per namespace, and attribution of drops against them.
pub struct NetfilterContext {
    tools: Arc<Tools>,
    history: HashMap<u32, Vec<Arc<Snapshot>>>,
    /// Namespaces by last use, for forgetting.
    used: Vec<u32>,
}

impl Default for NetfilterContext {
    fn default() -> Self {
        Self::new()
    }
}

impl NetfilterContext {
    pub fn new() -> Self {
        NetfilterContext {
            tools: Arc::new(Tools::find()),
            history: HashMap::new(),
            used: Vec::new(),
        }
    }

    fn touch(&mut self, inode: u32) {
        self.used.retain(|&i| i != inode);
        self.used.push(inode);
        if self.used.len() > MAX_NAMESPACES {
            let old = self.used.remove(0);
            self.history.remove(&old);
        }
    }

    fn take(&mut self, ns: &Netns) -> Option<Arc<Snapshot>> {
        match snapshot(&ns.path, &self.tools) {
            Ok(s) => {
                log::debug!(
                    "netfilter snapshot of {}: {} tables in {:.1} ms",
                    ns.path.display(),
                    s.tables.len(),
                    (s.finished_ns - s.started_ns) as f64 / 1e6
                );
                let s = Arc::new(s);
                let h = self.history.entry(ns.inode).or_default();
                h.push(Arc::clone(&s));
                if h.len() > HISTORY {
                    h.remove(0);
                }
                self.touch(ns.inode);
                Some(s)
            }
            Err(e) => {
                log::debug!("netfilter snapshot of {}: {e:#}", ns.path.display());
                None
            }
        }
    }

    /// The newest snapshot of the namespace with this inode.
    pub fn latest(&self, inode: u32) -> Option<Arc<Snapshot>> {
        self.history.get(&inode)?.last().cloned()
    }

    /// A "before" for the first drop in `ns`: call before tracing starts.
    pub fn prime(&mut self, ns: &Netns) {
        self.take(ns);
    }

    /// Which rule, policy, conntrack or NAT drop killed this NETFILTER_DROP
    /// packet in `ns`: the kernel's own verdicts for it first (rung 1, see
    /// netfilter::kernel), the rule counters within the table and hook they
    /// name (or everywhere, without them).
    pub fn attribute(
        &mut self,
        ns: Option<&Netns>,
        d: &Drop,
        verdicts: &[Verdict],
        rung: &dyn Fn(NfFn) -> String,
    ) -> Option<Attribution> {
        let scope = netfilter::kernel::scope(verdicts);
        let counted = ns.and_then(|ns| self.counted(ns, d, scope.as_ref()));
        if verdicts.is_empty() {
            return counted;
        }
        netfilter::kernel::combine(verdicts, d.ts_ns, rung, counted)
    }

    fn counted(
        &mut self,
        ns: &Netns,
        d: &Drop,
        scope: Option<&netfilter::kernel::Scope>,
    ) -> Option<Attribution> {
        let hist = self.history.get(&ns.inode).cloned().unwrap_or_default();
        let before = hist.iter().rev().find(|s| s.finished_ns < d.ts_ns).cloned();
        let after = match hist.iter().find(|s| s.started_ns > d.ts_ns) {
            Some(s) => Arc::clone(s),
            None => self.take(ns)?,
        };
        let dropped = Dropped {
            src: d.saddr,
            dst: d.daddr,
            sport: d.sport,
            dport: d.dport,
            tcp_flags: d.tcp_flags,
            mark: d.mark,
            ifindex: d.ifindex,
        };
        netfilter::attribution::attribute_within(&dropped, before.as_deref(), &after, scope)
    }
}

/// For `kdrop check`: which attribution methods this host offers, best
/// first.
/// `kernel` names the rung each netfilter function's verdict comes
/// through (from the probe reports).
pub fn describe_methods(kernel: &[(&str, Option<String>)]) -> Vec<String> {
    let t = Tools::find();
    let tools: Vec<String> = [&t.legacy4, &t.legacy6, &t.nft_save4, &t.nft_save6]
        .into_iter()
        .flatten()
        .map(|p| tool_name(p))
        .chain(t.nft.as_ref().map(|_| "nft -j".to_string()))
        .collect();
    let used: Vec<String> = kernel
        .iter()
        .filter_map(|(f, r)| Some(format!("{f} via {}", r.as_ref()?)))
        .collect();
    vec![
        if used.is_empty() {
            "kernel verdicts (nf_conntrack_in, nf_nat_inet_fn, nft_do_chain, ipt_do_table): \
             none here, their probes did not attach"
                .to_string()
        } else {
            format!("kernel verdicts: {}", used.join(", "))
        },
        if tools.is_empty() {
            "rule counters: no iptables-save or nft found".into()
        } else {
            format!("rule counters before/after each drop: {}", tools.join(", "))
        },
        "ruleset evaluation: for nftables rules and policies without counters".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_stat() {
        let text = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
                    00000003  00000000 00000000 00000000 0000000a 00000000 00000000 00000000 00000000 00000001 00000002 00000000 00000000  00000000 00000000 00000000 00000000\n\
                    00000003  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000010 00000003 00000000  00000000 00000000 00000000 00000000\n";
        let s = parse_conntrack_stat(text).unwrap();
        assert_eq!(
            (s.invalid, s.insert_failed, s.drop, s.early_drop),
            (11, 1, 18, 3)
        );
        assert_eq!((s.chaintoolong, s.clash_resolve), (0, 0));
        assert!(parse_conntrack_stat("").is_none());
        assert!(parse_conntrack_stat("drop\nzz\n").is_none());
    }

    #[test]
    fn conntrack_lines() {
        assert_eq!(
            parse_conntrack_line("tcp      6 117 SYN_SENT src=10.98.1.2 dst=10.98.2.2 sport=41001 dport=8006 [UNREPLIED] src=10.98.2.2 dst=10.98.2.1 sport=8006 dport=40000 mark=0 use=1").unwrap(),
            "orig 10.98.1.2:41001 -> 10.98.2.2:8006, state SYN_SENT, unreplied"
        );
        assert_eq!(
            parse_conntrack_line("tcp 6 431999 ESTABLISHED src=fd00::1 dst=fd00::2 sport=1 dport=2 src=fd00::2 dst=fd00::1 sport=2 dport=1 [ASSURED] mark=0 use=1").unwrap(),
            "orig [fd00::1]:1 -> [fd00::2]:2, state ESTABLISHED"
        );
        assert_eq!(
            parse_conntrack_line("conntrack v1.4.7: 0 flow entries"),
            None
        );
    }

    #[test]
    fn ip_addr_json() {
        let json = r#"[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8},{"family":"inet6","local":"::1"}]},
            {"ifindex":4,"ifname":"bp0","master":"br0","addr_info":[]},
            {"ifindex":5,"ifname":"br0","addr_info":[{"family":"inet","local":"10.5.0.254"}]}]"#;
        let i = parse_ip_addr(json);
        assert_eq!(i.len(), 3);
        assert_eq!(
            i[0].addrs,
            [
                "127.0.0.1".parse::<std::net::IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(i[1].master.as_deref(), Some("br0"));
        assert_eq!(i[2].index, 5);
        assert!(parse_ip_addr("nope").is_empty());
    }

    #[test]
    fn xtables_replacement_needs_the_same_chains() {
        let nft_json = r#"{"nftables": [{"table": {"family": "ip", "name": "filter"}},
            {"chain": {"family": "ip", "table": "filter", "name": "INPUT", "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
            {"table": {"family": "ip", "name": "nat"}},
            {"chain": {"family": "ip", "table": "nat", "name": "POSTROUTING", "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
            {"chain": {"family": "ip", "table": "nat", "name": "mine", "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}}]}"#;
        let mut tables = nft::parse_ruleset(nft_json).unwrap();
        let saved = iptables::parse_save(
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
