//! Files an x86_64 guest keeps open while its tests run. The guest's root
//! is this machine's filesystem over 9p without a cache (virtme-ng's
//! mount): a file nobody holds leaves the dentry cache when it is closed
//! (`v9fs_dentry_operations.d_delete = always_delete_dentry`), the next
//! lookup makes a new inode (`v9fs_get_new_inode_from_fid` without a
//! cache), and its pages are read again (v5.10 fs/9p/vfs_dentry.c and
//! vfs_inode.c, https://github.com/torvalds/linux/blob/v5.10/fs/9p/). Every
//! `ip` or `nft` a test ran read its binary and libraries anew: `/bin/true`
//! took 390 ms on 5.10 against 90 ms on 6.1 (BENCHMARKS.md). A process
//! that holds these files open keeps their dentries, inodes and pages.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use super::on_path;

/// The programs the tests and kdrop run most (Command::new in tests/src,
/// tests/tests and kdrop/src), and those of the guest script itself.
const TOOLS: &[&str] = &[
    "ip",
    "bridge",
    "tc",
    "ss",
    "nft",
    "iptables",
    "ip6tables",
    "iptables-legacy",
    "iptables-nft",
    "conntrack",
    "sysctl",
    "bpftool",
    "mount",
    "umount",
    "nsenter",
    "unshare",
    "setpriv",
    "modprobe",
    "sh",
    "sleep",
    "date",
    "cut",
    "cat",
];

/// The files to hold: `extra` (kdrop), each tool's binary and the
/// libraries `ldd` names for them, and the iptables extensions beside
/// libxtables (dlopened per match). What cannot be found is left out:
/// holding is only a speed-up.
pub(super) fn files(extra: &[&Path]) -> Vec<PathBuf> {
    let bins: BTreeSet<PathBuf> = TOOLS
        .iter()
        .filter_map(|t| on_path(t)?.canonicalize().ok())
        .collect();
    let mut held: BTreeSet<PathBuf> = bins.clone();
    let libs = Command::new("ldd")
        .args(&bins)
        .output()
        .map(|o| libraries(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default();
    for lib in libs {
        let Ok(lib) = lib.canonicalize() else {
            continue;
        };
        if lib
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libxtables.so"))
        {
            if let Some(dir) = lib.parent().map(|d| d.join("xtables")) {
                held.extend(
                    std::fs::read_dir(dir)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "so")),
                );
            }
        }
        held.insert(lib);
    }
    held.extend(extra.iter().map(|p| p.to_path_buf()));
    held.into_iter().collect()
}

/// The libraries in `ldd`'s output for several files: `name => /path
/// (addr)` and the loader's own `/path (addr)`; not the `/file:` headers.
fn libraries(ldd: &str) -> Vec<PathBuf> {
    ldd.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None if l.ends_with(':') => return None,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_from_ldd_of_two_files() {
        let out = "/usr/bin/ip:\n\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibbpf.so.1 => /lib/x86_64-linux-gnu/libbpf.so.1 (0x00007f1)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f2)\n\
                   /usr/sbin/nft:\n\tlibnftables.so.1 => not found\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f3)\n";
        assert_eq!(
            libraries(out),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libbpf.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
            ]
        );
    }

    #[test]
    fn holds_this_machines_ip_and_its_loader() {
        let kdrop = Path::new("/k/kdrop");
        let held = files(&[kdrop]);
        let ip = on_path("ip").unwrap().canonicalize().unwrap();
        assert!(held.contains(&ip), "{held:?}");
        assert!(held.contains(&kdrop.to_path_buf()));
        assert!(
            held.iter()
                .any(|p| p.to_string_lossy().contains("ld-linux")),
            "{held:?}"
        );
    }
}
