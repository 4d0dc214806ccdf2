//! A listener that could not take a connection: its accept queue full (the
//! application is not calling accept() fast enough), seen from the
//! listener's side. Either the client's SYN went unanswered (a SYN refused
//! by a full accept queue is freed with `consume_skb`, not `kfree_skb`:
//! `tcp_conn_request` counts ListenOverflows and drops it, v6.18
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_input.c), or
//! the final ACK was refused (`tcp_v4_syn_recv_sock` finds the queue full:
//! TCP_LISTEN_OVERFLOW,
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_ipv4.c).
//! Also the duplicate SYN a listener frees while the handshake's request
//! socket waits for its final ACK.
use super::fix_kinds::Kind;
use crate::model::cause::Cause;
use crate::model::{
    finding::{Finding, Fix},
    listen::{ListenCounters, ListenerFound, ProcessRef},
    packet::Tuple,
};

/// The kernel's default `net.core.somaxconn` since 5.4 (4096; 128 before):
/// what kdrop proposes when the backlog in force was capped below it.
pub const SOMAXCONN_DEFAULT: u32 = 4096;

/// How kdrop saw the connection fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The client's SYN went unanswered; the line says how often.
    Unanswered(String),
    /// The final ACK was dropped (TCP_LISTEN_OVERFLOW); the line names the
    /// kernel's reason and location.
    FinalAck(String),
    /// No packet seen: the namespace's counters moved (kdrop's listen
    /// watch); the line says by how much, over how long.
    Counters(String),
}

/// The processes as `comm (pid N)`, or what is known without them.
pub fn owner_text(owners: &[ProcessRef]) -> String {
    match owners {
        [] => "the listener".into(),
        [p] => format!("{} (pid {})", p.comm, p.pid),
        [p, rest @ ..] => format!("{} (pid {}, and {} more)", p.comm, p.pid, rest.len()),
    }
}

/// Did the counters grow since kdrop's previous read? Without one, a count
/// may be from long ago: it says nothing about this connection.
fn overflows_moved(f: &ListenerFound) -> bool {
    let now = f.counters.listen_overflows.unwrap_or(0);
    f.counters_before
        .as_ref()
        .and_then(|b| b.listen_overflows)
        .is_some_and(|before| now > before)
}

fn counter_text(name: &str, now: Option<u64>, before: Option<u64>, since: &str) -> Option<String> {
    let now = now?;
    Some(match before {
        Some(b) if now >= b => format!("{name} {now} (+{} {since})", now - b),
        _ => format!("{name} {now}"),
    })
}

/// The TcpExt counters of the listener's namespace, as evidence.
pub fn counters_line(now: &ListenCounters, before: Option<&ListenCounters>) -> String {
    counters_line_since(now, before, "since kdrop's previous read")
}

/// `counters_line` with the growth since `before` said as `since`.
pub fn counters_line_since(
    now: &ListenCounters,
    before: Option<&ListenCounters>,
    since: &str,
) -> String {
    let parts: Vec<String> = [
        (
            "ListenOverflows",
            now.listen_overflows,
            before.and_then(|b| b.listen_overflows),
        ),
        (
            "ListenDrops",
            now.listen_drops,
            before.and_then(|b| b.listen_drops),
        ),
        (
            "TCPReqQFullDrop",
            now.req_q_full_drop,
            before.and_then(|b| b.req_q_full_drop),
        ),
        (
            "TCPReqQFullDoCookies",
            now.req_q_full_do_cookies,
            before.and_then(|b| b.req_q_full_do_cookies),
        ),
        (
            "SyncookiesSent",
            now.syncookies_sent,
            before.and_then(|b| b.syncookies_sent),
        ),
    ]
    .into_iter()
    .filter_map(|(n, v, b)| counter_text(n, v, b, since))
    .collect();
    if parts.is_empty() {
        return "TcpExt counters unreadable".into();
    }
    format!("TcpExt {}", parts.join(", "))
}

/// How a listener's accept queue shows that it refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    /// Full now.
    Full,
    /// Room now, but the kernel refused (the final ACK's reason) or the
    /// overflow counter moved since the previous read.
    Overflowed,
}

/// The facts of `overflow`: whether, and how, the queue refused.
fn queue(f: &ListenerFound, seen: &Seen) -> Option<Queue> {
    if f.listener.accept_queue_full() {
        Some(Queue::Full)
    } else if matches!(seen, Seen::FinalAck(_)) || overflows_moved(f) {
        Some(Queue::Overflowed)
    } else {
        None
    }
}

/// The verdict for a connection `t` (client -> listener) that a listener
/// could not take, or None when the listener shows no overflow.
pub fn overflow(f: &ListenerFound, t: &Tuple, seen: &Seen) -> Option<Finding> {
    let queue = queue(f, seen)?;
    let l = &f.listener;
    let who = owner_text(&f.owners);
    let (q, b) = (l.accept_queue, l.accept_backlog);
    let summary = match queue {
        Queue::Full => format!(
            "accept queue of {who} on {} is full: {q}/{b} waiting; it is not calling accept() \
             fast enough",
            l.local
        ),
        Queue::Overflowed => format!(
            "accept queue of {who} on {} overflowed (now {q}/{b} waiting): it is not calling \
             accept() fast enough",
            l.local
        ),
    };
    let (fix, fix_notes) = repair(f, &who);
    let port = l.local.port();
    Some(Finding {
        cause: Cause::ListenOverflow,
        summary,
        evidence: overflow_evidence(f, t, seen),
        fix,
        fix_notes,
        inspect: vec![
            format!("{}ss -ltnp 'sport = :{port}'", f.exec),
            format!(
                "{}nstat -az TcpExtListenOverflows TcpExtListenDrops",
                f.exec
            ),
        ],
        ..Finding::default()
    })
}

/// What was seen of the connection, the listener and its owners, the
/// sysctls that size its queues, and its counters.
fn overflow_evidence(f: &ListenerFound, t: &Tuple, seen: &Seen) -> Vec<String> {
    let l = &f.listener;
    let (q, b) = (l.accept_queue, l.accept_backlog);
    let s = &f.sysctls;
    let opt = |v: Option<u32>| v.map_or("unreadable".into(), |v| v.to_string());
    let mut evidence = vec![match seen {
        Seen::Unanswered(line) => format!(
            "SYN {} -> {}: {line}; a SYN refused by a full accept queue is freed without a \
             drop reason (consume_skb in tcp_rcv_state_process): only the counters below show it",
            t.src, t.dst
        ),
        Seen::FinalAck(line) => format!(
            "{line}: the final ACK of {} -> {} completed the handshake, but the accept queue \
             had no room for the new connection",
            t.src, t.dst
        ),
        Seen::Counters(line) => format!(
            "{line}; a SYN refused by a full accept queue is freed without a drop reason \
             (consume_skb in tcp_rcv_state_process): only the counters below show it"
        ),
    }];
    evidence.push(format!(
        "listener {} in netns {}: accept queue {q} waiting, backlog {b} (the kernel refuses \
         when more than {b} wait), SYN queue {} request sockets",
        l.local, f.netns_name, l.syn_queue
    ));
    evidence.push(match f.owners.as_slice() {
        [] => format!(
            "no process found holding the socket (inode {}, uid {})",
            l.inode, l.uid
        ),
        owners => owners
            .iter()
            .map(|p| format!("owner: {} (pid {}): {}", p.comm, p.pid, p.cmdline))
            .collect::<Vec<_>>()
            .join("; "),
    });
    evidence.push(format!(
        "net.core.somaxconn = {}, net.ipv4.tcp_max_syn_backlog = {}, net.ipv4.tcp_syncookies \
         = {}",
        opt(s.somaxconn),
        opt(s.tcp_max_syn_backlog),
        opt(s.tcp_syncookies)
    ));
    evidence.push(counters_line(&f.counters, f.counters_before.as_ref()));
    evidence
}

/// The node can repair one case: the backlog in force is net.core.somaxconn
/// below the kernel's default, so listen() was capped (the kernel keeps
/// min(backlog, somaxconn), `__sys_listen`). Otherwise the application
/// chose its backlog, and only it can accept faster.
fn repair(f: &ListenerFound, who: &str) -> (Vec<Fix>, Vec<String>) {
    let b = f.listener.accept_backlog;
    match f.sysctls.somaxconn {
        Some(max) if b == max && max < SOMAXCONN_DEFAULT => (
            vec![Kind::Somaxconn.fix(format!(
                "{}sysctl -w net.core.somaxconn={SOMAXCONN_DEFAULT}",
                f.exec
            ))],
            vec![
                format!(
                    "the backlog in force ({b}) is net.core.somaxconn: {who} asked listen() \
                     for at least {b} and the kernel capped it"
                ),
                format!(
                    "the listener keeps its backlog of {b} until {who} calls listen() again: \
                     restart it after the sysctl"
                ),
                format!(
                    "a longer queue only absorbs bursts: if {who} accepts slower than clients \
                     connect, it fills again"
                ),
            ],
        ),
        // At the default, the application may have asked for more and been
        // capped: only its configuration says which.
        Some(max) if b == max => (
            Vec::new(),
            vec![format!(
                "the backlog in force ({b}) is net.core.somaxconn: {who} asked listen() for at \
                 least {b}; if its configuration asks for more, raise net.core.somaxconn to that \
                 (`{}sysctl -w net.core.somaxconn=<backlog>`) and restart it, else make it call \
                 accept() faster",
                f.exec
            )],
        ),
        somaxconn => (
            Vec::new(),
            vec![format!(
                "{who} asked listen() for a backlog of {b} (net.core.somaxconn is {}): make it \
                 call accept() faster, or raise the backlog in its own configuration and \
                 restart it; nothing on the node changes that",
                somaxconn.map_or("unreadable".into(), |v| v.to_string())
            )],
        ),
    }
}

/// A SYN freed at tcp_v4_rcv/tcp_v6_rcv with NOT_SPECIFIED: a request
/// socket for it exists (`tcp_check_req` answers a retransmitted SYN by
/// resending the SYN-ACK and the caller frees the SYN, v6.18
/// https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_minisocks.c).
/// `location` is where it was freed; `pending` whether sock_diag shows the
/// request socket now (None: not read).
pub fn duplicate_syn(t: &Tuple, location: &str, pending: Option<bool>) -> Finding {
    duplicate_syn_freed(t, location, pending, true)
}

/// `duplicate_syn` on a kernel that gives drops no reason (`reasons`
/// false): the same, said without one.
pub fn duplicate_syn_freed(
    t: &Tuple,
    location: &str,
    pending: Option<bool>,
    reasons: bool,
) -> Finding {
    let how = if reasons {
        "kernel drop reason NOT_SPECIFIED"
    } else {
        "freed (this kernel gives no drop reason)"
    };
    let mut evidence = vec![format!(
        "{how} at {location}: TCP's receive path frees a SYN that repeats one it is already \
         answering"
    )];
    match pending {
        Some(true) => evidence.push(format!(
            "sock_diag: a request socket {} <- {} waits in SYN-RECV for the final ACK",
            t.dst, t.src
        )),
        Some(false) => evidence.push(format!(
            "sock_diag: no request socket {} <- {} is left now (the handshake completed or \
             timed out since)",
            t.dst, t.src
        )),
        None => {}
    }
    Finding {
        cause: Cause::DuplicateSyn,
        summary: format!(
            "SYN {} -> {} repeated while the server's SYN-ACK for it was outstanding: the \
             server resent its SYN-ACK, so the SYN-ACK or the client's final ACK is being lost \
             on the way",
            t.src, t.dst
        ),
        evidence,
        fix_notes: vec![format!(
            "look for what drops the SYN-ACK towards {} or the final ACK towards {} (kdrop \
             reports those drops in this handshake when it sees them)",
            t.src.ip(),
            t.dst
        )],
        ..Finding::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::listen::{ListenSysctls, Listener};

    fn found(q: u32, b: u32, somaxconn: u32, before: Option<u64>, now: u64) -> ListenerFound {
        ListenerFound {
            netns: 9,
            netns_name: "srv".into(),
            exec: "ip netns exec srv ".into(),
            listener: Listener {
                local: "0.0.0.0:3306".parse().unwrap(),
                bound_if: 0,
                accept_queue: q,
                accept_backlog: b,
                syn_queue: 0,
                inode: 4242,
                uid: 0,
            },
            sysctls: ListenSysctls {
                somaxconn: Some(somaxconn),
                tcp_max_syn_backlog: Some(512),
                tcp_syncookies: Some(1),
            },
            counters: ListenCounters {
                listen_overflows: Some(now),
                listen_drops: Some(now),
                ..ListenCounters::default()
            },
            counters_before: before.map(|b| ListenCounters {
                listen_overflows: Some(b),
                listen_drops: Some(b),
                ..ListenCounters::default()
            }),
            owners: vec![ProcessRef {
                pid: 812,
                comm: "mysqld".into(),
                cmdline: "/usr/sbin/mysqld --port 3306".into(),
            }],
        }
    }

    fn t() -> Tuple {
        Tuple {
            src: "10.0.0.1:41000".parse().unwrap(),
            dst: "10.0.0.2:3306".parse().unwrap(),
        }
    }

    #[test]
    fn a_full_queue_the_app_chose_is_a_note_not_a_fix() {
        let f = found(2, 1, 4096, Some(3), 7);
        let seen = Seen::Unanswered("3 transmissions over 3.0s, none answered".into());
        let fd = overflow(&f, &t(), &seen).unwrap();
        assert_eq!(fd.cause, "listen_overflow");
        assert_eq!(
            fd.summary,
            "accept queue of mysqld (pid 812) on 0.0.0.0:3306 is full: 2/1 waiting; it is not \
             calling accept() fast enough"
        );
        assert!(fd.evidence[0].starts_with(
            "SYN 10.0.0.1:41000 -> 10.0.0.2:3306: 3 transmissions over 3.0s, none answered; "
        ));
        assert_eq!(
            fd.evidence[1],
            "listener 0.0.0.0:3306 in netns srv: accept queue 2 waiting, backlog 1 (the kernel \
             refuses when more than 1 wait), SYN queue 0 request sockets"
        );
        assert_eq!(
            fd.evidence[2],
            "owner: mysqld (pid 812): /usr/sbin/mysqld --port 3306"
        );
        assert_eq!(
            fd.evidence[4],
            "TcpExt ListenOverflows 7 (+4 since kdrop's previous read), ListenDrops 7 (+4 \
             since kdrop's previous read)"
        );
        assert!(fd.fix.is_empty());
        assert!(fd.fix_notes[0].starts_with(
            "mysqld (pid 812) asked listen() for a backlog of 1 (net.core.somaxconn is 4096)"
        ));
        assert_eq!(fd.inspect[0], "ip netns exec srv ss -ltnp 'sport = :3306'");
    }

    #[test]
    fn a_backlog_capped_by_somaxconn_is_repaired_by_the_sysctl() {
        let f = found(2, 1, 1, None, 2);
        let seen =
            Seen::FinalAck("kernel drop reason TCP_LISTEN_OVERFLOW at tcp_check_req+0x1".into());
        let fd = overflow(&f, &t(), &seen).unwrap();
        assert_eq!(
            fd.fix,
            vec!["ip netns exec srv sysctl -w net.core.somaxconn=4096".to_string()]
        );
        assert!(fd.fix_notes[1].contains("until mysqld (pid 812) calls listen() again"));
        assert_eq!(fd.evidence[4], "TcpExt ListenOverflows 2, ListenDrops 2");
    }

    #[test]
    fn the_queue_is_full_or_overflowed_since_the_last_read() {
        let seen = Seen::Unanswered("x".into());
        assert_eq!(
            queue(&found(129, 128, 4096, None, 0), &seen),
            Some(Queue::Full)
        );
        assert_eq!(
            queue(&found(0, 128, 4096, Some(5), 6), &seen),
            Some(Queue::Overflowed)
        );
        assert_eq!(queue(&found(0, 128, 4096, Some(5), 5), &seen), None);
    }

    #[test]
    fn a_listener_with_room_and_quiet_counters_is_not_the_cause() {
        let seen = Seen::Unanswered("x".into());
        assert_eq!(
            overflow(&found(0, 128, 4096, Some(5), 5), &t(), &seen),
            None
        );
        assert_eq!(overflow(&found(0, 128, 4096, None, 0), &t(), &seen), None);
        // Counted before kdrop first looked: not this connection's.
        assert_eq!(overflow(&found(0, 128, 4096, None, 9), &t(), &seen), None);
        // Room now, but it overflowed since the previous read.
        let fd = overflow(&found(0, 128, 4096, Some(5), 6), &t(), &seen).unwrap();
        assert!(
            fd.summary.contains("overflowed (now 0/128 waiting)"),
            "{}",
            fd.summary
        );
        // The kernel said so for the final ACK: a verdict whatever the queue is now.
        let fin = Seen::FinalAck("kernel drop reason TCP_LISTEN_OVERFLOW".into());
        assert!(overflow(&found(0, 128, 4096, Some(5), 5), &t(), &fin).is_some());
    }

    #[test]
    fn owners_and_counters_read_well() {
        assert_eq!(owner_text(&[]), "the listener");
        let mut f = found(3, 2, 4096, None, 1);
        f.owners.push(f.owners[0].clone());
        assert_eq!(owner_text(&f.owners), "mysqld (pid 812, and 1 more)");
        assert_eq!(
            counters_line(&ListenCounters::default(), None),
            "TcpExt counters unreadable"
        );
        f.owners.clear();
        let fd = overflow(&f, &t(), &Seen::Unanswered("x".into())).unwrap();
        assert!(fd.summary.starts_with("accept queue of the listener on"));
        assert_eq!(
            fd.evidence[2],
            "no process found holding the socket (inode 4242, uid 0)"
        );
    }

    #[test]
    fn a_duplicate_syn_names_the_lost_answer() {
        let f = duplicate_syn(&t(), "tcp_v4_rcv+0x1a", Some(true));
        assert_eq!(f.cause, "duplicate_syn");
        assert_eq!(
            f.evidence[1],
            "sock_diag: a request socket 10.0.0.2:3306 <- 10.0.0.1:41000 waits in SYN-RECV for \
             the final ACK"
        );
        assert!(f.fix.is_empty());
    }

    /// A backlog below somaxconn is what the application asked for: a
    /// lowered somaxconn did not cap it, so raising it changes nothing.
    #[test]
    fn a_backlog_below_a_lowered_somaxconn_is_the_applications_choice() {
        let fd = overflow(
            &found(129, 128, 1024, None, 1),
            &t(),
            &Seen::Unanswered("x".into()),
        )
        .unwrap();
        assert!(fd.fix.is_empty());
        assert_eq!(
            fd.fix_notes,
            vec![
                "mysqld (pid 812) asked listen() for a backlog of 128 (net.core.somaxconn is \
                 1024): make it call accept() faster, or raise the backlog in its own \
                 configuration and restart it; nothing on the node changes that"
                    .to_string()
            ]
        );
    }

    /// Capped at the default already: setting somaxconn to the default
    /// would change nothing, so it is not offered as a fix.
    #[test]
    fn a_backlog_capped_at_the_default_somaxconn_gets_no_sysctl_fix() {
        let fd = overflow(
            &found(4097, 4096, SOMAXCONN_DEFAULT, None, 1),
            &t(),
            &Seen::Unanswered("x".into()),
        )
        .unwrap();
        assert!(fd.fix.is_empty());
        // The application may have asked for more than the default cap.
        assert_eq!(
            fd.fix_notes,
            ["the backlog in force (4096) is net.core.somaxconn: mysqld (pid 812) asked listen() \
              for at least 4096; if its configuration asks for more, raise net.core.somaxconn to \
              that (`ip netns exec srv sysctl -w net.core.somaxconn=<backlog>`) and restart it, \
              else make it call accept() faster"]
        );
    }

    #[test]
    fn a_duplicate_syn_says_which_answer_to_look_for() {
        let f = duplicate_syn(&t(), "tcp_v4_rcv+0x1a", None);
        let no_reasons = duplicate_syn_freed(&t(), "tcp_v4_rcv+0x62", Some(true), false);
        assert_eq!(no_reasons.cause, "duplicate_syn");
        assert_eq!(
            no_reasons.evidence[0],
            "freed (this kernel gives no drop reason) at tcp_v4_rcv+0x62: TCP's receive path \
             frees a SYN that repeats one it is already answering"
        );
        assert_eq!(
            f.summary,
            "SYN 10.0.0.1:41000 -> 10.0.0.2:3306 repeated while the server's SYN-ACK for it was \
             outstanding: the server resent its SYN-ACK, so the SYN-ACK or the client's final \
             ACK is being lost on the way"
        );
        assert_eq!(
            f.evidence,
            vec![
                "kernel drop reason NOT_SPECIFIED at tcp_v4_rcv+0x1a: TCP's receive path frees a \
                 SYN that repeats one it is already answering"
                    .to_string()
            ]
        );
        assert_eq!(
            f.fix_notes,
            vec![
                "look for what drops the SYN-ACK towards 10.0.0.1 or the final ACK towards \
                 10.0.0.2:3306 (kdrop reports those drops in this handshake when it sees them)"
                    .to_string()
            ]
        );
        assert!(f.fix.is_empty());
        assert!(f.inspect.is_empty());
    }

    /// A counter below its previous read (the namespace was made again)
    /// shows its value, no negative growth.
    #[test]
    fn counters_that_went_back_show_their_value_only() {
        let c = |o, d| ListenCounters {
            listen_overflows: o,
            listen_drops: d,
            ..ListenCounters::default()
        };
        assert_eq!(
            counters_line(&c(Some(3), Some(7)), Some(&c(Some(5), Some(7)))),
            "TcpExt ListenOverflows 3, ListenDrops 7 (+0 since kdrop's previous read)"
        );
        assert_eq!(
            counters_line(&c(None, None), None),
            "TcpExt counters unreadable"
        );
    }
}
