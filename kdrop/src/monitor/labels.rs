//! Names for the kernel's aggregation keys, fixed when first seen so that
//! every series stays a monotonic counter.
use std::collections::HashMap;

use anyhow::Result;
use kdrop_common::AggKey;

use crate::{
    context::{Live, Node},
    kernel::facts::Reasons,
    output::metrics::{DropLabels, ListenLabels, SeriesCap},
};

pub struct Labels {
    keys: HashMap<AggKey, DropLabels>,
    cap: SeriesCap,
    node: Live,
    reasons: Reasons,
}

impl Labels {
    pub fn new(max_series: usize, reasons: Reasons) -> Result<Self> {
        Ok(Self {
            keys: HashMap::new(),
            cap: SeriesCap::new(max_series),
            node: Live::new()?,
            reasons,
        })
    }

    pub fn of(&mut self, k: &AggKey) -> DropLabels {
        if let Some(l) = self.keys.get(k) {
            return l.clone();
        }
        let labels = if k.overflow != 0 {
            DropLabels::overflow()
        } else {
            let owner = self.node.pod(k.netns);
            DropLabels {
                reason: self
                    .reasons
                    .name(k.reason)
                    .unwrap_or_else(|| "unknown".into()),
                netns: self
                    .node
                    .netns(k.netns)
                    .map_or_else(|| k.netns.to_string(), |n| n.display()),
                pod: owner.as_ref().map(|p| p.label()).unwrap_or_default(),
                container: owner.and_then(|p| p.containers).unwrap_or_default(),
                ifname: self.node.ifname(k.netns, k.ifindex),
                port: k.port.to_string(),
            }
        };
        let placed = self.cap.place(labels);
        self.keys.insert(*k, placed.clone());
        placed
    }

    /// The labels of a listener's refusals: its namespace, its pod, its
    /// port (empty: not known which listener).
    pub fn listener(&mut self, netns: u32, port: Option<u16>) -> ListenLabels {
        ListenLabels {
            netns: self
                .node
                .netns(netns)
                .map_or_else(|| netns.to_string(), |n| n.display()),
            pod: self.node.pod(netns).map(|p| p.label()).unwrap_or_default(),
            port: port.map(|p| p.to_string()).unwrap_or_default(),
        }
    }
}
