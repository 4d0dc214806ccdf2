//! Pods as the container runtime recorded them, named as `kubectl` shows
//! them, and the pods (and Service) one connection involves.
use serde::{ser::SerializeMap as _, Deserialize, Serialize, Serializer};

/// A pod's labels (its own, as `kubectl get pod --show-labels` shows
/// them), by key.
pub type Labels = std::collections::BTreeMap<String, String>;

/// Who a pod is, from the best record there was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodId {
    /// The pod's namespace and name (its sandbox's annotations).
    Named { namespace: String, name: String },
    /// Only the pod's UID (a cgroup path under kubepods).
    Uid(String),
    /// A container outside Kubernetes: the first 12 digits of its id.
    Container(String),
}

/// A pod and its containers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub id: PodId,
    /// The pod's containers by name, sorted, `,` between several (they
    /// share the pod's network namespace); None when none is running.
    pub containers: Option<String>,
    /// The pod's labels when the runtime's records on the node hold them
    /// (CRI-O's bundles do, containerd's do not: a finding that needs them
    /// asks the runtime over CRI, `Node::pod_labels`): a network policy's
    /// selectors are written from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Labels>,
}

impl Pod {
    /// The `pod` field and label: `namespace/name`, else the pod UID, else
    /// `container/<id12>`.
    pub fn label(&self) -> String {
        match &self.id {
            PodId::Named { namespace, name } => format!("{namespace}/{name}"),
            PodId::Uid(uid) => uid.clone(),
            PodId::Container(id) => format!("container/{id}"),
        }
    }

    /// How a sentence names it: `pod shop/cart-7d9f5c8b6-x2kqp`, `pod
    /// <uid>`, `container <id12>`.
    pub fn phrase(&self) -> String {
        match &self.id {
            PodId::Container(id) => format!("container {id}"),
            _ => format!("pod {}", self.label()),
        }
    }
}

/// The pods and Service a record's connection involves, each when known:
/// where it died, who started it, the Service it was addressed to, the pod
/// that serves it (after any DNAT). In JSON, the record's `pod`,
/// `container`, `client_pod`, `service` and `backend_pod`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnPods {
    /// The pod whose network namespace the record is in.
    pub pod: Option<Pod>,
    pub client: Option<Pod>,
    /// `namespace/name:port`.
    pub service: Option<String>,
    pub backend: Option<Pod>,
}

impl Serialize for ConnPods {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let label = |p: &Option<Pod>| p.as_ref().map(Pod::label);
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("pod", &label(&self.pod))?;
        m.serialize_entry(
            "container",
            &self.pod.as_ref().and_then(|p| p.containers.as_deref()),
        )?;
        m.serialize_entry("client_pod", &label(&self.client))?;
        m.serialize_entry("service", &self.service)?;
        m.serialize_entry("backend_pod", &label(&self.backend))?;
        m.end()
    }
}
