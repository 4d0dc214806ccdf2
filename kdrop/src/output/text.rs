//! Text output: one headline per record, its finding indented below; in a
//! flood, a repeated finding is printed in full once.
use std::{
    collections::HashMap,
    io::Write,
    time::{Duration, Instant},
};

use super::write_record;
use crate::model::{finding::Finding, record::DropRecord};

/// `14:03:07.123456 netns=node if=eth1 198.51.100.7:40000 -> 10.0.2.20:8080 [SYN] reason=IP_RPFILTER at=ip_rcv_finish_core+0x1a3`
pub fn text_line(r: &DropRecord) -> String {
    let time = r.ts.get(11..26).unwrap_or(&r.ts);
    let netns = match &r.netns_name {
        Some(n) => n.clone(),
        None => r.netns.to_string(),
    };
    let what = match (r.kind, &r.reason) {
        ("drop", reason) => format!(
            "reason={} at={}",
            reason.as_deref().unwrap_or("unknown"),
            r.location
        ),
        (kind, _) => kind.to_string(),
    };
    format!(
        "{time} netns={netns} if={} {} -> {} [{}] {what}",
        r.ifname,
        r.src(),
        r.dst(),
        r.tcp_flags,
    )
}

/// Text output in a flood: a finding is printed in full once, then, while
/// the same finding repeats within `REPEAT_WINDOW`, its headlines carry one
/// line pointing back to it (JSON always carries the whole finding).
#[derive(Debug, Default)]
pub struct Repeats {
    printed: HashMap<(&'static str, String), Instant>,
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
        let now = Instant::now();
        let key = (f.cause, f.summary.clone());
        if let Some(at) = self.printed.get(&key) {
            if now.duration_since(*at) < REPEAT_WINDOW {
                writeln!(out, "{}", text_line(r))?;
                return writeln!(out, "  why: [{}] the same finding as above", f.cause);
            }
        }
        if self.printed.len() >= REPEATS_KEPT {
            self.printed
                .retain(|_, at| now.duration_since(*at) < REPEAT_WINDOW);
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
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::record;

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
    }

    #[test]
    fn a_repeated_finding_is_printed_in_full_once_in_text() {
        let mut r = record();
        r.finding = Some(Finding {
            cause: "rp_filter_strict",
            summary: "strict".into(),
            evidence: vec!["e".into()],
            fix: vec!["f".into()],
        });
        let mut other = r.clone();
        other.finding.as_mut().unwrap().summary = "other".into();
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
                "  why: [rp_filter_strict] the same finding as above",
                "  why: other [rp_filter_strict]",
                "  why: [rp_filter_strict] the same finding as above",
            ]
        );
        assert_eq!(text.matches("    fix: f").count(), 2);
        // JSON lines always carry the whole finding.
        let mut out = Vec::new();
        rep.write(&mut out, &r, true).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("\"evidence\":[\"e\"]"));
    }
}
