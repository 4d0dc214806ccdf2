//! A Calico policy drop as a finding (`network_policy_denied`) and the
//! record's `network_policy` field. `fix` stays empty: Felix rewrites its
//! chains from the cluster's policies, so the repair is a policy object,
//! given in `fix_notes`; `inspect` lists what selects the pod.
use super::{felix::Owner, CalicoDrop, Chain, Ended};
pub use crate::diagnosis::netpol::Conn;
use crate::{
    diagnosis::{
        netpol::{self, peer_phrase, pod_phrase},
        reason::{reason_evidence, DropFacts},
    },
    model::{
        cause::Cause,
        finding::Finding,
        netfilter::{Attribution, Backend},
        policy::PolicyDrop,
    },
};

const REWRITTEN: &str = "Felix (calico-node) writes these chains from the cluster's policies \
                         and rewrites them within seconds: changing the ruleset on the node \
                         repairs nothing";

fn owner_phrase(o: &Owner) -> String {
    format!("{} {}", o.kind, o.name)
}

fn chain_phrase(c: &Chain) -> String {
    c.owner.as_ref().map_or_else(
        || c.chain.clone(),
        |o| format!("{} ({})", owner_phrase(o), c.chain),
    )
}

/// The commands that show what selects the pod: Kubernetes and Calico
/// policies of its namespace, the cluster-wide ones, its labels.
fn inspect(c: &Conn) -> Vec<String> {
    let mut between = Vec::new();
    if let Some(w) = c.protected {
        between.push(format!(
            "kubectl get networkpolicy -n {} -o yaml",
            w.namespace
        ));
        between.push(format!(
            "calicoctl get networkpolicy -n {} -o yaml",
            w.namespace
        ));
    }
    between.push("calicoctl get globalnetworkpolicy -o yaml".into());
    between.push("kubectl get globalnetworkpolicies.crd.projectcalico.org".into());
    netpol::inspect(c, between)
}

fn verdict(e: &Ended) -> &'static str {
    match e {
        Ended::NoPolicyPassed { .. } => "no_policy_allowed",
        Ended::Denied { .. } => "denied_by_rule",
        Ended::NoProfileMatched { .. } => "no_profile_matched",
    }
}

/// What ended it, in a sentence, and the chains it went through.
fn what(d: &CalicoDrop, port: &str) -> (String, Option<String>, Option<String>, Vec<String>) {
    match &d.ended {
        Ended::NoPolicyPassed { tier, policies } => {
            let names: Vec<String> = policies.iter().map(chain_phrase).collect();
            (
                format!(
                    "no policy of tier {tier} that selects it allows {port} (the tier ends in \
                     a drop: {})",
                    if names.is_empty() {
                        "no policy chain found".to_string()
                    } else {
                        format!("evaluated {}", names.join(", "))
                    }
                ),
                Some(tier.clone()),
                None,
                names,
            )
        }
        Ended::Denied { tier, policy, .. } => (
            format!(
                "a deny rule of {}{} dropped {port}",
                chain_phrase(policy),
                tier.as_ref()
                    .map(|t| format!(" in tier {t}"))
                    .unwrap_or_default()
            ),
            tier.clone(),
            Some(
                policy
                    .owner
                    .as_ref()
                    .map_or_else(|| policy.chain.clone(), owner_phrase),
            ),
            Vec::new(),
        ),
        Ended::NoProfileMatched { profiles } => {
            let names: Vec<String> = profiles.iter().map(chain_phrase).collect();
            (
                format!(
                    "no policy applies to it in this direction and none of its profiles ({}) \
                     allows {port}",
                    names.join(", ")
                ),
                None,
                None,
                names,
            )
        }
    }
}

/// The repair: a NetworkPolicy allowing exactly this connection, and
/// what else has to hold for it to work.
fn notes(d: &CalicoDrop, c: &Conn) -> Vec<String> {
    let mut notes = netpol::allow_notes(d.direction, c).unwrap_or_else(|| {
        vec![format!(
            "{} is no pod on this node's runtime: the policy that selects it is a Calico \
             GlobalNetworkPolicy or a host endpoint's; allow {} on TCP port {} there",
            c.protected_addr,
            peer_phrase(c.peer),
            c.port
        )]
    });
    match &d.ended {
        Ended::NoPolicyPassed { tier, .. } if tier != "default" => notes.push(format!(
            "the drop is at the end of Calico tier {tier}: Kubernetes NetworkPolicies live in \
             tier default, after it; allow (or pass) the connection with a Calico policy in \
             tier {tier} instead"
        )),
        Ended::Denied { policy, .. } => notes.push(format!(
            "{} denies it explicitly (Kubernetes NetworkPolicies only allow): remove or narrow \
             that deny rule, or put an Allow before it (a policy of lower order in the same \
             tier); an added NetworkPolicy alone does not override it",
            chain_phrase(policy)
        )),
        _ => {}
    }
    notes.push(netpol::other_end_note(d.direction));
    notes.push(REWRITTEN.into());
    notes
}

pub fn explain(d: &CalicoDrop, c: &Conn, a: &Attribution, f: &DropFacts) -> (Finding, PolicyDrop) {
    let port = format!("TCP port {}", c.port);
    let (ended, tier, policy, evaluated) = what(d, &port);
    let protected = pod_phrase(c.protected, c.protected_addr);
    let prep = d.direction.preposition();
    let summary = format!(
        "Calico network policy, {} of {protected} {prep} {}: {ended}",
        d.direction.name(),
        peer_phrase(c.peer),
    );
    let mut evidence = vec![reason_evidence(f), format!("method: {}", a.method)];
    if let (Some(t), Some(ch), Some(r)) = (&a.table, &a.chain, &a.rule) {
        evidence.push(format!("rule in {t}/{ch}: {r}"));
    }
    evidence.push(format!(
        "{} is the workload endpoint chain of {protected}{}",
        d.endpoint_chain,
        d.iface
            .as_ref()
            .map(|i| format!(" (interface {i})"))
            .unwrap_or_default()
    ));
    if d.ambiguous {
        evidence.push(
            "several workloads' chains reach this policy chain and the packet's interface \
             named none: the first was taken"
                .into(),
        );
    }
    evidence.extend(a.evidence.iter().cloned());
    let drop = PolicyDrop {
        tier,
        policy,
        evaluated,
        ..policy_drop(d, c, a)
    };
    let finding = Finding {
        cause: Cause::NetworkPolicyDenied,
        summary,
        evidence,
        fix: Vec::new(),
        fix_or: Vec::new(),
        fix_notes: notes(d, c),
        inspect: inspect(c),
    };
    (finding, drop)
}

/// The drop's facts in the engines' shared terms, but for the tier, the
/// policy and the policies evaluated (`what` finds them with its words).
pub(super) fn policy_drop(d: &CalicoDrop, c: &Conn, a: &Attribution) -> PolicyDrop {
    PolicyDrop {
        engine: "calico",
        dataplane: match a.backend {
            Some(Backend::Nftables) => "nftables",
            _ => "iptables",
        },
        verdict: verdict(&d.ended),
        direction: d.direction.name(),
        protected_pod: c.protected.map(netpol::pod_id),
        peer_pod: netpol::peer_pod_id(c.peer),
        protected_addr: c.protected_addr.to_string(),
        peer_addr: c.peer_addr.to_string(),
        port: c.port,
        protocol: "TCP",
        tier: None,
        endpoint_chain: d.endpoint_chain.clone(),
        interface: d.iface.clone(),
        chain: a.chain.clone().unwrap_or_else(|| d.endpoint_chain.clone()),
        policy: None,
        evaluated: Vec::new(),
    }
}
