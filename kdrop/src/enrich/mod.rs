//! Events in, records out: each kernel event gets its names (reason,
//! namespace, interface, code location, time) and its finding. The node is
//! asked through [`Node`] (I/O, cached); the reasoning is `diagnosis`'s.
mod drop;
mod handshake;
mod listen;
mod memo;
mod network_policy;
mod pods;
mod watch;

pub use self::watch::{ListenWatch, Refusals};

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use crate::{
    context::{conntrack_lookup::Side, NetnsName, Node},
    diagnosis::{
        handshake::{
            syn_ack::{self, SynAckRetransmits},
            verdict::Verdicts,
            CtBits, Dead, Tracker,
        },
        names,
        netfilter::pairing::VerdictLog,
    },
    kernel::facts::{CtNames, Reasons},
    model::{
        finding::Finding,
        packet::{Ct, CtSeen, Destroyed, Event, Tuple},
        record::{CtRecord, DropRecord, TupleRecord},
        time::rfc3339,
    },
};

/// What enrichment knows about the kernel: set once at start.
pub struct Facts {
    pub reasons: Reasons,
    pub ct_names: CtNames,
    /// The rung each netfilter function's verdicts come through.
    pub nf_rungs: HashMap<&'static str, String>,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC: bpf_ktime_get_ns() is monotonic.
    pub realtime_offset_ns: i128,
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC now.
pub fn realtime_offset_ns() -> i128 {
    clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC)
}

pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC).max(0) as u64
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// What a routing finding depends on: the namespace's routing state (its
/// generation) and the drop's own fields, with or without the kernel's
/// lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FindingKey {
    generation: u64,
    netns: u32,
    ifindex: u32,
    mark: u32,
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    reason: u32,
    src_check: Option<i32>,
    kernel_lookups: bool,
    /// The neighbour that sent it: the repair route's next hop.
    src_mac: Option<[u8; 6]>,
}
const FINDINGS_CACHED: usize = 4096;

pub struct Enricher<N: Node> {
    pub node: N,
    pub facts: Facts,
    ct_bits: CtBits,
    tracker: Tracker,
    /// One routing diagnosis per distinct drop while the context stays the
    /// same: a flood of identical drops costs one.
    findings: HashMap<FindingKey, Option<Finding>>,
    /// One diagnosis per distinct SYN drop while its inputs stay the same.
    memo: memo::Memo,
    /// One counter attribution per packet shape between two snapshots.
    attributions: memo::Attributions,
    /// Whether the memo is used (off: every drop diagnosed, for the tests
    /// that show it changes no output).
    pub memo_on: bool,
    /// Netfilter verdicts waiting for their drop.
    verdicts: VerdictLog,
    /// One verdict per handshake.
    handshakes: Verdicts,
    /// Local servers' SYN-ACKs retransmitted, by request socket.
    syn_acks: SynAckRetransmits,
    /// SYNs TCP freed after answering them otherwise, outside any failed
    /// handshake: not reported, counted (see `tcp_freed`).
    pub answered_by_tcp: u64,
    /// Drops with no finding of their own, held `HOLD_NS` for their
    /// handshake's verdict (kernel time of the drop, its ISN, record).
    held: VecDeque<(u64, u32, DropRecord)>,
}

/// How long a drop that explains nothing by itself waits for its
/// handshake's verdict. The SYN-ACK the client refuses comes within tens of
/// milliseconds of the server's answer; but a repeated SYN (`duplicate_syn`)
/// can come before the SYN-ACK it provokes by up to the request socket's
/// rate limit (tcp_check_req answers it through tcp_oow_rate_limited,
/// net.ipv4.tcp_invalid_ratelimit, 500 ms by default, v6.18
/// https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_minisocks.c)
/// or its timer: incident 4 traced everywhere printed the duplicate 288 ms
/// before the refused SYN-ACK that names the loop, two causes for one
/// handshake with 250 ms.
const HOLD_NS: u64 = 1_000_000_000;
/// At most this many overdue handshakes are checked against conntrack per
/// call of `due` (every 100 ms at least): 640 queries a second at most.
const OVERDUE_PER_CALL: usize = 64;
/// At most this many held at once: beyond it, unexplained drops go out at
/// once rather than wait in an unbounded queue.
const HELD_MAX: usize = 4096;

impl<N: Node> Enricher<N> {
    pub fn new(node: N, facts: Facts) -> Self {
        let bit = |n: &str| facts.ct_names.bit(n).unwrap_or(0);
        let ct_bits = CtBits {
            seen_reply: bit("SEEN_REPLY"),
            src_nat: bit("SRC_NAT"),
            dst_nat: bit("DST_NAT"),
        };
        Self {
            node,
            facts,
            ct_bits,
            tracker: Tracker::default(),
            findings: HashMap::new(),
            memo: memo::Memo::default(),
            attributions: memo::Attributions::default(),
            memo_on: true,
            verdicts: VerdictLog::default(),
            handshakes: Verdicts::default(),
            syn_acks: SynAckRetransmits::default(),
            answered_by_tcp: 0,
            held: VecDeque::new(),
        }
    }

    /// Drops that took a kept diagnosis (enrich::memo).
    pub fn memo_hits(&self) -> u64 {
        self.memo.hits
    }

    /// The record for one event, if it makes one: a drop always does; a
    /// packet leaving a device does when it shows a handshake died
    /// unanswered; a netfilter verdict waits for its drop.
    pub fn on_event(&mut self, e: &Event) -> Option<DropRecord> {
        let (r, ts, isn) = match e {
            Event::Drop(d) => {
                let r = self.drop_record(d);
                let in_failed = |me: &mut Self| {
                    client_end(&r).is_some_and(|c| me.handshakes.join(c, d.isn, d.ts_ns).is_some())
                };
                if tcp_freed(&r) && !in_failed(self) {
                    self.answered_by_tcp += 1;
                    return None;
                }
                // A drop that explains nothing by itself may belong to a
                // handshake whose verdict is a moment away (the SYN-ACK the
                // client refuses): held briefly, then filed under it.
                let weak = r.finding.as_ref().is_none_or(|f| f.cause.rank() == 0);
                if weak && client_end(&r).is_some() && self.held.len() < HELD_MAX {
                    self.held.push_back((d.ts_ns, d.isn, r));
                    return None;
                }
                (r, d.ts_ns, d.isn)
            }
            Event::Egress(p) => {
                let dead = self.tracker.on_egress(p, &self.ct_bits)?;
                (self.dead(&dead), p.ts_ns, p.isn)
            }
            // A retransmission is one more transmission of its handshake;
            // a SYN-ACK's also says the final ACK has not come.
            Event::Retrans(p) => {
                let dead = self.tracker.on_retrans(p, &self.ct_bits);
                let r = match dead {
                    Some(dead) => self.dead(&dead),
                    None if syn_ack::is_syn_ack(p) => {
                        let s = self.syn_acks.on_retrans(p)?;
                        self.syn_ack_unanswered(&s)
                    }
                    None => return None,
                };
                (r, p.ts_ns, p.isn)
            }
            // The client gave up: its handshake's verdict is due now.
            Event::Abandon(a) => {
                let dead = self.tracker.on_abandon(a, &self.ct_bits)?;
                (self.dead(&dead), a.packet.ts_ns, a.packet.isn)
            }
            Event::Verdict(v) => {
                self.verdicts.push(v.clone());
                return None;
            }
            // The session's, for --pcap.
            Event::Head(_) => return None,
        };
        Some(self.fold(r, ts, isn))
    }

    fn dead(&mut self, dead: &Dead) -> DropRecord {
        match dead {
            Dead::Unanswered(flow) => self.unanswered(flow, None),
            Dead::LoopedBack(pair) => self.unanswered(&pair.0, Some(&pair.1)),
        }
    }

    /// Files the record under its handshake: a shared id, and the
    /// handshake's one verdict (see diagnosis::handshake::verdict).
    /// Its summary then starts with the record's own pods
    /// (diagnosis::names).
    /// `isn`: the client's ISN of the record's connection (0: unknown).
    fn fold(&mut self, mut r: DropRecord, ts_ns: u64, isn: u32) -> DropRecord {
        let found = r.finding.take();
        r.finding = match (found, client_end(&r)) {
            (Some(found), Some(client)) => {
                let (id, finding) = self.handshakes.fold(client, isn, found, ts_ns);
                r.handshake = Some(id);
                Some(finding)
            }
            // No finding of its own: the handshake's verdict, if it has one.
            (None, Some(client)) => self.handshakes.join(client, isn, ts_ns).map(|(id, mut v)| {
                Arc::make_mut(&mut v).evidence.push(format!(
                    "this packet of the same handshake, by itself: {} at {}, nothing more",
                    r.reason.as_deref().unwrap_or("no drop reason"),
                    r.location
                ));
                r.handshake = Some(id);
                v
            }),
            (found, _) => found,
        };
        if let Some(f) = r.finding.as_mut() {
            names::name_pods(f, &r.pods);
        }
        r
    }

    /// "reset" records: RSTs answering a SYN-ACK, held
    /// `handshake::RESET_GRACE_NS` in case the SYN-ACK's own drop (which
    /// says more) follows; those due at `now` (CLOCK_MONOTONIC ns, the
    /// caller's: a replay passes the recorded one), every one with
    /// `u64::MAX` when tracing ends.
    pub fn due(&mut self, now: u64) -> Vec<DropRecord> {
        // At the end nothing is overdue: a retransmission's time had not come.
        let mut out = if now == u64::MAX {
            Vec::new()
        } else {
            self.given_up(now)
        };
        let resets = self.tracker.due_resets(now);
        for r in &resets {
            if self.sent_where_traced(r) {
                continue;
            }
            let rec = self.reset(r);
            out.push(self.fold(rec, r.rst.ts_ns, r.rst.isn));
        }
        out.extend(self.release_held(now));
        out
    }

    /// Held drops whose wait ended before `e` happened (kernel time): filed
    /// before it is, as a reader keeping up would have. A reader late by
    /// seconds (a slow guest's execs) took a drop, the SYN-ACK's
    /// retransmissions and its "unanswered" in one batch, and the drop held
    /// then joined the later verdict instead of making its own.
    pub fn held_due_before(&mut self, e: &Event) -> Vec<DropRecord> {
        let ts = match e {
            Event::Drop(d) => d.ts_ns,
            Event::Egress(p) | Event::Retrans(p) => p.ts_ns,
            Event::Abandon(a) => a.packet.ts_ns,
            Event::Verdict(_) | Event::Head(_) => return Vec::new(),
        };
        self.release_held(ts)
    }

    fn release_held(&mut self, now: u64) -> Vec<DropRecord> {
        let mut out = Vec::new();
        while self
            .held
            .front()
            .is_some_and(|(ts, _, _)| ts.saturating_add(HOLD_NS) <= now)
        {
            let (ts, isn, r) = self.held.pop_front().expect("front exists");
            out.push(self.fold(r, ts, isn));
        }
        out
    }

    /// Handshakes followed through their conntrack entries whose clients
    /// stopped retransmitting (a client elsewhere that gave up): "unanswered"
    /// records, unless the entry, asked now, shows a reply kdrop missed.
    fn given_up(&mut self, now: u64) -> Vec<DropRecord> {
        let mut out = Vec::new();
        for mut flow in self.tracker.overdue(now, OVERDUE_PER_CALL) {
            // Only an entry that is there and unreplied says so: a deleted
            // one says nothing (its destroy event reports it if unreplied).
            let Some(e) = self
                .node
                .conntrack_find(Side::Orig, &flow.orig, Some(flow.netns))
            else {
                continue;
            };
            if e.ct.status & self.ct_bits.seen_reply != 0 {
                self.tracker.answered(&flow.orig);
                continue;
            }
            self.tracker.reported(&flow.orig);
            flow.ct = Some(e.ct);
            let mut r = self.unanswered(&flow, None);
            if let Some(f) = r.finding.as_mut() {
                Arc::make_mut(f).evidence.push(format!(
                    "conntrack, asked now: the entry {} -> {} has still seen no reply{}",
                    e.ct.orig.src,
                    e.ct.orig.dst,
                    e.tcp_state
                        .map(|s| format!(
                            " (state {})",
                            crate::context::ctevents::parse::tcp_state_name(s)
                        ))
                        .unwrap_or_default()
                ));
            }
            out.push(self.fold(r, flow.last_ns, flow.isn));
        }
        out
    }

    /// The points that show SYNs leaving devices were armed at `since`
    /// (None: disarmed).
    pub fn watching(&mut self, since: Option<u64>) {
        self.tracker.watching(since);
    }

    /// A NAT'd conntrack entry was created: its handshake is followed from
    /// its first SYN; returns the client's ends to follow in the kernel.
    /// `late_ns`: how long the reader was busy before it read the event.
    pub fn on_new(
        &mut self,
        seen: &CtSeen,
        now_ns: u64,
        late_ns: u64,
    ) -> Vec<std::net::SocketAddr> {
        self.tracker
            .on_new(&seen.ct, seen.netns, now_ns, late_ns, &self.ct_bits)
    }

    /// A conntrack entry that died without a reply: an "unanswered" record
    /// for the handshake kdrop followed with that tuple, unless it was
    /// answered or already reported.
    pub fn on_destroyed(&mut self, d: &Destroyed) -> Option<DropRecord> {
        let flow = self.tracker.on_destroyed(&d.ct)?;
        let mut r = self.unanswered(&flow, None);
        let netns = self.netns_name(d.netns).display();
        let line = format!(
            "conntrack: the entry {} -> {} (reply {} -> {}) died without ever seeing a reply in netns {netns}{}, status [{}] (ctnetlink destroy event: timed out or deleted)",
            d.ct.orig.src,
            d.ct.orig.dst,
            d.ct.reply.src,
            d.ct.reply.dst,
            d.tcp_state
                .map(|s| format!(", state {}", crate::context::ctevents::parse::tcp_state_name(s)))
                .unwrap_or_default(),
            self.facts.ct_names.status(d.ct.status).join(",")
        );
        if let Some(f) = r.finding.as_mut() {
            Arc::make_mut(f).evidence.push(line);
        }
        Some(self.fold(r, flow.last_ns, flow.isn))
    }

    fn netns_name(&mut self, inode: u32) -> NetnsName {
        self.node
            .netns(inode)
            .unwrap_or(NetnsName { inode, name: None })
    }

    fn status(&self, ct: Option<&Ct>) -> Vec<String> {
        ct.map(|c| self.facts.ct_names.status(c.status))
            .unwrap_or_default()
    }

    fn ct_record(&self, ct: &Ct) -> CtRecord {
        let t = |t: &Tuple| TupleRecord {
            src: t.src.to_string(),
            dst: t.dst.to_string(),
        };
        CtRecord {
            orig: t(&ct.orig),
            reply: t(&ct.reply),
            status: self.facts.ct_names.status(ct.status),
            mark: ct.mark,
            zone: ct.zone,
        }
    }

    /// A kernel timestamp (CLOCK_MONOTONIC) as RFC 3339.
    fn ts(&self, mono_ns: u64) -> String {
        rfc3339((i128::from(mono_ns) + self.facts.realtime_offset_ns).max(0) as u64)
    }
}

/// The client's end of the handshake a record belongs to, as the client
/// sent it: the conntrack entry's original source when the packet carried
/// one; else the SYN's source, the SYN-ACK's destination; the record's own
/// source for handshakes kdrop followed (unanswered, reset).
/// A SYN TCP's receive path freed without a reason (NOT_SPECIFIED at
/// tcp_v4_rcv / tcp_v6_rcv) and without a request socket it repeats (no
/// `duplicate_syn`): a TIME_WAIT socket of the same 4-tuple took it (the
/// client reused its port), answered it with an ACK and freed it
/// (tcp_timewait_state_process's TCP_TW_ACK, then discard_it, v6.18
/// https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_ipv4.c; seen as
/// `rx_sk` in TIME_WAIT). The client answers that ACK with a RST, which
/// ends the TIME_WAIT socket, and sends its SYN again at once
/// (tcp_rcv_synsent_state_process rearms its timer at TCP_TIMEOUT_MIN):
/// nothing failed. A handshake that does fail is reported by its own
/// records.
fn tcp_freed(r: &DropRecord) -> bool {
    let tcp_rcv = ["tcp_v4_rcv+", "tcp_v6_rcv+"]
        .iter()
        .any(|f| r.location.starts_with(f));
    r.kind == "drop"
        && tcp_rcv
        && r.reason.as_deref() == Some("NOT_SPECIFIED")
        && r.tcp_flags == "SYN"
        && r.finding
            .as_ref()
            .is_none_or(|f| f.cause != "duplicate_syn")
}

fn client_end(r: &DropRecord) -> Option<std::net::SocketAddr> {
    if let Some(ct) = &r.ct {
        if let Ok(src) = ct.orig.src.parse() {
            return Some(src);
        }
    }
    let (src, dst) = (
        std::net::SocketAddr::new(r.saddr, r.sport),
        std::net::SocketAddr::new(r.daddr, r.dport),
    );
    match (r.kind, r.tcp_flags.as_str()) {
        // A listener's refusals counted, no client known: no handshake.
        ("listen_overflow", _) => None,
        ("drop", f) if f.contains("SYN") && f.contains("ACK") => Some(dst),
        // The client's final ACK, refused by a full accept queue.
        ("drop", _) if r.reason.as_deref() == Some("TCP_LISTEN_OVERFLOW") => Some(src),
        ("drop", f) if f.contains("SYN") => Some(src),
        ("drop", _) => None,
        _ => Some(src),
    }
}

#[cfg(test)]
mod tests;
