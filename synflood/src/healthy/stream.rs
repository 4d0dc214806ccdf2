//! One TCP connection carrying as much as it can: the client writes
//! `chunk`-byte buffers until its count (of writes) or time is up, then
//! shuts down its side; the server reads to EOF. Units: bytes the server
//! read. TCP's own flow control keeps nothing in excess in flight.
use std::{io, net::SocketAddrV4, os::fd::OwnedFd};

use super::{sock, Shared, Workload};

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
        let mut buf = vec![0u8; RECV_BUF];
        while sh.serving() {
            match sock::read(&c, &mut buf)? {
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
