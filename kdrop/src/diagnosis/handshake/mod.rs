//! Following handshakes through conntrack and NAT: SYNs leaving a device
//! (with the conntrack entry they carry) in, handshakes that died silently
//! out. Pure: recorded packets and context in, findings out.
pub mod findings;
pub mod loopback;
pub mod refused;
pub mod tracker;
pub mod verdict;

pub use self::{
    findings::{reset, reset_seen, unanswered},
    loopback::{lb_loopback, looped_back},
    refused::{BridgeFacts, Refused, Translator},
    tracker::{CtBits, Dead, Flow, Reset, Tracker, RESET_GRACE_NS, UNANSWERED_AFTER},
};

#[cfg(test)]
pub(crate) mod tests {
    use kdrop_common::{TCP_ACK, TCP_RST, TCP_SYN};

    use super::{
        tracker::{SynAckSeen, FORGET_AFTER_NS, RESET_GRACE_NS},
        *,
    };
    use crate::model::{
        packet::{Ct, Packet, Tuple},
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
        let ends = tr.on_new(&ct, 9, 100, &BITS);
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
        let ends = Tracker::default().on_new(&snat, 9, 100, &BITS);
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
