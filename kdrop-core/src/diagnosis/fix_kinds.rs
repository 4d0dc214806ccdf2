//! Every kind of repair command a finding can carry, each with a stable
//! name and the integration test that applies it from kdrop's JSON and then
//! makes a new connection (issue #25: no repair ships untried). The
//! netfilter repairs keep their own list (`netfilter::fixes::FixKind`) and
//! are folded in as `Kind::Netfilter`.
//!
//! Why nothing escapes: a finding's `fix` and `fix_or` hold
//! `model::finding::Fix`, which only `Kind::fix` builds (the unit test below
//! fails on any other `Fix::new(` in the sources). A new template therefore
//! names a kind; a new kind must name its test or the reason it has none
//! (`Kind::test` is an exhaustive match), and the test below fails when
//! that test is not in `tests/tests/` or never checks that it applied the
//! kind. In unit tests `Kind::fix` also checks that the command has its
//! kind's shape (`Kind::of`), so a template labelled with the wrong kind
//! fails the unit tests that reach it.
use super::netfilter::fixes::FixKind as NfKind;
use crate::model::finding::Fix;

/// One kind of repair command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `sysctl -w net.ipv4.conf.IF.rp_filter=2`.
    RpFilterLoose,
    /// `ip rule add from DST lookup T priority P`: replies (and the reverse
    /// lookup) to the table whose way back is the input device.
    RpFilterPolicyRule,
    /// `ip route add SRC/32 [via G] dev IIF [onlink]`: a way back at all.
    RouteBack,
    /// `sysctl -w net.ipv4.conf.IF.route_localnet=1`.
    RouteLocalnet,
    /// `ip addr del SRC/LEN dev DEV`: the source is one of this host's.
    LocalAddressDelete,
    /// `ip route del ROUTE table local`: local by an AnyIP route.
    LocalRouteDelete,
    /// `ip -6 route add SRC/128 ... table N` (rpfilter6's policy route).
    Rpfilter6Route,
    /// `ip -6 rule add [from S] to SRC/128 lookup N priority P`.
    Rpfilter6Rule,
    /// `ip6tables-* -t T -R CHAIN n ... -m rpfilter --loose ...`.
    Rpfilter6Ip6tablesLoose,
    /// `nft replace rule F T C handle H ...` without the `. iif` key.
    Rpfilter6NftLoose,
    /// `iptables-* -t nat -R CHAIN n ... --random-fully`: a NAT port clash.
    SnatWiden,
    /// `sysctl -w net.netfilter.nf_conntrack_max=N`.
    ConntrackMax,
    /// `sysctl -w net.netfilter.nf_conntrack_buckets=N`.
    ConntrackBuckets,
    /// `ip rule del priority P ...`: an `unreachable` rule ahead of a route.
    RuleDelete,
    /// `ip rule add to X lookup T`: a table no rule reads.
    RuleAddTo,
    /// `iptables -t nat -I PREROUTING -s C -d VIP ... -j DNAT
    /// --to-destination B`: a load balancer's VIP served on the node.
    LoopbackDnat,
    /// `conntrack -D ... --orig-src ...`: the entry made before the repair.
    ConntrackDeleteEntry,
    /// `modprobe br_netfilter`.
    ModprobeBrNetfilter,
    /// `sysctl -w net.bridge.bridge-nf-call-ip[6]tables=1`.
    BridgeNfCall,
    /// `iptables -t nat -A POSTROUTING -s C -d B/32 ... -j MASQUERADE`.
    HairpinMasquerade,
    /// `iptables -t nat -A POSTROUTING -d B/32 ... -j MASQUERADE`.
    ReturnPathMasquerade,
    /// `sysctl -w net.core.somaxconn=4096`.
    Somaxconn,
    /// `bpftool cgroup detach CG HOOK id N`.
    CgroupDetach,
    /// `tc filter del dev D HOOK ...`.
    TcFilterDelete,
    /// `ip link set dev D xdp[generic|drv|offload] off`.
    XdpDetach,
    /// A netfilter ruleset repair (its own list and tests).
    Netfilter(NfKind),
}

impl Kind {
    /// Every kind outside netfilter, then netfilter's.
    pub fn all() -> Vec<Kind> {
        let mut v = vec![
            Kind::RpFilterLoose,
            Kind::RpFilterPolicyRule,
            Kind::RouteBack,
            Kind::RouteLocalnet,
            Kind::LocalAddressDelete,
            Kind::LocalRouteDelete,
            Kind::Rpfilter6Route,
            Kind::Rpfilter6Rule,
            Kind::Rpfilter6Ip6tablesLoose,
            Kind::Rpfilter6NftLoose,
            Kind::SnatWiden,
            Kind::ConntrackMax,
            Kind::ConntrackBuckets,
            Kind::RuleDelete,
            Kind::RuleAddTo,
            Kind::LoopbackDnat,
            Kind::ConntrackDeleteEntry,
            Kind::ModprobeBrNetfilter,
            Kind::BridgeNfCall,
            Kind::HairpinMasquerade,
            Kind::ReturnPathMasquerade,
            Kind::Somaxconn,
            Kind::CgroupDetach,
            Kind::TcFilterDelete,
            Kind::XdpDetach,
        ];
        v.extend(NfKind::ALL.map(Kind::Netfilter));
        v
    }

    /// The command as a finding's repair of this kind.
    pub fn fix(self, cmd: String) -> Fix {
        // Unit tests reach every template: each must have its kind's shape.
        #[cfg(test)]
        assert_eq!(Kind::of(&cmd), Some(self), "`{cmd}` is not {}", self.name());
        Fix::new(self.name(), cmd)
    }

    /// The stable name (README's table of repairs and their tests).
    pub fn name(self) -> &'static str {
        match self {
            Kind::RpFilterLoose => "rp_filter_loose",
            Kind::RpFilterPolicyRule => "rp_filter_policy_rule",
            Kind::RouteBack => "route_back",
            Kind::RouteLocalnet => "route_localnet",
            Kind::LocalAddressDelete => "local_address_delete",
            Kind::LocalRouteDelete => "local_route_delete",
            Kind::Rpfilter6Route => "rpfilter6_route",
            Kind::Rpfilter6Rule => "rpfilter6_rule",
            Kind::Rpfilter6Ip6tablesLoose => "rpfilter6_ip6tables_loose",
            Kind::Rpfilter6NftLoose => "rpfilter6_nft_loose",
            Kind::SnatWiden => "snat_widen",
            Kind::ConntrackMax => "conntrack_max",
            Kind::ConntrackBuckets => "conntrack_buckets",
            Kind::RuleDelete => "rule_delete",
            Kind::RuleAddTo => "rule_add_to",
            Kind::LoopbackDnat => "loopback_dnat",
            Kind::ConntrackDeleteEntry => "conntrack_delete_entry",
            Kind::ModprobeBrNetfilter => "modprobe_br_netfilter",
            Kind::BridgeNfCall => "bridge_nf_call",
            Kind::HairpinMasquerade => "hairpin_masquerade",
            Kind::ReturnPathMasquerade => "return_path_masquerade",
            Kind::Somaxconn => "somaxconn",
            Kind::CgroupDetach => "cgroup_detach",
            Kind::TcFilterDelete => "tc_filter_delete",
            Kind::XdpDetach => "xdp_detach",
            Kind::Netfilter(k) => k.name(),
        }
    }

    /// `Ok(file::function)`: the integration test (tests/tests/<file>.rs)
    /// that applies this kind from kdrop's JSON and then connects.
    /// `Err(why)`: why no test on the hosts the suite runs on can apply it.
    pub fn test(self) -> Result<&'static str, &'static str> {
        Ok(match self {
            Kind::RpFilterLoose => {
                "routing::incident1_names_rule_route_and_rp_filter_and_the_sysctl_fix_works"
            }
            Kind::RpFilterPolicyRule => "routing::incident1_policy_rule_fix_works",
            Kind::RouteBack => {
                "routing::no_route_back_to_a_routed_client_is_repaired_through_its_router"
            }
            Kind::RouteLocalnet => "routing::localnet_martian_and_its_fix",
            Kind::LocalAddressDelete => "routing::incident3_local_source_martian_and_its_fix",
            Kind::LocalRouteDelete => {
                "routing::a_source_local_by_an_anyip_route_is_repaired_by_deleting_the_route"
            }
            Kind::Rpfilter6Route | Kind::Rpfilter6Rule => "rpfilter6::ip6tables_rpfilter_strict",
            Kind::Rpfilter6Ip6tablesLoose => "rpfilter6::ip6tables_rpfilter_loosened",
            Kind::Rpfilter6NftLoose => "rpfilter6::nft_fib_loosened",
            Kind::SnatWiden => {
                "conntrack::snat_port_clash_is_conntrack_insert_failed_and_widening_the_range_fixes_it"
            }
            Kind::ConntrackMax | Kind::ConntrackBuckets => {
                "conntrack_table::a_full_table_is_repaired_by_kdrops_sysctls"
            }
            Kind::RuleDelete => {
                "forwarding::an_unreachable_rule_ahead_of_the_route_is_named_and_deleted"
            }
            Kind::RuleAddTo => "forwarding::a_route_no_rule_reads_is_repaired_by_the_rule_kdrop_prints",
            Kind::LoopbackDnat | Kind::ConntrackDeleteEntry => {
                "conntrack::incident4_lb_loopback_without_snat_and_its_fix"
            }
            Kind::ModprobeBrNetfilter => {
                return Err(
                    "emitted only when br_netfilter is not loaded and its sysctls are absent; \
                     built into this host's kernel (no /proc/modules, /proc/sys/net/bridge \
                     present) it cannot be unloaded, and where it is a module the bridge tests \
                     running beside need it loaded: covered by unit tests only",
                )
            }
            Kind::BridgeNfCall => "incidents_traced::incident2_traced_by_the_service_port",
            Kind::HairpinMasquerade => {
                "conntrack::incident2_hairpin_syn_ack_skips_reverse_nat_and_the_masquerade_fix_works"
            }
            Kind::ReturnPathMasquerade => "conntrack::incident5_asymmetric_return_path_and_its_fix",
            Kind::Somaxconn => "causes::a_backlog_capped_by_somaxconn_is_repaired_by_the_sysctl",
            Kind::CgroupDetach => "causes::a_cgroup_egress_program_is_named_and_detached",
            Kind::TcFilterDelete => {
                "causes::a_tc_ingress_filter_dropping_the_syn_is_named_and_deleted"
            }
            Kind::XdpDetach => "causes::an_xdp_program_dropping_the_syn_is_named_and_detached",
            Kind::Netfilter(k) => k.test(),
        })
    }

    /// The kind of a command a finding wrote (after any `ip netns exec
    /// NS`), or `None` for one no template writes.
    pub fn of(cmd: &str) -> Option<Kind> {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let w = match words.as_slice() {
            ["ip", "netns", "exec", _, rest @ ..] => rest,
            all => all,
        };
        let has = |x: &str| w.contains(&x);
        Some(match w {
            ["sysctl", "-w", setting] => sysctl(setting)?,
            ["ip", "rule", "add", "from", ..] => Kind::RpFilterPolicyRule,
            ["ip", "rule", "add", "to", ..] => Kind::RuleAddTo,
            ["ip", "rule", "del", "priority", ..] => Kind::RuleDelete,
            ["ip", "route", "add", ..] => Kind::RouteBack,
            ["ip", "route", "del", .., "table", "local"] => Kind::LocalRouteDelete,
            ["ip", "addr", "del", ..] => Kind::LocalAddressDelete,
            ["ip", "-6", "route", "add", .., "table", _] => Kind::Rpfilter6Route,
            ["ip", "-6", "rule", "add", ..] => Kind::Rpfilter6Rule,
            ["ip", "link", "set", "dev", _, xdp, "off"] if xdp.starts_with("xdp") => {
                Kind::XdpDetach
            }
            ["nft", "replace", "rule", ..] => Kind::Rpfilter6NftLoose,
            ["modprobe", "br_netfilter"] => Kind::ModprobeBrNetfilter,
            ["bpftool", "cgroup", "detach", ..] => Kind::CgroupDetach,
            ["tc", "filter", "del", ..] => Kind::TcFilterDelete,
            ["conntrack", "-D", ..] => Kind::ConntrackDeleteEntry,
            [tool, ..] if tool.starts_with("ip6tables-") && has("-R") && has("--loose") => {
                Kind::Rpfilter6Ip6tablesLoose
            }
            [tool, "-t", "nat", "-R", ..] if tool.contains("tables-") && has("--random-fully") => {
                Kind::SnatWiden
            }
            ["iptables" | "ip6tables", "-t", "nat", "-I", "PREROUTING", ..] if has("DNAT") => {
                Kind::LoopbackDnat
            }
            ["iptables" | "ip6tables", "-t", "nat", "-A", "POSTROUTING", rest @ ..]
                if rest.ends_with(&["MASQUERADE"]) =>
            {
                if rest.first() == Some(&"-s") {
                    Kind::HairpinMasquerade
                } else {
                    Kind::ReturnPathMasquerade
                }
            }
            _ => Kind::Netfilter(NfKind::of(cmd)?),
        })
    }
}

/// The kind of a `sysctl -w` a finding writes. A device's setting is
/// matched by its ends: the device's name may hold dots (`eth0.100`).
fn sysctl(setting: &str) -> Option<Kind> {
    let (key, value) = setting.split_once('=')?;
    let dev = key.strip_prefix("net.ipv4.conf.");
    let dev_setting = |name: &str| {
        dev.and_then(|d| d.strip_suffix(name))
            .is_some_and(|d| d.ends_with('.') && d.len() > 1)
    };
    Some(match (key, value) {
        (_, "2") if dev_setting("rp_filter") => Kind::RpFilterLoose,
        (_, "1") if dev_setting("route_localnet") => Kind::RouteLocalnet,
        ("net.netfilter.nf_conntrack_max", _) => Kind::ConntrackMax,
        ("net.netfilter.nf_conntrack_buckets", _) => Kind::ConntrackBuckets,
        ("net.bridge.bridge-nf-call-iptables" | "net.bridge.bridge-nf-call-ip6tables", "1") => {
            Kind::BridgeNfCall
        }
        ("net.core.somaxconn", _) => Kind::Somaxconn,
        _ => return None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
    }

    /// Each kind's test exists as a `#[test] fn` in its file, and that file
    /// checks the kind it applied (`Kind::of` on the command, compared with
    /// `Kind::<Variant>`); a kind without a test says why. Netfilter's
    /// kinds are checked by their own test (`netfilter::fixes`).
    #[test]
    fn every_fix_kind_has_an_integration_test_that_applies_it() {
        let dir = root().join("../tests/tests");
        for kind in Kind::all() {
            if matches!(kind, Kind::Netfilter(_)) {
                continue;
            }
            let test = match kind.test() {
                Ok(t) => t,
                Err(why) => {
                    assert!(why.len() > 40, "{}: say why it has no test", kind.name());
                    continue;
                }
            };
            assert_applied_by(&dir, test, &format!("Kind::{kind:?}"), kind.name());
        }
    }

    /// `test` (`file::function`) is a `#[test] fn` in `dir/<file>.rs`, and
    /// that file names `marker` (the kind, as it checks the commands it
    /// applied).
    pub(crate) fn assert_applied_by(dir: &Path, test: &str, marker: &str, name: &str) {
        let (file, func) = test.split_once("::").unwrap();
        let path = dir.join(format!("{file}.rs"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {} for {}", path.display(), e, name));
        assert!(
            text.contains(&format!("#[test]\nfn {func}()")),
            "{}: no #[test] fn {func} for {}",
            path.display(),
            name
        );
        assert!(
            text.contains(marker),
            "{}: {} is never checked as applied",
            path.display(),
            name
        );
    }

    /// Only `Kind::fix` makes a `Fix`: no other source file calls its
    /// constructor, so every repair a finding carries has a listed kind.
    #[test]
    fn every_fix_is_made_by_its_kind() {
        // The core and the shell: neither may make a repair of its own.
        let workspace = root().parent().unwrap().to_path_buf();
        let mut stack = vec![root().join("src"), workspace.join("kdrop/src")];
        let mut offenders = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path.strip_prefix(&workspace).unwrap().display().to_string();
                let allowed = [
                    "kdrop-core/src/diagnosis/fix_kinds.rs",
                    "kdrop-core/src/model/finding.rs",
                ];
                if path.extension().is_some_and(|e| e == "rs") && !allowed.contains(&rel.as_str()) {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if text.contains(concat!("Fix", "::new(")) {
                        offenders.push(rel);
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "repairs made without a kind (use fix_kinds::Kind::fix): {offenders:?}"
        );
    }

    #[test]
    fn names_are_unique() {
        let all = Kind::all();
        for (i, a) in all.iter().enumerate() {
            assert!(
                all[i + 1..].iter().all(|b| b.name() != a.name()),
                "{} twice",
                a.name()
            );
        }
    }

    #[test]
    fn commands_are_told_apart() {
        let cases = [
            ("ip netns exec n sysctl -w net.ipv4.conf.eth1.rp_filter=2", Kind::RpFilterLoose),
            ("sysctl -w net.ipv4.conf.eth0.100.rp_filter=2", Kind::RpFilterLoose),
            ("ip rule add from 10.0.0.2 lookup 2 priority 99", Kind::RpFilterPolicyRule),
            ("ip route add 10.0.0.9/32 via 10.0.1.1 dev eth1 onlink", Kind::RouteBack),
            ("sysctl -w net.ipv4.conf.eth0.route_localnet=1", Kind::RouteLocalnet),
            ("ip addr del 203.0.113.5/32 dev kube-ipvs0", Kind::LocalAddressDelete),
            ("ip route del local 203.0.113.0/24 dev lo table local", Kind::LocalRouteDelete),
            ("ip -6 route add fd00::1/128 dev eth1 table 100", Kind::Rpfilter6Route),
            ("ip -6 rule add from fd00::2 to fd00::1/128 lookup 100 priority 5", Kind::Rpfilter6Rule),
            (
                "ip6tables-nft -t raw -R PREROUTING 1 -m rpfilter --loose --invert -j DROP",
                Kind::Rpfilter6Ip6tablesLoose,
            ),
            (
                "nft replace rule inet fw pre handle 2 fib saddr oif missing drop",
                Kind::Rpfilter6NftLoose,
            ),
            (
                "iptables-nft -t nat -R POSTROUTING 1 -o eth0 -j SNAT --to-source 10.0.0.1:1024-65535 --random-fully",
                Kind::SnatWiden,
            ),
            ("sysctl -w net.netfilter.nf_conntrack_max=8", Kind::ConntrackMax),
            ("sysctl -w net.netfilter.nf_conntrack_buckets=8", Kind::ConntrackBuckets),
            ("ip rule del priority 10 to 10.0.0.0/24 unreachable", Kind::RuleDelete),
            ("ip rule add to 10.0.0.0/24 lookup 7", Kind::RuleAddTo),
            (
                "iptables -t nat -I PREROUTING -s 10.0.0.5/32 -d 203.0.113.80/32 -p tcp --dport 80 -j DNAT --to-destination 10.0.0.9:80",
                Kind::LoopbackDnat,
            ),
            (
                "conntrack -D -f ipv6 -p tcp --orig-src fd00::5 --orig-port-src 4 --orig-dst fd00::9 --orig-port-dst 80",
                Kind::ConntrackDeleteEntry,
            ),
            ("modprobe br_netfilter", Kind::ModprobeBrNetfilter),
            ("sysctl -w net.bridge.bridge-nf-call-ip6tables=1", Kind::BridgeNfCall),
            (
                "iptables -t nat -A POSTROUTING -s 10.0.0.5 -d 10.0.0.9/32 -p tcp --dport 80 -j MASQUERADE",
                Kind::HairpinMasquerade,
            ),
            (
                "ip6tables -t nat -A POSTROUTING -d fd00::9/128 -p tcp --dport 80 -j MASQUERADE",
                Kind::ReturnPathMasquerade,
            ),
            ("sysctl -w net.core.somaxconn=4096", Kind::Somaxconn),
            ("bpftool cgroup detach /sys/fs/cgroup/x egress id 7", Kind::CgroupDetach),
            ("tc filter del dev s0 ingress protocol ip pref 10 handle 0x1 bpf", Kind::TcFilterDelete),
            ("ip link set dev s0 xdpgeneric off", Kind::XdpDetach),
            (
                "iptables-legacy -t filter -D INPUT -p tcp -m tcp --dport 80 -j DROP",
                Kind::Netfilter(NfKind::IptablesDeleteRule),
            ),
        ];
        for (cmd, kind) in cases {
            assert_eq!(Kind::of(cmd), Some(kind), "{cmd}");
        }
        for cmd in [
            "sysctl -w net.ipv4.conf.eth0.rp_filter=1",
            "ip route get 10.0.0.1",
            "conntrack -S",
            "nft -a list chain inet t input",
        ] {
            assert_eq!(Kind::of(cmd), None, "{cmd}");
        }
    }
}
