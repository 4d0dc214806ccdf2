//! What the tools print when they stop, read back.
use std::collections::BTreeMap;

/// One of kdrop's accounts: `matched` and where each matched record went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    /// What it counts: `drops`, `handshake packets followed`, ...
    pub label: String,
    pub values: BTreeMap<String, u64>,
}

impl Account {
    pub fn get(&self, k: &str) -> u64 {
        self.values.get(k).copied().unwrap_or(0)
    }

    /// `matched == emitted + lost + sampled out + capped`, or what differs.
    pub fn check(&self) -> Result<(), String> {
        let out: u64 = ["emitted", "lost", "sampled out", "capped"]
            .iter()
            .map(|k| self.get(k))
            .sum();
        if self.get("matched") == out {
            return Ok(());
        }
        let parts: Vec<String> = self
            .values
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        Err(format!(
            "kdrop's {} account does not add up: matched != emitted + lost + sampled out + capped ({})",
            self.label,
            parts.join(", ")
        ))
    }
}

/// Every line of kdrop's exit summary that accounts for matched records:
/// `kdrop: 3 events in 1.0s (matched 3, emitted 3, lost 0)`, `kdrop:
/// monitor stopped after 1.0s (matched ..., capped 0)`, `kdrop: handshake
/// packets followed: matched ...`. The drop path's comes first.
pub fn accounts(lines: &[String]) -> Vec<Account> {
    lines
        .iter()
        .filter_map(|l| {
            let body = l.strip_prefix("kdrop: ")?;
            let (head, tail) = body.split_once("matched ")?;
            let head = head.trim_end_matches(['(', ':', ' ']);
            let label = if head.contains(" events in ") || head.starts_with("monitor stopped") {
                "drops".to_string()
            } else {
                head.to_string()
            };
            let mut values = BTreeMap::new();
            let tail = tail.split(')').next().unwrap_or(tail);
            for part in format!("matched {tail}").split(", ") {
                let (k, v) = part.trim().rsplit_once(' ')?;
                values.insert(k.to_string(), v.parse().ok()?);
            }
            if let Some(n) = head.split_whitespace().next().and_then(|n| n.parse().ok()) {
                if head.contains(" events in ") {
                    values.insert("events".to_string(), n);
                }
            }
            Some(Account { label, values })
        })
        .collect()
}

/// The monitor's metrics address from its readiness line.
pub fn metrics_url(ready: &str) -> Option<String> {
    let (_, rest) = ready.split_once("metrics on ")?;
    Some(rest.split([';', ' ', ')']).next()?.to_string())
}

/// The accounts on a monitor's metrics page other than the drop path's
/// (which its exit line gives): `kdrop_handshake_packets_total{state=..}`.
pub fn metric_accounts(page: &str) -> Vec<Account> {
    let mut values = BTreeMap::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("kdrop_handshake_packets_total{state=\"") else {
            continue;
        };
        let Some((state, v)) = rest.split_once("\"}") else {
            continue;
        };
        if let Ok(v) = v.trim().parse::<u64>() {
            values.insert(state.replace('_', " "), v);
        }
    }
    if values.is_empty() {
        return Vec::new();
    }
    vec![Account {
        label: "handshake packets followed (metrics)".into(),
        values,
    }]
}
/// bpftrace's `@[KEY]: count` lines, by key.
pub fn bpftrace_counts(lines: &[String]) -> Vec<(String, u64)> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("@["))
        .filter_map(|l| l.rsplit_once("]:"))
        .filter_map(|(k, n)| Some((k.to_string(), n.trim().parse::<u64>().ok()?)))
        .collect()
}

/// `enum skb_drop_reason` names by value, from a `bpftool btf dump` of
/// the running kernel's BTF (the numbers differ between kernels).
pub fn drop_reasons(btf_dump: &str) -> BTreeMap<String, String> {
    btf_dump
        .lines()
        .skip_while(|l| !l.contains("ENUM 'skb_drop_reason'"))
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .filter_map(|l| {
            let (name, val) = l.trim().split_once(" val=")?;
            let name = name.trim_matches('\'');
            let name = name.strip_prefix("SKB_DROP_REASON_").unwrap_or(name);
            Some((val.to_string(), name.to_string()))
        })
        .collect()
}

/// Sum of bpftrace's `@[reason]: count` lines.
pub fn bpftrace_total(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter(|l| l.starts_with("@["))
        .filter_map(|l| l.rsplit_once(':'))
        .filter_map(|(_, n)| n.trim().parse::<u64>().ok())
        .sum()
}

/// `614963 packets captured` -> 614963.
pub fn tcpdump_stat(lines: &[String], what: &str) -> Option<u64> {
    lines
        .iter()
        .find(|l| l.trim_end().ends_with(what))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Sum of dropwatch's `N drops at LOCATION` lines.
pub fn dropwatch_total(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter(|l| l.contains(" drops at "))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_accounts() {
        let a = accounts(&v(&[
            "kdrop: tracing x",
            "kdrop: 7 events in 2.1s (matched 9, emitted 7, lost 2)",
            "kdrop:   NO_SOCKET 7",
            "kdrop: handshake packets followed: matched 40, emitted 38, lost 1",
        ]));
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].label, "drops");
        assert_eq!(
            (a[0].get("events"), a[0].get("matched"), a[0].get("lost")),
            (7, 9, 2)
        );
        assert!(a[0].check().is_ok());
        assert_eq!(a[1].label, "handshake packets followed");
        assert!(a[1].check().unwrap_err().contains("matched 40"));
        let m = accounts(&v(&[
            "kdrop: monitor stopped after 1.0s (matched 5, emitted 1, lost 0, sampled out 1, capped 3)",
        ]));
        assert_eq!(m[0].label, "drops");
        assert_eq!(m[0].get("sampled out"), 1);
        assert!(m[0].check().is_ok());
        assert_eq!(
            metrics_url("kdrop: tracing a via b (monitor: metrics on http://127.0.0.1:33977/metrics; events: 1)"),
            Some("http://127.0.0.1:33977/metrics".into())
        );
        assert_eq!(metrics_url("kdrop: tracing a via b"), None);
        let page = "# TYPE x counter\nkdrop_handshake_packets_total{state=\"matched\"} 10\n\
                    kdrop_handshake_packets_total{state=\"emitted\"} 4\n\
                    kdrop_handshake_packets_total{state=\"capped\"} 6\n";
        let h = metric_accounts(page);
        assert_eq!(h[0].get("matched"), 10);
        assert!(h[0].check().is_ok());
        assert!(metric_accounts("").is_empty());
    }

    #[test]
    fn parses_reports() {
        assert_eq!(
            bpftrace_total(&v(&[
                "Attaching 2 probes...",
                "",
                "@[12]: 820288",
                "@[2]: 3"
            ])),
            820291
        );
        let td = v(&[
            "614963 packets captured",
            "616064 packets received by filter",
            "0 packets dropped by kernel",
        ]);
        assert_eq!(
            bpftrace_counts(&v(&[
                "@[104]: 9",
                "@[tracepoint:net:net_dev_queue]: 12",
                "x"
            ])),
            vec![
                ("104".to_string(), 9),
                ("tracepoint:net:net_dev_queue".to_string(), 12)
            ]
        );
        let dump =
            "[1] INT 'int' size=4\n[2] ENUM 'skb_drop_reason' encoding=UNSIGNED size=4 vlen=3\n\
                    \t'SKB_CONSUMED' val=1\n\t'SKB_DROP_REASON_NOT_SPECIFIED' val=2\n\
                    \t'SKB_DROP_REASON_QUEUE_PURGE' val=104\n[3] STRUCT 'x' size=4 vlen=0\n";
        let r = drop_reasons(dump);
        assert_eq!(r.len(), 3);
        assert_eq!(r["104"], "QUEUE_PURGE");
        assert_eq!(r["1"], "SKB_CONSUMED");
        assert_eq!(tcpdump_stat(&td, "packets captured"), Some(614963));
        assert_eq!(
            tcpdump_stat(&td, "packets received by filter"),
            Some(616064)
        );
        assert_eq!(
            dropwatch_total(&v(&["12 drops at ip_rcv+0x1a (0xffff)", "3 drops at x"])),
            15
        );
    }
}
