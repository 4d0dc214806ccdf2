//! A drop by kube-proxy's own rules as a [`Finding`] in Kubernetes terms.
//! `fix` stays empty: kube-proxy rewrites its rules within seconds of any
//! change, so deleting one repairs nothing; the repair is a change to the
//! Service or its pods, named in `fix_notes`, and `inspect` shows them.
use super::{Kind, KubeDrop, SvcPort};
use crate::model::cause::Cause;
use crate::{
    diagnosis::reason::{reason_evidence, DropFacts},
    model::{
        finding::Finding,
        netfilter::{Attribution, Backend, Family},
    },
};

const REWRITTEN: &str = "kube-proxy wrote this rule and rewrites it within seconds of any \
                         change: deleting it repairs nothing";

fn kubectl(svc: &SvcPort) -> Vec<String> {
    let (ns, name) = (&svc.namespace, &svc.name);
    vec![
        format!("kubectl -n {ns} get endpointslices -l kubernetes.io/service-name={name}"),
        format!("kubectl -n {ns} get svc {name} -o yaml"),
    ]
}

/// `iptables-nft -t filter -L KUBE-SERVICES -v -n -x --line-numbers`.
fn listing(a: &Attribution, ns: &str) -> Option<String> {
    let tool = match (a.backend?, a.family) {
        (Backend::Nftables, _) => return None,
        (Backend::IptablesLegacy, Some(Family::Ip6)) => "ip6tables-legacy",
        (Backend::IptablesLegacy, _) => "iptables-legacy",
        (_, Some(Family::Ip6)) => "ip6tables-nft",
        _ => "iptables-nft",
    };
    Some(format!(
        "{ns}{tool} -t {} -L {} -v -n -x --line-numbers",
        a.table.as_deref()?,
        a.chain.as_deref()?
    ))
}

fn service(svc: &SvcPort) -> String {
    format!(
        "Service {}/{} {}",
        svc.namespace,
        svc.name,
        svc.port_phrase()
    )
}

/// `its node port 3001`, `its cluster IP 172.30.0.46:80`.
fn reached(kind: Kind, dst: &str) -> String {
    match kind {
        Kind::NodePort => format!(
            "its node port {}",
            dst.rsplit_once(':').map_or(dst, |(_, p)| p)
        ),
        k => format!("its {} {dst}", k.name()),
    }
}

/// What a finding says of one kind of kube-proxy drop: its cause and
/// summary, the notes on the repair and the commands that show it.
struct Words {
    cause: Cause,
    summary: String,
    notes: Vec<String>,
    inspect: Vec<String>,
}

fn no_endpoints(svc: &SvcPort, kind: Kind, f: &DropFacts) -> Words {
    Words {
        cause: Cause::KubeNoEndpoints,
        summary: format!(
            "{} has no ready endpoints: kube-proxy rejects new connections to {}",
            service(svc),
            reached(kind, &f.dst)
        ),
        notes: vec![format!(
            "give the Service ready endpoints: pods in namespace {} that match its selector, \
             pass their readiness probe and serve the port its targetPort names; or point \
             the client at a Service that has them",
            svc.namespace
        )],
        inspect: kubectl(svc),
    }
}

fn no_local_endpoints(svc: &SvcPort, kind: Kind, marked: bool, f: &DropFacts) -> Words {
    let external = kind.external();
    let policy = if external {
        "externalTrafficPolicy"
    } else {
        "internalTrafficPolicy"
    };
    let (masq, health) = if external {
        (
            " and the client's source address is masqueraded",
            " (a load balancer does that when it health-checks the Service's \
             healthCheckNodePort)",
        )
    } else {
        ("", "")
    };
    let how = if marked {
        "; kube-proxy's KUBE-XLB chain set the KUBE-MARK-DROP mark (0x8000) and \
         KUBE-FIREWALL dropped the marked packet"
    } else {
        ""
    };
    Words {
        cause: Cause::KubeNoLocalEndpoints,
        summary: format!(
            "{} has no endpoint on this node and {policy} is Local: kube-proxy drops \
             new connections to {} here{how}",
            service(svc),
            reached(kind, &f.dst)
        ),
        notes: vec![format!(
            "run a ready endpoint of the Service on this node, or set {policy}: Cluster \
             (then traffic is forwarded to endpoints on other nodes{masq}), or send the \
             traffic only to nodes that have an endpoint{health}"
        )],
        inspect: kubectl(svc),
    }
}

fn source_range(svc: &SvcPort, f: &DropFacts) -> Words {
    // `[2001:db8::7]:40000` too: the field takes CIDRs, not bracketed
    // addresses.
    let (client, cidr) = match f.src.parse::<std::net::SocketAddr>() {
        Ok(a) => {
            let len = if a.is_ipv4() { 32 } else { 128 };
            (a.ip().to_string(), format!("{}/{len}", a.ip()))
        }
        Err(_) => (f.src.clone(), f.src.clone()),
    };
    Words {
        cause: Cause::KubeSourceRanges,
        summary: format!(
            "{} accepts its load-balancer IP only from spec.loadBalancerSourceRanges, \
             and {client} is not in them",
            service(svc)
        ),
        notes: vec![format!(
            "add the client's address ({cidr}) to the Service's \
             spec.loadBalancerSourceRanges, or connect from an address it allows"
        )],
        inspect: kubectl(svc),
    }
}

fn forward_invalid(ns: &str) -> Words {
    Words {
        cause: Cause::KubeForwardInvalid,
        summary: "conntrack could not place this forwarded packet in a connection (state \
                  INVALID) and kube-proxy's KUBE-FORWARD chain drops INVALID packets"
            .to_string(),
        notes: vec![
            "conntrack calls a packet INVALID when it fits no connection it tracks (a reply \
             it never saw the start of, a sequence number out of window): a path that \
             skips this node one way, or an entry that expired, is the usual cause; \
             net.netfilter.nf_conntrack_tcp_be_liberal=1 makes conntrack accept \
             out-of-window packets"
                .into(),
        ],
        inspect: vec![format!("{ns}conntrack -S")],
    }
}

fn words(k: &KubeDrop, f: &DropFacts, ns: &str) -> Words {
    match k {
        KubeDrop::NoEndpoints { svc, kind } => no_endpoints(svc, *kind, f),
        KubeDrop::NoLocalEndpoints { svc, kind, marked } => {
            no_local_endpoints(svc, *kind, *marked, f)
        }
        KubeDrop::SourceRange { svc } => source_range(svc, f),
        KubeDrop::ForwardInvalid => forward_invalid(ns),
        KubeDrop::Localnet => Words {
            cause: Cause::KubeLocalnet,
            summary: "KUBE-FIREWALL blocks connections to 127.0.0.0/8 that do not come from it \
                      (\"block incoming localnet connections\", with route_localnet on)"
                .to_string(),
            notes: vec![
                "only the node itself may connect to 127.0.0.0/8: connect to the node's own \
                 address (a node port answers there), not to localhost from another host"
                    .into(),
            ],
            inspect: Vec::new(),
        },
        KubeDrop::Marked => Words {
            cause: Cause::KubeMarkedDrop,
            summary: "a kube-proxy chain in nat set the KUBE-MARK-DROP mark (0x8000) and \
                      KUBE-FIREWALL dropped the marked packet; no rule found names the Service"
                .to_string(),
            notes: Vec::new(),
            inspect: Vec::new(),
        },
    }
}

pub fn explain(k: &KubeDrop, a: &Attribution, f: &DropFacts) -> Finding {
    let ns = f
        .netns
        .map(|n| format!("ip netns exec {n} "))
        .unwrap_or_default();
    let Words {
        cause,
        summary,
        mut notes,
        mut inspect,
    } = words(k, f, &ns);
    notes.push(REWRITTEN.into());
    inspect.extend(listing(a, &ns));
    let mut evidence = vec![reason_evidence(f), format!("method: {}", a.method)];
    if let (Some(t), Some(c), Some(r)) = (&a.table, &a.chain, &a.rule) {
        evidence.push(format!("rule in {t}/{c}: {r}"));
    }
    evidence.extend(a.evidence.iter().cloned());
    Finding {
        cause,
        summary,
        evidence,
        fix: Vec::new(),
        fix_or: Vec::new(),
        fix_notes: notes,
        inspect,
    }
}
