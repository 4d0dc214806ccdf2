//! The few socket calls the workloads make, on raw fds: the crate depends on
//! libc only (xtask builds it before anything else).
use std::{
    io,
    net::SocketAddrV4,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    time::Duration,
};

/// How long a blocking receive waits before the loop looks at the shared
/// state again.
pub const POLL: Duration = Duration::from_millis(20);
/// A connect or write that takes longer is a failure, not a slow unit.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(2);

fn check(rc: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(rc)
}

pub fn socket(ty: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned right away.
    let fd = check(
        unsafe { libc::socket(libc::AF_INET, ty | libc::SOCK_CLOEXEC, 0) },
        "socket",
    )?;
    // SAFETY: a new fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: &T,
    what: &str,
) -> io::Result<()> {
    // SAFETY: v is a valid T for the call's duration.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(rc, what).map(|_| ())
}

pub fn set_int(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
    what: &str,
) -> io::Result<()> {
    setopt(fd.as_raw_fd(), level, name, &v, what)
}

fn timeval(d: Duration) -> libc::timeval {
    libc::timeval {
        // The fields' own types: musl's time_t aliases are deprecated.
        tv_sec: d.as_secs() as _,
        tv_usec: d.subsec_micros() as _,
    }
}

/// Receives (and accepts) give up after `recv`, sends (and connects) after
/// `send`: every blocking call in the workloads is bounded.
pub fn timeouts(fd: &OwnedFd, recv: Duration, send: Duration) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    setopt(
        raw,
        libc::SOL_SOCKET,
        libc::SO_RCVTIMEO,
        &timeval(recv),
        "SO_RCVTIMEO",
    )?;
    setopt(
        raw,
        libc::SOL_SOCKET,
        libc::SO_SNDTIMEO,
        &timeval(send),
        "SO_SNDTIMEO",
    )
}

/// A receive buffer of `bytes` even above net.core.rmem_max (root), else
/// as much as the sysctl allows.
pub fn rcvbuf(fd: &OwnedFd, bytes: libc::c_int) -> io::Result<()> {
    set_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        bytes,
        "SO_RCVBUFFORCE",
    )
    .or_else(|_| set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes, "SO_RCVBUF"))
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

pub fn bind(fd: &OwnedFd, a: SocketAddrV4) -> io::Result<()> {
    let sa = sockaddr(a);
    // SAFETY: sa is a valid sockaddr_in for the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sa).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    check(rc, &format!("bind {a}")).map(|_| ())
}

pub fn connect(fd: &OwnedFd, a: SocketAddrV4) -> io::Result<()> {
    let sa = sockaddr(a);
    // SAFETY: sa is a valid sockaddr_in for the call.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const sa).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    check(rc, &format!("connect {a}")).map(|_| ())
}

/// A TCP listener on `a` whose accept gives up after [`POLL`].
pub fn listener(a: SocketAddrV4, backlog: libc::c_int) -> io::Result<OwnedFd> {
    let fd = socket(libc::SOCK_STREAM)?;
    set_int(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")?;
    timeouts(&fd, POLL, SEND_TIMEOUT)?;
    bind(&fd, a)?;
    // SAFETY: plain syscall on our fd.
    check(unsafe { libc::listen(fd.as_raw_fd(), backlog) }, "listen")?;
    Ok(fd)
}

/// `Ok(None)` when the receive timeout passed first (EAGAIN).
pub fn accept(fd: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: no address wanted; the fd is owned right away.
    let rc = unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    match check(rc, "accept") {
        // SAFETY: a new fd nobody else owns.
        Ok(c) => Ok(Some(unsafe { OwnedFd::from_raw_fd(c) })),
        Err(e) if would_block(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// `Ok(None)` when the receive timeout passed first; `Ok(Some(0))` at EOF.
pub fn read(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for buf.len() bytes.
    let rc = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    match check(rc as libc::c_int, "read") {
        Ok(n) => Ok(Some(n as usize)),
        Err(e) if would_block(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Takes up to `len` bytes off a TCP socket without copying them
/// (MSG_TRUNC: `tcp_recvmsg_locked` skips the copy and frees them,
/// https://github.com/torvalds/linux/blob/v6.18/net/ipv4/tcp.c); as
/// [`read`] otherwise.
pub fn discard(fd: &OwnedFd, len: usize) -> io::Result<Option<usize>> {
    // SAFETY: with MSG_TRUNC TCP writes nothing to the buffer.
    let rc = unsafe { libc::recv(fd.as_raw_fd(), std::ptr::null_mut(), len, libc::MSG_TRUNC) };
    match check(rc as libc::c_int, "recv") {
        Ok(n) => Ok(Some(n as usize)),
        Err(e) if would_block(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes all of `buf` (a send timeout is a failure).
pub fn write_all(fd: &OwnedFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for buf.len() bytes.
        let rc = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        match check(rc as libc::c_int, "write") {
            Ok(n) => buf = &buf[n as usize..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub fn shutdown_write(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: plain syscall on our fd.
    check(
        unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) },
        "shutdown",
    )
    .map(|_| ())
}
