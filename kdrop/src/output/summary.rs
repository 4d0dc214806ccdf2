//! The summary at exit: events by reason, and the kernel's counters.
use std::collections::BTreeMap;

use crate::model::{record::DropRecord, stats::Stats};

/// Counts kept while tracing, printed at exit.
#[derive(Debug, Default)]
pub struct Summary {
    pub by_reason: BTreeMap<String, u64>,
    pub received: u64,
    pub undecodable: u64,
    /// Records by the Service they were sent to and their cause, as
    /// `kubectl` names the Service (`default/mysql:3306`).
    pub by_service: BTreeMap<(String, String), u64>,
}

impl Summary {
    pub fn add(&mut self, r: &DropRecord) {
        self.received += 1;
        let reason = match (&r.reason, r.kind) {
            (Some(reason), _) => reason.as_str(),
            (None, "drop") => "unknown",
            (None, kind) => kind,
        };
        // A known reason costs a lookup, not a String per record.
        match self.by_reason.get_mut(reason) {
            Some(n) => *n += 1,
            None => {
                self.by_reason.insert(reason.to_string(), 1);
            }
        }
        if let Some(svc) = &r.pods.service {
            let cause = r.finding.as_ref().map_or("unexplained", |f| f.cause.id());
            *self
                .by_service
                .entry((svc.clone(), cause.to_string()))
                .or_default() += 1;
        }
    }

    pub fn render(&self, stats: &Stats) -> String {
        let counters = &stats.drops;
        let secs = stats.elapsed.as_secs_f64();
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
        for ((svc, cause), n) in &self.by_service {
            s.push_str(&format!("kdrop: service {svc}: {cause} {n}\n"));
        }
        if stats.answered_by_tcp > 0 {
            s.push_str(&format!(
                "kdrop: {} SYN drops not reported: TCP freed them after answering them (a \
                 TIME_WAIT socket of the same tuple), in no failed handshake\n",
                stats.answered_by_tcp
            ));
        }
        if self.undecodable > 0 {
            s.push_str(&format!(
                "kdrop: {} undecodable records\n",
                self.undecodable
            ));
        }
        // The other sources' accounting, where they matched anything.
        let followed = [
            ("handshake packets followed", &stats.egress),
            ("netfilter drop verdicts followed", &stats.verdicts),
            ("SYN and SYN-ACK retransmissions", &stats.retrans),
        ];
        for (what, c) in followed {
            if c.matched > 0 {
                s.push_str(&format!(
                    "kdrop: {what}: matched {}, emitted {}, lost {}\n",
                    c.matched, c.emitted, c.lost
                ));
            }
        }
        let f = &stats.follow;
        if f.inserted > 0 || f.admitted > 0 || f.full > 0 {
            s.push_str(&format!(
                "kdrop: connections followed by their client's end: inserted {}, map full {}, packets admitted {}\n",
                f.inserted, f.full, f.admitted
            ));
        }
        if !stats.armed.is_empty() {
            let armed: Vec<String> = stats
                .armed
                .iter()
                .map(|(p, n, d)| {
                    format!(
                        "{p} {n} time{} for {:.1}s",
                        if *n == 1 { "" } else { "s" },
                        d.as_secs_f64()
                    )
                })
                .collect();
            s.push_str(&format!("kdrop: armed on demand: {}\n", armed.join(", ")));
        }
        if stats.ct_received > 0 || stats.ct_overruns > 0 {
            s.push_str(&format!(
                "kdrop: conntrack entries that died unreplied: received {}, socket overruns {}\n",
                stats.ct_received, stats.ct_overruns
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::record;

    fn stats(drops: kdrop_common::Counters, secs: u64) -> Stats {
        Stats {
            drops,
            elapsed: std::time::Duration::from_secs(secs),
            ..Stats::default()
        }
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
            s.render(&stats(c, 2)),
            "kdrop: 3 events in 2.0s (matched 3, emitted 3, lost 0)\n\
             kdrop:   NO_SOCKET    2\n\
             kdrop:   IP_RPFILTER  1\n"
        );
    }

    #[test]
    fn summary_names_services() {
        let mut s = Summary::default();
        let mut r = record();
        r.pods.service = Some("ns6/svc6:80".into());
        r.finding = Some(std::sync::Arc::new(crate::model::finding::Finding {
            cause: crate::model::cause::Cause::KubeNoEndpoints,
            ..Default::default()
        }));
        s.add(&r);
        s.add(&r);
        let text = s.render(&stats(kdrop_common::Counters::default(), 1));
        assert!(
            text.contains("kdrop: service ns6/svc6:80: kube_no_endpoints 2\n"),
            "{text}"
        );
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
        let first = Summary::default().render(&stats(c, 1));
        assert_eq!(
            first,
            "kdrop: 0 events in 1.0s (matched 250, emitted 2, lost 1, sampled out 247)\n"
        );
    }

    #[test]
    fn other_sources_are_accounted_when_they_matched() {
        let mut st = stats(kdrop_common::Counters::default(), 1);
        st.egress.matched = 4;
        st.egress.emitted = 3;
        st.egress.lost = 1;
        st.ct_received = 2;
        let text = Summary::default().render(&st);
        assert!(text.contains("kdrop: handshake packets followed: matched 4, emitted 3, lost 1\n"));
        assert!(!text.contains("netfilter drop verdicts"));
        assert!(
            text.contains("conntrack entries that died unreplied: received 2, socket overruns 0")
        );
    }
}
