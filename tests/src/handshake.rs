//! One handshake's records as kdrop printed them (`Record::of` says which
//! are its): all of them up to its "unanswered" record and the exit drain,
//! its one verdict, and its repair applied.
use std::{collections::BTreeSet, net::SocketAddr, os::fd::OwnedFd, time::Duration};

use crate::{
    connect_from,
    record::{Finding, Record},
    run_fix, Kdrop, Ns,
};

/// Every record of `client`'s handshake: read until its "unanswered"
/// record (the SYN's third transmission, 3 s after the first), then what
/// kdrop drained at exit.
pub fn records(k: Kdrop, client: SocketAddr) -> Vec<Record> {
    records_until(k, client, "unanswered", |e| e.kind == "unanswered")
}

/// Every record of `client`'s handshake up to the first that is `last`
/// (within 10 s), then what kdrop drained at exit.
pub fn records_until(
    k: Kdrop,
    client: SocketAddr,
    what: &str,
    last: impl Fn(&Record) -> bool,
) -> Vec<Record> {
    let seen = std::cell::RefCell::new(Vec::new());
    k.expect_record_within(
        &format!("the handshake's {what} record"),
        Duration::from_secs(10),
        |e| {
            if e.of(client) {
                seen.borrow_mut().push(e.clone());
            }
            e.of(client) && last(e)
        },
    );
    let mut out = seen.into_inner();
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    out.extend(done.records().into_iter().filter(|e| e.of(client)));
    out
}

/// One handshake, one cause, one id; returns the verdict (the first
/// record's finding).
pub fn one_verdict(recs: &[Record], cause: &str) -> Finding {
    assert!(!recs.is_empty());
    let causes: BTreeSet<String> = recs.iter().map(|e| e.cause().to_string()).collect();
    assert_eq!(causes, BTreeSet::from([cause.to_string()]), "{recs:#?}");
    let ids: BTreeSet<u64> = recs
        .iter()
        .map(|e| e.handshake.expect("a handshake id"))
        .collect();
    assert_eq!(ids.len(), 1, "{recs:#?}");
    recs[0].finding().clone()
}

/// Applies the finding's whole `fix` after closing the stuck socket (a
/// retransmission of it after the fix would complete its handshake and hold
/// the 5-tuple), then connects from `src` (the same client address and
/// port, the stale entry being part of the fix, or another).
pub fn fix_then_connect(
    f: &Finding,
    client: &Ns,
    syn: impl Into<Option<OwnedFd>>,
    src: SocketAddr,
    dst: SocketAddr,
) {
    drop(syn.into());
    for cmd in &f.fix {
        run_fix(cmd);
    }
    connect_from(client, src, dst).expect("a connection after the fix");
}
