//! The node's side of two findings: the programs on one hook of a device
//! where a packet died (tc filters, tcx and XDP programs, each program
//! described with its pins, agent and holders), and whether a handshake's
//! request socket still waits in a listener's SYN queue.
use std::{net::SocketAddr, path::Path};

use anyhow::{bail, Result};

use super::{
    bpf_progs::{cgroup_of, cgroup_progs, describe, PinIndex},
    listeners::{diag_request, dump_sockets, parse_diag_msg, TCP_SYN_RECV},
    netlink::{Socket, AF_INET, AF_INET6, NLM_F_DUMP},
    netns::in_netns,
    procs::{Held, Holders},
    tc_filters::device_progs,
};
use crate::model::progs::{CgroupProg, CgroupProgs, HookProgs};

/// Where agents and tools pin BPF objects.
const BPFFS: &str = "/sys/fs/bpf";
/// `TCP_NEW_SYN_RECV` (include/net/tcp_states.h): request sockets.
const TCP_NEW_SYN_RECV: u8 = 12;

/// The programs on `hook` (`ingress`, `egress`, `xdp`) of device `ifindex`
/// of the namespace at `netns`.
pub fn hook_progs(
    netns: &Path,
    ifindex: u32,
    hook: &str,
    holders: &mut Holders,
) -> Result<HookProgs> {
    let dp = in_netns(netns, move || device_progs(ifindex))??;
    let mut h = HookProgs {
        dev: dp.dev.clone(),
        ifindex,
        hook: hook.to_string(),
        ..HookProgs::default()
    };
    match hook {
        "ingress" | "egress" => {
            h.tc = dp.tc.into_iter().filter(|f| f.hook == hook).collect();
            let tcx = if hook == "ingress" {
                dp.tcx_ingress
            } else {
                dp.tcx_egress
            };
            h.tcx = tcx.unwrap_or_default().iter().map(|p| p.prog_id).collect();
        }
        "xdp" => h.xdp = dp.xdp,
        other => bail!("no hook {other}"),
    }
    let ids: Vec<u32> =
        h.tc.iter()
            .filter_map(|f| f.bpf.as_ref()?.prog_id)
            .chain(h.tcx.iter().copied())
            .chain(h.xdp.iter().map(|x| x.prog_id))
            .collect();
    if !ids.is_empty() {
        let pins = PinIndex::scan(Path::new(BPFFS));
        h.progs = ids
            .iter()
            .filter_map(|id| {
                describe(*id, &pins, holders)
                    .map_err(|e| log::debug!("BPF program {id}: {e:#}"))
                    .ok()
            })
            .collect();
    }
    Ok(h)
}

/// Does a request socket `local` <- `remote` wait in the namespace at
/// `netns` (sock_diag dumps request sockets as SYN_RECV)?
pub fn request_pending(netns: &Path, local: SocketAddr, remote: SocketAddr) -> Result<bool> {
    let socks = in_netns(netns, dump_sockets)??;
    Ok(socks.iter().any(|s| {
        (s.state == TCP_SYN_RECV || s.state == TCP_NEW_SYN_RECV)
            && s.local == local
            && s.remote == remote
    }))
}

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// Ancestors walked from a socket's cgroup towards the root.
const MAX_CGROUP_DEPTH: usize = 32;

/// The inode of the TCP socket bound to `local`, any state, in the calling
/// thread's namespace.
fn socket_inode(local: SocketAddr) -> Result<Option<u64>> {
    let sock = Socket::open_protocol(NETLINK_SOCK_DIAG, 0, false)?;
    let family = if local.is_ipv4() { AF_INET } else { AF_INET6 };
    let msgs = sock
        .request(SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, &diag_request(family, !0))?
        .map_err(std::io::Error::from_raw_os_error)?;
    Ok(msgs
        .iter()
        .filter_map(|p| parse_diag_msg(p))
        .find(|s| s.local == local && s.inode != 0)
        .map(|s| s.inode))
}

/// The programs in force on `hook` for the socket bound to `local` in the
/// namespace at `netns`: its owner's cgroup and each ancestor's attachments
/// (BPF_PROG_QUERY without EFFECTIVE names where each is attached).
pub fn socket_cgroup_progs(
    netns: &Path,
    local: SocketAddr,
    hook: &str,
    holders: &mut Holders,
) -> Result<Option<CgroupProgs>> {
    let Some(inode) = in_netns(netns, move || socket_inode(local))?? else {
        return Ok(None);
    };
    let owner = holders.lookup(Held::Socket(inode)).into_iter().next();
    let Some(cgroup) = owner.as_ref().and_then(|o| cgroup_of(o.pid)) else {
        return Ok(None);
    };
    let pins = PinIndex::scan(Path::new(BPFFS));
    let mut progs = Vec::new();
    let mut dir = Some(cgroup.as_path());
    for _ in 0..MAX_CGROUP_DEPTH {
        let Some(d) = dir else { break };
        // Above the cgroup2 mount the query fails: the walk ends there.
        let Ok(hooks) = cgroup_progs(d, false) else {
            break;
        };
        for a in hooks
            .iter()
            .filter(|h| h.hook == hook)
            .flat_map(|h| &h.progs)
        {
            match describe(a.prog_id, &pins, holders) {
                Ok(prog) => progs.push(CgroupProg {
                    attached_to: d.display().to_string(),
                    link_id: a.link_id,
                    prog,
                }),
                Err(e) => log::debug!("BPF program {}: {e:#}", a.prog_id),
            }
        }
        dir = d.parent();
    }
    Ok(Some(CgroupProgs {
        owner,
        cgroup: cgroup.display().to_string(),
        hook: hook.to_string(),
        progs,
    }))
}
