//! Which processes hold a socket (by inode) or a BPF object: one bounded
//! scan of /proc/*/fd, cached, so a burst of findings costs one scan.
//! Links are `socket:[INODE]` (sockets) and `anon_inode:bpf-prog` (whose
//! fdinfo has `prog_id:`), as fs/proc/fd.c and kernel/bpf/syscall.c show them.
use std::{
    collections::HashMap,
    fs,
    time::{Duration, Instant},
};

pub use crate::model::listen::ProcessRef;

/// Limits of one scan: a node with a million open files must not stall
/// kdrop; what was not reached is simply not named.
pub const MAX_PROCS: usize = 20_000;
pub const MAX_FDS: usize = 200_000;
/// A lookup that misses rescans at most this often.
pub const RESCAN_EVERY: Duration = Duration::from_secs(1);

/// What a descriptor refers to, from its /proc link (and fdinfo).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Held {
    Socket(u64),
    BpfProg(u32),
}

/// `socket:[12345]` → 12345.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// `prog_id:` of a BPF program's fdinfo text.
pub fn fdinfo_prog_id(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("prog_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The pid's comm and cmdline (None if it is gone).
pub fn process(pid: u32) -> Option<ProcessRef> {
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    Some(ProcessRef {
        pid,
        comm: comm.trim_end().to_string(),
        cmdline: cmdline_text(&cmdline),
    })
}

/// NUL-separated argv → one line.
pub fn cmdline_text(raw: &[u8]) -> String {
    raw.split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Holders of sockets and BPF programs, from the last scan.
#[derive(Debug, Default)]
pub struct Holders {
    map: HashMap<Held, Vec<u32>>,
    scanned: Option<Instant>,
    /// Whether the last scan stopped at a limit.
    pub truncated: bool,
    /// Scans done (for tests and summaries).
    pub scans: u64,
}

impl Holders {
    pub fn new() -> Self {
        Self::default()
    }

    /// The processes holding `what`; rescans when it is unknown and the
    /// last scan is older than RESCAN_EVERY.
    pub fn lookup(&mut self, what: Held) -> Vec<ProcessRef> {
        if !self.map.contains_key(&what) && self.scanned.is_none_or(|t| t.elapsed() >= RESCAN_EVERY)
        {
            self.scan();
        }
        let pids = self.map.get(&what).cloned().unwrap_or_default();
        pids.into_iter().filter_map(process).collect()
    }

    /// One pass over /proc/*/fd, bounded by MAX_PROCS and MAX_FDS.
    pub fn scan(&mut self) {
        self.scans += 1;
        self.scanned = Some(Instant::now());
        self.map.clear();
        self.truncated = false;
        let Ok(procs) = fs::read_dir("/proc") else {
            return;
        };
        let (mut nprocs, mut nfds) = (0usize, 0usize);
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            nprocs += 1;
            if nprocs > MAX_PROCS || nfds > MAX_FDS {
                self.truncated = true;
                break;
            }
            let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                nfds += 1;
                if nfds > MAX_FDS {
                    break;
                }
                let Ok(link) = fs::read_link(fd.path()) else {
                    continue;
                };
                let link = link.to_string_lossy();
                let held = if let Some(ino) = socket_inode(&link) {
                    Held::Socket(ino)
                } else if link == "anon_inode:bpf-prog" {
                    let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
                    match fs::read_to_string(info)
                        .ok()
                        .as_deref()
                        .and_then(fdinfo_prog_id)
                    {
                        Some(id) => Held::BpfProg(id),
                        None => continue,
                    }
                } else {
                    continue;
                };
                let pids = self.map.entry(held).or_default();
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn parses_links_and_fdinfo() {
        assert_eq!(socket_inode("socket:[4026]"), Some(4026));
        assert_eq!(socket_inode("socket:[x]"), None);
        assert_eq!(socket_inode("socket:[12"), None);
        assert_eq!(socket_inode("/dev/null"), None);
        assert_eq!(socket_inode(""), None);
        let info = "pos:\t0\nflags:\t02000002\nprog_type:\t3\nprog_jited:\t1\nprog_tag:\tabc\nprog_id:\t42\n";
        assert_eq!(fdinfo_prog_id(info), Some(42));
        assert_eq!(fdinfo_prog_id("prog_id:\tnope\n"), None);
        assert_eq!(cmdline_text(b"nc\0-l\0\0-p\x0080\0"), "nc -l -p 80");
        assert_eq!(cmdline_text(b""), "");
        assert_eq!(cmdline_text(&[0xff, 0, b'a']), "\u{fffd} a");
    }

    #[test]
    fn finds_our_own_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ino = {
            use std::os::fd::AsRawFd as _;
            fs::metadata(format!("/proc/self/fd/{}", l.as_raw_fd()))
                .unwrap()
                .ino()
        };
        let mut h = Holders::new();
        let owners = h.lookup(Held::Socket(ino));
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(owners[0].pid, std::process::id());
        // A known inode is answered from the cache.
        let scans = h.scans;
        h.lookup(Held::Socket(ino));
        assert_eq!(h.scans, scans);
        assert!(h.lookup(Held::Socket(u64::MAX)).is_empty());
    }
}
