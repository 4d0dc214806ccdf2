//! A drop by Calico's network policy (its iptables dataplane), in
//! Kubernetes terms: which workload's chain ended the packet, in which
//! direction, in which tier, and whether no policy allowed it or a rule
//! denied it. felix.rs reads Felix's chains back; finding.rs and policy.rs
//! turn the verdict into a finding and the NetworkPolicy that allows the
//! connection.
pub mod felix;
pub mod finding;

pub use super::netpol::{policy, Direction};

use self::felix::{FelixRule, Owner, Rules};
use crate::model::netfilter::{Attribution, Backend, DroppedBy, Family, Table};

/// A policy or profile chain and whom it belongs to, when its first
/// rule's comment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub chain: String,
    pub owner: Option<Owner>,
}

/// How the workload's chain ended the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// "End of tier T. Drop if no policies passed packet": policies of the
    /// tier select the workload, none allowed (or passed) this packet.
    NoPolicyPassed { tier: String, policies: Vec<Chain> },
    /// A deny rule of a policy (or profile) chain dropped it.
    Denied {
        tier: Option<String>,
        policy: Chain,
        rule_number: Option<usize>,
    },
    /// "Drop if no profiles matched": no policy applied, and none of the
    /// endpoint's profiles allowed it.
    NoProfileMatched { profiles: Vec<Chain> },
}

/// A Calico drop, read from the ruleset that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CalicoDrop {
    pub direction: Direction,
    /// The workload endpoint's chain (`cali-tw-cali95aa86cbb2a`).
    pub endpoint_chain: String,
    /// Its host-side interface, when the dispatch rules name it.
    pub iface: Option<String>,
    pub ended: Ended,
    /// Several workloads' chains reach the denying policy and the packet's
    /// interface did not say which: the first was taken.
    pub ambiguous: bool,
}

impl CalicoDrop {
    /// The chains as the dataplane names them: Felix's nftables table
    /// prefixes each with its layer (`filter-cali-tw-...`).
    fn in_layer(mut self, layer: &str) -> Self {
        if layer.is_empty() {
            return self;
        }
        let named = |c: &mut Chain| c.chain.insert_str(0, layer);
        self.endpoint_chain.insert_str(0, layer);
        match &mut self.ended {
            Ended::NoPolicyPassed { policies, .. } => policies.iter_mut().for_each(named),
            Ended::Denied { policy, .. } => named(policy),
            Ended::NoProfileMatched { profiles } => profiles.iter_mut().for_each(named),
        }
        self
    }
}

/// Reads a rule drop in Calico's chains. `iface_in` is the device the
/// packet came in by, `iface_out` the one it was routed to (when known):
/// they tell which workload's chain reached a shared policy chain.
pub fn classify(
    a: &Attribution,
    tables: &[Table],
    iface_in: &str,
    iface_out: Option<&str>,
) -> Option<CalicoDrop> {
    let layer = match a.backend {
        Some(Backend::Nftables) => felix::NFT_FILTER_LAYER,
        _ => "",
    };
    classify_felix(a, tables, iface_in, iface_out).map(|d| d.in_layer(layer))
}

/// [`classify`] in Felix's own chain names (its iptables dataplane's).
fn classify_felix(
    a: &Attribution,
    tables: &[Table],
    iface_in: &str,
    iface_out: Option<&str>,
) -> Option<CalicoDrop> {
    if a.dropped_by != DroppedBy::Rule {
        return None;
    }
    let chain = felix::chain_of(a)?;
    let table = table_of(a, tables)?;
    let rules = Rules::of(table);
    let rule = match a.backend {
        Some(Backend::Nftables) => FelixRule::parse_nft(a.chain.as_deref()?, a.rule.as_deref()?)?,
        _ => FelixRule::parse(a.rule.as_deref()?)?,
    };
    let named = |c: &str| Chain {
        chain: c.to_string(),
        owner: rules.owner(c),
    };
    if let Some(direction) = endpoint_direction(chain) {
        let ended = if let Some(tier) = rule.comments.iter().find_map(|c| felix::end_of_tier(c)) {
            let policies = rules.tier_policies(chain, tier, a.rule_number);
            Ended::NoPolicyPassed {
                tier: tier.to_string(),
                policies: policies.iter().map(|c| named(c)).collect(),
            }
        } else if rule.has_comment(felix::no_profile) {
            let profiles = rules.profiles(chain, a.rule_number);
            Ended::NoProfileMatched {
                profiles: profiles.iter().map(|c| named(c)).collect(),
            }
        } else {
            return None;
        };
        return Some(CalicoDrop {
            direction,
            endpoint_chain: chain.to_string(),
            iface: rules.iface_of(chain),
            ended,
            ambiguous: false,
        });
    }
    denied(a, &rules, chain, iface_in, iface_out)
}

/// A drop inside a policy or profile chain: an explicit deny rule. The
/// workload is the one whose endpoint chain reaches it through the
/// packet's interface.
fn denied(
    a: &Attribution,
    rules: &Rules,
    chain: &str,
    iface_in: &str,
    iface_out: Option<&str>,
) -> Option<CalicoDrop> {
    let direction = policy_direction(chain)?;
    let iface = match direction {
        Direction::Ingress => iface_out,
        Direction::Egress => Some(iface_in),
    };
    let (endpoint_chain, tier, ambiguous) =
        if chain.starts_with(felix::PROFILE_IN) || chain.starts_with(felix::PROFILE_OUT) {
            let users = profile_users(rules, chain);
            let (ep, amb) = pick(users, iface, rules)?;
            (ep, None, amb)
        } else {
            let users = rules.endpoints_of(chain);
            let eps: Vec<String> = users.iter().map(|(c, _)| c.clone()).collect();
            let (ep, amb) = pick(eps, iface, rules)?;
            let tier = users
                .into_iter()
                .find(|(c, _)| c == &ep)
                .and_then(|(_, t)| t);
            (ep, tier, amb)
        };
    let owner = rules.owner(chain);
    Some(CalicoDrop {
        direction,
        iface: rules.iface_of(&endpoint_chain),
        endpoint_chain,
        ended: Ended::Denied {
            tier,
            policy: Chain {
                chain: chain.to_string(),
                owner,
            },
            rule_number: a.rule_number,
        },
        ambiguous,
    })
}

/// The endpoint chains that jump to a profile chain.
fn profile_users(rules: &Rules, chain: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in rules.rules.iter().filter(|r| r.target == chain) {
        if endpoint_direction(&r.chain).is_some() && !out.contains(&r.chain) {
            out.push(r.chain.clone());
        }
    }
    out
}

/// The endpoint chain of the packet's interface among `chains`, else the
/// only one, else the first (ambiguous).
fn pick(chains: Vec<String>, iface: Option<&str>, rules: &Rules) -> Option<(String, bool)> {
    if let Some(i) = iface {
        if let Some(c) = chains
            .iter()
            .find(|c| rules.iface_of(c).as_deref() == Some(i))
        {
            return Some((c.clone(), false));
        }
    }
    let ambiguous = chains.len() > 1;
    chains.into_iter().next().map(|c| (c, ambiguous))
}

fn endpoint_direction(chain: &str) -> Option<Direction> {
    if chain.starts_with(felix::TO_WORKLOAD) {
        Some(Direction::Ingress)
    } else if chain.starts_with(felix::FROM_WORKLOAD) {
        Some(Direction::Egress)
    } else {
        None
    }
}

fn policy_direction(chain: &str) -> Option<Direction> {
    let ingress = [felix::POLICY_IN, felix::PROFILE_IN];
    let egress = [felix::POLICY_OUT, felix::PROFILE_OUT];
    if ingress.iter().any(|p| chain.starts_with(p)) {
        Some(Direction::Ingress)
    } else if egress.iter().any(|p| chain.starts_with(p)) {
        Some(Direction::Egress)
    } else {
        None
    }
}

/// The filter table the attribution names, of its backend and family.
fn table_of<'a>(a: &Attribution, tables: &'a [Table]) -> Option<&'a Table> {
    let name = a.table.as_deref().unwrap_or("filter");
    tables.iter().find(|t| {
        t.name == name
            && a.backend.is_none_or(|b| b == t.backend)
            && a.family
                .is_none_or(|f| f == t.family || t.family == Family::Inet)
    })
}

#[cfg(test)]
mod nft_tests;
#[cfg(test)]
mod tests;
