//! Harness for kdrop's integration tests: run the real binary, wait for its
//! readiness line, provoke real drops from namespaces the test owns.
use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        mpsc::{self, Receiver, RecvTimeoutError},
        OnceLock,
    },
    time::{Duration, Instant},
};

use kdrop::context::netns::in_netns;

pub mod containerd;
pub mod cri;
pub mod flood;
pub mod manifest;
pub mod prom;
pub mod scrape;
pub use kdrop::lab::netlab::{ip, veth, Ns};
use serde_json::Value;

/// How long kdrop may take to attach. Startup is well under a second; this
/// only bounds a hang.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long to wait for an event after provoking its drop.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A bound stretched by `KDROP_TEST_TIME_SCALE` (a whole number, default 1):
/// `cargo xtask vm` sets it for guests under TCG, several times slower than
/// this machine. Bounds only: nothing waits longer than its event needs.
pub fn bound(d: Duration) -> Duration {
    let scale = std::env::var("KDROP_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    d * scale
}

pub fn kdrop_bin() -> PathBuf {
    let bin = std::env::var_os("KDROP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/kdrop")
        });
    assert!(
        bin.exists(),
        "{} missing: run the tests with `cargo xtask test`",
        bin.display()
    );
    bin
}

/// Does this kernel's `kfree_skb` carry a drop reason (5.17+; not on
/// Debian 11's 5.10)? Asked of `kdrop check` once per test process, so tests
/// key on what kdrop found in BTF, not on version strings.
/// Is the running kernel at least `major.minor` (uname's release)?
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    have >= (major, minor)
}

pub fn kernel_has_drop_reasons() -> bool {
    let text = check_output();
    let line = text
        .lines()
        .find(|l| l.starts_with("kfree_skb "))
        .unwrap_or_else(|| panic!("kdrop check names no kfree_skb arguments:\n{text}"));
    if line.contains("no reason argument") {
        false
    } else if line.contains("reason #") {
        true
    } else {
        panic!("kdrop check: unexpected {line:?}")
    }
}

/// The rungs of the drop path's ladder that `kdrop check` could attach here
/// (it tries every one), e.g. `["tp_btf", "raw_tp"]`.
pub fn attachable_rungs() -> Vec<String> {
    check_output()
        .lines()
        .skip_while(|l| !l.starts_with("probe       skb:kfree_skb"))
        .skip(1)
        .map_while(|l| l.strip_prefix("              "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, outcome)| outcome.trim() == "attached")
        .map(|(rung, _)| rung.to_string())
        .collect()
}

/// Does the fib_validate_source return rung (fexit or kretprobe) attach
/// here? Then reverse-path drops are named even without kernel reasons.
pub fn src_check_attaches() -> bool {
    check_output()
        .lines()
        .find(|l| l.starts_with("probe       fib_validate_source (return)"))
        .is_some_and(|l| !l.ends_with("using none"))
}

/// The rung `kdrop check` chose for an optional probe point (`"nft_do_chain
/// (return)"`), or why none attached (the point's refusals, for a test's
/// skip message).
pub fn point_rung(point: &str) -> Result<String, String> {
    let text = check_output();
    let head = format!("probe       {point} ");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&head));
    let line = lines
        .next()
        .ok_or_else(|| format!("kdrop check lists no probe point {point}"))?;
    match line.rsplit_once("using ") {
        Some((_, r)) if r != "none" => Ok(r.to_string()),
        _ => Err(lines
            .map_while(|l| l.strip_prefix("              "))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// The cause kdrop gives an rp_filter drop: named from the kernel's reason,
/// or derived from fib_validate_source's return code where only that is
/// available; `no_reason` where neither is.
pub fn expected_rp_filter_cause() -> &'static str {
    if kernel_has_drop_reasons() || src_check_attaches() {
        "rp_filter_strict"
    } else {
        "no_reason"
    }
}

/// `kdrop check`'s report, run once per test process.
fn check_output() -> &'static str {
    static OUT: OnceLock<String> = OnceLock::new();
    OUT.get_or_init(|| {
        let out = Command::new(kdrop_bin())
            .arg("check")
            .output()
            .expect("running kdrop check");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "kdrop check failed:\n{text}");
        text
    })
}

/// The `reason` an event must carry for a drop the kernel names `name`:
/// that name where kfree_skb has reasons, null where it has none.
pub fn expected_reason(name: &str) -> Value {
    if kernel_has_drop_reasons() {
        Value::from(name)
    } else {
        Value::Null
    }
}

/// The finding's `cause` for a drop whose kernel reason gives `cause`; on a
/// kernel without reasons kdrop says it cannot know (`no_reason`).
pub fn expected_cause(cause: &str) -> &str {
    if kernel_has_drop_reasons() {
        cause
    } else {
        "no_reason"
    }
}

/// Whether the running kernel's `enum skb_drop_reason` has `name` (e.g.
/// IP_LOCAL_SOURCE came in 6.13): the reason kdrop reports where it has,
/// `None` where the kernel names the drop otherwise (or not at all).
pub fn kernel_reason(name: &str) -> Option<&str> {
    let btf = kdrop::kernel::btf::Btf::from_file(std::path::Path::new("/sys/kernel/btf/vmlinux"))
        .unwrap();
    kdrop::kernel::facts::Reasons::from_btf(&btf)
        .has(name)
        .then_some(name)
}

/// The `reason` label kdrop monitor gives a drop the kernel names `name`:
/// `unknown` on a kernel without drop reasons.
pub fn expected_reason_label(name: &str) -> &str {
    if kernel_has_drop_reasons() {
        name
    } else {
        "unknown"
    }
}

/// A namespace name unique to this test process and test.
pub fn ns_name(test: &str) -> String {
    format!("kdt{}-{test}", std::process::id())
}

/// A running kdrop.
pub struct Kdrop {
    child: Option<Child>,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    pub stderr_seen: Vec<String>,
}

/// A kdrop that has exited.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

/// The counters of kdrop's exit summary.
#[derive(Debug, PartialEq, Eq)]
pub struct Counts {
    pub received: u64,
    pub matched: u64,
    pub emitted: u64,
    pub lost: u64,
    /// Left out by `--sample` (0 without it: the summary then omits it).
    pub sampled_out: u64,
}

fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Kdrop {
    /// Starts kdrop and waits for `kdrop: tracing`.
    pub fn start(args: &[&str]) -> Self {
        Self::start_env(args, &[])
    }

    /// `start` with extra environment (e.g. `KDROP_RUNG`).
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut k = Self::spawn(args, env);
        k.wait_tracing();
        k
    }

    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(kdrop_bin());
        cmd.args(args).envs(env.iter().copied());
        Self::spawn_command(cmd)
    }

    /// Starts kdrop through a command of the test's making (e.g. inside
    /// `unshare`) and waits for `kdrop: tracing`.
    pub fn start_command(cmd: Command) -> Self {
        let mut k = Self::spawn_command(cmd);
        k.wait_tracing();
        k
    }

    fn spawn_command(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning kdrop");
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        Kdrop {
            child: Some(child),
            stdout,
            stderr,
            stderr_seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn wait_tracing(&mut self) {
        let limit = bound(START_TIMEOUT);
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    let ready = line.starts_with("kdrop: tracing");
                    self.stderr_seen.push(line);
                    if ready {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("kdrop not tracing after {limit:?}: {:?}", self.stderr_seen)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.as_mut().unwrap().wait();
                    panic!(
                        "kdrop exited before tracing ({status:?}): {:?}",
                        self.stderr_seen
                    )
                }
            }
        }
    }

    /// The next line on stdout (text output), or `None` after `timeout`.
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        self.stdout.recv_timeout(timeout).ok()
    }

    /// The next JSON event on stdout, or `None` after `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<Value> {
        let line = self.stdout.recv_timeout(timeout).ok()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}")))
    }

    /// The first event `want` accepts, failing the test after EVENT_TIMEOUT.
    pub fn expect_event(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        self.expect_event_within(what, EVENT_TIMEOUT, want)
    }

    /// The first event `want` accepts, failing the test after `timeout`
    /// (scaled by KDROP_TEST_TIME_SCALE, see `bound`).
    pub fn expect_event_within(
        &self,
        what: &str,
        timeout: Duration,
        want: impl Fn(&Value) -> bool,
    ) -> Value {
        let limit = bound(timeout);
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.next_event(left) {
                Some(e) if want(&e) => return e,
                Some(e) => seen.push(e),
                None => break,
            }
        }
        panic!("no event for {what} within {limit:?}; saw {seen:?}")
    }

    /// Sends `signal` and waits for the exit (bounded).
    pub fn stop(mut self, signal: i32) -> Finished {
        let mut child = self.child.take().unwrap();
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = Instant::now() + bound(Duration::from_secs(10));
        let status = loop {
            if let Some(s) = child.try_wait().expect("waiting for kdrop") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("kdrop did not exit within 10 s of signal {signal}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.finish(status)
    }

    /// Waits for kdrop to exit by itself (--count, --duration, errors).
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let mut child = self.child.take().unwrap();
        let timeout = bound(timeout);
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = child.try_wait().expect("waiting for kdrop") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("kdrop still running after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.finish(status)
    }

    fn finish(&mut self, status: ExitStatus) -> Finished {
        // The pipes close with the process: collect the rest.
        let stdout: Vec<String> = self.stdout.iter().collect();
        let mut stderr = std::mem::take(&mut self.stderr_seen);
        stderr.extend(self.stderr.iter());
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Kdrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Finished {
    /// `kdrop: N events in Xs (matched M, emitted E, lost L[, sampled out S])`.
    pub fn counts(&self) -> Counts {
        let line = self
            .stderr
            .iter()
            .find(|l| l.contains(" events in ") && l.contains("(matched "))
            .unwrap_or_else(|| panic!("no summary in {:?}", self.stderr));
        let nums: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .filter(|s| !s.is_empty() && !s.contains('.'))
            .map(|s| s.parse().unwrap())
            .collect();
        // N, then the integer part of the seconds is skipped by the '.' filter.
        assert!(
            nums.len() == 4 || (nums.len() == 5 && line.contains(", sampled out ")),
            "summary {line:?}"
        );
        Counts {
            received: nums[0],
            matched: nums[1],
            emitted: nums[2],
            lost: nums[3],
            sampled_out: nums.get(4).copied().unwrap_or(0),
        }
    }

    pub fn events(&self) -> Vec<Value> {
        self.stdout
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Pair's addressing on c0 and s0: IPv4 10.<net>.0.1/.2 and IPv6
/// fd00:<net>::1/::2 (no DAD, so the addresses are usable at once).
pub fn pair_addresses(client: &Ns, server: &Ns, net: u8) {
    for (ns, dev, last) in [(client, "c0", 1), (server, "s0", 2)] {
        ns.ip(&["addr", "add", &format!("10.{net}.0.{last}/24"), "dev", dev])
            .unwrap();
        ns.ip(&[
            "addr",
            "add",
            &format!("fd00:{net}::{last}/64"),
            "dev",
            dev,
            "nodad",
        ])
        .unwrap();
    }
}

/// Two namespaces joined by a veth: `client` (c0) and `server` (s0), with
/// IPv4 10.<net>.0.1/.2 and IPv6 fd00:<net>::1/::2.
pub struct Pair {
    pub client: Ns,
    pub server: Ns,
    pub net: u8,
}

impl Pair {
    pub fn new(test: &str, net: u8) -> Self {
        let client = Ns::new(&ns_name(&format!("{test}-c"))).unwrap();
        let server = Ns::new(&ns_name(&format!("{test}-s"))).unwrap();
        veth(
            &client,
            "c0",
            "02:00:00:00:00:01",
            &server,
            "s0",
            "02:00:00:00:00:02",
        )
        .unwrap();
        pair_addresses(&client, &server, net);
        Pair {
            client,
            server,
            net,
        }
    }

    pub fn client_v4(&self, port: u16) -> SocketAddr {
        format!("10.{}.0.1:{port}", self.net).parse().unwrap()
    }

    pub fn server_v4(&self, port: u16) -> SocketAddr {
        format!("10.{}.0.2:{port}", self.net).parse().unwrap()
    }

    pub fn client_v6(&self, port: u16) -> SocketAddr {
        format!("[fd00:{}::1]:{port}", self.net).parse().unwrap()
    }

    pub fn server_v6(&self, port: u16) -> SocketAddr {
        format!("[fd00:{}::2]:{port}", self.net).parse().unwrap()
    }
}

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
    let fd = send_syn(ns, src, dst);
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 3000) };
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no handshake in 3 s",
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

/// Runs one of kdrop's fix commands exactly as printed.
pub fn run_fix(cmd: &str) {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .expect("running sh");
    assert!(
        out.status.success(),
        "fix `{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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

/// BPF objects a process holds, from /proc/<pid>/fdinfo: ("prog", id),
/// ("link", id), ("map", id).
pub fn bpf_objects_of(pid: u32) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    let dir = format!("/proc/{pid}/fdinfo");
    for entry in std::fs::read_dir(&dir).expect("reading fdinfo").flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        // A link's fdinfo also names its program: take the link id only.
        let obj = if let Some(id) = field("link_id:") {
            ("link", id)
        } else if let Some(id) = field("prog_id:") {
            ("prog", id)
        } else if let Some(id) = field("map_id:") {
            ("map", id)
        } else {
            continue;
        };
        out.push(obj);
    }
    out
}

/// Does a program, link or map with this id still exist (bpftool asks the
/// kernel by id)?
pub fn bpf_object_exists(what: &str, id: u64) -> bool {
    Command::new("bpftool")
        .args([what, "show", "id", &id.to_string()])
        .output()
        .expect("running bpftool")
        .status
        .success()
}

/// A listener inside `ns`.
pub fn listen(ns: &Ns, addr: SocketAddr) -> std::net::TcpListener {
    in_netns(&ns.path(), move || std::net::TcpListener::bind(addr))
        .expect("entering the namespace")
        .unwrap_or_else(|e| panic!("listening on {addr}: {e}"))
}

/// A JSON array of strings (a finding's evidence or fix).
pub fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The inode of a namespace, as JSON events carry it.
pub fn inode(ns: &Ns) -> u64 {
    u64::from(ns.inode().unwrap())
}

/// Waits (bounded) until none of `objects` exists any more. The kernel frees
/// a program, link or map when its last reference goes, which can trail the
/// owner's exit a little: polling, as there is no event to wait on.
pub fn assert_released(objects: &[(&'static str, u64)]) {
    for (what, id) in objects {
        let gone = (0..200).any(|_| {
            let exists = bpf_object_exists(what, *id);
            if exists {
                std::thread::sleep(Duration::from_millis(10));
            }
            !exists
        });
        assert!(gone, "{what} {id} still exists after kdrop exited");
    }
}

/// Open file descriptors of a process.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Open descriptors of a process that are not files on a filesystem: BPF
/// objects, epoll, pipes, sockets. Files come and go (kdrop reads
/// /proc/kallsyms on a thread while it starts); these are its setup.
pub fn kernel_object_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|target| !target.starts_with("/"))
                .count()
        })
        .unwrap_or(0)
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
