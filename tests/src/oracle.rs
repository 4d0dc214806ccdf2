//! What each kernel has, from the kernel's own history and the matrix's
//! measured facts, never from kdrop: the tests' expected values come from
//! uname's version and these tables, so a kdrop that wrongly decided "no
//! reasons here" (or "this rung is refused") turns the suite red instead of
//! lowering what it expects. `tests/tests/oracle.rs` checks the tables
//! against the running kernel's BTF (bpftool) and sysfs.
use std::sync::OnceLock;

/// A kernel version, `(major, minor)`.
pub type Version = (u32, u32);

/// The first kernel whose `enum skb_drop_reason` has each reason a test
/// names, with where that was read. Before v6.0 the enum lives in
/// include/linux/skbuff.h, v6.0-v6.3 in include/net/dropreason.h, since
/// v6.4 in include/net/dropreason-core.h.
pub const REASONS: &[(&str, Version, &str)] = &[
    // c504e5c2f964 "net: skb: introduce kfree_skb_reason()" and the
    // ip_rcv/netfilter conversions of the same merge window: the v5.17
    // enum is exactly these twelve (+ MAX).
    // https://github.com/torvalds/linux/blob/v5.17/include/linux/skbuff.h
    ("NOT_SPECIFIED", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("NO_SOCKET", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("PKT_TOO_SMALL", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("TCP_CSUM", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("SOCKET_FILTER", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("UDP_CSUM", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("NETFILTER_DROP", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("OTHERHOST", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("IP_CSUM", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("IP_INHDR", (5, 17), "v5.17 include/linux/skbuff.h"),
    ("IP_RPFILTER", (5, 17), "v5.17 include/linux/skbuff.h"),
    (
        "UNICAST_IN_L2_MULTICAST",
        (5, 17),
        "v5.17 include/linux/skbuff.h",
    ),
    // Menglong Dong's neigh and dev conversions, net-next Feb-Mar 2022.
    // https://github.com/torvalds/linux/blob/v5.18/include/linux/skbuff.h
    ("NEIGH_FAILED", (5, 18), "v5.18 include/linux/skbuff.h"),
    ("TC_INGRESS", (5, 18), "v5.18 include/linux/skbuff.h"),
    // "net: ipv4: add skb drop reasons to ip_error()", net-next 2022-04-13
    // (after v5.18-rc1).
    // https://github.com/torvalds/linux/blob/v5.19/include/linux/skbuff.h
    ("IP_INNOROUTES", (5, 19), "v5.19 include/linux/skbuff.h"),
    // "net: ip: make fib_validate_source() return drop reason" and "make
    // ip_route_input_slow() return drop reasons", net-next Nov 2024.
    // https://github.com/torvalds/linux/blob/v6.13/include/net/dropreason-core.h
    (
        "IP_LOCAL_SOURCE",
        (6, 13),
        "v6.13 include/net/dropreason-core.h",
    ),
    (
        "IP_INVALID_SOURCE",
        (6, 13),
        "v6.13 include/net/dropreason-core.h",
    ),
    (
        "IP_LOCALNET",
        (6, 13),
        "v6.13 include/net/dropreason-core.h",
    ),
    // "tcp: add four drop reasons to tcp_check_req()", net-next 2025-02-28.
    // https://github.com/torvalds/linux/blob/v6.15/include/net/dropreason-core.h
    (
        "TCP_LISTEN_OVERFLOW",
        (6, 15),
        "v6.15 include/net/dropreason-core.h",
    ),
];

/// The first kernel whose `kfree_skb` tracepoint carries `reason`
/// (c504e5c2f964, v5.17:
/// https://github.com/torvalds/linux/blob/v5.17/include/trace/events/skb.h).
pub const KFREE_SKB_REASON: Version = (5, 17);
/// The first with `rx_sk` ("net: add rx_sk to trace_kfree_skb", v6.11:
/// https://github.com/torvalds/linux/blob/v6.11/include/trace/events/skb.h).
pub const KFREE_SKB_RX_SK: Version = (6, 11);

/// What one kernel of the matrix lets kdrop attach, measured when the
/// kernel joined the matrix (../shared/notes/kernel.md, README "Tested
/// kernels"), not asked of kdrop.
pub struct Kernel {
    pub version: Version,
    pub what: &'static str,
    /// /sys/bus/event_source/devices/kprobe exists (CONFIG_KPROBES).
    pub kprobes: bool,
    /// Per-module BTF under /sys/kernel/btf once the netfilter modules are
    /// loaded (5.11+, Debian's config).
    pub module_btf: bool,
    /// The kfree_skb rungs that must attach (each is driven by a drop).
    pub kfree_skb_rungs: &'static [&'static str],
    /// The rung of each "(return)" point kdrop must choose, or the kind of
    /// skip the kernel allows for it (tests/src/allowed_skips.rs).
    pub returns: &'static [(&'static str, Result<&'static str, &'static str>)],
}

/// The kernels `cargo xtask test` and `cargo xtask vm` run the suite on.
pub const MATRIX: &[Kernel] = &[
    Kernel {
        version: (5, 10),
        what: "Debian 11 bullseye",
        kprobes: true,
        module_btf: false,
        kfree_skb_rungs: &["tp_btf", "raw_tp", "tracepoint"],
        returns: &[
            // fexit on fib_validate_source is refused there (8 arguments).
            ("fib_validate_source", Ok("kretprobe")),
            ("nf_conntrack_in", Ok("kretprobe")),
            ("nf_nat_inet_fn", Ok("kretprobe")),
            ("nft_do_chain", Err("no-module-btf")),
            ("ipt_do_table", Ok("kretprobe")),
        ],
    },
    Kernel {
        version: (6, 1),
        what: "Debian 12 bookworm",
        kprobes: true,
        module_btf: true,
        kfree_skb_rungs: &["tp_btf", "raw_tp", "tracepoint"],
        // The same on arm64 (`cargo xtask vm --arch arm64`, 6.1.0-50-arm64,
        // 2026-11-28), where fexit is refused for another reason.
        returns: &[
            // x86_64: 6.1's trampolines take 6 arguments, fib_validate_source
            // has 8. arm64: no ftrace direct calls in 6.1 (Debian's arm64
            // config has no CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS, its
            // amd64 one has), and without them a trampoline has no ftrace_ops
            // and register_fentry (kernel/bpf/trampoline.c) refuses any
            // traceable kernel function with ENOTSUPP: the 524 kdrop check
            // prints there.
            ("fib_validate_source", Ok("kretprobe")),
            ("nf_conntrack_in", Ok("kretprobe")),
            ("nf_nat_inet_fn", Ok("kretprobe")),
            ("nft_do_chain", Ok("kretprobe")),
            ("ipt_do_table", Ok("kretprobe")),
        ],
    },
    Kernel {
        version: (6, 12),
        // kdrop check in `cargo xtask vm --kernel 6.12` (6.12.117+deb13,
        // 2026-11-26) chose exactly these, and on arm64 (`--arch arm64
        // --kernel 6.12`, 6.12.117+deb13-arm64, 2026-11-28) too; its BTF has the reasons up to
        // IP_INNOROUTES and rx_sk, not IP_LOCAL_SOURCE/LOCALNET or
        // TCP_LISTEN_OVERFLOW.
        what: "Debian 13 trixie",
        kprobes: true,
        module_btf: true,
        kfree_skb_rungs: &["tp_btf", "raw_tp", "tracepoint"],
        returns: &[
            ("fib_validate_source", Ok("fexit")),
            ("nf_conntrack_in", Ok("kretprobe")),
            ("nf_nat_inet_fn", Ok("kretprobe")),
            ("nft_do_chain", Ok("kretprobe")),
            ("ipt_do_table", Ok("kretprobe")),
        ],
    },
    Kernel {
        version: (6, 18),
        what: "this machine (Firecracker: no CONFIG_KPROBES, fentry/fexit EPERM)",
        kprobes: false,
        // Everything is built in: /sys/kernel/btf holds vmlinux alone.
        module_btf: false,
        // tracefs is not mounted here: the tracepoint rung has a test of
        // its own (tracepoint_rung_mounts_tracefs_when_needed).
        kfree_skb_rungs: &["tp_btf", "raw_tp"],
        returns: &[
            ("fib_validate_source", Err("no-kprobes")),
            ("nf_conntrack_in", Err("no-kprobes")),
            ("nf_nat_inet_fn", Err("no-kprobes")),
            ("nft_do_chain", Err("no-kprobes")),
            ("ipt_do_table", Err("no-kprobes")),
        ],
    },
];

/// uname's release, e.g. `6.18.44-fc-v782`.
pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("reading /proc/sys/kernel/osrelease")
        .trim()
        .to_string()
}

/// `(major, minor)` of a release string.
pub fn parse_version(release: &str) -> Version {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The running kernel's version.
pub fn running() -> Version {
    static V: OnceLock<Version> = OnceLock::new();
    *V.get_or_init(|| parse_version(&release()))
}

/// The running kernel's row of the matrix. A kernel outside the matrix
/// fails here: its facts must be measured and added first.
pub fn kernel() -> &'static Kernel {
    kernel_of(running()).unwrap_or_else(|| {
        panic!(
            "kernel {} is not in the oracle's matrix (tests/src/oracle.rs): measure it and add \
             its row",
            release()
        )
    })
}

pub fn kernel_of(v: Version) -> Option<&'static Kernel> {
    MATRIX.iter().find(|k| k.version == v)
}

/// Does kernel `v`'s `enum skb_drop_reason` have `name`? A name not in
/// [`REASONS`] is a test bug: the table must say when it came.
pub fn has_reason_in(v: Version, name: &str) -> bool {
    let (_, first, _) = REASONS
        .iter()
        .find(|(n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("drop reason {name} is not in tests/src/oracle.rs REASONS"));
    v >= *first
}

/// Does the running kernel have drop reason `name`?
pub fn has_reason(name: &str) -> bool {
    has_reason_in(running(), name)
}

/// Does the running kernel's kfree_skb carry a reason?
pub fn has_drop_reasons() -> bool {
    running() >= KFREE_SKB_REASON
}

/// The rung kdrop must choose for `func`'s return point here, or the kind
/// of skip allowed instead.
pub fn return_rung(func: &str) -> Result<&'static str, &'static str> {
    kernel()
        .returns
        .iter()
        .find(|(f, _)| *f == func)
        .unwrap_or_else(|| panic!("no return point {func} in tests/src/oracle.rs"))
        .1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_releases() {
        assert_eq!(parse_version("6.18.44-fc-v782"), (6, 18));
        assert_eq!(parse_version("5.10.0-32-amd64"), (5, 10));
        assert_eq!(parse_version("6.12.107+deb13-amd64"), (6, 12));
    }

    #[test]
    fn reasons_by_version() {
        assert!(!has_reason_in((5, 10), "NO_SOCKET"));
        assert!(has_reason_in((5, 17), "IP_RPFILTER"));
        assert!(!has_reason_in((5, 18), "IP_INNOROUTES"));
        assert!(has_reason_in((6, 1), "IP_INNOROUTES"));
        assert!(!has_reason_in((6, 12), "IP_LOCAL_SOURCE"));
        assert!(has_reason_in((6, 13), "IP_LOCAL_SOURCE"));
        assert!(!has_reason_in((6, 14), "TCP_LISTEN_OVERFLOW"));
        assert!(has_reason_in((6, 18), "TCP_LISTEN_OVERFLOW"));
    }

    #[test]
    fn every_matrix_kernel_names_every_return_point() {
        for k in MATRIX {
            let names: Vec<&str> = k.returns.iter().map(|(f, _)| *f).collect();
            assert_eq!(
                names,
                [
                    "fib_validate_source",
                    "nf_conntrack_in",
                    "nf_nat_inet_fn",
                    "nft_do_chain",
                    "ipt_do_table"
                ],
                "{:?}",
                k.version
            );
            for (f, r) in k.returns {
                if let Err(kind) = r {
                    let v = format!("{}.{}", k.version.0, k.version.1);
                    assert!(
                        crate::allowed_skips::allowed(&v, kind),
                        "{v}: {f} skips as {kind}, which tests/src/allowed_skips.rs does not allow"
                    );
                }
            }
        }
    }
}
