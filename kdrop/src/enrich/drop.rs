//! A dropped packet's record: its names, the route lookups and conntrack
//! entry it carried, the netfilter rule behind a NETFILTER_DROP, and the
//! finding (routing, hairpin, conntrack's own drop, or the reason alone).
use std::net::{IpAddr, SocketAddr};

use kdrop_common::{TCP_ACK, TCP_SYN};

use super::{Enricher, FINDINGS_CACHED};
use crate::{
    context::Node,
    diagnosis::{
        self, conntrack,
        netfilter::{self as nf, Dropped},
        routing, DropFacts,
    },
    model::{
        finding::Finding,
        netfilter::Attribution,
        packet::{Drop, NfFn, NfVerdict, Tuple},
        record::{DropRecord, LookupRecord},
    },
};

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
        let netfilter = match reason.as_deref() {
            Some("NETFILTER_DROP") => self.attribute(d, &verdicts),
            None if !verdicts.is_empty() || diagnosis::netfilter_location(&location) => {
                self.attribute(d, &verdicts)
            }
            _ => None,
        };
        let route_lookups = d
            .fib
            .iter()
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
            ts: self.ts(d.ts_ns),
            kind: "drop",
            netns: d.netns,
            netns_name: ns.name.clone(),
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
        };
        r.finding = self
            .explain_routing(d, &r)
            .or_else(|| self.explain_hairpin(d, &r))
            .or_else(|| self.explain_conntrack_drop(d, &r))
            .or_else(|| {
                diagnosis::explain(&DropFacts {
                    reason: r.reason.as_deref(),
                    ifname: &r.ifname,
                    netns: r.netns_name.as_deref(),
                    src: r.src(),
                    dst: r.dst(),
                    location: Some(&r.location),
                    netfilter: r.netfilter.as_ref(),
                })
            });
        if d.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK {
            // This drop is the record for the SYN-ACK: not also a "reset".
            self.tracker.syn_ack_dropped(&Tuple {
                src: SocketAddr::new(d.saddr, d.sport),
                dst: SocketAddr::new(d.daddr, d.dport),
            });
        }
        r
    }

    /// Which rule, policy, conntrack or NAT drop killed this NETFILTER_DROP
    /// packet: the kernel's own verdicts for it first (see
    /// diagnosis::netfilter::kernel), the rule counters within the table
    /// and hook they name (or everywhere, without them).
    fn attribute(&mut self, d: &Drop, verdicts: &[NfVerdict]) -> Option<Attribution> {
        let scope = nf::kernel::scope(verdicts);
        let counted = self
            .node
            .netfilter_around(d.netns, d.ts_ns)
            .and_then(|(before, after)| {
                nf::attribute_within(&Dropped::of(d), before.as_deref(), &after, scope.as_ref())
            });
        if verdicts.is_empty() {
            return counted;
        }
        let rungs = &self.facts.nf_rungs;
        let rung = |f: NfFn| {
            rungs
                .get(f.name())
                .cloned()
                .unwrap_or_else(|| "probe".into())
        };
        nf::kernel::combine(verdicts, d.ts_ns, &rung, counted)
    }

    /// A refused SYN-ACK that is the reply side of a DNAT'd SYN seen leaving.
    fn explain_hairpin(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
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
        let flow = self.tracker.dnat_reply(&syn_ack)?.clone();
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
        self.hairpin(&flow, &syn_ack, &kernel)
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
        let key = (
            ctx.generation,
            d.netns,
            d.ifindex,
            d.mark,
            src,
            dst,
            d.reason,
            d.src_check,
        );
        if let Some(f) = self.findings.get(&key) {
            return f.clone();
        }
        let exec = self.netns_name(d.netns).exec();
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
