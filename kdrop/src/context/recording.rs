//! A [`Node`] that asks another one and, when recording, keeps every
//! answer keyed by its question: a bundle line when the answer is new or
//! changed, nothing when it is the same again. Large answers (routing
//! contexts, netfilter snapshots) are kept once each, by content.
use std::{
    collections::{hash_map::DefaultHasher, HashMap},
    hash::{Hash as _, Hasher as _},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use serde::Serialize;
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

/// What a recording keeps between lines.
#[derive(Default)]
struct Kept {
    /// The last answer written for each question.
    answers: HashMap<String, Value>,
    /// Blob ids by content hash.
    blobs: HashMap<u64, u64>,
    /// Lines not yet handed to the bundle.
    pending: Vec<Line>,
}

pub struct Recorder<N: Node> {
    pub inner: N,
    kept: Option<Kept>,
}

impl<N: Node> Recorder<N> {
    /// Passes questions through; `recording` keeps the answers.
    pub fn new(inner: N, recording: bool) -> Self {
        Self {
            inner,
            kept: recording.then(Kept::default),
        }
    }

    /// The lines the answers since the last call made, in order.
    pub fn take_lines(&mut self) -> Vec<Line> {
        self.kept
            .as_mut()
            .map(|k| std::mem::take(&mut k.pending))
            .unwrap_or_default()
    }

    fn keep<A: Serialize>(&mut self, q: Value, a: &A) {
        let Some(k) = self.kept.as_mut() else { return };
        let a = serde_json::to_value(a).unwrap_or(Value::Null);
        keep_value(k, q, a);
    }

    /// An answer holding large objects: each kept as a blob once, the
    /// answer refers to them by id.
    fn keep_blobs<T: Serialize>(&mut self, q: Value, parts: &[Option<&T>]) {
        let Some(k) = self.kept.as_mut() else { return };
        let ids: Vec<Option<u64>> = parts.iter().map(|p| p.map(|v| blob(k, v))).collect();
        keep_value(k, q, json!(ids));
    }
}

fn keep_value(k: &mut Kept, q: Value, a: Value) {
    let q = q.to_string();
    if k.answers.get(&q) == Some(&a) {
        return;
    }
    k.answers.insert(q.clone(), a.clone());
    k.pending.push(Line::Answer { q, a });
}

fn blob<T: Serialize>(k: &mut Kept, v: &T) -> u64 {
    let v = serde_json::to_value(v).unwrap_or(Value::Null);
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    let hash = h.finish();
    if let Some(id) = k.blobs.get(&hash) {
        return *id;
    }
    let id = k.blobs.len() as u64;
    k.blobs.insert(hash, id);
    k.pending.push(Line::Blob { id, v });
    id
}

impl<N: Node> Node for Recorder<N> {
    fn netns(&mut self, inode: u32) -> Option<NetnsName> {
        let a = self.inner.netns(inode);
        self.keep(json!(["netns", inode]), &a);
        a
    }

    fn ifname(&mut self, netns: u32, ifindex: u32) -> String {
        let a = self.inner.ifname(netns, ifindex);
        self.keep(json!(["ifname", netns, ifindex]), &a);
        a
    }

    fn routing(&mut self, netns: u32) -> Option<Arc<NetnsContext>> {
        let a = self.inner.routing(netns);
        self.keep_blobs(json!(["routing", netns]), &[a.as_deref()]);
        a
    }

    fn netfilter_around(
        &mut self,
        netns: u32,
        ts_ns: u64,
    ) -> Option<(Option<Arc<Snapshot>>, Arc<Snapshot>)> {
        let a = self.inner.netfilter_around(netns, ts_ns);
        let q = json!(["netfilter_around", netns, ts_ns]);
        match &a {
            Some((before, after)) => self.keep_blobs(q, &[before.as_deref(), Some(after.as_ref())]),
            None => self.keep(q, &Value::Null),
        }
        a
    }

    fn netfilter_latest(&mut self, netns: u32) -> Option<Arc<Snapshot>> {
        let a = self.inner.netfilter_latest(netns);
        self.keep_blobs(json!(["netfilter_latest", netns]), &[a.as_deref()]);
        a
    }

    fn reply_holder(&mut self, netns: u32, reply: &Tuple) -> Option<String> {
        let a = self.inner.reply_holder(netns, reply);
        self.keep(json!(["reply_holder", netns, reply]), &a);
        a
    }

    fn reverse_route(
        &mut self,
        netns: u32,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        src_valid_mark: bool,
    ) -> Option<(RouteQuery, RouteLookup)> {
        let a = self
            .inner
            .reverse_route(netns, src, dst, mark, src_valid_mark);
        let q = json!(["reverse_route", netns, src, dst, mark, src_valid_mark]);
        self.keep(q, &a);
        a
    }

    fn route_get(&mut self, netns: u32, q: &RouteQuery) -> Option<RouteLookup> {
        let a = self.inner.route_get(netns, q);
        self.keep(json!(["route_get", netns, q]), &a);
        a
    }

    fn neighbour(&mut self, netns: u32, ifindex: u32, addr: IpAddr) -> Option<Neighbour> {
        let a = self.inner.neighbour(netns, ifindex, addr);
        self.keep(json!(["neighbour", netns, ifindex, addr]), &a);
        a
    }

    fn neighbours_with(
        &mut self,
        netns: u32,
        ifindex: u32,
        lladdr: [u8; 6],
    ) -> Option<Vec<Neighbour>> {
        let a = self.inner.neighbours_with(netns, ifindex, lladdr);
        self.keep(json!(["neighbours_with", netns, ifindex, lladdr]), &a);
        a
    }

    fn route_out(&mut self, netns: u32, dst: IpAddr) -> Option<u32> {
        let a = self.inner.route_out(netns, dst);
        self.keep(json!(["route_out", netns, dst]), &a);
        a
    }

    fn conntrack_find(&mut self, side: Side, t: &Tuple, netns: Option<u32>) -> Option<CtSeen> {
        let a = self.inner.conntrack_find(side, t, netns);
        self.keep(json!(["conntrack_find", side, t, netns]), &a);
        a
    }

    fn conntrack_from(&mut self, netns: u32, client: SocketAddr) -> Vec<CtSeen> {
        let a = self.inner.conntrack_from(netns, client);
        self.keep(json!(["conntrack_from", netns, client]), &a);
        a
    }

    fn waiting_for(&mut self, netns: u32, local: SocketAddr) -> Option<SocketAddr> {
        let a = self.inner.waiting_for(netns, local);
        self.keep(json!(["waiting_for", netns, local]), &a);
        a
    }

    fn br_netfilter_loaded(&mut self) -> bool {
        let a = self.inner.br_netfilter_loaded();
        self.keep(json!(["br_netfilter_loaded"]), &a);
        a
    }

    fn symbol(&mut self, addr: u64) -> Option<String> {
        let a = self.inner.symbol(addr);
        self.keep(json!(["symbol", addr]), &a);
        a
    }

    fn pod(&mut self, netns: u32) -> Option<Pod> {
        let a = self.inner.pod(netns);
        self.keep(json!(["pod", netns]), &a);
        a
    }

    fn pod_of_addr(&mut self, addr: IpAddr) -> Option<Pod> {
        let a = self.inner.pod_of_addr(addr);
        self.keep(json!(["pod_of_addr", addr]), &a);
        a
    }

    fn pod_labels(&mut self, pod: &PodId) -> Result<Labels, String> {
        let a = self.inner.pod_labels(pod);
        self.keep(json!(["pod_labels", pod]), &a);
        a
    }

    fn kube(&mut self, netns: u32) -> Option<Arc<Services>> {
        let a = self.inner.kube(netns);
        self.keep_blobs(json!(["kube", netns]), &[a.as_deref()]);
        a
    }

    fn listener(&mut self, near: u32, dst: SocketAddr) -> Option<ListenerFound> {
        let a = self.inner.listener(near, dst);
        self.keep(json!(["listener", near, dst]), &a);
        a
    }

    fn listen_spaces(&mut self, ports: &[u16]) -> Vec<u32> {
        let a = self.inner.listen_spaces(ports);
        self.keep(json!(["listen_spaces", ports]), &a);
        a
    }

    fn listen_counters(&mut self, netns: u32) -> Option<ListenCounters> {
        let a = self.inner.listen_counters(netns);
        self.keep(json!(["listen_counters", netns]), &a);
        a
    }

    fn listeners_of(&mut self, netns: u32, ports: &[u16]) -> Vec<ListenerFound> {
        let a = self.inner.listeners_of(netns, ports);
        self.keep(json!(["listeners_of", netns, ports]), &a);
        a
    }

    fn request_pending(
        &mut self,
        netns: u32,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Option<bool> {
        let a = self.inner.request_pending(netns, local, remote);
        self.keep(json!(["request_pending", netns, local, remote]), &a);
        a
    }

    fn hook_programs(&mut self, netns: u32, ifindex: u32, hook: &str) -> Option<HookProgs> {
        let a = self.inner.hook_programs(netns, ifindex, hook);
        self.keep(json!(["hook_programs", netns, ifindex, hook]), &a);
        a
    }

    fn cgroup_programs(
        &mut self,
        netns: u32,
        local: SocketAddr,
        hook: &str,
    ) -> Option<CgroupProgs> {
        let a = self.inner.cgroup_programs(netns, local, hook);
        self.keep(json!(["cgroup_programs", netns, local, hook]), &a);
        a
    }

    fn service(&mut self, netns: u32, vip: SocketAddr) -> Option<String> {
        let a = self.inner.service(netns, vip);
        self.keep(json!(["service", netns, vip]), &a);
        a
    }
}
