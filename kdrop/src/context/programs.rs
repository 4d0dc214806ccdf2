//! The node's side of two findings: the programs on one hook of a device
//! where a packet died (tc filters, tcx and XDP programs, each program
//! described with its pins, agent and holders), and whether a handshake's
//! request socket still waits in a listener's SYN queue.
use std::{net::SocketAddr, path::Path};

use anyhow::{bail, Result};

use super::{
    bpf_progs::{describe, PinIndex},
    listeners::{dump_sockets, TCP_SYN_RECV},
    netns::in_netns,
    procs::Holders,
    tc_filters::device_progs,
};
use crate::model::progs::HookProgs;

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
    let ids: Vec<u32> = h
        .tc
        .iter()
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
