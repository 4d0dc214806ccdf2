//! Files an x86_64 guest reads from copies in its own memory. The guest's
//! root is this machine's filesystem over 9p without a cache (virtme-ng's
//! mount): a file nobody holds leaves the dentry cache when it is closed
//! (`v9fs_dentry_operations.d_delete = always_delete_dentry`), the next
//! lookup makes a new inode (`v9fs_get_new_inode_from_fid` without a
//! cache), and its pages are read again (v5.10 fs/9p/vfs_dentry.c and
//! vfs_inode.c, https://github.com/torvalds/linux/blob/v5.10/fs/9p/). Every
//! `ip` or `nft` a test ran read its binary and libraries anew, on 5.10 a
//! page per round trip. Holding the files open kept their pages on 6.1
//! but not on 5.10, whose every lookup makes a new inode anyway (60 execs
//! of a static busybox held open over 9p: 2.9 s on 5.10, 0.9 s on 6.1).
//! So the guest copies these files into a tmpfs and binds each copy over
//! its original (guest.rs): 60 execs of the bound busybox took 0.7 s on
//! 5.10 and 0.6 s on 6.1 (BENCHMARKS.md).
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

/// What every dynamically linked program reads at its start.
const LOADER_CACHE: &str = "/etc/ld.so.cache";

/// The files to copy: `extra` (kdrop), each tool's binary and the
/// libraries `ldd` names for them, the iptables extensions beside
/// libxtables (dlopened per match) and the loader's cache. What cannot be
/// found is left out: the copies are only a speed-up.
pub(super) fn files(extra: &[&Path]) -> Vec<PathBuf> {
    let bins: BTreeSet<PathBuf> = TOOLS
        .iter()
        .filter_map(|t| on_path(t)?.canonicalize().ok())
        .collect();
    let mut copied: BTreeSet<PathBuf> = bins.clone();
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
                copied.extend(
                    std::fs::read_dir(dir)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "so")),
                );
            }
        }
        copied.insert(lib);
    }
    copied.extend(extra.iter().map(|p| p.to_path_buf()));
    copied.extend(Path::new(LOADER_CACHE).canonicalize());
    copied.into_iter().collect()
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
    fn copies_this_machines_ip_its_loader_and_its_cache() {
        let kdrop = Path::new("/k/kdrop");
        let copied = files(&[kdrop]);
        let ip = on_path("ip").unwrap().canonicalize().unwrap();
        assert!(copied.contains(&ip), "{copied:?}");
        assert!(copied.contains(&kdrop.to_path_buf()));
        assert!(
            copied
                .iter()
                .any(|p| p.to_string_lossy().contains("ld-linux")),
            "{copied:?}"
        );
        assert!(copied.contains(&PathBuf::from(LOADER_CACHE)), "{copied:?}");
    }
}
