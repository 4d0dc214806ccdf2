//! The SYN-ACKs seen leaving, and the RSTs that refuse them: a RST is held
//! for `RESET_GRACE_NS` (a drop of the SYN-ACK it answers may still come and
//! replace it), then reported once.
use std::collections::hash_map::Entry;

use kdrop_common::TCP_ACK;

use super::{isn_differs, Flow, Tracker, MAX_FLOWS, RESET_GRACE_NS};
use crate::model::packet::{Packet, Tuple};

/// A SYN-ACK seen leaving a device (the first time its connection's did:
/// a connection that reuses the tuple replaces it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynAckSeen {
    pub ts_ns: u64,
    pub netns: u32,
    pub ifindex: u32,
    pub reported: bool,
    /// The client's ISN it answers (`Packet::isn`; 0: unknown).
    pub isn: u32,
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

impl Tracker {
    /// A SYN-ACK leaving: it answers the flow it replies to, and is kept
    /// among the SYN-ACKs seen leaving.
    pub(super) fn syn_ack(&mut self, p: &Packet) {
        // A SYN-ACK leaving answers the flow it replies to.
        let key = p.ct.map_or(p.tuple.reversed(), |c| c.orig);
        if let Some(f) = self.flows.get_mut(&key) {
            // Unless it answers another connection on the same tuple.
            if !isn_differs(p.isn, f.isn) {
                f.answered = true;
            }
        }
        if self.syn_acks.len() >= MAX_FLOWS && !self.syn_acks.contains_key(&p.tuple) {
            // A SYN-ACK flood: keep the last second's.
            let cutoff = p.ts_ns.saturating_sub(1_000_000_000);
            self.syn_acks.retain(|_, s| s.ts_ns >= cutoff);
            if self.syn_acks.len() >= MAX_FLOWS {
                self.syn_acks.clear();
            }
        }
        let seen = SynAckSeen {
            ts_ns: p.ts_ns,
            netns: p.netns,
            ifindex: p.ifindex,
            reported: false,
            isn: p.isn,
        };
        match self.syn_acks.entry(p.tuple) {
            // Another connection on the same tuple (a reused client port):
            // a RST refusing the earlier one's SYN-ACK can no longer come.
            Entry::Occupied(mut o) if isn_differs(o.get().isn, p.isn) => {
                o.insert(seen);
            }
            Entry::Occupied(_) => {}
            Entry::Vacant(v) => {
                v.insert(seen);
            }
        }
    }

    /// A RST leaving: held when it answers a SYN-ACK seen leaving (once per
    /// SYN-ACK, however many devices the RST crosses). Seen leaving, not at
    /// tcp:tcp_send_reset: on v6.1 that fires only for a full socket, and a
    /// RST refusing a SYN-ACK has none (tcp_v4_send_reset,
    /// https://github.com/torvalds/linux/blob/v6.1/net/ipv4/tcp_ipv4.c).
    pub(super) fn on_rst(&mut self, p: &Packet) {
        // A RST refusing a SYN-ACK carries no ACK (the SYN-ACK had one:
        // `tcp_v4_send_reset` then sets only seq, v6.18
        // https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_ipv4.c);
        // RST|ACK is a socket aborting a connection it believed open.
        if p.tcp_flags & TCP_ACK != 0 {
            return;
        }
        // As the SYN-ACK left (reversed), or, for a RST seen after this
        // host translated it (DNAT'd on its way to the backend), as the
        // client addressed it: the entry's original direction.
        let Some(syn_ack) = [Some(p.tuple), p.ct.map(|c| c.orig)]
            .into_iter()
            .flatten()
            .map(|t| t.reversed())
            .find(|t| self.syn_acks.contains_key(t))
        else {
            return;
        };
        let Some(seen) = self.syn_acks.get_mut(&syn_ack) else {
            return;
        };
        // It refuses that SYN-ACK only if its sequence number answers it:
        // a RST of a later connection on the same tuple (whose own SYN-ACK
        // kdrop did not see, shed under load) answers something else, as
        // in 6.1's guest under healthy churn on reused ports (a FIN after
        // a SO_LINGER 0 abort, taken for the refusal of a SYN-ACK 3.9 s
        // older).
        if seen.reported || isn_differs(seen.isn, p.isn) {
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

    /// The client's final ACK answering the SYN-ACK `t` was seen (refused
    /// by a full accept queue): the client believed the connection open,
    /// so a RST it sends later is not a refusal of the SYN-ACK.
    pub fn final_ack_seen(&mut self, t: &Tuple, ts_ns: u64) {
        self.pending.remove(t);
        if let Some(s) = self.syn_acks.get_mut(t) {
            s.reported = true;
            return;
        }
        // A flood of refused ACKs: the table stays bounded (the RST|ACK
        // test still keeps their aborts out).
        if self.syn_acks.len() >= MAX_FLOWS {
            return;
        }
        self.syn_acks
            .entry(*t)
            .or_insert(SynAckSeen {
                ts_ns,
                netns: 0,
                ifindex: 0,
                reported: true,
                isn: 0,
            })
            .reported = true;
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
}
