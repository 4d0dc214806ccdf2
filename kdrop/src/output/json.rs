//! JSON lines in a flood: most records carry the same finding and netfilter
//! attribution as the one before (one diagnosis kept for many drops,
//! `enrich::memo`), so their JSON is written once and reused. Each line is
//! still the whole record, byte for byte what `json_line` writes.
use std::{
    io::{self, Write},
    sync::Arc,
};

use serde::Serialize;

use super::json_line;
use crate::model::{finding::Finding, netfilter::Attribution, record::DropRecord};

/// Where the two fields sit in a record written without them: next to each
/// other in `DropRecord`'s field order. A key cannot occur inside a string
/// value, whose quotes are escaped.
const HOLE: &str = r#","finding":null,"netfilter":null"#;

#[derive(Debug, Default)]
pub struct JsonLines {
    finding: Option<(Arc<Finding>, String)>,
    netfilter: Option<(Arc<Attribution>, String)>,
    /// The record written without the two, kept for the next: no
    /// allocation, and no growing, per line.
    shell: Vec<u8>,
}

impl JsonLines {
    /// Writes `r` as one JSON line. `r` is lent, not changed: its finding
    /// and attribution are set aside while the rest is written.
    pub fn write(&mut self, out: &mut impl Write, r: &mut DropRecord) -> io::Result<()> {
        let finding = r.finding.take();
        let netfilter = r.netfilter.take();
        self.shell.clear();
        serde_json::to_writer(&mut self.shell, &*r).expect("records serialize");
        r.finding = finding;
        r.netfilter = netfilter;
        let shell = &self.shell[..];
        // Near the end: only the policy and the handshake id follow (a
        // search from the end, without `str::rfind`'s setup per line).
        let hole = HOLE.as_bytes();
        let Some(at) = shell.windows(hole.len()).rposition(|w| w == hole) else {
            // Not the shape this relies on (a field moved): the slow way.
            return writeln!(out, "{}", json_line(r));
        };
        let f = match &r.finding {
            None => "null",
            Some(f) => kept(&mut self.finding, f, |k| Arc::ptr_eq(k, f) || k == f),
        };
        let n = match &r.netfilter {
            None => "null",
            Some(n) => kept(&mut self.netfilter, n, |k| Arc::ptr_eq(k, n) || k == n),
        };
        for part in [
            &shell[..at],
            br#","finding":"#,
            f.as_bytes(),
            br#","netfilter":"#,
            n.as_bytes(),
            &shell[at + hole.len()..],
            b"\n",
        ] {
            out.write_all(part)?;
        }
        Ok(())
    }
}

/// `v`'s JSON: the one kept in `slot` if `same` says it is of the value
/// kept, else written now and kept.
fn kept<'a, T: Serialize + Clone>(
    slot: &'a mut Option<(T, String)>,
    v: &T,
    same: impl Fn(&T) -> bool,
) -> &'a str {
    if !slot.as_ref().is_some_and(|(k, _)| same(k)) {
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
        a.netfilter = Some(Arc::new(attribution()));
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
            let want = json_line(r) + "\n";
            let mut got = Vec::new();
            lines.write(&mut got, r).unwrap();
            assert_eq!(String::from_utf8(got).unwrap(), want);
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
