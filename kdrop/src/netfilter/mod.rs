//! Which netfilter rule (or chain policy, or conntrack itself) dropped a
//! packet the kernel reported as `NETFILTER_DROP`. Pure logic only: the
//! rulesets come in as text the tools wrote, the I/O that runs those tools
//! inside the packet's namespace lives in `context::netfilter`.
//!
//! # Methods, best first (a ladder, like the probes')
//! 1. Kernel evidence ([`kernel`]): the NF_DROP verdict `nf_conntrack_in`,
//!    `nf_nat_inet_fn`, `nft_do_chain` or `ipt_do_table` returned for this
//!    packet (fexit or kretprobe; kernels with kprobes or fentry, not the
//!    development host), with the hook, table and chain. For a rule walker
//!    the counters below then name the rule inside that table and hook.
//! 2. Rule counters: the packet counters of every rule and chain policy,
//!    read before and after the drop through the tools' machine-readable
//!    output (`iptables-legacy-save -c`, `iptables-nft-save -c`, `nft -j list
//!    ruleset`). The drop rule whose counter moved and whose matches accept
//!    this packet, or the base chain whose policy counter moved.
//! 3. Ruleset evaluation: the packet walked through the ruleset with the
//!    matches kdrop can evaluate (nftables rules without a `counter`, chain
//!    policies of native nftables chains, which have no counter, or a
//!    namespace seen for the first time, with no snapshot from before).
//!
//! Nothing here changes the ruleset.
pub mod attribution;
pub mod finding;
pub mod iptables;
pub mod kernel;
pub mod matching;
pub mod nft;

use std::fmt;

use serde::Serialize;

pub use attribution::{attribute, Attribution};
pub use matching::Packet;

/// Which tool manages (and reports) a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
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

/// A netfilter hook, named as iptables names its built-in chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Accept,
    Drop,
}

/// A chain attached to a hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub hook: Hook,
    /// Lower runs first; iptables tables have fixed ones (raw -300, ...).
    pub priority: i32,
    pub policy: Policy,
    /// Packets that met the policy (iptables `:INPUT DROP [n:bytes]`);
    /// native nftables chains keep none.
    pub policy_packets: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

/// Where a rule sends a matching packet.
#[derive(Clone, Debug, PartialEq, Eq)]
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// As the tool writes it: `-A INPUT -p tcp -m tcp --dport 80 -j DROP`
    /// (`iptables -S`), or `tcp dport 80 counter drop` for nftables.
    pub text: String,
    /// nftables rule handle.
    pub handle: Option<u64>,
    pub matches: Vec<matching::Match>,
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ConntrackMoved {
    pub before: ConntrackStats,
    pub after: ConntrackStats,
}

/// An interface of the namespace: name, bridge master, local addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Iface {
    pub index: u32,
    pub name: String,
    pub master: Option<String>,
    pub addrs: Vec<std::net::IpAddr>,
}

/// Everything read from one namespace at one moment.
#[derive(Clone, Debug, Default)]
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
