//! A stand-in for Cilium's datapath where Cilium cannot run: a tc program
//! named as Cilium names the one on a pod's host veth
//! (`cil_from_container`, truncated by the kernel to 15 characters as
//! Cilium's is), attached by tcx (Cilium's attachment on 6.6+), that drops
//! IPv4 TCP SYNs to one port and counts them in a map named and shaped
//! as Cilium's `cilium_metrics` (bpf/lib/metrics.h: BPF_MAP_TYPE_PERCPU_HASH,
//! `struct metrics_key` of 8 bytes, `reason` at byte 0, `dir:2` at byte 1;
//! `struct metrics_value { __u64 count; __u64 bytes; }`), with the reason
//! Cilium's policy drop writes: DROP_POLICY (133), egress (2).
use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use kdrop::context::{in_netns, netns::ifindex};

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> std::io::Result<i32> {
    // SAFETY: attr is valid for its length.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc as i32)
}

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: a new descriptor the kernel gave us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// One instruction: opcode, dst and src registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut i = [0u8; 8];
    i[0] = code;
    i[1] = (src << 4) | dst;
    i[2..4].copy_from_slice(&off.to_le_bytes());
    i[4..8].copy_from_slice(&imm.to_le_bytes());
    i
}

/// Cilium's drop reason for "no policy allowed it" and the egress
/// direction, as `struct metrics_key`'s first two bytes.
pub const POLICY_DENIED: u8 = 133;
pub const EGRESS: u8 = 2;

/// The program, map and attachment; dropping it detaches and frees them.
pub struct CiliumStandIn {
    pub map: OwnedFd,
    pub prog: OwnedFd,
    _attached: Attached,
}

/// How the program is attached: a tcx link (6.6+), or, as Cilium does on
/// older kernels, a direct-action cls_bpf filter on a clsact qdisc.
enum Attached {
    Tcx(#[allow(dead_code)] OwnedFd),
    Tc { netns: PathBuf, dev: String },
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Attached::Tc { netns, dev } = self {
            let _ = tc(netns, &["qdisc", "del", "dev", dev, "clsact"]);
        }
    }
}

/// `tc` in the namespace at `netns`.
fn tc(netns: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
    std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .arg("tc")
        .args(args)
        .output()
}

/// Attaches `prog` to `dev`'s tc ingress with cls_bpf (kernels before
/// tcx, 6.6): pinned in a bpffs of its own for `tc ... object-pinned`, the
/// pin gone once the filter holds the program.
fn attach_cls_bpf(prog: &OwnedFd, netns: &Path, dev: &str) -> Attached {
    let dir = std::env::temp_dir().join(format!("kdt{}-cilium-bpffs", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting bpffs at {}", dir.display());
    let pin = dir.join("cil_from_container");
    let c = CString::new(pin.to_str().unwrap()).unwrap();
    // BPF_OBJ_PIN: pathname @0, bpf_fd @8.
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    let pinned = bpf(6, &mut attr);
    let run = |args: &[&str]| {
        let out = tc(netns, args).unwrap();
        assert!(
            out.status.success(),
            "tc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    if pinned.is_ok() {
        run(&["qdisc", "add", "dev", dev, "clsact"]);
        run(&[
            "filter",
            "add",
            "dev",
            dev,
            "ingress",
            "pref",
            "1",
            "bpf",
            "da",
            "object-pinned",
            pin.to_str().unwrap(),
        ]);
    }
    let _ = std::fs::remove_file(&pin);
    let _ = std::process::Command::new("umount").arg(&dir).status();
    let _ = std::fs::remove_dir(&dir);
    pinned.expect("pinning the stand-in");
    Attached::Tc {
        netns: netns.to_path_buf(),
        dev: dev.to_string(),
    }
}

impl CiliumStandIn {
    /// Attaches to tc ingress (tcx) of `dev` in the namespace at `netns`:
    /// packets from the pod behind that host veth, its egress.
    pub fn attach(netns: &Path, dev: &str, dport: u16) -> Self {
        Self::attach_by(netns, dev, dport, true)
    }

    /// As `attach`, by cls_bpf even where tcx exists (Cilium's
    /// `--enable-tcx=false`): the older kernels' attachment, on this one.
    pub fn attach_by_tc(netns: &Path, dev: &str, dport: u16) -> Self {
        Self::attach_by(netns, dev, dport, false)
    }

    fn attach_by(netns: &Path, dev: &str, dport: u16, tcx: bool) -> Self {
        // Its own map and program: charged to RLIMIT_MEMLOCK before 5.11
        // (5.10's whole suite: EPERM creating the map).
        crate::raise_memlock_before_5_11();
        // BPF_MAP_CREATE: type @0, key @4, value @8, max_entries @12,
        // map_flags @16, inner_map_fd @20, numa_node @24, map_name[16] @28.
        let mut attr = [0u8; 72];
        attr[0..4].copy_from_slice(&5u32.to_ne_bytes()); // PERCPU_HASH
        attr[4..8].copy_from_slice(&8u32.to_ne_bytes());
        attr[8..12].copy_from_slice(&16u32.to_ne_bytes());
        attr[12..16].copy_from_slice(&1024u32.to_ne_bytes());
        attr[28..28 + 14].copy_from_slice(b"cilium_metrics");
        let map = owned(bpf(0, &mut attr).expect("cilium_metrics map"));
        let fd = map.as_raw_fd();
        let port = i32::from(dport.swap_bytes()); // as a u16 load reads it
        let key = i32::from(POLICY_DENIED) | (i32::from(EGRESS) << 8);
        let ld_map = |dst: u8| {
            [
                insn(0x18, dst, 1, 0, fd), // BPF_LD_IMM64, BPF_PSEUDO_MAP_FD
                insn(0, 0, 0, 0, 0),
            ]
        };
        let mut p: Vec<[u8; 8]> = vec![
            insn(0x61, 2, 1, 76, 0),    // 0: r2 = skb->data
            insn(0x61, 3, 1, 80, 0),    // 1: r3 = skb->data_end
            insn(0xbf, 4, 2, 0, 0),     // 2: r4 = r2
            insn(0x07, 4, 0, 0, 54),    // 3: r4 += 54 (Ethernet, IPv4, TCP)
            insn(0x2d, 4, 3, 35, 0),    // 4: if r4 > r3 goto ok (40)
            insn(0x69, 5, 2, 12, 0),    // 5: r5 = ethertype
            insn(0x55, 5, 0, 33, 8),    // 6: if r5 != htons(0x0800) goto ok
            insn(0x71, 5, 2, 23, 0),    // 7: r5 = IPv4 protocol
            insn(0x55, 5, 0, 31, 6),    // 8: if r5 != TCP goto ok
            insn(0x71, 5, 2, 47, 0),    // 9: r5 = TCP flags
            insn(0x57, 5, 0, 0, 0x12),  // 10: r5 &= SYN|ACK
            insn(0x55, 5, 0, 28, 2),    // 11: if r5 != SYN goto ok
            insn(0x69, 5, 2, 36, 0),    // 12: r5 = TCP destination port
            insn(0x55, 5, 0, 26, port), // 13: if r5 != port goto ok
            insn(0xb7, 1, 0, 0, key),   // 14: r1 = metrics_key
            insn(0x7b, 10, 1, -8, 0),   // 15: *(u64 *)(r10 - 8) = r1
        ];
        p.extend(ld_map(1)); // 16-17
        p.extend([
            insn(0xbf, 2, 10, 0, 0),   // 18: r2 = r10
            insn(0x07, 2, 0, 0, -8),   // 19: r2 -= 8
            insn(0x85, 0, 0, 0, 1),    // 20: map_lookup_elem
            insn(0x15, 0, 0, 4, 0),    // 21: if r0 == 0 goto insert (26)
            insn(0x79, 1, 0, 0, 0),    // 22: r1 = value->count
            insn(0x07, 1, 0, 0, 1),    // 23: r1 += 1
            insn(0x7b, 0, 1, 0, 0),    // 24: value->count = r1
            insn(0x05, 0, 0, 12, 0),   // 25: goto drop (38)
            insn(0xb7, 1, 0, 0, 1),    // 26: insert: r1 = 1
            insn(0x7b, 10, 1, -24, 0), // 27: count = 1
            insn(0xb7, 1, 0, 0, 0),    // 28: r1 = 0
            insn(0x7b, 10, 1, -16, 0), // 29: bytes = 0
        ]);
        p.extend(ld_map(1)); // 30-31
        p.extend([
            insn(0xbf, 2, 10, 0, 0),  // 32: r2 = r10
            insn(0x07, 2, 0, 0, -8),  // 33: r2 -= 8 (key)
            insn(0xbf, 3, 10, 0, 0),  // 34: r3 = r10
            insn(0x07, 3, 0, 0, -24), // 35: r3 -= 24 (value)
            insn(0xb7, 4, 0, 0, 0),   // 36: r4 = BPF_ANY
            insn(0x85, 0, 0, 0, 2),   // 37: map_update_elem
            insn(0xb7, 0, 0, 0, 2),   // 38: drop: r0 = TC_ACT_SHOT
            insn(0x95, 0, 0, 0, 0),   // 39: exit
            insn(0xb7, 0, 0, 0, 0),   // 40: ok: r0 = TC_ACT_OK
            insn(0x95, 0, 0, 0, 0),   // 41: exit
        ]);
        let code: Vec<u8> = p.concat();
        let license = CString::new("GPL").unwrap();
        let mut log = vec![0u8; 65536];
        // BPF_PROG_LOAD: type @0, insn_cnt @4, insns @8, license @16,
        // log_level @24, log_size @28, log_buf @32, prog_name[16] @48,
        // expected_attach_type @68.
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&3u32.to_ne_bytes()); // SCHED_CLS
        attr[4..8].copy_from_slice(&(p.len() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
        attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
        attr[24..28].copy_from_slice(&1u32.to_ne_bytes());
        attr[28..32].copy_from_slice(&(log.len() as u32).to_ne_bytes());
        attr[32..40].copy_from_slice(&(log.as_mut_ptr() as u64).to_ne_bytes());
        attr[48..48 + 15].copy_from_slice(b"cil_from_contai");
        attr[68..72].copy_from_slice(&46u32.to_ne_bytes()); // BPF_TCX_INGRESS
        let prog = match bpf(5, &mut attr) {
            Ok(fd) => owned(fd),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                panic!(
                    "loading the stand-in: {e}\n{}",
                    String::from_utf8_lossy(&log[..end])
                )
            }
        };
        if !tcx {
            let attached = attach_cls_bpf(&prog, netns, dev);
            return CiliumStandIn {
                map,
                prog,
                _attached: attached,
            };
        }
        let prog_fd = prog.as_raw_fd() as u32;
        let name = dev.to_string();
        let link = in_netns(netns, move || {
            let idx = ifindex(&name).expect("the host veth");
            // BPF_LINK_CREATE: prog_fd @0, target_ifindex @4, attach_type @8.
            let mut attr = [0u8; 64];
            attr[0..4].copy_from_slice(&prog_fd.to_ne_bytes());
            attr[4..8].copy_from_slice(&idx.to_ne_bytes());
            attr[8..12].copy_from_slice(&46u32.to_ne_bytes());
            bpf(28, &mut attr).map(owned)
        })
        .unwrap();
        let attached = match link {
            Ok(link) => Attached::Tcx(link),
            // No tcx before v6.6 ("bpf: Add fd-based tcx multi-prog infra
            // with link support"): the attach type is unknown there.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => attach_cls_bpf(&prog, netns, dev),
            Err(e) => panic!("tcx link: {e}"),
        };
        CiliumStandIn {
            map,
            prog,
            _attached: attached,
        }
    }
}
