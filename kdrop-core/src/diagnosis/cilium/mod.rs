//! A drop by Cilium's datapath: a packet its tc program dropped (the
//! kernel says TC_INGRESS or TC_EGRESS, kdrop names the program), with
//! Cilium's own reason from its `cilium_metrics` map: the reason and
//! direction whose count grew since kdrop's previous read (or, at the first
//! read, the only one counted). A policy reason becomes a finding in
//! Kubernetes terms (finding.rs). Cilium's reasons are its API's
//! (api/v1/flow/flow.proto `DropReason`, the codes its datapath writes:
//! bpf/lib/common.h `DROP_*`).
pub mod finding;

use super::netpol::Direction;
use crate::model::progs::{CiliumCount, CiliumMetrics, HookProgs, ProgInfo};

/// flow.proto's `DropReason` names (Hubble's), by code.
const REASONS: &[(u8, &str)] = &[
    (130, "INVALID_SOURCE_MAC"),
    (131, "INVALID_DESTINATION_MAC"),
    (132, "INVALID_SOURCE_IP"),
    (133, "POLICY_DENIED"),
    (134, "INVALID_PACKET_DROPPED"),
    (135, "CT_TRUNCATED_OR_INVALID_HEADER"),
    (136, "CT_MISSING_TCP_ACK_FLAG"),
    (137, "CT_UNKNOWN_L4_PROTOCOL"),
    (138, "CT_CANNOT_CREATE_ENTRY_FROM_PACKET"),
    (139, "UNSUPPORTED_L3_PROTOCOL"),
    (140, "MISSED_TAIL_CALL"),
    (141, "ERROR_WRITING_TO_PACKET"),
    (142, "UNKNOWN_L4_PROTOCOL"),
    (143, "UNKNOWN_ICMPV4_CODE"),
    (144, "UNKNOWN_ICMPV4_TYPE"),
    (145, "UNKNOWN_ICMPV6_CODE"),
    (146, "UNKNOWN_ICMPV6_TYPE"),
    (147, "ERROR_RETRIEVING_TUNNEL_KEY"),
    (148, "ERROR_RETRIEVING_TUNNEL_OPTIONS"),
    (149, "INVALID_GENEVE_OPTION"),
    (150, "UNKNOWN_L3_TARGET_ADDRESS"),
    (151, "STALE_OR_UNROUTABLE_IP"),
    (152, "NO_MATCHING_LOCAL_CONTAINER_FOUND"),
    (153, "ERROR_WHILE_CORRECTING_L3_CHECKSUM"),
    (154, "ERROR_WHILE_CORRECTING_L4_CHECKSUM"),
    (155, "CT_MAP_INSERTION_FAILED"),
    (156, "INVALID_IPV6_EXTENSION_HEADER"),
    (157, "IP_FRAGMENTATION_NOT_SUPPORTED"),
    (158, "SERVICE_BACKEND_NOT_FOUND"),
    (160, "NO_TUNNEL_OR_ENCAPSULATION_ENDPOINT"),
    (161, "FAILED_TO_INSERT_INTO_PROXYMAP"),
    (162, "REACHED_EDT_RATE_LIMITING_DROP_HORIZON"),
    (163, "UNKNOWN_CONNECTION_TRACKING_STATE"),
    (164, "LOCAL_HOST_IS_UNREACHABLE"),
    (165, "NO_CONFIGURATION_AVAILABLE_TO_PERFORM_POLICY_DECISION"),
    (166, "UNSUPPORTED_L2_PROTOCOL"),
    (167, "NO_MAPPING_FOR_NAT_MASQUERADE"),
    (168, "UNSUPPORTED_PROTOCOL_FOR_NAT_MASQUERADE"),
    (169, "FIB_LOOKUP_FAILED"),
    (170, "ENCAPSULATION_TRAFFIC_IS_PROHIBITED"),
    (171, "INVALID_IDENTITY"),
    (172, "UNKNOWN_SENDER"),
    (173, "NAT_NOT_NEEDED"),
    (174, "IS_A_CLUSTERIP"),
    (175, "FIRST_LOGICAL_DATAGRAM_FRAGMENT_NOT_FOUND"),
    (176, "FORBIDDEN_ICMPV6_MESSAGE"),
    (177, "DENIED_BY_LB_SRC_RANGE_CHECK"),
    (178, "SOCKET_LOOKUP_FAILED"),
    (179, "SOCKET_ASSIGN_FAILED"),
    (180, "PROXY_REDIRECTION_NOT_SUPPORTED_FOR_PROTOCOL"),
    (181, "POLICY_DENY"),
    (182, "VLAN_FILTERED"),
    (183, "INVALID_VNI"),
    (184, "INVALID_TC_BUFFER"),
    (185, "NO_SID"),
    (186, "MISSING_SRV6_STATE"),
    (187, "NAT46"),
    (188, "NAT64"),
    (189, "AUTH_REQUIRED"),
    (190, "CT_NO_MAP_FOUND"),
    (191, "SNAT_NO_MAP_FOUND"),
    (192, "INVALID_CLUSTER_ID"),
    (193, "UNSUPPORTED_PROTOCOL_FOR_DSR_ENCAP"),
    (194, "NO_EGRESS_GATEWAY"),
    (196, "TTL_EXCEEDED"),
    (197, "NO_NODE_ID"),
];

/// No policy allowed it (no allow rule for the peer's identity and port).
pub const POLICY_DENIED: u8 = 133;
/// A deny rule (`ingressDeny`/`egressDeny`) matched.
pub const POLICY_DENY: u8 = 181;
/// An allow rule requires mutual authentication not done yet.
pub const AUTH_REQUIRED: u8 = 189;

pub fn reason_name(code: u8) -> Option<&'static str> {
    REASONS.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// How kdrop knows Cilium's reason for this drop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Counted {
    /// The count grew from `from` to `to` since kdrop's previous read.
    Grew { from: u64, to: u64 },
    /// The first read of the map: the only reason counted, `total` packets
    /// since Cilium created the map.
    OnlyOne { total: u64 },
}

/// A Cilium drop, read from the program and its metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CiliumDrop {
    pub prog: ProgInfo,
    pub dev: String,
    /// The tc hook (`ingress`, `egress`) the program is on.
    pub hook: String,
    pub reason: u8,
    /// The endpoint's direction Cilium counted it in.
    pub direction: Option<Direction>,
    pub map_id: u32,
    pub counted: Counted,
}

impl CiliumDrop {
    pub fn reason_name(&self) -> String {
        reason_name(self.reason)
            .map_or_else(|| format!("drop reason {}", self.reason), String::from)
    }

    pub fn is_policy(&self) -> bool {
        matches!(self.reason, POLICY_DENIED | POLICY_DENY | AUTH_REQUIRED)
    }
}

/// The counts that grew since the read before, or, at the first read, the
/// nonzero ones, with how kdrop knows.
fn moved(m: &CiliumMetrics) -> Vec<(CiliumCount, Counted)> {
    match &m.before {
        Some(before) => m
            .now
            .iter()
            .filter_map(|c| {
                let from = before
                    .iter()
                    .find(|b| (b.reason, b.dir) == (c.reason, c.dir))
                    .map_or(0, |b| b.packets);
                (c.packets > from).then_some((
                    *c,
                    Counted::Grew {
                        from,
                        to: c.packets,
                    },
                ))
            })
            .collect(),
        None => m
            .now
            .iter()
            .filter(|c| c.packets > 0)
            .map(|c| (*c, Counted::OnlyOne { total: c.packets }))
            .collect(),
    }
}

/// Cilium's drop on this hook: its program's metrics map names one reason
/// (one that moved; of several, the one policy reason among them).
pub fn classify(h: &HookProgs) -> Option<CiliumDrop> {
    let prog = h.progs.iter().find(|p| {
        p.cilium_metrics.is_some() && p.agent.as_ref().is_some_and(|a| a.name == "cilium")
    })?;
    let m = prog.cilium_metrics.as_ref()?;
    let moved = moved(m);
    let (count, counted) = match moved.as_slice() {
        [one] => one.clone(),
        several => {
            let mut policy = several
                .iter()
                .filter(|(c, _)| matches!(c.reason, POLICY_DENIED | POLICY_DENY | AUTH_REQUIRED));
            match (policy.next(), policy.next()) {
                (Some(p), None) => p.clone(),
                _ => return None,
            }
        }
    };
    let direction = match count.dir {
        1 => Some(Direction::Ingress),
        2 => Some(Direction::Egress),
        // From the program: into the pod (`cil_to_container`) is its
        // ingress, out of it (`cil_from_container`) its egress.
        _ if prog.name.starts_with("cil_to_contain") => Some(Direction::Ingress),
        _ if prog.name.starts_with("cil_from_conta") => Some(Direction::Egress),
        _ => None,
    };
    Some(CiliumDrop {
        prog: prog.clone(),
        dev: h.dev.clone(),
        hook: h.hook.clone(),
        reason: count.reason,
        direction,
        map_id: m.map_id,
        counted,
    })
}

#[cfg(test)]
mod tests;
