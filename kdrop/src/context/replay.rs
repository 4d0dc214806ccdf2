//! A [`Node`] that answers from a bundle: each question gets the answer the
//! live node gave it last (the recording's `answer` lines, applied in
//! order before the event that asked). No I/O beyond the bundle, no
//! privileges. A question the recording never asked answers as a node
//! that does not know (None), and is counted.
use std::{collections::HashMap, sync::Arc};

use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Value};

use super::{
    questions::{key, plain_questions},
    tape::Line,
    Node,
};
use crate::diagnosis::kube::Services;
use crate::model::{netfilter::Snapshot, routing::NetnsContext};

#[derive(Default)]
pub struct Replay {
    answers: HashMap<String, Value>,
    blobs: HashMap<u64, Value>,
    contexts: HashMap<u64, Arc<NetnsContext>>,
    snapshots: HashMap<u64, Arc<Snapshot>>,
    kube: HashMap<u64, Arc<Services>>,
    /// Questions the bundle has no answer to (a newer kdrop asking more).
    pub unanswered: u64,
}

impl Replay {
    /// Takes an `answer` or `blob` line; other lines are not the node's.
    pub fn apply(&mut self, line: &Line) {
        match line {
            Line::Answer { q, a } => {
                self.answers.insert(q.clone(), a.clone());
            }
            Line::Blob { id, v } => {
                self.blobs.insert(*id, v.clone());
            }
            _ => {}
        }
    }

    /// The fake node's side: `q`'s answer is `a`, as if recorded.
    #[cfg(test)]
    pub fn set<A: serde::Serialize>(&mut self, q: super::questions::Asked<A>, a: A) {
        let a = serde_json::to_value(a).expect("an answer serialises");
        self.apply(&Line::Answer {
            q: q.key.to_string(),
            a,
        });
    }

    /// The fake node's netfilter readings around a drop in `netns` at
    /// `ts_ns`, as if recorded (blob ids from 1000 up).
    #[cfg(test)]
    pub fn set_netfilter_around(
        &mut self,
        netns: u32,
        ts_ns: u64,
        before: Option<Snapshot>,
        after: Snapshot,
    ) {
        let mut id = |s: Snapshot| {
            let id = 1000 + self.blobs.len() as u64;
            let v = serde_json::to_value(s).expect("a snapshot serialises");
            self.apply(&Line::Blob { id, v });
            id
        };
        let ids = [before.map(&mut id), Some(id(after))];
        self.apply(&Line::Answer {
            q: json!(["netfilter_around", netns, ts_ns]).to_string(),
            a: json!(ids),
        });
    }

    fn answer<A: DeserializeOwned>(&mut self, q: Value) -> Option<A> {
        let q = q.to_string();
        let Some(a) = self.answers.get(&q) else {
            log::debug!("the bundle has no answer to {q}");
            self.unanswered += 1;
            return None;
        };
        serde_json::from_value(a.clone())
            .map_err(|e| log::warn!("the bundle's answer to {q}: {e}"))
            .ok()
    }

    fn typed<T: DeserializeOwned + Serialize>(
        blobs: &HashMap<u64, Value>,
        cache: &mut HashMap<u64, Arc<T>>,
        id: u64,
    ) -> Option<Arc<T>> {
        if let Some(v) = cache.get(&id) {
            return Some(v.clone());
        }
        let v: T = serde_json::from_value(blobs.get(&id)?.clone())
            .map_err(|e| log::warn!("the bundle's blob {id}: {e}"))
            .ok()?;
        let v = Arc::new(v);
        cache.insert(id, v.clone());
        Some(v)
    }

    fn ids(&mut self, q: Value) -> Option<Vec<Option<u64>>> {
        self.answer(q)
    }

    fn snapshot(&mut self, id: Option<u64>) -> Option<Arc<Snapshot>> {
        Self::typed(&self.blobs, &mut self.snapshots, id?)
    }
}

/// A plain question: the bundle's answer under its key, else what a
/// node that does not know answers.
macro_rules! replay_plain {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $unknown:expr;)*) => {
        $(
            fn $name(&mut self, $($arg: $ty),*) -> $ret {
                self.answer::<$ret>(key!($name $(, $arg)*))
                    .unwrap_or_else(|| $unknown)
            }
        )*
    };
}

impl Node for Replay {
    plain_questions!(replay_plain);

    fn routing(&mut self, netns: u32) -> Option<Arc<NetnsContext>> {
        let id = self.ids(json!(["routing", netns]))?.first().copied()??;
        Self::typed(&self.blobs, &mut self.contexts, id)
    }

    fn netfilter_around(
        &mut self,
        netns: u32,
        ts_ns: u64,
    ) -> Option<(Option<Arc<Snapshot>>, Arc<Snapshot>)> {
        let ids = self.ids(json!(["netfilter_around", netns, ts_ns]))?;
        let before = self.snapshot(ids.first().copied().flatten());
        let after = self.snapshot(ids.get(1).copied().flatten())?;
        Some((before, after))
    }

    fn netfilter_latest(&mut self, netns: u32) -> Option<Arc<Snapshot>> {
        let id = self
            .ids(json!(["netfilter_latest", netns]))?
            .first()
            .copied()??;
        self.snapshot(Some(id))
    }

    fn kube(&mut self, netns: u32) -> Option<Arc<Services>> {
        let id = self.ids(json!(["kube", netns]))?.first().copied()??;
        Self::typed(&self.blobs, &mut self.kube, id)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use super::*;
    use crate::context::recording::Recorder;
    use crate::context::{conntrack_lookup::Side, NetnsName};
    use crate::model::{
        listen::{ListenCounters, ListenerFound},
        neighbour::Neighbour,
        packet::{CtSeen, Tuple},
        pod::{Labels, Pod, PodId},
        progs::{CgroupProgs, HookProgs},
        routing::{RouteLookup, RouteQuery},
    };

    /// A node with fixed answers.
    struct Fixed;

    impl Node for Fixed {
        fn netns(&mut self, inode: u32) -> Option<NetnsName> {
            Some(NetnsName {
                inode,
                name: Some("lab".into()),
            })
        }
        fn ifname(&mut self, _: u32, ifindex: u32) -> String {
            format!("eth{ifindex}")
        }
        fn routing(&mut self, _: u32) -> Option<Arc<NetnsContext>> {
            Some(Arc::new(NetnsContext::default()))
        }
        fn netfilter_around(
            &mut self,
            _: u32,
            ts: u64,
        ) -> Option<(Option<Arc<Snapshot>>, Arc<Snapshot>)> {
            let s = Arc::new(Snapshot {
                started_ns: 1,
                finished_ns: 2,
                ..Default::default()
            });
            Some((
                None,
                Arc::new(Snapshot {
                    started_ns: ts,
                    ..(*s).clone()
                }),
            ))
        }
        fn netfilter_latest(&mut self, _: u32) -> Option<Arc<Snapshot>> {
            None
        }
        fn reply_holder(&mut self, _: u32, _: &Tuple) -> Option<String> {
            None
        }
        fn reverse_route(
            &mut self,
            _: u32,
            _: Ipv4Addr,
            _: Ipv4Addr,
            _: u32,
            _: bool,
        ) -> Option<(RouteQuery, RouteLookup)> {
            None
        }
        fn route_get(&mut self, _: u32, _: &RouteQuery) -> Option<RouteLookup> {
            None
        }
        fn neighbour(&mut self, _: u32, _: u32, _: IpAddr) -> Option<Neighbour> {
            None
        }
        fn neighbours_with(
            &mut self,
            _: u32,
            ifindex: u32,
            lladdr: [u8; 6],
        ) -> Option<Vec<Neighbour>> {
            Some(vec![Neighbour {
                dst: "10.231.2.1".parse().unwrap(),
                ifindex,
                dev: format!("eth{ifindex}"),
                state: crate::model::neighbour::NUD_STALE,
                lladdr: Some(crate::model::packet::mac_text(&lladdr)),
                router: false,
                probes: None,
            }])
        }
        fn route_out(&mut self, _: u32, _: IpAddr) -> Option<u32> {
            Some(3)
        }
        fn conntrack_find(&mut self, _: Side, _: &Tuple, _: Option<u32>) -> Option<CtSeen> {
            None
        }
        fn conntrack_from(&mut self, _: u32, _: SocketAddr) -> Vec<CtSeen> {
            Vec::new()
        }
        fn waiting_for(&mut self, _: u32, _: SocketAddr) -> Option<SocketAddr> {
            None
        }
        fn br_netfilter_loaded(&mut self) -> bool {
            true
        }
        fn symbol(&mut self, addr: u64) -> Option<String> {
            Some(format!("f+{addr:#x}"))
        }
        fn pod(&mut self, _: u32) -> Option<Pod> {
            None
        }
        fn pod_of_addr(&mut self, _: IpAddr) -> Option<Pod> {
            None
        }
        fn service(&mut self, _: u32, _: SocketAddr) -> Option<String> {
            None
        }
        fn kube(&mut self, _: u32) -> Option<Arc<Services>> {
            None
        }
        fn pod_labels(&mut self, _: &PodId) -> Result<Labels, String> {
            Ok([("app".to_string(), "db".to_string())].into())
        }
        fn listener(&mut self, _: u32, _: SocketAddr) -> Option<ListenerFound> {
            None
        }
        fn request_pending(&mut self, _: u32, _: SocketAddr, _: SocketAddr) -> Option<bool> {
            None
        }
        fn listen_spaces(&mut self, _: &[u16]) -> Vec<u32> {
            vec![7]
        }
        fn listen_counters(&mut self, _: u32) -> Option<ListenCounters> {
            None
        }
        fn listeners_of(&mut self, _: u32, _: &[u16]) -> Vec<ListenerFound> {
            Vec::new()
        }
        fn hook_programs(&mut self, _: u32, _: u32, _: &str) -> Option<HookProgs> {
            None
        }
        fn cgroup_programs(&mut self, _: u32, _: SocketAddr, _: &str) -> Option<CgroupProgs> {
            None
        }
    }

    #[test]
    fn replays_what_was_recorded_once() {
        let mut rec = Recorder::new(Fixed, true);
        assert_eq!(rec.ifname(7, 2), "eth2");
        assert_eq!(rec.ifname(7, 2), "eth2");
        rec.routing(7);
        rec.routing(7);
        rec.netfilter_around(7, 100);
        rec.netfilter_around(7, 200);
        assert!(rec.br_netfilter_loaded());
        rec.symbol(0x10);
        let mac = [2, 0, 0, 0, 0xe7, 3];
        let asked = rec.neighbours_with(7, 2, mac);
        let db = PodId::Named {
            namespace: "data".into(),
            name: "db-0".into(),
        };
        let labels = rec.pod_labels(&db);
        assert_eq!(rec.pod_labels(&db), labels);
        let lines = rec.take_lines();
        // Same answer twice: one line. One blob per distinct snapshot.
        let answers = lines
            .iter()
            .filter(|l| matches!(l, Line::Answer { .. }))
            .count();
        let blobs = lines
            .iter()
            .filter(|l| matches!(l, Line::Blob { .. }))
            .count();
        assert_eq!((answers, blobs), (8, 3));
        let mut replay = Replay::default();
        for l in &lines {
            replay.apply(l);
        }
        assert_eq!(replay.ifname(7, 2), "eth2");
        assert_eq!(replay.ifname(7, 3), "if3", "never asked");
        assert_eq!(replay.netns(7), None, "never asked");
        assert_eq!(replay.routing(7), Some(Arc::new(NetnsContext::default())));
        let (before, after) = replay.netfilter_around(7, 200).unwrap();
        assert!(before.is_none());
        assert_eq!(after.started_ns, 200);
        assert!(replay.br_netfilter_loaded());
        assert_eq!(replay.symbol(0x10).as_deref(), Some("f+0x10"));
        assert_eq!(replay.neighbours_with(7, 2, mac), asked);
        assert_eq!(replay.neighbours_with(7, 3, mac), None, "never asked");
        assert_eq!(replay.pod_labels(&db), labels);
        assert!(
            replay.pod_labels(&PodId::Uid("u".into())).is_err(),
            "never asked"
        );
        assert_eq!(replay.unanswered, 4);
    }
}
