//! A listener refusing connections, seen from its namespace's TcpExt
//! counters alone (the session's listen watch): no packet, no client
//! address. A SYN refused by a full accept queue, or by a full SYN queue
//! with cookies off, is freed with `consume_skb` (`tcp_conn_request`,
//! v6.18 https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_input.c),
//! so only ListenOverflows, ListenDrops, TCPReqQFullDrop and
//! TCPReqQFullDoCookies (`tcp_syn_flood_action`) show it.
use crate::model::cause::Cause;
use std::net::{Ipv4Addr, SocketAddr};

use super::listen::{counters_line_since, overflow, owner_text, Seen};
use crate::model::{
    finding::Finding,
    listen::{ListenCounters, ListenMoved, Listener, ListenerFound},
    packet::Tuple,
};

/// What the watch counted for one listener since its previous record (or,
/// for the first, since the read before the counters moved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched<'a> {
    /// The listener now; `counters` the namespace's at this read.
    pub found: &'a ListenerFound,
    /// The counters when the period began.
    pub base: &'a ListenCounters,
    /// The growth counted for this listener in the period.
    pub moved: ListenMoved,
    /// The period's length.
    pub over_ns: u64,
    /// Was a record written for this listener before (the period began
    /// with it)?
    pub again: bool,
}

/// The listeners of a namespace its counters' growth belongs to: those
/// whose queue that kind of refusal fills; when none is full now (the
/// application caught up), the only one watched, if there is only one.
pub fn blamed(listeners: &[Listener], m: &ListenMoved) -> Vec<usize> {
    let syn = m.req_q_full_drop + m.req_q_full_do_cookies > 0;
    let full: Vec<usize> = listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            m.listen_overflows > 0 && l.accept_queue_full() || syn && l.syn_queue_full()
        })
        .map(|(i, _)| i)
        .collect();
    match (full.is_empty(), listeners.len()) {
        (true, 1) => vec![0],
        _ => full,
    }
}

/// `+3 ListenOverflows, +3 ListenDrops` (the counters that moved).
pub fn moved_text(m: &ListenMoved) -> String {
    let parts: Vec<String> = [
        ("ListenOverflows", m.listen_overflows),
        ("ListenDrops", m.listen_drops),
        ("TCPReqQFullDrop", m.req_q_full_drop),
        ("TCPReqQFullDoCookies", m.req_q_full_do_cookies),
        ("SyncookiesSent", m.syncookies_sent),
    ]
    .into_iter()
    .filter(|(_, v)| *v > 0)
    .map(|(n, v)| format!("+{v} {n}"))
    .collect();
    if parts.is_empty() {
        "no counter moved".into()
    } else {
        parts.join(", ")
    }
}

fn period(w: &Watched) -> String {
    let secs = w.over_ns as f64 / 1e9;
    if w.again {
        format!("since kdrop's previous record for this listener, {secs:.1} s ago")
    } else {
        format!("in the last {secs:.1} s")
    }
}

fn plural(n: u64, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

/// The finding for a watched listener: its accept queue overflowing
/// (`listen_overflow`), its SYN queue full with cookies off
/// (`syn_queue_overflow`), or its SYN queue answered with cookies
/// (`syn_cookies`); None when none of those counters moved.
pub fn watched(w: &Watched) -> Option<Finding> {
    let since = if w.again {
        "since kdrop's previous record"
    } else {
        "since kdrop's previous read"
    };
    let counters = counters_line_since(&w.found.counters, Some(w.base), since);
    let m = &w.moved;
    if m.listen_overflows > 0 {
        return accept_overflow(w, counters);
    }
    if m.req_q_full_drop > 0 {
        return Some(syn_queue_full(w, counters));
    }
    if m.req_q_full_do_cookies > 0 {
        return Some(syn_cookies(w, counters));
    }
    None
}

/// The accept queue overflowed: the listener's finding, with the
/// counters that moved in the period as its evidence.
fn accept_overflow(w: &Watched, counters: String) -> Option<Finding> {
    let (f, l) = (w.found, &w.found.listener);
    let line = format!(
        "TcpExt {} {}: SYNs to {} refused (the counters name no client address)",
        moved_text(&w.moved),
        period(w),
        l.local
    );
    let t = Tuple {
        src: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        dst: l.local,
    };
    // The counters moved in the period, whatever the queue is now.
    let mut since_base = f.clone();
    since_base.counters_before = Some(w.base.clone());
    let mut fd = overflow(&since_base, &t, &Seen::Counters(line))?;
    if let Some(last) = fd.evidence.last_mut() {
        *last = counters;
    }
    Some(fd)
}

/// The SYN queue's state, the sysctls that bound it and its owner.
fn syn_queue_evidence(w: &Watched, counters: String) -> Vec<String> {
    let (f, l) = (w.found, &w.found.listener);
    let (q, b, sq) = (l.accept_queue, l.accept_backlog, l.syn_queue);
    let s = &f.sysctls;
    let opt = |v: Option<u32>| v.map_or("unreadable".into(), |v| v.to_string());
    let mut evidence = vec![
        format!("TcpExt {} {}", moved_text(&w.moved), period(w)),
        format!(
            "listener {} in netns {}: SYN queue {sq} request sockets, backlog {b} (it bounds \
             the SYN queue too: 6.18 refuses SYNs when more than {b} wait), accept queue {q} waiting",
            l.local, f.netns_name
        ),
        format!(
            "net.core.somaxconn = {}, net.ipv4.tcp_max_syn_backlog = {}, net.ipv4.tcp_syncookies \
             = {}",
            opt(s.somaxconn),
            opt(s.tcp_max_syn_backlog),
            opt(s.tcp_syncookies)
        ),
        counters,
    ];
    if let [p, ..] = f.owners.as_slice() {
        evidence.insert(
            2,
            format!("owner: {} (pid {}): {}", p.comm, p.pid, p.cmdline),
        );
    }
    evidence
}

/// What shows the request sockets, and what many of them mean.
fn syn_queue_inspect(w: &Watched) -> (Vec<String>, String) {
    let f = w.found;
    let port = f.listener.local.port();
    let inspect = vec![
        format!("{}ss -tn state syn-recv 'sport = :{port}'", f.exec),
        format!(
            "{}nstat -az TcpExtTCPReqQFullDrop TcpExtTCPReqQFullDoCookies TcpExtListenDrops",
            f.exec
        ),
    ];
    let flood = format!(
        "many SYN-RECV request sockets from few addresses are a SYN flood, or clients whose \
         final ACK is lost on the way: `{}`",
        inspect[0]
    );
    (inspect, flood)
}

fn syn_queue_full(w: &Watched, counters: String) -> Finding {
    let (f, l) = (w.found, &w.found.listener);
    let who = owner_text(&f.owners);
    let (inspect, flood) = syn_queue_inspect(w);
    Finding {
        cause: Cause::SynQueueOverflow,
        summary: format!(
            "SYN queue of {who} on {} is full ({}/{}) and SYN cookies are off: {} dropped {}",
            l.local,
            l.syn_queue,
            l.accept_backlog,
            plural(w.moved.req_q_full_drop, "SYN"),
            period(w)
        ),
        evidence: syn_queue_evidence(w, counters),
        fix_notes: vec![
            format!(
                "`{}sysctl -w net.ipv4.tcp_syncookies=1` answers SYNs past a full SYN queue \
                 with cookies instead of dropping them",
                f.exec
            ),
            format!(
                "a larger backlog ({who}'s listen(), capped by net.core.somaxconn) \
                 lengthens the SYN queue too"
            ),
            flood,
        ],
        inspect,
        ..Finding::default()
    }
}

fn syn_cookies(w: &Watched, counters: String) -> Finding {
    let (f, l) = (w.found, &w.found.listener);
    let who = owner_text(&f.owners);
    let (inspect, flood) = syn_queue_inspect(w);
    Finding {
        cause: Cause::SynCookies,
        summary: format!(
            "SYN queue of {who} on {} overflowed ({}/{}): {} answered with SYN cookies \
             {}; those connections open, but a cookie keeps only some TCP options",
            l.local,
            l.syn_queue,
            l.accept_backlog,
            plural(w.moved.req_q_full_do_cookies, "SYN"),
            period(w)
        ),
        evidence: syn_queue_evidence(w, counters),
        fix_notes: vec![
            "a connection opened by a cookie has no window scaling or SACK unless the \
             client sent timestamps: throughput may suffer"
                .into(),
            format!(
                "a larger backlog ({who}'s listen(), capped by net.core.somaxconn) \
                 lengthens the SYN queue"
            ),
            flood,
        ],
        inspect,
        ..Finding::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::listen::{ListenSysctls, ProcessRef};

    fn listener(port: u16, q: u32, b: u32, sq: u32) -> Listener {
        Listener {
            local: SocketAddr::new([10, 0, 0, 2].into(), port),
            bound_if: 0,
            accept_queue: q,
            accept_backlog: b,
            syn_queue: sq,
            inode: 4242,
            uid: 0,
        }
    }

    fn counters(o: u64, d: u64, qd: u64, qc: u64) -> ListenCounters {
        ListenCounters {
            listen_overflows: Some(o),
            listen_drops: Some(d),
            syncookies_sent: Some(qc),
            req_q_full_drop: Some(qd),
            req_q_full_do_cookies: Some(qc),
        }
    }

    fn found(l: Listener, now: ListenCounters) -> ListenerFound {
        ListenerFound {
            netns: 9,
            netns_name: "srv".into(),
            exec: "ip netns exec srv ".into(),
            listener: l,
            sysctls: ListenSysctls {
                somaxconn: Some(4096),
                tcp_max_syn_backlog: Some(512),
                tcp_syncookies: Some(0),
            },
            counters: now,
            counters_before: None,
            owners: vec![ProcessRef {
                pid: 812,
                comm: "api".into(),
                cmdline: "/srv/api --port 8080".into(),
            }],
        }
    }

    #[test]
    fn growth_goes_to_the_full_queue_or_the_only_listener() {
        let m = ListenMoved::between(&counters(3, 3, 0, 0), &counters(5, 5, 0, 0));
        assert_eq!((m.listen_overflows, m.listen_drops), (2, 2));
        assert!(m.any());
        let ls = [listener(80, 0, 128, 0), listener(8080, 2, 1, 0)];
        assert_eq!(blamed(&ls, &m), vec![1]);
        // Drained since: two candidates, no blame; one: that one.
        let drained = [listener(80, 0, 128, 0), listener(8080, 0, 1, 0)];
        assert!(blamed(&drained, &m).is_empty());
        assert_eq!(blamed(&drained[1..], &m), vec![0]);
        // A SYN queue at its limit takes the SYN-queue counters, not overflows.
        let syn = ListenMoved {
            req_q_full_drop: 4,
            listen_drops: 4,
            ..ListenMoved::default()
        };
        let ls = [listener(80, 2, 1, 0), listener(8080, 0, 4, 4)];
        assert_eq!(blamed(&ls, &syn), vec![1]);
        // Cookies sent alone (tcp_syncookies=2) are no refusal.
        let cookies = ListenMoved {
            syncookies_sent: 9,
            ..ListenMoved::default()
        };
        assert!(!cookies.any());
        // A counter that went back (the namespace was made again) counts 0.
        let back = ListenMoved::between(&counters(9, 9, 0, 0), &counters(1, 1, 0, 0));
        assert!(!back.any());
        let unreadable = ListenMoved::between(&ListenCounters::default(), &counters(1, 1, 0, 0));
        assert_eq!(unreadable, ListenMoved::default());
    }

    #[test]
    fn an_accept_queue_overflow_seen_only_in_the_counters() {
        let (base, now) = (counters(3, 3, 0, 0), counters(5, 5, 0, 0));
        let f = found(listener(8080, 2, 1, 0), now.clone());
        let w = Watched {
            found: &f,
            base: &base,
            moved: ListenMoved::between(&base, &now),
            over_ns: 500_000_000,
            again: false,
        };
        let fd = watched(&w).unwrap();
        assert_eq!(fd.cause, "listen_overflow");
        assert_eq!(
            fd.summary,
            "accept queue of api (pid 812) on 10.0.0.2:8080 is full: 2/1 waiting; it is not \
             calling accept() fast enough"
        );
        assert!(
            fd.evidence[0].starts_with(
                "TcpExt +2 ListenOverflows, +2 ListenDrops in the last 0.5 s: SYNs to \
                 10.0.0.2:8080 refused (the counters name no client address); "
            ),
            "{}",
            fd.evidence[0]
        );
        assert_eq!(
            fd.evidence[1],
            "listener 10.0.0.2:8080 in netns srv: accept queue 2 waiting, backlog 1 (the kernel \
             refuses when more than 1 wait), SYN queue 0 request sockets"
        );
        assert_eq!(
            fd.evidence.last().unwrap(),
            "TcpExt ListenOverflows 5 (+2 since kdrop's previous read), ListenDrops 5 (+2 since \
             kdrop's previous read), TCPReqQFullDrop 0 (+0 since kdrop's previous read), \
             TCPReqQFullDoCookies 0 (+0 since kdrop's previous read), SyncookiesSent 0 (+0 \
             since kdrop's previous read)"
        );
        // Ten seconds later, drained, with more refused in between.
        let later = counters(12, 12, 0, 0);
        let f = found(listener(8080, 0, 1, 0), later.clone());
        let again = Watched {
            found: &f,
            base: &now,
            moved: ListenMoved::between(&now, &later),
            over_ns: 10_049_000_000,
            again: true,
        };
        let fd = watched(&again).unwrap();
        assert!(
            fd.summary.contains("overflowed (now 0/1 waiting)"),
            "{}",
            fd.summary
        );
        assert!(fd.evidence[0].starts_with(
            "TcpExt +7 ListenOverflows, +7 ListenDrops since kdrop's previous record for this \
             listener, 10.0 s ago: "
        ));
        assert!(fd
            .evidence
            .last()
            .unwrap()
            .starts_with("TcpExt ListenOverflows 12 (+7 since kdrop's previous record)"));
    }

    #[test]
    fn a_full_syn_queue_without_cookies_and_with_them() {
        let (base, now) = (counters(0, 0, 0, 0), counters(0, 4, 4, 0));
        let f = found(listener(8080, 0, 4, 4), now.clone());
        let w = Watched {
            found: &f,
            base: &base,
            moved: ListenMoved::between(&base, &now),
            over_ns: 500_000_000,
            again: false,
        };
        let fd = watched(&w).unwrap();
        assert_eq!(fd.cause, "syn_queue_overflow");
        assert_eq!(
            fd.summary,
            "SYN queue of api (pid 812) on 10.0.0.2:8080 is full (4/4) and SYN cookies are off: \
             4 SYNs dropped in the last 0.5 s"
        );
        assert_eq!(
            fd.evidence[0],
            "TcpExt +4 ListenDrops, +4 TCPReqQFullDrop in the last 0.5 s"
        );
        assert_eq!(fd.evidence[2], "owner: api (pid 812): /srv/api --port 8080");
        assert!(fd.fix.is_empty());
        assert!(
            fd.fix_notes[0].starts_with("`ip netns exec srv sysctl -w net.ipv4.tcp_syncookies=1`")
        );
        assert_eq!(
            fd.inspect[0],
            "ip netns exec srv ss -tn state syn-recv 'sport = :8080'"
        );

        let cookies = counters(0, 0, 0, 1);
        let w = Watched {
            found: &f,
            base: &base,
            moved: ListenMoved::between(&base, &cookies),
            over_ns: 500_000_000,
            again: false,
        };
        let fd = watched(&w).unwrap();
        assert_eq!(fd.cause, "syn_cookies");
        assert!(fd
            .summary
            .contains("1 SYN answered with SYN cookies in the last 0.5 s"));
        // Only ListenDrops: no cause kdrop can name.
        let drops = ListenMoved {
            listen_drops: 1,
            ..ListenMoved::default()
        };
        let w = Watched { moved: drops, ..w };
        assert_eq!(watched(&w), None);
        assert_eq!(moved_text(&ListenMoved::default()), "no counter moved");
    }
}
