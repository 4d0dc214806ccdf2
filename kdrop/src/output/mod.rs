//! Turning records into what people and programs read: one text line or
//! one JSON object per record (`text`), the summary at exit (`summary`),
//! the Prometheus exposition (`metrics`).
pub mod json;
pub mod metrics;
pub mod pcapng;
pub mod summary;
pub mod text;

use std::{fmt::Display, io::Write};

use crate::model::record::DropRecord;

/// Lines to an output that goes quiet once it is closed (`kdrop check |
/// head`): what follows is dropped, never a panic, and the caller carries
/// on to its own end.
pub struct Lines<W: Write> {
    out: W,
    closed: bool,
}

impl<W: Write> Lines<W> {
    pub fn new(out: W) -> Self {
        Self { out, closed: false }
    }

    pub fn line(&mut self, line: impl Display) {
        if !self.closed {
            self.closed = writeln!(self.out, "{line}")
                .and_then(|()| self.out.flush())
                .is_err();
        }
    }

    pub fn closed(&self) -> bool {
        self.closed
    }
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
    use crate::model::{
        pod::{Pod, PodId},
        time::rfc3339,
    };

    pub fn record() -> DropRecord {
        DropRecord {
            packet: None,
            ts: rfc3339(1_795_240_987_123_456_789),
            kind: "drop",
            netns: 4026532999,
            netns_name: Some("node".into()),
            pods: Default::default(),
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
            network_policy: None,
            handshake: None,
        }
    }

    /// A pipe whose reader is gone.
    struct Closed(usize);

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            self.0 += 1;
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_go_quiet_on_a_closed_output() {
        let mut out = Lines::new(Closed(0));
        out.line("kernel 6.18");
        out.line(format_args!("btf {}", 1));
        assert!(out.closed());
        // Tried once, then not again.
        assert_eq!(out.out.0, 1);
        let mut open = Lines::new(Vec::new());
        open.line("a");
        open.line(format_args!("b {}", 2));
        assert!(!open.closed());
        assert_eq!(String::from_utf8(open.out).unwrap(), "a\nb 2\n");
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
        for k in ["pod", "container", "client_pod", "service", "backend_pod"] {
            assert!(v[k].is_null(), "{k}: {v}");
        }
        let pod = |namespace: &str, name: &str, containers: Option<&str>| Pod {
            id: PodId::Named {
                namespace: namespace.into(),
                name: name.into(),
            },
            containers: containers.map(String::from),
            labels: None,
        };
        r.pods.pod = Some(pod("shop", "cart-7d9f", Some("cart")));
        r.pods.backend = Some(pod("data", "mysql-0", None));
        let v: serde_json::Value = serde_json::from_str(&json_line(&r)).unwrap();
        assert_eq!(
            (&v["pod"], &v["container"], &v["backend_pod"]),
            (
                &"shop/cart-7d9f".into(),
                &"cart".into(),
                &"data/mysql-0".into()
            )
        );
    }
}
