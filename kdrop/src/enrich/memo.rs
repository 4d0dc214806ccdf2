//! A flood of drops that share a cause costs one diagnosis: the finding,
//! policy and pods of a SYN drop, kept for the inputs that decided them
//! (the namespace, device, reason and place, the addresses and service
//! port, the netfilter attribution) within the freshness the node's
//! context has anyway. Every other drop is diagnosed in full.
use std::{collections::HashMap, net::IpAddr, sync::Arc};

use kdrop_common::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

use crate::{
    diagnosis::netfilter::{self as nf, Dropped},
    model::{
        finding::Finding,
        netfilter::{Attribution, Snapshot},
        packet::Drop,
        pod::ConnPods,
        policy::PolicyDrop,
        record::DropRecord,
    },
};

/// How long a diagnosis stands for later drops with the same inputs: the
/// shortest freshness of the context it asked (context::live's
/// HOLDER_FRESH, 1 s). In the drops' own clock, so that a replay reuses
/// exactly what the live run reused.
const FRESH_NS: u64 = 1_000_000_000;
/// Diagnoses kept at most (then forgotten at once: a flood of distinct
/// drops costs what it cost without the memo, plus the hashing).
const KEPT: usize = 4096;

/// What a SYN drop's diagnosis reads of the drop itself, but for its
/// source port, time and ISN. A SYN's finding does not depend on its
/// source port: the repairs open the service (destination) for it, the
/// lookups ask routes by address; replies (SYN-ACK) and entries (a
/// conntrack tuple) do, and are never kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    period: u64,
    netns: u32,
    ifindex: u32,
    reason: u32,
    location: u64,
    mark: u32,
    saddr: IpAddr,
    daddr: IpAddr,
    dport: u16,
    src_check: Option<i32>,
    src_mac: Option<[u8; 6]>,
}

impl Key {
    /// The key of a drop whose diagnosis can be kept: a SYN (no ACK, RST
    /// or FIN), without a conntrack entry or route lookups of its own, not
    /// dropped by a program (whose evidence is its counters, read now).
    pub(super) fn of(d: &Drop, by_program: bool) -> Option<Self> {
        let syn = d.tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
        if !syn || by_program || d.ct.is_some() || !d.fib.is_empty() {
            return None;
        }
        Some(Self {
            period: d.ts_ns / FRESH_NS,
            netns: d.netns,
            ifindex: d.ifindex,
            reason: d.reason,
            location: d.location,
            mark: d.mark,
            saddr: d.saddr,
            daddr: d.daddr,
            dport: d.dport,
            src_check: d.src_check,
            src_mac: d.src_mac,
        })
    }
}

/// What a diagnosis adds to a record.
#[derive(Clone, Debug)]
struct Diagnosed {
    /// The attribution it was made with: another rule, policy or counter
    /// reading is another diagnosis.
    netfilter: Option<Arc<Attribution>>,
    finding: Option<Arc<Finding>>,
    network_policy: Option<PolicyDrop>,
    pods: ConnPods,
}

#[derive(Default)]
pub(super) struct Memo {
    kept: HashMap<Key, Diagnosed>,
    /// Drops that took a kept diagnosis (a test's and a profile's count).
    pub hits: u64,
}

impl Memo {
    /// Fills `r` from the diagnosis kept for `key`, if its attribution is
    /// the record's; whether it did.
    pub(super) fn fill(&mut self, key: &Key, r: &mut DropRecord) -> bool {
        let Some(d) = self.kept.get(key).filter(|d| d.netfilter == r.netfilter) else {
            return false;
        };
        r.finding.clone_from(&d.finding);
        r.network_policy.clone_from(&d.network_policy);
        r.pods.clone_from(&d.pods);
        self.hits += 1;
        true
    }

    /// Keeps the diagnosis `r` now holds for later drops with `key`.
    pub(super) fn keep(&mut self, key: Key, r: &DropRecord) {
        if self.kept.len() >= KEPT {
            self.kept.clear();
        }
        self.kept.insert(
            key,
            Diagnosed {
                netfilter: r.netfilter.clone(),
                finding: r.finding.clone(),
                network_policy: r.network_policy.clone(),
                pods: r.pods.clone(),
            },
        );
    }
}

/// One counter attribution per packet shape and pair of snapshots: the
/// drops of a flood that fall between the same two readings of the rule
/// counters are attributed alike, but for what the rules read of them.
#[derive(Default)]
pub(super) struct Attributions {
    kept: HashMap<AttrKey, Option<Arc<Attribution>>>,
    /// Whether the newest `after` snapshot has a rule that reads source
    /// ports (then they are part of the key).
    sport_read: Option<(Arc<Snapshot>, bool)>,
}

/// The snapshots by when they were read (CLOCK_MONOTONIC ns, start and
/// end: one namespace's readings never overlap, and two namespaces are
/// never read at once), not by reference: an entry must not keep a
/// ruleset alive (kube-proxy's run to megabytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct AttrKey {
    before: (u64, u64),
    after: (u64, u64),
    packet: Dropped,
}

impl Attributions {
    /// `nf::attribute_within` without a kernel scope, once per key.
    pub(super) fn attribute(
        &mut self,
        packet: Dropped,
        before: Option<Arc<Snapshot>>,
        after: Arc<Snapshot>,
    ) -> Option<Arc<Attribution>> {
        let sport_read = match &self.sport_read {
            Some((s, read)) if Arc::ptr_eq(s, &after) => *read,
            _ => {
                let read = nf::reads_source_port(&after);
                self.sport_read = Some((after.clone(), read));
                read
            }
        };
        let read = |s: &Snapshot| (s.started_ns, s.finished_ns);
        let key = AttrKey {
            before: before.as_deref().map_or((0, 0), read),
            after: read(&after),
            packet: Dropped {
                sport: if sport_read { packet.sport } else { 0 },
                ..packet
            },
        };
        if let Some(a) = self.kept.get(&key) {
            return a.clone();
        }
        let attribution =
            nf::attribute_within(&packet, before.as_deref(), &after, None).map(Arc::new);
        if self.kept.len() >= KEPT {
            self.kept.clear();
        }
        self.kept.insert(key, attribution.clone());
        attribution
    }
}
