//! A connection a network policy denied, in Kubernetes terms: the
//! `network_policy` field of a drop record (README).
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicyDrop {
    /// `calico`, `kube-router`, `cilium`.
    pub engine: &'static str,
    /// `iptables`, `nftables`, `ebpf` (Cilium's programs).
    pub dataplane: &'static str,
    /// `no_policy_allowed` (end of tier; kube-router's REJECT of what no
    /// policy marked), `denied_by_rule` (a deny rule of a policy),
    /// `no_profile_matched`, `auth_required` (Cilium: the allowing rule
    /// needs mutual authentication).
    pub verdict: &'static str,
    /// `ingress` or `egress` of `protected_pod`.
    pub direction: &'static str,
    /// The pod whose policy ended the connection (`namespace/name`): the
    /// server for ingress, the client for egress; null when its address is
    /// no pod's.
    pub protected_pod: Option<String>,
    /// The other end, refused (`namespace/name`), null when no pod.
    pub peer_pod: Option<String>,
    pub protected_addr: String,
    pub peer_addr: String,
    /// The server's port and the protocol.
    pub port: u16,
    pub protocol: &'static str,
    /// The tier whose end (or whose policy) dropped it; null for profiles.
    pub tier: Option<String>,
    /// The workload's endpoint chain (`cali-tw-<iface>`) and interface.
    pub endpoint_chain: String,
    pub interface: Option<String>,
    /// The chain whose rule dropped it: the endpoint chain (end of tier,
    /// no profile), or the policy's (`cali-pi-...`).
    pub chain: String,
    /// The policy (or profile) whose rule denied it, as Felix names it
    /// (`NetworkPolicy shop/deny-cart`); null when no policy allowed it.
    pub policy: Option<String>,
    /// The policies of the tier the packet went through without an allow
    /// (or the profiles), by their chains' comments (else chain names).
    pub evaluated: Vec<String>,
}
