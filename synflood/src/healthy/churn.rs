//! TCP connection churn: the client connects, writes a few bytes and
//! closes; the server accepts, reads them to the client's FIN and closes.
//! Every connection is a full, successful handshake and a clean close.
//! Units: connections the server saw through (exactly `write` bytes, then
//! EOF).
//!
//! The client closes first, so TIME_WAIT is on its side: the namespace it
//! runs in needs `net.ipv4.tcp_tw_reuse=1` and a wide
//! `net.ipv4.ip_local_port_range` to keep finding source ports.
use std::{io, net::SocketAddrV4, os::fd::OwnedFd, time::Instant};

use super::{sock, Shared, Workload, DRAIN};

/// Far above the client's window, so the accept queue never fills (a full
/// one drops the handshake's last ACK).
const BACKLOG: libc::c_int = 4096;

#[derive(Clone, Copy, Debug)]
pub struct Churn {
    /// Bytes the client writes before closing (0: none).
    pub write: usize,
}

impl Churn {
    /// Reads one accepted connection to EOF; its byte count.
    fn drain(&self, c: &OwnedFd) -> io::Result<usize> {
        let mut buf = [0u8; 256];
        let mut got = 0;
        let t0 = Instant::now();
        loop {
            match sock::read(c, &mut buf)? {
                Some(0) => return Ok(got),
                Some(n) => got += n,
                None if t0.elapsed() < DRAIN => {}
                None => {
                    return Err(io::Error::other(format!(
                        "an accepted connection sent {got} of {} bytes and no FIN within {DRAIN:?}",
                        self.write
                    )))
                }
            }
        }
    }
}

impl Workload for Churn {
    fn listen(&self, at: SocketAddrV4) -> io::Result<OwnedFd> {
        sock::listener(at, BACKLOG)
    }

    fn serve(&self, fd: OwnedFd, sh: &Shared) -> io::Result<()> {
        while sh.serving() {
            // Accepted sockets inherit the listener's receive timeout.
            let Some(c) = sock::accept(&fd)? else {
                continue;
            };
            let got = self.drain(&c)?;
            if got != self.write {
                return Err(io::Error::other(format!(
                    "a connection carried {got} bytes, not {}",
                    self.write
                )));
            }
            drop(c);
            sh.add_received(1);
        }
        Ok(())
    }

    fn drive(&self, to: SocketAddrV4, sh: &Shared) -> io::Result<()> {
        let payload = vec![b'k'; self.write];
        let mut made = 0u64;
        while sh.driving(made) {
            let c = sock::socket(libc::SOCK_STREAM)?;
            // A connect or write taking longer than this fails the run.
            sock::timeouts(&c, sock::SEND_TIMEOUT, sock::SEND_TIMEOUT)?;
            sock::connect(&c, to)?;
            sock::write_all(&c, &payload)?;
            drop(c);
            made += 1;
            sh.add_sent(1);
        }
        Ok(())
    }
}
