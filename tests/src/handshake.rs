//! One handshake's records as kdrop printed them: which are its, all of
//! them up to its "unanswered" record and the exit drain, and its one verdict.
use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use serde_json::Value;

use crate::Kdrop;

/// Is this record about the handshake of `client` (its SYN, the SYN-ACK
/// to it, or a packet of it after NAT that names the client's end)?
pub fn of(e: &Value, client: SocketAddr) -> bool {
    let end = |a: &str, p: &str| e[a] == client.ip().to_string() && e[p] == client.port();
    end("saddr", "sport") || end("daddr", "dport")
}

/// Is this record about exactly the packet `src -> dst` (as the record
/// names its tuple)?
pub fn is_tuple(e: &Value, src: &SocketAddr, dst: &SocketAddr) -> bool {
    e["saddr"] == src.ip().to_string()
        && e["sport"] == src.port()
        && e["daddr"] == dst.ip().to_string()
        && e["dport"] == dst.port()
}

/// Every record of `client`'s handshake: read until its "unanswered"
/// record (the SYN's third transmission, 3 s after the first), then what
/// kdrop drained at exit.
pub fn records(k: Kdrop, client: SocketAddr) -> Vec<Value> {
    records_until(k, client, "unanswered", |e| e["kind"] == "unanswered")
}

/// Every record of `client`'s handshake up to the first that is `last`
/// (within 10 s), then what kdrop drained at exit.
pub fn records_until(
    k: Kdrop,
    client: SocketAddr,
    what: &str,
    last: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let seen = std::cell::RefCell::new(Vec::new());
    k.expect_event_within(
        &format!("the handshake's {what} record"),
        Duration::from_secs(10),
        |e| {
            if of(e, client) {
                seen.borrow_mut().push(e.clone());
            }
            of(e, client) && last(e)
        },
    );
    let mut out = seen.into_inner();
    let done = k.stop(libc::SIGINT);
    assert!(done.status.success(), "{done:?}");
    out.extend(done.events().into_iter().filter(|e| of(e, client)));
    out
}

/// One handshake, one cause, one id; returns the verdict (the first
/// record's finding).
pub fn one_verdict(recs: &[Value], cause: &str) -> Value {
    assert!(!recs.is_empty());
    let causes: BTreeSet<String> = recs
        .iter()
        .map(|e| e["finding"]["cause"].as_str().unwrap_or("none").to_string())
        .collect();
    assert_eq!(causes, BTreeSet::from([cause.to_string()]), "{recs:#?}");
    let ids: BTreeSet<u64> = recs
        .iter()
        .map(|e| e["handshake"].as_u64().expect("a handshake id"))
        .collect();
    assert_eq!(ids.len(), 1, "{recs:#?}");
    recs[0]["finding"].clone()
}
