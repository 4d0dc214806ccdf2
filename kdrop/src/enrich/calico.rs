//! A drop in Calico's chains, in Kubernetes terms: the pods at both ends
//! of the connection (by address, as the runtime recorded them) and the
//! chains of the namespace's ruleset that ended it.
use std::net::{IpAddr, SocketAddr};

use kdrop_common::{TCP_ACK, TCP_SYN};

use super::Enricher;
use crate::{
    context::Node,
    diagnosis::{
        calico::{
            self,
            finding::Conn,
            policy::{Peer, Workload},
            Direction,
        },
        names,
    },
    model::{
        finding::Finding,
        packet::{Drop, Tuple},
        pod::{Pod, PodId},
        policy::PolicyDrop,
        record::DropRecord,
    },
};

impl<N: Node> Enricher<N> {
    pub(super) fn explain_calico(
        &mut self,
        d: &Drop,
        r: &DropRecord,
    ) -> Option<(Finding, PolicyDrop)> {
        let a = r.netfilter.as_ref()?;
        if !a.chain.as_deref()?.starts_with("cali-") {
            return None;
        }
        let snap = self.node.netfilter_latest(d.netns)?;
        // Only a policy chain shared by several workloads needs the device
        // the packet was routed to (its ingress endpoint).
        let out = if a.chain.as_deref()?.starts_with("cali-p") {
            self.node
                .route_out(d.netns, d.daddr)
                .map(|i| self.node.ifname(d.netns, i))
        } else {
            None
        };
        let drop = calico::classify(a, &snap.tables, &r.ifname, out.as_deref())?;
        let syn_ack = d.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK;
        let tuple = Tuple {
            src: SocketAddr::new(d.saddr, d.sport),
            dst: SocketAddr::new(d.daddr, d.dport),
        };
        let ends = names::ends(&tuple, syn_ack, d.ct.as_ref(), self.ct_bits.dst_nat);
        let port = if syn_ack { d.sport } else { d.dport };
        let (protected_addr, peer_addr) = match drop.direction {
            Direction::Ingress => (ends.server, ends.client),
            Direction::Egress => (ends.client, ends.server),
        };
        let protected = self
            .node
            .pod_of_addr(protected_addr)
            .and_then(|p| self.workload(p));
        let peer = self.peer(peer_addr);
        let conn = Conn {
            protected: protected.as_ref(),
            peer: &peer,
            protected_addr,
            peer_addr,
            port,
        };
        let facts = super::drop::facts(r, d.tcp_flags, Some(a));
        Some(calico::finding::explain(&drop, &conn, a, &facts))
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
