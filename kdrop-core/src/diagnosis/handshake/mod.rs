//! Following handshakes through conntrack and NAT: SYNs leaving a device
//! (with the conntrack entry they carry) in, handshakes that died silently
//! out. Pure: recorded packets and context in, findings out.
pub mod findings;
pub mod loopback;
pub mod refused;
pub mod schedule;
pub mod syn_ack;
pub mod tracker;
pub mod transmission;
pub mod verdict;

pub use self::{
    findings::{reset, reset_seen, unanswered},
    loopback::{lb_loopback, looped_back},
    refused::{BridgeFacts, Refused, Translator},
    tracker::{CtBits, Dead, Flow, GaveUp, Reset, Tracker, RESET_GRACE_NS, UNANSWERED_AFTER},
};

#[cfg(test)]
pub(crate) mod tests {
    use kdrop_common::{TCP_ACK, TCP_RST, TCP_SYN};

    use super::{
        tracker::{SynAckSeen, FORGET_AFTER_NS, RESET_GRACE_NS},
        *,
    };
    use crate::diagnosis::fix_kinds::Kind;
    use crate::model::cause::Cause;
    use crate::model::{
        finding::Finding,
        packet::{Abandon, Ct, Packet, Tuple},
        routing::{Addr, Link, Tables},
    };

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
            isn: 0,
            ct,
        }
    }

    pub(crate) fn tables() -> Tables {
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
            rules6: vec![],
            routes6: vec![],
        }
    }

    #[test]
    fn a_dnat_syn_sent_three_times_is_an_asymmetric_return() {
        let mut tr = Tracker::default();
        assert_eq!(tr.on_egress(&syn(0, Some(dnat_ct(8))), &BITS), None);
        // The same SYN leaving the next device on its way is not a retransmission.
        let next_device = Packet {
            ifindex: 6,
            ..syn(20_000, Some(dnat_ct(8)))
        };
        assert_eq!(tr.on_egress(&next_device, &BITS), None);
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

    /// 6.12's whole suite under TCG: the first SYN left the client pod's
    /// device and, 200 ms later, the node's; counted twice, the handshake
    /// was "unanswered" at its first retransmission, before the SYN-ACK's
    /// drop that names the hairpin was read.
    #[test]
    fn one_transmission_is_counted_once_however_slowly_it_crosses_devices() {
        let mut tr = Tracker::default();
        let at = |ts: u64, netns: u32, ifindex: u32| Packet {
            netns,
            ifindex,
            ..syn(ts, Some(dnat_ct(8)))
        };
        let ms = 1_000_000;
        // The client pod's eth0, then the node's bridge port 300 ms later.
        assert_eq!(tr.on_egress(&at(0, 7, 2), &BITS), None);
        assert_eq!(tr.on_egress(&at(300 * ms, 9, 6), &BITS), None);
        // The retransmission, seen leaving the client pod again: the second.
        assert_eq!(tr.on_egress(&at(1_100 * ms, 7, 2), &BITS), None);
        // The socket's own word for it, and its way through the node.
        let mut rtx = at(1_100 * ms + 10, 7, 0);
        assert_eq!(tr.on_retrans(&rtx, &BITS), None);
        assert_eq!(tr.on_egress(&at(1_450 * ms, 9, 6), &BITS), None);
        // A retransmission however soon (a sock_ops program's timeout): it
        // leaves a device the last one left.
        let Some(Dead::Unanswered(f)) = tr.on_egress(&at(1_500 * ms, 7, 2), &BITS) else {
            panic!("the third transmission kills it")
        };
        assert_eq!((f.syns, f.first_ns, f.last_ns), (3, 0, 1_500 * ms));
        // Time alone tells apart the socket's retransmissions, seen leaving
        // no device: the first (and the one before it, unseen), then one
        // 600 ms later.
        let mut tr = Tracker::default();
        rtx.ts_ns = 0;
        assert_eq!(tr.on_retrans(&rtx, &BITS), None);
        rtx.ts_ns = 400 * ms;
        assert_eq!(tr.on_retrans(&rtx, &BITS), None, "within the window");
        rtx.ts_ns = 1_000 * ms;
        assert!(tr.on_retrans(&rtx, &BITS).is_some());
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
        let t = tables();
        let d = Translator {
            flow: flow.clone(),
            status: vec!["CONFIRMED".into(), "DST_NAT".into()],
            tables: &t,
            bridge: BridgeFacts::default(),
            exec: String::new(),
            netns: "node".into(),
            dev: "vethb".into(),
        };
        let refused = Refused {
            syn_ack,
            kernel: "kernel: drop reason NO_SOCKET at tcp_v4_rcv+0x1".into(),
            waits_for: Some("100.67.30.133:80".parse().unwrap()),
            dnat: Some(d.clone()),
            back: None,
            back_stale: None,
        };
        let f = refused::explain(&refused, &BITS).unwrap();
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

    /// Incident 5 traced everywhere: the DNAT'd SYN leaves the node, then a
    /// router on the way to the backend (client -> backend, no NAT of its
    /// own): the same handshake further on, not a loop.
    #[test]
    fn the_dnatted_syn_seen_further_on_is_not_a_loop() {
        let mut tr = Tracker::default();
        let router = |ts| Packet {
            netns: 8,
            tuple: tuple("172.16.0.50:40000", "10.0.0.13:80"),
            ct: None,
            ..syn(ts, None)
        };
        let mut dead = None;
        for ts in [0, 1_000_000_000, 3_000_000_000] {
            dead = dead.or(tr.on_egress(&syn(ts, Some(dnat_ct(8))), &BITS));
            dead = dead.or(tr.on_egress(&router(ts + 1_000_000), &BITS));
        }
        let Some(Dead::Unanswered(f)) = dead else {
            panic!("{dead:?}")
        };
        assert_eq!(f.orig, dnat_ct(8).orig);
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
            isn: 0,
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
        let f = lb_loopback(
            &looped_back(&first, &came_back, &["DST_NAT".into()], &tables()),
            "",
        );
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
    fn a_new_nat_entry_is_the_first_transmission_and_names_the_hairpin_reply() {
        let mut tr = Tracker::default();
        let ct = dnat_ct(8);
        let ends = tr.on_new(&ct, 9, 100, 0, &BITS);
        assert_eq!(ends, [ct.orig.src]);
        // Its reply side is known before any packet was seen leaving.
        assert_eq!(tr.dnat_reply(&ct.reply).map(|f| f.orig), Some(ct.orig));
        // The first SYN seen leaving after the event is the same transmission...
        assert_eq!(tr.on_egress(&syn(50, Some(ct)), &BITS), None);
        // ...the retransmissions are the second and third.
        assert_eq!(tr.on_egress(&syn(1_000_000_000, Some(ct)), &BITS), None);
        let Some(Dead::Unanswered(f)) = tr.on_egress(&syn(3_000_000_000, Some(ct)), &BITS) else {
            panic!()
        };
        assert_eq!((f.syns, f.netns), (3, 7));
        // SNAT: the client's end after it is followed too.
        let mut snat = ct;
        snat.reply.dst = tuple("10.0.0.12:61000", "10.0.0.12:61000").src;
        let ends = Tracker::default().on_new(&snat, 9, 100, 0, &BITS);
        assert_eq!(ends.len(), 2);
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
            isn: 0,
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

    /// The client believed the connection open: its RST|ACK (an abort) or
    /// any RST after its final ACK was refused is not a SYN-ACK refusal.
    #[test]
    fn a_client_that_acked_is_not_refusing_the_syn_ack() {
        let mut tr = Tracker::default();
        let syn_ack = tuple("10.0.0.13:80", "172.16.0.50:40000");
        tr.on_egress(&packet(0, 3, syn_ack, TCP_SYN | TCP_ACK), &BITS);
        tr.on_egress(&packet(10, 4, syn_ack.reversed(), TCP_RST | TCP_ACK), &BITS);
        assert!(tr.due_resets(u64::MAX).is_empty());
        let mut tr = Tracker::default();
        tr.on_egress(&packet(0, 3, syn_ack, TCP_SYN | TCP_ACK), &BITS);
        tr.final_ack_seen(&syn_ack, 5);
        tr.on_egress(&packet(10, 4, syn_ack.reversed(), TCP_RST), &BITS);
        assert!(tr.due_resets(u64::MAX).is_empty());
        // Seen before the SYN-ACK left: still not a refusal.
        let mut tr = Tracker::default();
        tr.final_ack_seen(&syn_ack, 0);
        tr.on_egress(&packet(5, 3, syn_ack, TCP_SYN | TCP_ACK), &BITS);
        tr.on_egress(&packet(10, 4, syn_ack.reversed(), TCP_RST), &BITS);
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
                isn: 0,
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

    fn flow(ct: Option<Ct>, syns: u32, last_ns: u64, ifindex: u32) -> Flow {
        let orig = ct.map_or(tuple("172.16.0.50:40000", "10.0.0.13:80"), |c| c.orig);
        Flow {
            orig,
            ct,
            first_ns: 0,
            last_ns,
            syns,
            first_unseen: false,
            from_entry: false,
            isn: 0,
            gave_up: None,
            answered: false,
            reported: true,
            netns: 7,
            ifindex,
            wire: tuple("172.16.0.50:40000", "10.0.0.13:80"),
            due_ns: 0,
            crossed: Default::default(),
        }
    }

    /// A conntrack entry that translated nothing (CONFIRMED only).
    fn plain_ct() -> Ct {
        Ct {
            orig: tuple("172.16.0.50:40000", "10.0.0.13:80"),
            reply: tuple("10.0.0.13:80", "172.16.0.50:40000"),
            status: 8,
            mark: 0,
            zone: 0,
            ctinfo: 2,
        }
    }

    /// Without a DNAT (no entry, or one that translated nothing) a SYN
    /// nobody answers is only unanswered: no return path to blame.
    #[test]
    fn an_unanswered_syn_without_dnat_is_only_unanswered() {
        let cases = [
            (
                flow(None, 1, 0, 2),
                "SYN 172.16.0.50:40000 -> 10.0.0.13:80 sent once out of eth0 without an answer",
                "1 transmission of the SYN, not answered",
            ),
            (
                flow(Some(plain_ct()), 3, 3_000_000_000, 9),
                "SYN 172.16.0.50:40000 -> 10.0.0.13:80 sent 3 times out of if9 without an answer",
                "3 transmissions of the same SYN over 3.0s, none answered",
            ),
        ];
        for (f, summary, sent) in cases {
            assert_eq!(
                unanswered(
                    &f,
                    &BITS,
                    &["CONFIRMED".into()],
                    &tables(),
                    "ip netns exec nodeb "
                ),
                Finding {
                    cause: Cause::Unanswered,
                    summary: summary.into(),
                    evidence: vec![sent.into()],
                    ..Finding::default()
                }
            );
        }
    }

    #[test]
    fn an_asymmetric_return_path_finding_in_full() {
        let ct = dnat_ct(8);
        let f = flow(Some(ct), 2, 1_000_000_000, 2);
        let status = ["CONFIRMED".to_string(), "DST_NAT".to_string()];
        assert_eq!(
            unanswered(&f, &BITS, &status, &tables(), "ip netns exec nodeb "),
            Finding {
                cause: Cause::AsymmetricReturnPath,
                summary: "SYN 172.16.0.50:40000 -> 10.0.58.158:80 was DNAT'd to 10.0.0.13:80 and \
                          sent out eth0, but no reply came back through this host: asymmetric \
                          return path"
                    .into(),
                evidence: vec![
                    "conntrack: orig 172.16.0.50:40000 -> 10.0.58.158:80, reply 10.0.0.13:80 -> \
                     172.16.0.50:40000, status [CONFIRMED,DST_NAT] (UNREPLIED)"
                        .into(),
                    "2 transmissions of the same SYN over 1.0s, none answered".into(),
                    "no SNAT: 10.0.0.13:80 sees 172.16.0.50 as the source and answers it \
                     directly, bypassing this host, so the reply is never un-DNAT'd"
                        .into(),
                ],
                fix: vec![
                    Kind::ReturnPathMasquerade.fix(
                        "ip netns exec nodeb iptables -t nat -A POSTROUTING -d 10.0.0.13/32 -p \
                         tcp --dport 80 -j MASQUERADE"
                            .into(),
                    ),
                    Kind::ConntrackDeleteEntry.fix(
                        "ip netns exec nodeb conntrack -D -p tcp --orig-src 172.16.0.50 \
                         --orig-port-src 40000 --orig-dst 10.0.58.158 --orig-port-dst 80"
                            .into(),
                    ),
                ],
                fix_or: vec![],
                fix_notes: vec![
                    "with the masquerade 10.0.0.13:80 answers this host, which un-NATs the \
                     reply; the entry made before it has no SNAT, so the client's retries from \
                     172.16.0.50:40000 fail until it is deleted (the second command)"
                        .into(),
                    "or, outside this node: route 172.16.0.50 back through this host on \
                     10.0.0.13's side (the router or gateway between them)"
                        .into(),
                ],
                inspect: vec![
                    "ip netns exec nodeb conntrack -L -p tcp --orig-src 172.16.0.50 \
                     --orig-port-src 40000 --orig-dst 10.0.58.158 --orig-port-dst 80"
                        .into()
                ],
            }
        );
    }

    #[test]
    fn an_lb_loopback_finding_in_full() {
        let first = Flow {
            orig: tuple("10.244.2.5:41000", "203.0.113.80:80"),
            ..flow(None, 3, 3_000_000_000, 2)
        };
        let back_ct = Ct {
            orig: tuple("10.244.2.5:41000", "10.70.0.10:30080"),
            reply: tuple("10.244.2.9:80", "10.244.2.5:41000"),
            ..dnat_ct(8)
        };
        let back = flow(Some(back_ct), 2, 3_000_000_000, 6);
        let status = ["CONFIRMED".to_string(), "DST_NAT".to_string()];
        let l = looped_back(&first, &back, &status, &tables());
        assert_eq!(
            lb_loopback(&l, "ip netns exec node "),
            Finding {
                cause: Cause::LbLoopbackWithoutSnat,
                summary: "SYN 10.244.2.5:41000 -> 203.0.113.80:80 left by eth0 to the load \
                          balancer, came back as 10.244.2.5:41000 -> 10.70.0.10:30080 and was \
                          DNAT'd to 10.244.2.9:80 without SNAT: the reply goes straight to \
                          10.244.2.5 and bypasses the load balancer"
                    .into(),
                evidence: vec![
                    "3 transmissions of the same SYN over 3.0s, none answered (to \
                     203.0.113.80:80, out of eth0)"
                        .into(),
                    "the same client address and port came back in: conntrack 10.244.2.5:41000 \
                     -> 10.70.0.10:30080, reply 10.244.2.9:80 -> 10.244.2.5:41000, status \
                     [CONFIRMED,DST_NAT], sent out vethb"
                        .into(),
                    "no SNAT: 10.244.2.9:80 answers 10.244.2.5 directly from its own address, so \
                     the reply is un-NAT'd at most to 10.70.0.10:30080 by this node, never to \
                     203.0.113.80:80: the client's socket never sees its SYN-ACK"
                        .into(),
                ],
                fix: vec![
                    Kind::LoopbackDnat.fix(
                        "ip netns exec node iptables -t nat -I PREROUTING -s 10.244.2.5/32 -d \
                         203.0.113.80/32 -p tcp --dport 80 -j DNAT --to-destination \
                         10.244.2.9:80"
                            .into(),
                    ),
                    Kind::ConntrackDeleteEntry.fix(
                        "ip netns exec node conntrack -D -p tcp --orig-src 10.244.2.5 \
                         --orig-port-src 41000 --orig-dst 203.0.113.80 --orig-port-dst 80"
                            .into(),
                    ),
                ],
                fix_or: vec![],
                fix_notes: vec![
                    "the first command serves 203.0.113.80:80 on this node for 10.244.2.5, as \
                     kube-proxy does for a Service's status.loadBalancer.ingress IPs; on \
                     Kubernetes the lasting repair is that: a Service whose load balancer \
                     reports its IP in status.loadBalancer.ingress (ipMode VIP), so kube-proxy \
                     writes those rules"
                        .into(),
                    "or SNAT before the load balancer (on the client's side), so the reply goes \
                     back through it"
                        .into(),
                    "externalTrafficPolicy: Cluster does not repair this: the load balancer's \
                     own DNAT of the VIP can only be undone by the load balancer, and the reply \
                     never reaches it"
                        .into(),
                ],
                inspect: vec![
                    "ip netns exec node iptables-save -t nat | grep -e 203.0.113.80 -e 10.244.2.9"
                        .into(),
                    "ip netns exec node conntrack -L -p tcp --orig-src 10.244.2.5 \
                     --orig-port-src 41000 --orig-dst 203.0.113.80 --orig-port-dst 80"
                        .into(),
                    "kubectl get svc -A -o wide | grep 203.0.113.80".into(),
                ],
            }
        );
    }

    /// Three SYNs of `p`'s handshake, a second apart, with `other` (another
    /// handshake) sent once before: what the tracker says of the third.
    fn third_syn_after(other: Packet, p: Packet) -> Option<Dead> {
        let mut tr = Tracker::default();
        assert_eq!(tr.on_egress(&other, &BITS), None);
        let mut dead = None;
        for ts in [1, 1_000_000_000, 3_000_000_000] {
            dead = dead.or(tr.on_egress(
                &Packet {
                    ts_ns: ts,
                    ..p.clone()
                },
                &BITS,
            ));
        }
        dead
    }

    /// A loopback takes the same client end, two destinations, and exactly
    /// one of them DNAT'd without SNAT: anything else is each handshake
    /// unanswered on its own.
    #[test]
    fn only_the_same_client_end_dnatted_on_one_side_is_a_loopback() {
        let untracked = syn(0, None);
        let to_other = |ct: Option<Ct>| Packet {
            tuple: tuple("172.16.0.50:40000", "192.0.2.1:443"),
            ct: ct.map(|c| Ct {
                orig: tuple("172.16.0.50:40000", "192.0.2.1:443"),
                reply: tuple("192.0.2.1:443", "172.16.0.50:40000"),
                ..c
            }),
            ..syn(0, None)
        };
        // Another client's DNAT'd handshake.
        let other_client = Packet {
            tuple: tuple("172.16.0.51:40000", "10.0.0.13:80"),
            ..syn(
                0,
                Some(Ct {
                    orig: tuple("172.16.0.51:40000", "10.0.58.158:80"),
                    reply: tuple("10.0.0.13:80", "172.16.0.51:40000"),
                    ..dnat_ct(8)
                }),
            )
        };
        // The same client end to another address, tracked without NAT.
        let Some(Dead::Unanswered(f)) =
            third_syn_after(to_other(Some(plain_ct())), untracked.clone())
        else {
            panic!()
        };
        assert_eq!(f.orig, untracked.tuple);
        let Some(Dead::Unanswered(f)) = third_syn_after(other_client, to_other(None)) else {
            panic!()
        };
        assert_eq!(f.orig, tuple("172.16.0.50:40000", "192.0.2.1:443"));
        // The same client end DNAT'd elsewhere: a loop.
        let Some(Dead::LoopedBack(pair)) =
            third_syn_after(syn(0, Some(dnat_ct(8))), to_other(None))
        else {
            panic!()
        };
        assert_eq!(
            (pair.0.orig, pair.1.orig),
            (tuple("172.16.0.50:40000", "192.0.2.1:443"), dnat_ct(8).orig)
        );
    }

    /// The SYN that came back DNAT'd may reach the count first: the pair
    /// is still (the SYN to the VIP, the one that came back).
    #[test]
    fn a_loopback_counted_first_on_its_way_back_keeps_the_order() {
        let out = Packet {
            tuple: tuple("172.16.0.50:40000", "203.0.113.80:80"),
            ..syn(0, None)
        };
        let mut tr = Tracker::default();
        let mut dead = None;
        for ts in [0, 1_000_000_000, 3_000_000_000] {
            dead = dead.or(tr.on_egress(&syn(ts, Some(dnat_ct(8))), &BITS));
            dead = dead.or(tr.on_egress(
                &Packet {
                    ts_ns: ts + 1,
                    ..out.clone()
                },
                &BITS,
            ));
        }
        let Some(Dead::LoopedBack(pair)) = dead else {
            panic!("{dead:?}")
        };
        assert_eq!((pair.0.orig, pair.1.orig), (out.tuple, dnat_ct(8).orig));
        assert_eq!((pair.0.syns, pair.1.syns), (2, 3));
    }

    /// Only a segment with both SYN and ACK answers a handshake; an ACK
    /// alone (or any segment without SYN) is neither an answer nor a
    /// transmission.
    #[test]
    fn segments_without_syn_neither_answer_nor_count() {
        let mut tr = Tracker::default();
        let t = syn(0, None).tuple;
        assert_eq!(tr.on_egress(&syn(0, None), &BITS), None);
        for (ts, tup, flags) in [
            (500_000_000, t.reversed(), TCP_ACK),
            (600_000_000, t, TCP_ACK),
            (700_000_000, t.reversed(), 0x01 | TCP_ACK),
        ] {
            assert_eq!(tr.on_egress(&packet(ts, 2, tup, flags), &BITS), None);
        }
        assert_eq!(tr.on_egress(&syn(1_000_000_000, None), &BITS), None);
        let Some(Dead::Unanswered(f)) = tr.on_egress(&syn(3_000_000_000, None), &BITS) else {
            panic!()
        };
        assert_eq!(f.syns, 3);
    }

    /// A SYN-ACK is remembered until it expires, whatever other SYN-ACKs
    /// leave meanwhile.
    #[test]
    fn a_syn_ack_is_forgotten_by_age_only() {
        let a = tuple("10.0.0.13:80", "172.16.0.50:40000");
        let b = tuple("10.0.0.13:80", "172.16.0.50:40001");
        let reset_of = |tr: &mut Tracker, ts, t: Tuple| {
            tr.on_egress(&packet(ts, 4, t.reversed(), TCP_RST), &BITS);
            tr.due_resets(u64::MAX)
                .into_iter()
                .map(|r| r.syn_ack)
                .collect::<Vec<_>>()
        };
        let mut tr = Tracker::default();
        tr.on_egress(&packet(0, 3, a, TCP_SYN | TCP_ACK), &BITS);
        tr.on_egress(&packet(2_000_000_000, 3, b, TCP_SYN | TCP_ACK), &BITS);
        assert_eq!(reset_of(&mut tr, 2_100_000_000, a), [a]);

        let mut tr = Tracker::default();
        tr.on_egress(&packet(0, 3, a, TCP_SYN | TCP_ACK), &BITS);
        tr.on_egress(&packet(FORGET_AFTER_NS, 3, b, TCP_SYN | TCP_ACK), &BITS);
        tr.expire(FORGET_AFTER_NS + 1);
        assert_eq!(reset_of(&mut tr, FORGET_AFTER_NS + 2, a), []);
        assert_eq!(reset_of(&mut tr, FORGET_AFTER_NS + 3, b), [b]);
    }

    /// `tracker::MAX_FLOWS`.
    const MAX_FLOWS: u32 = 65_536;

    fn client(i: u32) -> Tuple {
        Tuple {
            src: (std::net::Ipv4Addr::from(0x0a80_0000 + i), 40000).into(),
            dst: "10.0.0.13:80".parse().unwrap(),
        }
    }

    /// A SYN-ACK flood fills the table: the last second's are kept, older
    /// ones forgotten.
    #[test]
    fn a_full_syn_ack_table_keeps_the_last_second() {
        let mut tr = Tracker::default();
        for i in 0..MAX_FLOWS - 1 {
            tr.on_egress(
                &packet(0, 3, client(i).reversed(), TCP_SYN | TCP_ACK),
                &BITS,
            );
        }
        let recent = client(MAX_FLOWS).reversed();
        tr.on_egress(&packet(1_500_000_000, 3, recent, TCP_SYN | TCP_ACK), &BITS);
        let new = client(MAX_FLOWS + 1).reversed();
        tr.on_egress(&packet(2_000_000_000, 3, new, TCP_SYN | TCP_ACK), &BITS);
        for t in [client(0), recent.reversed(), new.reversed()] {
            tr.on_egress(&packet(2_100_000_000, 4, t, TCP_RST), &BITS);
        }
        let due: Vec<_> = tr
            .due_resets(u64::MAX)
            .into_iter()
            .map(|r| r.syn_ack)
            .collect();
        assert_eq!(due.len(), 2);
        assert!(due.contains(&recent) && due.contains(&new), "{due:?}");
    }

    /// A full flow table is emptied of flows idle before the new one, from
    /// a SYN seen leaving or a new conntrack entry alike.
    #[test]
    fn a_full_flow_table_makes_room() {
        for by_event in [false, true] {
            let mut tr = Tracker::default();
            for i in 0..MAX_FLOWS {
                tr.on_egress(&packet(0, 2, client(i), TCP_SYN), &BITS);
            }
            assert_eq!(tr.len(), MAX_FLOWS as usize);
            let new = Ct {
                orig: client(MAX_FLOWS),
                reply: client(MAX_FLOWS).reversed(),
                ..plain_ct()
            };
            if by_event {
                tr.on_new(&new, 7, 1_000_000_000, 0, &BITS);
            } else {
                tr.on_egress(&syn(1_000_000_000, Some(new)), &BITS);
            }
            assert_eq!(tr.len(), 1);
        }
    }

    /// Below the limit nothing is forgotten to make room.
    #[test]
    fn flows_below_the_limit_are_all_kept() {
        let mut tr = Tracker::default();
        assert!(tr.is_empty());
        tr.on_egress(&syn(0, None), &BITS);
        tr.on_egress(&packet(10_000_000_000, 2, client(1), TCP_SYN), &BITS);
        let new = Ct {
            orig: client(2),
            reply: client(2).reversed(),
            ..plain_ct()
        };
        tr.on_new(&new, 7, 20_000_000_000, 0, &BITS);
        assert_eq!(tr.len(), 3);
        assert!(!tr.is_empty());
    }

    /// Only a DNAT'd entry's reply side names its handshake: an entry
    /// without DNAT (untranslated, or SNAT only) is no hairpin candidate.
    #[test]
    fn only_dnatted_entries_are_found_by_their_reply() {
        let mut tr = Tracker::default();
        tr.on_egress(&syn(0, Some(plain_ct())), &BITS);
        assert_eq!(tr.dnat_reply(&plain_ct().reply), None);
        let snat = Ct {
            reply: tuple("10.0.0.13:80", "10.0.0.12:61000"),
            status: 8 | BITS.src_nat,
            ..plain_ct()
        };
        let ends = tr.on_new(&snat, 9, 100, 0, &BITS);
        assert_eq!(
            ends,
            [
                "172.16.0.50:40000".parse().unwrap(),
                "10.0.0.12:61000".parse().unwrap()
            ]
        );
        assert_eq!(tr.dnat_reply(&snat.reply), None);
        assert_eq!(tr.len(), 1);
    }

    const S: u64 = 1_000_000_000;

    fn syn_isn(ts: u64, isn: u32) -> Packet {
        Packet {
            isn,
            ..syn(ts, None)
        }
    }

    fn syn_ack_isn(ts: u64, isn: u32) -> Packet {
        Packet {
            tuple: syn(0, None).tuple.reversed(),
            tcp_flags: TCP_SYN | TCP_ACK,
            isn,
            ..syn(ts, None)
        }
    }

    fn rst_isn(ts: u64, isn: u32) -> Packet {
        Packet {
            ifindex: 4,
            tcp_flags: TCP_RST,
            isn,
            ..syn(ts, None)
        }
    }

    /// A RST refuses a SYN-ACK only if its sequence number answers that
    /// SYN-ACK's connection: a client port reused (healthy churn), the
    /// later connection's SYN-ACK unseen, its RST answering a FIN is not
    /// the refusal of the earlier one's (6.1's guest reported that once).
    #[test]
    fn a_rst_of_another_connection_on_the_tuple_refuses_no_syn_ack() {
        let s = 1_000_000_000;
        let mut tr = Tracker::default();
        tr.on_egress(&syn_isn(0, 100), &BITS);
        tr.on_egress(&syn_ack_isn(1000, 100), &BITS);
        tr.on_egress(&syn_isn(3 * s, 200), &BITS);
        tr.on_egress(&rst_isn(3 * s + 900, 200), &BITS);
        assert_eq!(tr.due_resets(u64::MAX), []);
        // The earlier connection's own refusal still is one.
        tr.on_egress(&rst_isn(3 * s + 1000, 100), &BITS);
        let [r] = &tr.due_resets(u64::MAX)[..] else {
            panic!("one reset")
        };
        assert_eq!((r.syn_ack_at.ts_ns, r.syn_ack_at.isn), (1000, 100));
    }

    /// The SYN-ACK of a connection that reuses the tuple replaces the
    /// earlier one's: a refusal names when its own SYN-ACK left, and an
    /// earlier one already settled does not hide it.
    #[test]
    fn a_syn_ack_of_a_new_connection_on_the_tuple_replaces_the_old() {
        let s = 1_000_000_000;
        let mut tr = Tracker::default();
        let syn_ack = syn_ack_isn(1000, 100);
        tr.on_egress(&syn_ack, &BITS);
        tr.final_ack_seen(&syn_ack.tuple, 2000);
        // Its retransmission keeps the first transmission's time.
        tr.on_egress(&syn_ack_isn(s, 100), &BITS);
        tr.on_egress(&rst_isn(s + 10, 100), &BITS);
        assert_eq!(tr.due_resets(u64::MAX), []);
        tr.on_egress(&syn_ack_isn(5 * s, 300), &BITS);
        tr.on_egress(&rst_isn(5 * s + 10, 300), &BITS);
        let [r] = &tr.due_resets(u64::MAX)[..] else {
            panic!("one reset")
        };
        assert_eq!((r.syn_ack_at.ts_ns, r.syn_ack_at.isn), (5 * s, 300));
        // Unknown ISNs (older bundles) match anything, as before.
        let mut tr = Tracker::default();
        tr.on_egress(&syn_ack_isn(1000, 0), &BITS);
        tr.on_egress(&rst_isn(2000, 300), &BITS);
        assert_eq!(tr.due_resets(u64::MAX).len(), 1);
    }

    fn gave_up(ts: u64, isn: u32, retransmits: Option<u32>, err: i32) -> Abandon {
        Abandon {
            packet: Packet {
                ifindex: 0,
                ..syn_isn(ts, isn)
            },
            err,
            retransmits,
        }
    }

    #[test]
    fn connections_that_reuse_a_client_port_are_not_one_handshake() {
        let mut tr = Tracker::default();
        // Three connections from one client port, a second apart, their
        // SYN-ACKs unseen (a capped monitor): no SYN sent three times.
        for (i, isn) in [11, 22, 33].into_iter().enumerate() {
            assert_eq!(tr.on_egress(&syn_isn(i as u64 * S, isn), &BITS), None);
        }
        // The third one's own retransmissions are.
        assert_eq!(tr.on_egress(&syn_isn(4 * S, 33), &BITS), None);
        let Some(Dead::Unanswered(f)) = tr.on_egress(&syn_isn(6 * S, 33), &BITS) else {
            panic!("the same SYN three times is dead")
        };
        assert_eq!((f.syns, f.isn, f.first_ns), (3, 33, 2 * S));
    }

    #[test]
    fn a_syn_ack_answers_only_its_own_connection() {
        let mut tr = Tracker::default();
        tr.on_egress(&syn_isn(0, 5), &BITS);
        // The answer to an older connection on the same tuple.
        tr.on_egress(&syn_ack_isn(S / 2, 4), &BITS);
        tr.on_egress(&syn_isn(S, 5), &BITS);
        assert!(matches!(
            tr.on_egress(&syn_isn(3 * S, 5), &BITS),
            Some(Dead::Unanswered(_))
        ));
        // Its own answer (or an unknown ISN) does.
        let mut tr = Tracker::default();
        tr.on_egress(&syn_isn(0, 5), &BITS);
        tr.on_egress(&syn_ack_isn(S / 2, 5), &BITS);
        tr.on_egress(&syn_isn(S, 5), &BITS);
        assert_eq!(tr.on_egress(&syn_isn(3 * S, 5), &BITS), None);
    }

    #[test]
    fn a_retransmission_counts_the_transmission_before_it() {
        let mut tr = Tracker::default();
        // The device probe was not armed: only the socket's retransmissions.
        assert_eq!(tr.on_retrans(&syn_isn(S, 9), &BITS), None);
        let Some(Dead::Unanswered(f)) = tr.on_retrans(&syn_isn(3 * S, 9), &BITS) else {
            panic!("the second retransmission is the third transmission")
        };
        assert_eq!((f.syns, f.first_unseen), (3, true));
        assert_eq!(
            findings::transmissions(&f),
            "3 transmissions of the same SYN, none answered (counted by the client's socket: \
             kdrop saw those of the last 2.0s)"
        );
        // The same retransmission seen leaving a device too is one.
        let mut tr = Tracker::default();
        // A socket's retransmission has no device.
        let rtx = Packet {
            ifindex: 0,
            ..syn_isn(S, 9)
        };
        tr.on_retrans(&rtx, &BITS);
        assert_eq!(tr.on_egress(&syn_isn(S + 1_000, 9), &BITS), None);
        let next_device = Packet {
            ifindex: 6,
            ..syn_isn(S + 2_000, 9)
        };
        assert_eq!(tr.on_egress(&next_device, &BITS), None);
    }

    #[test]
    fn a_client_that_gives_up_gets_its_verdict_then() {
        // A 1 s connect timeout: one transmission, never seen, no retransmission.
        let mut tr = Tracker::default();
        let Some(Dead::Unanswered(f)) = tr.on_abandon(&gave_up(S, 9, Some(0), 0), &BITS) else {
            panic!("given up is dead")
        };
        assert_eq!(
            (f.syns, f.gave_up, f.ifindex),
            (1, Some(GaveUp::Socket(0)), 0)
        );
        assert_eq!(
            findings::transmissions(&f),
            "1 transmission of the SYN, not answered; then the client's connect() ended in \
             SYN-SENT: the application closed it (a connect timeout, or it gave up)"
        );
        // A 3 s timeout: one retransmission seen, the socket says 1.
        let mut tr = Tracker::default();
        tr.on_retrans(&syn_isn(S, 9), &BITS);
        let Some(Dead::Unanswered(f)) = tr.on_abandon(&gave_up(3 * S, 9, Some(1), 110), &BITS)
        else {
            panic!("given up is dead")
        };
        assert_eq!(
            (f.syns, f.gave_up, f.ifindex),
            (2, Some(GaveUp::Socket(110)), 2)
        );
        assert!(findings::transmissions(&f)
            .ends_with("the kernel gave up (ETIMEDOUT: net.ipv4.tcp_syn_retries spent)"));
        // Unknown retransmissions: at least the one.
        let mut tr = Tracker::default();
        let Some(Dead::Unanswered(f)) = tr.on_abandon(&gave_up(S, 9, None, 0), &BITS) else {
            panic!()
        };
        assert_eq!(f.syns, 1);
    }

    #[test]
    fn a_client_that_gives_up_after_an_answer_or_a_verdict_is_no_new_death() {
        // Refused by a RST: the RST (or the drop that made it) explains it.
        let mut tr = Tracker::default();
        assert_eq!(tr.on_abandon(&gave_up(S, 9, Some(0), 111), &BITS), None);
        // Answered.
        let mut tr = Tracker::default();
        tr.on_egress(&syn_isn(0, 9), &BITS);
        tr.on_egress(&syn_ack_isn(1_000, 9), &BITS);
        assert_eq!(tr.on_abandon(&gave_up(S, 9, Some(0), 0), &BITS), None);
        // Already reported at the second retransmission.
        let mut tr = Tracker::default();
        tr.on_retrans(&syn_isn(S, 9), &BITS);
        assert!(tr.on_retrans(&syn_isn(3 * S, 9), &BITS).is_some());
        assert_eq!(tr.on_abandon(&gave_up(4 * S, 9, Some(2), 0), &BITS), None);
        // Another connection on the tuple gave up: it is a death of its own.
        assert!(tr
            .on_abandon(&gave_up(9 * S, 10, Some(0), 0), &BITS)
            .is_some());
    }

    /// A local client's retransmission (its socket's namespace, no device)
    /// does not move a DNAT'd handshake to the client's namespace, in
    /// either order with the entry's NEW event; a device sighting does say
    /// where the SYN left.
    #[test]
    fn a_client_socket_retransmission_leaves_the_dnat_in_the_entry_namespace() {
        let ct = dnat_ct(8);
        let retrans = Packet {
            netns: 3,
            ifindex: 0,
            tuple: ct.orig,
            ..syn(1_000_000_000, None)
        };
        let place = |tr: &Tracker| tr.dnat_reply(&ct.reply).map(|f| (f.netns, f.ifindex));
        let mut tr = Tracker::default();
        tr.on_new(&ct, 9, 100, 0, &BITS);
        assert_eq!(tr.on_retrans(&retrans, &BITS), None);
        assert_eq!(place(&tr), Some((9, 0)));
        let mut tr = Tracker::default();
        assert_eq!(tr.on_retrans(&retrans, &BITS), None);
        tr.on_new(&ct, 9, 100, 0, &BITS);
        assert_eq!(place(&tr), Some((9, 0)));
        assert_eq!(tr.on_egress(&syn(1_000_100_000, Some(ct)), &BITS), None);
        assert_eq!(place(&tr), Some((7, 2)));
    }

    #[test]
    fn a_tracked_handshake_whose_retransmissions_stop_is_overdue_once() {
        const MS: u64 = 1_000_000;
        let tracked = |ts| syn(ts, Some(dnat_ct(8)));
        // Followed from its entry's creation (its first transmission),
        // then nothing: due 1 s later, and some lateness.
        let mut tr = Tracker::default();
        tr.on_new(&dnat_ct(8), 7, 0, 0, &BITS);
        assert!(tr.overdue(1_400 * MS, usize::MAX).is_empty());
        let [f] = &tr.overdue(1_500 * MS, usize::MAX)[..] else {
            panic!("overdue after 1.5 s")
        };
        assert_eq!(
            (f.syns, f.gave_up),
            (
                1,
                Some(GaveUp::Silent {
                    waited_ns: 1_500 * MS
                })
            )
        );
        assert!(findings::transmissions(f).ends_with(
            "no retransmission came in the 1.5s after the last, though the next was due (Linux \
             doubles the gap from 1 s): the client gave up, a connect timeout as short as that \
             (or its retransmissions stopped reaching this host)"
        ));
        assert!(tr.overdue(60_000 * MS, usize::MAX).is_empty(), "once");
        // A retransmission on time moves the deadline: the next gap is 2 s.
        let mut tr = Tracker::default();
        tr.on_new(&dnat_ct(8), 7, 0, 0, &BITS);
        tr.on_egress(&tracked(1_000 * MS), &BITS);
        assert!(tr.overdue(3_400 * MS, usize::MAX).is_empty());
        let [f] = &tr.overdue(3_500 * MS, usize::MAX)[..] else {
            panic!("overdue 2.5 s after the second")
        };
        assert_eq!(f.syns, 2);
        // The caller found a reply in the entry: answered, never reported.
        let mut tr = Tracker::default();
        tr.on_new(&dnat_ct(8), 7, 0, 0, &BITS);
        let [f] = &tr.overdue(2_000 * MS, usize::MAX)[..] else {
            panic!()
        };
        tr.answered(&f.orig);
        tr.on_egress(&tracked(3_000 * MS), &BITS);
        assert!(tr.overdue(60_000 * MS, usize::MAX).is_empty());
    }

    /// The conntrack test of the project's CI: the point that shows the
    /// SYN leaving was armed late, its first retransmission went by unseen,
    /// and kdrop called the handshake given up while the client was still
    /// retransmitting. What kdrop did not watch is not waited for.
    #[test]
    fn a_retransmission_due_before_the_device_point_was_armed_is_not_waited_for() {
        const MS: u64 = 1_000_000;
        let mut tr = Tracker::default();
        tr.watching(Some(700 * MS));
        tr.on_new(&dnat_ct(8), 7, 100 * MS, 0, &BITS);
        // Disarmed meanwhile: the deadline set stands.
        tr.watching(None);
        assert!(tr.overdue(3_599 * MS, usize::MAX).is_empty());
        let [f] = &tr.overdue(3_600 * MS, usize::MAX)[..] else {
            panic!("overdue 3.5 s after the entry")
        };
        assert_eq!(f.syns, 1);
        // Armed in time (10 ms after): the first retransmission is due.
        let mut tr = Tracker::default();
        tr.watching(Some(110 * MS));
        tr.on_new(&dnat_ct(8), 7, 100 * MS, 0, &BITS);
        assert_eq!(tr.overdue(1_600 * MS, usize::MAX).len(), 1);
        // The retransmission after the next one it saw is timed as usual.
        let mut tr = Tracker::default();
        tr.watching(Some(700 * MS));
        tr.on_new(&dnat_ct(8), 7, 100 * MS, 0, &BITS);
        tr.on_egress(&syn(3_100 * MS, Some(dnat_ct(8))), &BITS);
        assert!(tr.overdue(5_599 * MS, usize::MAX).is_empty());
        assert_eq!(tr.overdue(5_600 * MS, usize::MAX).len(), 1);
    }

    /// incident5 in a fresh machine's CI (dpkg unpacking beside it): the
    /// session was busy 1.2 s (the SYN-ACK's drop explained) before it read
    /// the entry's NEW event, so the SYN's first retransmission had gone by
    /// before the points were armed; timed from the read, the handshake was
    /// called given up after "1 transmission" while its client still sent.
    /// The reader's own lateness moves the wait to the retransmission after.
    #[test]
    fn an_entry_read_late_does_not_wait_for_a_retransmission_gone_by() {
        const MS: u64 = 1_000_000;
        // SYN at 0, read and armed at 1.2 s.
        let read_late = |late| {
            let mut tr = Tracker::default();
            tr.watching(Some(1_200 * MS));
            tr.on_new(&dnat_ct(8), 7, 1_200 * MS, late, &BITS);
            tr
        };
        // Not told: the 1 s one is waited for, 2.7 s is the verdict.
        assert_eq!(read_late(0).overdue(2_700 * MS, usize::MAX).len(), 1);
        // Told: the SYN may have left at 0, its 1 s retransmission before
        // the arming; the one 2 s after it is waited for (due by 4.2 s
        // counted from the read, overdue at 4.7 s).
        let mut tr = read_late(1_200 * MS);
        assert!(tr.overdue(4_699 * MS, usize::MAX).is_empty());
        tr.on_egress(&syn(3_000 * MS, Some(dnat_ct(8))), &BITS);
        assert!(tr.overdue(5_499 * MS, usize::MAX).is_empty());
        let [f] = &tr.overdue(5_500 * MS, usize::MAX)[..] else {
            panic!("overdue 2.5 s after the retransmission seen")
        };
        assert_eq!(f.syns, 2);
        // A client that gave up at once still gets its verdict, later.
        assert_eq!(
            read_late(1_200 * MS).overdue(4_700 * MS, usize::MAX).len(),
            1
        );
        // Lateness within LATE_NS changes nothing.
        let mut tr = Tracker::default();
        tr.watching(Some(110 * MS));
        tr.on_new(&dnat_ct(8), 7, 100 * MS, 400 * MS, &BITS);
        assert_eq!(tr.overdue(1_600 * MS, usize::MAX).len(), 1);
    }

    #[test]
    fn only_unanswered_tracked_handshakes_become_overdue() {
        const S: u64 = 1_000_000_000;
        // No conntrack entry to ask: a local client's socket says it.
        let mut tr = Tracker::default();
        tr.on_egress(&syn(0, None), &BITS);
        assert!(tr.overdue(100 * S, usize::MAX).is_empty());
        // Answered.
        let mut tr = Tracker::default();
        tr.on_egress(&syn(0, Some(dnat_ct(8))), &BITS);
        tr.on_egress(&syn(1_000, Some(dnat_ct(8 | BITS.seen_reply))), &BITS);
        assert!(tr.overdue(100 * S, usize::MAX).is_empty());
        // Reported at its third transmission.
        let mut tr = Tracker::default();
        tr.on_new(&dnat_ct(8), 7, 0, 0, &BITS);
        for ts in [S, 3 * S] {
            tr.on_egress(&syn(ts, Some(dnat_ct(8))), &BITS);
        }
        assert!(tr.overdue(100 * S, usize::MAX).is_empty());
        // First seen leaving a device, with its entry: it may be several
        // retransmissions in (the device probe armed late), so when the
        // next is due is not known.
        let mut tr = Tracker::default();
        tr.on_egress(&syn(S, Some(dnat_ct(8))), &BITS);
        assert!(tr.overdue(100 * S, usize::MAX).is_empty());
        // Followed from its entry's creation (a client elsewhere).
        let mut tr = Tracker::default();
        tr.on_new(&dnat_ct(8), 7, 0, 0, &BITS);
        assert_eq!(tr.overdue(2 * S, usize::MAX).len(), 1);
    }

    #[test]
    fn a_rst_seen_after_this_host_dnatted_it_still_refuses_the_syn_ack() {
        let mut tr = Tracker::default();
        // The SYN-ACK left towards the client un-DNAT'd: VIP -> client.
        let ct = dnat_ct(8 | BITS.seen_reply);
        let syn_ack = Packet {
            tuple: ct.orig.reversed(),
            tcp_flags: TCP_SYN | TCP_ACK,
            ct: Some(ct),
            ..syn(0, None)
        };
        tr.on_egress(&syn_ack, &BITS);
        // The client's RST to the VIP, DNAT'd here on its way to the backend.
        let rst = Packet {
            tuple: ct.reply.reversed(),
            tcp_flags: TCP_RST,
            ct: Some(ct),
            ..syn(1_000, None)
        };
        tr.on_egress(&rst, &BITS);
        let [r] = &tr.due_resets(u64::MAX)[..] else {
            panic!("the RST refuses the SYN-ACK")
        };
        assert_eq!(r.syn_ack, ct.orig.reversed());
    }

    #[test]
    fn overdue_handshakes_come_a_bounded_number_at_a_time() {
        const S: u64 = 1_000_000_000;
        let mut tr = Tracker::default();
        for port in 0..5u16 {
            let mut ct = dnat_ct(8);
            ct.orig.src.set_port(50_000 + port);
            tr.on_new(&ct, 7, 0, 0, &BITS);
        }
        assert_eq!(tr.overdue(2 * S, 2).len(), 2);
        assert_eq!(tr.overdue(2 * S, 2).len(), 2);
        assert_eq!(tr.overdue(2 * S, 2).len(), 1, "the rest, later");
        assert!(tr.overdue(2 * S, 2).is_empty());
    }
}
