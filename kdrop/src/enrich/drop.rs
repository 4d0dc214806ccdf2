//! A dropped packet's record: its names, the route lookups and conntrack
//! entry it carried, the netfilter rule behind a NETFILTER_DROP, and the
//! finding (routing, forwarding, a refused SYN-ACK, conntrack's own drop,
//! or the reason alone).
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use kdrop_common::{TCP_ACK, TCP_SYN};

use super::{memo, Enricher, FindingKey, FINDINGS_CACHED};
use crate::{
    context::Node,
    diagnosis::{
        self, conntrack, forwarding, kube,
        netfilter::{self as nf, Dropped},
        routing, rpfilter6, way_back, DropFacts,
    },
    model::{
        finding::Finding,
        neighbour::Neighbour,
        netfilter::{Attribution, DroppedBy},
        packet::{Drop, NfFn, NfVerdict, Tuple},
        record::{DropRecord, LookupRecord},
        routing::{RouteLookup, RouteQuery},
    },
};

/// The explanations of a drop, each asked in turn; the first that finds
/// something is the record's finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Explainer {
    /// A network policy engine's chain (Calico's, kube-router's): in
    /// Kubernetes terms (pods, direction, policy), before the netfilter
    /// rule it is made of.
    NetworkPolicy,
    /// The kernel's reverse-path or martian check, with its lookups.
    Routing,
    /// A forwarded packet with no route or no neighbour.
    Forwarding,
    /// A SYN-ACK refused by TCP: the hairpin or the loop seen from the
    /// NAT entry it belongs to.
    Refused,
    /// Conntrack's own drop (table full, insert clash).
    ConntrackDrop,
    /// A kube-proxy rule, named as its Service.
    Kube,
    /// A BPF program (tc, XDP, cgroup, socket filter).
    Program,
    /// A full accept queue, named from its listener.
    Listen,
    /// The drop reason alone (the netfilter rule, when attributed).
    Reason,
}

/// Richer before poorer: what names the cause in the terms of the thing
/// that decided (a policy, a route, a NAT entry, a Service, a program)
/// before the generic reading of the reason, which is last.
const PRECEDENCE: [Explainer; 9] = [
    Explainer::NetworkPolicy,
    Explainer::Routing,
    Explainer::Forwarding,
    Explainer::Refused,
    Explainer::ConntrackDrop,
    Explainer::Kube,
    Explainer::Program,
    Explainer::Listen,
    Explainer::Reason,
];

impl<N: Node> Enricher<N> {
    pub(super) fn drop_record(&mut self, d: &Drop) -> DropRecord {
        let ns = self.netns_name(d.netns);
        let ifname = self.node.ifname(d.netns, d.ifindex);
        let reason = self.facts.reasons.name(d.reason);
        let location = self
            .node
            .symbol(d.location)
            .unwrap_or_else(|| format!("{:#x}", d.location));
        let verdicts = self.verdicts.take_for(d);
        // Without a reason (before 5.17) the kernel's NF_DROP verdict, or
        // a free in nf_hook_slow, is what says netfilter dropped it.
        let (netfilter, unattributed) = match reason.as_deref() {
            Some("NETFILTER_DROP") => self.attribute(d, &verdicts),
            None if !verdicts.is_empty() || diagnosis::netfilter_location(&location) => {
                self.attribute(d, &verdicts)
            }
            _ => (None, None),
        };
        // A packet a program dropped died before routing (tc ingress, XDP)
        // or after it was done (tc egress, cgroup): lookups recorded then
        // belong to other packets.
        let by_program = reason
            .as_deref()
            .is_some_and(|r| diagnosis::programs::REASONS.contains(&r))
            || location.starts_with("do_xdp_generic+");
        let route_lookups = d
            .fib
            .iter()
            .filter(|_| !by_program)
            .map(|l| LookupRecord {
                table: l.table,
                err: l.err,
                src: l.src,
                dst: l.dst,
                iif: l.iif,
                oif: l.oif,
                mark: l.mark,
                dev: (l.err == 0 && l.res_ifindex != 0)
                    .then(|| self.node.ifname(d.netns, l.res_ifindex)),
                gw: l.gw,
            })
            .collect();
        let mut r = DropRecord {
            packet: Some((d.cpu, d.ts_ns)),
            ts: self.ts(d.ts_ns),
            kind: "drop",
            netns: d.netns,
            netns_name: ns.name.clone(),
            pods: Default::default(),
            ifname,
            ifindex: d.ifindex,
            family: if d.saddr.is_ipv4() { "ipv4" } else { "ipv6" },
            saddr: d.saddr,
            sport: d.sport,
            daddr: d.daddr,
            dport: d.dport,
            tcp_flags: crate::model::packet::tcp_flags(d.tcp_flags),
            reason,
            location,
            mark: d.mark,
            route_lookups,
            ct: d.ct.as_ref().map(|c| self.ct_record(c)),
            finding: None,
            netfilter,
            network_policy: None,
            handshake: None,
        };
        // A SYN like one diagnosed a moment ago: that diagnosis.
        let memo_key = memo::Key::of(d, by_program).filter(|_| self.memo_on);
        if let Some(k) = &memo_key {
            if self.memo.fill(k, &mut r) {
                return r;
            }
        }
        let (mut policy_finding, policy) = self.explain_network_policy(d, &r).unzip();
        r.network_policy = policy;
        r.finding = PRECEDENCE
            .iter()
            .find_map(|e| match e {
                Explainer::NetworkPolicy => policy_finding.take(),
                Explainer::Routing => self.explain_routing(d, &r),
                Explainer::Forwarding => self.explain_forwarding(d, &r),
                Explainer::Refused => self.explain_refused(d, &r),
                Explainer::ConntrackDrop => self.explain_conntrack_drop(d, &r),
                Explainer::Kube => self.explain_kube(d, &r),
                Explainer::Program => self.explain_program(d, &r),
                Explainer::Listen => self.explain_listen(d, &r),
                Explainer::Reason => diagnosis::explain(&DropFacts {
                    unattributed: unattributed.as_deref(),
                    ..facts(&r, d.tcp_flags, r.netfilter.as_deref())
                }),
            })
            .map(Arc::new);
        // Not a rival: the netfilter finding, refined with the way back
        // an IPv6 rpfilter rule looked up.
        if let Some(f) = self.explain_rpfilter6(d, &r) {
            r.finding = Some(Arc::new(f));
        }
        let syn_ack = d.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK;
        let tuple = Tuple {
            src: SocketAddr::new(d.saddr, d.sport),
            dst: SocketAddr::new(d.daddr, d.dport),
        };
        self.name_pods(&mut r, &tuple, syn_ack, d.ct.as_ref());
        if syn_ack {
            // This drop is the record for the SYN-ACK: not also a "reset".
            self.tracker.syn_ack_dropped(&tuple);
        }
        if let Some(k) = memo_key {
            self.memo.keep(k, &r);
        }
        r
    }

    /// Which rule, policy, conntrack or NAT drop killed this NETFILTER_DROP
    /// packet: the kernel's own verdicts for it first (see
    /// diagnosis::netfilter::kernel), the rule counters within the table
    /// and hook they name (or everywhere, without them). Without an
    /// answer, why not (the finding says it).
    fn attribute(
        &mut self,
        d: &Drop,
        verdicts: &[NfVerdict],
    ) -> (Option<Arc<Attribution>>, Option<String>) {
        let scope = nf::kernel::scope(verdicts);
        let around = self.node.netfilter_around(d.netns, d.ts_ns);
        let Some((before, after)) = around else {
            let a = nf::kernel::combine(verdicts, d.ts_ns, &|f| self.rung(f), None).map(Arc::new);
            let why = a.is_none().then(|| nf::UNREAD.to_string());
            return (a, why);
        };
        let counted = match &scope {
            None if self.memo_on => {
                self.attributions
                    .attribute(Dropped::of(d), before.clone(), after.clone())
            }
            scope => {
                nf::attribute_within(&Dropped::of(d), before.as_deref(), &after, scope.as_ref())
                    .map(Arc::new)
            }
        };
        let why = || nf::unattributed(before.as_deref(), &after);
        if verdicts.is_empty() {
            let unattributed = counted.is_none().then(why);
            return (counted, unattributed);
        }
        // The kernel named the table and hook; when the counters could not
        // name the rule within them, its evidence says why.
        let counters_silent = counted.is_none();
        let a = nf::kernel::combine(
            verdicts,
            d.ts_ns,
            &|f| self.rung(f),
            counted.map(Arc::unwrap_or_clone),
        )
        .map(|mut a| {
            if counters_silent && a.dropped_by == DroppedBy::Table {
                a.evidence.push(format!("rule counters: {}", why()));
            }
            Arc::new(a)
        });
        let unattributed = a.is_none().then(why);
        (a, unattributed)
    }

    /// The rung a netfilter function's verdict came through.
    fn rung(&self, f: NfFn) -> String {
        self.facts
            .nf_rungs
            .get(f.name())
            .cloned()
            .unwrap_or_else(|| "probe".into())
    }

    /// A drop by a rule kube-proxy wrote, in Kubernetes terms.
    fn explain_kube(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        let a = r.netfilter.as_ref()?;
        if a.dropped_by != DroppedBy::Rule {
            return None;
        }
        let s = self.node.kube(d.netns).unwrap_or_default();
        let local = s.local.contains(&d.daddr);
        let k = kube::classify(a, &s, SocketAddr::new(d.daddr, d.dport), local)?;
        Some(kube::finding::explain(
            &k,
            a,
            &facts(r, d.tcp_flags, Some(a)),
        ))
    }

    /// A SYN-ACK the client refused: the reply of a DNAT'd handshake that
    /// came back with the wrong source.
    fn explain_refused(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        // Before 5.17 (no reasons) the place says as much: tcp_v4_rcv and
        // tcp_v6_rcv free a segment no socket takes at their `discard_it`
        // (https://github.com/torvalds/linux/blob/v5.10/net/ipv4/tcp_ipv4.c),
        // and this SYN-ACK's tuple is one no local socket can have: its SYN
        // went to the DNAT'd address.
        let no_socket = match r.reason.as_deref() {
            Some(reason) => reason == "NO_SOCKET",
            None => ["tcp_v4_rcv+", "tcp_v6_rcv+"]
                .iter()
                .any(|f| r.location.starts_with(f)),
        };
        if !no_socket || d.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN | TCP_ACK {
            return None;
        }
        let syn_ack = Tuple {
            src: SocketAddr::new(d.saddr, d.sport),
            dst: SocketAddr::new(d.daddr, d.dport),
        };
        let dnat = self.tracker.dnat_reply(&syn_ack).cloned();
        let kernel = format!(
            "kernel: {} at {} in netns {}: no socket for {} -> {}, so it answers with a RST",
            match r.reason {
                Some(_) => "drop reason NO_SOCKET",
                None => "no drop reason on this kernel, freed by TCP's receive path",
            },
            r.location,
            r.netns_name.clone().unwrap_or_else(|| r.netns.to_string()),
            syn_ack.src,
            syn_ack.dst
        );
        self.refused(&syn_ack, d.netns, dnat, &kernel, d.ts_ns)
    }

    /// A drop conntrack itself made (its statistics moved): a NAT port
    /// clash at confirmation or a full table.
    fn explain_conntrack_drop(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        let moved = r.netfilter.as_ref()?.conntrack.as_ref()?;
        let rules = self
            .node
            .netfilter_latest(d.netns)
            .map(|s| conntrack::nat_rules(&s.tables))
            .unwrap_or_default();
        let status = self.status(d.ct.as_ref());
        let ns = self.netns_name(d.netns);
        // Who holds the reply tuple this entry wanted (only for a clash).
        let holder = match &d.ct {
            Some(ct) if moved.after.insert_failed > moved.before.insert_failed => {
                self.node.reply_holder(d.netns, &ct.reply)
            }
            _ => None,
        };
        conntrack::explain(&conntrack::CtDrop {
            moved,
            ct: d.ct.as_ref(),
            bits: &self.ct_bits,
            status: &status,
            nat_rules: &rules,
            kernel: format!(
                "kernel drop reason {} at {}",
                r.reason.as_deref().unwrap_or("NETFILTER_DROP"),
                r.location
            ),
            netns_exec: &ns.exec(),
            netns: &ns.display(),
            holder,
        })
    }

    /// No route, or a next hop that does not answer: the lookup the kernel
    /// did (or asked now) and what the tables and the neighbour hold.
    fn explain_forwarding(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        // Before 5.17 no reason: the place says it (v5.10: `ip_error` frees
        // a packet whose input route is an error, net/ipv4/route.c;
        // `neigh_invalidate` frees the packets queued on a failed
        // neighbour, net/core/neighbour.c).
        let reason = match r.reason.as_deref() {
            Some(reason) if forwarding::REASONS.contains(&reason) => reason,
            None if r.location.starts_with("ip_error+") => "IP_INNOROUTES",
            None if r.location.starts_with("neigh_invalidate+") => "NEIGH_FAILED",
            _ => return None,
        };
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (d.saddr, d.daddr) else {
            return None;
        };
        let ctx = self.node.routing(d.netns)?;
        let ns = self.netns_name(d.netns);
        let local = reason == "IP_OUTNOROUTES";
        let iif = if local { 0 } else { d.ifindex };
        // The same lookup, asked now, when the kernel's were not recorded.
        let asked = if d.fib.is_empty() {
            let q = RouteQuery {
                src: Some(IpAddr::V4(src)),
                iif: (iif != 0).then_some(iif),
                mark: Some(d.mark),
                ..RouteQuery::get(IpAddr::V4(dst))
            };
            let mut answer = self.node.route_get(d.netns, &q).map(|a| (q, a));
            // A locally sent packet's drop names its egress device: ask as
            // this host would send it.
            if reason == "NEIGH_FAILED" && !matches!(answer, Some((_, RouteLookup::Found(_)))) {
                let q = RouteQuery::get(IpAddr::V4(dst));
                answer = self.node.route_get(d.netns, &q).map(|a| (q, a));
            }
            answer
        } else {
            None
        };
        let kernel = match r.reason {
            Some(_) => format!("kernel drop reason {reason} at {}", r.location),
            None => format!(
                "freed at {}: no drop reason on this kernel (5.17+ has them); that place frees \
                 {}",
                r.location,
                if reason == "NEIGH_FAILED" {
                    "the packets waiting for a neighbour that failed to resolve"
                } else {
                    "a packet whose input route is an error (no route)"
                }
            ),
        };
        let mut stuck = forwarding::Stuck {
            reason,
            src,
            dst,
            iif,
            mark: d.mark,
            kernel,
            fib: &d.fib,
            asked: asked.as_ref(),
            neighbour: None,
            netns_exec: &ns.exec(),
            netns: &ns.display(),
        };
        let neighbour = match forwarding::next_hop(&stuck) {
            Some(h) if reason == "NEIGH_FAILED" => self.node.neighbour(d.netns, h.oif, h.addr),
            _ => None,
        };
        stuck.neighbour = neighbour.as_ref();
        forwarding::explain(&stuck, &ctx.tables)
    }

    /// An IPv6 packet dropped by an rpfilter / fib rule: the netfilter
    /// finding with the way back the kernel's lookup finds, asked again in
    /// the drop's namespace.
    fn explain_rpfilter6(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        let a = r.netfilter.as_ref()?;
        let check = rpfilter6::Check::of(a)?;
        let (IpAddr::V6(src), IpAddr::V6(dst)) = (d.saddr, d.daddr) else {
            return None;
        };
        let base = Finding::clone(r.finding.as_deref()?);
        let ctx = self.node.routing(d.netns)?;
        let asked = check.query(src, dst, d.ifindex, d.mark);
        let answer = self.node.route_get(d.netns, &asked)?;
        let via_iif = self
            .node
            .route_get(d.netns, &rpfilter6::via_iif_query(src, d.ifindex));
        let exec = self.netns_name(d.netns).exec();
        let neighbours = self.sender_entries(d);
        let drop = rpfilter6::Rpf6 {
            src,
            dst,
            iif: d.ifindex,
            mark: d.mark,
            check,
            asked: &asked,
            answer: &answer,
            via_iif: via_iif.as_ref(),
            sender: way_back::Sender {
                mac: d.src_mac,
                neighbours: neighbours.as_deref(),
            },
            netns_exec: &exec,
        };
        Some(rpfilter6::explain(base, a, &drop, &ctx.tables))
    }

    /// The input device's neighbour entries with the packet's source MAC:
    /// who handed it to the node (asked only when it carried one).
    fn sender_entries(&mut self, d: &Drop) -> Option<Vec<Neighbour>> {
        self.node.neighbours_with(d.netns, d.ifindex, d.src_mac?)
    }

    /// Reverse-path and martian drops, with the namespace's routing context.
    fn explain_routing(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        let reason = r.reason.as_deref();
        // No reason at all (5.10): only what fib_validate_source or the drop
        // location can tell (routing::derive_reason).
        // NOT_SPECIFIED (before 6.13 for martians, e.g. 6.1) the same way.
        let derivable = d.src_check.is_some() || r.location.starts_with("ip_rcv_finish_core");
        match reason {
            Some("NOT_SPECIFIED") | None if derivable => {}
            Some(reason) if routing::REASONS.contains(&reason) => {}
            _ => return None,
        }
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (d.saddr, d.daddr) else {
            return None;
        };
        let ctx = self.node.routing(d.netns)?;
        let key = FindingKey {
            generation: ctx.generation,
            netns: d.netns,
            ifindex: d.ifindex,
            mark: d.mark,
            src,
            dst,
            reason: d.reason,
            src_check: d.src_check,
            kernel_lookups: !d.fib.is_empty(),
            src_mac: d.src_mac,
        };
        if let Some(f) = self.findings.get(&key) {
            return f.clone();
        }
        let exec = self.netns_name(d.netns).exec();
        // No lookup of the kernel's for this packet (the probe was not
        // armed yet): ask the kernel the same question now.
        let asked = if d.fib.is_empty() {
            let iif = ctx.tables.link_name(d.ifindex);
            let vmark = ctx.confs.or(&iif, |c| c.src_valid_mark);
            self.node.reverse_route(d.netns, src, dst, d.mark, vmark)
        } else {
            None
        };
        // Martians need no way back; a reverse-path drop may.
        let neighbours = match reason {
            Some(r) if r != "IP_RPFILTER" && r != "NOT_SPECIFIED" => None,
            _ => self.sender_entries(d),
        };
        let f = routing::explain(
            &routing::RouteDrop {
                reason,
                location: &r.location,
                iif: d.ifindex,
                src,
                dst,
                mark: d.mark,
                fib: &d.fib,
                netns_exec: &exec,
                src_check: d.src_check,
                asked: asked.as_ref(),
                sender: way_back::Sender {
                    mac: d.src_mac,
                    neighbours: neighbours.as_deref(),
                },
            },
            &ctx.tables,
            &ctx.confs,
        );
        if self.findings.len() > FINDINGS_CACHED {
            self.findings.clear();
        }
        self.findings.insert(key, f.clone());
        f
    }
}

/// What the explanations from the drop reason read of a drop's record,
/// with `netfilter` the attribution they explain.
pub(super) fn facts<'a>(
    r: &'a DropRecord,
    tcp_flags: u8,
    netfilter: Option<&'a Attribution>,
) -> DropFacts<'a> {
    DropFacts {
        reason: r.reason.as_deref(),
        ifname: &r.ifname,
        netns: r.netns_name.as_deref(),
        src: r.src(),
        dst: r.dst(),
        location: Some(&r.location),
        tcp_flags,
        netfilter,
        unattributed: None,
    }
}

#[cfg(test)]
mod precedence {
    use super::{Explainer, PRECEDENCE};

    /// Every explanation is asked once (nine of nine), the generic reading
    /// of the reason last, and a Calico policy before the kube-proxy rule
    /// reading of the same netfilter drop.
    #[test]
    fn each_explanation_once_and_the_reason_last() {
        for e in PRECEDENCE {
            assert_eq!(PRECEDENCE.iter().filter(|x| **x == e).count(), 1, "{e:?}");
        }
        assert_eq!(PRECEDENCE.last(), Some(&Explainer::Reason));
        let at = |e| PRECEDENCE.iter().position(|x| *x == e).unwrap();
        assert!(at(Explainer::NetworkPolicy) < at(Explainer::Kube));
        assert!(at(Explainer::Routing) < at(Explainer::Forwarding));
    }
}
