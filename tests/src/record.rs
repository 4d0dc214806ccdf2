//! kdrop's JSON-lines output as the tests read it: README's schema ("JSON
//! schema"), written down here and not taken from kdrop's own model, so
//! that a field kdrop renames or retypes fails the tests instead of
//! following along. A field README gives as "string or null" (or "object or
//! null") must be there, null or not: a missing one is an error, not `None`
//! (`nullable`). Only fields README says may be absent have a default.
use std::{fmt, net::SocketAddr};

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A field that is always present and may be null.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// One line of `kdrop --json`.
#[derive(Clone, Debug, Deserialize)]
pub struct Record {
    pub ts: String,
    /// `drop`, `unanswered`, `reset`, `listen_overflow`.
    pub kind: String,
    pub netns: u64,
    #[serde(deserialize_with = "nullable")]
    pub netns_name: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub pod: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub container: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub client_pod: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub service: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub backend_pod: Option<String>,
    pub ifname: String,
    pub ifindex: u32,
    /// `ipv4` or `ipv6`.
    pub family: String,
    pub saddr: String,
    pub sport: u16,
    pub daddr: String,
    pub dport: u16,
    pub tcp_flags: String,
    /// Null on kernels without drop reasons.
    #[serde(deserialize_with = "nullable")]
    pub reason: Option<String>,
    pub location: String,
    pub mark: u32,
    pub route_lookups: Vec<Lookup>,
    #[serde(deserialize_with = "nullable")]
    pub ct: Option<Ct>,
    #[serde(deserialize_with = "nullable")]
    pub finding: Option<Finding>,
    #[serde(deserialize_with = "nullable")]
    pub netfilter: Option<Netfilter>,
    /// Absent unless Calico's network policy denied the connection.
    #[serde(default)]
    pub network_policy: Option<NetworkPolicy>,
    /// The handshake the record belongs to; null for a `listen_overflow`
    /// record (never filed under a handshake).
    #[serde(deserialize_with = "nullable")]
    pub handshake: Option<u64>,
    /// The line as kdrop printed it (for failure messages).
    #[serde(skip)]
    pub line: String,
}

/// A finding: kdrop's explanation.
#[derive(Clone, Debug, Deserialize)]
pub struct Finding {
    pub cause: String,
    pub summary: String,
    pub evidence: Vec<String>,
    pub fix: Vec<String>,
    pub fix_or: Vec<Vec<String>>,
    pub fix_notes: Vec<String>,
    pub inspect: Vec<String>,
}

/// One of the kernel's IPv4 route lookups for the packet.
#[derive(Clone, Debug, Deserialize)]
pub struct Lookup {
    pub table: u32,
    pub err: i32,
    pub src: String,
    pub dst: String,
    pub iif: u32,
    pub oif: u32,
    pub mark: u32,
    #[serde(deserialize_with = "nullable")]
    pub dev: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub gw: Option<String>,
}

/// The conntrack entry the packet carried.
#[derive(Clone, Debug, Deserialize)]
pub struct Ct {
    pub orig: Tuple,
    pub reply: Tuple,
    pub status: Vec<String>,
    pub mark: u32,
    pub zone: u16,
}

/// One direction of a conntrack entry, `addr:port` each.
#[derive(Clone, Debug, Deserialize)]
pub struct Tuple {
    pub src: String,
    pub dst: String,
}

/// The netfilter rule, policy or conntrack drop a `NETFILTER_DROP` points at.
#[derive(Clone, Debug, Deserialize)]
pub struct Netfilter {
    /// `rule`, `policy`, `conntrack`, `nat`, `table`.
    pub dropped_by: String,
    pub method: String,
    #[serde(deserialize_with = "nullable")]
    pub hook: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub family: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub backend: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub table: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub chain: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub rule: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub rule_number: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    pub handle: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    pub target: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub packets_before: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    pub packets_after: Option<u64>,
    pub ctstate_invalid: bool,
    /// A policy's drop only.
    #[serde(default)]
    pub accepts_established: Option<bool>,
    /// Present (and true) only when the chain runs before conntrack.
    #[serde(default)]
    pub before_conntrack: Option<bool>,
    /// Present (and true) only when the rule was gone from the reading
    /// after the drop.
    #[serde(default)]
    pub gone: Option<bool>,
    /// A conntrack drop only.
    #[serde(default)]
    pub conntrack: Option<ConntrackMoved>,
    pub evidence: Vec<String>,
}

/// Conntrack's statistics before and after a drop.
#[derive(Clone, Debug, Deserialize)]
pub struct ConntrackMoved {
    pub before: ConntrackStats,
    pub after: ConntrackStats,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ConntrackStats {
    pub drop: u64,
    pub insert_failed: u64,
    pub early_drop: u64,
    pub invalid: u64,
    pub chaintoolong: u64,
    pub clash_resolve: u64,
    #[serde(deserialize_with = "nullable")]
    pub count: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    pub max: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    pub buckets: Option<u64>,
}

/// A connection Calico's network policy denied.
#[derive(Clone, Debug, Deserialize)]
pub struct NetworkPolicy {
    pub engine: String,
    pub dataplane: String,
    pub verdict: String,
    pub direction: String,
    #[serde(deserialize_with = "nullable")]
    pub protected_pod: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub peer_pod: Option<String>,
    pub protected_addr: String,
    pub peer_addr: String,
    pub port: u16,
    pub protocol: String,
    #[serde(deserialize_with = "nullable")]
    pub tier: Option<String>,
    pub endpoint_chain: String,
    #[serde(deserialize_with = "nullable")]
    pub interface: Option<String>,
    pub chain: String,
    #[serde(deserialize_with = "nullable")]
    pub policy: Option<String>,
    pub evaluated: Vec<String>,
}

impl Record {
    /// A line of kdrop's output; a line that does not fit the schema fails
    /// the test.
    pub fn parse(line: &str) -> Self {
        let mut r: Record = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("record does not fit the schema ({e}): {line}"));
        r.line = line.to_string();
        r
    }

    /// A record already read as JSON.
    pub fn from_value(v: &Value) -> Self {
        Self::parse(&v.to_string())
    }

    /// The finding, which this record must have.
    pub fn finding(&self) -> &Finding {
        self.finding
            .as_ref()
            .unwrap_or_else(|| panic!("no finding: {self}"))
    }

    /// The finding's cause, `none` without a finding.
    pub fn cause(&self) -> &str {
        self.finding.as_ref().map_or("none", |f| f.cause.as_str())
    }

    /// The netfilter attribution, which this record must have.
    pub fn netfilter(&self) -> &Netfilter {
        self.netfilter
            .as_ref()
            .unwrap_or_else(|| panic!("no netfilter attribution: {self}"))
    }

    /// The network policy denial, which this record must carry.
    pub fn policy(&self) -> &NetworkPolicy {
        self.network_policy
            .as_ref()
            .unwrap_or_else(|| panic!("no network_policy: {self}"))
    }

    /// The conntrack entry, which this record must carry.
    pub fn ct(&self) -> &Ct {
        self.ct
            .as_ref()
            .unwrap_or_else(|| panic!("no conntrack entry: {self}"))
    }

    /// Is this record about exactly the packet `src -> dst` (as the record
    /// names its tuple)?
    pub fn is_tuple(&self, src: &SocketAddr, dst: &SocketAddr) -> bool {
        self.saddr == src.ip().to_string()
            && self.sport == src.port()
            && self.daddr == dst.ip().to_string()
            && self.dport == dst.port()
    }

    /// Is this record about the handshake of `client` (its SYN, the
    /// SYN-ACK to it, or a packet of it after NAT that names the client's
    /// end)?
    pub fn of(&self, client: SocketAddr) -> bool {
        let ip = client.ip().to_string();
        (self.saddr == ip && self.sport == client.port())
            || (self.daddr == ip && self.dport == client.port())
    }
}

impl Netfilter {
    /// Conntrack's statistics, which this conntrack drop must carry.
    pub fn conntrack(&self) -> &ConntrackMoved {
        self.conntrack
            .as_ref()
            .unwrap_or_else(|| panic!("no conntrack statistics: {self:?}"))
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from kdrop (an iptables-nft rule dropping a SYN in a lab
    /// namespace, 6.18).
    const NETFILTER_DROP: &str = r#"{"ts":"2026-11-28T02:56:08.600440Z","kind":"drop","netns":4026532246,"netns_name":"kdcap-s","pod":null,"container":null,"client_pod":null,"service":null,"backend_pod":null,"ifname":"s0","ifindex":2,"family":"ipv4","saddr":"10.250.0.1","sport":33522,"daddr":"10.250.0.2","dport":7777,"tcp_flags":"SYN","reason":"NETFILTER_DROP","location":"nft_do_chain+0x3e8","mark":0,"route_lookups":[],"ct":null,"finding":{"cause":"netfilter_rule","summary":"iptables-nft rule 1 in filter/INPUT (ip, INPUT hook) dropped it: -A INPUT -p tcp -m tcp --dport 7777 -j DROP","evidence":["kernel drop reason NETFILTER_DROP at nft_do_chain+0x3e8","method: rule counters (iptables-nft-save -c)","rule counter went 0 -> 1 packets between the snapshots around the drop","the rule's matches fit this packet"],"fix":["ip netns exec kdcap-s iptables-nft -t filter -I INPUT 1 -p tcp -d 10.250.0.2 --dport 7777 -j ACCEPT"],"fix_or":[["ip netns exec kdcap-s iptables-nft -t filter -D INPUT -p tcp -m tcp --dport 7777 -j DROP"]],"fix_notes":["the first repair lets TCP to 10.250.0.2:7777 through, from any client; deleting the rule lets everything it dropped through"],"inspect":["ip netns exec kdcap-s iptables-nft -t filter -L INPUT -v -n -x --line-numbers","ip netns exec kdcap-s iptables-nft-save -c -t filter"]},"netfilter":{"dropped_by":"rule","method":"rule counters (iptables-nft-save -c)","hook":"INPUT","family":"ip","backend":"iptables-nft","table":"filter","chain":"INPUT","rule":"-A INPUT -p tcp -m tcp --dport 7777 -j DROP","rule_number":1,"handle":null,"target":"DROP","packets_before":0,"packets_after":1,"ctstate_invalid":false,"evidence":["rule counter went 0 -> 1 packets between the snapshots around the drop","the rule's matches fit this packet"]},"handshake":1}"#;

    #[test]
    fn a_captured_netfilter_drop() {
        let r = Record::parse(NETFILTER_DROP);
        assert_eq!(r.kind, "drop");
        assert_eq!(r.netns, 4026532246);
        assert_eq!(r.netns_name.as_deref(), Some("kdcap-s"));
        assert_eq!(r.pod, None);
        assert_eq!((r.ifname.as_str(), r.ifindex), ("s0", 2));
        assert_eq!(r.family, "ipv4");
        let src: SocketAddr = "10.250.0.1:33522".parse().unwrap();
        let dst: SocketAddr = "10.250.0.2:7777".parse().unwrap();
        assert!(r.is_tuple(&src, &dst));
        assert!(!r.is_tuple(&dst, &src));
        assert!(r.of(src));
        assert_eq!(r.reason.as_deref(), Some("NETFILTER_DROP"));
        assert!(r.route_lookups.is_empty());
        assert!(r.ct.is_none());
        assert_eq!(r.cause(), "netfilter_rule");
        let f = r.finding();
        assert_eq!(f.evidence.len(), 4);
        assert_eq!(
            f.fix,
            [
                "ip netns exec kdcap-s iptables-nft -t filter -I INPUT 1 -p tcp -d 10.250.0.2 \
              --dport 7777 -j ACCEPT"
            ]
        );
        assert_eq!(f.fix_or.len(), 1);
        assert_eq!(f.inspect.len(), 2);
        let n = r.netfilter();
        assert_eq!(n.dropped_by, "rule");
        assert_eq!(n.backend.as_deref(), Some("iptables-nft"));
        assert_eq!(n.rule_number, Some(1));
        assert_eq!((n.packets_before, n.packets_after), (Some(0), Some(1)));
        assert_eq!(n.handle, None);
        assert_eq!(n.before_conntrack, None);
        assert!(r.network_policy.is_none());
        assert_eq!(r.handshake, Some(1));
        assert_eq!(r.to_string(), NETFILTER_DROP);
    }

    /// A field README gives as "or null" must still be there; a renamed
    /// field is a failure, not a `None`.
    #[test]
    fn a_missing_or_renamed_field_fails() {
        for (from, to) in [
            ("\"netns_name\":", "\"netns_label\":"),
            ("\"reason\":", "\"drop_reason\":"),
            ("\"cause\":", "\"why\":"),
            ("\"handshake\":", "\"attempt\":"),
            ("\"handle\":", "\"nft_handle\":"),
        ] {
            let line = NETFILTER_DROP.replacen(from, to, 1);
            assert!(
                serde_json::from_str::<Record>(&line).is_err(),
                "{from} renamed {to} still parsed"
            );
        }
    }
}
