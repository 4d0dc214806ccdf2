//! Connections and single SYNs with exact 5-tuples, from inside a namespace.
use std::{
    net::{SocketAddr, SocketAddrV4},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
    time::{Duration, Instant},
};

use kdrop::context::netns::in_netns;

use crate::{nf::iptables, *};

fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: zeroed sockaddr_storage is valid; we fill one variant.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in.
            unsafe { std::ptr::write((&raw mut ss).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6.
            unsafe { std::ptr::write((&raw mut ss).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// A full handshake `src -> dst` from inside `ns` with a fixed source
/// address and port, bounded by 3 s.
pub fn connect_from(ns: &Ns, src: SocketAddr, dst: SocketAddr) -> std::io::Result<()> {
    connect_within(ns, src, dst, Duration::from_secs(3))
}

/// `connect_from` giving up after `timeout`, as a client with a connect
/// timeout does: the socket is closed then, in SYN-SENT if nothing answered.
pub fn connect_within(
    ns: &Ns,
    src: SocketAddr,
    dst: SocketAddr,
    timeout: Duration,
) -> std::io::Result<()> {
    let fd = send_syn(ns, src, dst);
    wait_connected(&fd, timeout)
}

/// Waits for a SYN sent at `sent` to complete on one of its
/// retransmissions. Linux resends it 1, 3, 7, 15, 31 and 63 s after the
/// first (TCP_TIMEOUT_INIT, 1 s, doubled per retry: include/net/tcp.h, and
/// tcp_syn_retries 6), so the next one comes within twice the time since
/// the first plus a second: a fix applied late waits for that one (a
/// fixed 12 s ran out in 6.1's whole suite under TCG).
pub fn wait_retransmitted(fd: &OwnedFd, sent: Instant) -> std::io::Result<()> {
    let next = sent.elapsed() * 2 + Duration::from_secs(2);
    wait_connected(fd, bound(Duration::from_secs(12)).max(next))
}

/// Waits up to `timeout` for a socket `send_syn` returned to finish its
/// handshake (a retransmission of its SYN answered): the same tuple tried
/// again, as the client's kernel does.
pub fn wait_connected(fd: &OwnedFd, timeout: Duration) -> std::io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no handshake in {timeout:?}"),
        ));
    }
    let mut err: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err/len are valid out-parameters for SO_ERROR.
    unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&raw mut err).cast(),
            &mut len,
        )
    };
    if err != 0 {
        return Err(std::io::Error::from_raw_os_error(err));
    }
    Ok(())
}

/// Sends one SYN `src -> dst` from inside `ns` with a non-blocking connect
/// from a fixed source port, so the test knows the exact 5-tuple. The socket
/// stays open (no retransmission decisions are taken for the test) until the
/// returned fd is dropped.
pub fn send_syn(ns: &Ns, src: SocketAddr, dst: SocketAddr) -> OwnedFd {
    send_syn_at(&ns.path(), src, dst)
}

/// `send_syn` from the namespace at `netns` (a pod's, which the test does
/// not own).
pub fn send_syn_at(netns: &Path, src: SocketAddr, dst: SocketAddr) -> OwnedFd {
    in_netns(netns, move || -> std::io::Result<OwnedFd> {
        let family = if src.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain socket calls; the fd is owned right away. CLOEXEC: a
        // command another test spawns meanwhile must not inherit it (its copy
        // would keep the handshake alive after the test closes it).
        let fd = unsafe {
            libc::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let one: libc::c_int = 1;
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&raw const one).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        let (s, slen) = sockaddr(&src);
        if unsafe { libc::bind(fd, (&raw const s).cast(), slen) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (d, dlen) = sockaddr(&dst);
        if unsafe { libc::connect(fd, (&raw const d).cast(), dlen) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
        }
        Ok(owned)
    })
    .expect("entering the client namespace")
    .unwrap_or_else(|e| panic!("SYN {src} -> {dst}: {e}"))
}

/// A bare SYN's TCP header (no options) from `src` to `dst` with sequence
/// number `seq` and its right checksum (pseudo-header + header, RFC 9293
/// 3.1).
pub fn syn_segment(src: SocketAddrV4, dst: SocketAddrV4, seq: u32) -> [u8; 20] {
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&src.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[12] = 5 << 4; // data offset: 5 words
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    };
    add(&src.ip().octets());
    add(&dst.ip().octets());
    add(&[0, libc::IPPROTO_TCP as u8, 0, 20]);
    add(&tcp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    tcp
}

/// Sends the TCP segment `tcp` from `src` to `dst` through a raw socket in
/// `ns` (the kernel writes the IP header): one transmission, with no socket
/// behind it to retransmit, however slow the machine.
pub fn send_raw_tcp(ns: &Ns, src: SocketAddrV4, dst: SocketAddrV4, tcp: &[u8]) {
    let tcp = tcp.to_vec();
    in_netns(&ns.path(), move || -> std::io::Result<()> {
        // SAFETY: plain socket calls on an fd owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_TCP,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let _owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_addr.s_addr = u32::from_ne_bytes(src.ip().octets());
        let len = size_of::<libc::sockaddr_in>() as u32;
        if unsafe { libc::bind(fd, (&raw const sin).cast(), len) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        sin.sin_addr.s_addr = u32::from_ne_bytes(dst.ip().octets());
        let n = unsafe {
            libc::sendto(
                fd,
                tcp.as_ptr().cast(),
                tcp.len(),
                0,
                (&raw const sin).cast(),
                len,
            )
        };
        if n != tcp.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    })
    .expect("entering the namespace")
    .unwrap_or_else(|e| panic!("raw TCP {src} -> {dst}: {e}"));
}

/// A listener inside `ns`.
pub fn listen(ns: &Ns, addr: SocketAddr) -> std::net::TcpListener {
    in_netns(&ns.path(), move || std::net::TcpListener::bind(addr))
        .expect("entering the namespace")
        .unwrap_or_else(|e| panic!("listening on {addr}: {e}"))
}

/// Packets a rule in `chain` of `ns`'s filter table has matched, by a
/// word of the rule (iptables -L -v -x -n).
pub fn rule_packets(ns: &Ns, chain: &str, has: &str) -> u64 {
    rule_packets_of(ns, "iptables", chain, has)
}

/// `rule_packets` through `tool` (`ip6tables` for IPv6's rules).
pub fn rule_packets_of(ns: &Ns, tool: &str, chain: &str, has: &str) -> u64 {
    let text = in_ns(ns, &[tool, "-L", chain, "-v", "-x", "-n"]);
    text.lines()
        .find(|l| l.contains(has))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no rule with {has} in {chain}:\n{text}"))
}

/// A handshake through a node whose SYN passes it three times, each one
/// answered: the client's own namespace (which the tests do not trace)
/// drops the SYN-ACKs until the server (listening on `server_port`, after
/// any DNAT) has counted three SYNs (Linux
/// sends them 0, 1 and 3 s apart: TCP_TIMEOUT_INIT, doubled per retry,
/// include/net/tcp.h), then lets the handshake complete. Three
/// transmissions is what an "unanswered" finding takes, so a kdrop that
/// did not tell answered from unanswered reports it here. Returns the
/// connected socket.
pub fn answered_three_times(
    client: &Ns,
    server: &Ns,
    server_port: u16,
    src: SocketAddr,
    dst: SocketAddr,
) -> OwnedFd {
    answered_three_times_then(client, server, server_port, src, dst, || {})
}

/// `answered_three_times`, calling `before_lifting` once the SYN-ACKs were
/// dropped and before the client's rule goes (a test tracing the client's
/// namespace waits there for kdrop to have read that rule).
pub fn answered_three_times_then(
    client: &Ns,
    server: &Ns,
    server_port: u16,
    src: SocketAddr,
    dst: SocketAddr,
    before_lifting: impl FnOnce(),
) -> OwnedFd {
    let port = server_port.to_string();
    let sport = src.port().to_string();
    iptables(
        server,
        &format!("-I INPUT -p tcp --syn --dport {port} -j ACCEPT"),
    );
    iptables(client, &format!("-I INPUT -p tcp --dport {sport} -j DROP"));
    let fd = send_syn(client, src, dst);
    let deadline = Instant::now() + bound(Duration::from_secs(10));
    while rule_packets(server, "INPUT", "flags:0x17/0x02") < 3 {
        assert!(Instant::now() < deadline, "the server never saw 3 SYNs");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        rule_packets(client, "INPUT", "DROP") >= 3,
        "SYN-ACKs not dropped"
    );
    before_lifting();
    iptables(client, &format!("-D INPUT -p tcp --dport {sport} -j DROP"));
    // The next SYN-ACK (the server's or the client's 7 s retransmission)
    // completes it.
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = bound(Duration::from_secs(10)).as_millis() as i32;
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, ms) }, 1, "no handshake");
    assert_eq!(pfd.revents & libc::POLLERR, 0, "the handshake failed");
    fd
}

/// A listener in `ns` with listen(2)'s `backlog`, never accepting.
pub fn listen_backlog(ns: &Ns, addr: SocketAddr, backlog: i32) -> OwnedFd {
    in_netns(&ns.path(), move || {
        let std_l = std::net::TcpListener::bind(addr).unwrap();
        // Re-listen with the small backlog: listen(2) on a listening socket
        // updates sk_max_ack_backlog.
        use std::os::fd::IntoRawFd as _;
        let fd = std_l.into_raw_fd();
        // SAFETY: fd is a valid listening socket we own.
        assert_eq!(unsafe { libc::listen(fd, backlog) }, 0);
        unsafe { OwnedFd::from_raw_fd(fd) }
    })
    .unwrap()
}

/// Output of a command run inside `ns` (`ip netns exec`), failing the test
/// if it fails.
pub fn in_ns(ns: &Ns, cmd: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(cmd)
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `ss -ltn`'s Recv-Q and Send-Q (waiting, backlog) for the listener on
/// `local` (as ss writes it: `*:PORT` for a dual-stack wildcard).
pub fn ss_listen_queues(ns: &Ns, local: impl ToString) -> (u32, u32) {
    let (text, local) = (in_ns(ns, &["ss", "-ltnH"]), local.to_string());
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some(local.as_str()))
        .unwrap_or_else(|| panic!("ss shows no listener on {local}:\n{text}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[1].parse().unwrap(), f[2].parse().unwrap())
}
