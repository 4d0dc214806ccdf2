//! `--port 80` on a node where a load balancer sends a Service's traffic to
//! its node port: the SYNs arrive there with the node port (and, after
//! kube-proxy's DNAT, with the backend's port), never with 80. So the
//! filter also takes the node ports of the Services on the asked ports,
//! from kube-proxy's rules of the traced namespace (or of the node's, for a
//! pod's), read once at start: a Service created later is not followed.
//! What a forwarding namespace hides from the filter is said at start.
use kdrop_common::{Filter, MAX_PORTS};

use crate::{
    context::{
        netns::{in_netns, Netns},
        Live, Node as _,
    },
    filter::add_ports,
};

/// The node ports added to the filter, and what is not followed.
#[derive(Debug, Default)]
pub struct NodePorts {
    /// `node port 30080 of web/web:80`, each followed.
    pub followed: Vec<String>,
    /// What is not followed, and why (`kdrop: without ...` lines).
    pub left: Vec<String>,
}

/// Widens `filter` (whose ports are the user's) in place.
pub fn follow(live: &mut Live, traced: u32, filter: &mut Filter) -> NodePorts {
    let asked = filter.ports[..filter.n_ports as usize].to_vec();
    if asked.is_empty() {
        return NodePorts::default();
    }
    let Some(services) = live.kube(traced) else {
        // Said, not silent: a Service's node port would go unfollowed
        // because the rules naming it could not be read.
        let unread = live.rules_unread(traced);
        let left = (!unread.is_empty())
            .then(|| {
                format!(
                    "kube-proxy's node ports of --port: the rules were not read ({})",
                    unread.join("; ")
                )
            })
            .into_iter()
            .collect();
        return NodePorts {
            followed: Vec::new(),
            left,
        };
    };
    let found = services.node_ports_of(&asked);
    let ports: Vec<u16> = found.iter().map(|(p, _)| *p).collect();
    let not_fitted = add_ports(filter, &ports);
    let mut n = NodePorts::default();
    for (port, svc) in found {
        let what = format!("node port {port} of {}", svc.display());
        if not_fitted.contains(&port) {
            n.left.push(format!(
                "{what} (kube-proxy's rules): the filter holds at most {MAX_PORTS} ports; add --port {port} in place of another"
            ));
        } else {
            n.followed.push(what);
        }
    }
    n
}

/// Said when the traced namespace forwards: a handshake forwarded without
/// NAT here is followed by its drops alone, since following it needs a
/// probe on every forwarded packet (incident 4 from the node alone, with a
/// plain DNAT of the node port, is such a case).
pub fn unfollowed(ns: &Netns) -> Option<String> {
    let forwards = in_netns(&ns.path, || {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").is_ok_and(|v| v.trim() == "1")
    })
    .unwrap_or(false);
    forwards.then(|| {
        "forwarded handshakes not NAT'd here (net.ipv4.ip_forward=1): their drops are \
         reported, but one from another host that is never answered is not (that would take \
         a probe on every forwarded packet), nor a port a load balancer maps --port to unless \
         kube-proxy's rules name it as a node port (add it: --port <node port>)"
            .to_string()
    })
}
