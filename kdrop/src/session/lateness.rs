//! How long what the session reads may have waited unread. A ctnetlink NEW
//! event has no time of its own (netlink_recvmsg gives no timestamp), and
//! the tracker times a NAT'd handshake from it: read after the loop was
//! busy 1.2 s (a SYN-ACK's drop explained while dpkg unpacked beside it),
//! the SYN's first retransmission had gone by unwatched and the client
//! was called given up while it still sent (incident 5 in a fresh
//! machine's CI).

/// A `select!` that returned this long after it was entered waited: no
/// source had anything when it was entered. Shorter is "at once": the
/// reactor may just have learnt of what came while the loop was busy.
const WAITED_NS: u64 = 1_000_000;

/// When the loop last waited with nothing to read.
#[derive(Debug)]
pub(super) struct Lateness {
    quiet_from: u64,
}

impl Lateness {
    pub(super) fn new(now_ns: u64) -> Self {
        Self { quiet_from: now_ns }
    }

    /// The loop's `select!`, entered at `entered`, returned at `woke`: since
    /// when what it returned may have waited. Counted from the last wait
    /// before this one, so a wait that was the thread preempted with
    /// something pending still counts the work before it; when idle, the
    /// 100 ms tick bounds the excess. Whatever the turn does before it
    /// handles the event (the ring drained first) adds to the lateness.
    pub(super) fn since(&mut self, entered: u64, woke: u64) -> u64 {
        let since = self.quiet_from.min(woke);
        if woke.saturating_sub(entered) >= WAITED_NS {
            self.quiet_from = entered;
        }
        since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn busy_work_before_a_read_is_its_lateness() {
        let mut l = Lateness::new(0);
        // Idle: the tick's waits.
        assert_eq!(l.since(0, 100 * MS), 0);
        assert_eq!(l.since(100 * MS, 200 * MS), 0);
        // A drop woke it at 250 ms, explained until 1.45 s; the NEW event
        // that came meanwhile is there at once.
        assert_eq!(l.since(200 * MS, 250 * MS), 100 * MS);
        assert_eq!(l.since(1_450 * MS, 1_450 * MS + 20_000), 200 * MS);
        // Still counted from the last wait while it returns at once.
        assert_eq!(l.since(1_460 * MS, 1_460 * MS), 200 * MS);
        // Waiting again: only that wait and the one before count.
        assert_eq!(l.since(1_470 * MS, 1_570 * MS), 200 * MS);
        assert_eq!(l.since(1_570 * MS, 1_600 * MS), 1_470 * MS);
    }

    #[test]
    fn a_clock_seen_out_of_order_is_not_late() {
        let mut l = Lateness::new(5 * MS);
        assert_eq!(l.since(MS, 2 * MS), 2 * MS);
    }
}
