//! Kubernetes names from kube-proxy's rules: Services by virtual address,
//! node port and endpoint (services.rs), and the drops kube-proxy's own
//! rules make, explained as Kubernetes objects (finding.rs).
pub mod finding;
pub mod nft;
pub mod services;

use std::net::SocketAddr;

pub use self::services::{Frontend, Kind, KubeRule, Services, SvcPort};
use crate::model::netfilter::{Attribution, Backend};

/// A drop by a rule kube-proxy (or the kubelet, for KUBE-FIREWALL) wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeDrop {
    /// `"ns/svc:port has no endpoints" -j REJECT`.
    NoEndpoints { svc: SvcPort, kind: Kind },
    /// `"ns/svc:port has no local endpoints" -j DROP` (external or internal
    /// traffic policy Local); `marked`: a KUBE-XLB/KUBE-SVL chain set
    /// KUBE-MARK-DROP's 0x8000 and KUBE-FIREWALL dropped it (before 1.25).
    NoLocalEndpoints {
        svc: SvcPort,
        kind: Kind,
        marked: bool,
    },
    /// Not from a `loadBalancerSourceRanges` source (KUBE-PROXY-FIREWALL,
    /// or KUBE-FW-* marking it for KUBE-FIREWALL before 1.25).
    SourceRange { svc: SvcPort },
    /// KUBE-FORWARD's `--ctstate INVALID -j DROP`.
    ForwardInvalid,
    /// KUBE-FIREWALL's "block incoming localnet connections".
    Localnet,
    /// KUBE-FIREWALL's mark drop with no kube-proxy rule found that marks
    /// this destination.
    Marked,
}

/// What kube-proxy's rule that dropped a packet to `dst` means; `local`:
/// `dst` is one of the namespace's own addresses (a node port).
pub fn classify(
    a: &Attribution,
    services: &Services,
    dst: SocketAddr,
    local: bool,
) -> Option<KubeDrop> {
    let frontend = services.frontend(dst, local);
    if a.backend == Some(Backend::Nftables) {
        return classify_nft(a, services, dst, local);
    }
    let rule = KubeRule::parse(a.rule.as_deref()?)?;
    let named = |svc: Option<SvcPort>| {
        // The rule's own comment names the Service; the map gives the number.
        let svc = svc?;
        Some(
            frontend
                .filter(|f| f.svc.key() == svc.key())
                .map_or(svc, |f| f.svc.clone()),
        )
    };
    let remark = rule.remark();
    match rule.chain.as_str() {
        "KUBE-SERVICES" | "KUBE-EXTERNAL-SERVICES" => {
            without_endpoints(&rule, frontend, named(rule.svc())?)
        }
        "KUBE-PROXY-FIREWALL" => Some(KubeDrop::SourceRange {
            svc: named(rule.svc())?,
        }),
        "KUBE-FORWARD" if rule.ctstate.as_deref() == Some("INVALID") => {
            Some(KubeDrop::ForwardInvalid)
        }
        "KUBE-FIREWALL" if rule.mark.is_some() => Some(marked(services, frontend)),
        "KUBE-FIREWALL" if remark.is_empty() && rule.comment.is_some() => None,
        "KUBE-FIREWALL"
            if rule.comment.as_deref() == Some("block incoming localnet connections") =>
        {
            Some(KubeDrop::Localnet)
        }
        _ => None,
    }
}

/// A filter rule of a Service without endpoints (`has no endpoints`) or
/// without local ones; its kind from the frontend, else from the rule.
fn without_endpoints(
    rule: &KubeRule,
    frontend: Option<&Frontend>,
    svc: SvcPort,
) -> Option<KubeDrop> {
    let kind = match (frontend, rule.dst, rule.dst_local) {
        (Some(f), _, _) => f.kind,
        (None, None, true) => Kind::NodePort,
        _ if rule.chain == "KUBE-SERVICES" => Kind::ClusterIp,
        _ => Kind::ExternalIp,
    };
    match rule.remark() {
        "has no endpoints" => Some(KubeDrop::NoEndpoints { svc, kind }),
        "has no local endpoints" => Some(KubeDrop::NoLocalEndpoints {
            svc,
            kind,
            marked: false,
        }),
        _ => None,
    }
}

/// A packet KUBE-FIREWALL dropped for its mark: which Service marked it
/// (no local endpoints, or a source range), when its frontend says.
fn marked(services: &Services, frontend: Option<&Frontend>) -> KubeDrop {
    let Some(f) = frontend else {
        return KubeDrop::Marked;
    };
    match services.mark_drops.get(&f.svc.key()) {
        Some(true) => KubeDrop::NoLocalEndpoints {
            svc: f.svc.clone(),
            kind: f.kind,
            marked: true,
        },
        Some(false) => KubeDrop::SourceRange { svc: f.svc.clone() },
        None => KubeDrop::Marked,
    }
}

/// A drop in kube-proxy's nftables table: by its no-endpoint verdict maps
/// (reject through `reject-chain`, or drop), or by a Service's
/// `firewall-*` chain (loadBalancerSourceRanges).
fn classify_nft(a: &Attribution, s: &Services, dst: SocketAddr, local: bool) -> Option<KubeDrop> {
    if a.table.as_deref() != Some(nft::TABLE) {
        return None;
    }
    let chain = a.chain.as_deref()?;
    if let Some(("firewall", svc, _)) = nft::chain_svc(chain) {
        let svc = s.frontend(dst, local).map_or(svc, |f| f.svc.clone());
        return Some(KubeDrop::SourceRange { svc });
    }
    if !matches!(
        chain,
        "reject-chain" | "service-endpoints-check" | "nodeport-endpoints-check"
    ) {
        return None;
    }
    let (svc, reject, kind) = match s.nft_no_endpoints.get(&dst) {
        Some((svc, reject)) => {
            let kind = s.vips.get(&dst).map_or(Kind::ExternalIp, |f| f.kind);
            (svc.clone(), *reject, kind)
        }
        None if local => {
            let (svc, reject) = s.nft_no_endpoint_ports.get(&dst.port())?;
            (svc.clone(), *reject, Kind::NodePort)
        }
        None => return None,
    };
    Some(if reject {
        KubeDrop::NoEndpoints { svc, kind }
    } else {
        KubeDrop::NoLocalEndpoints {
            svc,
            kind,
            marked: false,
        }
    })
}
