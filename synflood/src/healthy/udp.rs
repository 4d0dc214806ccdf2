//! Small UDP datagrams, `sendmmsg` on a connected socket (its route is
//! cached: the client's own stack does no route lookup per packet) and
//! `recvmmsg` at the server. Units: datagrams.
use std::{
    io,
    net::SocketAddrV4,
    os::fd::{AsRawFd as _, OwnedFd},
};

use super::{sock, Shared, Workload};

/// Datagrams per `sendmmsg` / `recvmmsg`.
const BATCH: usize = 64;
/// Room for the datagrams the client may have in flight, and more.
const RCVBUF: libc::c_int = 32 << 20;
const RECV_BUF: usize = 2048;

#[derive(Clone, Copy, Debug)]
pub struct Udp {
    /// Payload bytes per datagram.
    pub payload: usize,
}

fn msgs(bufs: &mut [Vec<u8>], iovs: &mut Vec<libc::iovec>) -> Vec<libc::mmsghdr> {
    *iovs = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    iovs.iter_mut()
        .map(|iov| {
            // SAFETY: a zeroed mmsghdr is valid; it points at one iovec
            // that outlives it (the caller keeps `iovs`).
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect()
}

impl Workload for Udp {
    fn listen(&self, at: SocketAddrV4) -> io::Result<OwnedFd> {
        let fd = sock::socket(libc::SOCK_DGRAM)?;
        sock::rcvbuf(&fd, RCVBUF)?;
        sock::timeouts(&fd, sock::POLL, sock::SEND_TIMEOUT)?;
        sock::bind(&fd, at)?;
        Ok(fd)
    }

    fn serve(&self, fd: OwnedFd, sh: &Shared) -> io::Result<()> {
        let mut bufs = vec![vec![0u8; RECV_BUF]; BATCH];
        let mut iovs = Vec::new();
        let mut m = msgs(&mut bufs, &mut iovs);
        while sh.serving() {
            // MSG_WAITFORONE: block (up to the receive timeout) for the
            // first, then take what is queued.
            // SAFETY: m points at BATCH valid buffers.
            let rc = unsafe {
                libc::recvmmsg(
                    fd.as_raw_fd(),
                    m.as_mut_ptr(),
                    BATCH as u32,
                    // c_int in glibc's prototype, c_uint in musl's.
                    libc::MSG_WAITFORONE as _,
                    std::ptr::null_mut(),
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if sock::would_block(&e) {
                    continue;
                }
                return Err(io::Error::new(e.kind(), format!("recvmmsg: {e}")));
            }
            sh.add_received(rc as u64);
        }
        Ok(())
    }

    fn drive(&self, to: SocketAddrV4, sh: &Shared) -> io::Result<()> {
        let fd = sock::socket(libc::SOCK_DGRAM)?;
        sock::timeouts(&fd, sock::POLL, sock::SEND_TIMEOUT)?;
        sock::connect(&fd, to)?;
        let mut bufs: Vec<Vec<u8>> = (0..BATCH)
            .map(|i| vec![i as u8; self.payload.max(1)])
            .collect();
        let mut iovs = Vec::new();
        let mut m = msgs(&mut bufs, &mut iovs);
        let mut sent = 0u64;
        while sh.driving(sent) {
            let n = (sh.count - sent).min(BATCH as u64) as u32;
            // SAFETY: m[..n] point at valid payloads.
            let rc = unsafe { libc::sendmmsg(fd.as_raw_fd(), m.as_mut_ptr(), n, 0) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                // A full device queue is back-pressure, not failure.
                if e.raw_os_error() == Some(libc::ENOBUFS) || sock::would_block(&e) {
                    std::thread::yield_now();
                    continue;
                }
                return Err(io::Error::new(e.kind(), format!("sendmmsg: {e}")));
            }
            sent += rc as u64;
            sh.add_sent(rc as u64);
        }
        Ok(())
    }
}
