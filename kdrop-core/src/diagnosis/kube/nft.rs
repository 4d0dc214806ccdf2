//! kube-proxy's nftables mode read back into Kubernetes names: its `ip
//! kube-proxy` table (`nft -j list table ip kube-proxy`) keeps the Services
//! in verdict maps, not in rule comments (kubernetes/kubernetes
//! pkg/proxy/nftables/proxier.go): `service-ips` (address . proto . port :
//! goto service-HASH-ns/svc/tcp/p80 or external-...), `service-nodeports`,
//! `no-endpoint-services` and `no-endpoint-nodeports` (with the Service in
//! the element's comment, verdict `drop` for no local endpoint, `goto
//! reject-chain` for none), and the endpoint in the chain name
//! (`endpoint-HASH-ns/svc/tcp/p80__10.180.0.1/80`).
use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use serde_json::Value;

use super::services::{Frontend, Kind, Services, SvcPort};

/// The name of kube-proxy's nftables table (both families).
pub const TABLE: &str = "kube-proxy";

/// `service-ULMVA6XW-ns1/svc1/tcp/p80` → (`service`, ns1/svc1:p80, None);
/// `endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80` → (.., Some(10.180.0.1:80)).
pub fn chain_svc(chain: &str) -> Option<(&str, SvcPort, Option<SocketAddr>)> {
    let (prefix, rest) = chain.split_once('-')?;
    if !["service", "external", "endpoint", "firewall"].contains(&prefix) {
        return None;
    }
    let (_hash, rest) = rest.split_once('-')?;
    let (svc, ep) = match rest.split_once("__") {
        Some((s, e)) => {
            let (ip, port) = e.rsplit_once('/')?;
            let ip: IpAddr = ip.parse().ok()?;
            (s, Some(SocketAddr::new(ip, port.parse().ok()?)))
        }
        None => (rest, None),
    };
    let parts: Vec<&str> = svc.split('/').collect();
    let [ns, name, _proto, port] = parts[..] else {
        return None;
    };
    let svc = SvcPort::parse(&format!("{ns}/{name}:{port}"))?;
    Some((prefix, svc, ep))
}

/// A map element: its key's parts (`["1.2.3.4", "tcp", 80]`), comment and verdict.
fn elements(map: &Value) -> Vec<(Vec<Value>, Option<String>, Value)> {
    let Some(elems) = map.get("elem").and_then(Value::as_array) else {
        return Vec::new();
    };
    elems
        .iter()
        .filter_map(|pair| {
            let [key, verdict] = pair.as_array()?.as_slice() else {
                return None;
            };
            let (key, comment) = match key.get("elem") {
                Some(e) => (
                    e.get("val")?.clone(),
                    e.get("comment").and_then(Value::as_str).map(String::from),
                ),
                None => (key.clone(), None),
            };
            let parts = match key.get("concat").and_then(Value::as_array) {
                Some(c) => c.clone(),
                None => vec![key],
            };
            Some((parts, comment, verdict.clone()))
        })
        .collect()
}

fn goto(verdict: &Value) -> Option<&str> {
    verdict
        .get("goto")
        .or_else(|| verdict.get("jump"))?
        .get("target")?
        .as_str()
}

/// `addr . proto . port` or `proto . port` of a TCP element.
fn addr_port(parts: &[Value]) -> (Option<IpAddr>, Option<u16>) {
    let port = parts
        .last()
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let tcp = parts.iter().any(|p| p.as_str() == Some("tcp"));
    let ip = parts
        .first()
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok());
    (ip, port.filter(|_| tcp))
}

/// Service ports by their Service's key, as the ClusterIP elements give
/// them: the other names of the Service take them.
type Ports = HashMap<(String, String, String), u16>;

/// The addresses of the `cluster-ips` set.
fn cluster_ips<'a>(sets: impl Iterator<Item = &'a Value>) -> HashSet<IpAddr> {
    sets.filter(|s| s.get("name").and_then(Value::as_str) == Some("cluster-ips"))
        .flat_map(|s| {
            s.get("elem")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|e| e.as_str().and_then(|s| s.parse().ok()))
        .collect()
}

impl Services {
    /// Adds the names of kube-proxy's nftables table (`nft -j list table`).
    pub fn add_nft(&mut self, json: &Value) {
        let items = json
            .get("nftables")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let of_table = |kind: &'static str| {
            items
                .iter()
                .filter_map(move |i| i.get(kind))
                .filter(|o| o.get("table").and_then(Value::as_str) == Some(TABLE))
        };
        let cluster_ips = cluster_ips(of_table("set"));
        let mut ports = Ports::new();
        for map in of_table("map") {
            let name = map.get("name").and_then(Value::as_str).unwrap_or("");
            for (parts, comment, verdict) in elements(map) {
                let (ip, port) = addr_port(&parts);
                let Some(port) = port else { continue };
                match name {
                    "service-ips" | "service-nodeports" => {
                        self.add_service(ip, port, &verdict, &mut ports)
                    }
                    "no-endpoint-services" | "no-endpoint-nodeports" => {
                        let Some(svc) = comment.as_deref().and_then(SvcPort::parse) else {
                            continue;
                        };
                        let reject = goto(&verdict) == Some("reject-chain");
                        self.add_no_endpoint(ip, port, svc, reject, &cluster_ips, &mut ports);
                    }
                    _ => {}
                }
            }
        }
        for chain in of_table("chain") {
            let name = chain.get("name").and_then(Value::as_str).unwrap_or("");
            if let Some((_, svc, Some(ep))) = chain_svc(name) {
                self.endpoints.insert(ep, svc);
            }
        }
        self.fill_ports(&ports);
    }

    /// A `service-ips` or `service-nodeports` element: a frontend going to
    /// its Service's chain (`service-...` for a ClusterIP, `external-...`).
    fn add_service(&mut self, ip: Option<IpAddr>, port: u16, verdict: &Value, ports: &mut Ports) {
        let Some((prefix, svc, _)) = goto(verdict).and_then(chain_svc) else {
            return;
        };
        match ip {
            Some(ip) => {
                let kind = if prefix == "service" {
                    ports.insert(svc.key(), port);
                    Kind::ClusterIp
                } else {
                    Kind::ExternalIp
                };
                self.vips
                    .insert(SocketAddr::new(ip, port), Frontend { svc, kind });
            }
            None => {
                let f = Frontend {
                    svc,
                    kind: Kind::NodePort,
                };
                self.node_ports.insert(port, f);
            }
        }
    }

    /// A `no-endpoint-services` or `no-endpoint-nodeports` element: a
    /// frontend without endpoints (`reject`: none at all, else no local one).
    fn add_no_endpoint(
        &mut self,
        ip: Option<IpAddr>,
        port: u16,
        svc: SvcPort,
        reject: bool,
        cluster_ips: &HashSet<IpAddr>,
        ports: &mut Ports,
    ) {
        match ip {
            Some(ip) => {
                let a = SocketAddr::new(ip, port);
                let kind = if cluster_ips.contains(&ip) {
                    ports.entry(svc.key()).or_insert(port);
                    Kind::ClusterIp
                } else {
                    Kind::ExternalIp
                };
                self.vips.entry(a).or_insert(Frontend {
                    svc: svc.clone(),
                    kind,
                });
                self.nft_no_endpoints.insert(a, (svc, reject));
            }
            None => {
                let f = Frontend {
                    svc: svc.clone(),
                    kind: Kind::NodePort,
                };
                self.node_ports.entry(port).or_insert(f);
                self.nft_no_endpoint_ports.insert(port, (svc, reject));
            }
        }
    }

    /// Every name of a Service takes the port its ClusterIP gives it.
    fn fill_ports(&mut self, ports: &Ports) {
        let fill = |svc: &mut SvcPort| {
            if let Some(p) = ports.get(&svc.key()) {
                svc.port = Some(*p);
            }
        };
        self.vips.values_mut().for_each(|f| fill(&mut f.svc));
        self.node_ports.values_mut().for_each(|f| fill(&mut f.svc));
        self.endpoints.values_mut().for_each(fill);
        self.nft_no_endpoints
            .values_mut()
            .for_each(|(s, _)| fill(s));
        self.nft_no_endpoint_ports
            .values_mut()
            .for_each(|(s, _)| fill(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClusterIP without endpoints: its frontend, its port for the
    /// Service's other names, and `reject` from the element's verdict.
    #[test]
    fn a_cluster_ip_without_endpoints() {
        let ip: IpAddr = "10.96.0.10".parse().unwrap();
        let svc = SvcPort::parse("ns1/svc1:p80").unwrap();
        let mut s = Services::default();
        let mut ports = Ports::new();
        s.add_no_endpoint(
            Some(ip),
            80,
            svc.clone(),
            true,
            &HashSet::from([ip]),
            &mut ports,
        );
        let a = SocketAddr::new(ip, 80);
        assert_eq!(s.vips[&a].kind, Kind::ClusterIp);
        assert_eq!(s.nft_no_endpoints[&a], (svc.clone(), true));
        assert_eq!(ports[&svc.key()], 80);
        s.fill_ports(&ports);
        assert_eq!(s.vips[&a].svc.port, Some(80));
    }
}
