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
mod deleted;
pub mod describe;
pub mod finding;
pub mod fixes;
pub mod kernel;
pub mod matching;
pub mod pairing;
pub mod unattributed;

pub use attribution::{attribute, attribute_within, Dropped};
pub use matching::{reads_source_port, Packet};
pub use unattributed::{unattributed, UNREAD};
