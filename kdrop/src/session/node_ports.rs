//! `--port 80` on a node where a load balancer sends a Service's traffic to
//! its node port: the SYNs arrive there with the node port (and, after
//! kube-proxy's DNAT, with the backend's port), never with 80. So the
//! filter also takes the node ports of the Services on the asked ports,
//! from kube-proxy's rules of the traced namespace (or of the node's, for a
//! pod's), read once at start: a Service created later is not followed.
use kdrop_common::{Filter, MAX_PORTS};

use crate::{
    context::{Live, Node as _},
    filter::add_ports,
};

/// The node ports added to the filter, and those that did not fit.
#[derive(Debug, Default)]
pub struct NodePorts {
    /// `node port 30080 of web/web:80`, each followed.
    pub followed: Vec<String>,
    /// Why a node port is not followed.
    pub left: Vec<String>,
}

/// Widens `filter` (whose ports are the user's) in place.
pub fn follow(live: &mut Live, traced: u32, filter: &mut Filter) -> NodePorts {
    let asked = filter.ports[..filter.n_ports as usize].to_vec();
    if asked.is_empty() {
        return NodePorts::default();
    }
    let Some(services) = live.kube(traced) else {
        return NodePorts::default();
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
