//! One TCP connection carrying as much as it can: the client writes
//! `chunk`-byte buffers until its count (of writes) or time is up, then
//! shuts down its side; the server takes the bytes off the socket to EOF
//! without copying them (MSG_TRUNC): the measurement is then the stack's
//! per-packet work, not a second memcpy whose speed follows what else
//! loads the host's memory (the copying server's MB per CPU second varied
//! 2,200-3,100 between identical runs here, the discarding one's
//! 3,500-3,560). Units: bytes the server took. TCP's own flow control keeps
//! nothing in excess in flight.
use std::{io, net::SocketAddrV4, os::fd::OwnedFd};

use super::{sock, Shared, Workload};

/// Most bytes taken off the socket per call.
const RECV_BUF: usize = 256 << 10;

#[derive(Clone, Copy, Debug)]
pub struct Stream {
    /// Bytes per write.
    pub chunk: usize,
}

impl Workload for Stream {
    fn listen(&self, at: SocketAddrV4) -> io::Result<OwnedFd> {
        sock::listener(at, 1)
    }

    fn serve(&self, fd: OwnedFd, sh: &Shared) -> io::Result<()> {
        let c = loop {
            if !sh.serving() {
                return Ok(());
            }
            if let Some(c) = sock::accept(&fd)? {
                break c;
            }
        };
        while sh.serving() {
            match sock::discard(&c, RECV_BUF)? {
                Some(0) => break,
                Some(n) => sh.add_received(n as u64),
                None => {}
            }
        }
        Ok(())
    }

    fn drive(&self, to: SocketAddrV4, sh: &Shared) -> io::Result<()> {
        let c = sock::socket(libc::SOCK_STREAM)?;
        sock::timeouts(&c, sock::SEND_TIMEOUT, sock::SEND_TIMEOUT)?;
        sock::connect(&c, to)?;
        let chunk = vec![b'k'; self.chunk.max(1)];
        let mut writes = 0u64;
        while sh.driving(writes) {
            sock::write_all(&c, &chunk)?;
            writes += 1;
            sh.add_sent(chunk.len() as u64);
        }
        sock::shutdown_write(&c)
    }
}
