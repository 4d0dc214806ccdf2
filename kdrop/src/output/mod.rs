//! Turning records into what people and programs read: one text line or
//! one JSON object per record (`text`), the summary at exit (`summary`),
//! the Prometheus exposition (`metrics`).
pub mod metrics;
pub mod summary;
pub mod text;

use std::io::Write;

use crate::model::record::DropRecord;

pub fn json_line(r: &DropRecord) -> String {
    serde_json::to_string(r).expect("records serialize")
}

/// Writes one record (text: the headline, then the finding indented);
/// `Err` only for a closed output (the caller stops quietly).
pub fn write_record(out: &mut impl Write, r: &DropRecord, json: bool) -> std::io::Result<()> {
    if json {
        return writeln!(out, "{}", json_line(r));
    }
    writeln!(out, "{}", text::text_line(r))?;
    if let Some(f) = &r.finding {
        for line in text::finding_lines(f) {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::time::rfc3339;

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
}
