//! A kube-router policy drop as a finding (`network_policy_denied`) and
//! the record's `network_policy` field. `fix` stays empty: kube-router
//! rewrites its chains from the cluster's policies, so the repair is a
//! NetworkPolicy, given in `fix_notes`; `inspect` lists what selects the pod.
use super::{KubeRouterDrop, PolicyChain};
use crate::{
    diagnosis::{
        netpol::{self, peer_phrase, pod_phrase, Conn},
        reason::{reason_evidence, DropFacts},
    },
    model::{
        cause::Cause,
        finding::Finding,
        netfilter::{Attribution, Backend},
        policy::PolicyDrop,
    },
};

const REWRITTEN: &str = "kube-router writes these chains from the cluster's NetworkPolicies \
                         and rewrites them at its next sync (at once on a change to a policy \
                         or pod): changing the ruleset on the node repairs nothing";

fn policy_phrase(p: &PolicyChain) -> String {
    match &p.policy {
        Some(id) => format!("NetworkPolicy {id} ({})", p.chain),
        None => p.chain.clone(),
    }
}

/// What `kubectl` shows of the policies that select the pod.
fn inspect(d: &KubeRouterDrop, c: &Conn) -> Vec<String> {
    let ns = c.protected.map(|w| w.namespace.clone()).or_else(|| {
        d.pod
            .as_ref()
            .and_then(|p| p.split_once('/'))
            .map(|(n, _)| n.into())
    });
    let mut between = Vec::new();
    if let Some(ns) = &ns {
        between.push(format!("kubectl get networkpolicy -n {ns} -o yaml"));
    }
    for p in &d.policies {
        if let Some((ns, name)) = p.policy.as_deref().and_then(|p| p.split_once('/')) {
            between.push(format!("kubectl describe networkpolicy -n {ns} {name}"));
        }
    }
    netpol::inspect(c, between)
}

fn notes(d: &KubeRouterDrop, c: &Conn) -> Vec<String> {
    let mut notes = netpol::allow_notes(d.direction, c).unwrap_or_else(|| {
        vec![format!(
            "{} is no pod of this node's container runtime: allow {} on TCP port {} in the \
             NetworkPolicy that selects {}",
            c.protected_addr,
            peer_phrase(c.peer),
            c.port,
            d.pod.as_deref().unwrap_or("it")
        )]
    });
    notes.push(netpol::other_end_note(d.direction));
    notes.push(REWRITTEN.into());
    notes
}

pub fn explain(
    d: &KubeRouterDrop,
    c: &Conn,
    a: &Attribution,
    f: &DropFacts,
) -> (Finding, PolicyDrop) {
    let drop = policy_drop(d, c, a);
    let protected = match (c.protected, &d.pod) {
        (None, Some(p)) => format!("pod {p}"),
        _ => pod_phrase(c.protected, c.protected_addr),
    };
    let summary = format!(
        "kube-router network policy, {} of {protected} {} {}: no NetworkPolicy that selects \
         it allows TCP port {} ({}), and kube-router rejects what none allowed",
        d.direction.name(),
        d.direction.preposition(),
        peer_phrase(c.peer),
        c.port,
        if drop.evaluated.is_empty() {
            "no policy chain found".to_string()
        } else {
            format!("evaluated {}", drop.evaluated.join(", "))
        }
    );
    let mut evidence = vec![reason_evidence(f), format!("method: {}", a.method)];
    if let (Some(t), Some(ch), Some(r)) = (&a.table, &a.chain, &a.rule) {
        evidence.push(format!("rule in {t}/{ch}: {r}"));
    }
    evidence.push(format!(
        "{} is the firewall chain of {protected} (address {}): it rejects what no policy \
         chain of the pod's {} marked 0x10000",
        d.pod_chain,
        d.pod_addr,
        d.direction.name()
    ));
    evidence.extend(a.evidence.iter().cloned());
    let finding = Finding {
        cause: Cause::NetworkPolicyDenied,
        summary,
        evidence,
        fix: Vec::new(),
        fix_or: Vec::new(),
        fix_notes: notes(d, c),
        inspect: inspect(d, c),
    };
    (finding, drop)
}

/// The drop's facts in the engines' shared terms: no policy of the pod's
/// allowed it, and which were evaluated.
pub(super) fn policy_drop(d: &KubeRouterDrop, c: &Conn, a: &Attribution) -> PolicyDrop {
    PolicyDrop {
        engine: "kube-router",
        dataplane: match a.backend {
            Some(Backend::Nftables) => "nftables",
            _ => "iptables",
        },
        verdict: "no_policy_allowed",
        direction: d.direction.name(),
        protected_pod: c.protected.map(netpol::pod_id).or_else(|| d.pod.clone()),
        peer_pod: netpol::peer_pod_id(c.peer),
        protected_addr: c.protected_addr.to_string(),
        peer_addr: c.peer_addr.to_string(),
        port: c.port,
        protocol: "TCP",
        tier: None,
        endpoint_chain: d.pod_chain.clone(),
        interface: None,
        chain: a.chain.clone().unwrap_or_else(|| d.pod_chain.clone()),
        policy: None,
        evaluated: d.policies.iter().map(policy_phrase).collect(),
    }
}
