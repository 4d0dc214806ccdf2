//! Netfilter as kdrop reads it: tables, chains and rules with their packet
//! counters (from iptables-save and nft JSON), conntrack's statistics, and
//! the attribution of a drop to a rule, a policy or conntrack.
use std::{fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

/// Which tool manages (and reports) a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Backend {
    #[serde(rename = "iptables-legacy")]
    IptablesLegacy,
    #[serde(rename = "iptables-nft")]
    IptablesNft,
    #[serde(rename = "nftables")]
    Nftables,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::IptablesLegacy => "iptables-legacy",
            Backend::IptablesNft => "iptables-nft",
            Backend::Nftables => "nftables",
        }
    }
}

/// Netfilter family, spelled as nftables does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ip,
    Ip6,
    Inet,
    Bridge,
    Arp,
    Netdev,
}

impl Family {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ip" => Family::Ip,
            "ip6" => Family::Ip6,
            "inet" => Family::Inet,
            "bridge" => Family::Bridge,
            "arp" => Family::Arp,
            "netdev" => Family::Netdev,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
            Family::Bridge => "bridge",
            Family::Arp => "arp",
            Family::Netdev => "netdev",
        }
    }
}

/// IPPROTO_TCP: every packet kdrop reports is TCP.
pub const PROTO_TCP: u8 = 6;

/// A netfilter hook, named as iptables names its built-in chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    pub const ALL: [Hook; 5] = [
        Hook::Prerouting,
        Hook::Input,
        Hook::Forward,
        Hook::Output,
        Hook::Postrouting,
    ];

    /// `INPUT` (iptables built-in chain) or `input` (nftables hook).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "prerouting" => Hook::Prerouting,
            "input" => Hook::Input,
            "forward" => Hook::Forward,
            "output" => Hook::Output,
            "postrouting" => Hook::Postrouting,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Hook::Prerouting => "PREROUTING",
            Hook::Input => "INPUT",
            Hook::Forward => "FORWARD",
            Hook::Output => "OUTPUT",
            Hook::Postrouting => "POSTROUTING",
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a base chain does with a packet no rule decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    Accept,
    Drop,
}

/// A chain attached to a hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseChain {
    pub hook: Hook,
    /// Lower runs first; iptables tables have fixed ones (raw -300, ...).
    pub priority: i32,
    pub policy: Policy,
    /// Packets that met the policy (iptables `:INPUT DROP [n:bytes]`);
    /// native nftables chains keep none.
    pub policy_packets: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

/// Where a rule sends a matching packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Accept,
    Drop,
    /// REJECT: drops (and answers with an ICMP error or a RST).
    Reject,
    /// Ends evaluation without dropping here: NFQUEUE, DNAT, SNAT, ...
    Terminal,
    Return,
    Jump(String),
    Goto(String),
    /// Non-terminating (LOG, MARK, a bare counter): evaluation goes on.
    Continue,
    /// An nftables verdict map (`vmap`): which element applies is not
    /// evaluated; it may drop, and may jump to these chains.
    Map {
        may_drop: bool,
        chains: Vec<String>,
    },
}

impl Verdict {
    pub fn drops(&self) -> bool {
        matches!(
            self,
            Verdict::Drop | Verdict::Reject | Verdict::Map { may_drop: true, .. }
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// As the tool writes it: `-A INPUT -p tcp -m tcp --dport 80 -j DROP`
    /// (`iptables -S`), or `tcp dport 80 counter drop` for nftables.
    pub text: String,
    /// nftables rule handle.
    pub handle: Option<u64>,
    pub matches: Vec<Match>,
    pub verdict: Verdict,
    /// `DROP`, `REJECT --reject-with tcp-reset`, `drop`, `reject`, ...
    pub target: String,
    /// Packet counter; `None` for nftables rules without `counter`.
    pub packets: Option<u64>,
    /// How many of `matches` the counter sits behind: it counts the packets
    /// that passed those. Equal to `matches.len()` when the counter counts
    /// exactly the packets the rule matched.
    pub counted_matches: usize,
}

/// A table as one tool reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    pub backend: Backend,
    pub family: Family,
    pub name: String,
    pub chains: Vec<Chain>,
    /// The command whose output this is (`iptables-legacy-save -c`).
    pub source: String,
}

impl Table {
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }
}

/// Conntrack's own counters (`/proc/net/stat/nf_conntrack` of the
/// namespace, summed over CPUs) and table fill.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackStats {
    pub drop: u64,
    pub insert_failed: u64,
    pub early_drop: u64,
    pub invalid: u64,
    /// Insertions refused because a hash chain was too long (the
    /// `chainlength` column; `chaintoolong` in `conntrack -S`).
    pub chaintoolong: u64,
    /// Clashes resolved without a drop (`clashres`).
    pub clash_resolve: u64,
    /// Entries in this namespace (`nf_conntrack_count`).
    pub count: Option<u64>,
    /// `nf_conntrack_max`: global, compared with each namespace's count.
    pub max: Option<u64>,
    /// `nf_conntrack_buckets`: hash table size, global.
    pub buckets: Option<u64>,
}

/// Conntrack's counters before and after a drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackMoved {
    pub before: ConntrackStats,
    pub after: ConntrackStats,
}

/// An interface of the namespace: name, bridge master, local addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iface {
    pub index: u32,
    pub name: String,
    pub master: Option<String>,
    pub addrs: Vec<std::net::IpAddr>,
}

/// Everything read from one namespace at one moment.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC ns (the clock of the kernel's event timestamps) when
    /// reading began and ended: the counters are from in between.
    pub started_ns: u64,
    pub finished_ns: u64,
    pub tables: Vec<Table>,
    pub conntrack: Option<ConntrackStats>,
    pub ifaces: Vec<Iface>,
    /// What could not be read, for the evidence (`nft: not installed`).
    pub problems: Vec<String>,
}

/// Splits a priority given as a number or as an nftables standard name.
pub fn priority_of(family: Family, prio: &str) -> Option<i32> {
    if let Ok(n) = prio.parse() {
        return Some(n);
    }
    // `raw + 10`: nftables writes offsets from a standard name.
    let (name, offset) = match prio.split_once(['+', '-']) {
        Some((n, o)) => {
            let o: i32 = o.trim().parse().ok()?;
            let neg = prio.contains('-');
            (n.trim(), if neg { -o } else { o })
        }
        None => (prio.trim(), 0),
    };
    // nft(8) "STANDARD PRIORITY NAMES".
    let base = match (family, name) {
        (Family::Bridge, "dstnat") => -300,
        (Family::Bridge, "filter") => -200,
        (Family::Bridge, "out") => 100,
        (Family::Bridge, "srcnat") => 300,
        (_, "raw") => -300,
        (_, "mangle") => -150,
        (_, "dstnat") => -100,
        (_, "filter") => 0,
        (_, "security") => 50,
        (_, "srcnat") => 100,
        _ => return None,
    };
    Some(base + offset)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dir {
    Src,
    Dst,
    /// multiport `--ports`: either port.
    Either,
}

/// Conntrack states (`--ctstate`, `ct state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CtState {
    New,
    Established,
    Related,
    Invalid,
    Untracked,
    /// SNAT/DNAT virtual states: not evaluated.
    Nat,
}

impl CtState {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "new" => CtState::New,
            "established" => CtState::Established,
            "related" => CtState::Related,
            "invalid" => CtState::Invalid,
            "untracked" => CtState::Untracked,
            "snat" | "dnat" => CtState::Nat,
            _ => return None,
        })
    }
}

/// One condition of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Match {
    /// Layer 4 protocol number (`-p tcp`, `meta l4proto tcp`).
    Proto {
        neg: bool,
        proto: u8,
    },
    /// The rule only sees IPv4 (`ip saddr` in an inet table) or IPv6.
    L3 {
        v6: bool,
    },
    /// Address in a prefix.
    Addr {
        dir: Dir,
        neg: bool,
        net: IpAddr,
        len: u8,
    },
    /// Address in an inclusive range (iprange, nft `a-b`).
    AddrRange {
        dir: Dir,
        neg: bool,
        lo: IpAddr,
        hi: IpAddr,
    },
    /// Any of these addresses/prefixes (nft anonymous set).
    AddrSet {
        dir: Dir,
        neg: bool,
        nets: Vec<(IpAddr, u8)>,
    },
    /// Port in any of these inclusive ranges; `proto` is the protocol the
    /// match belongs to (a `udp dport` never matches TCP).
    Port {
        dir: Dir,
        neg: bool,
        proto: u8,
        ranges: Vec<(u16, u16)>,
    },
    /// Interface name; `+` (iptables) or `*` (nftables) at the end is a
    /// prefix wildcard.
    Iface {
        input: bool,
        neg: bool,
        name: String,
    },
    /// `(flags & mask) == value`, or with `any` set `(flags & mask) != 0`.
    TcpFlags {
        neg: bool,
        mask: u8,
        value: u8,
        any: bool,
    },
    CtState {
        neg: bool,
        states: Vec<CtState>,
    },
    /// `(mark & mask) == value`.
    Mark {
        neg: bool,
        value: u32,
        mask: u32,
    },
    /// Anything else, as written: `-m set --match-set x src`.
    Unknown(String),
}

/// What dropped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DroppedBy {
    Rule,
    Policy,
    Conntrack,
    /// The NAT step (kernel verdict of nf_nat_inet_fn).
    Nat,
    /// A rule or the policy of this table and hook, by the kernel's
    /// verdict; no counter said which.
    Table,
}

/// kdrop's answer, with the evidence for it. Serialized as the `netfilter`
/// field of a JSON event (README).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribution {
    pub dropped_by: DroppedBy,
    /// `rule counters (iptables-legacy-save -c)`, `ruleset evaluation (nft
    /// -j list ruleset)`, `conntrack statistics (...)`.
    pub method: String,
    pub hook: Option<Hook>,
    pub family: Option<Family>,
    pub backend: Option<Backend>,
    pub table: Option<String>,
    pub chain: Option<String>,
    /// `-A INPUT -p tcp -m tcp --dport 80 -j DROP`, or nftables rule text.
    pub rule: Option<String>,
    /// 1-based position in its chain (`--line-numbers`).
    pub rule_number: Option<usize>,
    /// nftables rule handle.
    pub handle: Option<u64>,
    /// `DROP`, `REJECT --reject-with tcp-reset`, `drop`; the policy for a
    /// chain policy.
    pub target: Option<String>,
    pub packets_before: Option<u64>,
    pub packets_after: Option<u64>,
    /// The rule matches conntrack state INVALID.
    pub ctstate_invalid: bool,
    /// For a chain policy's drop: whether the chain has a rule that accepts
    /// every packet of an established connection (`--ctstate ESTABLISHED`,
    /// `ct state established`), so that the replies of what it lets in pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepts_established: Option<bool>,
    /// The chain runs before conntrack (the raw table, priority below
    /// -200): no conntrack state is known there yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_conntrack: bool,
    /// The rule is gone from the rules read after the drop (deleted since):
    /// named from the reading before it. Present (and true) only then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
    /// For a conntrack drop: its statistics before and after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conntrack: Option<ConntrackMoved>,
    pub evidence: Vec<String>,
}

impl Attribution {
    /// Who dropped it and how kdrop knows, nothing else yet: no rule, no
    /// counters, no evidence.
    pub fn bare(dropped_by: DroppedBy, method: String) -> Self {
        Self {
            dropped_by,
            method,
            hook: None,
            family: None,
            backend: None,
            table: None,
            chain: None,
            rule: None,
            rule_number: None,
            handle: None,
            target: None,
            packets_before: None,
            packets_after: None,
            ctstate_invalid: false,
            accepts_established: None,
            before_conntrack: false,
            gone: false,
            conntrack: None,
            evidence: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(Hook::parse("INPUT"), Some(Hook::Input));
        assert_eq!(Hook::parse("postrouting"), Some(Hook::Postrouting));
        assert_eq!(Hook::parse("ingress"), None);
        assert_eq!(Hook::Forward.to_string(), "FORWARD");
        assert_eq!(Family::parse("inet"), Some(Family::Inet));
        assert_eq!(Family::parse("x"), None);
        assert_eq!(Backend::IptablesNft.name(), "iptables-nft");
        assert_eq!(
            serde_json::to_string(&Backend::IptablesLegacy).unwrap(),
            "\"iptables-legacy\""
        );
        assert_eq!(serde_json::to_string(&Hook::Input).unwrap(), "\"INPUT\"");
        assert_eq!(serde_json::to_string(&Family::Ip6).unwrap(), "\"ip6\"");
    }

    #[test]
    fn priorities() {
        assert_eq!(priority_of(Family::Ip, "-300"), Some(-300));
        assert_eq!(priority_of(Family::Inet, "filter"), Some(0));
        assert_eq!(priority_of(Family::Inet, "raw + 10"), Some(-290));
        assert_eq!(priority_of(Family::Ip, "mangle - 5"), Some(-155));
        assert_eq!(priority_of(Family::Bridge, "filter"), Some(-200));
        assert_eq!(priority_of(Family::Ip, "bogus"), None);
    }

    #[test]
    fn drop_verdicts() {
        assert!(Verdict::Drop.drops());
        assert!(Verdict::Reject.drops());
        assert!(!Verdict::Accept.drops());
        assert!(!Verdict::Jump("X".into()).drops());
    }
}
