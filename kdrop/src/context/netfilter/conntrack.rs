//! Conntrack as the namespace shows it: its statistics
//! (/proc/net/stat/nf_conntrack and the count/max sysctls) and, for one
//! reply tuple, the entry that holds it (a ctnetlink lookup).
use crate::{
    context::{
        conntrack_lookup::{lookup, Side},
        ctevents::parse::{tcp_state_name, IPS_SEEN_REPLY},
        netns::Netns,
    },
    model::{
        netfilter::ConntrackStats,
        packet::{CtSeen, Tuple},
    },
};

pub fn read_conntrack() -> Option<ConntrackStats> {
    let text = std::fs::read_to_string("/proc/thread-self/net/stat/nf_conntrack").ok()?;
    let mut stats = parse_conntrack_stat(&text)?;
    let num = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    // Network sysctls answer for the opening thread's namespace.
    stats.count = num("/proc/sys/net/netfilter/nf_conntrack_count");
    stats.max = num("/proc/sys/net/netfilter/nf_conntrack_max");
    stats.buckets = num("/proc/sys/net/netfilter/nf_conntrack_buckets");
    Some(stats)
}

/// `/proc/net/stat/nf_conntrack`: a header of column names, then one row of
/// hex numbers per CPU.
pub fn parse_conntrack_stat(text: &str) -> Option<ConntrackStats> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let mut s = ConntrackStats::default();
    for row in lines {
        for (name, v) in header.iter().zip(row.split_whitespace()) {
            let v = u64::from_str_radix(v, 16).ok()?;
            match *name {
                "drop" => s.drop += v,
                "insert_failed" => s.insert_failed += v,
                "early_drop" => s.early_drop += v,
                "invalid" => s.invalid += v,
                // ct_cpu_seq_show prints st->chaintoolong under this name
                // (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_standalone.c).
                "chainlength" => s.chaintoolong += v,
                "clashres" => s.clash_resolve += v,
                _ => {}
            }
        }
    }
    Some(s)
}

/// The entry of the namespace whose reply tuple is `reply` (a ctnetlink
/// lookup), as `orig A -> B, state S[, unreplied]`: who holds the tuple a
/// clashing entry wanted.
pub fn reply_holder(ns: &Netns, reply: &Tuple) -> Option<String> {
    match lookup(ns, Side::Reply, reply, 0) {
        Ok(found) => found.as_ref().map(describe_holder),
        Err(e) => {
            log::debug!("who holds {} -> {}: {e:#}", reply.src, reply.dst);
            None
        }
    }
}

/// `orig A:1 -> B:2, state SYN_SENT, unreplied`, as `conntrack -L` would
/// show the entry (UNREPLIED: no IPS_SEEN_REPLY, the uapi bit the tool
/// tests too).
pub fn describe_holder(e: &CtSeen) -> String {
    let mut out = format!("orig {} -> {}", e.ct.orig.src, e.ct.orig.dst);
    if let Some(s) = e.tcp_state {
        out.push_str(&format!(", state {}", tcp_state_name(s)));
    }
    if e.ct.status & IPS_SEEN_REPLY == 0 {
        out.push_str(", unreplied");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_stat() {
        let text = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
                    00000003  00000000 00000000 00000000 0000000a 00000000 00000000 00000000 00000000 00000001 00000002 00000000 00000000  00000000 00000000 00000000 00000000\n\
                    00000003  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000010 00000003 00000000  00000000 00000000 00000000 00000000\n";
        let s = parse_conntrack_stat(text).unwrap();
        assert_eq!(
            (s.invalid, s.insert_failed, s.drop, s.early_drop),
            (11, 1, 18, 3)
        );
        assert_eq!((s.chaintoolong, s.clash_resolve), (0, 0));
        assert!(parse_conntrack_stat("").is_none());
        assert!(parse_conntrack_stat("drop\nzz\n").is_none());
    }

    #[test]
    fn holder_text_is_what_conntrack_l_showed() {
        use crate::model::packet::Ct;
        let e = |orig: (&str, &str), state, status| CtSeen {
            netns: 1,
            ct: Ct {
                orig: Tuple {
                    src: orig.0.parse().unwrap(),
                    dst: orig.1.parse().unwrap(),
                },
                reply: Tuple {
                    src: orig.1.parse().unwrap(),
                    dst: orig.0.parse().unwrap(),
                },
                status,
                mark: 0,
                zone: 0,
                ctinfo: 0,
            },
            tcp_state: state,
            timeout_s: Some(117),
        };
        // The texts the `conntrack -L` parser gave for the same entries.
        assert_eq!(
            describe_holder(&e(("10.98.1.2:41001", "10.98.2.2:8006"), Some(1), 8)),
            "orig 10.98.1.2:41001 -> 10.98.2.2:8006, state SYN_SENT, unreplied"
        );
        assert_eq!(
            describe_holder(&e(("[fd00::1]:1", "[fd00::2]:2"), Some(3), 8 | 2 | 4)),
            "orig [fd00::1]:1 -> [fd00::2]:2, state ESTABLISHED"
        );
        assert_eq!(
            describe_holder(&e(("10.0.0.1:1", "10.0.0.2:2"), None, 2)),
            "orig 10.0.0.1:1 -> 10.0.0.2:2"
        );
    }
}
