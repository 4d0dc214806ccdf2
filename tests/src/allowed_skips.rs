//! The one list of skips each kernel allows. A test that cannot run here
//! calls `integration_tests::skip` with one of these kinds: a kind this
//! kernel does not allow fails the test, and `cargo xtask test` / `cargo
//! xtask vm` (which include this file) fail the run on a `SKIP` line whose
//! kind the kernel does not allow. Anything else that stops a test (a
//! probe point gone, a program the verifier refused) is a failure.

/// `(kernel major.minor, kind, why the kernel cannot run the test)`.
pub const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "6.18",
        "no-kprobes",
        "this machine's kernel has no CONFIG_KPROBES and refuses fentry/fexit (EPERM): \
         return points have no rung",
    ),
    (
        "5.10",
        "no-module-btf",
        "no per-module BTF before 5.11: nft_do_chain's struct nft_pktinfo is unknown",
    ),
    (
        "5.10",
        "no-drop-reasons",
        "no enum skb_drop_reason before 5.17: causes told from the reason (TC_INGRESS, \
         BPF_CGROUP_EGRESS, NOT_SPECIFIED, TCP_LISTEN_OVERFLOW ...) cannot be",
    ),
    (
        "6.12",
        "nft-frees-inside",
        "Debian's 6.12 frees a dropped packet inside nft_do_chain and returns NF_STOLEN: \
         no NF_DROP verdict to record",
    ),
];

/// Does kernel `version` (`major.minor`) allow a skip of `kind`?
pub fn allowed(version: &str, kind: &str) -> bool {
    ALLOWED.iter().any(|(v, k, _)| *v == version && *k == kind)
}

/// `(test, kind)` of a `SKIP <test>: <kind> (<detail>)` line, wherever
/// libtest's own output put it on the line.
pub fn parse_skip(line: &str) -> Option<(&str, &str)> {
    let at = line.find("SKIP ")?;
    let (test, rest) = line[at + 5..].split_once(": ")?;
    let kind = rest.split_whitespace().next()?;
    (!test.is_empty() && !test.contains(' ')).then_some((test, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_skip_lines() {
        assert_eq!(
            parse_skip("SKIP ipt_verdict: no-kprobes (kretprobe refused)"),
            Some(("ipt_verdict", "no-kprobes"))
        );
        assert_eq!(
            parse_skip("test ipt_verdict ... SKIP ipt_verdict: no-kprobes (x)"),
            Some(("ipt_verdict", "no-kprobes"))
        );
        assert_eq!(parse_skip("test result: ok. 3 passed"), None);
        assert_eq!(parse_skip("SKIP : x"), None);
    }

    #[test]
    fn allows_per_kernel() {
        assert!(allowed("6.18", "no-kprobes"));
        assert!(!allowed("6.1", "no-kprobes"));
        assert!(!allowed("6.18", "no-module-btf"));
    }
}
