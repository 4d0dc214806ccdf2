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
        r.pods = ConnPods {
            pod: self.node.pod(r.netns),
            client: self.node.pod_of_addr(ends.client),
            service: ends.vip.and_then(|vip| self.node.service(r.netns, vip)),
            backend: self.node.pod_of_addr(ends.server),
        };
    }
}
