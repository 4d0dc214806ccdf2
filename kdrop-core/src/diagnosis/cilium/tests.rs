use std::{collections::BTreeMap, net::IpAddr};

use super::{finding::explain, *};
use crate::{
    diagnosis::{
        netpol::{
            policy::{Peer, Workload},
            Conn,
        },
        reason::DropFacts,
    },
    model::progs::Agent,
};

fn count(reason: u8, dir: u8, packets: u64) -> CiliumCount {
    CiliumCount {
        reason,
        dir,
        packets,
    }
}

fn hook(name: &str, now: Vec<CiliumCount>, before: Option<Vec<CiliumCount>>) -> HookProgs {
    HookProgs {
        dev: "lxc1a2b3c".into(),
        ifindex: 9,
        hook: "ingress".into(),
        progs: vec![ProgInfo {
            id: 77,
            prog_type: "sched_cls".into(),
            name: name.into(),
            tag: "abababababababab".into(),
            load_time_ns: 0,
            loaded_at_unix: None,
            created_by_uid: 0,
            map_ids: vec![5],
            pinned: vec![],
            agent: Some(Agent {
                name: "cilium".into(),
                evidence: format!("program name {name}"),
            }),
            holders: vec![],
            cilium_metrics: Some(CiliumMetrics {
                map_id: 5,
                now,
                before,
            }),
        }],
        ..Default::default()
    }
}

#[test]
fn the_reason_that_grew() {
    let h = hook(
        "cil_from_contai",
        vec![count(133, 2, 7), count(158, 1, 40)],
        Some(vec![count(133, 2, 6), count(158, 1, 40)]),
    );
    let d = classify(&h).unwrap();
    assert_eq!(d.reason, POLICY_DENIED);
    assert_eq!(d.reason_name(), "POLICY_DENIED");
    assert_eq!(d.direction, Some(Direction::Egress));
    assert_eq!(d.counted, Counted::Grew { from: 6, to: 7 });
    assert!(d.is_policy());
    // A reason counted for the first time grew from nothing.
    let h = hook("cil_to_contain", vec![count(181, 1, 1)], Some(vec![]));
    let d = classify(&h).unwrap();
    assert_eq!(
        (d.reason, d.counted),
        (POLICY_DENY, Counted::Grew { from: 0, to: 1 })
    );
    assert_eq!(d.direction, Some(Direction::Ingress));
}

#[test]
fn first_read_and_ambiguity() {
    // First read: the only reason counted.
    let d = classify(&hook("cil_from_contai", vec![count(133, 2, 3)], None)).unwrap();
    assert_eq!(d.counted, Counted::OnlyOne { total: 3 });
    // Several reasons, one a policy's: that one.
    let h = hook(
        "cil_from_contai",
        vec![count(133, 2, 3), count(169, 2, 1)],
        None,
    );
    assert_eq!(classify(&h).unwrap().reason, POLICY_DENIED);
    // Several and no policy's, or two policy reasons: no guess.
    let h = hook(
        "cil_from_contai",
        vec![count(169, 2, 3), count(158, 2, 1)],
        None,
    );
    assert_eq!(classify(&h), None);
    let h = hook(
        "cil_from_contai",
        vec![count(133, 2, 3), count(181, 2, 1)],
        None,
    );
    assert_eq!(classify(&h), None);
    // Nothing moved.
    let h = hook(
        "cil_from_contai",
        vec![count(133, 2, 3)],
        Some(vec![count(133, 2, 3)]),
    );
    assert_eq!(classify(&h), None);
    // The direction from the program when the key has none.
    let d = classify(&hook("cil_to_contain", vec![count(133, 0, 1)], None)).unwrap();
    assert_eq!(d.direction, Some(Direction::Ingress));
    assert_eq!(
        classify(&hook("cil_from_netdev", vec![count(133, 0, 1)], None))
            .unwrap()
            .direction,
        None
    );
    // Not Cilium's program.
    let mut h = hook("cil_from_contai", vec![count(133, 2, 1)], None);
    h.progs[0].agent = None;
    assert_eq!(classify(&h), None);
    assert_eq!(reason_name(196), Some("TTL_EXCEEDED"));
    assert_eq!(reason_name(159), None);
}

#[test]
fn a_deny_rule_in_kubernetes_terms() {
    let h = hook(
        "cil_to_contain",
        vec![count(181, 1, 2)],
        Some(vec![count(181, 1, 1)]),
    );
    let d = classify(&h).unwrap();
    let db = Workload {
        namespace: "data".into(),
        name: "db-0".into(),
        labels: Ok(BTreeMap::from([("app".to_string(), "db".to_string())])),
    };
    let ip: IpAddr = "10.0.3.7".parse().unwrap();
    let peer = Peer::Addr(ip);
    let conn = Conn {
        protected: Some(&db),
        peer: &peer,
        protected_addr: "10.0.3.9".parse().unwrap(),
        peer_addr: ip,
        port: 5432,
    };
    let facts = DropFacts {
        reason: Some("TC_EGRESS"),
        ifname: "lxc1a2b3c",
        netns: None,
        src: "10.0.3.7:40000".into(),
        dst: "10.0.3.9:5432".into(),
        location: None,
        tcp_flags: 0x02,
        netfilter: None,
        unattributed: None,
    };
    let (f, p) = explain(&d, Direction::Ingress, &conn, &facts);
    assert_eq!(
        f.summary,
        "Cilium network policy, ingress of pod data/db-0 from 10.0.3.7: Cilium dropped TCP port \
         5432 as POLICY_DENY (181)"
    );
    assert_eq!(p.verdict, "denied_by_rule");
    assert_eq!(p.engine, "cilium");
    assert_eq!(p.interface.as_deref(), Some("lxc1a2b3c"));
    assert!(f.evidence.iter().any(|e| {
        e
        == "Cilium's metrics map (map 5) counted it: POLICY_DENY ingress went from 1 to 2 packets \
            since kdrop's previous read"
    }));
    assert!(f
        .fix_notes
        .iter()
        .any(|n| n.starts_with("a deny rule (ingressDeny")));
    assert!(
        f.fix_notes[0].contains("cidr: \"10.0.3.7/32\""),
        "{}",
        f.fix_notes[0]
    );
    assert!(f
        .inspect
        .contains(&"hubble observe --verdict DROPPED --to-pod data/db-0".to_string()));
}
