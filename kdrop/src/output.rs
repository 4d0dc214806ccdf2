//! Turning events into what people and programs read: one text line or one
//! JSON object per event, and the summary at exit.
use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
    net::IpAddr,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::diagnosis::Finding;

/// A drop with everything userspace learned about it. Field names are the JSON
/// schema (README): add fields, never rename these.
#[derive(Clone, Debug, Serialize)]
pub struct DropRecord {
    pub ts: String,
    pub kind: &'static str,
    pub netns: u32,
    pub netns_name: Option<String>,
    pub ifname: String,
    pub ifindex: u32,
    pub family: &'static str,
    pub saddr: IpAddr,
    pub sport: u16,
    pub daddr: IpAddr,
    pub dport: u16,
    pub tcp_flags: String,
    /// Kernel name without `SKB_DROP_REASON_`; null when the kernel gives none.
    pub reason: Option<String>,
    /// `symbol+0xoff`, or the raw address when symbols are hidden.
    pub location: String,
    pub mark: u32,
    /// The kernel's IPv4 route lookups for this packet (fib:fib_table_lookup).
    pub route_lookups: Vec<LookupRecord>,
    /// The conntrack entry the packet carried.
    pub ct: Option<CtRecord>,
    pub finding: Option<Finding>,
    /// For NETFILTER_DROP: the rule, chain policy or conntrack drop.
    pub netfilter: Option<crate::netfilter::Attribution>,
}

/// A conntrack entry: both directions, as `conntrack -L` shows them.
#[derive(Clone, Debug, Serialize)]
pub struct CtRecord {
    pub orig: TupleRecord,
    pub reply: TupleRecord,
    /// `enum ip_conntrack_status` bit names, e.g. `["CONFIRMED", "DST_NAT"]`.
    pub status: Vec<String>,
    pub mark: u32,
    pub zone: u16,
}

#[derive(Clone, Debug, Serialize)]
pub struct TupleRecord {
    pub src: String,
    pub dst: String,
}

/// One route lookup the kernel did for the packet.
#[derive(Clone, Debug, Serialize)]
pub struct LookupRecord {
    pub table: u32,
    /// 0, or the negative errno of a failed lookup (-11: no match in this table).
    pub err: i32,
    pub src: std::net::Ipv4Addr,
    pub dst: std::net::Ipv4Addr,
    pub iif: u32,
    pub oif: u32,
    pub mark: u32,
    /// Result interface name, resolved in the packet's namespace.
    pub dev: Option<String>,
    pub gw: Option<std::net::Ipv4Addr>,
}

impl DropRecord {
    pub fn src(&self) -> String {
        endpoint(self.saddr, self.sport)
    }

    pub fn dst(&self) -> String {
        endpoint(self.daddr, self.dport)
    }
}

pub fn endpoint(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

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

pub fn json_line(r: &DropRecord) -> String {
    serde_json::to_string(r).expect("records serialize")
}

/// Writes one record (text: the headline, then the finding indented);
/// `Err` only for a closed output (the caller stops quietly).
pub fn write_record(out: &mut impl Write, r: &DropRecord, json: bool) -> std::io::Result<()> {
    if json {
        return writeln!(out, "{}", json_line(r));
    }
    writeln!(out, "{}", text_line(r))?;
    if let Some(f) = &r.finding {
        for line in finding_lines(f) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
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

/// Counts kept while tracing, printed at exit.
#[derive(Debug, Default)]
pub struct Summary {
    pub by_reason: BTreeMap<String, u64>,
    pub received: u64,
    pub undecodable: u64,
}

impl Summary {
    pub fn add(&mut self, r: &DropRecord) {
        self.received += 1;
        let reason = match (&r.reason, r.kind) {
            (Some(reason), _) => reason.clone(),
            (None, "drop") => "unknown".into(),
            (None, kind) => kind.to_string(),
        };
        *self.by_reason.entry(reason).or_default() += 1;
    }

    pub fn render(&self, counters: &kdrop_common::Counters, secs: f64) -> String {
        // `sampled out` only appears with --sample, so the common line stays
        // as it always was; scripts read the numbers in this order.
        let sampled = match counters.sampled_out {
            0 => String::new(),
            n => format!(", sampled out {n}"),
        };
        let mut s = format!(
            "kdrop: {} events in {secs:.1}s (matched {}, emitted {}, lost {}{sampled})\n",
            self.received, counters.matched, counters.emitted, counters.lost
        );
        let width = self.by_reason.keys().map(String::len).max().unwrap_or(0);
        let mut rows: Vec<_> = self.by_reason.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (reason, n) in rows {
            s.push_str(&format!("kdrop:   {reason:<width$}  {n}\n"));
        }
        if self.undecodable > 0 {
            s.push_str(&format!(
                "kdrop: {} undecodable records\n",
                self.undecodable
            ));
        }
        s
    }
}

/// RFC 3339 UTC with microseconds, from nanoseconds since the epoch.
pub fn rfc3339(epoch_ns: u64) -> String {
    let secs = epoch_ns / 1_000_000_000;
    let micros = (epoch_ns % 1_000_000_000) / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A finding as indented lines under its event's headline.
pub fn finding_lines(f: &Finding) -> Vec<String> {
    let mut lines = vec![format!("  why: {} [{}]", f.summary, f.cause)];
    lines.extend(f.evidence.iter().map(|e| format!("    evidence: {e}")));
    lines.extend(f.fix.iter().map(|c| format!("    fix: {c}")));
    lines
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn record() -> DropRecord {
        DropRecord {
            ts: rfc3339(1_795_240_987_123_456_789),
            kind: "drop",
            netns: 4026532999,
            netns_name: Some("node".into()),
            ifname: "eth1".into(),
            ifindex: 3,
            family: "ipv4",
            saddr: "198.51.100.7".parse().unwrap(),
            sport: 40000,
            daddr: "10.0.2.20".parse().unwrap(),
            dport: 8080,
            tcp_flags: "SYN".into(),
            reason: Some("IP_RPFILTER".into()),
            location: "ip_rcv_finish_core+0x1a3".into(),
            mark: 0,
            route_lookups: vec![],
            ct: None,
            finding: None,
            netfilter: None,
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(951_782_400_000_001_000),
            "2000-02-29T00:00:00.000001Z"
        );
        assert_eq!(
            rfc3339(1_795_240_987_123_456_789),
            "2026-11-21T06:03:07.123456Z"
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
    }

    #[test]
    fn json_schema() {
        let v: serde_json::Value = serde_json::from_str(&json_line(&record())).unwrap();
        assert_eq!(v["ts"], "2026-11-21T06:03:07.123456Z");
        assert_eq!(v["kind"], "drop");
        assert_eq!(v["netns"], 4026532999u64);
        assert_eq!(v["netns_name"], "node");
        assert_eq!(v["ifname"], "eth1");
        assert_eq!(v["ifindex"], 3);
        assert_eq!(v["family"], "ipv4");
        assert_eq!(v["saddr"], "198.51.100.7");
        assert_eq!(v["sport"], 40000);
        assert_eq!(v["daddr"], "10.0.2.20");
        assert_eq!(v["dport"], 8080);
        assert_eq!(v["tcp_flags"], "SYN");
        assert_eq!(v["reason"], "IP_RPFILTER");
        assert_eq!(v["location"], "ip_rcv_finish_core+0x1a3");
        let mut r = record();
        r.netns_name = None;
        r.reason = None;
        let v: serde_json::Value = serde_json::from_str(&json_line(&r)).unwrap();
        assert!(v["netns_name"].is_null());
        assert!(v["reason"].is_null());
    }

    #[test]
    fn summary_sorts_by_count() {
        let mut s = Summary::default();
        let mut r = record();
        s.add(&r);
        r.reason = Some("NO_SOCKET".into());
        s.add(&r);
        s.add(&r);
        let c = kdrop_common::Counters {
            matched: 3,
            emitted: 3,
            lost: 0,
            sampled_out: 0,
            capped: 0,
        };
        assert_eq!(
            s.render(&c, 2.0),
            "kdrop: 3 events in 2.0s (matched 3, emitted 3, lost 0)\n\
             kdrop:   NO_SOCKET    2\n\
             kdrop:   IP_RPFILTER  1\n"
        );
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

    #[test]
    fn summary_names_sampled_out_only_when_sampling() {
        let c = kdrop_common::Counters {
            matched: 250,
            emitted: 2,
            lost: 1,
            sampled_out: 247,
            capped: 0,
        };
        let first = Summary::default().render(&c, 1.0);
        assert_eq!(
            first,
            "kdrop: 0 events in 1.0s (matched 250, emitted 2, lost 1, sampled out 247)\n"
        );
    }
}
