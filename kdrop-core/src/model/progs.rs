//! What runs on a packet's path and can drop it: tc filters, tcx and XDP
//! programs of a device, cgroup programs, and what a BPF program is (id,
//! name, tag, pins, the agent that loaded it). Filled by
//! `context::tc_filters` and `context::bpf_progs`.
use serde::{Deserialize, Serialize};

use super::listen::ProcessRef;

/// One tc filter, named as `tc filter show dev DEV ingress|egress` names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcFilter {
    pub dev: String,
    pub ifindex: u32,
    /// `ingress` or `egress`.
    pub hook: String,
    /// `bpf`, `u32`, `matchall`, ...
    pub kind: String,
    pub pref: u16,
    /// As tc prints it: `all`, `ip`, `ipv6`, `arp`, `802.1Q`, or 0xNNNN.
    pub protocol: String,
    /// As tc prints it: `0x1` (cls_bpf and most kinds), `800::800` (u32).
    pub handle: String,
    pub chain: u32,
    pub bpf: Option<ClsBpf>,
}

/// cls_bpf details.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClsBpf {
    /// The program's verdict is the action (TCA_BPF_FLAG_ACT_DIRECT).
    pub direct_action: bool,
    /// eBPF: the program.
    pub prog_id: Option<u32>,
    /// TCA_BPF_NAME: what tc was given (object file and section, or pin).
    pub name: Option<String>,
    pub tag: Option<String>,
    /// Classic BPF: the bytecode as tc prints it (`N,code jt jf k,...`).
    pub bytecode: Option<String>,
    pub in_hw: bool,
}

/// The XDP program of one mode on a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XdpProg {
    /// `native` (driver), `generic` (skb) or `offload` (hardware).
    pub mode: String,
    pub prog_id: u32,
}

/// Everything on one device's packet path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProgs {
    pub dev: String,
    pub ifindex: u32,
    pub tc: Vec<TcFilter>,
    /// None: the kernel has no tcx (before 6.6).
    pub tcx_ingress: Option<Vec<AttachedProg>>,
    pub tcx_egress: Option<Vec<AttachedProg>>,
    pub xdp: Vec<XdpProg>,
}

/// A loaded BPF program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgInfo {
    pub id: u32,
    /// `sched_cls`, `xdp`, `cgroup_skb`, ... (`prog_type` N if unknown).
    pub prog_type: String,
    pub name: String,
    /// The program tag, 16 hex digits as bpftool and tc print it.
    pub tag: String,
    /// Nanoseconds since boot when it was loaded.
    pub load_time_ns: u64,
    /// The same as seconds since the epoch (derived from the boot time now).
    pub loaded_at_unix: Option<u64>,
    pub created_by_uid: u32,
    pub map_ids: Vec<u32>,
    /// bpffs paths of the program or of a link holding it.
    pub pinned: Vec<String>,
    /// The agent that loaded it, when its pins or name say so.
    pub agent: Option<Agent>,
    /// Processes with a descriptor of the program.
    pub holders: Vec<ProcessRef>,
    /// Cilium's drop counters, when one of the program's maps is Cilium's
    /// `cilium_metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cilium_metrics: Option<CiliumMetrics>,
}

/// Cilium's `cilium_metrics` map (bpf/lib/metrics.h: a per-CPU hash of
/// `struct metrics_key { __u8 reason; __u8 dir:2, pad:6; ... }` to
/// `struct metrics_value { __u64 count; __u64 bytes; }`, bpf/lib/common.h),
/// its drop counts summed over CPUs, now and at kdrop's previous read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiliumMetrics {
    pub map_id: u32,
    pub now: Vec<CiliumCount>,
    /// None: the first read of this map (the counts are since Cilium
    /// created it).
    pub before: Option<Vec<CiliumCount>>,
}

/// Packets Cilium counted for one drop reason and direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiliumCount {
    /// Cilium's drop reason (flow.proto `DropReason`: 133 POLICY_DENIED ...).
    pub reason: u8,
    /// 1 ingress, 2 egress (of the endpoint), 0 unknown.
    pub dir: u8,
    pub packets: u64,
}

/// Which agent a program belongs to, and what says so.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    /// `cilium` or `calico`.
    pub name: String,
    pub evidence: String,
}

/// One program attached at a hook (tcx, cgroup).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachedProg {
    pub prog_id: u32,
    /// The bpf link holding it (tcx and link-based cgroup attachments).
    pub link_id: Option<u32>,
    /// BPF_F_ALLOW_MULTI and friends, where the kernel reports them.
    pub attach_flags: u32,
}

/// Programs on one cgroup hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupHook {
    /// `ingress`, `egress`, `sock_create`, `connect4`, ...
    pub hook: String,
    pub progs: Vec<AttachedProg>,
}

/// The programs of one hook of a device where a packet died, described.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookProgs {
    pub dev: String,
    pub ifindex: u32,
    /// `ingress`, `egress` or `xdp`.
    pub hook: String,
    /// tc filters on the hook, in the order tc lists them.
    pub tc: Vec<TcFilter>,
    /// Programs on the hook (cls_bpf's, tcx's, XDP's), described.
    pub progs: Vec<ProgInfo>,
    /// tcx programs on the hook (ids).
    pub tcx: Vec<u32>,
    pub xdp: Vec<XdpProg>,
}

/// The cgroup programs on a socket's hook: its owner, its cgroup, and each
/// program in force there with the cgroup it is attached to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupProgs {
    pub owner: Option<ProcessRef>,
    /// The owner's cgroup (a path under the cgroup2 mount).
    pub cgroup: String,
    /// `egress`, `ingress`, ...
    pub hook: String,
    pub progs: Vec<CgroupProg>,
}

/// One program in force on a cgroup hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupProg {
    /// The cgroup it is attached to (the socket's or an ancestor).
    pub attached_to: String,
    /// The bpf link holding it, if attached through one.
    pub link_id: Option<u32>,
    pub prog: ProgInfo,
}
