//! A [`Node`] that asks another one and, when recording, keeps every
//! answer keyed by its question: a bundle line when the answer is new or
//! changed, nothing when it is the same again. Large answers (routing
//! contexts, netfilter snapshots) are kept once each, by content.
use std::{
    collections::{hash_map::DefaultHasher, HashMap},
    hash::{Hash as _, Hasher as _},
    sync::Arc,
};

use serde::Serialize;
use serde_json::{json, Value};

use super::{
    questions::{key, plain_questions},
    tape::Line,
    Node,
};
use crate::diagnosis::kube::Services;
use crate::model::{netfilter::Snapshot, routing::NetnsContext};

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

/// A plain question: asked of the inner node, its answer kept under its
/// key (`["name", args...]`).
macro_rules! record_plain {
    ($($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $unknown:expr;)*) => {
        $(
            fn $name(&mut self, $($arg: $ty),*) -> $ret {
                let a = self.inner.$name($($arg),*);
                self.keep(key!($name $(, $arg)*), &a);
                a
            }
        )*
    };
}

impl<N: Node> Node for Recorder<N> {
    plain_questions!(record_plain);

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

    fn kube(&mut self, netns: u32) -> Option<Arc<Services>> {
        let a = self.inner.kube(netns);
        self.keep_blobs(json!(["kube", netns]), &[a.as_deref()]);
        a
    }
}
