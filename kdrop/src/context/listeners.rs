//! TCP listeners of a network namespace and the state of their queues, read
//! through sock_diag (NETLINK_SOCK_DIAG, `inet_diag_req_v2`), plus the
//! sysctls and TcpExt counters that decide and record listen overflows.
//!
//! For a LISTEN socket the kernel reports the accept queue in
//! `idiag_rqueue` (`sk_ack_backlog`) and its limit in `idiag_wqueue`
//! (`sk_max_ack_backlog`): `tcp_diag_get_info`,
//! https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp_diag.c. The
//! queue is full when `sk_ack_backlog > sk_max_ack_backlog`
//! (`sk_acceptq_is_full`, include/net/sock.h), so backlog 1 holds 2.
//! The SYN queue has no diag field: it is counted here as the request
//! sockets (TCP_NEW_SYN_RECV, dumped as SYN_RECV by `inet_req_diag_fill`;
//! asking for SYN_RECV includes them, `tcp_diag_dump` in v6.18) whose local
//! address and port are the listener's.
use std::{
    collections::BTreeMap,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use anyhow::Result;

use super::{
    netlink::{u32_of, Socket, AF_INET, AF_INET6, NLM_F_DUMP},
    netns::in_netns,
};

pub use crate::model::listen::{
    listener_for, ListenCounters, ListenSnapshot, ListenSysctls, Listener,
};

/// One socket of a sock_diag answer (`struct inet_diag_msg`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiagSock {
    pub family: u8,
    pub state: u8,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub bound_if: u32,
    pub rqueue: u32,
    pub wqueue: u32,
    pub uid: u32,
    pub inode: u64,
}

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const IPPROTO_TCP: u8 = 6;
pub const TCP_SYN_RECV: u8 = 3;
pub const TCP_LISTEN: u8 = 10;
const TCP_NEW_SYN_RECV: u8 = 12;

/// The `inet_diag_req_v2` body asking for TCP sockets of `family` in `states`.
pub fn diag_request(family: u8, states: u32) -> Vec<u8> {
    // family, protocol, ext, pad, states, then a zeroed inet_diag_sockid (48 bytes).
    let mut b = vec![family, IPPROTO_TCP, 0, 0];
    b.extend_from_slice(&states.to_ne_bytes());
    b.resize(56, 0);
    b
}

/// Parses one `struct inet_diag_msg` (include/uapi/linux/inet_diag.h).
pub fn parse_diag_msg(p: &[u8]) -> Option<DiagSock> {
    let family = *p.first()?;
    let addr = |off: usize, port_off: usize| -> Option<SocketAddr> {
        let port = u16::from_be_bytes(p.get(port_off..port_off + 2)?.try_into().ok()?);
        let ip = match family {
            AF_INET => IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(p.get(off..off + 4)?).ok()?,
            )),
            AF_INET6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(p.get(off..off + 16)?).ok()?,
            )),
            _ => return None,
        };
        Some(SocketAddr::new(ip, port))
    };
    Some(DiagSock {
        family,
        state: *p.get(1)?,
        local: addr(8, 4)?,
        remote: addr(24, 6)?,
        bound_if: u32_of(p.get(40..44)?)?,
        rqueue: u32_of(p.get(56..60)?)?,
        wqueue: u32_of(p.get(60..64)?)?,
        uid: u32_of(p.get(64..68)?)?,
        inode: u64::from(u32_of(p.get(68..72)?)?),
    })
}

/// Listeners with their SYN queues counted from the request sockets.
pub fn assemble(socks: &[DiagSock]) -> Vec<Listener> {
    let mut out: Vec<Listener> = socks
        .iter()
        .filter(|s| s.state == TCP_LISTEN)
        .map(|s| Listener {
            local: s.local,
            bound_if: s.bound_if,
            accept_queue: s.rqueue,
            accept_backlog: s.wqueue,
            syn_queue: 0,
            inode: s.inode,
            uid: s.uid,
        })
        .collect();
    for req in socks
        .iter()
        .filter(|s| s.state == TCP_SYN_RECV || s.state == TCP_NEW_SYN_RECV)
    {
        let owner = listener_for(&out, req.local).map(|l| l.inode);
        if let Some(l) = out.iter_mut().find(|l| Some(l.inode) == owner) {
            l.syn_queue += 1;
        }
    }
    out
}

/// The TcpExt (and any other) counters of a netstat/snmp file, as
/// "TcpExt.ListenOverflows" → value. Header and value lines come in pairs.
pub fn parse_netstat(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { break };
        let (Some((p1, names)), Some((p2, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        if p1 != p2 {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse() {
                out.insert(format!("{p1}.{n}"), v);
            }
        }
    }
    out
}

/// The listen counters among TcpExt's (`parse_netstat`'s keys).
pub fn counters_from_netstat(m: &BTreeMap<String, u64>) -> ListenCounters {
    let get = |k: &str| m.get(&format!("TcpExt.{k}")).copied();
    ListenCounters {
        listen_overflows: get("ListenOverflows"),
        listen_drops: get("ListenDrops"),
        syncookies_sent: get("SyncookiesSent"),
        req_q_full_drop: get("TCPReqQFullDrop"),
        req_q_full_do_cookies: get("TCPReqQFullDoCookies"),
    }
}

/// The calling thread's namespace's counters. /proc/self/net would be the
/// thread-group leader's namespace, not this thread's.
pub fn read_counters() -> ListenCounters {
    let text = fs::read_to_string("/proc/thread-self/net/netstat").unwrap_or_default();
    counters_from_netstat(&parse_netstat(&text))
}

/// /proc/sys/net is the calling thread's namespace.
pub fn read_sysctls() -> ListenSysctls {
    let get = |k: &str| {
        fs::read_to_string(format!("/proc/sys/net/{k}"))
            .ok()
            .and_then(|v| v.trim().parse().ok())
    };
    ListenSysctls {
        somaxconn: get("core/somaxconn"),
        tcp_max_syn_backlog: get("ipv4/tcp_max_syn_backlog"),
        tcp_syncookies: get("ipv4/tcp_syncookies"),
    }
}

/// Every TCP listener and request socket, both families, in the calling
/// thread's namespace.
pub fn dump_sockets() -> Result<Vec<DiagSock>> {
    let sock = Socket::open_protocol(NETLINK_SOCK_DIAG, 0, false)?;
    let states = 1 << TCP_LISTEN | 1 << TCP_SYN_RECV | 1 << TCP_NEW_SYN_RECV;
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        let msgs = sock
            .request(
                SOCK_DIAG_BY_FAMILY,
                NLM_F_DUMP,
                &diag_request(family, states),
            )?
            .map_err(std::io::Error::from_raw_os_error)?;
        out.extend(msgs.iter().filter_map(|p| parse_diag_msg(p)));
    }
    Ok(out)
}

/// Listeners, sysctls and counters of the calling thread's namespace.
pub fn snapshot() -> Result<ListenSnapshot> {
    Ok(ListenSnapshot {
        listeners: assemble(&dump_sockets()?),
        sysctls: read_sysctls(),
        counters: read_counters(),
    })
}

/// `snapshot` inside the namespace at `netns`.
pub fn snapshot_in(netns: &Path) -> Result<ListenSnapshot> {
    in_netns(netns, snapshot)?
}

/// Is the listener on one of `ports` (any port when empty)?
pub fn on_ports(l: &Listener, ports: &[u16]) -> bool {
    ports.is_empty() || ports.contains(&l.local.port())
}

/// Does the namespace at `netns` have a TCP listener on one of `ports`
/// (any when empty)? One sock_diag dump of listening sockets.
pub fn listens_in(netns: &Path, ports: &[u16]) -> Result<bool> {
    let ports = ports.to_vec();
    in_netns(netns, move || -> Result<bool> {
        Ok(assemble(&dump_sockets()?)
            .iter()
            .any(|l| on_ports(l, &ports)))
    })?
}

/// The TcpExt counters of the namespace at `netns`: one file read.
pub fn counters_in(netns: &Path) -> Result<ListenCounters> {
    in_netns(netns, read_counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag_msg(family: u8, state: u8, local: &[u8], lport: u16, rq: u32, wq: u32) -> Vec<u8> {
        let mut m = vec![0u8; 72];
        m[0] = family;
        m[1] = state;
        m[4..6].copy_from_slice(&lport.to_be_bytes());
        m[8..8 + local.len()].copy_from_slice(local);
        m[56..60].copy_from_slice(&rq.to_ne_bytes());
        m[60..64].copy_from_slice(&wq.to_ne_bytes());
        m[68..72].copy_from_slice(&777u32.to_ne_bytes());
        m
    }

    #[test]
    fn listeners_and_syn_queues() {
        let l4 = parse_diag_msg(&diag_msg(AF_INET, TCP_LISTEN, &[0; 4], 3306, 2, 1)).unwrap();
        assert_eq!(l4.local, "0.0.0.0:3306".parse().unwrap());
        assert_eq!((l4.rqueue, l4.wqueue, l4.inode), (2, 1, 777));
        let mut l6 = parse_diag_msg(&diag_msg(AF_INET6, TCP_LISTEN, &[0; 16], 80, 0, 128)).unwrap();
        l6.inode = 778;
        let req =
            parse_diag_msg(&diag_msg(AF_INET, TCP_SYN_RECV, &[10, 0, 0, 2], 3306, 0, 0)).unwrap();
        let req6 =
            parse_diag_msg(&diag_msg(AF_INET, TCP_SYN_RECV, &[10, 0, 0, 2], 80, 0, 0)).unwrap();
        let ls = assemble(&[l4, l6, req.clone(), req, req6]);
        assert_eq!(ls.len(), 2);
        assert_eq!((ls[0].syn_queue, ls[1].syn_queue), (2, 1));
        assert!(ls[0].accept_queue_full());
        assert!(!ls[1].accept_queue_full());
        // A dual-stack [::]:80 takes IPv4; 0.0.0.0 does not take IPv6.
        assert_eq!(
            listener_for(&ls, "10.0.0.2:80".parse().unwrap()).map(|l| l.inode),
            Some(778)
        );
        assert!(listener_for(&ls, "[fd00::1]:3306".parse().unwrap()).is_none());
        assert!(listener_for(&ls, "10.0.0.2:22".parse().unwrap()).is_none());
    }

    #[test]
    fn netstat_pairs() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPReqQFullDrop\n\
                    TcpExt: 1 7 8 0\nIpExt: InNoRoutes\nIpExt: 3\n";
        let m = parse_netstat(text);
        let c = counters_from_netstat(&m);
        assert_eq!(c.listen_overflows, Some(7));
        assert_eq!(c.listen_drops, Some(8));
        assert_eq!(c.syncookies_sent, Some(1));
        assert_eq!(c.req_q_full_do_cookies, None);
        assert_eq!(m.get("IpExt.InNoRoutes"), Some(&3));
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..90 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 31 + 5) as u8).collect();
            let _ = parse_diag_msg(&junk);
            let mut j = junk.clone();
            if let Some(f) = j.first_mut() {
                *f = AF_INET6;
            }
            let _ = parse_diag_msg(&j);
        }
        for text in [
            "",
            ":",
            "TcpExt:\n",
            "a: 1\nb: 2\n",
            "TcpExt: x\nTcpExt: y z\n",
            "\n\n\n",
        ] {
            let _ = counters_from_netstat(&parse_netstat(text));
        }
        assert_eq!(parse_diag_msg(&[AF_INET, 10]), None);
    }

    #[test]
    fn reads_this_namespace() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let s = snapshot().unwrap();
        let me = listener_for(&s.listeners, l.local_addr().unwrap()).unwrap();
        assert_eq!(me.local.port(), port);
        assert!(s.sysctls.somaxconn.is_some());
        assert!(s.counters.listen_overflows.is_some());
    }
}
