//! A dead handshake explained: hairpin without reverse NAT, asymmetric
//! return path, LB loopback, unanswered, SYN-ACK answered by a RST.
use std::net::IpAddr;

use super::tracker::{CtBits, Flow, Reset};
use crate::model::{
    finding::Finding,
    packet::{Ct, Tuple},
    routing::Tables,
};

/// A conntrack entry as evidence: both tuples and the status bits.
pub(crate) fn ct_text(ct: &Ct, status: &[String]) -> String {
    format!(
        "orig {} -> {}, reply {} -> {}, status [{}]",
        ct.orig.src,
        ct.orig.dst,
        ct.reply.src,
        ct.reply.dst,
        status.join(",")
    )
}

/// Bridge facts for the hairpin case, read from the namespace that did the
/// DNAT.
#[derive(Clone, Debug, Default)]
pub struct BridgeFacts {
    pub br_netfilter_loaded: bool,
    /// net.bridge.bridge-nf-call-iptables in that namespace (None: absent).
    pub call_iptables: Option<u32>,
}

/// A SYN-ACK refused (NO_SOCKET) whose tuple is the reply side of a DNAT'd
/// entry: the reply skipped de-NAT, so the client has no socket for it.
#[allow(clippy::too_many_arguments)]
pub fn hairpin(
    syn_ack: &Tuple,
    flow: &Flow,
    status: &[String],
    t: &Tables,
    bridge: &BridgeFacts,
    kernel: &str,
    dnat_ns: &str,
) -> Option<Finding> {
    let ct = flow.ct?;
    let (client, service, backend) = (ct.orig.src, ct.orig.dst, ct.reply.src);
    let port = t.link(flow.ifindex);
    let br = port
        .and_then(|p| p.master)
        .and_then(|m| t.link(m))
        .filter(|b| b.kind.as_deref() == Some("bridge"));
    let mut evidence = vec![
        kernel.to_string(),
        format!("conntrack: {}", ct_text(&ct, status)),
    ];
    let (same_bridge, br_name) = match (port, br) {
        (Some(p), Some(b)) => {
            let client_on_bridge = t
                .addrs
                .iter()
                .any(|a| a.index == b.index && same_subnet(a.addr, client.ip(), a.prefix_len));
            evidence.push(format!(
                "the DNAT'd SYN left by {}, a port of bridge {}{}",
                p.name,
                b.name,
                if client_on_bridge {
                    format!("; {} is on {}'s subnet too: the reply is bridged straight back, never routed", client.ip(), b.name)
                } else {
                    String::new()
                }
            ));
            (client_on_bridge, b.name.clone())
        }
        _ => (false, String::new()),
    };
    evidence.push(format!(
        "br_netfilter {}; net.bridge.bridge-nf-call-iptables = {}: bridged packets skip \
         netfilter, so the reply is not un-DNAT'd",
        if bridge.br_netfilter_loaded {
            "loaded"
        } else {
            "not loaded"
        },
        bridge
            .call_iptables
            .map_or("absent".to_string(), |v| v.to_string())
    ));
    let mut fix = Vec::new();
    if !bridge.br_netfilter_loaded && bridge.call_iptables.is_none() {
        fix.push("modprobe br_netfilter".to_string());
    }
    fix.push(format!(
        "{dnat_ns}sysctl -w net.bridge.bridge-nf-call-iptables=1"
    ));
    if same_bridge {
        fix.push(format!(
            "{dnat_ns}iptables -t nat -A POSTROUTING -s {} -d {}/32 -p tcp --dport {} -j MASQUERADE",
            client.ip(),
            backend.ip(),
            backend.port()
        ));
    }
    Some(Finding {
        cause: "hairpin_no_reverse_nat",
        summary: format!(
            "hairpin: the SYN-ACK from {} matches the reply side of a DNAT'd connection ({} -> {} => {}) but arrived un-NAT'd{}",
            syn_ack.src,
            client,
            service,
            backend,
            if br_name.is_empty() {
                String::new()
            } else {
                format!(": both ends are on bridge {br_name}")
            }
        ),
        evidence,
        fix,
    })
}

fn same_subnet(a: IpAddr, b: IpAddr, len: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let len = u32::from(len.min(32));
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(b) & mask
        }
        _ => false,
    }
}

fn transmissions(flow: &Flow) -> String {
    let secs = (flow.last_ns.saturating_sub(flow.first_ns)) as f64 / 1e9;
    if flow.syns == 1 {
        return "1 transmission of the SYN, not answered".into();
    }
    format!(
        "{} transmissions of the same SYN over {secs:.1}s, none answered",
        flow.syns
    )
}

/// Incident 4: this host's SYN to a VIP went to the load balancer, came back
/// in and was DNAT'd to a backend without SNAT.
pub fn looped_back(first: &Flow, back: &Flow, status: &[String], t: &Tables, ns: &str) -> Finding {
    let client = first.orig.src;
    let vip = first.orig.dst;
    let ct = back.ct.expect("a looped-back flow is DNAT'd");
    let backend = ct.reply.src;
    let out_dev = t.link_name(first.ifindex);
    let back_dev = t.link_name(back.ifindex);
    Finding {
        cause: "lb_loopback_without_snat",
        summary: format!(
            "SYN {client} -> {vip} left by {out_dev} to the load balancer, came back as {client} -> {} and was DNAT'd to {backend} without SNAT: the reply goes straight to {} and bypasses the load balancer",
            ct.orig.dst,
            client.ip()
        ),
        evidence: vec![
            format!("{} (to {vip}, out of {out_dev})", transmissions(first)),
            format!(
                "the same client address and port came back in: conntrack {} -> {}, reply {} -> {}, status [{}], sent out {back_dev}",
                ct.orig.src,
                ct.orig.dst,
                ct.reply.src,
                ct.reply.dst,
                status.join(",")
            ),
            format!(
                "no SNAT: {backend} answers {} directly from its own address, not from {vip}, so the client's socket never sees its SYN-ACK",
                client.ip()
            ),
        ],
        fix: vec![
            format!(
                "{ns}iptables -t nat -I PREROUTING -s {}/32 -d {}/32 -p tcp --dport {} -j DNAT --to-destination {backend}",
                client.ip(),
                vip.ip(),
                vip.port()
            ),
            format!(
                "{ns}iptables -t nat -I POSTROUTING -s {}/32 -d {}/32 -p tcp --dport {} -j MASQUERADE",
                client.ip(),
                backend.ip(),
                backend.port()
            ),
            "Kubernetes: externalTrafficPolicy: Cluster, or a kube-proxy that serves LoadBalancer IPs locally for in-cluster clients".into(),
        ],
    }
}

/// The evidence line of a RST answering a SYN-ACK: where each left.
pub fn reset_seen(
    r: &Reset,
    syn_ack_dev: &str,
    syn_ack_ns: &str,
    rst_dev: &str,
    rst_ns: &str,
) -> String {
    let ms = r.rst.ts_ns.saturating_sub(r.syn_ack_at.ts_ns) as f64 / 1e6;
    format!(
        "the SYN-ACK {} -> {} left {syn_ack_dev} in netns {syn_ack_ns}; {ms:.1} ms later {} \
         answered it with a RST, which left {rst_dev} in netns {rst_ns}",
        r.syn_ack.src,
        r.syn_ack.dst,
        r.syn_ack.dst.ip()
    )
}

/// A SYN-ACK answered by a RST, with no NAT kdrop saw to blame.
pub fn reset(r: &Reset, seen: &str) -> Finding {
    let (server, client) = (r.syn_ack.src, r.syn_ack.dst);
    let syn = match &r.flow {
        Some(f) => format!(
            "{} (SYN {} -> {})",
            transmissions(f).replace(", none answered", ""),
            f.orig.src,
            f.orig.dst
        ),
        None => format!("kdrop did not see a SYN {client} -> {server} leave any device it follows"),
    };
    Finding {
        cause: "syn_ack_reset",
        summary: format!(
            "the SYN-ACK {server} -> {client} was answered by a RST: {} has no socket waiting for it",
            client.ip()
        ),
        evidence: vec![
            seen.to_string(),
            syn,
            format!(
                "a SYN-ACK is refused with a RST when no socket of {} is in SYN-SENT for {server}: \
                 its SYN went to another address (a translation the reply did not undo), it \
                 gave up before the SYN-ACK came, or it never had one (a half-open port scan)",
                client.ip()
            ),
        ],
        fix: vec![],
    }
}

/// A SYN sent `UNANSWERED_AFTER` times without an answer, explained.
pub fn unanswered(
    flow: &Flow,
    bits: &CtBits,
    status: &[String],
    t: &Tables,
    dnat_ns: &str,
) -> Finding {
    let dev = t.link_name(flow.ifindex);
    let sent = transmissions(flow);
    match flow.ct {
        Some(ct) if ct.status & bits.dst_nat != 0 && ct.status & bits.src_nat == 0 => {
            let (client, service, backend) = (ct.orig.src, ct.orig.dst, ct.reply.src);
            Finding {
                cause: "asymmetric_return_path",
                summary: format!(
                    "SYN {client} -> {service} was DNAT'd to {backend} and sent out {dev}, but no \
                     reply came back through this host: asymmetric return path"
                ),
                evidence: vec![
                    format!("conntrack: {} (UNREPLIED)", ct_text(&ct, status)),
                    sent,
                    format!(
                        "no SNAT: {backend} sees {} as the source and answers it directly, \
                         bypassing this host, so the reply is never un-DNAT'd",
                        client.ip()
                    ),
                ],
                fix: vec![
                    format!(
                        "{dnat_ns}iptables -t nat -A POSTROUTING -d {}/32 -p tcp --dport {} -j MASQUERADE",
                        backend.ip(),
                        backend.port()
                    ),
                    format!(
                        "or route {} back through this host on {}'s side",
                        client.ip(),
                        backend.ip()
                    ),
                ],
            }
        }
        _ => Finding {
            cause: "unanswered",
            summary: format!(
                "SYN {} -> {} sent {} out of {dev} without an answer",
                flow.orig.src,
                flow.orig.dst,
                if flow.syns == 1 {
                    "once".to_string()
                } else {
                    format!("{} times", flow.syns)
                }
            ),
            evidence: vec![sent],
            fix: vec![],
        },
    }
}
