//! A drop by kube-router's network policy controller (its iptables
//! dataplane), in Kubernetes terms. kube-router gives every local pod a
//! firewall chain, `KUBE-POD-FW-<hash>`, reached from `KUBE-ROUTER-FORWARD`
//! (and INPUT, OUTPUT) by the pod's address as destination ("in") or
//! source ("out"). The chain sends the packet through the chain of every
//! NetworkPolicy that selects the pod, `KUBE-NWPLCY-<hash>` (`-d <pod>` for
//! ingress policies, `-s <pod>` for egress ones, neither for both), or
//! through `KUBE-NWPLCY-DEFAULT` for a direction no policy selects; a
//! policy that allows the packet marks it 0x10000, and the pod chain
//! REJECTs what is left unmarked. Kubernetes policies only allow, so the
//! verdict is always that none of them allowed it.
//!
//! The chains and comments as kube-router writes them (cloudnativelabs/
//! kube-router pkg/controllers/netpol): v2.11's `<namespace>/<name>
//! <kind>` comments (comments.go: `reject`, `policy`, `in`, `out`), and
//! the sentences of v2.10 and before (pod.go: "rule to REJECT traffic
//! destined for POD name:<pod> namespace: <ns>", "run through nw policy
//! <name>"). Its nftables dataplane (npc_nftables.go, v2.11: table
//! `kube-router-filter-ipv4`/`-ipv6`) has the same chains and comments,
//! `ip saddr`/`ip daddr` where iptables has `-s`/`-d`, and `counter reject`.
pub mod finding;

use std::net::IpAddr;

use super::{kube::services::tokens, netpol::Direction};
use crate::model::netfilter::{Attribution, Backend, DroppedBy, Table};

/// A pod's firewall chain.
pub const POD_FW: &str = "KUBE-POD-FW-";
/// A NetworkPolicy's chain, and kube-router's own chains of that prefix.
pub const POLICY: &str = "KUBE-NWPLCY-";
const OWN_CHAINS: [&str; 3] = [
    "KUBE-NWPLCY-DEFAULT",
    "KUBE-NWPLCY-COMMON",
    "KUBE-NWPLCY-TAIL",
];

/// A NetworkPolicy's chain, with the policy its jump's comment names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyChain {
    pub chain: String,
    /// `namespace/name`, when the comment says.
    pub policy: Option<String>,
}

/// A kube-router policy drop, read from the ruleset that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeRouterDrop {
    pub direction: Direction,
    /// The pod's firewall chain that rejected it.
    pub pod_chain: String,
    /// The pod it guards (`namespace/name`), from the REJECT rule's comment.
    pub pod: Option<String>,
    /// Its address, from the rules that jump to the chain.
    pub pod_addr: IpAddr,
    /// The NetworkPolicies of that direction the packet went through, none
    /// of which marked it.
    pub policies: Vec<PolicyChain>,
}

/// One `-A` line's comment, target and `-s`/`-d` addresses.
#[derive(Debug, Default)]
struct Line {
    chain: String,
    comment: Option<String>,
    target: String,
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
}

impl Line {
    /// A rule of the backend's text, in `chain` (nft's text holds no chain).
    fn of(backend: Backend, chain: &str, text: &str) -> Option<Self> {
        match backend {
            Backend::Nftables => Some(Self::parse_nft(chain, text)),
            _ => Self::parse(text),
        }
    }

    /// `ip daddr 10.244.7.2 counter jump KUBE-POD-FW-X comment "ns/pod in"`,
    /// as kdrop renders nft's rules.
    fn parse_nft(chain: &str, text: &str) -> Self {
        let mut l = Line {
            chain: chain.to_string(),
            ..Default::default()
        };
        let (body, comment) = match text.split_once(" comment \"") {
            Some((b, c)) => (
                b,
                Some(c.strip_suffix('"').unwrap_or(c).replace("\\\"", "\"")),
            ),
            None => (text, None),
        };
        l.comment = comment;
        let t: Vec<&str> = body.split_whitespace().collect();
        for (i, w) in t.iter().enumerate() {
            let next = t.get(i + 1).copied().unwrap_or_default();
            let prev = if i > 0 { t[i - 1] } else { "" };
            let addr = prev == "ip" || prev == "ip6";
            match *w {
                "jump" | "goto" => l.target = next.to_string(),
                "saddr" if addr => l.src = host(next),
                "daddr" if addr => l.dst = host(next),
                _ => {}
            }
        }
        l
    }

    fn parse(text: &str) -> Option<Self> {
        let t = tokens(text);
        if t.first().map(String::as_str) != Some("-A") {
            return None;
        }
        let mut l = Line {
            chain: t.get(1)?.clone(),
            ..Default::default()
        };
        let mut neg = false;
        for (i, tok) in t.iter().enumerate().skip(2) {
            let arg = t.get(i + 1);
            match tok.as_str() {
                "!" => {
                    neg = true;
                    continue;
                }
                "--comment" => l.comment = arg.cloned(),
                "-j" | "--jump" | "-g" | "--goto" => l.target = arg.cloned().unwrap_or_default(),
                "-s" | "--source" if !neg => l.src = arg.and_then(|a| host(a)),
                "-d" | "--destination" if !neg => l.dst = arg.and_then(|a| host(a)),
                _ => {}
            }
            neg = false;
        }
        Some(l)
    }
}

/// `10.244.0.5/32` → the address; a wider prefix is no pod's.
fn host(a: &str) -> Option<IpAddr> {
    let (ip, len) = a.split_once('/').unwrap_or((a, ""));
    let ip: IpAddr = ip.parse().ok()?;
    let full = if ip.is_ipv4() { "32" } else { "128" };
    (len.is_empty() || len == full).then_some(ip)
}

/// The pod a REJECT rule's comment names: `kdt-db/db-0 reject` (v2.11),
/// `rule to REJECT traffic destined for POD name:db-0 namespace: kdt-db`.
pub fn rejecting_pod(comment: &str) -> Option<String> {
    if let Some(id) = comment.strip_suffix(" reject") {
        return id.contains('/').then(|| id.to_string());
    }
    let rest = comment.strip_prefix("rule to REJECT traffic destined for POD name:")?;
    let (name, ns) = rest.split_once(" namespace: ")?;
    Some(format!("{}/{}", ns.trim(), name.trim()))
}

/// The policy a pod chain's jump names: `kdt-db/allow-api policy` (v2.11),
/// `run through nw policy allow-api` (the pod's namespace, before).
fn policy_of(comment: &str, pod_ns: Option<&str>) -> Option<String> {
    if let Some(id) = comment.strip_suffix(" policy") {
        return id.contains('/').then(|| id.to_string());
    }
    let name = comment.strip_prefix("run through nw policy ")?;
    Some(match pod_ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    })
}

/// Reads a REJECT in a pod's firewall chain. `src`/`dst` are the dropped
/// packet's addresses: the pod's own says the direction.
pub fn classify(
    a: &Attribution,
    tables: &[Table],
    src: IpAddr,
    dst: IpAddr,
) -> Option<KubeRouterDrop> {
    if a.dropped_by != DroppedBy::Rule {
        return None;
    }
    let chain = a.chain.as_deref()?;
    if !chain.starts_with(POD_FW) {
        return None;
    }
    let backend = a.backend.unwrap_or(Backend::IptablesNft);
    let rule = Line::of(backend, chain, a.rule.as_deref()?)?;
    let pod = rule.comment.as_deref().and_then(rejecting_pod);
    let table = tables.iter().find(|t| {
        t.name == a.table.as_deref().unwrap_or("filter")
            && (t.backend == Backend::Nftables) == (backend == Backend::Nftables)
            && t.chain(chain).is_some()
    })?;
    let lines: Vec<Line> = table
        .chains
        .iter()
        .flat_map(|c| c.rules.iter().map(move |r| (c, r)))
        .filter_map(|(c, r)| Line::of(backend, &c.name, &r.text))
        .collect();
    let (direction, pod_addr) = direction_of(&lines, chain, src, dst)?;
    let pod_ns = pod
        .as_deref()
        .and_then(|p| p.split_once('/'))
        .map(|(n, _)| n);
    let policies = policies_of(&lines, chain, direction, pod_ns);
    Some(KubeRouterDrop {
        direction,
        pod_chain: chain.to_string(),
        pod,
        pod_addr,
        policies,
    })
}

/// Which way the packet crossed the pod's firewall chain, and the pod's
/// address: the jumps into its chain match it, and so does the chain's own
/// "from local node" accept.
fn direction_of(
    lines: &[Line],
    chain: &str,
    src: IpAddr,
    dst: IpAddr,
) -> Option<(Direction, IpAddr)> {
    let addrs: Vec<IpAddr> = lines
        .iter()
        .filter(|l| l.target == chain || l.chain == chain)
        .flat_map(|l| [l.src, l.dst])
        .flatten()
        .collect();
    if addrs.contains(&dst) {
        Some((Direction::Ingress, dst))
    } else if addrs.contains(&src) {
        Some((Direction::Egress, src))
    } else {
        None
    }
}

/// The policy chains the pod's firewall chain jumps to for `direction`,
/// with the NetworkPolicy each names.
fn policies_of(
    lines: &[Line],
    chain: &str,
    direction: Direction,
    pod_ns: Option<&str>,
) -> Vec<PolicyChain> {
    lines
        .iter()
        .filter(|l| l.chain == chain && l.target.starts_with(POLICY))
        .filter(|l| !OWN_CHAINS.contains(&l.target.as_str()))
        .filter(|l| match direction {
            Direction::Ingress => l.src.is_none(),
            Direction::Egress => l.dst.is_none(),
        })
        .map(|l| PolicyChain {
            chain: l.target.clone(),
            policy: l.comment.as_deref().and_then(|c| policy_of(c, pod_ns)),
        })
        .collect()
}

#[cfg(test)]
mod tests;
