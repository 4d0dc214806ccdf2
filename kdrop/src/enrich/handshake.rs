//! Records of handshakes that died without a drop: a SYN never answered
//! ("unanswered"), a SYN-ACK answered by a RST ("reset"), and what the
//! node shows about a refused SYN-ACK (hairpin, LB loopback, asymmetric
//! return), which both of those and a SYN-ACK's drop can lead to.
use std::{net::SocketAddr, sync::Arc};

use kdrop_common::{TCP_ACK, TCP_SYN};

use super::Enricher;
use crate::{
    context::{conntrack_lookup::Side, Node},
    diagnosis::handshake::{
        self, refused,
        syn_ack::{self, SynAckRetransmitted},
        BridgeFacts, Flow, Refused, Reset, Translator,
    },
    model::{
        finding::Finding,
        packet::Tuple,
        record::DropRecord,
        routing::{NetnsContext, Tables},
    },
};

impl<N: Node> Enricher<N> {
    /// A handshake that died silently, as an event of kind "unanswered";
    /// `back` is the same SYN come back DNAT'd (incident 4).
    pub(super) fn unanswered(&mut self, flow: &Flow, back: Option<&Flow>) -> DropRecord {
        let mut flow = flow.clone();
        if flow.ifindex == 0 {
            // Followed from its conntrack entry, not seen leaving: the
            // device the namespace routes it out of.
            flow.ifindex = self
                .node
                .route_out(flow.netns, flow.wire.dst.ip())
                .unwrap_or(0);
        }
        let flow = &flow;
        let ns = self.netns_name(flow.netns);
        let ifname = self.node.ifname(flow.netns, flow.ifindex);
        // The repair runs where the DNAT happened: for a looped-back SYN the
        // namespace it came back into, not the client's.
        let fix_ns = back.map_or(flow.netns, |b| b.netns);
        let tables = self
            .node
            .routing(fix_ns)
            .map(|c| c.tables.clone())
            .unwrap_or_default();
        let exec = self.netns_name(fix_ns).exec();
        let finding = match back {
            Some(back) => {
                let status = self.status(back.ct.as_ref());
                handshake::lb_loopback(&handshake::looped_back(flow, back, &status, &tables), &exec)
            }
            // Both ends on one bridge that skips netfilter: a hairpin whose
            // refused SYN-ACK went by before kdrop armed what shows it.
            None => match self.silent_hairpin(flow) {
                Some(f) => f,
                None => self.unanswered_on_the_way(flow, &tables, &exec),
            },
        };
        let mut r = DropRecord {
            packet: None,
            ts: self.ts(flow.last_ns),
            kind: "unanswered",
            netns: flow.netns,
            netns_name: ns.name,
            pods: Default::default(),
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
            network_policy: None,
            handshake: None,
            finding: Some(Arc::new(finding)),
        };
        let ct = back.and_then(|b| b.ct.as_ref()).or(flow.ct.as_ref());
        self.name_pods(&mut r, &flow.orig, false, ct);
        r
    }

    /// A local server's SYN-ACK retransmitted without the final ACK, as an
    /// event of kind "unanswered" about the client's SYN.
    pub(super) fn syn_ack_unanswered(&mut self, s: &SynAckRetransmitted) -> DropRecord {
        let (server, client) = (s.syn_ack.src, s.syn_ack.dst);
        let ifindex = self.node.route_out(s.netns, client.ip()).unwrap_or(0);
        let ifname = if ifindex == 0 {
            String::new()
        } else {
            self.node.ifname(s.netns, ifindex)
        };
        let ns = self.netns_name(s.netns);
        let pending = self.node.request_pending(s.netns, server, client);
        let exec = ns.exec();
        let finding = syn_ack::unanswered(
            s,
            &syn_ack::Around {
                dev: &ifname,
                pending,
                ns: &exec,
            },
        );
        let syn = s.syn_ack.reversed();
        let mut r = DropRecord {
            packet: None,
            ts: self.ts(s.last_ns),
            kind: "unanswered",
            netns: s.netns,
            netns_name: ns.name,
            pods: Default::default(),
            ifname,
            ifindex,
            family: if client.is_ipv4() { "ipv4" } else { "ipv6" },
            saddr: client.ip(),
            sport: client.port(),
            daddr: server.ip(),
            dport: server.port(),
            tcp_flags: crate::model::packet::tcp_flags(TCP_SYN | TCP_ACK),
            reason: None,
            location: String::new(),
            mark: 0,
            route_lookups: Vec::new(),
            ct: None,
            netfilter: None,
            network_policy: None,
            handshake: None,
            finding: Some(Arc::new(finding)),
        };
        self.name_pods(&mut r, &syn, false, None);
        r
    }

    /// Was the RST `r` sent by the namespace it was seen leaving (its source
    /// one of that namespace's addresses), where kdrop traces? Then it did
    /// not refuse the SYN-ACK: a namespace that refuses one sends the RST,
    /// then frees the SYN-ACK (tcp_v4_rcv's no_tcp_socket path, kfree_skb
    /// with NO_SOCKET; a plain kfree_skb there on v5.10,
    /// https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_ipv4.c and
    /// v5.10's), a drop kdrop sees there and reports instead of the RST
    /// (`Tracker::syn_ack_dropped`). A RST still held answered a later
    /// segment with the same sequence number: the server's FIN reaching a
    /// client that aborted the open connection (SO_LINGER 0, as health
    /// checkers do) and has no socket left.
    pub(super) fn sent_where_traced(&mut self, r: &Reset) -> bool {
        let src = r.rst.tuple.src.ip();
        self.node
            .routing(r.rst.netns)
            .is_some_and(|c| c.tables.addrs.iter().any(|a| a.addr == src))
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
            .clone()
            .filter(|f| f.ct.is_some_and(|c| c.status & self.ct_bits.dst_nat != 0));
        let finding = self
            .refused(&r.syn_ack, r.rst.netns, dnat, &seen, r.rst.ts_ns)
            .unwrap_or_else(|| handshake::reset(r, &seen));
        // The handshake as the client started it, when kdrop saw it.
        let t = r
            .flow
            .as_ref()
            .map_or(r.rst.tuple, |f| f.ct.map_or(f.orig, |c| c.orig));
        let mut rec = DropRecord {
            packet: None,
            ts: self.ts(r.rst.ts_ns),
            kind: "reset",
            netns: r.rst.netns,
            netns_name: ns.name,
            pods: Default::default(),
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
            network_policy: None,
            handshake: None,
            finding: Some(Arc::new(finding)),
        };
        let ct = r.flow.as_ref().and_then(|f| f.ct.as_ref());
        self.name_pods(&mut rec, &t, false, ct);
        rec
    }

    /// A SYN-ACK the client refused (`kernel` says how), with `dnat` the
    /// DNAT'd handshake it answers when kdrop followed it: what the node
    /// shows about it (see diagnosis::handshake::refused), or None.
    pub(super) fn refused(
        &mut self,
        syn_ack: &Tuple,
        client_ns: u32,
        dnat: Option<Flow>,
        kernel: &str,
        now_ns: u64,
    ) -> Option<Finding> {
        let client = syn_ack.dst;
        let dnat_bit = self.ct_bits.dst_nat;
        // The entry whose reply side this SYN-ACK is, in the namespace that
        // DNAT'd its SYN: followed already, or found now.
        let dnat = dnat.or_else(|| {
            let seen = self
                .node
                .conntrack_find(Side::Reply, syn_ack, None)
                .filter(|s| s.ct.status & dnat_bit != 0)?;
            self.tracker
                .on_new(&seen.ct, seen.netns, now_ns, 0, &self.ct_bits);
            self.tracker.dnat_reply(syn_ack).cloned()
        });
        // The client's SYN come back into a namespace as client -> the
        // SYN-ACK's source and DNAT'd there (incident 4), else the DNAT'd
        // handshake itself.
        let back = self
            .node
            .conntrack_find(
                Side::Orig,
                &Tuple {
                    src: client,
                    dst: syn_ack.src,
                },
                None,
            )
            .filter(|s| s.ct.status & dnat_bit != 0)
            .map(|s| flow_of(&s))
            .or_else(|| dnat.clone());
        back.as_ref()?;
        let waits_for = self.node.waiting_for(client_ns, client);
        let vip = waits_for.or(dnat.as_ref().and_then(|f| f.ct).map(|c| c.orig.dst));
        let mut back_stale = match (&back, vip) {
            (Some(b), Some(vip)) if b.ct.is_some_and(|c| c.orig.dst != vip) => {
                let to_vip = Tuple {
                    src: client,
                    dst: vip,
                };
                self.node
                    .conntrack_find(Side::Orig, &to_vip, Some(b.netns))
                    .map(|_| {
                        let dev = self
                            .node
                            .route_out(b.netns, vip.ip())
                            .map(|i| self.node.ifname(b.netns, i));
                        (to_vip, dev)
                    })
            }
            _ => None,
        };
        if let (None, None, Some(b)) = (waits_for, &back_stale, &back) {
            back_stale = self.sent_elsewhere(b, client);
        }
        let contexts: Vec<Option<Arc<NetnsContext>>> = [&dnat, &back]
            .iter()
            .map(|f| f.as_ref().and_then(|f| self.node.routing(f.netns)))
            .collect();
        let dnat = match (dnat, &contexts[0]) {
            (Some(f), Some(c)) => Some(self.translator(f, c)),
            _ => None,
        };
        let back = match (back, &contexts[1]) {
            (Some(f), Some(c)) => Some(self.translator(f, c)),
            _ => None,
        };
        refused::explain(
            &Refused {
                syn_ack: *syn_ack,
                kernel: kernel.to_string(),
                waits_for,
                dnat,
                back,
                back_stale,
            },
            &self.ct_bits,
        )
    }

    /// The client's socket out of reach (another namespace, closed by a
    /// short connect timeout): did `back`'s namespace forward the same
    /// client end elsewhere first, unanswered and not NAT'd (the SYN to the
    /// load balancer's VIP that came back as `back`)? That entry, and the
    /// device it left by.
    fn sent_elsewhere(
        &mut self,
        back: &Flow,
        client: SocketAddr,
    ) -> Option<(Tuple, Option<String>)> {
        let came_back_to = back.ct?.orig.dst;
        let quiet = self.ct_bits.seen_reply | self.ct_bits.dst_nat | self.ct_bits.src_nat;
        let e = self
            .node
            .conntrack_from(back.netns, client)
            .into_iter()
            .find(|e| e.ct.orig.dst != came_back_to && e.ct.status & quiet == 0)?;
        let dev = self
            .node
            .route_out(back.netns, e.ct.orig.dst.ip())
            .map(|i| self.node.ifname(back.netns, i));
        Some((e.ct.orig, dev))
    }

    /// The hairpin seen from its silence (refused::silent_hairpin).
    fn silent_hairpin(&mut self, flow: &Flow) -> Option<Finding> {
        flow.ct?;
        let ctx = self.node.routing(flow.netns)?;
        let d = self.translator(flow.clone(), &ctx);
        refused::silent_hairpin(&d, &self.ct_bits, handshake::findings::transmissions(flow))
    }

    /// A silent death explained from the flow's own namespace, else from
    /// the listener's side.
    fn unanswered_on_the_way(&mut self, flow: &Flow, tables: &Tables, exec: &str) -> Finding {
        let status = self.status(flow.ct.as_ref());
        let f = handshake::unanswered(flow, &self.ct_bits, &status, tables, exec);
        // Nothing on the way explains it: the listener's side may.
        if f.cause == "unanswered" {
            self.unanswered_listener(flow).unwrap_or(f)
        } else {
            f
        }
    }

    fn translator<'a>(&mut self, flow: Flow, ctx: &'a NetnsContext) -> Translator<'a> {
        let ns = self.netns_name(flow.netns);
        let status = self.status(flow.ct.as_ref());
        let ifindex = match flow.ifindex {
            0 => flow
                .ct
                .and_then(|c| self.node.route_out(flow.netns, c.reply.src.ip()))
                .unwrap_or(0),
            i => i,
        };
        Translator {
            dev: self.node.ifname(flow.netns, ifindex),
            status,
            tables: &ctx.tables,
            bridge: BridgeFacts {
                br_netfilter_loaded: self.node.br_netfilter_loaded(),
                call_iptables: ctx.confs.bridge_nf_call_iptables,
                call_ip6tables: ctx.confs.bridge_nf_call_ip6tables,
            },
            exec: ns.exec(),
            netns: ns.display(),
            flow,
        }
    }
}

/// An entry found by lookup as a flow of its namespace (the device its SYN
/// left by unknown).
fn flow_of(seen: &crate::model::packet::CtSeen) -> Flow {
    Flow {
        orig: seen.ct.orig,
        ct: Some(seen.ct),
        first_ns: 0,
        last_ns: 0,
        syns: 0,
        first_unseen: false,
        from_entry: false,
        isn: 0,
        gave_up: None,
        answered: false,
        reported: false,
        netns: seen.netns,
        ifindex: 0,
        due_ns: 0,
        crossed: Default::default(),
        wire: Tuple {
            src: seen.ct.orig.src,
            dst: seen.ct.reply.src,
        },
    }
}
