//! Calico's iptables rules read back: the chain names and comments Felix
//! writes (projectcalico/calico felix/rules: rule_defs.go for the
//! prefixes, endpoints.go for a workload's chains and tiers, policy.go for
//! the policy and profile chains; the iptables renderer puts a
//! `cali:<hash>` comment first on every rule, then the rule's own). Its
//! nftables dataplane (felix/nftables: table_layer.go, renderer.go) writes
//! the same chains into one `calico` table, each prefixed with its layer
//! (`filter-cali-tw-...`), and one comment per rule: `cali:<hash>; <the
//! rule's comments>`.
use crate::{
    diagnosis::kube::services::tokens,
    model::netfilter::{Attribution, Backend, Table},
};

/// The layer prefix of Felix's nftables chains that hold its filter rules.
pub const NFT_FILTER_LAYER: &str = "filter-";

/// The chain an attribution names, as Felix names it in its iptables
/// dataplane (`cali-tw-...`): an nftables chain without its layer prefix.
pub fn chain_of(a: &Attribution) -> Option<&str> {
    let chain = a.chain.as_deref()?;
    let chain = match a.backend {
        Some(Backend::Nftables) => chain.strip_prefix(NFT_FILTER_LAYER)?,
        _ => chain,
    };
    chain.starts_with("cali-").then_some(chain)
}

/// To a workload (its ingress), from it (its egress).
pub const TO_WORKLOAD: &str = "cali-tw-";
pub const FROM_WORKLOAD: &str = "cali-fw-";
/// A policy's inbound and outbound chains, and policy groups (several
/// policies of one tier behind one chain).
pub const POLICY_IN: &str = "cali-pi-";
pub const POLICY_OUT: &str = "cali-po-";
pub const GROUP_IN: &str = "cali-gi-";
pub const GROUP_OUT: &str = "cali-go-";
/// A profile's chains: Calico's per-namespace (`kns.<ns>`) and
/// per-service-account (`ksa.<ns>.<sa>`) profiles.
pub const PROFILE_IN: &str = "cali-pri-";
pub const PROFILE_OUT: &str = "cali-pro-";

/// One `-A cali-... ` line taken apart as far as the diagnosis needs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FelixRule {
    pub chain: String,
    /// Every comment but Felix's own `cali:<hash>`.
    pub comments: Vec<String>,
    /// `-j` or `-g` target.
    pub target: String,
    pub in_iface: Option<String>,
    pub out_iface: Option<String>,
}

impl FelixRule {
    pub fn parse(text: &str) -> Option<Self> {
        let t = tokens(text);
        if t.first().map(String::as_str) != Some("-A") {
            return None;
        }
        let mut r = FelixRule {
            chain: t.get(1)?.clone(),
            ..Default::default()
        };
        let mut neg = false;
        for (i, tok) in t.iter().enumerate().skip(2) {
            let arg = t.get(i + 1).cloned();
            match tok.as_str() {
                "!" => {
                    neg = true;
                    continue;
                }
                "--comment" => r.comments.extend(arg.filter(|c| !c.starts_with("cali:"))),
                "-j" | "--jump" | "-g" | "--goto" => r.target = arg.unwrap_or_default(),
                "-i" | "--in-interface" if !neg => r.in_iface = arg,
                "-o" | "--out-interface" if !neg => r.out_iface = arg,
                _ => {}
            }
            neg = false;
        }
        Some(r)
    }

    /// A rule of Felix's nftables table, from its text as kdrop renders it
    /// (`... counter jump filter-cali-pi-x comment "cali:h; Start of tier
    /// default"`), in chain `chain` (with its layer prefix).
    pub fn parse_nft(chain: &str, text: &str) -> Option<Self> {
        let unlayered = |c: &str| c.strip_prefix(NFT_FILTER_LAYER).unwrap_or(c).to_string();
        let mut r = FelixRule {
            chain: unlayered(chain),
            ..Default::default()
        };
        let (body, comment) = match text.split_once(" comment \"") {
            Some((b, c)) => (
                b,
                Some(c.strip_suffix('"').unwrap_or(c).replace("\\\"", "\"")),
            ),
            None => (text, None),
        };
        if let Some(c) = comment {
            let own = match c.split_once(';') {
                Some((hash, rest)) if hash.starts_with("cali:") => rest.trim().to_string(),
                _ => c.trim().to_string(),
            };
            if !own.is_empty() {
                r.comments.push(own);
            }
        }
        let t: Vec<&str> = body.split_whitespace().collect();
        for (i, w) in t.iter().enumerate() {
            let next = t.get(i + 1).copied().unwrap_or_default();
            let name = || next.trim_matches('"').to_string();
            match *w {
                "jump" | "goto" => r.target = unlayered(next),
                "iifname" if next.starts_with('"') => r.in_iface = Some(name()),
                "oifname" if next.starts_with('"') => r.out_iface = Some(name()),
                _ => {}
            }
        }
        Some(r)
    }

    pub fn has_comment(&self, f: impl Fn(&str) -> bool) -> bool {
        self.comments.iter().any(|c| f(c))
    }
}

/// The tier Calico before 3.30 had alone, unnamed in its rules.
const ONLY_TIER: &str = "default";

/// `End of tier default. Drop if no policies passed packet` → `default`
/// (the action word is `Drop` or `Reject`, as Felix's deny action is set);
/// before 3.30, `Drop if no policies passed packet` alone.
pub fn end_of_tier(comment: &str) -> Option<&str> {
    let denied = |s: &str| {
        s.split_once(' ').is_some_and(|(a, t)| {
            matches!(a, "Drop" | "Reject") && t == "if no policies passed packet"
        })
    };
    match comment.strip_prefix("End of tier ") {
        Some(rest) => {
            let (tier, tail) = rest.split_once(". ")?;
            denied(tail).then_some(tier)
        }
        None => denied(comment).then_some(ONLY_TIER),
    }
}

/// `Start of tier default` → `default`; before 3.30, `Start of policies`.
pub fn start_of_tier(comment: &str) -> Option<&str> {
    comment
        .strip_prefix("Start of tier ")
        .or_else(|| (comment == "Start of policies").then_some(ONLY_TIER))
}

/// `Drop if no profiles matched` (or `Reject ...`).
pub fn no_profile(comment: &str) -> bool {
    comment.ends_with(" if no profiles matched")
}

/// What the first rule of a policy or profile chain says it is: the
/// kind (`KubernetesNetworkPolicy`, `NetworkPolicy`, `GlobalNetworkPolicy`,
/// `Profile`; `Policy` before Calico 3.30) and the name as Felix wrote it
/// (`shop/deny-cart`, `kns.shop`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

/// `KubernetesNetworkPolicy shop/allow-web ingress` → its owner.
pub fn owner_comment(comment: &str) -> Option<Owner> {
    let body = comment
        .strip_suffix(" ingress")
        .or_else(|| comment.strip_suffix(" egress"))?;
    let (kind, name) = body.split_once(' ')?;
    let word = |s: &str| !s.is_empty() && !s.contains(' ');
    (word(kind) && word(name) && kind.chars().next()?.is_ascii_uppercase()).then(|| Owner {
        kind: kind.into(),
        name: name.into(),
    })
}

/// The rules of one table, parsed once.
pub struct Rules {
    pub rules: Vec<FelixRule>,
}

impl Rules {
    pub fn of(table: &Table) -> Self {
        let nft = table.backend == Backend::Nftables;
        let rules = table
            .chains
            .iter()
            .flat_map(|c| c.rules.iter().map(move |r| (c, r)))
            .filter_map(|(c, r)| {
                if nft {
                    FelixRule::parse_nft(&c.name, &r.text)
                } else {
                    FelixRule::parse(&r.text)
                }
            })
            .collect();
        Rules { rules }
    }

    pub fn chain<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a FelixRule> + 'a {
        self.rules.iter().filter(move |r| r.chain == name)
    }

    /// Who a policy or profile chain belongs to, from its first rule's
    /// comment (Felix writes it there only).
    pub fn owner(&self, chain: &str) -> Option<Owner> {
        self.chain(chain)
            .next()?
            .comments
            .iter()
            .find_map(|c| owner_comment(c))
    }

    /// The workload interface an endpoint chain serves: the dispatch rule
    /// that sends to it (`-o cali95aa86cbb2a -g cali-tw-cali95aa86cbb2a`),
    /// else the chain's own suffix (Felix hashes it only when too long).
    pub fn iface_of(&self, endpoint_chain: &str) -> Option<String> {
        let dispatched = self
            .rules
            .iter()
            .filter(|r| r.target == endpoint_chain)
            .find_map(|r| r.out_iface.clone().or_else(|| r.in_iface.clone()));
        dispatched.or_else(|| {
            let s = endpoint_chain
                .strip_prefix(TO_WORKLOAD)
                .or_else(|| endpoint_chain.strip_prefix(FROM_WORKLOAD))?;
            (!s.starts_with('_') && !s.is_empty()).then(|| s.to_string())
        })
    }

    /// The endpoint chains that reach a policy chain, directly or through
    /// a policy group, with the tier whose section jumps to it.
    pub fn endpoints_of(&self, policy_chain: &str) -> Vec<(String, Option<String>)> {
        let groups: Vec<&str> = self
            .rules
            .iter()
            .filter(|r| r.target == policy_chain)
            .filter(|r| r.chain.starts_with(GROUP_IN) || r.chain.starts_with(GROUP_OUT))
            .map(|r| r.chain.as_str())
            .collect();
        let mut out = Vec::new();
        for r in &self.rules {
            let endpoint = r.chain.starts_with(TO_WORKLOAD) || r.chain.starts_with(FROM_WORKLOAD);
            if endpoint && (r.target == policy_chain || groups.contains(&r.target.as_str())) {
                let tier = self.tier_before(&r.chain, r);
                if !out.iter().any(|(c, _)| c == &r.chain) {
                    out.push((r.chain.clone(), tier));
                }
            }
        }
        out
    }

    /// The tier whose "Start of tier" comment comes last before `rule` in
    /// its chain.
    fn tier_before(&self, chain: &str, rule: &FelixRule) -> Option<String> {
        let mut tier = None;
        for r in self.chain(chain) {
            if std::ptr::eq(r, rule) {
                break;
            }
            if let Some(t) = r.comments.iter().find_map(|c| start_of_tier(c)) {
                tier = Some(t.to_string());
            }
        }
        tier
    }

    /// The policy chains a tier's section of an endpoint chain jumps to
    /// (policy groups opened one level), in order, before rule `upto`
    /// (1-based; the whole chain when None).
    pub fn tier_policies(&self, chain: &str, tier: &str, upto: Option<usize>) -> Vec<String> {
        let mut inside = false;
        let mut out = Vec::new();
        for (i, r) in self.chain(chain).enumerate() {
            if upto.is_some_and(|n| i + 1 >= n) {
                break;
            }
            if let Some(t) = r.comments.iter().find_map(|c| start_of_tier(c)) {
                inside = t == tier;
                continue;
            }
            if !inside {
                continue;
            }
            let t = r.target.as_str();
            if is_policy_chain(t) {
                out.push(t.to_string());
            } else if t.starts_with(GROUP_IN) || t.starts_with(GROUP_OUT) {
                out.extend(
                    self.chain(t)
                        .filter(|g| is_policy_chain(&g.target))
                        .map(|g| g.target.clone()),
                );
            }
        }
        out
    }

    /// The profile chains an endpoint chain jumps to before rule `upto`.
    pub fn profiles(&self, chain: &str, upto: Option<usize>) -> Vec<String> {
        self.chain(chain)
            .enumerate()
            .take_while(|(i, _)| upto.is_none_or(|n| i + 1 < n))
            .map(|(_, r)| r.target.as_str())
            .filter(|t| t.starts_with(PROFILE_IN) || t.starts_with(PROFILE_OUT))
            .map(String::from)
            .collect()
    }
}

pub fn is_policy_chain(c: &str) -> bool {
    c.starts_with(POLICY_IN) || c.starts_with(POLICY_OUT)
}
