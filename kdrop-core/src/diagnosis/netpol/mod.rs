//! What every network policy engine's drop has in common, in Kubernetes
//! terms: the direction of the protected pod it guards, the two ends of
//! the connection, and the repair, a NetworkPolicy that allows exactly
//! that connection (policy.rs). The engines read their own rulesets:
//! `super::calico` (Felix's chains), `super::kube_router` (its pod
//! firewall chains).
pub mod policy;

use std::net::IpAddr;

use self::policy::{network_policy, Peer, Workload};

/// Which of the workload's directions the policy guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// To the workload.
    Ingress,
    /// From it.
    Egress,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    /// The other end's direction for the same connection.
    pub fn other(self) -> Self {
        match self {
            Direction::Ingress => Direction::Egress,
            Direction::Egress => Direction::Ingress,
        }
    }

    /// `from` the peer (ingress) or `to` it (egress).
    pub fn preposition(self) -> &'static str {
        match self {
            Direction::Ingress => "from",
            Direction::Egress => "to",
        }
    }
}

/// The connection's two ends as the policy sees them.
pub struct Conn<'a> {
    /// The pod whose policy dropped it, when its address is a pod's.
    pub protected: Option<&'a Workload>,
    pub peer: &'a Peer,
    pub protected_addr: IpAddr,
    pub peer_addr: IpAddr,
    /// The server's port.
    pub port: u16,
}

pub fn pod_phrase(w: Option<&Workload>, addr: IpAddr) -> String {
    w.map_or_else(
        || addr.to_string(),
        |w| format!("pod {}/{}", w.namespace, w.name),
    )
}

pub fn peer_phrase(p: &Peer) -> String {
    match p {
        Peer::Pod(w) => format!("pod {}/{}", w.namespace, w.name),
        Peer::Addr(a) => a.to_string(),
    }
}

/// `namespace/name` of the pods, as the record's `network_policy` has them.
pub fn pod_id(w: &Workload) -> String {
    format!("{}/{}", w.namespace, w.name)
}

pub fn peer_pod_id(p: &Peer) -> Option<String> {
    match p {
        Peer::Pod(w) => Some(pod_id(w)),
        Peer::Addr(_) => None,
    }
}

/// `kubectl get pod ... --show-labels` of both ends, around `between`:
/// what selects the protected pod, then what its peer carries.
pub fn inspect(c: &Conn, between: Vec<String>) -> Vec<String> {
    let labels = |w: &Workload| {
        format!(
            "kubectl get pod -n {} {} --show-labels",
            w.namespace, w.name
        )
    };
    let mut out: Vec<String> = c.protected.map(labels).into_iter().collect();
    out.extend(between);
    if let Peer::Pod(w) = c.peer {
        out.push(labels(w));
    }
    out
}

/// Why the policy's pod selectors cannot pick exactly these pods: labels
/// kdrop could not read (and why not), pods that have none.
fn inexact(pods: &[&Workload]) -> Vec<String> {
    let mut unknown: Vec<&str> = Vec::new();
    let mut bare = Vec::new();
    for w in pods {
        match &w.labels {
            Err(why) if !unknown.contains(&why.as_str()) => unknown.push(why),
            Ok(l) if l.is_empty() => bare.push(format!("pod {}/{}", w.namespace, w.name)),
            _ => {}
        }
    }
    let mut notes = Vec::new();
    if !unknown.is_empty() {
        notes.push(format!(
            "the container runtime's records on this node do not give the pods' labels ({}): \
             a selector written `{{}}` selects every pod of the namespace; replace it with the \
             pod's labels (kubectl get pod --show-labels) to allow only this pod",
            unknown.join("; ")
        ));
    }
    if !bare.is_empty() {
        notes.push(format!(
            "{} {} no labels: its selector `{{}}` selects every pod of the namespace; label \
             the pod and select it by that label to allow only this pod",
            bare.join(" and "),
            if bare.len() == 1 { "has" } else { "have" }
        ));
    }
    notes
}

/// The repair for a protected pod: the NetworkPolicy allowing exactly this
/// connection, and why its selectors may be wider. `None` when the
/// protected end is no pod of this node's runtime.
pub fn allow_notes(dir: Direction, c: &Conn) -> Option<Vec<String>> {
    let w = c.protected?;
    let yaml = network_policy(dir, w, c.peer, c.port);
    let mut pods = vec![w];
    if let Peer::Pod(p) = c.peer {
        pods.push(p);
    }
    let inexact = inexact(&pods);
    let exactly = if inexact.is_empty() {
        "exactly this connection"
    } else {
        "this connection (and, with its `{}` selectors, the same from and to every pod \
         of these namespaces)"
    };
    let mut notes = vec![format!(
        "apply this NetworkPolicy (kubectl apply -f -) to allow {exactly}:\n{yaml}"
    )];
    notes.extend(inexact);
    Some(notes)
}

/// The other end may be guarded too.
pub fn other_end_note(dir: Direction) -> String {
    format!(
        "if policies also select the other end for {}, it needs its own allow for this \
         connection; replies are allowed by connection tracking",
        dir.other().name()
    )
}
