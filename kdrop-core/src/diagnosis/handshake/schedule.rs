//! When a SYN's next retransmission is overdue (the client's schedule, and
//! what kdrop could see of it), and how kdrop knows a client gave up.

/// A SYN's first retransmission comes `TCP_TIMEOUT_INIT` (1 s) after it,
/// each next one after twice the gap before (`tcp_retransmit_timer`'s
/// backoff, include/net/tcp.h and net/ipv4/tcp_timer.c as of v6.18; since
/// v6.7 the first `tcp_syn_linear_timeouts` gaps stay 1 s, which only
/// brings them sooner).
pub(super) const FIRST_RTO_NS: u64 = 1_000_000_000;
/// How long past its due time a retransmission may be late (timer slack,
/// a slow guest) before kdrop takes it that the client gave up. Also how
/// late a conntrack NEW event may be read after its SYN.
pub(super) const LATE_NS: u64 = 500_000_000;
/// Retransmissions skipped at most (`tcp_syn_retries` is 6 by default).
const MAX_SKIPPED: u32 = 6;

/// How kdrop learned that a client gave up on its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GaveUp {
    /// Its socket left SYN-SENT for CLOSE with this `sk_err`.
    Socket(i32),
    /// No retransmission came this long after the last transmission,
    /// though one was due (a client elsewhere: no socket here to ask).
    Silent { waited_ns: u64 },
}

/// When the retransmission after `syns` transmissions (the last at
/// `last_ns`) is overdue. `watched_from`: since when the points that see
/// it leave a device are armed (None: unknown, taken as always). One due
/// before then may have passed unseen (kdrop armed them late: a slow
/// attach, a starved process), so the one after it is waited for instead:
/// silence kdrop did not watch is no proof that the client gave up.
pub fn overdue_at(last_ns: u64, syns: u32, watched_from: Option<u64>) -> u64 {
    let mut at = last_ns;
    let mut n = syns.max(1);
    loop {
        let next = at.saturating_add(FIRST_RTO_NS << (n - 1).min(6));
        // The SYN may have left up to LATE_NS before kdrop read its entry.
        let watched = watched_from.is_none_or(|w| next >= w.saturating_add(LATE_NS));
        if watched || n >= syns.max(1) + MAX_SKIPPED {
            return next.saturating_add(LATE_NS);
        }
        at = next;
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    #[test]
    fn the_gap_doubles_from_one_second_with_some_lateness() {
        assert_eq!(overdue_at(0, 1, None), 1_500 * MS);
        assert_eq!(overdue_at(S, 2, None), 3 * S + 500 * MS);
        assert_eq!(overdue_at(3 * S, 3, None), 7 * S + 500 * MS);
        // Watched from just after the first (an attach of 10 ms).
        assert_eq!(overdue_at(0, 1, Some(10 * MS)), 1_500 * MS);
        assert_eq!(overdue_at(S, 2, Some(10 * MS)), 3 * S + 500 * MS);
    }

    #[test]
    fn a_retransmission_due_before_kdrop_watched_is_not_waited_for() {
        // Armed 0.6 s after the entry was read: the retransmission due at
        // 1 s may have come before (the entry read late), so the next one,
        // 2 s later, is what a live client still sends.
        assert_eq!(overdue_at(0, 1, Some(600 * MS)), 3 * S + 500 * MS);
        // Armed 2.6 s late: the ones at 1 s and 3 s may both be gone.
        assert_eq!(overdue_at(0, 1, Some(2_600 * MS)), 7 * S + 500 * MS);
        // Bounded: an arming far past the client's whole schedule.
        assert_eq!(
            overdue_at(0, 1, Some(u64::MAX / 2)),
            (127 * S).saturating_add(500 * MS)
        );
    }
}
