//! One verdict per handshake. A failed connection attempt leaves several
//! records (its SYN's drop, the SYN-ACK refused in the client, the RST, the
//! retransmissions counted, the conntrack entry that dies): they share a
//! handshake id, and the strongest cause any of them found is the
//! handshake's verdict. A record whose own cause is weaker carries the
//! verdict, with its own observation added as evidence: no second,
//! contradicting cause.
use std::{collections::HashMap, net::SocketAddr, sync::Arc};

use crate::model::finding::Finding;

/// Handshakes idle this long are forgotten (a later attempt from the same
/// client port is a new handshake).
const FORGET_AFTER_NS: u64 = 120_000_000_000;
/// At most this many handshakes are remembered, each with its verdict
/// (about 800 bytes): 65,536 cost a SYN flood from cycling source ports
/// 44 MB of RSS (tests/tests/torture.rs); 2,048 keep every handshake an
/// engineer can read folded, and a flood's repeats are one line anyway.
const MAX_HANDSHAKES: usize = 2_048;

#[derive(Clone, Debug)]
struct Handshake {
    id: u64,
    /// Shared with the records that carry it.
    verdict: Arc<Finding>,
    last_ns: u64,
    /// The client's ISN (0: unknown).
    isn: u32,
}

impl Handshake {
    /// Is a record of the client's connection with ISN `isn` at `now_ns`
    /// this handshake? Not when it is stale, nor when both ISNs are known and
    /// differ: the client reused its port for another connection.
    fn current(&self, isn: u32, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.last_ns) < FORGET_AFTER_NS
            && (isn == 0 || self.isn == 0 || isn == self.isn)
    }
}

/// Handshakes by their client's end (address and port as the client sent
/// them, before any NAT on the way) and its ISN, which NAT leaves alone.
/// A client end (one port) carries this many handshakes at once at most:
/// connections to several servers from one port (SO_REUSEADDR), or one
/// after another; the least recent goes first.
const PER_CLIENT: usize = 4;

#[derive(Debug, Default)]
pub struct Verdicts {
    by_client: HashMap<SocketAddr, Vec<Handshake>>,
    next_id: u64,
}

impl Verdicts {
    /// Files `found` (the cause a record found by itself) under the
    /// handshake of `client` with ISN `isn` (0: unknown) at `now_ns`;
    /// returns the handshake's id and the finding the record carries:
    /// `found` when it is the strongest yet, else the handshake's verdict
    /// with `found`'s summary added as evidence.
    pub fn fold(
        &mut self,
        client: SocketAddr,
        isn: u32,
        found: Arc<Finding>,
        now_ns: u64,
    ) -> (u64, Arc<Finding>) {
        if self.by_client.len() >= MAX_HANDSHAKES && !self.by_client.contains_key(&client) {
            let cutoff = now_ns.saturating_sub(FORGET_AFTER_NS);
            self.by_client
                .retain(|_, hs| hs.iter().any(|h| h.last_ns >= cutoff));
            if self.by_client.len() >= MAX_HANDSHAKES {
                self.by_client.clear();
            }
        }
        let Some(h) = self.current(client, isn, now_ns) else {
            return self.new_handshake(client, isn, found, now_ns);
        };
        h.last_ns = now_ns;
        if h.isn == 0 {
            h.isn = isn;
        }
        // The same cause again (a retransmission): the record keeps its own
        // evidence (the kernel's lookups for that packet), and it is the
        // newest word on the handshake.
        if found.cause == h.verdict.cause || found.cause.rank() > h.verdict.cause.rank() {
            h.verdict = found.clone();
            return (h.id, found);
        }
        // A weaker, different cause: the verdict stands, and says what this
        // packet showed by itself.
        let mut verdict = h.verdict.clone();
        Arc::make_mut(&mut verdict).evidence.push(format!(
            "this packet of the same handshake, by itself: {} [{}]",
            found.summary, found.cause
        ));
        (h.id, verdict)
    }

    /// The id and verdict of `client`'s handshake with ISN `isn`, if it has
    /// one that is still current: for a record that found nothing by itself.
    pub fn join(
        &mut self,
        client: SocketAddr,
        isn: u32,
        now_ns: u64,
    ) -> Option<(u64, Arc<Finding>)> {
        let h = self.current(client, isn, now_ns)?;
        h.last_ns = h.last_ns.max(now_ns);
        Some((h.id, h.verdict.clone()))
    }

    /// `client`'s current handshake that `isn` belongs to, the most recent
    /// when either ISN is unknown.
    fn current(&mut self, client: SocketAddr, isn: u32, now_ns: u64) -> Option<&mut Handshake> {
        self.by_client
            .get_mut(&client)?
            .iter_mut()
            .filter(|h| h.current(isn, now_ns))
            .max_by_key(|h| (isn != 0 && h.isn == isn, h.last_ns))
    }

    fn new_handshake(
        &mut self,
        client: SocketAddr,
        isn: u32,
        found: Arc<Finding>,
        now_ns: u64,
    ) -> (u64, Arc<Finding>) {
        self.next_id += 1;
        let id = self.next_id;
        let hs = self.by_client.entry(client).or_default();
        hs.retain(|h| now_ns.saturating_sub(h.last_ns) < FORGET_AFTER_NS);
        if hs.len() >= PER_CLIENT {
            if let Some(oldest) = (0..hs.len()).min_by_key(|&i| hs[i].last_ns) {
                hs.swap_remove(oldest);
            }
        }
        hs.push(Handshake {
            id,
            verdict: found.clone(),
            last_ns: now_ns,
            isn,
        });
        (id, found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cause::Cause;

    fn rank(cause: &str) -> u8 {
        Cause::from_id(cause).unwrap().rank()
    }

    fn finding(cause: &str, summary: &str) -> Arc<Finding> {
        Arc::new(Finding {
            cause: Cause::from_id(cause).unwrap(),
            summary: summary.into(),
            evidence: vec!["own".into()],
            ..Finding::default()
        })
    }

    #[test]
    fn a_weaker_cause_carries_the_verdict_and_adds_what_it_saw() {
        let mut v = Verdicts::default();
        let client: SocketAddr = "10.244.1.5:43534".parse().unwrap();
        let (id, f) = v.fold(client, 0, finding("hairpin_no_reverse_nat", "hairpin"), 1);
        assert_eq!((id, f.cause.id()), (1, "hairpin_no_reverse_nat"));
        // The same handshake's SYN, counted unanswered three times later:
        // not a second, contradicting cause.
        let (id2, f) = v.fold(
            client,
            0,
            finding("asymmetric_return_path", "asym"),
            3_000_000_000,
        );
        assert_eq!(id2, id);
        assert_eq!(f.cause, "hairpin_no_reverse_nat");
        assert_eq!(
            f.evidence.last().unwrap(),
            "this packet of the same handshake, by itself: asym [asymmetric_return_path]"
        );
        // A stronger cause upgrades the verdict.
        let other: SocketAddr = "10.244.1.5:43600".parse().unwrap();
        let (a, f) = v.fold(other, 0, finding("unanswered", "u"), 1);
        assert_eq!(f.cause, "unanswered");
        let (b, f) = v.fold(other, 0, finding("lb_loopback_without_snat", "lb"), 2);
        assert_eq!((a, f.cause.id()), (b, "lb_loopback_without_snat"));
        assert_ne!(a, id);
        // The same cause again keeps the record's own evidence.
        let mut again = finding("lb_loopback_without_snat", "lb");
        Arc::make_mut(&mut again).evidence = vec!["the kernel's own lookups".into()];
        let (_, f) = v.fold(other, 0, again, 3);
        assert_eq!(f.evidence, ["the kernel's own lookups"]);
    }

    #[test]
    fn a_record_without_a_finding_joins_its_handshake() {
        let mut v = Verdicts::default();
        let client: SocketAddr = "10.245.2.5:46702".parse().unwrap();
        assert_eq!(v.join(client, 0, 1), None, "no handshake yet");
        let (id, _) = v.fold(client, 0, finding("lb_loopback_without_snat", "lb"), 1);
        let (joined, f) = v.join(client, 0, 2).unwrap();
        assert_eq!((joined, f.cause.id()), (id, "lb_loopback_without_snat"));
        // Not a forgotten one.
        assert_eq!(v.join(client, 0, 2 + FORGET_AFTER_NS), None);
    }

    #[test]
    fn a_later_attempt_from_the_same_port_is_a_new_handshake() {
        let mut v = Verdicts::default();
        let client: SocketAddr = "192.0.2.1:40000".parse().unwrap();
        let (a, _) = v.fold(client, 0, finding("rp_filter_strict", "s"), 1);
        let (b, f) = v.fold(client, 0, finding("no_socket", "n"), 1 + FORGET_AFTER_NS);
        assert_ne!(a, b);
        assert_eq!(f.cause, "no_socket");
    }

    #[test]
    fn ranks() {
        assert!(rank("rp_filter_strict") > rank("asymmetric_return_path"));
        assert!(rank("asymmetric_return_path") > rank("syn_ack_reset"));
        assert!(rank("syn_ack_reset") > rank("unanswered"));
    }

    #[test]
    fn ranks_of_the_named_causes() {
        for (cause, r) in [
            ("unanswered", 0),
            ("no_reason", 0),
            ("duplicate_syn", 0),
            ("syn_ack_unanswered", 0),
            ("no_socket", 1),
            ("syn_ack_reset", 1),
            ("netfilter", 1),
            ("otherhost", 1),
            ("asymmetric_return_path", 2),
            ("hairpin_no_reverse_nat", 3),
            ("rp_filter_strict", 3),
        ] {
            assert_eq!(rank(cause), r, "{cause}");
        }
    }

    /// Another cause as strong as the verdict does not replace it; what
    /// it found is added, even in the verdict's own words.
    #[test]
    fn an_equally_strong_or_same_worded_cause_keeps_the_verdict() {
        let mut v = Verdicts::default();
        let client: SocketAddr = "10.244.1.5:43534".parse().unwrap();
        v.fold(client, 0, finding("hairpin_no_reverse_nat", "hairpin"), 1);
        // Each record carries the verdict with its own line added (the
        // verdict itself does not grow).
        for (found, line) in [
            (
                finding("rp_filter_strict", "strict"),
                "this packet of the same handshake, by itself: strict [rp_filter_strict]",
            ),
            (
                finding("unanswered", "hairpin"),
                "this packet of the same handshake, by itself: hairpin [unanswered]",
            ),
        ] {
            let (_, f) = v.fold(client, 0, found, 2);
            assert_eq!(f.cause, "hairpin_no_reverse_nat");
            assert_eq!(f.evidence, ["own", line]);
        }
    }

    fn client(i: usize) -> SocketAddr {
        (std::net::Ipv4Addr::from(0x0a80_0000 + i as u32), 40000).into()
    }

    /// Below the limit a handshake is only forgotten when its own next
    /// record comes too late: a record read late (from another CPU's
    /// buffer) still joins it after another client's newer one.
    #[test]
    fn below_the_limit_no_handshake_is_forgotten_for_another() {
        let mut v = Verdicts::default();
        let (id, _) = v.fold(client(0), 0, finding("no_socket", "n"), 1);
        v.fold(client(1), 0, finding("no_socket", "n"), 2 + FORGET_AFTER_NS);
        assert_eq!(v.join(client(0), 0, 2).map(|(i, _)| i), Some(id));
    }

    /// A full table forgets the idle handshakes first, and everything when
    /// none is idle.
    #[test]
    fn a_full_table_makes_room() {
        let mut v = Verdicts::default();
        for i in 0..MAX_HANDSHAKES - 1 {
            v.fold(client(i), 0, finding("no_socket", "n"), 1);
        }
        let recent = client(MAX_HANDSHAKES);
        let (id, _) = v.fold(recent, 0, finding("no_socket", "n"), FORGET_AFTER_NS + 5);
        v.fold(
            client(MAX_HANDSHAKES + 1),
            0,
            finding("no_socket", "n"),
            FORGET_AFTER_NS + 10,
        );
        assert_eq!(
            v.join(recent, 0, FORGET_AFTER_NS + 10).map(|(i, _)| i),
            Some(id)
        );
        assert_eq!(v.by_client.len(), 2);

        let mut v = Verdicts::default();
        for i in 0..MAX_HANDSHAKES {
            v.fold(client(i), 0, finding("no_socket", "n"), 1);
        }
        v.fold(client(MAX_HANDSHAKES), 0, finding("no_socket", "n"), 2);
        assert_eq!(v.join(client(0), 0, 2), None);
        assert_eq!(v.by_client.len(), 1);
    }

    #[test]
    fn a_reused_client_port_is_another_handshake() {
        let mut v = Verdicts::default();
        let client: SocketAddr = "10.0.0.2:40000".parse().unwrap();
        // A connection to port 81 dropped by a rule...
        let (a, _) = v.fold(client, 7, finding("netfilter", "port 81 rule"), 1);
        // ...then the same client port, another ISN: its records neither
        // join nor carry the port-81 verdict.
        assert_eq!(v.join(client, 9, 2), None);
        let (b, f) = v.fold(client, 9, finding("unanswered", "u"), 3);
        assert_ne!(a, b);
        assert_eq!(f.cause, "unanswered");
        assert_eq!(f.evidence, ["own"], "nothing of the other connection");
        // Both at once (one port, two servers): a late record of the first
        // is still the first's, with its verdict.
        let (c, f) = v.fold(client, 7, finding("unanswered", "gave up"), 4);
        assert_eq!((c, f.cause.id()), (a, "netfilter"));
        // Unknown ISNs (bundles from before) fold into the most recent.
        assert_eq!(v.join(client, 0, 5).map(|(i, _)| i), Some(a));
        // A client end keeps PER_CLIENT handshakes, the least recent goes.
        for isn in 10..10 + PER_CLIENT as u32 {
            v.fold(client, isn, finding("no_socket", "n"), 10 + u64::from(isn));
        }
        assert_eq!(v.join(client, 9, 100), None, "the least recent went");
        assert!(v.join(client, 10, 100).is_some());
    }
}
