//! The enricher on recorded answers (context::replay): which events make
//! records, and which are counted instead.
use std::collections::HashMap;

use kdrop_common::{TCP_ACK, TCP_SYN};

use super::{memo, Enricher, Facts};
use crate::{
    context::{questions::asked, replay::Replay, NetnsName},
    kernel::facts::Reasons,
    model::packet::{Drop, Event, Packet, Tuple},
};

const NS: u32 = 9;
const TCP_V4_RCV: u64 = 0xffff_0091;

fn enricher() -> Enricher<Replay> {
    let mut e = Enricher::new(
        Replay::default(),
        Facts {
            reasons: Reasons::from_pairs([("NOT_SPECIFIED", 2)]),
            ct_names: Default::default(),
            nf_rungs: HashMap::new(),
            realtime_offset_ns: 0,
        },
    );
    e.node
        .set(asked::symbol(TCP_V4_RCV), Some("tcp_v4_rcv+0x91".into()));
    e.node.set(
        asked::netns(NS),
        Some(NetnsName {
            inode: NS,
            name: Some("srv".into()),
        }),
    );
    e
}

/// A SYN client -> server freed by TCP's receive path without a reason.
fn syn_freed() -> Event {
    Event::Drop(syn())
}

/// A SYN client -> server dropped (reason 2) at TCP's receive path.
fn syn() -> Drop {
    Drop {
        ts_ns: 1_000_000_000,
        cpu: 0,
        location: TCP_V4_RCV,
        reason: 2,
        netns: NS,
        ifindex: 2,
        mark: 0,
        saddr: "10.0.1.1".parse().unwrap(),
        daddr: "10.0.2.2".parse().unwrap(),
        sport: 43006,
        dport: 80,
        tcp_flags: TCP_SYN,
        isn: 7,
        fib: Vec::new(),
        ct: None,
        src_check: None,
        src_mac: None,
    }
}

fn pending(e: &mut Enricher<Replay>, yes: bool) {
    e.node.set(
        asked::request_pending(
            NS,
            "10.0.2.2:80".parse().unwrap(),
            "10.0.1.1:43006".parse().unwrap(),
        ),
        Some(yes),
    );
}

/// The server's SYN-ACK for the client of `syn`, retransmitted at `ts_ns`.
fn rtx(ts_ns: u64) -> Event {
    Event::Retrans(Packet {
        ts_ns,
        netns: NS,
        ifindex: 0,
        mark: 0,
        tuple: Tuple {
            src: "10.0.2.2:80".parse().unwrap(),
            dst: "10.0.1.1:43006".parse().unwrap(),
        },
        tcp_flags: TCP_SYN | TCP_ACK,
        isn: 7,
        ct: None,
    })
}

/// The held weak records, all of them.
fn drained(e: &mut Enricher<Replay>) -> Vec<crate::model::record::DropRecord> {
    e.due(u64::MAX)
}

#[test]
fn a_syn_tcp_freed_without_a_request_socket_is_counted_not_reported() {
    let mut e = enricher();
    pending(&mut e, false);
    assert!(e.on_event(&syn_freed()).is_none());
    assert!(drained(&mut e).is_empty());
    assert_eq!(e.answered_by_tcp, 1);
}

#[test]
fn a_syn_repeating_a_pending_request_is_a_duplicate() {
    let mut e = enricher();
    pending(&mut e, true);
    assert!(e.on_event(&syn_freed()).is_none(), "held for its verdict");
    let r = drained(&mut e);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].finding.as_ref().unwrap().cause, "duplicate_syn");
    assert_eq!(e.answered_by_tcp, 0);
}

#[test]
fn a_syn_tcp_freed_in_a_failed_handshake_carries_its_verdict() {
    let mut e = enricher();
    pending(&mut e, false);
    // The server's SYN-ACK for that client, retransmitted twice, 2 s apart.
    assert!(e.on_event(&rtx(500_000_000)).is_none());
    let r = e.on_event(&rtx(2_500_000_000)).expect("dead");
    assert_eq!(r.kind, "unanswered");
    assert_eq!(r.tcp_flags, "SYN|ACK");
    assert_eq!((r.sport, r.dport), (43006, 80));
    let f = r.finding.as_ref().unwrap();
    assert_eq!(f.cause, "syn_ack_unanswered");
    // A later free of the same client's SYN joins that handshake.
    let Event::Drop(mut d) = syn_freed() else {
        unreachable!()
    };
    d.ts_ns = 3_000_000_000;
    assert!(e.on_event(&Event::Drop(d)).is_none(), "held");
    let r = drained(&mut e);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].finding.as_ref().unwrap().cause, "syn_ack_unanswered");
    assert_eq!(e.answered_by_tcp, 0);
}

/// The VM's silent test at CI's load: the reader seconds late, a repeated
/// SYN's drop (held for its verdict) and the SYN-ACK's retransmissions that
/// kill the handshake come in one batch. The drop's wait ended before the
/// retransmissions happened: it is filed first, and its cause stands.
#[test]
fn a_held_drop_is_filed_before_a_later_event_of_the_same_batch() {
    let mut e = enricher();
    pending(&mut e, true);
    assert!(e.on_event(&syn_freed()).is_none(), "held");
    // Within its second: still held.
    assert!(e.held_due_before(&rtx(1_900_000_000)).is_empty());
    let first = e.held_due_before(&rtx(2_500_000_000));
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].finding.as_ref().unwrap().cause, "duplicate_syn");
    assert!(e.on_event(&rtx(2_500_000_000)).is_none());
    let r = e.on_event(&rtx(4_500_000_000)).expect("dead");
    assert_eq!(r.kind, "unanswered");
    let f = r.finding.as_ref().unwrap();
    assert_eq!(f.cause, "duplicate_syn");
    assert!(
        f.evidence.last().unwrap().ends_with("[syn_ack_unanswered]"),
        "{f:?}"
    );
    assert_eq!(r.handshake, first[0].handshake);
}

/// Before 5.17 no free has a reason: the request socket alone makes a
/// duplicate, and a SYN freed without one is reported (it may be a closed
/// port's), never counted away.
#[test]
fn without_drop_reasons_only_a_pending_request_makes_a_duplicate() {
    let reasonless = || {
        let Event::Drop(mut d) = syn_freed() else {
            unreachable!()
        };
        d.reason = kdrop_common::ABSENT;
        Event::Drop(d)
    };
    let mut e = enricher();
    pending(&mut e, true);
    assert!(e.on_event(&reasonless()).is_none(), "held");
    let r = drained(&mut e);
    let f = r[0].finding.as_ref().unwrap();
    assert_eq!(f.cause, "duplicate_syn");
    assert!(f.evidence[0].starts_with("freed (this kernel gives no drop reason)"));
    let mut e = enricher();
    pending(&mut e, false);
    assert!(e.on_event(&reasonless()).is_none(), "held");
    let r = drained(&mut e);
    assert_eq!(r.len(), 1);
    assert_ne!(
        r[0].finding.as_ref().map(|f| f.cause.id()),
        Some("duplicate_syn")
    );
    assert_eq!(e.answered_by_tcp, 0);
}

/// Kept: SYNs alike but for their source port, ISN and time within the
/// same second. Not kept: replies, entries, lookups, programs' drops.
#[test]
fn which_drops_share_a_diagnosis() {
    let a = memo::Key::of(&syn(), false).unwrap();
    let mut b = syn();
    (b.sport, b.isn, b.ts_ns) = (40001, 99, 1_900_000_000);
    assert_eq!(memo::Key::of(&b, false), Some(a));
    b.ts_ns = 2_000_000_000;
    assert_ne!(
        memo::Key::of(&b, false),
        Some(a),
        "a second later: asked again"
    );
    let mut c = syn();
    c.saddr = "10.0.1.2".parse().unwrap();
    assert_ne!(memo::Key::of(&c, false), Some(a));
    let mut syn_ack = syn();
    syn_ack.tcp_flags = TCP_SYN | TCP_ACK;
    assert_eq!(memo::Key::of(&syn_ack, false), None);
    let mut ecn = syn();
    ecn.tcp_flags = TCP_SYN | 0x40 | 0x80;
    assert!(memo::Key::of(&ecn, false).is_some(), "ECE and CWR on a SYN");
    let mut looked_up = syn();
    looked_up.fib.push(crate::model::packet::Lookup {
        ts_ns: 1,
        table: 254,
        err: 0,
        iif: 2,
        oif: 0,
        mark: 0,
        src: "10.0.2.2".parse().unwrap(),
        dst: "10.0.1.1".parse().unwrap(),
        res_ifindex: 2,
        gw: None,
        scope: 0,
    });
    assert_eq!(memo::Key::of(&looked_up, false), None);
    assert_eq!(memo::Key::of(&syn(), true), None);
}

/// The enricher of a kernel with NETFILTER_DROP (reason 7), and a SYN it
/// dropped; the node's readings around it have nft failing.
fn nf_dropped() -> (Enricher<Replay>, Drop) {
    let mut e = enricher();
    e.facts.reasons = Reasons::from_pairs([("NETFILTER_DROP", 7)]);
    let d = Drop { reason: 7, ..syn() };
    let failed = crate::model::netfilter::Snapshot {
        started_ns: d.ts_ns + 1,
        finished_ns: d.ts_ns + 2,
        problems: vec!["/usr/sbin/nft -j list ruleset failed: Error: busy".into()],
        ..Default::default()
    };
    e.node.set_netfilter_around(NS, d.ts_ns, None, failed);
    (e, d)
}

const NFT_FAILED: &str = "the rules read after the drop are incomplete: /usr/sbin/nft -j list \
                          ruleset failed: Error: busy";

#[test]
fn a_netfilter_drop_kdrop_cannot_attribute_says_why() {
    let (mut e, d) = nf_dropped();
    let r = e.on_event(&Event::Drop(d)).expect("a record");
    assert!(r.netfilter.is_none());
    let f = r.finding.as_ref().unwrap();
    assert_eq!(f.cause, "netfilter");
    assert_eq!(
        f.fix_notes,
        [format!(
            "kdrop could not tell which rule: {NFT_FAILED}; the rulesets below hold it"
        )]
    );
}

#[test]
fn a_netfilter_drop_in_a_namespace_kdrop_cannot_read_says_so() {
    let (mut e, mut d) = nf_dropped();
    d.ts_ns += 1; // no readings recorded for this drop
    let r = e.on_event(&Event::Drop(d)).expect("a record");
    assert_eq!(
        r.finding.as_ref().unwrap().fix_notes,
        [format!(
            "kdrop could not tell which rule: {}; the rulesets below hold it",
            crate::diagnosis::netfilter::UNREAD
        )]
    );
}

/// The kernel's verdict names the table and hook; the counters could not
/// name the rule in it, and its evidence says why.
#[test]
fn a_kernel_verdict_without_counters_says_why_not_the_rule() {
    use crate::model::{
        netfilter::{Family, Hook},
        packet::{NfFn, NfVerdict},
    };
    let (mut e, d) = nf_dropped();
    let v = NfVerdict {
        ts_ns: d.ts_ns - 1_000,
        cpu: d.cpu,
        func: NfFn::NftDoChain,
        raw: 0,
        netns: d.netns,
        saddr: d.saddr,
        daddr: d.daddr,
        sport: d.sport,
        dport: d.dport,
        hook: Some(Hook::Input),
        family: Some(Family::Ip),
        table: Some("filter".into()),
        chain: Some("INPUT".into()),
    };
    assert!(e.on_event(&Event::Verdict(v)).is_none());
    let r = e.on_event(&Event::Drop(d)).expect("a record");
    let a = r.netfilter.as_ref().expect("the kernel's verdict");
    assert_eq!(a.dropped_by, crate::model::netfilter::DroppedBy::Table);
    assert_eq!(a.chain.as_deref(), Some("INPUT"));
    assert_eq!(
        a.evidence.last().unwrap(),
        &format!("rule counters: {NFT_FAILED}")
    );
}
