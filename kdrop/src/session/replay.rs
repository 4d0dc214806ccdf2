//! `kdrop explain`: a recorded session's steps taken again, in order,
//! through the same enrichment, with the node answering from the bundle
//! and the clock the recording's. No BPF, no privileges.
use std::path::Path;

use anyhow::{Context as _, Result};

use super::{capture::Capture, Control, Sink};
use crate::{
    context::{
        replay::Replay,
        tape::{Line, StatsLine, Tape},
    },
    enrich::{Enricher, Facts, ListenWatch},
    event,
    model::{
        packet::{CtSeen, Event},
        stats::Stats,
    },
};

/// What the replay found besides the records.
#[derive(Debug, Default)]
pub struct Replayed {
    /// The accounting the recording ended with (None: it was cut short).
    pub stats: Option<StatsLine>,
    /// Why recording stopped early, if it did (the size cap).
    pub truncated: Option<String>,
    /// Ring records that did not decode here.
    pub undecodable: u64,
    /// Questions the bundle had no answer to.
    pub unanswered: u64,
    /// Packets written to the pcapng, when asked for one.
    pub pcap_written: Option<u64>,
    /// Drops that took a diagnosis kept from an earlier one (enrich::memo).
    pub memo_hits: u64,
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        anyhow::bail!("odd length");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .context("not hex")
        })
        .collect()
}

/// The facts the recording's enrichment had.
fn facts(tape: &Tape) -> Facts {
    let h = &tape.header;
    Facts {
        reasons: h.reasons.clone(),
        ct_names: h.ct_names.clone(),
        // The enricher names functions by static strings: the rungs of
        // those this kdrop knows.
        nf_rungs: crate::probes::nf::FUNCS
            .iter()
            .filter_map(|f| Some((f.name, h.nf_rungs.get(f.name)?.clone())))
            .collect(),
        realtime_offset_ns: h.realtime_offset_ns,
    }
}

/// Takes every step of the tape into `sink`, as the live session did;
/// with `pcap`, writes the packets the bundle holds (recorded with
/// `--pcap`) there.
pub fn replay(tape: &Tape, sink: &mut impl Sink, pcap: Option<&Path>) -> Result<Replayed> {
    let mut capture = match pcap {
        Some(p) => Some(Capture::create(p, tape.header.realtime_offset_ns)?),
        None => None,
    };
    let mut out = Replayed::default();
    steps(tape, sink, &mut capture, &mut out, true)?;
    if let Some(c) = capture {
        out.pcap_written = Some(c.written);
        let stats = out.stats.as_ref().map(Stats::from).unwrap_or_default();
        c.finish(&stats)?;
    }
    Ok(out)
}

fn steps(
    tape: &Tape,
    sink: &mut impl Sink,
    capture: &mut Option<Capture>,
    out: &mut Replayed,
    memo_on: bool,
) -> Result<()> {
    let mut enricher = Enricher::new(Replay::default(), facts(tape));
    enricher.memo_on = memo_on;
    let mut watch: Option<ListenWatch> = None;
    for line in &tape.lines {
        let records = match line {
            Line::Answer { .. } | Line::Blob { .. } => {
                enricher.node.apply(line);
                continue;
            }
            Line::Ring { hex, .. } => {
                let bytes = unhex(hex).context("a ring record in the bundle")?;
                match event::decode(&bytes) {
                    Ok(e) => {
                        if let (Event::Head(h), Some(c)) = (&e, capture.as_mut()) {
                            c.head(h);
                        }
                        let mut records = enricher.held_due_before(&e);
                        records.extend(enricher.on_event(&e));
                        records
                    }
                    Err(e) => {
                        log::debug!("{e}");
                        out.undecodable += 1;
                        Vec::new()
                    }
                }
            }
            Line::CtNew { now, late, seen } => {
                follow_new(&mut enricher, seen, *now, *late);
                continue;
            }
            Line::Watched { since } => {
                enricher.watching(*since);
                continue;
            }
            Line::CtDestroyed { destroyed, .. } => {
                enricher.on_destroyed(destroyed).into_iter().collect()
            }
            Line::Due { now } => enricher.due(now.unwrap_or(u64::MAX)),
            Line::Listen { now, netns, ports } => {
                let w = watch.get_or_insert_with(|| ListenWatch::new(*netns, ports));
                enricher.watch_listeners(w, *now).0
            }
            Line::Stats(s) => {
                out.stats = Some(s.clone());
                continue;
            }
            Line::Truncated { reason } => {
                out.truncated = Some(reason.clone());
                continue;
            }
        };
        for r in records {
            if let Some(c) = capture.as_mut() {
                c.record(&r)?;
            }
            if sink.record(r) == Control::Stop {
                out.unanswered = enricher.node.unanswered;
                out.memo_hits = enricher.memo_hits();
                return Ok(());
            }
        }
        sink.flush();
    }
    out.unanswered = enricher.node.unanswered;
    out.memo_hits = enricher.memo_hits();
    Ok(())
}

fn follow_new(enricher: &mut Enricher<Replay>, seen: &CtSeen, now: u64, late: u64) {
    // The ends the live session followed in the kernel: nothing to do
    // here, their packets are on the tape.
    let _ = enricher.on_new(seen, now, late);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{context::tape, model::record::DropRecord};

    #[derive(Default)]
    struct Kept(Vec<DropRecord>);

    impl Sink for Kept {
        fn record(&mut self, r: DropRecord) -> Control {
            self.0.push(r);
            Control::Continue
        }
    }

    /// A real drop, recorded on 6.18: netns rB with
    /// `iptables-legacy -A INPUT -p tcp --dport 7001 -j DROP`, five
    /// connects from 10.99.0.1 in netns rA (timeouts 0.3, 0.3, 1.5, 0.3,
    /// 0.3 s: 6 SYNs dropped, as the live run printed), `kdrop record
    /// --netns rB -p 7001 --pcap`. Re-recorded whenever kdrop asks the node
    /// a new question (replay counts unanswered ones).
    #[test]
    fn a_recorded_netfilter_rule_drop_is_explained_again() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/bundles/netfilter_rule.kdrop"
        );
        let tape = tape::read(std::path::Path::new(path)).unwrap();
        assert_eq!(tape.header.schema, 1);
        assert!(tape.cut.is_none());
        let mut kept = Kept::default();
        let pcap = std::env::temp_dir().join(format!("kdrop-replay-{}.pcapng", std::process::id()));
        let done = replay(&tape, &mut kept, Some(&pcap)).unwrap();
        let written = std::fs::metadata(&pcap).map(|m| m.len());
        let _ = std::fs::remove_file(&pcap);
        // Recorded with --pcap: every drop's packet is in the bundle.
        assert_eq!(done.pcap_written, Some(6));
        assert!(written.unwrap() > 6 * 40);
        assert_eq!((done.undecodable, done.unanswered), (0, 0));
        let stats = done.stats.unwrap();
        assert_eq!((stats.drops.matched, stats.missing()), (6, 0));
        assert_eq!(kept.0.len(), 6);
        for r in &kept.0 {
            assert_eq!(r.reason.as_deref(), Some("NETFILTER_DROP"));
            assert_eq!((r.saddr.to_string(), r.dport), ("10.99.0.1".into(), 7001));
            assert_eq!(r.ifname, "vb");
            let f = r.finding.as_ref().unwrap();
            assert_eq!(f.cause, "netfilter_rule");
            assert!(
                f.summary
                    .ends_with("-A INPUT -p tcp -m tcp --dport 7001 -j DROP"),
                "{}",
                f.summary
            );
            let nf = r.netfilter.as_ref().unwrap();
            assert!(
                nf.packets_before.is_some() && nf.packets_after > nf.packets_before,
                "{nf:?}"
            );
        }
    }

    /// A flood recorded on 6.18: netns kdx-n with
    /// `iptables-legacy -A INPUT -p tcp --syn --dport 8080 -m tcp --sport
    /// 1024:2023 -j DROP` then the same rule without `--sport`; 3 bursts of
    /// 1000 SYNs, 1 s apart, from 10.251.9.10-13 (raw socket in netns kdx-c),
    /// source ports cycling over 1024-3023; `kdrop record --netns kdx-n -p
    /// 8080`. The rule counters read 1571 and 1429 after it.
    fn flood() -> Tape {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/bundles/flood_two_rules.kdrop"
        );
        tape::read(std::path::Path::new(path)).unwrap()
    }

    fn records(tape: &Tape, memo_on: bool) -> (Vec<DropRecord>, Replayed) {
        let mut kept = Kept::default();
        let mut out = Replayed::default();
        steps(tape, &mut kept, &mut None, &mut out, memo_on).unwrap();
        (kept.0, out)
    }

    /// The diagnoses kept for a flood change no record: each is what a
    /// diagnosis from scratch finds, and each line what `json_line`
    /// writes. The rule is the one whose `--sport` range holds the packet's
    /// port (the source port is part of what is kept when a rule reads
    /// it), as the counters say: 1571 and 1429.
    #[test]
    fn a_flood_explained_from_kept_diagnoses_is_explained_alike() {
        let tape = flood();
        let (fresh, done) = records(&tape, false);
        let (kept, memo) = records(&tape, true);
        assert_eq!((done.unanswered, memo.unanswered), (0, 0));
        assert_eq!(done.memo_hits, 0);
        // A diagnosis per source, second and pair of counter snapshots.
        assert!(memo.memo_hits > 2_800, "{}", memo.memo_hits);
        assert_eq!(fresh.len(), 3000);
        let mut lines = crate::output::json::JsonLines::default();
        let mut by_rule = [0; 2];
        for (a, mut b) in fresh.into_iter().zip(kept) {
            let want = crate::output::json_line(&a) + "\n";
            let mut got = Vec::new();
            lines.write(&mut got, &mut b).unwrap();
            assert_eq!(String::from_utf8(got).unwrap(), want);
            let rule = b.netfilter.as_ref().and_then(|n| n.rule_number);
            let expected = if (1024..=2023).contains(&b.sport) {
                1
            } else {
                2
            };
            assert_eq!(rule, Some(expected), "sport {}", b.sport);
            by_rule[expected - 1] += 1;
        }
        assert_eq!(by_rule, [1571, 1429]);
    }

    #[test]
    fn hex_round_trip() {
        let b = vec![0u8, 1, 0xfe, 0x7f];
        assert_eq!(super::unhex(&super::super::recording::hex(&b)).unwrap(), b);
        assert!(super::unhex("abc").is_err());
        assert!(super::unhex("zz").is_err());
    }
}
