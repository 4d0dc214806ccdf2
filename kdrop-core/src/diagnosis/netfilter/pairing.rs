//! Netfilter verdict records kept for a moment and handed to the drop they
//! explain: same CPU, same namespace, same addresses and ports, recorded at
//! most `WINDOW_NS` before the free (`nf_hook_slow` frees the packet right
//! after the verdict, so the record is always ahead of its drop on the ring
//! buffer).
use std::collections::VecDeque;

use crate::model::packet::{Drop, NfVerdict};

/// How long before its drop a verdict may be (same softirq: microseconds).
pub const WINDOW_NS: u64 = 10_000_000;
/// Records kept waiting for their drop.
const KEPT: usize = 256;

/// Verdicts waiting for their drop.
#[derive(Default)]
pub struct VerdictLog {
    recent: VecDeque<NfVerdict>,
}

impl VerdictLog {
    pub fn push(&mut self, v: NfVerdict) {
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(v);
    }

    /// The verdicts for this drop, innermost first (the order they
    /// returned in), taken out of the log.
    pub fn take_for(&mut self, d: &Drop) -> Vec<NfVerdict> {
        let (mine, rest): (Vec<NfVerdict>, Vec<NfVerdict>) =
            self.recent.drain(..).partition(|v| belongs(v, d));
        // Records older than any drop they could still explain go.
        self.recent = rest
            .into_iter()
            .filter(|v| v.ts_ns.saturating_add(WINDOW_NS) >= d.ts_ns || v.ts_ns > d.ts_ns)
            .collect();
        mine
    }
}

fn belongs(v: &NfVerdict, d: &Drop) -> bool {
    v.cpu == d.cpu
        && v.netns == d.netns
        && v.ts_ns <= d.ts_ns
        && d.ts_ns - v.ts_ns <= WINDOW_NS
        && (v.saddr, v.sport, v.daddr, v.dport) == (d.saddr, d.sport, d.daddr, d.dport)
}

#[cfg(test)]
mod tests {
    use kdrop_common::TCP_SYN;

    use super::*;
    use crate::model::{
        netfilter::{Family, Hook},
        packet::NfFn,
    };

    fn verdict(func: NfFn) -> NfVerdict {
        NfVerdict {
            ts_ns: 1_000,
            cpu: 1,
            func,
            raw: 0,
            netns: 7,
            saddr: "10.0.0.1".parse().unwrap(),
            daddr: "10.0.0.2".parse().unwrap(),
            sport: 40000,
            dport: 80,
            hook: Some(Hook::Input),
            family: Some(Family::Ip),
            table: Some("kdt".into()),
            chain: None,
        }
    }

    fn drop_at(ts_ns: u64, cpu: u32, sport: u16) -> Drop {
        Drop {
            ts_ns,
            cpu,
            location: 0,
            reason: 0,
            netns: 7,
            ifindex: 2,
            mark: 0,
            saddr: "10.0.0.1".parse().unwrap(),
            daddr: "10.0.0.2".parse().unwrap(),
            sport,
            dport: 80,
            tcp_flags: TCP_SYN,
            isn: 0,
            fib: Vec::new(),
            ct: None,
            src_check: None,
            src_mac: None,
        }
    }

    #[test]
    fn pairs_with_its_own_drop_only() {
        let v = verdict(NfFn::NftDoChain);
        let mut log = VerdictLog::default();
        log.push(v.clone());
        // Another CPU, another port, before the verdict: not it.
        assert!(log.take_for(&drop_at(2_000, 0, 40000)).is_empty());
        assert!(log.take_for(&drop_at(2_000, 1, 40001)).is_empty());
        assert!(log.take_for(&drop_at(500, 1, 40000)).is_empty());
        let got = log.take_for(&drop_at(2_000, 1, 40000));
        assert_eq!(got, vec![v.clone()]);
        // Taken: a second drop of the same tuple does not reuse it.
        assert!(log.take_for(&drop_at(3_000, 1, 40000)).is_empty());
        // Too old for its drop, and then forgotten.
        log.push(v);
        assert!(log
            .take_for(&drop_at(1_000 + WINDOW_NS + 1, 1, 40000))
            .is_empty());
        assert!(log.recent.is_empty());
    }

    /// CLOCK_MONOTONIC stamps are large: the window is measured between
    /// verdict and drop, not from zero.
    #[test]
    fn pairs_at_realistic_timestamps() {
        let mut v = verdict(NfFn::IptDoTable);
        v.ts_ns = 5_000_000_000;
        let mut log = VerdictLog::default();
        log.push(v.clone());
        assert_eq!(
            log.take_for(&drop_at(5_000_012_000, 1, 40000)),
            vec![v.clone()]
        );
        // Exactly WINDOW_NS before its drop still belongs to it.
        log.push(v.clone());
        assert_eq!(
            log.take_for(&drop_at(5_000_000_000 + WINDOW_NS, 1, 40000)),
            vec![v]
        );
    }

    #[test]
    fn bounded() {
        let mut log = VerdictLog::default();
        let v = verdict(NfFn::ConntrackIn);
        for _ in 0..KEPT + 10 {
            log.push(v.clone());
        }
        assert_eq!(log.recent.len(), KEPT);
    }
}
