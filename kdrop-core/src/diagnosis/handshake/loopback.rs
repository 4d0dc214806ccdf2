//! Incident 4: a client on this node sends to a load balancer's VIP; the
//! load balancer DNATs it to this node (a NodePort) and keeps the client's
//! address; this node DNATs it to a local backend without SNAT
//! (externalTrafficPolicy: Local), so the backend answers the client
//! directly and the load balancer never undoes its own DNAT.
use crate::model::cause::Cause;
use std::net::SocketAddr;

use super::{
    findings::{clear_entry, host_prefix, iptables_for, show_entry, transmissions},
    tracker::Flow,
};
use crate::diagnosis::fix_kinds::Kind;
use crate::model::{
    finding::{Finding, Fix},
    packet::Tuple,
    routing::Tables,
};

/// One looped-back handshake, however kdrop saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loopback {
    pub client: SocketAddr,
    /// What the client sent its SYN to (the load balancer's VIP).
    pub vip: SocketAddr,
    /// The SYN as it came back into this node (the load balancer's DNAT).
    pub came_back_as: SocketAddr,
    /// Where this node DNAT'd it.
    pub backend: SocketAddr,
    /// The device this node sent the SYN to the VIP out of, when it did.
    pub out_dev: Option<String>,
    /// What showed it, first in the evidence.
    pub seen: Vec<String>,
    /// This node's entry of the SYN to the VIP, deleted after the repair
    /// (None: this node holds none).
    pub stale: Option<Tuple>,
}

/// The finding; `ns` runs commands in the namespace that DNAT'd the SYN
/// that came back (the node's, not the client's).
pub fn lb_loopback(l: &Loopback, ns: &str) -> Finding {
    let (client, vip, backend) = (l.client, l.vip, l.backend);
    let mut evidence = l.seen.clone();
    evidence.push(format!(
        "no SNAT: {backend} answers {} directly from its own address, so the reply is un-NAT'd \
         at most to {} by this node, never to {vip}: the client's socket never sees its SYN-ACK",
        client.ip(),
        l.came_back_as
    ));
    Finding {
        cause: Cause::LbLoopbackWithoutSnat,
        summary: format!(
            "SYN {client} -> {vip} {}came back as {client} -> {} and was DNAT'd to {backend} \
             without SNAT: the reply goes straight to {} and bypasses the load balancer",
            l.out_dev
                .as_ref()
                .map(|d| format!("left by {d} to the load balancer, "))
                .unwrap_or_default(),
            l.came_back_as,
            client.ip()
        ),
        evidence,
        fix: lb_loopback_fix(l, ns),
        fix_notes: vec![
            format!(
                "the first command serves {vip} on this node for {}, as kube-proxy does for a \
                 Service's status.loadBalancer.ingress IPs; on Kubernetes the lasting repair is \
                 that: a Service whose load balancer reports its IP in \
                 status.loadBalancer.ingress (ipMode VIP), so kube-proxy writes those rules",
                client.ip()
            ),
            "or SNAT before the load balancer (on the client's side), so the reply goes back \
             through it"
                .into(),
            "externalTrafficPolicy: Cluster does not repair this: the load balancer's own DNAT \
             of the VIP can only be undone by the load balancer, and the reply never reaches it"
                .into(),
        ],
        inspect: [
            Some(format!(
                "{ns}{}-save -t nat | grep -e {} -e {}",
                iptables_for(vip.ip()),
                vip.ip(),
                backend.ip()
            )),
            l.stale.as_ref().map(|t| show_entry(ns, t)),
            Some(format!("kubectl get svc -A -o wide | grep {}", vip.ip())),
        ]
        .into_iter()
        .flatten()
        .collect(),
        ..Finding::default()
    }
}

/// Short-circuit the VIP on the node, as kube-proxy does for a Service's
/// status.loadBalancer.ingress IPs; the client's retries of the same port
/// keep the entry made without it until it is deleted.
fn lb_loopback_fix(l: &Loopback, ns: &str) -> Vec<Fix> {
    let (client, vip, backend) = (l.client, l.vip, l.backend);
    let mut fix = vec![Kind::LoopbackDnat.fix(format!(
        "{ns}{} -t nat -I PREROUTING -s {}/{p} -d {}/{p} -p tcp --dport {} -j DNAT --to-destination {backend}",
        iptables_for(vip.ip()),
        client.ip(),
        vip.ip(),
        vip.port(),
        p = host_prefix(vip.ip()),
    ))];
    fix.extend(
        l.stale
            .as_ref()
            .map(|t| Kind::ConntrackDeleteEntry.fix(clear_entry(ns, t))),
    );
    fix
}

/// Seen by the tracker: the SYN to the VIP leaving (`first`) and the same
/// client's SYN coming back DNAT'd without SNAT (`back`), both in this
/// node's namespace.
pub fn looped_back(first: &Flow, back: &Flow, status: &[String], t: &Tables) -> Loopback {
    let ct = back.ct.expect("a looped-back flow is DNAT'd");
    let out_dev = t.link_name(first.ifindex);
    Loopback {
        client: first.orig.src,
        vip: first.orig.dst,
        came_back_as: ct.orig.dst,
        backend: ct.reply.src,
        seen: vec![
            // The same transmissions, counted on both flows: the fuller count.
            format!(
                "{} (to {}, out of {out_dev})",
                transmissions(if back.syns > first.syns { back } else { first }),
                first.orig.dst
            ),
            format!(
                "the same client address and port came back in: conntrack {} -> {}, reply {} -> {}, status [{}], sent out {}",
                ct.orig.src,
                ct.orig.dst,
                ct.reply.src,
                ct.reply.dst,
                status.join(","),
                t.link_name(back.ifindex)
            ),
        ],
        out_dev: Some(out_dev),
        // The node's conntrack saw the SYN to the VIP pass (the egress
        // carried its entry).
        stale: Some(first.orig),
    }
}
