//! Text output: one headline per record, its finding indented below; in a
//! flood, a repeated finding is printed in full once.
use crate::model::cause::Cause;
use std::{collections::HashMap, io::Write, time::Duration};

use super::write_record;
use crate::model::{finding::Finding, pod::Pod, record::DropRecord, time::epoch_micros};

/// `14:03:07.123456 netns=node if=eth1 198.51.100.7:40000 -> 10.0.2.20:8080 [SYN] reason=IP_RPFILTER at=ip_rcv_finish_core+0x1a3`,
/// with ` pod=shop/cart-7d9f container=cart` after the namespace when it is
/// a pod's, and the connection's other pods and Service after the flags
/// (` client=... service=... backend=...`, each when known and not `pod`).
pub fn text_line(r: &DropRecord) -> String {
    let time = r.ts.get(11..26).unwrap_or(&r.ts);
    let mut netns = match &r.netns_name {
        Some(n) => n.clone(),
        None => r.netns.to_string(),
    };
    let add = |s: &mut String, key: &str, v: &Option<String>| {
        if let Some(v) = v {
            s.push_str(&format!(" {key}={v}"));
        }
    };
    let p = &r.pods;
    let label = |p: &Option<Pod>| p.as_ref().map(Pod::label);
    add(&mut netns, "pod", &label(&p.pod));
    add(
        &mut netns,
        "container",
        &p.pod.as_ref().and_then(|p| p.containers.clone()),
    );
    let other = |o: &Option<Pod>| label(o).filter(|_| o != &p.pod);
    let mut peers = String::new();
    add(&mut peers, "client", &other(&p.client));
    add(&mut peers, "service", &p.service);
    add(&mut peers, "backend", &other(&p.backend));
    // The listen watch's record: a listener, no client, no device.
    if r.kind == "listen_overflow" {
        return format!(
            "{time} netns={netns} listener {} [SYN refused]{peers} {}",
            r.dst(),
            r.kind
        );
    }
    let what = match (r.kind, &r.reason) {
        ("drop", reason) => format!(
            "reason={} at={}",
            reason.as_deref().unwrap_or("unknown"),
            r.location
        ),
        (kind, _) => kind.to_string(),
    };
    format!(
        "{time} netns={netns} if={} {} -> {} [{}]{peers} {what}",
        r.ifname,
        r.src(),
        r.dst(),
        r.tcp_flags,
    )
}

/// Text output in a flood: a finding is printed in full once, then, while
/// the same finding repeats within `REPEAT_WINDOW`, its headlines carry one
/// line pointing back to it (JSON always carries the whole finding). The
/// window is measured in the records' own times (`DropRecord::ts`), never
/// the wall clock: `kdrop explain` replays a run in milliseconds and must
/// fold exactly the lines the live run folded.
#[derive(Debug, Default)]
pub struct Repeats {
    /// Each finding printed in full: its record's time, µs since the epoch.
    printed: HashMap<(Cause, String), u64>,
    /// The verdict printed for each handshake.
    verdicts: HashMap<u64, (Cause, String)>,
}

const REPEAT_WINDOW: Duration = Duration::from_secs(10);
const REPEATS_KEPT: usize = 4096;

impl Repeats {
    /// Writes one record as `write_record` does, but a finding printed in
    /// full less than `REPEAT_WINDOW` ago as one line.
    pub fn write(
        &mut self,
        out: &mut impl Write,
        r: &DropRecord,
        json: bool,
    ) -> std::io::Result<()> {
        let Some(f) = r.finding.as_ref().filter(|_| !json) else {
            return write_record(out, r, json);
        };
        let key = (f.cause, f.summary.clone());
        // A further packet of a handshake whose verdict was printed: one line.
        if let Some(id) = r.handshake {
            if self.verdicts.get(&id) == Some(&key) {
                return writeln!(
                    out,
                    "{}  (handshake #{id}: [{}] above)",
                    text_line(r),
                    f.cause
                );
            }
            if self.verdicts.len() >= REPEATS_KEPT {
                self.verdicts.clear();
            }
            self.verdicts.insert(id, key.clone());
        }
        // A record whose time cannot be read (none kdrop makes) is printed
        // in full and starts no window.
        let Some(now) = epoch_micros(&r.ts) else {
            return write_record(out, r, json);
        };
        // Records arrive slightly out of time order (rings of different
        // CPUs, held drops released later): one older than the print it
        // repeats is within the window.
        let within = |at: u64| Duration::from_micros(now.saturating_sub(at)) < REPEAT_WINDOW;
        if self.printed.get(&key).is_some_and(|at| within(*at)) {
            return writeln!(
                out,
                "{}  (the same finding: [{}] above)",
                text_line(r),
                f.cause
            );
        }
        if self.printed.len() >= REPEATS_KEPT {
            self.printed.retain(|_, at| within(*at));
        }
        self.printed.insert(key, now);
        write_record(out, r, json)
    }
}

/// A finding as indented lines under its event's headline.
pub fn finding_lines(f: &Finding) -> Vec<String> {
    let mut lines = vec![format!("  why: {} [{}]", f.summary, f.cause)];
    lines.extend(f.evidence.iter().map(|e| format!("    evidence: {e}")));
    lines.extend(f.fix.iter().map(|c| format!("    fix: {c}")));
    for alt in &f.fix_or {
        for (i, c) in alt.iter().enumerate() {
            let lead = if i == 0 { "or:" } else { "   " };
            lines.push(format!("    {lead} {c}"));
        }
    }
    lines.extend(f.fix_notes.iter().map(|n| format!("    note: {n}")));
    lines.extend(f.inspect.iter().map(|c| format!("    inspect: {c}")));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::{pod::PodId, time::rfc3339},
        output::tests::record,
    };

    /// `record()`'s time plus `ms` milliseconds, as records carry it.
    fn ms_after(ms: u64) -> String {
        rfc3339(1_795_240_987_123_456_789 + ms * 1_000_000)
    }

    /// For records of one finding at these times (ms after `record()`'s),
    /// written in this order: whether each was folded into one line.
    fn folded(times: &[u64]) -> Vec<bool> {
        let mut r = record();
        r.finding = Some(std::sync::Arc::new(Finding {
            cause: Cause::RpFilterStrict,
            summary: "strict".into(),
            ..Finding::default()
        }));
        let mut rep = Repeats::default();
        times
            .iter()
            .map(|ms| {
                r.ts = ms_after(*ms);
                let mut out = Vec::new();
                rep.write(&mut out, &r, false).unwrap();
                let text = String::from_utf8(out).unwrap();
                let one = text.ends_with("  (the same finding: [rp_filter_strict] above)\n");
                assert_eq!(text.lines().count(), if one { 1 } else { 2 }, "{text}");
                one
            })
            .collect()
    }

    #[test]
    fn a_repeat_within_10_s_of_the_print_in_record_time_is_folded() {
        // Written at once, as a replay does: only the records' times count.
        assert_eq!(folded(&[0, 1, 5_000, 9_999]), [false, true, true, true]);
    }

    #[test]
    fn a_repeat_10_s_or_more_after_the_print_is_printed_in_full_again() {
        // The window runs from the last full print, not from each repeat.
        assert_eq!(
            folded(&[0, 6_000, 10_000, 19_999, 20_000, 45_000]),
            [false, true, false, true, false, false]
        );
    }

    #[test]
    fn a_record_whose_time_cannot_be_read_is_printed_in_full() {
        let mut r = record();
        r.ts = "yesterday".into();
        r.finding = Some(std::sync::Arc::new(Finding {
            cause: Cause::RpFilterStrict,
            summary: "strict".into(),
            ..Finding::default()
        }));
        let mut rep = Repeats::default();
        let mut out = Vec::new();
        for _ in 0..2 {
            rep.write(&mut out, &r, false).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("  why: strict").count(), 2, "{text}");
    }

    #[test]
    fn a_repeat_older_than_its_print_is_within_the_window() {
        // Another CPU's ring, or a drop held for its handshake's verdict:
        // earlier than the print, however much, folds (no underflow).
        assert_eq!(
            folded(&[60_000, 59_000, 0, 69_999, 70_000]),
            [false, true, true, true, false]
        );
    }

    #[test]
    fn a_listener_refusing_has_no_client_in_its_headline() {
        let mut r = record();
        r.kind = "listen_overflow";
        r.ifname = String::new();
        assert_eq!(
            text_line(&r),
            "06:03:07.123456 netns=node listener 10.0.2.20:8080 [SYN refused] listen_overflow"
        );
    }

    #[test]
    fn text() {
        assert_eq!(
            text_line(&record()),
            "06:03:07.123456 netns=node if=eth1 198.51.100.7:40000 -> 10.0.2.20:8080 [SYN] reason=IP_RPFILTER at=ip_rcv_finish_core+0x1a3"
        );
        let mut r = record();
        r.netns_name = None;
        r.reason = None;
        r.saddr = "2001:db8::7".parse().unwrap();
        assert!(text_line(&r).contains("netns=4026532999 if=eth1 [2001:db8::7]:40000"));
        assert!(text_line(&r).contains("reason=unknown"));
        let pod = |namespace: &str, name: &str, containers: Option<&str>| Pod {
            id: PodId::Named {
                namespace: namespace.into(),
                name: name.into(),
            },
            containers: containers.map(String::from),
            labels: None,
        };
        r.pods.pod = Some(pod("shop", "cart-7d9f", Some("cart")));
        assert!(
            text_line(&r).contains(" netns=4026532999 pod=shop/cart-7d9f container=cart if=eth1 "),
            "{}",
            text_line(&r)
        );
        // The other end is named; the pod itself is not repeated.
        r.pods.client = r.pods.pod.clone();
        r.pods.service = Some("data/mysql:3306".into());
        r.pods.backend = Some(pod("data", "mysql-0", None));
        assert!(
            text_line(&r)
                .contains("[SYN] service=data/mysql:3306 backend=data/mysql-0 reason=unknown"),
            "{}",
            text_line(&r)
        );
    }

    /// A repair command (loose rp_filter on `dev`), as findings make them.
    fn rp(dev: &str) -> crate::model::finding::Fix {
        crate::diagnosis::fix_kinds::Kind::RpFilterLoose
            .fix(format!("sysctl -w net.ipv4.conf.{dev}.rp_filter=2"))
    }

    #[test]
    fn fixes_alternatives_notes_and_inspections_have_their_own_lines() {
        let f = Finding {
            cause: Cause::NoReason,
            summary: "s".into(),
            evidence: vec![],
            fix: vec![rp("a"), rp("b")],
            fix_or: vec![vec![rp("x"), rp("y")]],
            fix_notes: vec!["n".into()],
            inspect: vec!["i".into()],
        };
        assert_eq!(
            finding_lines(&f),
            [
                "  why: s [no_reason]",
                "    fix: sysctl -w net.ipv4.conf.a.rp_filter=2",
                "    fix: sysctl -w net.ipv4.conf.b.rp_filter=2",
                "    or: sysctl -w net.ipv4.conf.x.rp_filter=2",
                "        sysctl -w net.ipv4.conf.y.rp_filter=2",
                "    note: n",
                "    inspect: i",
            ]
        );
    }

    #[test]
    fn a_handshake_verdict_is_printed_once_then_a_line_per_packet() {
        let mut r = record();
        r.handshake = Some(7);
        r.finding = Some(std::sync::Arc::new(Finding {
            cause: Cause::HairpinNoReverseNat,
            summary: "hairpin".into(),
            ..Finding::default()
        }));
        let mut rep = Repeats::default();
        let mut out = Vec::new();
        rep.write(&mut out, &r, false).unwrap();
        // The verdict stands for the whole handshake, however long after.
        let mut later = r.clone();
        later.kind = "unanswered";
        later.ts = ms_after(30_000);
        rep.write(&mut out, &later, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        let why: Vec<_> = text.lines().filter(|l| l.starts_with("  why")).collect();
        assert_eq!(why, ["  why: hairpin [hairpin_no_reverse_nat]"]);
        // The further packet is one line.
        let last = text.lines().last().unwrap();
        assert!(
            last.ends_with(" unanswered  (handshake #7: [hairpin_no_reverse_nat] above)"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3, "{text}");
    }

    #[test]
    fn a_repeated_finding_is_printed_in_full_once_in_text() {
        let mut r = record();
        r.finding = Some(std::sync::Arc::new(Finding {
            cause: Cause::RpFilterStrict,
            summary: "strict".into(),
            evidence: vec!["e".into()],
            fix: vec![rp("f")],
            ..Finding::default()
        }));
        let mut other = r.clone();
        std::sync::Arc::make_mut(other.finding.as_mut().unwrap()).summary = "other".into();
        let mut rep = Repeats::default();
        let mut out = Vec::new();
        for r in [&r, &r, &other, &r] {
            rep.write(&mut out, r, false).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let why: Vec<_> = text.lines().filter(|l| l.starts_with("  why")).collect();
        assert_eq!(
            why,
            [
                "  why: strict [rp_filter_strict]",
                "  why: other [rp_filter_strict]",
            ]
        );
        // The repeats: one line each.
        assert_eq!(
            text.lines()
                .filter(|l| l.ends_with("  (the same finding: [rp_filter_strict] above)"))
                .count(),
            2,
            "{text}"
        );
        assert_eq!(
            text.matches("    fix: sysctl -w net.ipv4.conf.f.rp_filter=2")
                .count(),
            2
        );
        // JSON lines always carry the whole finding.
        let mut out = Vec::new();
        rep.write(&mut out, &r, true).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("\"evidence\":[\"e\"]"));
    }
}
