//! A drop by a network policy engine (Calico's and kube-router's chains,
//! Cilium's tc programs),
//! in Kubernetes terms: the pods at both ends of the connection (by
//! address, as the runtime recorded them) and the chains of the
//! namespace's ruleset that ended it.
use std::net::{IpAddr, SocketAddr};

use kdrop_common::{TCP_ACK, TCP_SYN};

use super::Enricher;
use crate::{
    context::Node,
    diagnosis::{
        calico, cilium, kube_router, names,
        netpol::{
            policy::{Peer, Workload},
            Conn, Direction,
        },
    },
    model::{
        finding::Finding,
        packet::{Drop, Tuple},
        pod::{Pod, PodId},
        policy::PolicyDrop,
        record::DropRecord,
    },
};

/// A connection's ends, owned: [`Conn`] borrows them.
struct Ends {
    protected: Option<Workload>,
    peer: Peer,
    protected_addr: IpAddr,
    peer_addr: IpAddr,
    port: u16,
}

impl Ends {
    fn conn(&self) -> Conn<'_> {
        Conn {
            protected: self.protected.as_ref(),
            peer: &self.peer,
            protected_addr: self.protected_addr,
            peer_addr: self.peer_addr,
            port: self.port,
        }
    }
}

impl<N: Node> Enricher<N> {
    pub(super) fn explain_network_policy(
        &mut self,
        d: &Drop,
        r: &DropRecord,
    ) -> Option<(Finding, PolicyDrop)> {
        if let Some(found) = self.explain_cilium(d, r) {
            return Some(found);
        }
        let a = r.netfilter.as_ref()?;
        let chain = a.chain.as_deref()?;
        let facts = super::drop::facts(r, d.tcp_flags, Some(a));
        if let Some(felix_chain) = calico::felix::chain_of(a) {
            let snap = self.node.netfilter_latest(d.netns)?;
            // Only a policy chain shared by several workloads needs the
            // device the packet was routed to (its ingress endpoint).
            let out = if felix_chain.starts_with("cali-p") {
                self.node
                    .route_out(d.netns, d.daddr)
                    .map(|i| self.node.ifname(d.netns, i))
            } else {
                None
            };
            let drop = calico::classify(a, &snap.tables, &r.ifname, out.as_deref())?;
            let ends = self.ends(d, drop.direction);
            return Some(calico::finding::explain(&drop, &ends.conn(), a, &facts));
        }
        if chain.starts_with(kube_router::POD_FW) {
            let snap = self.node.netfilter_latest(d.netns)?;
            let drop = kube_router::classify(a, &snap.tables, d.saddr, d.daddr)?;
            let ends = self.ends(d, drop.direction);
            return Some(kube_router::finding::explain(
                &drop,
                &ends.conn(),
                a,
                &facts,
            ));
        }
        None
    }

    /// A packet Cilium's tc program dropped for a policy reason its metrics
    /// map counted.
    fn explain_cilium(&mut self, d: &Drop, r: &DropRecord) -> Option<(Finding, PolicyDrop)> {
        let hook = match r.reason.as_deref()? {
            "TC_INGRESS" => "ingress",
            "TC_EGRESS" => "egress",
            _ => return None,
        };
        let progs = self.node.hook_programs(d.netns, d.ifindex, hook)?;
        let drop = cilium::classify(&progs).filter(|c| c.is_policy())?;
        let dir = drop.direction?;
        let ends = self.ends(d, dir);
        let facts = super::drop::facts(r, d.tcp_flags, None);
        Some(cilium::finding::explain(&drop, dir, &ends.conn(), &facts))
    }

    /// The protected pod (the server for ingress, the client for egress),
    /// its peer, and the connection's addresses and server port.
    fn ends(&mut self, d: &Drop, dir: Direction) -> Ends {
        let syn_ack = d.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK;
        let tuple = Tuple {
            src: SocketAddr::new(d.saddr, d.sport),
            dst: SocketAddr::new(d.daddr, d.dport),
        };
        let ends = names::ends(&tuple, syn_ack, d.ct.as_ref(), self.ct_bits.dst_nat);
        let port = if syn_ack { d.sport } else { d.dport };
        let (protected_addr, peer_addr) = match dir {
            Direction::Ingress => (ends.server, ends.client),
            Direction::Egress => (ends.client, ends.server),
        };
        let protected = self
            .node
            .pod_of_addr(protected_addr)
            .and_then(|p| self.workload(p));
        Ends {
            protected,
            peer: self.peer(peer_addr),
            protected_addr,
            peer_addr,
            port,
        }
    }

    fn peer(&mut self, addr: IpAddr) -> Peer {
        self.node
            .pod_of_addr(addr)
            .and_then(|p| self.workload(p))
            .map_or(Peer::Addr(addr), Peer::Pod)
    }

    /// A pod the runtime named, as a policy selects it, with its labels:
    /// from the runtime's records on the node (CRI-O's bundles), else asked
    /// of the runtime over CRI (containerd's), here only, where the
    /// NetworkPolicy's selectors need them.
    fn workload(&mut self, p: Pod) -> Option<Workload> {
        let (namespace, name) = match &p.id {
            PodId::Named { namespace, name } => (namespace.clone(), name.clone()),
            _ => return None,
        };
        let labels = match p.labels {
            Some(l) => Ok(l),
            None => self.node.pod_labels(&p.id),
        };
        Some(Workload {
            namespace,
            name,
            labels,
        })
    }
}
