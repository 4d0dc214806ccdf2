//! Programs that can drop (context::tc_filters, context::bpf_progs) read
//! from real attachments in a test namespace: a classic-BPF cls_bpf filter
//! that drops TCP SYNs, a u32 filter, an eBPF tc program loaded and pinned
//! here, a tcx link, an XDP program and a cgroup program. `tc`, `ip` and
//! `bpftool` are the oracles.
use std::{
    ffi::CString,
    net::TcpStream,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use integration_tests::{kernel_at_least, listen, raise_memlock_before_5_11, Pair};
use kdrop::context::{
    bpf_progs::{cgroup2_mount, cgroup_progs, describe, tcx_progs, PinIndex},
    in_netns,
    netns::ifindex,
    procs::Holders,
    tc_filters::device_progs_in,
};
use serde_json::Value;

/// Drops IPv4 TCP segments with SYN set and ACK clear (offsets from the
/// Ethernet header: cls_bpf pushes it back at ingress), else TC_ACT_UNSPEC.
const DROP_SYN: &str = "12,40 0 0 12,21 0 8 2048,48 0 0 23,21 0 6 6,40 0 0 20,69 4 0 8191,\
177 0 0 14,80 0 0 27,84 0 0 18,21 1 0 2,6 0 0 4294967295,6 0 0 2";

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> std::io::Result<i32> {
    // SAFETY: attr is valid for its length.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc as i32)
}

/// Loads `r0 = ret; exit` as a program of `prog_type` named `name`
/// (BPF_PROG_LOAD, include/uapi/linux/bpf.h).
fn load(prog_type: u32, name: &str, ret: i32) -> OwnedFd {
    let mut insns = vec![0xb7u8, 0, 0, 0];
    insns.extend_from_slice(&ret.to_le_bytes());
    insns.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    let license = CString::new("GPL").unwrap();
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&prog_type.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..48 + name.len()].copy_from_slice(name.as_bytes());
    let fd = bpf(5, &mut attr).unwrap_or_else(|e| panic!("loading {name}: {e}"));
    // SAFETY: a new descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn pin(fd: &OwnedFd, path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    bpf(6, &mut attr).unwrap_or_else(|e| panic!("pinning {}: {e}", path.display()));
}

/// A private bpffs instance, unmounted on drop.
struct Bpffs(PathBuf);

impl Bpffs {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("kdt{}-bpffs", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        run("mount", &["-t", "bpf", "bpf", dir.to_str().unwrap()]);
        Bpffs(dir)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A cgroup of the test's own, removed on drop.
struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `tc filter show` lines with a handle, as (pref, kind, protocol, chain,
/// handle, the whole line).
fn tc_show(ns: &str, dev: &str, hook: &str) -> Vec<(u16, String, String, u32, String, String)> {
    run("tc", &["-n", ns, "filter", "show", "dev", dev, hook])
        .lines()
        .filter(|l| l.starts_with("filter ") && (l.contains(" handle ") || l.contains(" fh ")))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let after = |k: &str| w[w.iter().position(|x| *x == k).unwrap() + 1].to_string();
            let pref_at = w.iter().position(|x| *x == "pref").unwrap();
            let handle = if l.contains(" fh ") {
                after("fh")
            } else {
                after("handle")
            };
            (
                after("pref").parse().unwrap(),
                w[pref_at + 2].to_string(),
                after("protocol"),
                after("chain").parse().unwrap(),
                handle,
                l.to_string(),
            )
        })
        .collect()
}

fn bpftool_prog(id: u32) -> Value {
    serde_json::from_str(&run(
        "bpftool",
        &["-j", "-f", "prog", "show", "id", &id.to_string()],
    ))
    .unwrap()
}

#[test]
fn tc_tcx_and_xdp_programs_as_tc_ip_and_bpftool_show_them() {
    raise_memlock_before_5_11();
    let p = Pair::new("dp1", 176);
    let ns = p.server.name.clone();
    let fs = Bpffs::new();
    run("tc", &["-n", &ns, "qdisc", "add", "dev", "s0", "clsact"]);
    run(
        "tc",
        &[
            "-n", &ns, "filter", "add", "dev", "s0", "ingress", "pref", "10", "protocol", "ip",
            "bpf", "da", "bytecode", DROP_SYN,
        ],
    );
    run(
        "tc",
        &[
            "-n", &ns, "filter", "add", "dev", "s0", "ingress", "pref", "20", "protocol", "ip",
            "u32", "match", "ip", "dport", "9", "0xffff", "flowid", "1:1",
        ],
    );
    // An eBPF program (TC_ACT_UNSPEC: continue) through a pin, on egress.
    let tc_prog = load(3, "kdt_tc_pass", -1);
    let tc_pin = fs.0.join("kdt_tc_pass");
    pin(&tc_prog, &tc_pin);
    run(
        "tc",
        &[
            "-n",
            &ns,
            "filter",
            "add",
            "dev",
            "s0",
            "egress",
            "pref",
            "5",
            "bpf",
            "da",
            "object-pinned",
            tc_pin.to_str().unwrap(),
        ],
    );
    // A tcx link on ingress (kernel 6.6+), made inside the namespace.
    let has_tcx = kernel_at_least(6, 6);
    let link = has_tcx.then(|| {
        let tcx_prog = load(3, "cil_from_netdev", -1);
        let tcx_fd = tcx_prog.as_raw_fd() as u32;
        in_netns(&p.server.path(), move || {
            let idx = ifindex("s0").unwrap();
            let mut attr = [0u8; 64];
            attr[0..4].copy_from_slice(&tcx_fd.to_ne_bytes());
            attr[4..8].copy_from_slice(&idx.to_ne_bytes());
            attr[8..12].copy_from_slice(&46u32.to_ne_bytes());
            bpf(28, &mut attr).map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .unwrap()
        .expect("tcx link")
    });
    // XDP (generic mode: XDP_PASS) through ip and a pin.
    let xdp_prog = load(6, "kdt_xdp_pass", 2);
    let xdp_pin = fs.0.join("kdt_xdp_pass");
    pin(&xdp_prog, &xdp_pin);
    run(
        "ip",
        &[
            "-n",
            &ns,
            "link",
            "set",
            "dev",
            "s0",
            "xdpgeneric",
            "pinned",
            xdp_pin.to_str().unwrap(),
        ],
    );

    // The SYN filter really drops: no handshake to the server.
    let _l = listen(&p.server, p.server_v4(7000));
    let to = p.server_v4(7000);
    let refused = in_netns(&p.client.path(), move || {
        TcpStream::connect_timeout(&to, Duration::from_millis(300))
    })
    .unwrap();
    assert!(refused.is_err(), "the SYN filter let a handshake through");

    let s0 = in_netns(&p.server.path(), || ifindex("s0"))
        .unwrap()
        .unwrap();
    let d = device_progs_in(&p.server.path(), s0).unwrap();
    assert_eq!(d.dev, "s0");
    for hook in ["ingress", "egress"] {
        let ours: Vec<_> =
            d.tc.iter()
                .filter(|f| f.hook == hook)
                .map(|f| {
                    (
                        f.pref,
                        f.kind.clone(),
                        f.protocol.clone(),
                        f.chain,
                        f.handle.clone(),
                    )
                })
                .collect();
        let tc: Vec<_> = tc_show(&ns, "s0", hook)
            .into_iter()
            .map(|(a, b, c, e, h, _)| (a, b, c, e, h))
            .collect();
        // Ingress: cls_bpf, u32's hash table and its key; egress: cls_bpf.
        assert_eq!(
            ours.len(),
            if hook == "ingress" { 3 } else { 1 },
            "{ours:?}"
        );
        assert_eq!(ours, tc, "{hook}");
    }
    let classic =
        d.tc.iter()
            .find(|f| f.pref == 10)
            .unwrap()
            .bpf
            .clone()
            .unwrap();
    assert!(classic.direct_action && classic.prog_id.is_none());
    let line = &tc_show(&ns, "s0", "ingress")[0].5;
    assert!(
        line.contains(&format!(
            "bytecode '{}'",
            classic.bytecode.as_ref().unwrap()
        )),
        "{line}"
    );
    let ebpf =
        d.tc.iter()
            .find(|f| f.pref == 5)
            .unwrap()
            .bpf
            .clone()
            .unwrap();
    let id = ebpf.prog_id.expect("eBPF filter's program id");
    let line = &tc_show(&ns, "s0", "egress")[0].5;
    assert!(line.contains(&format!(" id {id} ")), "{line}");
    assert!(
        line.contains(&format!(" tag {} ", ebpf.tag.as_ref().unwrap())),
        "{line}"
    );

    // The program behind the filter, as bpftool knows it.
    let pins = PinIndex::scan(&fs.0);
    let mut holders = Holders::new();
    let info = describe(id, &pins, &mut holders).unwrap();
    let bt = bpftool_prog(id);
    assert_eq!(info.name, bt["name"].as_str().unwrap());
    assert_eq!(info.tag, bt["tag"].as_str().unwrap());
    assert_eq!(info.prog_type, bt["type"].as_str().unwrap());
    assert_eq!(u64::from(info.created_by_uid), bt["uid"].as_u64().unwrap());
    assert_eq!(info.pinned, vec![tc_pin.display().to_string()]);
    let loaded = bt["loaded_at"].as_u64().unwrap();
    assert!(
        info.loaded_at_unix.unwrap().abs_diff(loaded) <= 1,
        "{info:?} vs {bt}"
    );
    assert_eq!(info.agent, None);
    assert_eq!(
        info.holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
        vec![std::process::id()]
    );

    if has_tcx {
        // tcx: the link and its program; the program's name says Cilium.
        let tcx = in_netns(&p.server.path(), move || tcx_progs(s0, true))
            .unwrap()
            .unwrap()
            .expect("tcx since 6.6");
        assert_eq!(d.tcx_ingress.as_ref(), Some(&tcx));
        assert_eq!(tcx.len(), 1);
        let link_info: Value = serde_json::from_str(&run(
            "bpftool",
            &[
                "-j",
                "link",
                "show",
                "id",
                &tcx[0].link_id.unwrap().to_string(),
            ],
        ))
        .unwrap();
        assert_eq!(
            link_info["prog_id"].as_u64(),
            Some(u64::from(tcx[0].prog_id))
        );
        let tcx_info = describe(tcx[0].prog_id, &pins, &mut holders).unwrap();
        assert_eq!(tcx_info.agent.map(|a| a.name), Some("cilium".to_string()));
        assert_eq!(d.tcx_egress, Some(vec![]));
    } else {
        assert_eq!((d.tcx_ingress.clone(), d.tcx_egress.clone()), (None, None));
    }

    // XDP: mode and program as ip shows them.
    let ipd = run("ip", &["-n", &ns, "-d", "link", "show", "s0"]);
    assert_eq!(d.xdp.len(), 1, "{d:?}");
    assert_eq!(d.xdp[0].mode, "generic");
    assert!(
        ipd.contains(&format!("prog/xdp id {} ", d.xdp[0].prog_id)) && ipd.contains("xdpgeneric"),
        "{ipd}"
    );
    assert_eq!(
        pins.paths(d.xdp[0].prog_id),
        vec![xdp_pin.display().to_string()]
    );
    drop(link);
}

/// What is attached to the cgroup at `path` (opened as `dir`), as
/// (bpftool's attach type name, program id): `bpftool cgroup show`, the
/// oracle. Debian's bpftool 7.1 asks each attach type with
/// `prog_attach_flags` set, a field of BPF_PROG_QUERY that 6.0 added
/// (BPF_LSM_CGROUP); an older kernel refuses non-zero bytes past the
/// attr it knows (E2BIG), for every type, and bpftool then exits 255
/// printing `[]` (Debian's 5.10). There the oracle is the kernel's answer
/// to the query as it has been since 4.15, asked here for both inet hooks
/// (not through kdrop's code).
fn attached_as_bpftool_shows(path: &Path, dir: &std::fs::File) -> Vec<(String, u64)> {
    let out = Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(path)
        .output()
        .unwrap();
    if !out.status.success() {
        assert!(!kernel_at_least(6, 0), "bpftool cgroup show: {out:?}");
        return [(0u32, "cgroup_inet_ingress"), (1, "cgroup_inet_egress")]
            .into_iter()
            .flat_map(|(attach_type, name)| {
                // BPF_PROG_QUERY: target_fd, attach_type, query_flags,
                // attach_flags (out), prog_ids, prog_cnt (in/out).
                let mut ids = [0u32; 16];
                let mut attr = [0u8; 32];
                attr[0..4].copy_from_slice(&(dir.as_raw_fd() as u32).to_ne_bytes());
                attr[4..8].copy_from_slice(&attach_type.to_ne_bytes());
                attr[16..24].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
                attr[24..28].copy_from_slice(&(ids.len() as u32).to_ne_bytes());
                bpf(16, &mut attr).unwrap();
                let n = u32::from_ne_bytes(attr[24..28].try_into().unwrap()) as usize;
                ids[..n]
                    .iter()
                    .map(|id| (name.to_string(), u64::from(*id)))
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    let bt: Value = serde_json::from_slice(&out.stdout).unwrap();
    bt.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["attach_type"].as_str().unwrap().to_string(),
                e["id"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn cgroup_programs_as_bpftool_shows_them() {
    raise_memlock_before_5_11();
    let root = cgroup2_mount(&std::fs::read_to_string("/proc/self/mountinfo").unwrap())
        .expect("cgroup2 mounted");
    let cg = Cgroup(root.join(format!("kdt{}-dp2", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    let prog = load(8, "kdt_cg_allow", 1);
    let dir = std::fs::File::open(&cg.0).unwrap();
    // BPF_PROG_ATTACH: target_fd, attach_bpf_fd, attach_type (0: ingress), flags (2: multi).
    let mut attr = [0u8; 32];
    attr[0..4].copy_from_slice(&(dir.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    attr[12..16].copy_from_slice(&2u32.to_ne_bytes());
    bpf(8, &mut attr).unwrap();

    let hooks = cgroup_progs(&cg.0, false).unwrap();
    let bt = attached_as_bpftool_shows(&cg.0, &dir);
    assert_eq!(bt.len(), 1, "{bt:?}");
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0].hook, "ingress");
    assert_eq!(bt[0].0, "cgroup_inet_ingress");
    assert_eq!(u64::from(hooks[0].progs[0].prog_id), bt[0].1);
    // In force there, and in a child (effective), but attached to neither parent.
    let child = Cgroup(cg.0.join("child"));
    std::fs::create_dir(&child.0).unwrap();
    assert!(cgroup_progs(&child.0, false).unwrap().is_empty());
    let eff = cgroup_progs(&child.0, true).unwrap();
    assert_eq!(eff.len(), 1);
    assert_eq!(eff[0].progs[0].prog_id, hooks[0].progs[0].prog_id);
    // Detach (BPF_PROG_DETACH: no flags) so the cgroups can go.
    attr[12..16].fill(0);
    bpf(9, &mut attr).unwrap();
    assert!(cgroup_progs(&cg.0, false).unwrap().is_empty());
    drop(child);
}
