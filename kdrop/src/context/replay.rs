//! A [`Node`] that answers from a bundle: each question gets the answer the
//! live node gave it last (the recording's `answer` lines, applied in
//! order before the event that asked). No I/O beyond the bundle, no
//! privileges. A question the recording never asked answers as a node
//! that does not know (None), and is counted.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Value};

use super::{conntrack_lookup::Side, tape::Line, NetnsName, Node};
use crate::diagnosis::kube::Services;
use crate::model::{
    listen::{ListenCounters, ListenerFound},
    neighbour::Neighbour,
    netfilter::Snapshot,
    packet::{CtSeen, Tuple},
    pod::{Labels, Pod, PodId},
    progs::{CgroupProgs, HookProgs},
    routing::{NetnsContext, RouteLookup, RouteQuery},
};

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

impl Node for Replay {
    fn netns(&mut self, inode: u32) -> Option<NetnsName> {
        self.answer::<Option<NetnsName>>(json!(["netns", inode]))
            .flatten()
    }

    fn ifname(&mut self, netns: u32, ifindex: u32) -> String {
        self.answer(json!(["ifname", netns, ifindex]))
            .unwrap_or_else(|| format!("if{ifindex}"))
    }

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

    fn kube(&mut self, netns: u32) -> Option<Arc<Services>> {
        let id = self.ids(json!(["kube", netns]))?.first().copied()??;
        Self::typed(&self.blobs, &mut self.kube, id)
    }

    fn netfilter_latest(&mut self, netns: u32) -> Option<Arc<Snapshot>> {
        let id = self
            .ids(json!(["netfilter_latest", netns]))?
            .first()
            .copied()??;
        self.snapshot(Some(id))
    }

    fn reply_holder(&mut self, netns: u32, reply: &Tuple) -> Option<String> {
        self.answer::<Option<String>>(json!(["reply_holder", netns, reply]))
            .flatten()
    }

    fn reverse_route(
        &mut self,
        netns: u32,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        src_valid_mark: bool,
    ) -> Option<(RouteQuery, RouteLookup)> {
        let q = json!(["reverse_route", netns, src, dst, mark, src_valid_mark]);
        self.answer::<Option<(RouteQuery, RouteLookup)>>(q)
            .flatten()
    }

    fn route_get(&mut self, netns: u32, q: &RouteQuery) -> Option<RouteLookup> {
        self.answer::<Option<RouteLookup>>(json!(["route_get", netns, q]))
            .flatten()
    }

    fn neighbour(&mut self, netns: u32, ifindex: u32, addr: IpAddr) -> Option<Neighbour> {
        self.answer::<Option<Neighbour>>(json!(["neighbour", netns, ifindex, addr]))
            .flatten()
    }

    fn neighbours_with(
        &mut self,
        netns: u32,
        ifindex: u32,
        lladdr: [u8; 6],
    ) -> Option<Vec<Neighbour>> {
        self.answer::<Option<Vec<Neighbour>>>(json!(["neighbours_with", netns, ifindex, lladdr]))
            .flatten()
    }

    fn route_out(&mut self, netns: u32, dst: IpAddr) -> Option<u32> {
        self.answer::<Option<u32>>(json!(["route_out", netns, dst]))
            .flatten()
    }

    fn conntrack_find(&mut self, side: Side, t: &Tuple, netns: Option<u32>) -> Option<CtSeen> {
        self.answer::<Option<CtSeen>>(json!(["conntrack_find", side, t, netns]))
            .flatten()
    }

    fn conntrack_from(&mut self, netns: u32, client: SocketAddr) -> Vec<CtSeen> {
        self.answer::<Vec<CtSeen>>(json!(["conntrack_from", netns, client]))
            .unwrap_or_default()
    }

    fn waiting_for(&mut self, netns: u32, local: SocketAddr) -> Option<SocketAddr> {
        self.answer::<Option<SocketAddr>>(json!(["waiting_for", netns, local]))
            .flatten()
    }

    fn br_netfilter_loaded(&mut self) -> bool {
        self.answer(json!(["br_netfilter_loaded"])).unwrap_or(false)
    }

    fn symbol(&mut self, addr: u64) -> Option<String> {
        self.answer::<Option<String>>(json!(["symbol", addr]))
            .flatten()
    }

    fn pod(&mut self, netns: u32) -> Option<Pod> {
        self.answer::<Option<Pod>>(json!(["pod", netns])).flatten()
    }

    fn pod_of_addr(&mut self, addr: IpAddr) -> Option<Pod> {
        self.answer::<Option<Pod>>(json!(["pod_of_addr", addr]))
            .flatten()
    }

    fn pod_labels(&mut self, pod: &PodId) -> Result<Labels, String> {
        self.answer::<Result<Labels, String>>(json!(["pod_labels", pod]))
            .unwrap_or_else(|| Err("the recording holds no answer of the runtime".into()))
    }

    fn listener(&mut self, near: u32, dst: SocketAddr) -> Option<ListenerFound> {
        self.answer::<Option<ListenerFound>>(json!(["listener", near, dst]))
            .flatten()
    }

    fn listen_spaces(&mut self, ports: &[u16]) -> Vec<u32> {
        self.answer::<Vec<u32>>(json!(["listen_spaces", ports]))
            .unwrap_or_default()
    }

    fn listen_counters(&mut self, netns: u32) -> Option<ListenCounters> {
        self.answer::<Option<ListenCounters>>(json!(["listen_counters", netns]))
            .flatten()
    }

    fn listeners_of(&mut self, netns: u32, ports: &[u16]) -> Vec<ListenerFound> {
        self.answer::<Vec<ListenerFound>>(json!(["listeners_of", netns, ports]))
            .unwrap_or_default()
    }

    fn request_pending(
        &mut self,
        netns: u32,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Option<bool> {
        self.answer::<Option<bool>>(json!(["request_pending", netns, local, remote]))
            .flatten()
    }

    fn hook_programs(&mut self, netns: u32, ifindex: u32, hook: &str) -> Option<HookProgs> {
        self.answer::<Option<HookProgs>>(json!(["hook_programs", netns, ifindex, hook]))
            .flatten()
    }

    fn cgroup_programs(
        &mut self,
        netns: u32,
        local: SocketAddr,
        hook: &str,
    ) -> Option<CgroupProgs> {
        self.answer::<Option<CgroupProgs>>(json!(["cgroup_programs", netns, local, hook]))
            .flatten()
    }

    fn service(&mut self, netns: u32, vip: SocketAddr) -> Option<String> {
        self.answer::<Option<String>>(json!(["service", netns, vip]))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::recording::Recorder;

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
