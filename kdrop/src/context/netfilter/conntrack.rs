//! Conntrack as the namespace shows it: its statistics
//! (/proc/net/stat/nf_conntrack and the count/max sysctls) and, for one
//! reply tuple, the entry that holds it (`conntrack -L`).
use std::path::Path;

use super::snapshot::{run, which};
use crate::{
    context::netns::in_netns,
    model::{netfilter::ConntrackStats, packet::Tuple},
};

pub fn read_conntrack() -> Option<ConntrackStats> {
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

/// The entry of the namespace at `path` whose reply tuple is `reply`
/// (`conntrack -L` filtered on it), as `orig A -> B, state S`: who holds
/// the tuple a clashing entry wanted.
pub fn reply_holder(path: &Path, reply: &Tuple) -> Option<String> {
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
}
