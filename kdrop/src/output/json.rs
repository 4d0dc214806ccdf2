//! JSON lines in a flood: most records carry the same finding and netfilter
//! attribution as the one before (one diagnosis kept for many drops,
//! `enrich::memo`), so their JSON is written once and reused. Each line is
//! still the whole record, byte for byte what `json_line` writes.
use serde::Serialize;

use super::json_line;
use crate::model::{finding::Finding, netfilter::Attribution, record::DropRecord};

/// Where the two fields sit in a record written without them: next to each
/// other in `DropRecord`'s field order. A key cannot occur inside a string
/// value, whose quotes are escaped.
const HOLE: &str = r#","finding":null,"netfilter":null"#;

#[derive(Debug, Default)]
pub struct JsonLines {
    finding: Option<(Finding, String)>,
    netfilter: Option<(Attribution, String)>,
}

impl JsonLines {
    /// `r` as one JSON object (without the newline). `r` is lent, not
    /// changed: its finding and attribution are set aside while the rest is
    /// written.
    pub fn line(&mut self, r: &mut DropRecord) -> String {
        let finding = r.finding.take();
        let netfilter = r.netfilter.take();
        let shell = serde_json::to_string(&*r).expect("records serialize");
        r.finding = finding;
        r.netfilter = netfilter;
        let Some(at) = shell.find(HOLE) else {
            // Not the shape this relies on (a field moved): the slow way.
            return json_line(r);
        };
        let f = fragment(&mut self.finding, r.finding.as_deref());
        let n = fragment(&mut self.netfilter, r.netfilter.as_ref());
        let mut line = String::with_capacity(shell.len() + f.len() + n.len() + 24);
        line.push_str(&shell[..at]);
        line.push_str(r#","finding":"#);
        line.push_str(f);
        line.push_str(r#","netfilter":"#);
        line.push_str(n);
        line.push_str(&shell[at + HOLE.len()..]);
        line
    }
}

/// `v`'s JSON: the one kept in `slot` if `v` is the value kept, else
/// written now and kept.
fn fragment<'a, T: Serialize + PartialEq + Clone>(
    slot: &'a mut Option<(T, String)>,
    v: Option<&T>,
) -> &'a str {
    let Some(v) = v else {
        return "null";
    };
    if slot.as_ref().is_none_or(|(kept, _)| kept != v) {
        let json = serde_json::to_string(v).expect("findings serialize");
        *slot = Some((v.clone(), json));
    }
    slot.as_ref().map_or("null", |(_, json)| json.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::record;

    /// Whatever the record holds, and whatever came before: the line
    /// `json_line` writes.
    #[test]
    fn same_bytes_as_json_line() {
        let mut lines = JsonLines::default();
        let mut a = record();
        a.finding = Some(std::sync::Arc::new(Finding {
            summary: "iptables-nft rule 1 in filter/INPUT dropped it".into(),
            evidence: vec!["rule counter went 0 -> 1".into()],
            fix_notes: vec!["lets TCP to 10.0.0.2:8080 through".into()],
            ..Default::default()
        }));
        a.netfilter = Some(attribution());
        let b = record();
        let mut c = a.clone();
        if let Some(f) = c.finding.as_mut() {
            std::sync::Arc::make_mut(f)
                .summary
                .push_str(" \"quoted\" \\ and ,\"finding\":null,\"netfilter\":null");
        }
        let mut d = c.clone();
        d.sport += 1;
        d.netfilter = None;
        for r in [
            &mut a.clone(),
            &mut b.clone(),
            &mut c,
            &mut d,
            &mut a,
            &mut b.clone(),
        ] {
            let want = json_line(r);
            assert_eq!(lines.line(r), want);
        }
        assert!(
            a.finding.is_some() && a.netfilter.is_some(),
            "given back whole"
        );
    }

    fn attribution() -> Attribution {
        serde_json::from_str(
            r#"{"dropped_by": "rule", "method": "rule counters (iptables-nft-save -c)",
            "hook": "INPUT", "family": "ip", "backend": "iptables-nft", "table": "filter",
            "chain": "INPUT", "rule": "-A INPUT -p tcp -m tcp --dport 8080 -j DROP",
            "rule_number": 1, "handle": null, "target": "DROP", "packets_before": 0,
            "packets_after": 1, "ctstate_invalid": false, "evidence": []}"#,
        )
        .expect("an attribution")
    }
}
