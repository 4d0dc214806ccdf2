//! Names in the finding: which ends of a connection to look up as pods,
//! and the summary's lead naming them as `kubectl` does (`pod
//! shop/cart-7d9f5c8b6-x2kqp → service shop/mysql:3306 → pod
//! data/mysql-0: ...`). Addresses stay in the evidence.
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use crate::model::{
    finding::Finding,
    packet::{Ct, Tuple},
    pod::{ConnPods, Pod},
};

/// The ends of a connection: who started it, who serves it, and the
/// virtual address it was sent to when that was DNAT'd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ends {
    pub client: IpAddr,
    pub server: IpAddr,
    pub vip: Option<SocketAddr>,
}

/// The ends of the connection of a packet `tuple` (a SYN-ACK goes from
/// the server to the client) that carried `ct`: the entry knows better
/// (its original source started it, its reply comes from the server it
/// reached; with `dst_nat` set in its status, its original destination was
/// a virtual address).
pub fn ends(tuple: &Tuple, syn_ack: bool, ct: Option<&Ct>, dst_nat: u32) -> Ends {
    if let Some(ct) = ct {
        return Ends {
            client: ct.orig.src.ip(),
            server: ct.reply.src.ip(),
            vip: (dst_nat != 0 && ct.status & dst_nat != 0).then_some(ct.orig.dst),
        };
    }
    let t = if syn_ack { tuple.reversed() } else { *tuple };
    Ends {
        client: t.src.ip(),
        server: t.dst.ip(),
        vip: None,
    }
}

/// How the summary names the pods and Service: first the pod the record
/// is in, then the other end. None when no pod is involved.
pub fn lead(p: &ConnPods) -> Option<String> {
    let phrase = |p: &Option<Pod>| p.as_ref().map(Pod::phrase);
    let own = phrase(&p.pod);
    let other = |end: &Option<Pod>| phrase(end).filter(|e| Some(e) != own.as_ref());
    let service = p.service.as_ref().map(|s| format!("service {s}"));
    let (client, backend) = (other(&p.client), other(&p.backend));
    let is = |end: &Option<Pod>| p.pod.is_some() && end == &p.pod;
    let path = |parts: Vec<Option<String>>| {
        let parts: Vec<String> = parts.into_iter().flatten().collect();
        (!parts.is_empty()).then(|| parts.join(" → "))
    };
    match own {
        // It died in the pod that serves the connection.
        Some(own) if is(&p.backend) && !is(&p.client) => {
            let from = match (client, service) {
                (Some(c), Some(s)) => format!(", from {c} through {s}"),
                (Some(c), None) => format!(", from {c}"),
                (None, Some(s)) => format!(", through {s}"),
                (None, None) => String::new(),
            };
            Some(format!("{own}{from}"))
        }
        // In the client's pod (or one between).
        Some(own) => path(vec![Some(own), service, backend]),
        // On the node: the connection as far as it is known.
        None => match (client, service, backend) {
            (Some(c), s, b) => path(vec![Some(c), s, b]),
            (None, s, b) => path(vec![s, b]).map(|to| format!("to {to}")),
        },
    }
}

/// Puts the lead before the finding's summary.
/// A summary that already starts with the Service (`Service ns/svc port
/// p80 has no ready endpoints`) is not told it again.
pub fn name_pods(f: &mut Arc<Finding>, p: &ConnPods) {
    if let Some(summary) = summary_with_pods(f, p) {
        Arc::make_mut(f).summary = summary;
    }
}

/// The summary `name_pods` gives `f`, if the pods change it: a finding
/// shared with other records is copied only then.
fn summary_with_pods(f: &Finding, p: &ConnPods) -> Option<String> {
    let mut p = p.clone();
    if let Some(svc) = &p.service {
        let base = svc.split(':').next().unwrap_or(svc);
        if f.summary.starts_with(&format!("Service {base} ")) {
            p.service = None;
        }
    }
    lead(&p).map(|lead| format!("{lead}: {}", f.summary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pod::PodId;

    fn pod(ns: &str, name: &str) -> Option<Pod> {
        Some(Pod {
            id: PodId::Named {
                namespace: ns.into(),
                name: name.into(),
            },
            containers: Some("c".into()),
            labels: None,
        })
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_summary_naming_its_service_is_not_told_twice() {
        let mut p = ConnPods {
            service: Some("ns6/svc6:80".into()),
            ..Default::default()
        };
        let mut f = Arc::new(Finding {
            summary: "Service ns6/svc6 port p80 has no ready endpoints".into(),
            ..Default::default()
        });
        name_pods(&mut f, &p);
        assert_eq!(
            f.summary,
            "Service ns6/svc6 port p80 has no ready endpoints"
        );
        p.client = pod("shop", "cart-1");
        name_pods(&mut f, &p);
        assert_eq!(
            f.summary,
            "pod shop/cart-1: Service ns6/svc6 port p80 has no ready endpoints"
        );
        let mut g = Arc::new(Finding {
            summary: "iptables-legacy rule 1 in filter/FORWARD dropped it".into(),
            ..Default::default()
        });
        name_pods(
            &mut g,
            &ConnPods {
                service: Some("ns1/svc1:80".into()),
                ..Default::default()
            },
        );
        assert_eq!(
            g.summary,
            "to service ns1/svc1:80: iptables-legacy rule 1 in filter/FORWARD dropped it"
        );
    }

    #[test]
    fn ends_of_a_connection() {
        let syn = Tuple {
            src: sa("10.244.7.2:40000"),
            dst: sa("10.96.0.10:3306"),
        };
        let plain = ends(&syn, false, None, 0x20);
        assert_eq!(
            (plain.client, plain.server, plain.vip),
            (syn.src.ip(), syn.dst.ip(), None)
        );
        // A SYN-ACK travels from the server.
        let back = ends(&syn.reversed(), true, None, 0x20);
        assert_eq!((back.client, back.server), (syn.src.ip(), syn.dst.ip()));
        // DNAT'd: the server is who the reply comes from.
        let ct = Ct {
            orig: syn,
            reply: Tuple {
                src: sa("10.244.7.9:3306"),
                dst: sa("10.244.7.2:40000"),
            },
            status: 0x20 | 0x8,
            mark: 0,
            zone: 0,
            ctinfo: 0,
        };
        let e = ends(&syn, false, Some(&ct), 0x20);
        assert_eq!(
            (e.client, e.server, e.vip),
            (syn.src.ip(), ct.reply.src.ip(), Some(syn.dst))
        );
        // Not DNAT'd (the bit is not set, or unknown on this kernel).
        assert_eq!(ends(&syn, false, Some(&ct), 0x40).vip, None);
        assert_eq!(ends(&syn, false, Some(&ct), 0).vip, None);
    }

    #[test]
    fn the_summary_starts_with_the_pod_it_died_in() {
        let cart = pod("shop", "cart-7d9f5c8b6-x2kqp");
        let db = pod("data", "mysql-0");
        let svc = Some("data/mysql:3306".to_string());
        let lead_of = |pod, client, service: &Option<String>, backend| {
            lead(&ConnPods {
                pod,
                client,
                service: service.clone(),
                backend,
            })
        };
        // In the client's pod.
        assert_eq!(
            lead_of(cart.clone(), cart.clone(), &svc, db.clone()).as_deref(),
            Some("pod shop/cart-7d9f5c8b6-x2kqp → service data/mysql:3306 → pod data/mysql-0")
        );
        assert_eq!(
            lead_of(cart.clone(), None, &None, None).as_deref(),
            Some("pod shop/cart-7d9f5c8b6-x2kqp")
        );
        // In the backend's.
        assert_eq!(
            lead_of(db.clone(), cart.clone(), &None, db.clone()).as_deref(),
            Some("pod data/mysql-0, from pod shop/cart-7d9f5c8b6-x2kqp")
        );
        assert_eq!(
            lead_of(db.clone(), cart.clone(), &svc, db.clone()).as_deref(),
            Some("pod data/mysql-0, from pod shop/cart-7d9f5c8b6-x2kqp through service data/mysql:3306")
        );
        // On the node.
        assert_eq!(
            lead_of(None, cart.clone(), &None, db.clone()).as_deref(),
            Some("pod shop/cart-7d9f5c8b6-x2kqp → pod data/mysql-0")
        );
        assert_eq!(
            lead_of(None, None, &svc, db.clone()).as_deref(),
            Some("to service data/mysql:3306 → pod data/mysql-0")
        );
        assert_eq!(lead_of(None, None, &None, None), None);
        // Its own client and backend (a hairpin to itself): named as the
        // client's side, through the service.
        assert_eq!(
            lead_of(cart.clone(), cart.clone(), &svc, cart.clone()).as_deref(),
            Some("pod shop/cart-7d9f5c8b6-x2kqp → service data/mysql:3306")
        );
        // A pod talking to itself is named once.
        assert_eq!(
            lead_of(cart.clone(), cart.clone(), &None, cart.clone()).as_deref(),
            Some("pod shop/cart-7d9f5c8b6-x2kqp")
        );
        let mut f = Arc::new(Finding {
            summary: "SYN dropped".into(),
            ..Finding::default()
        });
        name_pods(
            &mut f,
            &ConnPods {
                pod: cart,
                ..ConnPods::default()
            },
        );
        assert_eq!(f.summary, "pod shop/cart-7d9f5c8b6-x2kqp: SYN dropped");
    }
}
