//! Events in, records out: each kernel event gets its names (reason,
//! namespace, interface, code location, time) and its finding. The node is
//! asked through [`Node`] (I/O, cached); the reasoning is `diagnosis`'s.
mod drop;
mod handshake;

use std::collections::HashMap;

use crate::{
    context::{ctevents::parse::IPS_SEEN_REPLY, NetnsName, Node},
    diagnosis::{
        handshake::{CtBits, Dead, Tracker},
        netfilter::pairing::VerdictLog,
    },
    kernel::facts::{CtNames, Reasons},
    model::{
        finding::Finding,
        packet::{Ct, Destroyed, Event, Tuple},
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

type FindingKey = (
    u64,
    u32,
    u32,
    u32,
    std::net::Ipv4Addr,
    std::net::Ipv4Addr,
    u32,
    Option<i32>,
);
const FINDINGS_CACHED: usize = 4096;

pub struct Enricher<N: Node> {
    pub node: N,
    pub facts: Facts,
    ct_bits: CtBits,
    tracker: Tracker,
    /// One routing diagnosis per distinct drop while the context stays the
    /// same: a flood of identical drops costs one.
    findings: HashMap<FindingKey, Option<Finding>>,
    /// Netfilter verdicts waiting for their drop.
    verdicts: VerdictLog,
}

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
            verdicts: VerdictLog::default(),
        }
    }

    /// The status bit that marks an answered entry (the uapi value when the
    /// kernel's BTF does not name it).
    pub fn seen_reply_bit(&self) -> u32 {
        match self.ct_bits.seen_reply {
            0 => IPS_SEEN_REPLY,
            b => b,
        }
    }

    /// The record for one event, if it makes one: a drop always does; a
    /// packet leaving a device does when it shows a handshake died
    /// unanswered; a netfilter verdict waits for its drop.
    pub fn on_event(&mut self, e: &Event) -> Option<DropRecord> {
        match e {
            Event::Drop(d) => Some(self.drop_record(d)),
            Event::Egress(p) => match self.tracker.on_egress(p, &self.ct_bits)? {
                Dead::Unanswered(flow) => Some(self.unanswered(&flow, None)),
                Dead::LoopedBack(pair) => Some(self.unanswered(&pair.0, Some(&pair.1))),
            },
            Event::Verdict(v) => {
                self.verdicts.push(v.clone());
                None
            }
        }
    }

    /// "reset" records: RSTs answering a SYN-ACK, held
    /// `handshake::RESET_GRACE_NS` in case the SYN-ACK's own drop (which
    /// says more) follows; with `all`, every one held, when tracing ends.
    pub fn due(&mut self, all: bool) -> Vec<DropRecord> {
        let now = if all { u64::MAX } else { monotonic_ns() };
        let resets = self.tracker.due_resets(now);
        resets.iter().map(|r| self.reset(r)).collect()
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
            f.evidence.push(line);
        }
        Some(r)
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
