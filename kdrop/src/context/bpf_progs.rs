//! BPF programs that can drop packets, through the bpf(2) syscall: what a
//! program is (BPF_PROG_GET_FD_BY_ID + BPF_OBJ_GET_INFO_BY_FD), what is
//! attached to a device's tcx hooks or a cgroup (BPF_PROG_QUERY), where it is
//! pinned under /sys/fs/bpf, and which agent loaded it when that can be told.
//! Layouts: `union bpf_attr`, `struct bpf_prog_info`, `enum bpf_attach_type`
//! and `enum bpf_prog_type` of include/uapi/linux/bpf.h (stable UAPI; tcx
//! since 6.6, https://github.com/torvalds/linux/blob/v6.18/include/uapi/linux/bpf.h).
use std::{
    collections::HashMap,
    ffi::CString,
    fs, io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};

use super::procs::{Held, Holders};

pub use crate::model::progs::{Agent, AttachedProg, CgroupHook, ProgInfo};

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
pub const BPF_TCX_INGRESS: u32 = 46;
pub const BPF_TCX_EGRESS: u32 = 47;
const BPF_F_QUERY_EFFECTIVE: u32 = 1;
/// At most this many programs per hook are reported.
const MAX_PROGS: usize = 64;
/// `struct bpf_prog_info` is about 230 bytes on 6.18; a larger zeroed
/// buffer is accepted (the kernel checks the tail is zero).
const INFO_LEN: usize = 256;

/// Cgroup hooks where a program can refuse a TCP connection or drop its
/// packets: skb ingress/egress, socket creation, bind, connect.
pub const CGROUP_DROP_HOOKS: [(u32, &str); 9] = [
    (0, "ingress"),
    (1, "egress"),
    (2, "sock_create"),
    (8, "bind4"),
    (9, "bind6"),
    (10, "connect4"),
    (11, "connect6"),
    (12, "post_bind4"),
    (13, "post_bind6"),
];

const PROG_TYPES: [&str; 33] = [
    "unspec",
    "socket_filter",
    "kprobe",
    "sched_cls",
    "sched_act",
    "tracepoint",
    "xdp",
    "perf_event",
    "cgroup_skb",
    "cgroup_sock",
    "lwt_in",
    "lwt_out",
    "lwt_xmit",
    "sock_ops",
    "sk_skb",
    "cgroup_device",
    "sk_msg",
    "raw_tracepoint",
    "cgroup_sock_addr",
    "lwt_seg6local",
    "lirc_mode2",
    "sk_reuseport",
    "flow_dissector",
    "cgroup_sysctl",
    "raw_tracepoint_writable",
    "cgroup_sockopt",
    "tracing",
    "struct_ops",
    "ext",
    "lsm",
    "sk_lookup",
    "syscall",
    "netfilter",
];

pub fn prog_type_name(t: u32) -> String {
    PROG_TYPES
        .get(t as usize)
        .map_or_else(|| format!("prog_type {t}"), |s| s.to_string())
}

pub(super) fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> io::Result<i32> {
    // SAFETY: attr is a valid, writable buffer of the given size; the
    // kernel reads/writes at most that many bytes.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as i32)
}

pub(super) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

pub(super) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

pub(super) fn get_u32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

pub(super) fn get_u64(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// An fd for program `id` (BPF_PROG_GET_FD_BY_ID: prog_id @0).
pub fn prog_fd(id: u32) -> Result<OwnedFd> {
    let mut attr = [0u8; 16];
    put_u32(&mut attr, 0, id);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).with_context(|| format!("BPF program {id}"))?;
    // SAFETY: the kernel returned a new descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Parses `struct bpf_prog_info` as the kernel filled it; `map_ids`: the
/// buffer its map_ids pointer referred to.
pub fn parse_prog_info(info: &[u8], map_ids: &[u32]) -> Option<ProgInfo> {
    // type @0, id @4, tag @8, load_time @40, created_by_uid @48,
    // nr_map_ids @52, name[16] @64.
    let tag = info
        .get(8..16)?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = info.get(64..80)?;
    let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
    let nr_maps = get_u32(info, 52)? as usize;
    Some(ProgInfo {
        id: get_u32(info, 4)?,
        prog_type: prog_type_name(get_u32(info, 0)?),
        name: String::from_utf8_lossy(&name[..end]).into_owned(),
        tag,
        load_time_ns: get_u64(info, 40)?,
        loaded_at_unix: None,
        created_by_uid: get_u32(info, 48)?,
        map_ids: map_ids[..nr_maps.min(map_ids.len())].to_vec(),
        pinned: Vec::new(),
        agent: None,
        holders: Vec::new(),
        cilium_metrics: None,
    })
}

/// Program `id`'s info from the kernel (without pins, agent, holders).
pub fn prog_info(id: u32) -> Result<ProgInfo> {
    let fd = prog_fd(id)?;
    let mut maps = vec![0u32; MAX_PROGS];
    let mut info = vec![0u8; INFO_LEN];
    put_u32(&mut info, 52, maps.len() as u32);
    put_u64(&mut info, 56, maps.as_mut_ptr() as u64);
    let mut attr = [0u8; 16];
    put_u32(&mut attr, 0, fd.as_raw_fd() as u32);
    put_u32(&mut attr, 4, info.len() as u32);
    put_u64(&mut attr, 8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).with_context(|| format!("info of BPF program {id}"))?;
    let mut p = parse_prog_info(&info, &maps).context("short bpf_prog_info")?;
    p.loaded_at_unix = boot_ns_to_unix(p.load_time_ns);
    Ok(p)
}

/// CLOCK_BOOTTIME nanoseconds → seconds since the epoch, from the two
/// clocks read now.
fn boot_ns_to_unix(ns: u64) -> Option<u64> {
    // SAFETY: clock_gettime writes one timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let boot_now = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
    let since = boot_now.checked_sub(Duration::from_nanos(ns))?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    Some(now.checked_sub(since)?.as_secs())
}

/// BPF_PROG_QUERY (target @0, attach_type @4, query_flags @8, attach_flags
/// @12, prog_ids @16, count @24, prog_attach_flags @32, link_ids @40).
/// `Ok(None)`: the kernel does not know this hook (EINVAL).
fn query(
    target: u32,
    attach_type: u32,
    flags: u32,
    links: bool,
) -> Result<Option<Vec<AttachedProg>>> {
    let mut ids = vec![0u32; MAX_PROGS];
    let mut link_ids = vec![0u32; MAX_PROGS];
    let mut attr = [0u8; 64];
    put_u32(&mut attr, 0, target);
    put_u32(&mut attr, 4, attach_type);
    put_u32(&mut attr, 8, flags);
    put_u64(&mut attr, 16, ids.as_mut_ptr() as u64);
    put_u32(&mut attr, 24, ids.len() as u32);
    if links {
        put_u64(&mut attr, 40, link_ids.as_mut_ptr() as u64);
    }
    match bpf(BPF_PROG_QUERY, &mut attr) {
        Ok(_) => {}
        // link_ids came with tcx (6.6): an older kernel refuses any
        // attribute past the fields it knows (CHECK_ATTR) with EINVAL, so
        // a cgroup hook looked empty there (found on 6.1). Ask again
        // without it.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && links => {
            return query(target, attach_type, flags, false);
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(e).context("BPF_PROG_QUERY"),
    }
    let n = (get_u32(&attr, 24).unwrap_or(0) as usize).min(MAX_PROGS);
    let attach_flags = get_u32(&attr, 12).unwrap_or(0);
    Ok(Some(
        (0..n)
            .map(|i| AttachedProg {
                prog_id: ids[i],
                link_id: (links && link_ids[i] != 0).then_some(link_ids[i]),
                attach_flags,
            })
            .collect(),
    ))
}

/// Programs on a device's tcx hook (kernels 6.6+; `None` before), in the
/// calling thread's namespace (ifindex is per namespace).
pub fn tcx_progs(ifindex: u32, ingress: bool) -> Result<Option<Vec<AttachedProg>>> {
    let hook = if ingress {
        BPF_TCX_INGRESS
    } else {
        BPF_TCX_EGRESS
    };
    query(ifindex, hook, 0, true)
}

/// Programs on `cgroup`'s drop-capable hooks: attached there, or in force
/// there (`effective`: inherited from ancestors too). Hooks without
/// programs are left out.
pub fn cgroup_progs(cgroup: &Path, effective: bool) -> Result<Vec<CgroupHook>> {
    let dir = fs::File::open(cgroup).with_context(|| format!("{}", cgroup.display()))?;
    let flags = if effective { BPF_F_QUERY_EFFECTIVE } else { 0 };
    let mut out = Vec::new();
    for (ty, hook) in CGROUP_DROP_HOOKS {
        // Effective queries cannot return link ids.
        if let Some(progs) = query(dir.as_raw_fd() as u32, ty, flags, !effective)? {
            if !progs.is_empty() {
                out.push(CgroupHook {
                    hook: hook.to_string(),
                    progs,
                });
            }
        }
    }
    Ok(out)
}

/// The cgroup (v2) of a process, as a path under the cgroup2 mount.
pub fn cgroup_of(pid: u32) -> Option<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    Some(cgroup2_mount(&info)?.join(rel.trim_start_matches('/')))
}

/// Where cgroup2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on
/// hybrid hosts), from mountinfo: `... MOUNTPOINT OPTIONS ... - FSTYPE ...`.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (mount, fs) = l.split_once(" - ")?;
        (fs.split_whitespace().next()? == "cgroup2")
            .then(|| mount.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// Program ids pinned under a bpffs root: a program's own pin, or a link's
/// (tcx, XDP and cgroup links are pinned by agents to survive restarts).
#[derive(Debug, Default)]
pub struct PinIndex {
    pub by_prog: HashMap<u32, Vec<String>>,
    /// The scan stopped at its limit.
    pub truncated: bool,
}

/// Bounds of one pin scan.
pub const PIN_SCAN_MAX_ENTRIES: usize = 20_000;
pub const PIN_SCAN_MAX_DEPTH: usize = 8;

impl PinIndex {
    /// Walks `root` (normally /sys/fs/bpf), opening each pinned object once.
    pub fn scan(root: &Path) -> Self {
        let mut idx = PinIndex::default();
        let mut seen = 0usize;
        let mut stack = vec![(root.to_path_buf(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                seen += 1;
                if seen > PIN_SCAN_MAX_ENTRIES {
                    idx.truncated = true;
                    return idx;
                }
                let path = e.path();
                match e.file_type() {
                    Ok(t) if t.is_dir() && depth < PIN_SCAN_MAX_DEPTH => {
                        stack.push((path, depth + 1))
                    }
                    Ok(t) if t.is_file() => {
                        if let Some(id) = pinned_prog_id(&path) {
                            idx.by_prog
                                .entry(id)
                                .or_default()
                                .push(path.display().to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        for v in idx.by_prog.values_mut() {
            v.sort();
        }
        idx
    }

    pub fn paths(&self, prog_id: u32) -> Vec<String> {
        self.by_prog.get(&prog_id).cloned().unwrap_or_default()
    }
}

/// The program a pinned object is or holds (BPF_OBJ_GET: pathname @0,
/// file_flags @12; then prog_id from the fd's fdinfo). Maps give None.
fn pinned_prog_id(path: &Path) -> Option<u32> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut attr = [0u8; 16];
    put_u64(&mut attr, 0, c.as_ptr() as u64);
    let fd = bpf(BPF_OBJ_GET, &mut attr).ok()?;
    // SAFETY: a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // /proc/thread-self: the fd table is shared, but be exact about whose.
    let info = fs::read_to_string(format!("/proc/thread-self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    super::procs::fdinfo_prog_id(&info)
}

/// Which agent a program belongs to. Conventions, from the agents' sources:
/// Cilium names its entry programs `cil_*` (pkg/datapath/loader/loader.go:
/// cil_from_container, cil_from_netdev, cil_xdp_entry, ...) and pins links
/// under /sys/fs/bpf/cilium (devices/<dev>/links, endpoints/<id>/links:
/// pkg/datapath/loader/paths.go); Calico names its programs `calico_*` /
/// `cali_*` (felix/bpf-gpl) and pins under /sys/fs/bpf/tc/globals and
/// /sys/fs/bpf/tcx (felix/bpf/bpfdefs/defs.go). /sys/fs/bpf/tc/globals
/// alone is iproute2's default and names nobody.
pub fn attribute(name: &str, pinned: &[String]) -> Option<Agent> {
    let agent = |n: &str, e: String| {
        Some(Agent {
            name: n.to_string(),
            evidence: e,
        })
    };
    if let Some(p) = pinned.iter().find(|p| p.starts_with("/sys/fs/bpf/cilium/")) {
        return agent("cilium", format!("pinned at {p}"));
    }
    if let Some(p) = pinned
        .iter()
        .find(|p| p.starts_with("/sys/fs/bpf/tcx/") || p.starts_with("/sys/fs/bpf/calico/"))
    {
        return agent("calico", format!("pinned at {p}"));
    }
    if name.starts_with("cil_") {
        return agent("cilium", format!("program name {name}"));
    }
    if name.starts_with("calico_") || name.starts_with("cali_") {
        return agent("calico", format!("program name {name}"));
    }
    None
}

/// Everything about program `id`: info, pins (from `pins`), agent, holders.
pub fn describe(id: u32, pins: &PinIndex, holders: &mut Holders) -> Result<ProgInfo> {
    let mut p = prog_info(id)?;
    p.pinned = pins.paths(id);
    p.agent = attribute(&p.name, &p.pinned);
    p.holders = holders.lookup(Held::BpfProg(id));
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prog_info() {
        let mut info = vec![0u8; INFO_LEN];
        put_u32(&mut info, 0, 3);
        put_u32(&mut info, 4, 77);
        info[8..16].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]);
        put_u64(&mut info, 40, 123);
        put_u32(&mut info, 48, 1000);
        put_u32(&mut info, 52, 2);
        info[64..72].copy_from_slice(b"cil_from");
        let p = parse_prog_info(&info, &[5, 6, 0]).unwrap();
        assert_eq!(
            (p.id, p.prog_type.as_str(), p.name.as_str()),
            (77, "sched_cls", "cil_from")
        );
        assert_eq!(p.tag, "deadbeef00010203");
        assert_eq!(
            (p.load_time_ns, p.created_by_uid, p.map_ids.clone()),
            (123, 1000, vec![5, 6])
        );
        // More map ids claimed than the buffer held: what is there.
        put_u32(&mut info, 52, 9);
        assert_eq!(parse_prog_info(&info, &[5]).unwrap().map_ids, vec![5]);
        assert_eq!(prog_type_name(6), "xdp");
        assert_eq!(prog_type_name(999), "prog_type 999");
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..100 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 41 + 13) as u8).collect();
            let _ = parse_prog_info(&junk, &[]);
        }
        assert_eq!(parse_prog_info(&[0; 70], &[]), None);
    }

    #[test]
    fn agents_from_pins_and_names() {
        let a = attribute(
            "tail_x",
            &["/sys/fs/bpf/cilium/devices/eth0/links/cil_from_netdev".into()],
        );
        assert_eq!(a.unwrap().name, "cilium");
        assert_eq!(attribute("cil_to_container", &[]).unwrap().name, "cilium");
        assert_eq!(attribute("calico_tc_main", &[]).unwrap().name, "calico");
        assert_eq!(
            attribute("x", &["/sys/fs/bpf/tcx/eth0_ingress".into()])
                .unwrap()
                .name,
            "calico"
        );
        assert_eq!(
            attribute("my_filter", &["/sys/fs/bpf/tc/globals/my_filter".into()]),
            None
        );
    }

    #[test]
    fn unknown_program_is_an_error() {
        // Id 0 never exists.
        assert!(prog_info(0).is_err());
        assert!(cgroup_progs(Path::new("/nonexistent-cgroup"), false).is_err());
        assert!(cgroup_of(std::process::id()).is_some_and(|p| p.is_dir()));
        let mi = "30 1 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n\
                  35 30 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(mi),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(cgroup2_mount("garbage\n - cgroup2\n"), None);
    }
}
