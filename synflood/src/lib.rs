//! A bounded SYN flood for benchmarks and torture tests.
//!
//! Ethernet frames carrying TCP SYNs, written with `sendmmsg` on an AF_PACKET
//! socket that bypasses the qdisc, so nearly all the time goes into the
//! receiving side's stack (and the drop path a tracer hooks), which runs in
//! the sender's context: veth delivers to the peer through the backlog, and
//! the softirq runs when the sender re-enables bottom halves.
//!
//! Safety rails: it stops at `count` packets or after `duration`, whichever
//! comes first, and refuses to run in the initial network namespace: frames
//! only ever leave through an interface of a namespace the caller created.
pub mod healthy;
mod ns;
mod packet;

use std::{
    fs, io,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
    time::{Duration, Instant},
};

pub use packet::{syn_frame, FRAME_LEN};

use ns::{in_own_namespace, pin_to, thread_cpu};

/// Frames per `sendmmsg` call.
const BATCH: usize = 64;

/// What to send.
#[derive(Clone, Debug)]
pub struct Flood {
    /// Interface to send from, in the namespace the flood runs in.
    pub ifname: String,
    pub src_mac: [u8; 6],
    /// The peer's MAC: frames for another MAC would be dropped as OTHERHOST.
    pub dst_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub dport: u16,
    /// Source ports cycle through `sport_base..sport_base + sport_span`.
    pub sport_base: u16,
    pub sport_span: u16,
    /// Stop after this many frames...
    pub count: u64,
    /// ...or after this long, whichever comes first.
    pub duration: Duration,
    /// Pin the sending thread to this CPU (steadier numbers).
    pub cpu: Option<usize>,
}

/// What was sent: frames the kernel accepted, for how long, and the CPU
/// time the sending thread used (with the receiving side's softirq work,
/// which runs in its context).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sent {
    pub packets: u64,
    pub elapsed: Duration,
    pub cpu: Duration,
}

impl Sent {
    pub fn pps(&self) -> f64 {
        self.packets as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Packets per second of the sender's own CPU time: what one CPU
    /// given to the flood alone would manage. Far less sensitive than
    /// `pps` to other work sharing the CPU.
    pub fn pps_cpu(&self) -> f64 {
        self.packets as f64 / self.cpu.as_secs_f64().max(1e-9)
    }
}

impl Flood {
    /// Floods from the calling thread's network namespace, which must be a
    /// named one (/run/netns) other than the initial one.
    pub fn run(&self) -> io::Result<Sent> {
        if !in_own_namespace()? {
            return Err(io::Error::other(
                "refusing to flood outside a namespace created for it (/run/netns)",
            ));
        }
        if let Some(cpu) = self.cpu {
            pin_to(cpu)?;
        }
        let sock = packet_socket(&self.ifname)?;
        let mut frames = vec![[0u8; FRAME_LEN]; BATCH];
        let mut iovs: Vec<libc::iovec> = frames
            .iter_mut()
            .map(|f| libc::iovec {
                iov_base: f.as_mut_ptr().cast(),
                iov_len: FRAME_LEN,
            })
            .collect();
        // SAFETY: zeroed mmsghdr is valid; each points at one iovec that
        // lives as long as `iovs`.
        let mut msgs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();

        let span = u64::from(self.sport_span.max(1));
        let cpu0 = thread_cpu();
        let start = Instant::now();
        let mut sent: u64 = 0;
        while sent < self.count && start.elapsed() < self.duration {
            let n = (self.count - sent).min(BATCH as u64) as usize;
            for (i, frame) in frames.iter_mut().take(n).enumerate() {
                let seq = sent + i as u64;
                let sport = self.sport_base.wrapping_add((seq % span) as u16);
                *frame = syn_frame(self, sport, seq as u32);
            }
            // SAFETY: msgs[..n] point at initialised frames.
            let rc = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                // A full device queue is back-pressure, not failure.
                if e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == io::ErrorKind::Interrupted
                {
                    std::thread::yield_now();
                    continue;
                }
                return Err(e);
            }
            sent += rc as u64;
        }
        Ok(Sent {
            packets: sent,
            elapsed: start.elapsed(),
            cpu: thread_cpu() - cpu0,
        })
    }

    /// Floods from a thread that joins the namespace at `netns` (a file such
    /// as /run/netns/NAME); returns when the flood ends.
    pub fn run_in(&self, netns: &Path) -> io::Result<Sent> {
        let file = fs::File::open(netns)?;
        let flood = self.clone();
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only; the fd is valid for the call.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            flood.run()
        })
        .join()
        .map_err(|_| io::Error::other("flood thread panicked"))?
    }
}

/// An AF_PACKET socket bound to `ifname` that receives nothing (protocol 0)
/// and hands frames straight to the driver (no qdisc).
fn packet_socket(ifname: &str) -> io::Result<OwnedFd> {
    let name = std::ffi::CString::new(ifname).map_err(io::Error::other)?;
    // SAFETY: plain libc calls; the fd is owned right away.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::other(format!("no interface {ifname}")));
    }
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: option value is a c_int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zeroed sockaddr_ll is valid; family and ifindex filled in.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = ifindex as i32;
    let rc = unsafe {
        libc::bind(
            fd,
            (&raw const sll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_the_initial_namespace() {
        // Unit tests run in the host's namespace (or a container's main one,
        // which PID 1 shares): the flood must refuse before sending.
        let f = Flood {
            ifname: "lo".into(),
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: Ipv4Addr::new(10, 250, 0, 1),
            dst: Ipv4Addr::new(10, 250, 0, 2),
            dport: 8080,
            sport_base: 1024,
            sport_span: 1000,
            count: 1,
            duration: Duration::from_millis(1),
            cpu: None,
        };
        let e = f.run().unwrap_err();
        assert!(e.to_string().contains("refusing"), "{e}");
    }
}
