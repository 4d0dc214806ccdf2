//! Why no rule, policy or conntrack drop could be named for a
//! NETFILTER_DROP: the finding says it, so that "kdrop could not tell"
//! comes with what kdrop lacked (a tool that failed or timed out, no
//! reading from before the drop) rather than alone.
use crate::model::netfilter::Snapshot;

/// The namespace could not be entered to read its rules at all.
pub const UNREAD: &str = "the namespace's rules could not be read (it is gone, or kdrop could not \
                          enter it)";

/// Why `attribute` found nothing in these readings.
pub fn unattributed(before: Option<&Snapshot>, after: &Snapshot) -> String {
    if !after.problems.is_empty() {
        return format!(
            "the rules read after the drop are incomplete: {}",
            after.problems.join("; ")
        );
    }
    if after.tables.iter().all(|t| t.chains.is_empty()) {
        return "no netfilter chain was found in the namespace after the drop".into();
    }
    let Some(b) = before else {
        return "no rule or chain policy that drops matches this packet in the rules read after \
                the drop, and no reading from before it shows which counter moved"
            .into();
    };
    if !b.problems.is_empty() {
        return format!(
            "the rules read before the drop are incomplete: {}",
            b.problems.join("; ")
        );
    }
    format!(
        "no counter of a rule or chain policy that could drop this packet moved in the {:.1} s \
         between the readings before and after the drop, and none matches it",
        after.started_ns.saturating_sub(b.finished_ns) as f64 / 1e9
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::netfilter::{Backend, Chain, Family, Table};

    fn snap(chains: usize, problems: &[&str], at: (u64, u64)) -> Snapshot {
        Snapshot {
            started_ns: at.0,
            finished_ns: at.1,
            tables: vec![Table {
                backend: Backend::IptablesNft,
                family: Family::Ip,
                name: "filter".into(),
                chains: (0..chains)
                    .map(|i| Chain {
                        name: format!("c{i}"),
                        base: None,
                        rules: vec![],
                    })
                    .collect(),
                source: "iptables-nft-save -c".into(),
            }],
            problems: problems.iter().map(|p| p.to_string()).collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_tool_that_failed_is_named() {
        let after = snap(
            1,
            &["/usr/sbin/nft did not answer within 5s", "netlink: EPERM"],
            (0, 0),
        );
        assert_eq!(
            unattributed(None, &after),
            "the rules read after the drop are incomplete: /usr/sbin/nft did not answer within \
             5s; netlink: EPERM"
        );
        let before = snap(1, &["iptables-nft-save -c failed: x"], (0, 0));
        assert_eq!(
            unattributed(Some(&before), &snap(1, &[], (0, 0))),
            "the rules read before the drop are incomplete: iptables-nft-save -c failed: x"
        );
    }

    #[test]
    fn empty_readings_and_first_sight_say_so() {
        assert_eq!(
            unattributed(None, &snap(0, &[], (0, 0))),
            "no netfilter chain was found in the namespace after the drop"
        );
        assert_eq!(
            unattributed(None, &Snapshot::default()),
            "no netfilter chain was found in the namespace after the drop"
        );
        assert!(unattributed(None, &snap(2, &[], (0, 0)))
            .ends_with("and no reading from before it shows which counter moved"));
    }

    #[test]
    fn both_readings_whole_give_the_interval() {
        let before = snap(1, &[], (1_000_000_000, 1_200_000_000));
        let after = snap(1, &[], (3_700_000_000, 3_900_000_000));
        assert_eq!(
            unattributed(Some(&before), &after),
            "no counter of a rule or chain policy that could drop this packet moved in the 2.5 s \
             between the readings before and after the drop, and none matches it"
        );
    }
}
