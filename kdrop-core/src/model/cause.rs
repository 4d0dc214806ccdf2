//! Why a handshake died, as kdrop names it: one enum, each cause with its
//! stable id (the JSON `cause`, the `kdrop_findings_total` label), its rank
//! (how much it says, for the verdict of a handshake several records
//! speak for) and what it means (the README's table of causes).
use serde::{Serialize, Serializer};

macro_rules! causes {
    ($($(#[doc = $doc:literal])+ $v:ident = $id:literal, $rank:literal;)+) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Cause {
            $($(#[doc = $doc])+ $v,)+
        }

        impl Cause {
            /// Every cause, in the order of the table.
            pub const ALL: &'static [Cause] = &[$(Cause::$v,)+];

            /// The cause whose id this is.
            pub fn from_id(id: &str) -> Option<Cause> {
                Self::ALL.iter().copied().find(|c| c.id() == id)
            }

            /// The stable id: never renamed (alerts and scripts match it).
            pub fn id(self) -> &'static str {
                match self {
                    $(Cause::$v => $id,)+
                }
            }

            /// How much it says, weakest first (0 to 3): a cause the kernel
            /// named for this very packet (a drop reason with its context)
            /// outranks one inferred from what did not happen (no reply),
            /// which outranks saying nothing.
            pub fn rank(self) -> u8 {
                match self {
                    $(Cause::$v => $rank,)+
                }
            }

            /// What it means, one sentence.
            pub fn doc(self) -> &'static str {
                match self {
                    $(Cause::$v => concat!($($doc),+).trim_ascii(),)+
                }
            }
        }
    };
}

causes! {
    /// Nothing answered the SYN and nothing on the traced side says why.
    Unanswered = "unanswered", 0;
    /// A drop whose kernel reason kdrop has no explanation for (or no reason at all).
    NoReason = "no_reason", 0;
    /// The client repeated a SYN its server answered: the SYN-ACK is lost past the server.
    DuplicateSyn = "duplicate_syn", 0;
    /// The server retransmitted its SYN-ACK and no final ACK came.
    SynAckUnanswered = "syn_ack_unanswered", 0;
    /// No socket listens on the port, or the packet matches no connection.
    NoSocket = "no_socket", 1;
    /// The client refused the SYN-ACK with a RST (no connection of its own matches it).
    SynAckReset = "syn_ack_reset", 1;
    /// Netfilter dropped it and kdrop could not tell which rule; the note says why (a tool that failed or timed out, the readings it lacked).
    Netfilter = "netfilter", 1;
    /// The frame was addressed to another host's MAC.
    Otherhost = "otherhost", 1;
    /// A DNAT'd SYN left this node and its reply takes another path back.
    AsymmetricReturnPath = "asymmetric_return_path", 2;
    /// Strict reverse-path filter: the way back to the source leaves by another interface.
    RpFilterStrict = "rp_filter_strict", 3;
    /// Reverse-path filter with no route back to the source at all.
    RpFilterLoose = "rp_filter_loose", 3;
    /// Reverse-path filter, named by the kernel's drop reason alone.
    RpFilter = "rp_filter", 3;
    /// An IPv6 rpfilter match (ip6tables or nftables fib) dropped it.
    Rpfilter6 = "rpfilter6", 3;
    /// The source is one of this host's addresses, arriving on another interface.
    MartianLocalSource = "martian_local_source", 3;
    /// The source address is invalid (martian).
    MartianSource = "martian_source", 3;
    /// A 127.0.0.0/8 address on an interface without route_localnet.
    MartianLocalnet = "martian_localnet", 3;
    /// No route for the destination.
    NoRoute = "no_route", 3;
    /// The next hop's neighbour entry failed to resolve.
    NeighbourFailed = "neighbour_failed", 3;
    /// An IPsec (xfrm) policy refused it.
    XfrmPolicy = "xfrm_policy", 3;
    /// A netfilter rule dropped it (named, with its counters or the kernel's verdict).
    NetfilterRule = "netfilter_rule", 3;
    /// A netfilter chain's policy dropped it.
    NetfilterPolicy = "netfilter_policy", 3;
    /// Conntrack called it INVALID and a rule drops INVALID packets.
    ConntrackInvalid = "conntrack_invalid", 3;
    /// Conntrack itself dropped it (table full, or the entry not inserted).
    ConntrackDrop = "conntrack_drop", 3;
    /// The NAT step dropped it: no address or port to map it to.
    NatDrop = "nat_drop", 3;
    /// A netfilter table dropped it, by a rule or its chain policy (counters do not say which).
    NetfilterTable = "netfilter_table", 3;
    /// The conntrack table was full (nf_conntrack_max).
    ConntrackTableFull = "conntrack_table_full", 3;
    /// Conntrack failed to insert the new entry (a clash).
    ConntrackInsertFailed = "conntrack_insert_failed", 3;
    /// A kube-proxy Service without ready endpoints rejected it.
    KubeNoEndpoints = "kube_no_endpoints", 3;
    /// A kube-proxy Service without an endpoint on this node (externalTrafficPolicy or internalTrafficPolicy Local) dropped it.
    KubeNoLocalEndpoints = "kube_no_local_endpoints", 3;
    /// A load balancer's source ranges (loadBalancerSourceRanges) refused the client.
    KubeSourceRanges = "kube_source_ranges", 3;
    /// kube-proxy's KUBE-FORWARD chain dropped a forwarded packet conntrack calls INVALID.
    KubeForwardInvalid = "kube_forward_invalid", 3;
    /// KUBE-FIREWALL blocked a connection to 127.0.0.0/8 from elsewhere (route_localnet on).
    KubeLocalnet = "kube_localnet", 3;
    /// A kube-proxy chain marked it for KUBE-FIREWALL to drop (before 1.25), no rule naming the Service.
    KubeMarkedDrop = "kube_marked_drop", 3;
    /// A Kubernetes network policy (Calico, kube-router, Cilium) denied the connection.
    NetworkPolicyDenied = "network_policy_denied", 3;
    /// A cgroup BPF program of the sending socket dropped it.
    BpfCgroup = "bpf_cgroup", 3;
    /// A socket filter of the receiving socket dropped it.
    SocketFilter = "socket_filter", 3;
    /// An XDP program dropped it.
    XdpProgram = "xdp_program", 3;
    /// A tc filter or program dropped it.
    TcFilter = "tc_filter", 3;
    /// The DNAT'd SYN-ACK of a hairpin connection came back un-NAT'd (bridged replies skip netfilter).
    HairpinNoReverseNat = "hairpin_no_reverse_nat", 3;
    /// A SYN looped back through a load balancer to this node and was DNAT'd without SNAT.
    LbLoopbackWithoutSnat = "lb_loopback_without_snat", 3;
    /// A listener's accept queue was full.
    ListenOverflow = "listen_overflow", 3;
    /// A listener's SYN queue was full.
    SynQueueOverflow = "syn_queue_overflow", 3;
    /// A listener answered with SYN cookies (its SYN queue full).
    SynCookies = "syn_cookies", 3;
}

// Written out: the table's macro has no place for `#[default]`.
#[allow(clippy::derivable_impls)]
impl Default for Cause {
    fn default() -> Self {
        Cause::NoReason
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

impl Serialize for Cause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.id())
    }
}

/// Tests and callers compare with the id as written in JSON.
impl PartialEq<&str> for Cause {
    fn eq(&self, other: &&str) -> bool {
        self.id() == *other
    }
}

impl PartialEq<str> for Cause {
    fn eq(&self, other: &str) -> bool {
        self.id() == other
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn ids_are_unique_snake_case_and_documented() {
        let mut seen = HashSet::new();
        for c in Cause::ALL {
            assert!(seen.insert(c.id()), "{} twice", c.id());
            assert!(
                c.id()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                c.id()
            );
            assert!(c.doc().ends_with('.'), "{}: {:?}", c.id(), c.doc());
            assert!(c.rank() <= 3);
        }
    }

    #[test]
    fn serialized_as_its_id() {
        assert_eq!(
            serde_json::to_string(&Cause::RpFilterStrict).unwrap(),
            "\"rp_filter_strict\""
        );
        assert_eq!(Cause::NoSocket, "no_socket");
        assert_eq!(Cause::NoSocket.to_string(), "no_socket");
    }

    /// The README's table of causes lists every cause, with its rank and
    /// meaning, in this order.
    #[test]
    fn the_readme_lists_every_cause() {
        let readme = include_str!("../../../README.md");
        let rows: Vec<&str> = readme
            .lines()
            .skip_while(|l| !l.starts_with("### Causes"))
            .skip(1)
            .take_while(|l| !l.starts_with('#'))
            .filter(|l| l.starts_with("| `"))
            .collect();
        let want: Vec<String> = Cause::ALL
            .iter()
            .map(|c| format!("| `{}` | {} | {} |", c.id(), c.rank(), c.doc()))
            .collect();
        assert_eq!(rows, want);
    }
}
