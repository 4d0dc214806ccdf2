//! Healthy traffic for benchmarks: what a tracer costs packets it never
//! reports. A client thread in one namespace talks to a server thread in
//! another, through whatever the caller put between them (a router
//! namespace, in the bench); nothing is meant to be dropped, and the server
//! counts what arrived.
//!
//! - [`Udp`]: small datagrams on a connected socket, `sendmmsg` batches.
//! - [`Churn`]: short TCP connections: connect, one small write, close.
//! - [`Stream`]: one TCP connection writing as fast as it can.
//!
//! Safety rails, as for the flood: each run stops after `count` units or
//! `duration`, whichever comes first, and both threads refuse to run in a
//! namespace that is not one created under /run/netns (or is the initial
//! one). The client never runs more than `window` units ahead of what the
//! server has taken in (UDP has no flow control of its own and an accept
//! queue overflows), so a starved server slows the client instead of
//! making the kernel drop.
mod churn;
mod sock;
mod stream;
mod udp;

use std::{
    io,
    net::SocketAddrV4,
    os::fd::OwnedFd,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

pub use churn::Churn;
pub use stream::Stream;
pub use udp::Udp;

use crate::ns;

/// How long the server waits, once the client is done, for units still on
/// their way before it gives up on them (they were then lost).
const DRAIN: Duration = Duration::from_secs(1);

/// Where the two ends run and how long.
#[derive(Clone, Debug)]
pub struct Ends {
    /// Namespace files (/run/netns/NAME).
    pub client_ns: PathBuf,
    pub server_ns: PathBuf,
    /// The server's address, as the client reaches it.
    pub server: SocketAddrV4,
    /// Pin each side's thread to a CPU (steadier numbers).
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// Stop after this many units (packets, connections, writes)...
    pub count: u64,
    /// ...or after this long, whichever comes first.
    pub duration: Duration,
}

/// What one run did. Units are packets ([`Udp`]), connections ([`Churn`])
/// or bytes ([`Stream`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Done {
    /// Units the client completed (sent, connected, written).
    pub sent: u64,
    /// Units the server took in; `sent - received` were lost.
    pub received: u64,
    /// From the client's start to the server's last unit.
    pub elapsed: Duration,
    /// CPU time of each side's thread, with the kernel work that ran in its
    /// context (on veth, the softirq that carries a packet through every
    /// namespace to its socket runs in the sender's).
    pub client_cpu: Duration,
    pub server_cpu: Duration,
    /// How long each thread was runnable but waited for its CPU: what
    /// else on the machine took from the wall-clock figure.
    pub client_wait: Duration,
    pub server_wait: Duration,
}

/// One side of a workload.
pub trait Workload: Send + Sync + 'static {
    /// In the server's namespace: the socket the client reaches.
    fn listen(&self, at: SocketAddrV4) -> io::Result<OwnedFd>;
    /// Takes units in until [`Shared::serving`] says to stop.
    fn serve(&self, sock: OwnedFd, sh: &Shared) -> io::Result<()>;
    /// Starts units until [`Shared::driving`] says to stop.
    fn drive(&self, to: SocketAddrV4, sh: &Shared) -> io::Result<()>;
}

/// What the two threads share.
pub struct Shared {
    t0: Instant,
    /// Nanoseconds since t0 at which the client stops (set as it starts).
    deadline_ns: AtomicU64,
    count: u64,
    window: u64,
    /// Units the client completed, the server took in.
    sent: AtomicU64,
    received: AtomicU64,
    /// Nanoseconds since t0: the client's start, the server's last unit.
    started_ns: AtomicU64,
    last_ns: AtomicU64,
    client_done: AtomicBool,
    /// One side failed: the other stops too.
    abort: AtomicBool,
}

impl Shared {
    fn since_t0(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// The client, before starting unit number `sent()`: `false` once the
    /// count or the time is up, or the server failed. Waits (sleeping, not
    /// spinning: the client's CPU time is the measurement) while `window`
    /// units are in flight.
    pub fn driving(&self, started: u64) -> bool {
        loop {
            if self.abort.load(Ordering::Relaxed)
                || started >= self.count
                || self.since_t0() >= self.deadline_ns.load(Ordering::Relaxed)
            {
                return false;
            }
            let sent = self.sent.load(Ordering::Relaxed);
            if sent.saturating_sub(self.received.load(Ordering::Relaxed)) < self.window {
                return true;
            }
            thread::sleep(Duration::from_micros(50));
        }
    }

    pub fn add_sent(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_received(&self, n: u64) {
        self.received.fetch_add(n, Ordering::Relaxed);
        self.last_ns.store(self.since_t0(), Ordering::Relaxed);
    }

    /// The server, between units: `false` once the client is done and
    /// everything it sent arrived, or nothing more arrived for [`DRAIN`]
    /// after it finished, or the client failed.
    pub fn serving(&self) -> bool {
        if self.abort.load(Ordering::Relaxed) {
            return false;
        }
        if !self.client_done.load(Ordering::Acquire) {
            return true;
        }
        let (sent, received) = (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        );
        let last = self
            .last_ns
            .load(Ordering::Relaxed)
            .max(self.started_ns.load(Ordering::Relaxed));
        received < sent && self.since_t0().saturating_sub(last) < DRAIN.as_nanos() as u64
    }
}

/// Runs `w` between the two namespaces of `e`: the server listens first
/// (its readiness is the client's start signal), then the client drives
/// until its count or time is up, then the server drains.
pub fn run<W: Workload>(e: &Ends, w: W, window: u64) -> io::Result<Done> {
    let sh = Arc::new(Shared {
        t0: Instant::now(),
        deadline_ns: AtomicU64::new(u64::MAX),
        count: e.count,
        window: window.max(1),
        sent: AtomicU64::new(0),
        received: AtomicU64::new(0),
        started_ns: AtomicU64::new(0),
        last_ns: AtomicU64::new(0),
        client_done: AtomicBool::new(false),
        abort: AtomicBool::new(false),
    });
    let w = Arc::new(w);
    let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
    let server = {
        let (sh, w, e) = (sh.clone(), w.clone(), e.clone());
        thread::spawn(move || -> io::Result<(Duration, Duration)> {
            let sock = match ns::enter(&e.server_ns, e.server_cpu).and_then(|()| w.listen(e.server))
            {
                Ok(s) => s,
                Err(err) => {
                    let _ = ready_tx.send(Err(io::Error::new(err.kind(), err.to_string())));
                    return Err(err);
                }
            };
            let _ = ready_tx.send(Ok(()));
            let (cpu0, wait0) = (ns::thread_cpu(), ns::thread_wait());
            let r = w.serve(sock, &sh);
            if r.is_err() {
                sh.abort.store(true, Ordering::Relaxed);
            }
            r.map(|()| (ns::thread_cpu() - cpu0, ns::thread_wait() - wait0))
        })
    };
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            let _ = server.join();
            return Err(io::Error::new(err.kind(), format!("server: {err}")));
        }
        Err(_) => {
            let _ = server.join();
            return Err(io::Error::other("server thread ended before listening"));
        }
    }
    let client = {
        let (sh, w, e) = (sh.clone(), w.clone(), e.clone());
        thread::spawn(move || -> io::Result<(Duration, Duration)> {
            let r = ns::enter(&e.client_ns, e.client_cpu).and_then(|()| {
                let (cpu0, wait0) = (ns::thread_cpu(), ns::thread_wait());
                let now = sh.since_t0();
                sh.started_ns.store(now, Ordering::Relaxed);
                let secs = e.duration.as_nanos().min(u128::from(u64::MAX / 2)) as u64;
                sh.deadline_ns.store(now + secs, Ordering::Relaxed);
                w.drive(e.server, &sh)
                    .map(|()| (ns::thread_cpu() - cpu0, ns::thread_wait() - wait0))
            });
            if r.is_err() {
                sh.abort.store(true, Ordering::Relaxed);
            }
            sh.client_done.store(true, Ordering::Release);
            r
        })
    };
    let client_cpu = join(client, "client");
    let server_cpu = join(server, "server");
    let ((client_cpu, client_wait), (server_cpu, server_wait)) = match (client_cpu, server_cpu) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(e), _) => return Err(io::Error::new(e.kind(), format!("client: {e}"))),
        (_, Err(e)) => return Err(io::Error::new(e.kind(), format!("server: {e}"))),
    };
    let started = sh.started_ns.load(Ordering::Relaxed);
    let last = sh.last_ns.load(Ordering::Relaxed).max(started);
    Ok(Done {
        sent: sh.sent.load(Ordering::Relaxed),
        received: sh.received.load(Ordering::Relaxed),
        elapsed: Duration::from_nanos(last - started),
        client_cpu,
        server_cpu,
        client_wait,
        server_wait,
    })
}

fn join<T>(h: thread::JoinHandle<io::Result<T>>, who: &str) -> io::Result<T> {
    h.join()
        .map_err(|_| io::Error::other(format!("{who} thread panicked")))?
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn refuses_the_initial_namespace() {
        // Unit tests run in the host's namespace (or a container's main
        // one, which PID 1 shares): the server side must refuse before it
        // listens, and the run must say so.
        let e = Ends {
            client_ns: "/proc/self/ns/net".into(),
            server_ns: "/proc/self/ns/net".into(),
            server: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9),
            client_cpu: None,
            server_cpu: None,
            count: 1,
            duration: Duration::from_millis(1),
        };
        let err = run(&e, Udp { payload: 64 }, 1).unwrap_err();
        assert!(err.to_string().contains("refusing"), "{err}");
    }
}
