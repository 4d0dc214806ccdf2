//! When to arm the on-demand points: a record that needs a kind of evidence
//! asks for it, and it stays armed until no record has asked for `QUIET`.
//! Pure: records and a clock in, decisions out.
use std::collections::BTreeMap;

use crate::{model::record::DropRecord, probes::Demand};

/// How long a demand stays armed after the last record that asked for it:
/// longer than the gap between a SYN's retransmissions up to the third
/// (1 s, 3 s, 7 s after the first, Linux defaults), so a handshake that
/// keeps failing keeps its evidence.
pub const QUIET_NS: u64 = 10_000_000_000;

/// Drop reasons route lookups explain (names from `enum skb_drop_reason`):
/// the reverse-path and martian checks, and forwarding failures.
pub const ROUTE_REASONS: [&str; 8] = [
    "IP_RPFILTER",
    "IP_LOCAL_SOURCE",
    "IP_INVALID_SOURCE",
    "IP_LOCALNET",
    "IP_INNOROUTES",
    "IP_OUTNOROUTES",
    "NEIGH_FAILED",
    // Before 6.13 martians are NOT_SPECIFIED (e.g. 6.1).
    "NOT_SPECIFIED",
];

/// What evidence the next packets of a record's connection would need.
pub fn demands(r: &DropRecord) -> Vec<Demand> {
    let mut out = Vec::new();
    match r.kind {
        "drop" => {
            let reason = r.reason.as_deref();
            let routing = match reason {
                Some(name) => ROUTE_REASONS.contains(&name),
                // No reason (before 5.17): where routing refuses packets
                // (see enrich's routing and forwarding findings).
                None => ["ip_rcv_finish_core", "ip_error+", "neigh_invalidate+"]
                    .iter()
                    .any(|f| r.location.starts_with(f)),
            };
            if routing {
                out.push(Demand::Routes);
            }
            let netfilter = reason == Some("NETFILTER_DROP")
                || (reason.is_none() && r.location.starts_with("nf_hook_slow"))
                || r.netfilter.is_some();
            if netfilter {
                out.push(Demand::Verdicts);
            }
            // A refused SYN-ACK: what answers it (a RST) and the next SYN
            // tell whose handshake it was.
            if r.tcp_flags == "SYN|ACK" {
                out.push(Demand::Handshakes);
            }
        }
        // A handshake kdrop follows died: keep following its retries.
        "unanswered" | "reset" => out.push(Demand::Handshakes),
        _ => {}
    }
    out
}

/// Which demands are armed, and when each was last asked for.
#[derive(Debug, Default)]
pub struct Arming {
    last: BTreeMap<Demand, u64>,
}

impl Arming {
    /// A record asked for `d` at `now_ns`: true when it must be armed now
    /// (it was not).
    pub fn want(&mut self, d: Demand, now_ns: u64) -> bool {
        self.last.insert(d, now_ns).is_none()
    }

    /// The armed demands nothing asked for in `QUIET_NS`: disarm them.
    pub fn quiet(&mut self, now_ns: u64) -> Vec<Demand> {
        let done: Vec<Demand> = self
            .last
            .iter()
            .filter(|(_, &at)| now_ns.saturating_sub(at) >= QUIET_NS)
            .map(|(d, _)| *d)
            .collect();
        for d in &done {
            self.last.remove(d);
        }
        done
    }

    /// Forgets `d` (its points could not be armed).
    pub fn forget(&mut self, d: Demand) {
        self.last.remove(&d);
    }

    pub fn is_armed(&self, d: Demand) -> bool {
        self.last.contains_key(&d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::record;

    #[test]
    fn records_ask_for_the_evidence_their_cause_needs() {
        let mut r = record();
        assert_eq!(demands(&r), [Demand::Routes]);
        r.reason = Some("NETFILTER_DROP".into());
        assert_eq!(demands(&r), [Demand::Verdicts]);
        r.reason = Some("NO_SOCKET".into());
        r.tcp_flags = "SYN|ACK".into();
        assert_eq!(demands(&r), [Demand::Handshakes]);
        r.tcp_flags = "SYN".into();
        assert!(demands(&r).is_empty(), "a refused SYN needs nothing more");
        // Kernels without reasons: the place says it.
        r.reason = None;
        r.location = "ip_rcv_finish_core+0x1a3".into();
        assert_eq!(demands(&r), [Demand::Routes]);
        r.location = "nf_hook_slow+0x93".into();
        assert_eq!(demands(&r), [Demand::Verdicts]);
        r.location = "tcp_v4_rcv+0x10".into();
        assert!(demands(&r).is_empty());
        r.kind = "unanswered";
        assert_eq!(demands(&r), [Demand::Handshakes]);
    }

    #[test]
    fn armed_until_quiet() {
        let mut a = Arming::default();
        assert!(a.want(Demand::Routes, 1_000));
        assert!(!a.want(Demand::Routes, 2_000), "armed once");
        assert!(a.quiet(2_000 + QUIET_NS - 1).is_empty());
        // Asked again: the quiet period starts over.
        a.want(Demand::Routes, 5_000_000_000);
        assert!(a.quiet(2_000 + QUIET_NS).is_empty());
        assert_eq!(a.quiet(5_000_000_000 + QUIET_NS), [Demand::Routes]);
        assert!(!a.is_armed(Demand::Routes));
        assert!(a.want(Demand::Routes, 60_000_000_000), "armed again");
    }
}
