//! A local server's SYN-ACK that no final ACK answers: the request socket
//! retransmits it (`tcp:tcp_retransmit_synack`) until the ACK comes or
//! `tcp_synack_retries` (5) run out, about 63 s. Seen from the server's
//! node alone, with a client elsewhere that gives up after one SYN, these
//! retransmissions are all that shows the handshake dying: nothing is
//! dropped here. A request socket stops retransmitting once the final ACK
//! completes it (reqsk_timer_handler, inet_rtx_syn_ack from tcp_check_req
//! for a repeated SYN; v6.18
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/inet_connection_sock.c
//! and net/ipv4/tcp_minisocks.c), so a count reaching `DEAD_AFTER` is at
//! least a second without it.
use crate::model::cause::Cause;
use std::collections::HashMap;

use kdrop_common::{TCP_ACK, TCP_SYN};

use crate::model::{
    finding::Finding,
    packet::{Packet, Tuple},
};

/// Retransmissions of one SYN-ACK that make its handshake dead: with the
/// first, three transmissions (the timer's are 1 s and 3 s after it, Linux
/// defaults)...
pub const DEAD_AFTER: u32 = 2;
/// ... this far apart at least, first to last: a SYN the client repeats
/// makes the request socket answer at once, beside the timer's (the
/// duplicate's own drop says more, and comes first).
const DEAD_SPAN_NS: u64 = 1_500_000_000;
/// At most this many request sockets followed (a SYN flood's are dropped
/// oldest-second first).
const MAX: usize = 65_536;

/// One request socket's SYN-ACK, retransmitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynAckRetransmitted {
    /// The SYN-ACK (server -> client).
    pub syn_ack: Tuple,
    /// The client's ISN (0: unknown): another is another connection.
    pub isn: u32,
    pub retransmits: u32,
    pub first_ns: u64,
    pub last_ns: u64,
    pub netns: u32,
    pub reported: bool,
}

/// The SYN-ACK retransmissions of each request socket.
#[derive(Debug, Default)]
pub struct SynAckRetransmits {
    by_tuple: HashMap<Tuple, SynAckRetransmitted>,
}

/// Is `p` a SYN-ACK?
pub fn is_syn_ack(p: &Packet) -> bool {
    p.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK
}

impl SynAckRetransmits {
    /// One retransmission of the SYN-ACK `p`; its handshake once it is
    /// dead (`DEAD_AFTER` retransmissions, reported once).
    pub fn on_retrans(&mut self, p: &Packet) -> Option<SynAckRetransmitted> {
        if self.by_tuple.len() >= MAX && !self.by_tuple.contains_key(&p.tuple) {
            let cutoff = p.ts_ns.saturating_sub(1_000_000_000);
            self.by_tuple.retain(|_, s| s.last_ns >= cutoff);
            if self.by_tuple.len() >= MAX {
                self.by_tuple.clear();
            }
        }
        let fresh = || SynAckRetransmitted {
            syn_ack: p.tuple,
            isn: p.isn,
            retransmits: 0,
            first_ns: p.ts_ns,
            last_ns: p.ts_ns,
            netns: p.netns,
            reported: false,
        };
        let s = self.by_tuple.entry(p.tuple).or_insert_with(fresh);
        // The client reused its port: another request socket.
        if p.isn != 0 && s.isn != 0 && p.isn != s.isn {
            *s = fresh();
        }
        s.retransmits += 1;
        s.last_ns = p.ts_ns;
        let span = s.last_ns.saturating_sub(s.first_ns);
        if s.retransmits < DEAD_AFTER || span < DEAD_SPAN_NS || s.reported {
            return None;
        }
        s.reported = true;
        Some(s.clone())
    }
}

/// What the node shows around one: the device its SYN-ACK leaves by, whether the request socket still waits (sock_diag), and
/// `ns` runs commands in its namespace.
pub struct Around<'a> {
    pub dev: &'a str,
    pub pending: Option<bool>,
    pub ns: &'a str,
}

/// The handshake dead on the server's side: its SYN-ACK repeated without a
/// final ACK.
pub fn unanswered(s: &SynAckRetransmitted, a: &Around) -> Finding {
    let (server, client) = (s.syn_ack.src, s.syn_ack.dst);
    let sent = s.retransmits + 1;
    let secs = s.last_ns.saturating_sub(s.first_ns) as f64 / 1e9;
    let out = if a.dev.is_empty() {
        String::new()
    } else {
        format!(" out of {}", a.dev)
    };
    let mut evidence = vec![format!(
        "tcp:tcp_retransmit_synack: the request socket {server} <- {client} retransmitted its \
         SYN-ACK {} times over {secs:.1}s ({sent} transmissions with the first); a final ACK \
         would have completed it and ended them",
        s.retransmits
    )];
    match a.pending {
        Some(true) => evidence.push(format!(
            "sock_diag: the request socket {server} <- {client} still waits in SYN-RECV"
        )),
        Some(false) => evidence.push(format!(
            "sock_diag: no request socket {server} <- {client} is left now (completed or timed \
             out since)"
        )),
        None => {}
    }
    if !a.dev.is_empty() {
        evidence.push(format!(
            "this node routes {}{out}: the SYN-ACK leaves the node there",
            client.ip()
        ));
    }
    Finding {
        cause: Cause::SynAckUnanswered,
        summary: format!(
            "SYN-ACK {server} -> {client} sent {sent} times{out} without the client's final \
             ACK: the SYN-ACK or the ACK is lost between this node and {}, or the client gave up",
            client.ip()
        ),
        evidence,
        fix_notes: vec![format!(
            "look for what drops SYN-ACKs towards {} past this node (a firewall or security \
             group on the way, a return route other than the way the SYN came in) or the final \
             ACK towards {server}; a client that repeats its SYN meanwhile (a duplicate_syn \
             record) never got the SYN-ACK",
            client.ip()
        )],
        inspect: vec![
            format!(
                "{}ss -tn state syn-recv src {} dst {}",
                a.ns,
                server.ip(),
                client.ip()
            ),
            format!("{}ip route get {} from {}", a.ns, client.ip(), server.ip()),
            format!("{}nstat -az TcpExtTCPSynRetrans", a.ns),
        ],
        ..Finding::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syn_ack(ts_ns: u64, isn: u32) -> Packet {
        Packet {
            ts_ns,
            netns: 7,
            ifindex: 0,
            mark: 0,
            tuple: Tuple {
                src: "10.0.2.2:7002".parse().unwrap(),
                dst: "10.0.1.1:42031".parse().unwrap(),
            },
            tcp_flags: TCP_SYN | TCP_ACK,
            isn,
            ct: None,
        }
    }

    #[test]
    fn dead_at_the_second_retransmission_once() {
        let mut r = SynAckRetransmits::default();
        assert_eq!(r.on_retrans(&syn_ack(1_000_000_000, 5)), None);
        let s = r.on_retrans(&syn_ack(3_000_000_000, 5)).expect("dead");
        assert_eq!(
            (s.retransmits, s.first_ns, s.last_ns),
            (2, 1_000_000_000, 3_000_000_000)
        );
        assert_eq!(
            r.on_retrans(&syn_ack(7_000_000_000, 5)),
            None,
            "reported once"
        );
    }

    #[test]
    fn a_repeated_syns_answer_beside_the_timers_is_not_a_second() {
        let mut r = SynAckRetransmits::default();
        const S: u64 = 1_000_000_000;
        assert_eq!(r.on_retrans(&syn_ack(S, 5)), None);
        assert_eq!(r.on_retrans(&syn_ack(S + 2_000_000, 5)), None);
        assert_eq!(r.on_retrans(&syn_ack(2 * S + S / 2 - 1, 5)), None);
        assert!(r.on_retrans(&syn_ack(2 * S + S / 2, 5)).is_some());
    }

    #[test]
    fn another_isn_is_another_request_socket() {
        const S: u64 = 2_000_000_000;
        let mut r = SynAckRetransmits::default();
        assert_eq!(r.on_retrans(&syn_ack(S, 5)), None);
        assert_eq!(r.on_retrans(&syn_ack(2 * S, 6)), None, "count restarts");
        assert!(r.on_retrans(&syn_ack(3 * S, 6)).is_some());
        // Unknown ISNs are taken as the same connection.
        let mut r = SynAckRetransmits::default();
        assert_eq!(r.on_retrans(&syn_ack(S, 0)), None);
        assert!(r.on_retrans(&syn_ack(2 * S, 6)).is_some());
    }

    #[test]
    fn a_syn_ack_is_syn_and_ack() {
        let mut p = syn_ack(1, 1);
        assert!(is_syn_ack(&p));
        p.tcp_flags = TCP_SYN;
        assert!(!is_syn_ack(&p));
        p.tcp_flags = TCP_ACK;
        assert!(!is_syn_ack(&p));
    }

    #[test]
    fn the_finding_in_full() {
        let s = SynAckRetransmitted {
            syn_ack: syn_ack(0, 1).tuple,
            isn: 1,
            retransmits: 2,
            first_ns: 1_000_000_000,
            last_ns: 3_000_000_000,
            netns: 7,
            reported: true,
        };
        let a = Around {
            dev: "s0",
            pending: Some(true),
            ns: "ip netns exec srv ",
        };
        let f = unanswered(&s, &a);
        assert_eq!(f.cause, "syn_ack_unanswered");
        assert_eq!(
            f.summary,
            "SYN-ACK 10.0.2.2:7002 -> 10.0.1.1:42031 sent 3 times out of s0 without the \
             client's final ACK: the SYN-ACK or the ACK is lost between this node and \
             10.0.1.1, or the client gave up"
        );
        assert_eq!(
            f.evidence,
            [
                "tcp:tcp_retransmit_synack: the request socket 10.0.2.2:7002 <- 10.0.1.1:42031 \
                 retransmitted its SYN-ACK 2 times over 2.0s (3 transmissions with the first); \
                 a final ACK would have completed it and ended them",
                "sock_diag: the request socket 10.0.2.2:7002 <- 10.0.1.1:42031 still waits in \
                 SYN-RECV",
                "this node routes 10.0.1.1 out of s0: the SYN-ACK leaves the node there",
            ]
        );
        assert!(f.fix.is_empty(), "the repair is past this node");
        assert_eq!(
            f.inspect,
            [
                "ip netns exec srv ss -tn state syn-recv src 10.0.2.2 dst 10.0.1.1",
                "ip netns exec srv ip route get 10.0.1.1 from 10.0.2.2",
                "ip netns exec srv nstat -az TcpExtTCPSynRetrans",
            ]
        );
        let gone = Around {
            dev: "",
            pending: Some(false),
            ns: "",
        };
        let f = unanswered(&s, &gone);
        assert!(f.summary.contains("sent 3 times without"), "{}", f.summary);
        assert_eq!(f.evidence.len(), 2);
        assert!(
            f.evidence[1].contains("no request socket"),
            "{:?}",
            f.evidence
        );
    }
}
