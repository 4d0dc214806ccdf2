//! The listen watch: a SYN refused by a full accept or SYN queue leaves no
//! drop event (`consume_skb`), only the namespace's TcpExt counters. Polled
//! from the session's tick, it reads those counters (one file per
//! namespace) and, only when they move, the namespace's listeners; a
//! listener they blame gets a record of kind `listen_overflow`, at most
//! one per `REPEAT_NS` while it keeps refusing. Pay per anomaly: no probe.
//! Everything is asked of the node and the clock is the caller's, so a
//! replay takes the same steps.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use super::Enricher;
use crate::{
    context::Node,
    diagnosis::{
        listen_watch::{blamed, watched, Watched},
        names,
    },
    model::{
        listen::{ListenCounters, ListenMoved, ListenerFound},
        pod::ConnPods,
        record::DropRecord,
    },
};

/// How often the counters are read.
pub const POLL_NS: u64 = 500_000_000;
/// How often the namespaces to watch are looked for again (without
/// `--netns`): one sock_diag dump per namespace.
pub const SPACES_NS: u64 = 5_000_000_000;
/// At most one record per listener this often while it keeps refusing.
pub const REPEAT_NS: u64 = 10_000_000_000;

/// What the watch counted for one listener since its last record.
#[derive(Clone, Debug)]
struct Pending {
    moved: ListenMoved,
    /// The counters and the time when the period began.
    base: ListenCounters,
    since: u64,
    last_record: Option<u64>,
}

/// Refusals the watch counted, for monitor's metrics: the namespace's
/// growth, under the listener it blames (`port` None: it could not tell
/// which).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusals {
    pub netns: u32,
    pub port: Option<u16>,
    pub moved: ListenMoved,
}

/// The watch's state; the session (and a replay) keeps one.
#[derive(Debug)]
pub struct ListenWatch {
    /// `--netns` (0: kdrop's own and every namespace with a listener on
    /// `ports`).
    netns: u32,
    ports: Vec<u16>,
    spaces: Vec<u32>,
    spaces_at: Option<u64>,
    last_poll: Option<u64>,
    counters: HashMap<u32, (u64, ListenCounters)>,
    pending: HashMap<(u32, SocketAddr), Pending>,
}

impl ListenWatch {
    pub fn new(netns: u32, ports: &[u16]) -> Self {
        Self {
            netns,
            ports: ports.to_vec(),
            spaces: Vec::new(),
            spaces_at: None,
            last_poll: None,
            counters: HashMap::new(),
            pending: HashMap::new(),
        }
    }

    /// What it watches: `--netns` (0: all) and the ports, as a tape keeps them.
    pub fn config(&self) -> (u32, Vec<u16>) {
        (self.netns, self.ports.clone())
    }

    /// Is a poll due at `now`?
    pub fn due(&self, now: u64) -> bool {
        self.last_poll
            .is_none_or(|t| now >= t.saturating_add(POLL_NS))
    }
}

impl<N: Node> Enricher<N> {
    /// One poll of the watch at `now` (CLOCK_MONOTONIC ns, the caller's):
    /// the records due and the refusals counted.
    pub fn watch_listeners(
        &mut self,
        w: &mut ListenWatch,
        now: u64,
    ) -> (Vec<DropRecord>, Vec<Refusals>) {
        w.last_poll = Some(now);
        if w.netns != 0 {
            w.spaces = vec![w.netns];
        } else if w
            .spaces_at
            .is_none_or(|t| now >= t.saturating_add(SPACES_NS))
        {
            w.spaces = self.node.listen_spaces(&w.ports);
            w.spaces_at = Some(now);
            w.counters.retain(|ns, _| w.spaces.contains(ns));
        }
        let mut refusals = Vec::new();
        let mut found: HashMap<u32, Vec<ListenerFound>> = HashMap::new();
        for ns in w.spaces.clone() {
            let Some(c) = self.node.listen_counters(ns) else {
                continue;
            };
            let Some((at, prev)) = w.counters.insert(ns, (now, c.clone())) else {
                continue;
            };
            let moved = ListenMoved::between(&prev, &c);
            if !moved.any() {
                continue;
            }
            let ls = self.node.listeners_of(ns, &w.ports);
            let listeners: Vec<_> = ls.iter().map(|f| f.listener.clone()).collect();
            let who = blamed(&listeners, &moved);
            refusals.push(Refusals {
                netns: ns,
                port: match who.as_slice() {
                    [one] => Some(listeners[*one].local.port()),
                    _ => None,
                },
                moved,
            });
            for i in who {
                let p = w
                    .pending
                    .entry((ns, listeners[i].local))
                    .or_insert(Pending {
                        moved: ListenMoved::default(),
                        base: prev.clone(),
                        since: at,
                        last_record: None,
                    });
                p.moved.add(&moved);
            }
            found.insert(ns, ls);
        }
        let mut records = Vec::new();
        let mut keys: Vec<(u32, SocketAddr)> = w.pending.keys().copied().collect();
        keys.sort();
        for key in keys {
            let p = w.pending[&key].clone();
            if p.last_record
                .is_some_and(|t| now < t.saturating_add(REPEAT_NS))
            {
                continue;
            }
            if !p.moved.any() {
                // Quiet for a whole period: forgotten.
                w.pending.remove(&key);
                continue;
            }
            let (ns, local) = key;
            let Some(c) = w.counters.get(&ns).map(|(_, c)| c.clone()) else {
                w.pending.remove(&key);
                continue;
            };
            let ls = found
                .entry(ns)
                .or_insert_with(|| self.node.listeners_of(ns, &w.ports));
            let Some(mut f) = ls.iter().find(|f| f.listener.local == local).cloned() else {
                // The listener is gone.
                w.pending.remove(&key);
                continue;
            };
            f.counters = c.clone();
            let finding = watched(&Watched {
                found: &f,
                base: &p.base,
                moved: p.moved,
                over_ns: now.saturating_sub(p.since),
                again: p.last_record.is_some(),
            });
            w.pending.insert(
                key,
                Pending {
                    moved: ListenMoved::default(),
                    base: c,
                    since: now,
                    last_record: Some(now),
                },
            );
            if let Some(finding) = finding {
                records.push(self.listen_record(&f, finding, now));
            }
        }
        (records, refusals)
    }

    fn listen_record(
        &mut self,
        f: &ListenerFound,
        finding: crate::model::finding::Finding,
        now: u64,
    ) -> DropRecord {
        let ns = self.netns_name(f.netns);
        let local = f.listener.local;
        // The client is unknown: its address is the unspecified one.
        let any: IpAddr = if local.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let mut r = DropRecord {
            packet: None,
            ts: self.ts(now),
            kind: "listen_overflow",
            netns: f.netns,
            netns_name: ns.name,
            pods: ConnPods::default(),
            ifname: String::new(),
            ifindex: 0,
            family: if local.is_ipv4() { "ipv4" } else { "ipv6" },
            saddr: any,
            sport: 0,
            daddr: local.ip(),
            dport: local.port(),
            tcp_flags: "SYN".into(),
            reason: None,
            location: String::new(),
            mark: 0,
            route_lookups: Vec::new(),
            ct: None,
            netfilter: None,
            network_policy: None,
            handshake: None,
            finding: Some(Arc::new(finding)),
        };
        r.pods.pod = self.node.pod(f.netns);
        if let Some(fd) = r.finding.as_mut() {
            names::name_pods(fd, &r.pods);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        context::{questions::asked, replay::Replay, NetnsName},
        enrich::Facts,
        model::listen::{ListenSysctls, Listener},
    };

    fn enricher() -> Enricher<Replay> {
        Enricher::new(
            Replay::default(),
            Facts {
                reasons: Default::default(),
                ct_names: Default::default(),
                nf_rungs: HashMap::new(),
                realtime_offset_ns: 0,
            },
        )
    }

    fn overflows(e: &mut Enricher<Replay>, n: u64) {
        let c = ListenCounters {
            listen_overflows: Some(n),
            listen_drops: Some(n),
            ..ListenCounters::default()
        };
        e.node.set(asked::listen_counters(9), Some(c));
    }

    fn listening(e: &mut Enricher<Replay>, q: u32) {
        let f = ListenerFound {
            netns: 9,
            netns_name: "srv".into(),
            exec: "ip netns exec srv ".into(),
            listener: Listener {
                local: "10.0.0.2:8080".parse().unwrap(),
                bound_if: 0,
                accept_queue: q,
                accept_backlog: 1,
                syn_queue: 0,
                inode: 1,
                uid: 0,
            },
            sysctls: ListenSysctls::default(),
            counters: ListenCounters::default(),
            counters_before: None,
            owners: Vec::new(),
        };
        e.node.set(asked::listeners_of(9, &[8080]), vec![f]);
        e.node.set(
            asked::netns(9),
            Some(NetnsName {
                inode: 9,
                name: Some("srv".into()),
            }),
        );
        e.node.set(asked::pod(9), None);
    }

    /// The first read is a baseline; a move makes one record at once;
    /// more moves within REPEAT_NS wait and are counted into the next.
    #[test]
    fn one_record_per_listener_per_period_with_the_refusals_between() {
        let mut e = enricher();
        let mut w = ListenWatch::new(9, &[8080]);
        overflows(&mut e, 5);
        listening(&mut e, 2);
        assert!(w.due(0));
        let (r, n) = e.watch_listeners(&mut w, 0);
        assert!(r.is_empty() && n.is_empty());
        assert!(!w.due(POLL_NS - 1) && w.due(POLL_NS));

        overflows(&mut e, 7);
        let (r, n) = e.watch_listeners(&mut w, POLL_NS);
        assert_eq!(r.len(), 1);
        assert_eq!(n.len(), 1);
        assert_eq!((n[0].port, n[0].moved.listen_overflows), (Some(8080), 2));
        let rec = &r[0];
        assert_eq!(rec.kind, "listen_overflow");
        assert_eq!(rec.dst(), "10.0.0.2:8080");
        assert_eq!(
            (rec.src(), rec.netns_name.as_deref()),
            ("0.0.0.0:0".into(), Some("srv"))
        );
        let f = rec.finding.as_ref().unwrap();
        assert_eq!(f.cause, "listen_overflow");
        assert!(f.evidence[0]
            .starts_with("TcpExt +2 ListenOverflows, +2 ListenDrops in the last 0.5 s"));

        // Still refusing: counted, not reported, until REPEAT_NS has passed.
        overflows(&mut e, 10);
        let (r, n) = e.watch_listeners(&mut w, 2 * POLL_NS);
        assert!(r.is_empty());
        assert_eq!(n[0].moved.listen_overflows, 3);
        overflows(&mut e, 11);
        listening(&mut e, 0);
        let (r, _) = e.watch_listeners(&mut w, POLL_NS + REPEAT_NS);
        let f = r[0].finding.as_ref().unwrap();
        assert!(
            f.evidence[0].starts_with(
                "TcpExt +4 ListenOverflows, +4 ListenDrops since kdrop's previous record for \
                 this listener, 10.0 s ago"
            ),
            "{}",
            f.evidence[0]
        );
        assert!(f.summary.contains("overflowed (now 0/1 waiting)"));
        // Quiet for a whole period: nothing more, and forgotten.
        let (r, n) = e.watch_listeners(&mut w, POLL_NS + 2 * REPEAT_NS);
        assert!(r.is_empty() && n.is_empty());
        assert!(w.pending.is_empty());
        assert_eq!(e.node.unanswered, 0);
    }

    /// Without --netns: the namespaces come from the node, again every
    /// SPACES_NS.
    #[test]
    fn namespaces_are_looked_for_again() {
        let mut e = enricher();
        let mut w = ListenWatch::new(0, &[8080]);
        e.node.set(asked::listen_spaces(&[8080]), vec![1]);
        e.node
            .set(asked::listen_counters(1), Some(ListenCounters::default()));
        e.watch_listeners(&mut w, 0);
        assert_eq!(w.spaces, vec![1]);
        e.node.set(asked::listen_spaces(&[8080]), vec![1, 9]);
        overflows(&mut e, 5);
        e.watch_listeners(&mut w, POLL_NS);
        assert_eq!(w.spaces, vec![1]);
        e.watch_listeners(&mut w, SPACES_NS);
        assert_eq!(w.spaces, vec![1, 9]);
        assert!(w.counters.contains_key(&9));
    }
}
