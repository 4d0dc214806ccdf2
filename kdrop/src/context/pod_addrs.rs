//! The addresses of a pod's network namespace, read through a process in
//! it: `/proc/PID/net/fib_trie` (the IPv4 addresses are its LOCAL host
//! routes) and `/proc/PID/net/if_inet6`. Any user may read them: no setns
//! (CAP_SYS_ADMIN) and no ptrace access, neither of which the DaemonSet has.
use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

/// The addresses of the namespace `pid` is in, loopback and link-local
/// ones left out (every pod has the same).
pub fn of_pid(pid: u32) -> Vec<IpAddr> {
    let read = |f: &str| fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default();
    let mut out: Vec<IpAddr> = local_v4(&read("fib_trie"))
        .into_iter()
        .map(IpAddr::V4)
        .chain(global_v6(&read("if_inet6")).into_iter().map(IpAddr::V6))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The local IPv4 addresses in a `fib_trie` listing: a leaf `|-- A.B.C.D`
/// followed by its alias line `/32 host LOCAL` (fib_trie_seq_show prints
/// the prefix length, the scope and the route type of each alias,
/// https://github.com/torvalds/linux/blob/v6.1/net/ipv4/fib_trie.c). The
/// address is listed under both the Main and the Local table.
pub fn local_v4(fib_trie: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut leaf = None;
    for line in fib_trie.lines().map(str::trim) {
        if let Some(a) = line.strip_prefix("|-- ") {
            leaf = a.parse::<Ipv4Addr>().ok();
            continue;
        }
        let mut words = line.split_whitespace();
        if (words.next(), words.next(), words.next()) == (Some("/32"), Some("host"), Some("LOCAL"))
        {
            out.extend(leaf.filter(|a| !a.is_loopback()));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The global-scope addresses in an `if_inet6` listing: 32 hex digits,
/// ifindex, prefix length, scope, flags, name (if6_seq_show,
/// https://github.com/torvalds/linux/blob/v6.1/net/ipv6/addrconf.c; scope
/// 00 is IFA_GLOBAL).
pub fn global_v6(if_inet6: &str) -> Vec<Ipv6Addr> {
    if_inet6
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 4 || w[3] != "00" || w[0].len() != 32 {
                return None;
            }
            u128::from_str_radix(w[0], 16).ok().map(Ipv6Addr::from)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // /proc/PID/net/fib_trie of a namespace with 10.99.1.5/24 on a veth
    // and lo up (6.18, this machine).
    const FIB_TRIE: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.99.1.0/24 2 0 2
        +-- 10.99.1.0/29 2 0 2
           |-- 10.99.1.0
              /24 link UNICAST
           |-- 10.99.1.5
              /32 host LOCAL
        |-- 10.99.1.255
           /32 link BROADCAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
Local:
  +-- 10.99.1.0/24 2 0 2
     +-- 10.99.1.0/29 2 0 2
        |-- 10.99.1.0
           /24 link UNICAST
        |-- 10.99.1.5
           /32 host LOCAL
";

    #[test]
    fn ipv4_addresses_are_the_local_host_routes() {
        assert_eq!(
            local_v4(FIB_TRIE),
            ["10.99.1.5".parse::<Ipv4Addr>().unwrap()]
        );
        assert!(local_v4("").is_empty());
    }

    #[test]
    fn ipv6_addresses_of_global_scope() {
        let t = "fe80000000000000c0b722fffedda4bb 03 40 20 c0       d0
00000000000000000000000000000001 01 80 10 80       lo
20010db8009900000000000000000005 03 40 00 82       d0
";
        assert_eq!(
            global_v6(t),
            ["2001:db8:99::5".parse::<Ipv6Addr>().unwrap()]
        );
        assert!(global_v6("garbage\n").is_empty());
    }
}
