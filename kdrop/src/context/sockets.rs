//! The client's side of a handshake: the TCP socket in SYN-SENT at a local
//! address, and the remote it waits for, read through sock_diag
//! (NETLINK_SOCK_DIAG). A SYN-ACK from any other address is refused with a
//! RST (`tcp_v4_rcv` finds no socket for it: NO_SOCKET).
use std::net::SocketAddr;

use anyhow::Result;

use super::{
    listeners::{diag_request, parse_diag_msg},
    netlink::{Socket, AF_INET, AF_INET6, NLM_F_DUMP},
};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `TCP_SYN_SENT` of include/net/tcp_states.h.
const TCP_SYN_SENT: u8 = 2;

/// The remote a SYN-SENT socket bound to `local` waits for, in the calling
/// thread's namespace.
pub fn syn_sent_to(local: SocketAddr) -> Result<Option<SocketAddr>> {
    let sock = Socket::open_protocol(NETLINK_SOCK_DIAG, 0, false)?;
    let family = if local.is_ipv4() { AF_INET } else { AF_INET6 };
    let msgs = sock
        .request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_DUMP,
            &diag_request(family, 1 << TCP_SYN_SENT),
        )?
        .map_err(std::io::Error::from_raw_os_error)?;
    Ok(msgs
        .iter()
        .filter_map(|p| parse_diag_msg(p))
        .find(|s| s.state == TCP_SYN_SENT && s.local == local)
        .map(|s| s.remote))
}

#[cfg(test)]
mod tests {
    use std::{
        net::{TcpListener, TcpStream},
        os::fd::AsRawFd,
    };

    use super::*;

    /// A real socket of this namespace: connected, then not in SYN-SENT;
    /// nothing waits at an address no socket has.
    #[test]
    fn finds_no_socket_that_is_not_waiting() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(c.as_raw_fd() > 0);
        let local = c.local_addr().unwrap();
        // ESTABLISHED, not SYN-SENT.
        assert_eq!(syn_sent_to(local).unwrap(), None);
    }
}
