//! A rule deleted between a drop and kdrop's reading after it: named
//! from the reading before the drop (see `deleted_since`).
use super::{
    attribution::{attribute_in, Dropped},
    describe::{FIRST_LOOK, NO_COUNTER},
    kernel::Scope,
};
use crate::model::netfilter::{Attribution, DroppedBy, Snapshot};

/// A rule deleted between the drop and the reading after it (removed at
/// once by whoever saw the drop, or kdrop reading late): the reading from
/// before the drop still holds it. The packet is walked through that
/// reading by its matches alone (its counters are from before the drop,
/// no conntrack statistics are compared), and a rule found there counts
/// only if the reading after lacks it.
pub(super) fn deleted_since(
    d: &Dropped,
    before: &Snapshot,
    after: &Snapshot,
    scope: Option<&Scope>,
) -> Option<Attribution> {
    let mut a = attribute_in(d, None, before, scope, false)?;
    let rule = a.rule.as_ref()?;
    let still_there = after.tables.iter().any(|t| {
        Some(t.family) == a.family
            && Some(t.backend) == a.backend
            && Some(&t.name) == a.table.as_ref()
            && a.chain
                .as_ref()
                .and_then(|c| t.chain(c))
                .is_some_and(|c| c.rules.iter().any(|r| &r.text == rule))
    });
    if a.dropped_by != DroppedBy::Rule || still_there {
        return None;
    }
    a.gone = true;
    a.evidence.retain(|l| l != NO_COUNTER && l != FIRST_LOOK);
    a.evidence.insert(
        0,
        "the rule is gone from the rules read after the drop (deleted since): found in the \
         reading from before the drop, by the packet's walk through its matches"
            .into(),
    );
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        diagnosis::netfilter::{attribute, matching::TCP_SYN},
        model::netfilter::{Backend, Family, Iface},
        parse::iptables_save::parse_save,
    };

    fn snap(input: &[(u64, &str)]) -> Snapshot {
        let mut text = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
                        :OUTPUT ACCEPT [0:0]\n"
            .to_string();
        for (n, spec) in input {
            text.push_str(&format!("[{n}:0] -A INPUT {spec}\n"));
        }
        text.push_str("COMMIT\n");
        Snapshot {
            tables: parse_save(
                &text,
                Backend::IptablesNft,
                Family::Ip,
                "iptables-nft-save -c",
            )
            .unwrap(),
            ifaces: vec![Iface {
                index: 2,
                name: "c0".into(),
                master: None,
                addrs: vec!["10.7.0.1".parse().unwrap()],
            }],
            ..Snapshot::default()
        }
    }

    /// A SYN-ACK from the server to the client's port 40000.
    fn syn_ack() -> Dropped {
        Dropped {
            src: "10.7.0.2".parse().unwrap(),
            dst: "10.7.0.1".parse().unwrap(),
            sport: 80,
            dport: 40000,
            tcp_flags: TCP_SYN | 0x10,
            mark: 0,
            ifindex: 2,
        }
    }

    const RULE: &str = "-p tcp -m tcp --dport 40000 -j DROP";

    #[test]
    fn a_rule_deleted_after_the_drop_is_named_from_the_reading_before() {
        // Its counter read 0 before (the drop came after that reading):
        // matches alone name it.
        let before = snap(&[(3, "-p tcp -m tcp --dport 22 -j ACCEPT"), (0, RULE)]);
        let after = snap(&[(3, "-p tcp -m tcp --dport 22 -j ACCEPT")]);
        let a = attribute(&syn_ack(), Some(&before), &after).unwrap();
        assert_eq!(a.dropped_by, DroppedBy::Rule);
        assert!(a.gone);
        assert_eq!(
            a.rule.as_deref(),
            Some("-A INPUT -p tcp -m tcp --dport 40000 -j DROP")
        );
        assert_eq!(a.rule_number, Some(2));
        assert_eq!(a.method, "ruleset evaluation (iptables-nft-save -c)");
        assert_eq!(
            a.evidence,
            [
                "the rule is gone from the rules read after the drop (deleted since): found in \
                 the reading from before the drop, by the packet's walk through its matches",
                "the rule's matches fit this packet",
            ]
        );
    }

    #[test]
    fn a_rule_still_there_or_no_reading_before_names_nothing() {
        let before = snap(&[(0, RULE)]);
        // Still there and its counter did not move: not this rule.
        assert!(attribute(&syn_ack(), Some(&before), &before).is_none());
        // No reading from before: nothing to find it in.
        assert!(attribute(&syn_ack(), None, &snap(&[])).is_none());
        // Gone, but its matches exclude the packet.
        let other = snap(&[(0, "-p tcp -m tcp --dport 41000 -j DROP")]);
        assert!(attribute(&syn_ack(), Some(&other), &snap(&[])).is_none());
        // Present and moved: counted as ever, not gone.
        let a = attribute(&syn_ack(), Some(&before), &snap(&[(1, RULE)])).unwrap();
        assert!(!a.gone);
        assert_eq!(a.method, "rule counters (iptables-nft-save -c)");
    }
}
