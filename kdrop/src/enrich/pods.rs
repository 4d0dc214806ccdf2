//! The pods a record involves: the one whose network namespace it is in,
//! and the connection's client and backend, found by address among the
//! pods the runtime recorded. The finding's summary names them once the
//! record has its handshake's verdict (`Enricher::fold`).
use super::Enricher;
use crate::{
    context::Node,
    diagnosis::names,
    model::{
        packet::{Ct, Tuple},
        pod::ConnPods,
        record::DropRecord,
    },
};

impl<N: Node> Enricher<N> {
    /// Fills the record's pods; `tuple` is the packet's (`syn_ack`: from
    /// the server), `ct` the entry it carried.
    pub(super) fn name_pods(
        &mut self,
        r: &mut DropRecord,
        tuple: &Tuple,
        syn_ack: bool,
        ct: Option<&Ct>,
    ) {
        let ends = names::ends(tuple, syn_ack, ct, self.ct_bits.dst_nat);
        let to = if syn_ack { tuple.src } else { tuple.dst };
        r.pods = ConnPods {
            pod: self.node.pod(r.netns),
            client: self.node.pod_of_addr(ends.client),
            // The address the client sent to: the entry's original
            // destination when it was DNAT'd, else the packet's own.
            service: self.node.service(r.netns, ends.vip.unwrap_or(to)),
            backend: self.node.pod_of_addr(ends.server),
        };
    }
}
