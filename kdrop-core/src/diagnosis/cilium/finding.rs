//! A Cilium policy drop as a finding (`network_policy_denied`) and the
//! record's `network_policy` field. `fix` stays empty: Cilium regenerates
//! the endpoint's program and policy map from the cluster's policies, so
//! the repair is a policy object, given in `fix_notes`.
use super::{CiliumDrop, Counted, AUTH_REQUIRED, POLICY_DENY};
use crate::{
    diagnosis::{
        netpol::{self, peer_phrase, pod_phrase, Conn, Direction},
        reason::{reason_evidence, DropFacts},
    },
    model::{cause::Cause, finding::Finding, policy::PolicyDrop},
};

const REWRITTEN: &str = "the Cilium agent writes the endpoint's program and policy map from \
                         the cluster's policies: changing them on the node repairs nothing";

fn verdict(d: &CiliumDrop) -> &'static str {
    match d.reason {
        POLICY_DENY => "denied_by_rule",
        AUTH_REQUIRED => "auth_required",
        _ => "no_policy_allowed",
    }
}

fn counted(d: &CiliumDrop) -> String {
    let dir = d.direction.map_or("", |d| d.name());
    match d.counted {
        Counted::Grew { from, to } => format!(
            "Cilium's metrics map (map {}) counted it: {} {dir} went from {from} to {to} \
             packets since kdrop's previous read",
            d.map_id,
            d.reason_name()
        ),
        Counted::OnlyOne { total } => format!(
            "Cilium's metrics map (map {}) counts {total} {dir} packets dropped as {}, its only \
             drop reason so far (kdrop's first read of it: no count from before)",
            d.map_id,
            d.reason_name()
        ),
    }
}

fn inspect(c: &Conn, dir: Direction) -> Vec<String> {
    let mut between = Vec::new();
    if let Some(w) = c.protected {
        between.push(format!(
            "kubectl get networkpolicy -n {} -o yaml",
            w.namespace
        ));
        between.push(format!(
            "kubectl get ciliumnetworkpolicies -n {} -o yaml",
            w.namespace
        ));
        let flag = match dir {
            Direction::Ingress => "--to-pod",
            Direction::Egress => "--from-pod",
        };
        between.push(format!(
            "hubble observe --verdict DROPPED {flag} {}/{}",
            w.namespace, w.name
        ));
    }
    between.push("kubectl get ciliumclusterwidenetworkpolicies -o yaml".into());
    between.push("kubectl -n kube-system exec ds/cilium -- cilium-dbg monitor --type drop".into());
    netpol::inspect(c, between)
}

fn notes(d: &CiliumDrop, dir: Direction, c: &Conn) -> Vec<String> {
    let mut notes = netpol::allow_notes(dir, c).unwrap_or_else(|| {
        vec![format!(
            "{} is no pod of this node's container runtime (a host, or a pod elsewhere): allow \
             {} on TCP port {} in the CiliumNetworkPolicy or CiliumClusterwideNetworkPolicy \
             that selects it",
            c.protected_addr,
            peer_phrase(c.peer),
            c.port
        )]
    });
    match d.reason {
        POLICY_DENY => notes.push(
            "a deny rule (ingressDeny or egressDeny of a CiliumNetworkPolicy) matched: deny \
             rules win over every allow, so an added NetworkPolicy alone does not let it \
             through; narrow or remove that deny rule"
                .into(),
        ),
        AUTH_REQUIRED => notes.push(
            "the allowing rule requires mutual authentication (authentication.mode: \
             required) and the two identities have not authenticated: check Cilium's \
             authentication (SPIRE) rather than the policy"
                .into(),
        ),
        _ => {}
    }
    notes.push(netpol::other_end_note(dir));
    notes.push(REWRITTEN.into());
    notes
}

pub fn explain(d: &CiliumDrop, dir: Direction, c: &Conn, f: &DropFacts) -> (Finding, PolicyDrop) {
    let protected = pod_phrase(c.protected, c.protected_addr);
    let summary = format!(
        "Cilium network policy, {} of {protected} {} {}: Cilium dropped TCP port {} as {} ({})",
        dir.name(),
        dir.preposition(),
        peer_phrase(c.peer),
        c.port,
        d.reason_name(),
        d.reason
    );
    let agent = d
        .prog
        .agent
        .as_ref()
        .map(|a| format!(", Cilium's ({})", a.evidence))
        .unwrap_or_default();
    let evidence = vec![
        reason_evidence(f),
        format!(
            "program {} (id {}, {}) on tc {} of {}{agent}",
            d.prog.name, d.prog.id, d.prog.prog_type, d.hook, d.dev
        ),
        counted(d),
    ];
    let drop = PolicyDrop {
        engine: "cilium",
        dataplane: "ebpf",
        verdict: verdict(d),
        direction: dir.name(),
        protected_pod: c.protected.map(netpol::pod_id),
        peer_pod: netpol::peer_pod_id(c.peer),
        protected_addr: c.protected_addr.to_string(),
        peer_addr: c.peer_addr.to_string(),
        port: c.port,
        protocol: "TCP",
        tier: None,
        endpoint_chain: d.prog.name.clone(),
        interface: Some(d.dev.clone()),
        chain: d.prog.name.clone(),
        policy: None,
        evaluated: Vec::new(),
    };
    let finding = Finding {
        cause: Cause::NetworkPolicyDenied,
        summary,
        evidence,
        fix: Vec::new(),
        fix_or: Vec::new(),
        fix_notes: notes(d, dir, c),
        inspect: inspect(c, dir),
    };
    (finding, drop)
}
