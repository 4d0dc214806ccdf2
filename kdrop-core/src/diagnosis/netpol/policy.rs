//! The Kubernetes NetworkPolicy that allows exactly one denied connection:
//! in the protected pod's namespace, selecting it by its labels, allowing
//! the peer (its namespace by the `kubernetes.io/metadata.name` label every
//! namespace carries since Kubernetes 1.22, and its labels) on the port.
//! Strings are written as JSON strings, which YAML reads as double-quoted
//! scalars: a label value such as `true` or `1.0` stays a string.
use std::net::IpAddr;

use super::Direction;
use crate::model::pod::Labels;

/// A pod as the policy names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub name: String,
    /// Its labels as the runtime recorded or gave them; else why kdrop
    /// could not read them (the selector then cannot be exact).
    pub labels: Result<Labels, String>,
}

/// The other end of the connection: a pod, or an address no pod has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    Pod(Workload),
    Addr(IpAddr),
}

const NS_LABEL: &str = "kubernetes.io/metadata.name";

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `matchLabels` lines at `indent`, or `{}` (every pod) without labels.
fn match_labels(labels: Option<&Labels>, indent: &str) -> String {
    match labels.filter(|l| !l.is_empty()) {
        Some(l) => {
            let mut s = format!("{indent}matchLabels:\n");
            for (k, v) in l {
                s.push_str(&format!("{indent}  {}: {}\n", q(k), q(v)));
            }
            s
        }
        None => format!("{indent}{{}}\n"),
    }
}

/// A DNS subdomain name: lowercase letters, digits, `-` and `.`, at most
/// 253 characters, alphanumeric at both ends.
fn object_name(parts: &[&str]) -> String {
    let raw = parts.join("-").to_ascii_lowercase();
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(253)
        .collect();
    clean
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

fn peer_name(p: &Peer) -> String {
    match p {
        Peer::Pod(w) => w.name.clone(),
        Peer::Addr(a) => a.to_string(),
    }
}

/// The `- from:`/`- to:` peer entry, indented for a rule.
fn peer_entry(p: &Peer) -> String {
    match p {
        Peer::Pod(w) => format!(
            "    - namespaceSelector:\n        matchLabels:\n          {}: {}\n      podSelector:\n{}",
            q(NS_LABEL),
            q(&w.namespace),
            match_labels(w.labels.as_ref().ok(), "        ")
        ),
        Peer::Addr(a) => {
            let len = if a.is_ipv4() { 32 } else { 128 };
            format!("    - ipBlock:\n        cidr: {}\n", q(&format!("{a}/{len}")))
        }
    }
}

/// The policy as YAML: `protected` is the pod whose policy denied the
/// connection (the server for ingress, the client for egress).
pub fn network_policy(dir: Direction, protected: &Workload, peer: &Peer, port: u16) -> String {
    let (from, to) = match dir {
        Direction::Ingress => (peer_name(peer), protected.name.clone()),
        Direction::Egress => (protected.name.clone(), peer_name(peer)),
    };
    let name = object_name(&["kdrop-allow", &from, "to", &to, &port.to_string()]);
    let (kind, list, key) = match dir {
        Direction::Ingress => ("Ingress", "ingress", "from"),
        Direction::Egress => ("Egress", "egress", "to"),
    };
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {}\n  \
         namespace: {}\nspec:\n  podSelector:\n{}  policyTypes:\n  - {kind}\n  {list}:\n  - \
         {key}:\n{}    ports:\n    - protocol: TCP\n      port: {port}\n",
        q(&name),
        q(&protected.namespace),
        match_labels(protected.labels.as_ref().ok(), "    "),
        peer_entry(peer),
    )
}
