//! Network namespaces: names under /run/netns, processes holding them, and
//! running code inside one (interface names are per namespace).
use std::{
    collections::HashMap,
    ffi::CString,
    fs,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

pub const NETNS_DIR: &str = "/run/netns";

/// A namespace kdrop can enter: its inode, a path to it, and its name if it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netns {
    pub inode: u32,
    pub path: PathBuf,
    pub name: Option<String>,
}

pub fn inode_of(path: &Path) -> Result<u32> {
    let meta = fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    Ok(meta.ino() as u32)
}

/// Is `path` a namespace file (on nsfs), as opposed to any file?
fn is_nsfs(path: &Path) -> bool {
    const NSFS_MAGIC: i64 = 0x6e73_6673;
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into buf; c is a valid C string.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    rc == 0 && buf.f_type as i64 == NSFS_MAGIC
}

/// kdrop's own namespace.
pub fn own() -> Result<Netns> {
    let path = PathBuf::from("/proc/self/ns/net");
    Ok(Netns {
        inode: inode_of(&path)?,
        path: PathBuf::from(format!("/proc/{}/ns/net", std::process::id())),
        name: None,
    })
}

/// Resolves `--netns`: a name under /run/netns, a path, or an inode number.
pub fn resolve_arg(arg: &str, registry: &mut NetnsRegistry) -> Result<Netns, String> {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_digit()) {
        let inode: u32 = arg.parse().map_err(|_| format!("bad netns inode {arg}"))?;
        return registry
            .lookup(inode)
            .ok_or_else(|| format!("no network namespace with inode {inode}"));
    }
    let path = if arg.contains('/') {
        PathBuf::from(arg)
    } else {
        Path::new(NETNS_DIR).join(arg)
    };
    let inode = inode_of(&path).map_err(|e| format!("unknown netns {arg}: {e:#}"))?;
    if !is_nsfs(&path) {
        return Err(format!("{arg} is not a network namespace"));
    }
    let name = (!arg.contains('/')).then(|| arg.to_string());
    let name = name.or_else(|| registry.lookup(inode).and_then(|n| n.name));
    Ok(Netns { inode, path, name })
}

/// inode → namespace, refreshed when an unknown inode shows up (at most once
/// a second, so a flood from an unnamed namespace costs one scan). A known
/// entry is checked again once a second: the kernel reuses a freed
/// namespace's inode number (proc_inum's IDA hands out the lowest free one),
/// so a pod started after another was deleted may get its number, and the
/// dead one's name must not stay on it.
#[derive(Debug, Default)]
pub struct NetnsRegistry {
    known: HashMap<u32, Netns>,
    /// When each known entry's path was last seen to hold its inode.
    checked: HashMap<u32, Instant>,
    last_scan: Option<Instant>,
}

const RESCAN_EVERY: Duration = Duration::from_secs(1);

impl NetnsRegistry {
    pub fn new() -> Self {
        let mut r = Self::default();
        r.scan();
        r
    }

    pub fn lookup(&mut self, inode: u32) -> Option<Netns> {
        if let Some(n) = self.known.get(&inode) {
            let now = Instant::now();
            let fresh = self
                .checked
                .get(&inode)
                .is_some_and(|t| now.duration_since(*t) < RESCAN_EVERY);
            if fresh || inode_of(&n.path).is_ok_and(|i| i == inode) {
                if !fresh {
                    self.checked.insert(inode, now);
                }
                return Some(n.clone());
            }
            // Gone, or its path now holds another namespace: a scan says
            // what holds the number now (whatever the scan's age).
            self.scan();
            return self.known.get(&inode).cloned();
        }
        if self.last_scan.is_none_or(|t| t.elapsed() >= RESCAN_EVERY) {
            self.scan();
        }
        self.known.get(&inode).cloned()
    }

    /// Every namespace known now (after a fresh scan).
    pub fn all(&mut self) -> Vec<Netns> {
        self.scan();
        let mut v: Vec<Netns> = self.known.values().cloned().collect();
        v.sort_by_key(|n| n.inode);
        v
    }

    /// Named namespaces win over process paths.
    fn scan(&mut self) {
        let now = Instant::now();
        self.last_scan = Some(now);
        self.known.clear();
        if let Ok(procs) = fs::read_dir("/proc") {
            for p in procs.flatten() {
                let name = p.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
                if let Ok(inode) = inode_of(&path) {
                    self.known.entry(inode).or_insert(Netns {
                        inode,
                        path,
                        name: None,
                    });
                }
            }
        }
        if let Ok(entries) = fs::read_dir(NETNS_DIR) {
            for e in entries.flatten() {
                let path = e.path();
                if let (Ok(inode), Some(name)) = (inode_of(&path), e.file_name().to_str()) {
                    self.known.insert(
                        inode,
                        Netns {
                            inode,
                            path,
                            name: Some(name.to_string()),
                        },
                    );
                }
            }
        }
        self.checked = self.known.keys().map(|&i| (i, now)).collect();
    }
}

/// Runs `f` on a thread that has joined the namespace at `path`; sockets it
/// opens belong to that namespace.
pub fn in_netns<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let handle = std::thread::spawn(move || -> Result<T> {
        // SAFETY: setns on this thread only; the fd is valid for the call.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("setns");
        }
        Ok(f())
    });
    handle
        .join()
        .map_err(|_| anyhow::anyhow!("netns worker panicked"))?
        .with_context(|| format!("entering {}", path.display()))
}

/// Interface name for `ifindex` in the calling thread's namespace.
pub fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// Interface index for `name` in the calling thread's namespace.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: c is a valid C string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

/// (netns, ifindex) → interface name, resolved inside the namespace once,
/// with the path it was resolved through: a namespace number the kernel
/// gave to another namespace (see [`NetnsRegistry`]) comes with another
/// path, and its names are looked up again. A name that could not be
/// resolved is not kept.
#[derive(Debug, Default)]
pub struct IfNames {
    cache: HashMap<(u32, u32), (PathBuf, String)>,
}

impl IfNames {
    pub fn get(&mut self, ns: Option<&Netns>, own_inode: u32, netns: u32, ifindex: u32) -> String {
        if ifindex == 0 {
            return "-".into();
        }
        let via = ns.map(|n| n.path.as_path()).unwrap_or(Path::new(""));
        if let Some((p, n)) = self.cache.get(&(netns, ifindex)) {
            if p == via {
                return n.clone();
            }
        }
        let name = if netns == own_inode {
            ifname(ifindex)
        } else {
            ns.and_then(|ns| in_netns(&ns.path, move || ifname(ifindex)).ok().flatten())
        };
        match name {
            Some(name) => {
                self.cache
                    .insert((netns, ifindex), (via.to_path_buf(), name.clone()));
                name
            }
            None => format!("if{ifindex}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_has_loopback() {
        assert_eq!(ifname(1).as_deref(), Some("lo"));
        assert_eq!(ifindex("lo"), Some(1));
        assert_eq!(ifindex("no-such-if0"), None);
        assert_eq!(ifindex("bad\0name"), None);
    }

    /// A number whose path now holds another namespace (the kernel reused
    /// a deleted namespace's inode) is not answered with the dead one's
    /// name.
    #[test]
    fn a_reused_inode_is_not_named_after_the_dead_namespace() {
        let me = own().unwrap();
        let mut r = NetnsRegistry::new();
        let dead = me.inode.wrapping_add(1);
        // What the registry learnt when `dead` was a named namespace whose
        // path is now elsewhere (this process's, another inode).
        r.known.insert(
            dead,
            Netns {
                inode: dead,
                path: PathBuf::from("/proc/self/ns/net"),
                name: Some("gone".into()),
            },
        );
        r.checked.insert(dead, Instant::now() - RESCAN_EVERY);
        assert!(r
            .lookup(dead)
            .is_none_or(|n| n.name.as_deref() != Some("gone")));
        // Checked within the second: answered from what it knows.
        assert_eq!(r.lookup(me.inode).map(|n| n.inode), Some(me.inode));
    }

    #[test]
    fn an_unresolved_interface_name_is_not_kept() {
        let me = own().unwrap();
        let mut names = IfNames::default();
        let ns = Netns {
            inode: me.inode.wrapping_add(1),
            path: PathBuf::from("/nonexistent/ns"),
            name: None,
        };
        assert_eq!(names.get(Some(&ns), me.inode, ns.inode, 1), "if1");
        assert!(names.cache.is_empty());
        let real = Netns {
            path: PathBuf::from("/proc/self/ns/net"),
            ..ns.clone()
        };
        assert_eq!(names.get(Some(&real), me.inode, ns.inode, 1), "lo");
        // The same number through another path: looked up again.
        assert_eq!(names.get(Some(&ns), me.inode, ns.inode, 1), "if1");
    }

    #[test]
    fn registry_knows_our_namespace() {
        let me = own().unwrap();
        let mut r = NetnsRegistry::new();
        assert_eq!(r.lookup(me.inode).map(|n| n.inode), Some(me.inode));
        assert!(resolve_arg("definitely-not-a-netns", &mut r).is_err());
        assert!(resolve_arg("/tmp", &mut r).is_err());
        let by_path = resolve_arg("/proc/self/ns/net", &mut r).unwrap();
        assert_eq!(by_path.inode, me.inode);
        let by_inode = resolve_arg(&me.inode.to_string(), &mut r).unwrap();
        assert_eq!(by_inode.inode, me.inode);
    }
}
