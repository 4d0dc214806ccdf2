//! Following each handshake by its conntrack original tuple: SYNs, SYN-ACKs
//! and RSTs leaving devices in; handshakes that died silently, or were
//! refused with a RST, out.
use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
};

use kdrop_common::{TCP_ACK, TCP_RST, TCP_SYN};

pub use super::schedule::GaveUp;
use super::schedule::{overdue_at, LATE_NS};
pub use super::transmission::Crossed;
pub use resets::{Reset, SynAckSeen};

mod resets;
use crate::model::packet::{Abandon, Ct, Packet, Tuple};

/// The `sk_err` values a connect() ending in SYN-SENT carries
/// (include/uapi/asm-generic/errno.h, the same on x86_64 and arm64).
pub mod errno {
    /// A RST answered the SYN, which the drop or the RST explains.
    pub const ECONNREFUSED: i32 = 111;
    /// The kernel gave up (tcp_syn_retries).
    pub const ETIMEDOUT: i32 = 110;
    pub const EHOSTUNREACH: i32 = 113;
    pub const ENETUNREACH: i32 = 101;
}

/// A SYN sent this many times without an answer is a dead handshake: the
/// first and two retransmissions (1 s and 3 s after it, Linux defaults).
pub const UNANSWERED_AFTER: u32 = 3;
/// Flows idle this long are forgotten.
pub(super) const FORGET_AFTER_NS: u64 = 60_000_000_000;
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
    /// The first transmission was not seen: counted from a retransmission or
    /// from the socket's own count.
    pub first_unseen: bool,
    /// Followed from its conntrack entry's creation (ctnetlink NEW): its
    /// count starts at its first transmission, so when the next is due is
    /// known. A flow first seen leaving a device may be several
    /// retransmissions in (the device probe is armed on demand).
    pub from_entry: bool,
    /// The client's ISN (0: unknown): another ISN on the same tuple is
    /// another connection.
    pub isn: u32,
    /// The client gave up: how kdrop knows.
    pub gave_up: Option<GaveUp>,
    pub answered: bool,
    pub reported: bool,
    /// Where the (last) SYN left: namespace and device.
    pub netns: u32,
    pub ifindex: u32,
    /// The SYN as it left (after any DNAT).
    pub wire: Tuple,
    /// When its next retransmission is overdue (0: not waited for).
    pub due_ns: u64,
    /// Where its last transmission was seen leaving.
    pub crossed: Crossed,
}

impl Flow {
    /// Sets and returns when its next retransmission is overdue.
    fn next_due(&mut self, watched_from: Option<u64>) -> u64 {
        self.due_ns = overdue_at(self.last_ns, self.syns, watched_from);
        self.due_ns
    }

    /// Still waiting for an answer, followed from its entry's creation.
    fn waiting(&self) -> bool {
        !self.answered && !self.reported && self.gave_up.is_none() && self.from_entry
    }
}

/// Two packets' client ISNs (`Packet::isn`) name different connections
/// on one tuple; 0 is unknown (a bundle recorded before kdrop read it).
pub(super) fn isn_differs(a: u32, b: u32) -> bool {
    a != 0 && b != 0 && a != b
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
    /// When each unanswered tracked flow's next retransmission is overdue
    /// (stale entries are skipped when popped).
    deadlines: BinaryHeap<Reverse<(u64, Tuple)>>,
    /// Since when the points that see SYNs leave devices are armed.
    watched_from: Option<u64>,
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
    /// The points that show SYNs leaving devices were armed at `since`
    /// (None: disarmed, or unknown): a retransmission due before then is
    /// not waited for (see schedule::overdue_at).
    pub fn watching(&mut self, since: Option<u64>) {
        self.watched_from = since;
    }

    /// Feeds one packet leaving a device; returns a dead handshake when a
    /// SYN has now gone unanswered `UNANSWERED_AFTER` times (once per flow).
    pub fn on_egress(&mut self, p: &Packet, bits: &CtBits) -> Option<Dead> {
        if p.tcp_flags & (TCP_RST | TCP_SYN) == TCP_RST {
            self.on_rst(p);
            return None;
        }
        let flow = self.count(p, bits, false)?;
        Some(self.dead(flow, bits))
    }

    /// A SYN (or SYN-ACK) a local socket retransmitted: one more
    /// transmission, and proof of one before it, seen or not (the device
    /// probe is armed on demand, after the first).
    pub fn on_retrans(&mut self, p: &Packet, bits: &CtBits) -> Option<Dead> {
        let flow = self.count(p, bits, true)?;
        Some(self.dead(flow, bits))
    }

    /// A local client's connect() ended in SYN-SENT: its handshake is dead
    /// now, however few transmissions it had, unless something answered it
    /// (a SYN-ACK seen, a RST refusing it) or it was reported already.
    pub fn on_abandon(&mut self, a: &Abandon, bits: &CtBits) -> Option<Dead> {
        if a.err == errno::ECONNREFUSED {
            return None;
        }
        let p = &a.packet;
        // A socket's ends are its connection's original tuple.
        let f = self.flow_for(p.tuple, p, p.ts_ns);
        let sent = a.retransmits.map_or(1, |r| r.saturating_add(1));
        if f.syns < sent {
            // The socket sent more than kdrop saw: the first among them.
            f.first_unseen = true;
            f.syns = sent;
        }
        f.gave_up = Some(GaveUp::Socket(a.err));
        if f.answered || f.reported {
            return None;
        }
        f.reported = true;
        let flow = f.clone();
        Some(self.dead(flow, bits))
    }

    /// The flow of `key` for the handshake `p` belongs to: a new one when
    /// the tuple is new or carried another connection (another ISN).
    fn flow_for(&mut self, key: Tuple, p: &Packet, now_ns: u64) -> &mut Flow {
        if self.flows.len() >= MAX_FLOWS && !self.flows.contains_key(&key) {
            self.expire(now_ns.saturating_add(FORGET_AFTER_NS));
        }
        let fresh = || Flow {
            orig: key,
            ct: None,
            first_ns: now_ns,
            last_ns: now_ns,
            syns: 0,
            first_unseen: false,
            from_entry: false,
            isn: p.isn,
            gave_up: None,
            answered: false,
            reported: false,
            netns: p.netns,
            ifindex: p.ifindex,
            wire: p.tuple,
            due_ns: 0,
            crossed: Crossed::default(),
        };
        let f = self.flows.entry(key).or_insert_with(fresh);
        if isn_differs(p.isn, f.isn) {
            // The client reused its port: another connection, another
            // handshake (RFC 9293 3.4.1: a new ISN).
            *f = fresh();
        }
        if f.isn == 0 {
            f.isn = p.isn;
        }
        f
    }

    /// A dead handshake: unanswered, or looped back through a load balancer.
    fn dead(&mut self, flow: Flow, bits: &CtBits) -> Dead {
        // The same client endpoint with another destination, one of the two
        // DNAT'd without SNAT: the SYN looped back through a load balancer.
        // Whichever reached the count first (a flow followed from its
        // conntrack entry may be counted before the one seen leaving).
        let dnat_only = |f: &Flow| {
            f.ct.is_some_and(|c| c.status & bits.dst_nat != 0 && c.status & bits.src_nat == 0)
        };
        // Not the DNAT'd SYN itself seen further on (a router between the
        // DNAT and the backend follows it as client -> backend).
        let translated = |a: &Flow, b: &Flow| a.ct.is_some_and(|c| c.reply.src == b.orig.dst);
        let looped = self
            .flows
            .values()
            .find(|o| {
                o.orig.src == flow.orig.src
                    && o.orig.dst != flow.orig.dst
                    && dnat_only(o) != dnat_only(&flow)
                    && !translated(o, &flow)
                    && !translated(&flow, o)
            })
            .cloned();
        let (first, back) = match looped {
            None => return Dead::Unanswered(Box::new(flow)),
            Some(o) if dnat_only(&o) => (flow, o),
            Some(o) => (o, flow),
        };
        for key in [first.orig, back.orig] {
            if let Some(f) = self.flows.get_mut(&key) {
                f.reported = true;
            }
        }
        Dead::LoopedBack(Box::new((first, back)))
    }

    fn count(&mut self, p: &Packet, bits: &CtBits, retrans: bool) -> Option<Flow> {
        let syn = p.tcp_flags & TCP_SYN != 0;
        let ack = p.tcp_flags & TCP_ACK != 0;
        if syn && ack {
            self.syn_ack(p);
            return None;
        }
        if !syn {
            return None;
        }
        let key = p.ct.map_or(p.tuple, |c| c.orig);
        let watched_from = self.watched_from;
        let f = self.flow_for(key, p, p.ts_ns);
        let another = f.crossed.another(p, f.last_ns) || f.syns == 0;
        if retrans && f.syns == 0 {
            // The transmission this one repeats, before kdrop saw any.
            f.syns = 1;
            f.first_unseen = true;
        }
        if another {
            f.syns += 1;
        }
        f.last_ns = p.ts_ns;
        // A socket's retransmission has no device and no entry: where its
        // SYN left, if seen, stands, and so does the namespace of the entry
        // that NAT'd it (ctnetlink NEW): the client's own namespace is not
        // where the DNAT is (6.1's whole suite: the device probe armed late,
        // a hairpin explained from the client pod's tables).
        if !retrans || (f.ifindex == 0 && !f.from_entry) {
            f.netns = p.netns;
            f.ifindex = p.ifindex;
            f.wire = p.tuple;
        }
        if let Some(ct) = p.ct {
            f.ct = Some(ct);
            if ct.status & bits.seen_reply != 0 {
                f.answered = true;
            }
        }
        let dead = (f.syns >= UNANSWERED_AFTER && !f.answered && !f.reported).then(|| {
            f.reported = true;
            f.clone()
        });
        let due = (dead.is_none() && f.waiting()).then(|| f.next_due(watched_from));
        if let Some(ct) = p.ct.filter(|c| c.status & bits.dst_nat != 0) {
            self.dnat_replies.insert(ct.reply, key);
        }
        if let Some(due) = due {
            self.deadline(due, key);
        }
        dead
    }

    fn deadline(&mut self, due: u64, key: Tuple) {
        if self.deadlines.len() >= 4 * MAX_FLOWS {
            // Mostly stale: rebuilt from the flows still waiting.
            self.deadlines = self
                .flows
                .iter()
                .filter(|(_, f)| f.waiting())
                .map(|(k, f)| Reverse((f.due_ns, *k)))
                .collect();
        }
        self.deadlines.push(Reverse((due, key)));
    }

    /// Tracked flows (a conntrack entry says whether they were answered)
    /// whose next retransmission is overdue at `now_ns`, at most `max` (the
    /// rest wait for the next call: each costs the caller a conntrack
    /// query, and a SYN flood through NAT makes thousands): their clients
    /// gave up, unless the entry shows a reply kdrop did not see. Marked
    /// given up; the caller asks conntrack, then reports or `answered`.
    pub fn overdue(&mut self, now_ns: u64, max: usize) -> Vec<Flow> {
        let mut out = Vec::new();
        while let Some(Reverse((due, key))) = self.deadlines.peek().copied() {
            if due > now_ns || out.len() >= max {
                break;
            }
            self.deadlines.pop();
            let Some(f) = self.flows.get_mut(&key) else {
                continue;
            };
            // A later transmission moved its deadline: this one is stale.
            if !f.waiting() || f.due_ns != due {
                continue;
            }
            f.gave_up = Some(GaveUp::Silent {
                waited_ns: now_ns.saturating_sub(f.last_ns),
            });
            out.push(f.clone());
        }
        out
    }

    /// The caller found the flow's entry answered (SEEN_REPLY) after all.
    pub fn answered(&mut self, key: &Tuple) {
        if let Some(f) = self.flows.get_mut(key) {
            f.answered = true;
            f.gave_up = None;
        }
    }

    /// The caller reported the flow.
    pub fn reported(&mut self, key: &Tuple) {
        if let Some(f) = self.flows.get_mut(key) {
            f.reported = true;
        }
    }

    /// A NAT'd conntrack entry was created (ctnetlink NEW event, `now_ns`
    /// when it was read): the SYN that created it is the handshake's first
    /// transmission, followed from here as if seen leaving. Returns the
    /// client's ends to follow (before and after SNAT).
    /// `late_ns`: how long the reader was busy before it read the event
    /// (the event has no time of its own): the SYN may have left that long
    /// before `now_ns`, and a retransmission due before the points were
    /// armed plus that is not waited for (schedule::overdue_at allows
    /// `LATE_NS` of it already).
    pub fn on_new(
        &mut self,
        ct: &Ct,
        netns: u32,
        now_ns: u64,
        late_ns: u64,
        bits: &CtBits,
    ) -> Vec<std::net::SocketAddr> {
        let key = ct.orig;
        if self.flows.len() >= MAX_FLOWS && !self.flows.contains_key(&key) {
            self.expire(now_ns.saturating_add(FORGET_AFTER_NS));
        }
        // The SYN as it left this namespace: to whoever answers, from the
        // client's address after SNAT.
        let wire = ct.reply.reversed();
        let watched_from = self
            .watched_from
            .map(|w| w.saturating_add(late_ns.saturating_sub(LATE_NS)));
        let f = self.flows.entry(key).or_insert_with(|| Flow {
            orig: key,
            ct: None,
            first_ns: now_ns,
            last_ns: now_ns,
            syns: 1,
            first_unseen: false,
            from_entry: false,
            isn: 0,
            gave_up: None,
            answered: false,
            reported: false,
            netns,
            ifindex: 0,
            wire,
            due_ns: 0,
            crossed: Crossed::default(),
        });
        f.ct = Some(*ct);
        f.from_entry = true;
        if f.ifindex == 0 {
            // Only a socket's retransmission seen so far, in the client's
            // namespace: the entry's is where the SYN was NAT'd.
            f.netns = netns;
        }
        if ct.status & bits.seen_reply != 0 {
            f.answered = true;
        }
        let due = f.waiting().then(|| f.next_due(watched_from));
        if ct.status & bits.dst_nat != 0 {
            self.dnat_replies.insert(ct.reply, key);
        }
        if let Some(due) = due {
            self.deadline(due, key);
        }
        let mut ends = vec![ct.orig.src];
        if ct.reply.dst != ct.orig.src {
            ends.push(ct.reply.dst);
        }
        ends
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
