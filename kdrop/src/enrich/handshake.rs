//! Records of handshakes that died without a drop: a SYN never answered
//! ("unanswered"), a SYN-ACK answered by a RST ("reset"), and the hairpin
//! finding both of those and a refused SYN-ACK can lead to.
use super::Enricher;
use crate::{
    context::Node,
    diagnosis::handshake::{self, BridgeFacts, Flow, Reset},
    model::{finding::Finding, packet::Tuple, record::DropRecord},
};

impl<N: Node> Enricher<N> {
    /// A handshake that died silently, as an event of kind "unanswered";
    /// `back` is the same SYN come back DNAT'd (incident 4).
    pub(super) fn unanswered(&mut self, flow: &Flow, back: Option<&Flow>) -> DropRecord {
        let ns = self.netns_name(flow.netns);
        let ifname = self.node.ifname(flow.netns, flow.ifindex);
        let tables = self
            .node
            .routing(flow.netns)
            .map(|c| c.tables.clone())
            .unwrap_or_default();
        let exec = ns.exec();
        let finding = match back {
            Some(back) => {
                let status = self.status(back.ct.as_ref());
                handshake::looped_back(flow, back, &status, &tables, &exec)
            }
            None => {
                let status = self.status(flow.ct.as_ref());
                handshake::unanswered(flow, &self.ct_bits, &status, &tables, &exec)
            }
        };
        DropRecord {
            ts: self.ts(flow.last_ns),
            kind: "unanswered",
            netns: flow.netns,
            netns_name: ns.name,
            ifname,
            ifindex: flow.ifindex,
            family: if flow.orig.src.is_ipv4() {
                "ipv4"
            } else {
                "ipv6"
            },
            saddr: flow.orig.src.ip(),
            sport: flow.orig.src.port(),
            daddr: flow.orig.dst.ip(),
            dport: flow.orig.dst.port(),
            tcp_flags: "SYN".into(),
            reason: None,
            location: String::new(),
            mark: 0,
            route_lookups: Vec::new(),
            ct: back
                .and_then(|b| b.ct.as_ref())
                .or(flow.ct.as_ref())
                .map(|c| self.ct_record(c)),
            netfilter: None,
            finding: Some(finding),
        }
    }

    /// A SYN-ACK answered by a RST, as an event of kind "reset".
    pub(super) fn reset(&mut self, r: &Reset) -> DropRecord {
        let ns = self.netns_name(r.rst.netns);
        let ifname = self.node.ifname(r.rst.netns, r.rst.ifindex);
        let at = self.netns_name(r.syn_ack_at.netns);
        let syn_ack_dev = self.node.ifname(r.syn_ack_at.netns, r.syn_ack_at.ifindex);
        let seen = handshake::reset_seen(r, &syn_ack_dev, &at.display(), &ifname, &ns.display());
        let dnat = r
            .flow
            .as_ref()
            .filter(|f| f.ct.is_some_and(|c| c.status & self.ct_bits.dst_nat != 0));
        let finding = match dnat {
            Some(flow) => self.hairpin(flow, &r.syn_ack, &seen),
            None => None,
        }
        .unwrap_or_else(|| handshake::reset(r, &seen));
        // The handshake as the client started it, when kdrop saw it.
        let t = r
            .flow
            .as_ref()
            .map_or(r.rst.tuple, |f| f.ct.map_or(f.orig, |c| c.orig));
        DropRecord {
            ts: self.ts(r.rst.ts_ns),
            kind: "reset",
            netns: r.rst.netns,
            netns_name: ns.name,
            ifname,
            ifindex: r.rst.ifindex,
            family: if t.src.is_ipv4() { "ipv4" } else { "ipv6" },
            saddr: t.src.ip(),
            sport: t.src.port(),
            daddr: t.dst.ip(),
            dport: t.dst.port(),
            tcp_flags: crate::model::packet::tcp_flags(r.rst.tcp_flags),
            reason: None,
            location: String::new(),
            mark: r.rst.mark,
            route_lookups: Vec::new(),
            ct: r
                .flow
                .as_ref()
                .and_then(|f| f.ct.as_ref())
                .map(|c| self.ct_record(c)),
            netfilter: None,
            finding: Some(finding),
        }
    }

    /// The SYN-ACK of a DNAT'd handshake left un-NAT'd: the hairpin
    /// finding, with `kernel` (the refused SYN-ACK's drop, or the client's
    /// RST) as its first evidence.
    pub(super) fn hairpin(
        &mut self,
        flow: &Flow,
        syn_ack: &Tuple,
        kernel: &str,
    ) -> Option<Finding> {
        let ns = self.node.netns(flow.netns)?;
        let ctx = self.node.routing(flow.netns)?;
        let status = self.status(flow.ct.as_ref());
        let bridge = BridgeFacts {
            br_netfilter_loaded: self.node.br_netfilter_loaded(),
            call_iptables: ctx.confs.bridge_nf_call_iptables,
        };
        handshake::hairpin(
            syn_ack,
            flow,
            &status,
            &ctx.tables,
            &bridge,
            kernel,
            &ns.exec(),
        )
    }
}
