//! The Prometheus text exposition (format 0.0.4) of what monitor mode
//! counts. Pure: a snapshot in, text out.
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

/// Label value every label of a series takes when the series cap (or the
/// kernel's bounded map) has no room for its own labels.
pub const OVERFLOW: &str = "overflow";

/// Labels of `kdrop_drops_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DropLabels {
    pub reason: String,
    pub netns: String,
    pub pod: String,
    /// The pod's containers by name (empty when no pod).
    pub container: String,
    pub ifname: String,
    pub port: String,
}

impl DropLabels {
    pub fn overflow() -> Self {
        let o = || OVERFLOW.to_string();
        Self {
            reason: o(),
            netns: o(),
            pod: o(),
            container: o(),
            ifname: o(),
            port: o(),
        }
    }
}

/// Gives label sets their own series, up to `max` of them (the overflow
/// series included); once given, a series keeps it, so every series stays
/// a monotonic counter. Later label sets count into the overflow series.
#[derive(Debug)]
pub struct SeriesCap {
    max: usize,
    admitted: HashMap<DropLabels, ()>,
}

impl SeriesCap {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            admitted: HashMap::new(),
        }
    }

    /// The labels this set is counted under.
    pub fn place(&mut self, labels: DropLabels) -> DropLabels {
        if self.admitted.contains_key(&labels) {
            return labels;
        }
        // One slot is kept for the overflow series itself.
        if labels.reason != OVERFLOW && self.admitted.len() + 1 < self.max {
            self.admitted.insert(labels.clone(), ());
            return labels;
        }
        DropLabels::overflow()
    }
}

/// Labels of `kdrop_listen_overflows_total` and
/// `kdrop_listen_syncookies_total`: the listener's namespace, its pod, and
/// its port (empty when kdrop could not tell which listener refused).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenLabels {
    pub netns: String,
    pub pod: String,
    pub port: String,
}

/// Labels of `kdrop_network_policy_denials_total`: the pod whose network
/// policy denied the connection (`namespace/name`, empty when its address
/// is no pod's), the direction of that pod's traffic, the server's port,
/// the verdict and the policy whose rule denied it (empty when no policy
/// allowed it). No peer label: the refused clients are unbounded.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyLabels {
    pub pod: String,
    pub direction: String,
    pub port: String,
    pub verdict: String,
    pub policy: String,
}

impl PolicyLabels {
    pub fn overflow() -> Self {
        let o = || OVERFLOW.to_string();
        Self {
            pod: o(),
            direction: o(),
            port: o(),
            verdict: o(),
            policy: o(),
        }
    }
}

/// SYNs a listener refused (its accept queue or SYN queue full) and SYNs
/// answered with cookies, from its namespace's TcpExt counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenCounts {
    pub accept: u64,
    pub syn: u64,
    pub cookies: u64,
}

/// Counters of the drop path, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub matched: u64,
    pub emitted: u64,
    pub lost: u64,
    pub sampled_out: u64,
    pub capped: u64,
}

/// Handshake packets leaving devices (followed for unanswered handshakes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressCounts {
    pub matched: u64,
    pub emitted: u64,
    pub lost: u64,
    pub capped: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeState {
    pub point: String,
    pub rung: String,
    pub attached: bool,
}

/// Connections followed across NAT and namespaces (the FOLLOW map).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowCounts {
    pub inserted: u64,
    pub map_full: u64,
    pub admitted: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub drops: BTreeMap<DropLabels, u64>,
    pub findings: BTreeMap<String, u64>,
    pub listen: BTreeMap<ListenLabels, ListenCounts>,
    /// Network policy denials among the findings, by protected pod.
    pub policy: BTreeMap<PolicyLabels, u64>,
    pub events: EventCounts,
    pub egress: EgressCounts,
    /// SYN and SYN-ACK retransmissions of local sockets.
    pub retrans: EgressCounts,
    /// Netfilter drop verdicts (on-demand probes).
    pub verdicts: EgressCounts,
    pub follow: FollowCounts,
    pub probes: Vec<ProbeState>,
}

/// A label value with `\`, `"` and newlines escaped, as the format requires.
pub fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    header(
        &mut out,
        "kdrop_drops_total",
        "counter",
        "Dropped TCP packets that matched kdrop's filter, counted in the kernel (every one, \
         sampled or not), by drop reason, network namespace, pod, container, interface and service port.",
    );
    for (l, v) in &s.drops {
        sample(
            &mut out,
            "kdrop_drops_total",
            &[
                ("reason", &l.reason),
                ("netns", &l.netns),
                ("pod", &l.pod),
                ("container", &l.container),
                ("ifname", &l.ifname),
                ("port", &l.port),
            ],
            *v,
        );
    }
    header(
        &mut out,
        "kdrop_findings_total",
        "counter",
        "Diagnosed causes of the sampled drops and unanswered handshakes (detailed events only).",
    );
    for (cause, v) in &s.findings {
        sample(&mut out, "kdrop_findings_total", &[("cause", cause)], *v);
    }
    header(
        &mut out,
        "kdrop_network_policy_denials_total",
        "counter",
        "Sampled drops diagnosed as network_policy_denied, by the pod whose policy denied them \
         (namespace/name), the direction of that pod's traffic (ingress, egress), the server's \
         port, the verdict (no_policy_allowed, denied_by_rule, no_profile_matched) and the \
         denying policy (empty when no policy allowed the connection).",
    );
    for (l, v) in &s.policy {
        sample(
            &mut out,
            "kdrop_network_policy_denials_total",
            &[
                ("pod", &l.pod),
                ("direction", &l.direction),
                ("port", &l.port),
                ("verdict", &l.verdict),
                ("policy", &l.policy),
            ],
            *v,
        );
    }
    header(
        &mut out,
        "kdrop_listen_overflows_total",
        "counter",
        "SYNs a listener refused because its accept queue (queue=accept, TcpExt ListenOverflows) \
         or its SYN queue (queue=syn, TCPReqQFullDrop) was full, by network namespace, pod and \
         listening port; from the namespace's counters, no packet seen.",
    );
    for (l, c) in &s.listen {
        for (queue, v) in [("accept", c.accept), ("syn", c.syn)] {
            sample(
                &mut out,
                "kdrop_listen_overflows_total",
                &[
                    ("netns", &l.netns),
                    ("pod", &l.pod),
                    ("port", &l.port),
                    ("queue", queue),
                ],
                v,
            );
        }
    }
    header(
        &mut out,
        "kdrop_listen_syncookies_total",
        "counter",
        "SYNs a listener answered with SYN cookies because its SYN queue was full \
         (TcpExt TCPReqQFullDoCookies), by network namespace, pod and listening port.",
    );
    for (l, c) in &s.listen {
        sample(
            &mut out,
            "kdrop_listen_syncookies_total",
            &[("netns", &l.netns), ("pod", &l.pod), ("port", &l.port)],
            c.cookies,
        );
    }
    header(
        &mut out,
        "kdrop_events_total",
        "counter",
        "Drop path accounting: matched = emitted + lost + sampled_out + capped.",
    );
    let e = &s.events;
    for (state, v) in [
        ("matched", e.matched),
        ("emitted", e.emitted),
        ("lost", e.lost),
        ("sampled_out", e.sampled_out),
        ("capped", e.capped),
    ] {
        sample(&mut out, "kdrop_events_total", &[("state", state)], v);
    }
    header(
        &mut out,
        "kdrop_handshake_packets_total",
        "counter",
        "Handshake packets (SYN, SYN-ACK, RST) seen leaving devices, followed to find \
         handshakes that die unanswered: matched = emitted + lost + capped.",
    );
    let g = &s.egress;
    for (state, v) in [
        ("matched", g.matched),
        ("emitted", g.emitted),
        ("lost", g.lost),
        ("capped", g.capped),
    ] {
        sample(
            &mut out,
            "kdrop_handshake_packets_total",
            &[("state", state)],
            v,
        );
    }
    for (name, help, c) in [
        (
            "kdrop_retransmissions_total",
            "SYN and SYN-ACK retransmissions of local sockets that matched the filter: \
             matched = emitted + lost + capped.",
            &s.retrans,
        ),
        (
            "kdrop_netfilter_verdicts_total",
            "Netfilter NF_DROP verdicts read while their probes were armed on demand: \
             matched = emitted + lost + capped.",
            &s.verdicts,
        ),
    ] {
        header(&mut out, name, "counter", help);
        for (state, v) in [
            ("matched", c.matched),
            ("emitted", c.emitted),
            ("lost", c.lost),
            ("capped", c.capped),
        ] {
            sample(&mut out, name, &[("state", state)], v);
        }
    }
    header(
        &mut out,
        "kdrop_followed_connections_total",
        "counter",
        "Client ends followed across NAT and namespaces: inserted into the kernel's \
         bounded map, refused because it was full (map_full), and packets the user's \
         filter alone would have rejected that were admitted for them (admitted).",
    );
    let f = &s.follow;
    for (state, v) in [
        ("inserted", f.inserted),
        ("map_full", f.map_full),
        ("admitted", f.admitted),
    ] {
        sample(
            &mut out,
            "kdrop_followed_connections_total",
            &[("state", state)],
            v,
        );
    }
    header(
        &mut out,
        "kdrop_probe_attached",
        "gauge",
        "1 for the rung of each probe point's ladder kdrop attached, 0 for the others.",
    );
    for p in &s.probes {
        sample(
            &mut out,
            "kdrop_probe_attached",
            &[("point", &p.point), ("rung", &p.rung)],
            u64::from(p.attached),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(reason: &str, port: &str) -> DropLabels {
        DropLabels {
            reason: reason.into(),
            netns: "4026531840".into(),
            pod: String::new(),
            container: String::new(),
            ifname: "eth0".into(),
            port: port.into(),
        }
    }

    #[test]
    fn renders_the_exposition_format() {
        let mut s = Snapshot::default();
        s.drops.insert(labels("NO_SOCKET", "80"), 3);
        s.findings.insert("no_socket".into(), 2);
        s.events = EventCounts {
            matched: 3,
            emitted: 2,
            lost: 0,
            sampled_out: 1,
            capped: 0,
        };
        s.probes.push(ProbeState {
            point: "skb:kfree_skb".into(),
            rung: "tp_btf".into(),
            attached: true,
        });
        s.probes.push(ProbeState {
            point: "skb:kfree_skb".into(),
            rung: "raw_tp".into(),
            attached: false,
        });
        s.follow = FollowCounts {
            inserted: 4,
            map_full: 1,
            admitted: 9,
        };
        s.retrans.matched = 2;
        s.policy.insert(
            PolicyLabels {
                pod: "kdt-db/db-0".into(),
                direction: "ingress".into(),
                port: "5432".into(),
                verdict: "no_policy_allowed".into(),
                policy: String::new(),
            },
            2,
        );
        let text = render(&s);
        assert!(text.contains("kdrop_followed_connections_total{state=\"map_full\"} 1\n"));
        assert!(text.contains("kdrop_followed_connections_total{state=\"admitted\"} 9\n"));
        assert!(text.contains("kdrop_retransmissions_total{state=\"matched\"} 2\n"));
        assert!(text.contains("# TYPE kdrop_netfilter_verdicts_total counter\n"));
        let want = [
            "# TYPE kdrop_drops_total counter",
            "kdrop_drops_total{reason=\"NO_SOCKET\",netns=\"4026531840\",pod=\"\",container=\"\",ifname=\"eth0\",port=\"80\"} 3",
            "# TYPE kdrop_findings_total counter",
            "kdrop_findings_total{cause=\"no_socket\"} 2",
            "# TYPE kdrop_network_policy_denials_total counter",
            "kdrop_network_policy_denials_total{pod=\"kdt-db/db-0\",direction=\"ingress\",port=\"5432\",verdict=\"no_policy_allowed\",policy=\"\"} 2",
            "kdrop_events_total{state=\"matched\"} 3",
            "kdrop_events_total{state=\"sampled_out\"} 1",
            "kdrop_events_total{state=\"capped\"} 0",
            "kdrop_handshake_packets_total{state=\"capped\"} 0",
            "# TYPE kdrop_probe_attached gauge",
            "kdrop_probe_attached{point=\"skb:kfree_skb\",rung=\"tp_btf\"} 1",
            "kdrop_probe_attached{point=\"skb:kfree_skb\",rung=\"raw_tp\"} 0",
        ];
        for w in want {
            assert!(text.lines().any(|l| l == w), "missing {w:?} in\n{text}");
        }
        // Every metric has HELP then TYPE, once; every line ends with \n.
        for name in [
            "kdrop_drops_total",
            "kdrop_findings_total",
            "kdrop_network_policy_denials_total",
            "kdrop_events_total",
            "kdrop_handshake_packets_total",
            "kdrop_probe_attached",
        ] {
            assert_eq!(text.matches(&format!("# HELP {name} ")).count(), 1);
            assert_eq!(text.matches(&format!("# TYPE {name} ")).count(), 1);
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn escapes_label_values() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
        let mut s = Snapshot::default();
        s.findings.insert("we\"ird".into(), 1);
        assert!(render(&s).contains("kdrop_findings_total{cause=\"we\\\"ird\"} 1\n"));
    }

    #[test]
    fn series_cap_is_sticky_and_overflows() {
        let mut cap = SeriesCap::new(3);
        let a = labels("NO_SOCKET", "80");
        let b = labels("NO_SOCKET", "81");
        let c = labels("NO_SOCKET", "82");
        assert_eq!(cap.place(a.clone()), a);
        assert_eq!(cap.place(b.clone()), b);
        // Two own series and the overflow one: the third goes to overflow.
        assert_eq!(cap.place(c.clone()), DropLabels::overflow());
        // Admitted ones keep their series.
        assert_eq!(cap.place(a.clone()), a);
        assert_eq!(cap.place(c), DropLabels::overflow());
        assert_eq!(
            cap.place(DropLabels::overflow()),
            DropLabels::overflow(),
            "the kernel's overflow key stays overflow"
        );
    }
}
