//! The listen watch's poll from the session's tick (enrich::watch): its
//! records to the sink, its counts to the sink's metrics, the step taped.
use super::{recording::Line, Control, Session, Sink};
use crate::enrich::monotonic_ns;

impl Session {
    /// The first poll, before the readiness line: the counters' baseline,
    /// so that a refusal right after it is counted.
    pub(super) fn watch_baseline(&mut self) {
        let now = monotonic_ns();
        let (records, _) = self.enricher.watch_listeners(&mut self.watch, now);
        debug_assert!(records.is_empty(), "a first read has nothing to compare");
        let (netns, ports) = self.watch.config();
        self.taped(Line::Listen { now, netns, ports });
    }

    /// Polls the listen watch when due.
    pub(super) fn watch_listeners(&mut self, sink: &mut impl Sink) -> Control {
        let now = monotonic_ns();
        if !self.watch.due(now) {
            return Control::Continue;
        }
        let (records, refusals) = self.enricher.watch_listeners(&mut self.watch, now);
        let (netns, ports) = self.watch.config();
        self.taped(Line::Listen { now, netns, ports });
        for r in &refusals {
            sink.refused(r);
        }
        for r in records {
            if self.hand(r, sink) == Control::Stop {
                return Control::Stop;
            }
        }
        if self.tape_full() {
            return Control::Stop;
        }
        sink.flush()
    }
}
