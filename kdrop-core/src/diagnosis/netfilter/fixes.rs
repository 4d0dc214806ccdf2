//! The repairs a netfilter finding writes, one template per kind, each with
//! a stable name and the integration test that applies it and then makes a
//! new connection (issue #25: no repair ships untried). A kind added here
//! must name its test (`test` is an exhaustive match), and the unit test
//! below fails when that test is not in `tests/tests/`.

/// One kind of repair command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixKind {
    /// `iptables -I CHAIN n -p tcp -d DST --dport PORT -j ACCEPT` before the
    /// rule that dropped a SYN.
    IptablesAcceptBeforeRule,
    /// `iptables -D <the rule as iptables -S wrote it>`.
    IptablesDeleteRule,
    /// `iptables -A CHAIN -p tcp -d DST --dport PORT -j ACCEPT` ahead of a
    /// chain's DROP policy.
    IptablesAcceptAtPolicy,
    /// `iptables -I CHAIN n -m conntrack --ctstate ESTABLISHED,RELATED -j
    /// ACCEPT`: replies (and the rest) of connections the chain let through.
    IptablesAcceptEstablished,
    /// `iptables -A CHAIN -p tcp -s SRV --sport PORT -j ACCEPT` (or `-I
    /// CHAIN n`): the service's replies in a chain before conntrack.
    IptablesAcceptReplies,
    /// `nft insert rule ... position H ip daddr DST tcp dport PORT accept`.
    NftAcceptBeforeRule,
    /// `nft delete rule ... handle H`.
    NftDeleteRule,
    /// `nft add rule ... ip daddr DST tcp dport PORT accept`.
    NftAcceptAtPolicy,
    /// `nft insert rule ... [position H] ct state established,related accept`.
    NftAcceptEstablished,
    /// `nft add rule ... ip saddr SRV tcp sport PORT accept` (or `insert
    /// ... position H`): the service's replies in a chain before conntrack.
    NftAcceptReplies,
}

/// The conntrack states the reply repairs accept, in each tool's spelling.
pub const IPTABLES_ESTABLISHED: &str = "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT";
pub const NFT_ESTABLISHED: &str = "ct state established,related accept";

impl FixKind {
    pub const ALL: [FixKind; 10] = [
        FixKind::IptablesAcceptBeforeRule,
        FixKind::IptablesDeleteRule,
        FixKind::IptablesAcceptAtPolicy,
        FixKind::IptablesAcceptEstablished,
        FixKind::IptablesAcceptReplies,
        FixKind::NftAcceptBeforeRule,
        FixKind::NftDeleteRule,
        FixKind::NftAcceptAtPolicy,
        FixKind::NftAcceptEstablished,
        FixKind::NftAcceptReplies,
    ];

    /// The stable name (README's table of repairs and their tests).
    pub fn name(self) -> &'static str {
        match self {
            FixKind::IptablesAcceptBeforeRule => "iptables_accept_before_rule",
            FixKind::IptablesDeleteRule => "iptables_delete_rule",
            FixKind::IptablesAcceptAtPolicy => "iptables_accept_at_policy",
            FixKind::IptablesAcceptEstablished => "iptables_accept_established",
            FixKind::IptablesAcceptReplies => "iptables_accept_replies",
            FixKind::NftAcceptBeforeRule => "nft_accept_before_rule",
            FixKind::NftDeleteRule => "nft_delete_rule",
            FixKind::NftAcceptAtPolicy => "nft_accept_at_policy",
            FixKind::NftAcceptEstablished => "nft_accept_established",
            FixKind::NftAcceptReplies => "nft_accept_replies",
        }
    }

    /// `file::function` of the integration test (tests/tests/<file>.rs)
    /// that applies this kind from kdrop's JSON and then connects.
    pub fn test(self) -> &'static str {
        match self {
            FixKind::IptablesAcceptBeforeRule | FixKind::IptablesDeleteRule => {
                "nf_fixes::rule_fixes_legacy"
            }
            FixKind::IptablesAcceptAtPolicy | FixKind::IptablesAcceptEstablished => {
                "nf_fixes::forward_policy_fix_on_bridge_legacy"
            }
            FixKind::NftAcceptBeforeRule | FixKind::NftDeleteRule => "nf_fixes::nft_rule_fixes",
            FixKind::NftAcceptAtPolicy | FixKind::NftAcceptEstablished => {
                "nf_fixes::nft_forward_policy_fix"
            }
            FixKind::IptablesAcceptReplies => "nf_fixes::raw_policy_fix_on_bridge_legacy",
            FixKind::NftAcceptReplies => "nf_fixes::nft_raw_policy_fix",
        }
    }

    /// The kind of a command a netfilter finding wrote (after any `ip
    /// netns exec NS`), or `None` for one no template here writes.
    pub fn of(cmd: &str) -> Option<FixKind> {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let has = |w: &str| words.contains(&w);
        let nft = words.windows(2).any(|p| p[0] == "nft" && p[1] != "-a");
        // iptables-legacy, ip6tables-nft, ...
        let iptables = words.iter().any(|w| w.contains("tables-"));
        Some(if nft {
            match (has("insert"), has("delete"), has("add")) {
                _ if cmd.contains(NFT_ESTABLISHED) && has("insert") => {
                    FixKind::NftAcceptEstablished
                }
                _ if cmd.contains(" tcp sport ") && cmd.ends_with(" accept") => {
                    FixKind::NftAcceptReplies
                }
                (true, _, _) if has("position") => FixKind::NftAcceptBeforeRule,
                (_, true, _) => FixKind::NftDeleteRule,
                (_, _, true) => FixKind::NftAcceptAtPolicy,
                _ => return None,
            }
        } else if iptables {
            match (has("-I"), has("-D"), has("-A")) {
                _ if cmd.contains(IPTABLES_ESTABLISHED) && has("-I") => {
                    FixKind::IptablesAcceptEstablished
                }
                _ if has("--sport") && !has("-D") && cmd.ends_with("-j ACCEPT") => {
                    FixKind::IptablesAcceptReplies
                }
                (true, _, _) => FixKind::IptablesAcceptBeforeRule,
                (_, true, _) => FixKind::IptablesDeleteRule,
                (_, _, true) => FixKind::IptablesAcceptAtPolicy,
                _ => return None,
            }
        } else {
            return None;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind's test exists as a `#[test] fn` in its file, and that file
    /// checks the kinds it applied by name (`FixKind::of` on each command).
    #[test]
    fn every_fix_kind_has_an_integration_test_that_applies_it() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests");
        for kind in FixKind::ALL {
            crate::diagnosis::fix_kinds::tests::assert_applied_by(
                &dir,
                kind.test(),
                &format!("FixKind::{kind:?}"),
                kind.name(),
            );
        }
    }

    #[test]
    fn commands_are_told_apart() {
        let cases = [
            (
                "ip netns exec n iptables-nft -t filter -I INPUT 2 -p tcp -d 10.0.0.2 --dport 80 -j ACCEPT",
                FixKind::IptablesAcceptBeforeRule,
            ),
            (
                "ip6tables-legacy -t filter -D INPUT -p tcp -m tcp --dport 80 -j DROP",
                FixKind::IptablesDeleteRule,
            ),
            (
                "iptables-legacy -t filter -A FORWARD -p tcp -d 10.0.0.2 --dport 80 -j ACCEPT",
                FixKind::IptablesAcceptAtPolicy,
            ),
            (
                "iptables-legacy -t filter -I FORWARD 1 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                FixKind::IptablesAcceptEstablished,
            ),
            (
                "nft insert rule inet t input position 4 ip daddr 10.0.0.2 tcp dport 80 accept",
                FixKind::NftAcceptBeforeRule,
            ),
            (
                "nft delete rule inet t input handle 4",
                FixKind::NftDeleteRule,
            ),
            (
                "ip netns exec n nft add rule inet t forward ip6 daddr fd00::2 tcp dport 80 accept",
                FixKind::NftAcceptAtPolicy,
            ),
            (
                "nft insert rule inet t forward ct state established,related accept",
                FixKind::NftAcceptEstablished,
            ),
            (
                "iptables-nft -t raw -A PREROUTING -p tcp -s 10.0.0.2 --sport 80 -j ACCEPT",
                FixKind::IptablesAcceptReplies,
            ),
            (
                "nft add rule inet t pre ip6 saddr fd00::2 tcp sport 80 accept",
                FixKind::NftAcceptReplies,
            ),
            (
                "nft insert rule inet t pre position 3 ip saddr 10.0.0.2 tcp sport 80 accept",
                FixKind::NftAcceptReplies,
            ),
        ];
        for (cmd, kind) in cases {
            assert_eq!(FixKind::of(cmd), Some(kind), "{cmd}");
        }
        assert_eq!(FixKind::of("nft -a list chain inet t input"), None);
        assert_eq!(FixKind::of("sysctl -w net.ipv4.ip_forward=1"), None);
    }
}
