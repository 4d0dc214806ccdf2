//! kube-proxy's rules read back into Kubernetes names: which Service port
//! a virtual address (cluster IP, external IP, load-balancer IP) or a node
//! port belongs to, and which Service a backend endpoint serves. Read from
//! the comments and targets kube-proxy's iptables mode writes
//! (kubernetes/kubernetes pkg/proxy/iptables/proxier.go, `syncProxyRules`):
//! `"ns/svc:port cluster IP"` on the KUBE-SERVICES jump, `ns/svc:port` on a
//! KUBE-NODEPORTS jump and on a KUBE-SEP-* DNAT.
use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use serde::{Deserialize, Serialize};

use crate::model::netfilter::{Backend, Table};

/// A Service port as kube-proxy names it (`ServicePortName`): namespace,
/// name, the port's name (empty for a Service's only, unnamed port), and
/// its number when a cluster IP rule gave it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SvcPort {
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub port: Option<u16>,
}

impl SvcPort {
    /// `ns/svc:port` as kube-proxy writes it in a comment (`ns/svc:p80`,
    /// `ns/svc` for an unnamed port; before 1.25 `ns/svc:`).
    pub fn parse(s: &str) -> Option<Self> {
        let (namespace, rest) = s.split_once('/')?;
        let (name, port_name) = rest.split_once(':').unwrap_or((rest, ""));
        let dns = |x: &str| {
            !x.is_empty()
                && x.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        };
        (dns(namespace) && dns(name)).then(|| SvcPort {
            namespace: namespace.into(),
            name: name.into(),
            port_name: port_name.into(),
            port: None,
        })
    }

    /// `namespace/name:port` with the port's number, as `kubectl get svc`
    /// lists it (its name when the number is unknown).
    pub fn display(&self) -> String {
        match (self.port, self.port_name.as_str()) {
            (Some(p), _) => format!("{}/{}:{p}", self.namespace, self.name),
            (None, "") => format!("{}/{}", self.namespace, self.name),
            (None, n) => format!("{}/{}:{n}", self.namespace, self.name),
        }
    }

    /// `port p80` (its name, as the EndpointSlice names it), `port 80`
    /// for an unnamed one.
    pub fn port_phrase(&self) -> String {
        match (self.port, self.port_name.as_str()) {
            (Some(p), "") => format!("port {p}"),
            (None, "") => "port".into(),
            (_, n) => format!("port {n}"),
        }
    }

    pub fn key(&self) -> (String, String, String) {
        (
            self.namespace.clone(),
            self.name.clone(),
            self.port_name.clone(),
        )
    }
}

/// How traffic reaches a Service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    ClusterIp,
    ExternalIp,
    LoadBalancer,
    NodePort,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::ClusterIp => "cluster IP",
            Kind::ExternalIp => "external IP",
            Kind::LoadBalancer => "load-balancer IP",
            Kind::NodePort => "node port",
        }
    }

    pub fn external(self) -> bool {
        !matches!(self, Kind::ClusterIp)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frontend {
    pub svc: SvcPort,
    pub kind: Kind,
}

/// One `-A CHAIN ...` line taken apart.
#[derive(Debug, Default)]
pub struct KubeRule {
    pub chain: String,
    pub comment: Option<String>,
    pub dst: Option<IpAddr>,
    pub dport: Option<u16>,
    pub dst_local: bool,
    pub target: String,
    pub to_destination: Option<SocketAddr>,
    pub mark: Option<String>,
    pub ctstate: Option<String>,
}

/// Splits like iptables-save quotes (`"..."`, `\"` inside).
pub(crate) fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&c) = chars.peek() else { break };
        let mut t = String::new();
        if c == '"' {
            chars.next();
            while let Some(ch) = chars.next() {
                match ch {
                    '\\' => t.extend(chars.next()),
                    '"' => break,
                    ch => t.push(ch),
                }
            }
        } else {
            while let Some(ch) = chars.next_if(|c| !c.is_whitespace()) {
                t.push(ch);
            }
        }
        out.push(t);
    }
    out
}

impl KubeRule {
    /// A rule as iptables-save (or kube-proxy's restore input) writes it.
    pub fn parse(text: &str) -> Option<Self> {
        let t = tokens(text);
        if t.first().map(String::as_str) != Some("-A") {
            return None;
        }
        let mut r = KubeRule {
            chain: t.get(1)?.clone(),
            ..Default::default()
        };
        let mut neg = false;
        let mut i = 2;
        while i < t.len() {
            let arg = t.get(i + 1).map(String::as_str).unwrap_or("");
            match t[i].as_str() {
                "!" => {
                    neg = true;
                    i += 1;
                    continue;
                }
                "--comment" => r.comment = Some(arg.into()),
                "-d" | "--destination" if !neg => {
                    r.dst = arg.split('/').next().and_then(|a| a.parse().ok())
                }
                "--dport" | "--destination-port" if !neg => r.dport = arg.parse().ok(),
                "--dst-type" if !neg => r.dst_local = arg == "LOCAL",
                "-j" | "-g" => r.target = arg.into(),
                "--to-destination" => r.to_destination = arg.parse().ok(),
                "--mark" if !neg => r.mark = Some(arg.into()),
                "--ctstate" if !neg => r.ctstate = Some(arg.into()),
                _ => {}
            }
            neg = false;
            i += 1;
        }
        Some(r)
    }

    /// The Service port the comment starts with, if it does.
    pub fn svc(&self) -> Option<SvcPort> {
        SvcPort::parse(self.comment.as_deref()?.split_whitespace().next()?)
    }

    /// The comment after the Service's name (`cluster IP`, `has no endpoints`).
    pub fn remark(&self) -> &str {
        let c = self.comment.as_deref().unwrap_or("");
        c.split_once(' ').map_or("", |(_, r)| r)
    }
}

/// The hash kube-proxy ends a per-service chain with (`KUBE-SVC-<hash>`,
/// `KUBE-EXT-`, `KUBE-SVL-`, `KUBE-FW-`, `KUBE-XLB-`).
pub fn chain_hash(chain: &str) -> Option<&str> {
    [
        "KUBE-SVC-",
        "KUBE-EXT-",
        "KUBE-SVL-",
        "KUBE-FW-",
        "KUBE-XLB-",
    ]
    .iter()
    .find_map(|p| chain.strip_prefix(p))
}

/// Every name kube-proxy's rules of one namespace give. Serialized into
/// `kdrop record` bundles (the answer to `Node::kube`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Services {
    pub vips: HashMap<SocketAddr, Frontend>,
    pub node_ports: HashMap<u16, Frontend>,
    pub endpoints: HashMap<SocketAddr, SvcPort>,
    /// Per-service chains by hash, for the rule that dropped a packet.
    pub chains: HashMap<String, SvcPort>,
    /// Service ports whose packets a nat rule marks for KUBE-FIREWALL to
    /// drop (kube-proxy before 1.25): true when it is for want of a local
    /// endpoint, false for a load-balancer source range.
    #[serde(with = "pairs")]
    pub mark_drops: HashMap<(String, String, String), bool>,
    /// The namespace's own addresses: a node port is reached on these.
    pub local: HashSet<IpAddr>,
    /// nftables mode: the Service port an address without (local)
    /// endpoints belongs to, and whether it is rejected (no endpoints at
    /// all) rather than dropped (none on this node).
    pub nft_no_endpoints: HashMap<SocketAddr, (SvcPort, bool)>,
    pub nft_no_endpoint_ports: HashMap<u16, (SvcPort, bool)>,
}

/// A map whose keys JSON cannot hold (tuples) as a list of pairs.
mod pairs {
    use std::{collections::HashMap, hash::Hash};

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(
        m: &HashMap<K, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<HashMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Eq + Hash,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

/// Service ports by their Service's key, as the cluster IP rules give them:
/// the other names of the Service take them.
type Ports = HashMap<(String, String, String), u16>;

impl Services {
    /// From the iptables tables of a snapshot (kube-proxy's iptables mode
    /// writes `nat` and `filter`).
    pub fn from_tables(tables: &[Table]) -> Self {
        let rules = tables
            .iter()
            .filter(|t| t.backend != Backend::Nftables && (t.name == "nat" || t.name == "filter"))
            .flat_map(|t| t.chains.iter())
            .flat_map(|c| c.rules.iter())
            .filter_map(|r| KubeRule::parse(&r.text));
        Self::from_rules(rules)
    }

    pub fn from_rules(rules: impl IntoIterator<Item = KubeRule>) -> Self {
        let mut s = Services::default();
        let mut ports = Ports::new();
        for r in rules {
            let Some(svc) = r.svc() else { continue };
            s.add_rule(&r, svc, &mut ports);
        }
        let fill = |svc: &mut SvcPort| svc.port = ports.get(&svc.key()).copied();
        s.vips.values_mut().for_each(|f| fill(&mut f.svc));
        s.node_ports.values_mut().for_each(|f| fill(&mut f.svc));
        s.endpoints.values_mut().for_each(fill);
        s.chains.values_mut().for_each(fill);
        s
    }

    /// What one of kube-proxy's rules names for `svc`: its chain's hash,
    /// a drop mark, a frontend, an endpoint.
    fn add_rule(&mut self, r: &KubeRule, svc: SvcPort, ports: &mut Ports) {
        if let Some(h) = chain_hash(&r.chain).or_else(|| chain_hash(&r.target)) {
            self.chains
                .entry(h.to_string())
                .or_insert_with(|| svc.clone());
        }
        if r.target == "KUBE-MARK-DROP" {
            let no_local = r.remark().contains("has no local endpoints");
            if no_local || r.chain.starts_with("KUBE-FW-") {
                let e = self.mark_drops.entry(svc.key()).or_insert(no_local);
                *e |= no_local;
            }
        }
        if r.chain.starts_with("KUBE-SEP-") {
            if let Some(to) = r.to_destination {
                self.endpoints.insert(to, svc.clone());
            }
        }
        self.add_frontend(r, svc, ports);
    }

    /// A virtual address or node port a rule names (its comment says the
    /// kind), and the port of a cluster IP.
    fn add_frontend(&mut self, r: &KubeRule, svc: SvcPort, ports: &mut Ports) {
        let remark = r.remark();
        let kind = match remark {
            "cluster IP" => Some(Kind::ClusterIp),
            "external IP" => Some(Kind::ExternalIp),
            "loadbalancer IP" | "LB IP" => Some(Kind::LoadBalancer),
            _ => None,
        };
        match (&r.chain[..], kind, r.dst, r.dport) {
            ("KUBE-SERVICES", Some(kind), Some(ip), Some(port)) => {
                if kind == Kind::ClusterIp {
                    ports.insert(svc.key(), port);
                }
                // nat's comment names the kind; filter's guessed it.
                self.vips
                    .insert(SocketAddr::new(ip, port), Frontend { svc, kind });
            }
            // `-d 127.0.0.0/8` is the localhost variant of the same port.
            ("KUBE-NODEPORTS", None, _, Some(port))
                if remark.is_empty() && r.target.starts_with("KUBE-") =>
            {
                self.node_ports.entry(port).or_insert(Frontend {
                    svc,
                    kind: Kind::NodePort,
                });
            }
            // The filter rules of a Service without (local) endpoints
            // are the only trace of its addresses kube-proxy leaves.
            ("KUBE-SERVICES" | "KUBE-EXTERNAL-SERVICES", None, dst, Some(port))
                if remark.starts_with("has no") =>
            {
                self.add_without_endpoints(r, dst, port, svc, ports)
            }
            _ => {}
        }
    }

    /// A frontend from the filter rule of a Service without (local)
    /// endpoints: a virtual address, or a node port (`--dst-type LOCAL`).
    fn add_without_endpoints(
        &mut self,
        r: &KubeRule,
        dst: Option<IpAddr>,
        port: u16,
        svc: SvcPort,
        ports: &mut Ports,
    ) {
        match (dst, r.dst_local) {
            (Some(ip), _) => {
                let kind = if r.chain == "KUBE-SERVICES" {
                    Kind::ClusterIp
                } else {
                    Kind::ExternalIp
                };
                if kind == Kind::ClusterIp {
                    ports.entry(svc.key()).or_insert(port);
                }
                self.vips
                    .entry(SocketAddr::new(ip, port))
                    .or_insert(Frontend { svc, kind });
            }
            (None, true) => {
                self.node_ports.entry(port).or_insert(Frontend {
                    svc,
                    kind: Kind::NodePort,
                });
            }
            _ => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.vips.is_empty() && self.node_ports.is_empty() && self.endpoints.is_empty()
    }

    /// The Service port an address belongs to: a virtual address, else a
    /// node port when `local` (the address is the node's own).
    pub fn frontend(&self, addr: SocketAddr, local: bool) -> Option<&Frontend> {
        self.vips
            .get(&addr)
            .or_else(|| local.then(|| self.node_ports.get(&addr.port())).flatten())
    }

    /// The node ports of the Services whose port is one of `ports`, by
    /// node port, leaving out those already among `ports`: where a load
    /// balancer sends what its clients sent to the Service's port, so
    /// `--port 80` follows them too. A node port whose Service's port no
    /// cluster IP rule gave is left out (its port is unknown).
    pub fn node_ports_of(&self, ports: &[u16]) -> Vec<(u16, &SvcPort)> {
        let mut found: Vec<(u16, &SvcPort)> = self
            .node_ports
            .iter()
            .filter(|(np, f)| !ports.contains(np) && f.svc.port.is_some_and(|p| ports.contains(&p)))
            .map(|(np, f)| (*np, &f.svc))
            .collect();
        found.sort_by_key(|(np, _)| *np);
        found
    }

    /// The Service port a backend endpoint (`10.180.0.1:80`) serves.
    pub fn serving(&self, endpoint: SocketAddr) -> Option<&SvcPort> {
        self.endpoints.get(&endpoint)
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
