//! Following handshakes through conntrack and NAT: SYNs leaving a device
//! (with the conntrack entry they carry) in, handshakes that died silently
//! out. Pure: recorded packets and context in, findings out.
use std::{collections::HashMap, net::IpAddr};

use kdrop_common::{TCP_ACK, TCP_RST, TCP_SYN};

use super::Finding;
use crate::{
    context::netlink::Tables,
    event::{Ct, Packet, Tuple},
};

/// A SYN sent this many times without an answer is a dead handshake: the
/// first and two retransmissions (1 s and 3 s after it, Linux defaults).
pub const UNANSWERED_AFTER: u32 = 3;
/// The same SYN seen leaving several devices (pod veth, bridge, port) within
/// this long is one transmission; retransmissions are at least 200 ms
/// apart (TCP_RTO_MIN), the first one 1 s.
const SAME_TRANSMISSION_NS: u64 = 150_000_000;
/// Flows idle this long are forgotten.
const FORGET_AFTER_NS: u64 = 60_000_000_000;
/// At most this many flows are remembered (oldest dropped first).
const MAX_FLOWS: usize = 65_536;
/// A RST is reported this long after it left, unless the drop of the
/// SYN-ACK it answers shows up meanwhile and tells more (that drop comes
/// right after the RST: tcp_v4_rcv sends the RST, then frees the segment).
pub const RESET_GRACE_NS: u64 = 100_000_000;

/// The conntrack status bits diagnosis needs, named from the kernel's BTF.
#[derive(Clone, Copy, Debug, Default)]
pub struct CtBits {
    pub seen_reply: u32,
    pub src_nat: u32,
    pub dst_nat: u32,
}

/// One handshake, keyed by its conntrack original tuple (what the client
/// sent), or by the packet's tuple when untracked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    pub orig: Tuple,
    pub ct: Option<Ct>,
    pub first_ns: u64,
    pub last_ns: u64,
    pub syns: u32,
    pub answered: bool,
    pub reported: bool,
    /// Where the (last) SYN left: namespace and device.
    pub netns: u32,
    pub ifindex: u32,
    /// The SYN as it left (after any DNAT).
    pub wire: Tuple,
}

/// A SYN-ACK seen leaving a device (the first time its tuple did).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynAckSeen {
    pub ts_ns: u64,
    pub netns: u32,
    pub ifindex: u32,
    pub reported: bool,
}

/// A SYN-ACK answered by a RST: the side it went to has no socket for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reset {
    /// The SYN-ACK as it left (server -> client).
    pub syn_ack: Tuple,
    pub syn_ack_at: SynAckSeen,
    /// The RST as it left (client -> server).
    pub rst: Packet,
    /// The handshake the SYN-ACK answers, if kdrop saw its SYN: the DNAT'd
    /// flow whose reply side the SYN-ACK is, else the flow of the RST's
    /// tuple.
    pub flow: Option<Flow>,
}

#[derive(Debug, Default)]
pub struct Tracker {
    flows: HashMap<Tuple, Flow>,
    /// Reply tuple of a DNAT'd entry → its flow.
    dnat_replies: HashMap<Tuple, Tuple>,
    /// SYN-ACKs seen leaving, by their tuple.
    syn_acks: HashMap<Tuple, SynAckSeen>,
    /// RSTs answering a SYN-ACK, held for `RESET_GRACE_NS`, by SYN-ACK.
    pending: HashMap<Tuple, Reset>,
}

/// What a dead handshake turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dead {
    /// Sent `UNANSWERED_AFTER` times without an answer.
    Unanswered(Box<Flow>),
    /// Sent to a VIP (first flow), came back in from the load balancer with
    /// the same client address and port, and was DNAT'd to a backend without
    /// SNAT (second flow): the reply bypasses the load balancer.
    LoopedBack(Box<(Flow, Flow)>),
}

impl Tracker {
    /// Feeds one packet leaving a device; returns a dead handshake when a
    /// SYN has now gone unanswered `UNANSWERED_AFTER` times (once per flow).
    pub fn on_egress(&mut self, p: &Packet, bits: &CtBits) -> Option<Dead> {
        if p.tcp_flags & (TCP_RST | TCP_SYN) == TCP_RST {
            self.on_rst(p);
            return None;
        }
        let flow = self.count(p, bits)?;
        // The same client endpoint with another destination, DNAT'd without
        // SNAT: the SYN looped back through a load balancer.
        let looped = self
            .flows
            .values()
            .find(|o| {
                o.orig.src == flow.orig.src
                    && o.orig.dst != flow.orig.dst
                    && o.ct.is_some_and(|c| {
                        c.status & bits.dst_nat != 0 && c.status & bits.src_nat == 0
                    })
            })
            .cloned();
        let (first, back) = match looped {
            None => return Some(Dead::Unanswered(Box::new(flow))),
            Some(o) if o.first_ns >= flow.first_ns => (flow, o),
            Some(o) => (o, flow),
        };
        for key in [first.orig, back.orig] {
            if let Some(f) = self.flows.get_mut(&key) {
                f.reported = true;
            }
        }
        Some(Dead::LoopedBack(Box::new((first, back))))
    }

    fn count(&mut self, p: &Packet, bits: &CtBits) -> Option<Flow> {
        let syn = p.tcp_flags & TCP_SYN != 0;
        let ack = p.tcp_flags & TCP_ACK != 0;
        if syn && ack {
            // A SYN-ACK leaving answers the flow it replies to.
            let key = p.ct.map_or(p.tuple.reversed(), |c| c.orig);
            if let Some(f) = self.flows.get_mut(&key) {
                f.answered = true;
            }
            if self.syn_acks.len() >= MAX_FLOWS && !self.syn_acks.contains_key(&p.tuple) {
                // A SYN-ACK flood: keep the last second's.
                let cutoff = p.ts_ns.saturating_sub(1_000_000_000);
                self.syn_acks.retain(|_, s| s.ts_ns >= cutoff);
                if self.syn_acks.len() >= MAX_FLOWS {
                    self.syn_acks.clear();
                }
            }
            self.syn_acks.entry(p.tuple).or_insert(SynAckSeen {
                ts_ns: p.ts_ns,
                netns: p.netns,
                ifindex: p.ifindex,
                reported: false,
            });
            return None;
        }
        if !syn {
            return None;
        }
        let key = p.ct.map_or(p.tuple, |c| c.orig);
        if self.flows.len() >= MAX_FLOWS && !self.flows.contains_key(&key) {
            self.expire(p.ts_ns.saturating_add(FORGET_AFTER_NS));
        }
        let f = self.flows.entry(key).or_insert_with(|| Flow {
            orig: key,
            ct: None,
            first_ns: p.ts_ns,
            last_ns: p.ts_ns,
            syns: 0,
            answered: false,
            reported: false,
            netns: p.netns,
            ifindex: p.ifindex,
            wire: p.tuple,
        });
        if f.syns == 0 || p.ts_ns.saturating_sub(f.last_ns) >= SAME_TRANSMISSION_NS {
            f.syns += 1;
        }
        f.last_ns = p.ts_ns;
        f.netns = p.netns;
        f.ifindex = p.ifindex;
        f.wire = p.tuple;
        if let Some(ct) = p.ct {
            f.ct = Some(ct);
            if ct.status & bits.seen_reply != 0 {
                f.answered = true;
            }
            if ct.status & bits.dst_nat != 0 {
                self.dnat_replies.insert(ct.reply, key);
            }
        }
        if f.syns >= UNANSWERED_AFTER && !f.answered && !f.reported {
            f.reported = true;
            return Some(f.clone());
        }
        None
    }

    /// A conntrack entry died without a reply (ctnetlink destroy event): the
    /// flow kdrop followed with that original tuple, once, unless it was
    /// answered or already reported (the Tracker's own "unanswered" stands).
    pub fn on_destroyed(&mut self, ct: &Ct) -> Option<Flow> {
        let f = self.flows.get_mut(&ct.orig)?;
        if f.answered || f.reported {
            return None;
        }
        f.reported = true;
        if f.ct.is_none() {
            f.ct = Some(*ct);
        }
        Some(f.clone())
    }

    /// A RST leaving: held when it answers a SYN-ACK seen leaving (once per
    /// SYN-ACK, however many devices the RST crosses). Seen leaving, not at
    /// tcp:tcp_send_reset: on v6.1 that fires only for a full socket, and a
    /// RST refusing a SYN-ACK has none (tcp_v4_send_reset,
    /// https://github.com/torvalds/linux/blob/v6.1/net/ipv4/tcp_ipv4.c).
    fn on_rst(&mut self, p: &Packet) {
        let syn_ack = p.tuple.reversed();
        let Some(seen) = self.syn_acks.get_mut(&syn_ack) else {
            return;
        };
        if seen.reported {
            return;
        }
        seen.reported = true;
        let syn_ack_at = seen.clone();
        let flow = self
            .dnat_reply(&syn_ack)
            .or_else(|| self.flows.get(&p.ct.map_or(p.tuple, |c| c.orig)))
            .cloned();
        self.pending.insert(
            syn_ack,
            Reset {
                syn_ack,
                syn_ack_at,
                rst: p.clone(),
                flow,
            },
        );
    }

    /// The drop of the SYN-ACK `t` was seen (and reported): a RST answering
    /// it is not reported again.
    pub fn syn_ack_dropped(&mut self, t: &Tuple) {
        self.pending.remove(t);
        if let Some(s) = self.syn_acks.get_mut(t) {
            s.reported = true;
        }
    }

    /// RSTs held long enough (all of them with `now_ns == u64::MAX`).
    pub fn due_resets(&mut self, now_ns: u64) -> Vec<Reset> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let is_due = |r: &Reset| r.rst.ts_ns.saturating_add(RESET_GRACE_NS) <= now_ns;
        let mut due: Vec<Reset> = self
            .pending
            .values()
            .filter(|r| is_due(r))
            .cloned()
            .collect();
        self.pending.retain(|_, r| !is_due(r));
        due.sort_by_key(|r| r.rst.ts_ns);
        due
    }

    /// The DNAT'd flow whose reply side `t` is, if one was seen.
    pub fn dnat_reply(&self, t: &Tuple) -> Option<&Flow> {
        self.flows.get(self.dnat_replies.get(t)?)
    }

    /// Forgets flows idle since before `now_ns - FORGET_AFTER_NS`.
    pub fn expire(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(FORGET_AFTER_NS);
        self.flows.retain(|_, f| f.last_ns >= cutoff);
        let flows = &self.flows;
        self.dnat_replies.retain(|_, k| flows.contains_key(k));
        self.syn_acks.retain(|_, s| s.ts_ns >= cutoff);
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }
}

/// A conntrack entry as evidence: both tuples and the status bits.
pub(crate) fn ct_text(ct: &Ct, status: &[String]) -> String {
    format!(
        "orig {} -> {}, reply {} -> {}, status [{}]",
        ct.orig.src,
        ct.orig.dst,
        ct.reply.src,
        ct.reply.dst,
        status.join(",")
    )
}

/// Bridge facts for the hairpin case, read from the namespace that did the
/// DNAT.
#[derive(Clone, Debug, Default)]
pub struct BridgeFacts {
    pub br_netfilter_loaded: bool,
    /// net.bridge.bridge-nf-call-iptables in that namespace (None: absent).
    pub call_iptables: Option<u32>,
}

/// A SYN-ACK refused (NO_SOCKET) whose tuple is the reply side of a DNAT'd
/// entry: the reply skipped de-NAT, so the client has no socket for it.
#[allow(clippy::too_many_arguments)]
pub fn hairpin(
    syn_ack: &Tuple,
    flow: &Flow,
    status: &[String],
    t: &Tables,
    bridge: &BridgeFacts,
    kernel: &str,
    dnat_ns: &str,
) -> Option<Finding> {
    let ct = flow.ct?;
    let (client, service, backend) = (ct.orig.src, ct.orig.dst, ct.reply.src);
    let port = t.link(flow.ifindex);
    let br = port
        .and_then(|p| p.master)
        .and_then(|m| t.link(m))
        .filter(|b| b.kind.as_deref() == Some("bridge"));
    let mut evidence = vec![
        kernel.to_string(),
        format!("conntrack: {}", ct_text(&ct, status)),
    ];
    let (same_bridge, br_name) = match (port, br) {
        (Some(p), Some(b)) => {
            let client_on_bridge = t
                .addrs
                .iter()
                .any(|a| a.index == b.index && same_subnet(a.addr, client.ip(), a.prefix_len));
            evidence.push(format!(
                "the DNAT'd SYN left by {}, a port of bridge {}{}",
                p.name,
                b.name,
                if client_on_bridge {
                    format!("; {} is on {}'s subnet too: the reply is bridged straight back, never routed", client.ip(), b.name)
                } else {
                    String::new()
                }
            ));
            (client_on_bridge, b.name.clone())
        }
        _ => (false, String::new()),
    };
    evidence.push(format!(
        "br_netfilter {}; net.bridge.bridge-nf-call-iptables = {}: bridged packets skip \
         netfilter, so the reply is not un-DNAT'd",
        if bridge.br_netfilter_loaded {
            "loaded"
        } else {
            "not loaded"
        },
        bridge
            .call_iptables
            .map_or("absent".to_string(), |v| v.to_string())
    ));
    let mut fix = Vec::new();
    if !bridge.br_netfilter_loaded && bridge.call_iptables.is_none() {
        fix.push("modprobe br_netfilter".to_string());
    }
    fix.push(format!(
        "{dnat_ns}sysctl -w net.bridge.bridge-nf-call-iptables=1"
    ));
    if same_bridge {
        fix.push(format!(
            "{dnat_ns}iptables -t nat -A POSTROUTING -s {} -d {}/32 -p tcp --dport {} -j MASQUERADE",
            client.ip(),
            backend.ip(),
            backend.port()
        ));
    }
    Some(Finding {
        cause: "hairpin_no_reverse_nat",
        summary: format!(
            "hairpin: the SYN-ACK from {} matches the reply side of a DNAT'd connection ({} -> {} => {}) but arrived un-NAT'd{}",
            syn_ack.src,
            client,
            service,
            backend,
            if br_name.is_empty() {
                String::new()
            } else {
                format!(": both ends are on bridge {br_name}")
            }
        ),
        evidence,
        fix,
    })
}

fn same_subnet(a: IpAddr, b: IpAddr, len: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let len = u32::from(len.min(32));
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(b) & mask
        }
        _ => false,
    }
}

fn transmissions(flow: &Flow) -> String {
    let secs = (flow.last_ns.saturating_sub(flow.first_ns)) as f64 / 1e9;
    if flow.syns == 1 {
        return "1 transmission of the SYN, not answered".into();
    }
    format!(
        "{} transmissions of the same SYN over {secs:.1}s, none answered",
        flow.syns
    )
}

/// Incident 4: this host's SYN to a VIP went to the load balancer, came back
/// in and was DNAT'd to a backend without SNAT.
pub fn looped_back(first: &Flow, back: &Flow, status: &[String], t: &Tables, ns: &str) -> Finding {
    let client = first.orig.src;
    let vip = first.orig.dst;
    let ct = back.ct.expect("a looped-back flow is DNAT'd");
    let backend = ct.reply.src;
    let out_dev = t.link_name(first.ifindex);
    let back_dev = t.link_name(back.ifindex);
    Finding {
        cause: "lb_loopback_without_snat",
        summary: format!(
            "SYN {client} -> {vip} left by {out_dev} to the load balancer, came back as {client} -> {} and was DNAT'd to {backend} without SNAT: the reply goes straight to {} and bypasses the load balancer",
            ct.orig.dst,
            client.ip()
        ),
        evidence: vec![
            format!("{} (to {vip}, out of {out_dev})", transmissions(first)),
            format!(
                "the same client address and port came back in: conntrack {} -> {}, reply {} -> {}, status [{}], sent out {back_dev}",
                ct.orig.src,
                ct.orig.dst,
                ct.reply.src,
                ct.reply.dst,
                status.join(",")
            ),
            format!(
                "no SNAT: {backend} answers {} directly from its own address, not from {vip}, so the client's socket never sees its SYN-ACK",
                client.ip()
            ),
        ],
        fix: vec![
            format!(
                "{ns}iptables -t nat -I PREROUTING -s {}/32 -d {}/32 -p tcp --dport {} -j DNAT --to-destination {backend}",
                client.ip(),
                vip.ip(),
                vip.port()
            ),
            format!(
                "{ns}iptables -t nat -I POSTROUTING -s {}/32 -d {}/32 -p tcp --dport {} -j MASQUERADE",
                client.ip(),
                backend.ip(),
                backend.port()
            ),
            "Kubernetes: externalTrafficPolicy: Cluster, or a kube-proxy that serves LoadBalancer IPs locally for in-cluster clients".into(),
        ],
    }
}

/// The evidence line of a RST answering a SYN-ACK: where each left.
pub fn reset_seen(
    r: &Reset,
    syn_ack_dev: &str,
    syn_ack_ns: &str,
    rst_dev: &str,
    rst_ns: &str,
) -> String {
    let ms = r.rst.ts_ns.saturating_sub(r.syn_ack_at.ts_ns) as f64 / 1e6;
    format!(
        "the SYN-ACK {} -> {} left {syn_ack_dev} in netns {syn_ack_ns}; {ms:.1} ms later {} \
         answered it with a RST, which left {rst_dev} in netns {rst_ns}",
        r.syn_ack.src,
        r.syn_ack.dst,
        r.syn_ack.dst.ip()
    )
}

/// A SYN-ACK answered by a RST, with no NAT kdrop saw to blame.
pub fn reset(r: &Reset, seen: &str) -> Finding {
    let (server, client) = (r.syn_ack.src, r.syn_ack.dst);
    let syn = match &r.flow {
        Some(f) => format!(
            "{} (SYN {} -> {})",
            transmissions(f).replace(", none answered", ""),
            f.orig.src,
            f.orig.dst
        ),
        None => format!("kdrop did not see a SYN {client} -> {server} leave any device it follows"),
    };
    Finding {
        cause: "syn_ack_reset",
        summary: format!(
            "the SYN-ACK {server} -> {client} was answered by a RST: {} has no socket waiting for it",
            client.ip()
        ),
        evidence: vec![
            seen.to_string(),
            syn,
            format!(
                "a SYN-ACK is refused with a RST when no socket of {} is in SYN-SENT for {server}: \
                 its SYN went to another address (a translation the reply did not undo), it \
                 gave up before the SYN-ACK came, or it never had one (a half-open port scan)",
                client.ip()
            ),
        ],
        fix: vec![],
    }
}

/// A SYN sent `UNANSWERED_AFTER` times without an answer, explained.
pub fn unanswered(
    flow: &Flow,
    bits: &CtBits,
    status: &[String],
    t: &Tables,
    dnat_ns: &str,
) -> Finding {
    let dev = t.link_name(flow.ifindex);
    let sent = transmissions(flow);
    match flow.ct {
        Some(ct) if ct.status & bits.dst_nat != 0 && ct.status & bits.src_nat == 0 => {
            let (client, service, backend) = (ct.orig.src, ct.orig.dst, ct.reply.src);
            Finding {
                cause: "asymmetric_return_path",
                summary: format!(
                    "SYN {client} -> {service} was DNAT'd to {backend} and sent out {dev}, but no \
                     reply came back through this host: asymmetric return path"
                ),
                evidence: vec![
                    format!("conntrack: {} (UNREPLIED)", ct_text(&ct, status)),
                    sent,
                    format!(
                        "no SNAT: {backend} sees {} as the source and answers it directly, \
                         bypassing this host, so the reply is never un-DNAT'd",
                        client.ip()
                    ),
                ],
                fix: vec![
                    format!(
                        "{dnat_ns}iptables -t nat -A POSTROUTING -d {}/32 -p tcp --dport {} -j MASQUERADE",
                        backend.ip(),
                        backend.port()
                    ),
                    format!(
                        "or route {} back through this host on {}'s side",
                        client.ip(),
                        backend.ip()
                    ),
                ],
            }
        }
        _ => Finding {
            cause: "unanswered",
            summary: format!(
                "SYN {} -> {} sent {} out of {dev} without an answer",
                flow.orig.src,
                flow.orig.dst,
                if flow.syns == 1 {
                    "once".to_string()
                } else {
                    format!("{} times", flow.syns)
                }
            ),
            evidence: vec![sent],
            fix: vec![],
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::context::netlink::{Addr, Link};

    pub(crate) const BITS: CtBits = CtBits {
        seen_reply: 1 << 1,
        src_nat: 1 << 4,
        dst_nat: 1 << 5,
    };

    pub(crate) fn tuple(s: &str, d: &str) -> Tuple {
        Tuple {
            src: s.parse().unwrap(),
            dst: d.parse().unwrap(),
        }
    }

    fn dnat_ct(status: u32) -> Ct {
        Ct {
            orig: tuple("172.16.0.50:40000", "10.0.58.158:80"),
            reply: tuple("10.0.0.13:80", "172.16.0.50:40000"),
            status: status | BITS.dst_nat,
            mark: 0,
            zone: 0,
            ctinfo: 2,
        }
    }

    fn syn(ts: u64, ct: Option<Ct>) -> Packet {
        Packet {
            ts_ns: ts,
            netns: 7,
            ifindex: 2,
            mark: 0,
            tuple: tuple("172.16.0.50:40000", "10.0.0.13:80"),
            tcp_flags: TCP_SYN,
            ct,
        }
    }

    fn tables() -> Tables {
        Tables {
            links: vec![
                Link {
                    index: 2,
                    name: "eth0".into(),
                    master: None,
                    kind: Some("veth".into()),
                    up: true,
                },
                Link {
                    index: 5,
                    name: "cni0".into(),
                    master: None,
                    kind: Some("bridge".into()),
                    up: true,
                },
                Link {
                    index: 6,
                    name: "vethb".into(),
                    master: Some(5),
                    kind: Some("veth".into()),
                    up: true,
                },
            ],
            addrs: vec![Addr {
                index: 5,
                addr: "10.244.1.1".parse().unwrap(),
                prefix_len: 24,
                label: None,
            }],
            routes: vec![],
            rules: vec![],
        }
    }

    #[test]
    fn a_dnat_syn_sent_three_times_is_an_asymmetric_return() {
        let mut tr = Tracker::default();
        assert_eq!(tr.on_egress(&syn(0, Some(dnat_ct(8))), &BITS), None);
        // The same SYN leaving the next device on its way is not a retransmission.
        assert_eq!(tr.on_egress(&syn(20_000, Some(dnat_ct(8))), &BITS), None);
        assert_eq!(
            tr.on_egress(&syn(1_000_000_000, Some(dnat_ct(8))), &BITS),
            None
        );
        let Some(Dead::Unanswered(f)) = tr.on_egress(&syn(3_000_000_000, Some(dnat_ct(8))), &BITS)
        else {
            panic!()
        };
        assert_eq!(f.syns, 3);
        // Reported once.
        assert_eq!(
            tr.on_egress(&syn(7_000_000_000, Some(dnat_ct(8))), &BITS),
            None
        );
        let status = vec!["CONFIRMED".to_string(), "DST_NAT".to_string()];
        let fd = unanswered(&f, &BITS, &status, &tables(), "ip netns exec nodeb ");
        assert_eq!(fd.cause, "asymmetric_return_path");
        assert_eq!(
            fd.summary,
            "SYN 172.16.0.50:40000 -> 10.0.58.158:80 was DNAT'd to 10.0.0.13:80 and sent out \
             eth0, but no reply came back through this host: asymmetric return path"
        );
        assert_eq!(
            fd.evidence[0],
            "conntrack: orig 172.16.0.50:40000 -> 10.0.58.158:80, reply 10.0.0.13:80 -> \
             172.16.0.50:40000, status [CONFIRMED,DST_NAT] (UNREPLIED)"
        );
        assert_eq!(
            fd.evidence[1],
            "3 transmissions of the same SYN over 3.0s, none answered"
        );
        assert_eq!(
            fd.fix[0],
            "ip netns exec nodeb iptables -t nat -A POSTROUTING -d 10.0.0.13/32 -p tcp --dport 80 -j MASQUERADE"
        );
    }

    #[test]
    fn answered_or_snatted_flows_are_not_asymmetric() {
        let mut tr = Tracker::default();
        tr.on_egress(&syn(0, Some(dnat_ct(8))), &BITS);
        // The SYN-ACK leaving (back towards the client) answers it.
        let mut synack = syn(1, Some(dnat_ct(8 | BITS.seen_reply)));
        synack.tcp_flags = TCP_SYN | TCP_ACK;
        tr.on_egress(&synack, &BITS);
        tr.on_egress(&syn(2_000_000_000, Some(dnat_ct(8))), &BITS);
        assert_eq!(
            tr.on_egress(&syn(4_000_000_000, Some(dnat_ct(8))), &BITS),
            None
        );

        let mut tr = Tracker::default();
        let snat = dnat_ct(8 | BITS.src_nat);
        for ts in 0..2 {
            tr.on_egress(&syn(ts * 1_000_000_000, Some(snat)), &BITS);
        }
        let Some(Dead::Unanswered(f)) = tr.on_egress(&syn(3_000_000_000, Some(snat)), &BITS) else {
            panic!()
        };
        assert_eq!(
            unanswered(&f, &BITS, &[], &tables(), "").cause,
            "unanswered"
        );
    }

    #[test]
    fn a_refused_syn_ack_matching_a_dnat_reply_is_a_hairpin() {
        let mut tr = Tracker::default();
        let ct = Ct {
            orig: tuple("10.244.1.5:43534", "100.67.30.133:80"),
            reply: tuple("10.244.1.9:80", "10.244.1.5:43534"),
            status: 8 | BITS.dst_nat,
            mark: 0,
            zone: 0,
            ctinfo: 2,
        };
        let mut p = syn(0, Some(ct));
        p.ifindex = 6;
        tr.on_egress(&p, &BITS);
        let syn_ack = tuple("10.244.1.9:80", "10.244.1.5:43534");
        let flow = tr.dnat_reply(&syn_ack).unwrap();
        let f = hairpin(
            &syn_ack,
            flow,
            &["CONFIRMED".into(), "DST_NAT".into()],
            &tables(),
            &BridgeFacts::default(),
            "kernel: drop reason NO_SOCKET at tcp_v4_rcv+0x1",
            "",
        )
        .unwrap();
        assert_eq!(f.cause, "hairpin_no_reverse_nat");
        assert_eq!(
            f.summary,
            "hairpin: the SYN-ACK from 10.244.1.9:80 matches the reply side of a DNAT'd \
             connection (10.244.1.5:43534 -> 100.67.30.133:80 => 10.244.1.9:80) but arrived \
             un-NAT'd: both ends are on bridge cni0"
        );
        assert!(f.evidence[2].contains("a port of bridge cni0; 10.244.1.5 is on cni0's subnet too"));
        assert!(f.evidence[3]
            .starts_with("br_netfilter not loaded; net.bridge.bridge-nf-call-iptables = absent"));
        assert_eq!(f.fix[0], "modprobe br_netfilter");
        assert_eq!(f.fix[1], "sysctl -w net.bridge.bridge-nf-call-iptables=1");
        assert!(tr
            .dnat_reply(&tuple("10.244.1.9:81", "10.244.1.5:43534"))
            .is_none());
    }

    #[test]
    fn a_syn_that_comes_back_dnatted_without_snat_looped_through_the_lb() {
        let mut tr = Tracker::default();
        let out = |ts| Packet {
            ts_ns: ts,
            netns: 7,
            ifindex: 2,
            mark: 0,
            tuple: tuple("10.244.2.5:41000", "203.0.113.80:80"),
            tcp_flags: TCP_SYN,
            ct: None,
        };
        let back_ct = Ct {
            orig: tuple("10.244.2.5:41000", "10.70.0.10:30080"),
            reply: tuple("10.244.2.9:80", "10.244.2.5:41000"),
            status: 8 | BITS.dst_nat,
            mark: 0,
            zone: 0,
            ctinfo: 2,
        };
        let back = |ts| Packet {
            ifindex: 6,
            tuple: tuple("10.244.2.5:41000", "10.244.2.9:80"),
            ct: Some(back_ct),
            ..out(ts)
        };
        let mut dead = None;
        for ts in [0, 1_000_000_000, 3_000_000_000] {
            dead = dead.or(tr.on_egress(&out(ts), &BITS));
            dead = dead.or(tr.on_egress(&back(ts + 1_000_000), &BITS));
        }
        let Some(Dead::LoopedBack(pair)) = dead else {
            panic!("{dead:?}")
        };
        let (first, came_back) = *pair;
        assert_eq!(first.orig.dst.to_string(), "203.0.113.80:80");
        assert_eq!(came_back.orig.dst.to_string(), "10.70.0.10:30080");
        let f = looped_back(&first, &came_back, &["DST_NAT".into()], &tables(), "");
        assert_eq!(f.cause, "lb_loopback_without_snat");
        assert_eq!(
            f.summary,
            "SYN 10.244.2.5:41000 -> 203.0.113.80:80 left by eth0 to the load balancer, came \
             back as 10.244.2.5:41000 -> 10.70.0.10:30080 and was DNAT'd to 10.244.2.9:80 \
             without SNAT: the reply goes straight to 10.244.2.5 and bypasses the load balancer"
        );
        assert_eq!(f.fix[0], "iptables -t nat -I PREROUTING -s 10.244.2.5/32 -d 203.0.113.80/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.2.9:80");
        // Reported once, for the pair.
        assert_eq!(tr.on_egress(&back(9_000_000_000), &BITS), None);
    }

    #[test]
    fn an_entry_that_dies_unreplied_reports_its_flow_once() {
        let mut tr = Tracker::default();
        let ct = dnat_ct(8);
        // Never followed: nothing.
        assert_eq!(tr.on_destroyed(&ct), None);
        tr.on_egress(&syn(0, Some(ct)), &BITS);
        let f = tr.on_destroyed(&ct).unwrap();
        assert_eq!((f.syns, f.orig), (1, ct.orig));
        assert_eq!(tr.on_destroyed(&ct), None, "once");
        // The client's retransmissions on a new entry do not report it again.
        for ts in [1_000_000_000, 3_000_000_000] {
            assert_eq!(tr.on_egress(&syn(ts, Some(ct)), &BITS), None);
        }
        // Already reported by the Tracker itself: no duplicate.
        let mut tr = Tracker::default();
        let mut dead = None;
        for ts in [0, 1_000_000_000, 3_000_000_000] {
            dead = dead.or(tr.on_egress(&syn(ts, Some(ct)), &BITS));
        }
        assert!(dead.is_some());
        assert_eq!(tr.on_destroyed(&ct), None);
        // Answered: no.
        let mut tr = Tracker::default();
        tr.on_egress(&syn(0, Some(dnat_ct(8 | BITS.seen_reply))), &BITS);
        assert_eq!(tr.on_destroyed(&ct), None);
    }

    #[test]
    fn flows_expire() {
        let mut tr = Tracker::default();
        tr.on_egress(&syn(0, Some(dnat_ct(8))), &BITS);
        assert_eq!(tr.len(), 1);
        tr.expire(FORGET_AFTER_NS + 1);
        assert!(tr.is_empty());
        assert!(tr.dnat_reply(&dnat_ct(8).reply).is_none());
    }

    fn packet(ts: u64, ifindex: u32, t: Tuple, flags: u8) -> Packet {
        Packet {
            ts_ns: ts,
            netns: 7,
            ifindex,
            mark: 0,
            tuple: t,
            tcp_flags: flags,
            ct: None,
        }
    }

    /// The hairpin seen from the node only: the DNAT'd SYN, the un-NAT'd
    /// SYN-ACK and the client's RST each cross a port of the bridge.
    #[test]
    fn a_rst_answering_a_syn_ack_is_held_then_reported_once() {
        let mut tr = Tracker::default();
        tr.on_egress(&syn(0, Some(dnat_ct(8))), &BITS);
        let syn_ack = dnat_ct(8).reply;
        let ms = 1_000_000;
        assert!(tr
            .on_egress(&packet(ms, 3, syn_ack, TCP_SYN | TCP_ACK), &BITS)
            .is_none());
        // The RST leaves the client's veth, then the bridge port.
        for (ts, dev) in [(2 * ms, 4), (2 * ms + 1000, 5)] {
            assert!(tr
                .on_egress(&packet(ts, dev, syn_ack.reversed(), TCP_RST), &BITS)
                .is_none());
        }
        assert!(tr.due_resets(2 * ms + RESET_GRACE_NS - 1).is_empty());
        let due = tr.due_resets(2 * ms + RESET_GRACE_NS);
        assert_eq!(due.len(), 1);
        let r = &due[0];
        assert_eq!(r.syn_ack, syn_ack);
        assert_eq!((r.syn_ack_at.ts_ns, r.syn_ack_at.ifindex), (ms, 3));
        assert_eq!(r.rst.ifindex, 4);
        assert_eq!(r.flow.as_ref().unwrap().orig, dnat_ct(8).orig);
        assert!(tr.due_resets(u64::MAX).is_empty());
        // Another RST for the same SYN-ACK later is not a second report.
        tr.on_egress(&packet(9 * ms, 4, syn_ack.reversed(), TCP_RST), &BITS);
        assert!(tr.due_resets(u64::MAX).is_empty());
    }

    #[test]
    fn the_syn_ack_drop_replaces_the_rst_answering_it() {
        let mut tr = Tracker::default();
        let syn_ack = tuple("10.0.0.13:80", "172.16.0.50:40000");
        tr.on_egress(&packet(0, 3, syn_ack, TCP_SYN | TCP_ACK), &BITS);
        tr.on_egress(&packet(10, 4, syn_ack.reversed(), TCP_RST), &BITS);
        tr.syn_ack_dropped(&syn_ack);
        assert!(tr.due_resets(u64::MAX).is_empty());
        tr.on_egress(&packet(20, 4, syn_ack.reversed(), TCP_RST), &BITS);
        assert!(tr.due_resets(u64::MAX).is_empty());
    }

    #[test]
    fn rsts_that_answer_no_syn_ack_are_not_resets() {
        let mut tr = Tracker::default();
        let t = tuple("10.0.0.13:80", "172.16.0.50:40000");
        // A refused SYN (closed port): RST|ACK to a SYN, no SYN-ACK before.
        tr.on_egress(&packet(0, 3, t.reversed(), TCP_SYN), &BITS);
        tr.on_egress(&packet(10, 4, t, TCP_RST | TCP_ACK), &BITS);
        // A SYN-ACK of another connection, and a SYN|RST (not a reset).
        tr.on_egress(
            &packet(
                20,
                3,
                tuple("10.0.0.13:80", "172.16.0.50:40001"),
                TCP_SYN | TCP_ACK,
            ),
            &BITS,
        );
        tr.on_egress(
            &packet(
                30,
                4,
                tuple("172.16.0.50:40001", "10.0.0.13:80"),
                TCP_SYN | TCP_RST,
            ),
            &BITS,
        );
        assert!(tr.due_resets(u64::MAX).is_empty());
    }

    #[test]
    fn a_reset_without_nat_says_who_has_no_socket() {
        let syn_ack = tuple("10.0.0.13:80", "172.16.0.50:40000");
        let r = Reset {
            syn_ack,
            syn_ack_at: SynAckSeen {
                ts_ns: 0,
                netns: 7,
                ifindex: 3,
                reported: true,
            },
            rst: packet(1_500_000, 4, syn_ack.reversed(), TCP_RST),
            flow: None,
        };
        let seen = reset_seen(&r, "veth9", "node", "veth5", "node");
        assert_eq!(
            seen,
            "the SYN-ACK 10.0.0.13:80 -> 172.16.0.50:40000 left veth9 in netns node; 1.5 ms \
             later 172.16.0.50 answered it with a RST, which left veth5 in netns node"
        );
        let f = reset(&r, &seen);
        assert_eq!(f.cause, "syn_ack_reset");
        assert_eq!(
            f.summary,
            "the SYN-ACK 10.0.0.13:80 -> 172.16.0.50:40000 was answered by a RST: 172.16.0.50 \
             has no socket waiting for it"
        );
        assert_eq!(
            f.evidence[1],
            "kdrop did not see a SYN 172.16.0.50:40000 -> 10.0.0.13:80 leave any device it follows"
        );
        assert!(f.fix.is_empty());
    }
}
