//! A compared tool (see variants.rs) running: started, waited on until it
//! says it is ready, and stopped with SIGINT, with its CPU time, peak RSS,
//! BPF program runs and what it reported.
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::process::CommandExt as _,
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    parse::{self, Account},
    prog_stats::{self, ProgRuns},
    variants::{Tool, Variant},
};

/// How long a tool may take to become ready (bpftrace compiles first).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A line and whether it came from stdout.
type Line = (bool, String);

fn lines(r: impl std::io::Read + Send + 'static, stdout: bool, tx: mpsc::Sender<Line>) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send((stdout, line)).is_err() {
                break;
            }
        }
    });
}

pub struct Running {
    tool: Tool,
    child: Child,
    reaped: bool,
    rx: Receiver<Line>,
    seen: Vec<Line>,
    /// From spawn to the readiness line.
    pub ready: Duration,
    /// The readiness line itself.
    pub ready_line: String,
    cpu_at_ready: f64,
    progs_at_ready: BTreeMap<u32, (u64, u64)>,
}

/// What a stopped tool reported.
#[derive(Clone, Debug, Default)]
pub struct Stopped {
    /// CPU seconds (user + system) between ready and the stop signal.
    pub cpu_flood: f64,
    pub maxrss_kib: u64,
    /// Events the tool handed to userspace (kdrop records, tcpdump captures).
    pub to_user: Option<u64>,
    /// Events it saw in the kernel (kdrop `matched`, bpftrace's count sum).
    pub seen: Option<u64>,
    /// kdrop's counters of its drop path: matched, emitted, lost, sampled
    /// out (and, for the monitor, capped folded into sampled out).
    pub kdrop: Option<[u64; 4]>,
    /// bpftrace's counts by map key (a drop reason, a probe).
    pub counts: Vec<(String, u64)>,
    /// Every account kdrop gave (the drop path, handshake packets
    /// followed, ...), each to be checked.
    pub accounts: Vec<Account>,
    /// Nanoseconds per call of its BPF programs (with --prog-stats).
    pub prog_ns: Option<f64>,
    /// Its BPF programs that ran between ready and stop (runs counted only
    /// with --prog-stats).
    pub progs: Vec<ProgRuns>,
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a live process, seconds.
pub fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: fields count from after its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ')'.
    (ticks(11) + ticks(12)) / clk_tck()
}

impl Running {
    /// Starts a tool, kept off CPU `avoid` (the flood's) when the machine
    /// has another, and waits for its readiness line; `Err` carries the
    /// tool's own last words when it gives up (that is the n/a reason).
    pub fn start(v: &Variant, avoid: usize) -> Result<Self> {
        let tool = v.tool.context("the baseline runs no tool")?;
        let (ready_on_stdout, marker, stdout_piped) = match tool {
            // The monitor prints its events on stdout: kept from the pipe
            // and from this process.
            Tool::Kdrop => (false, "kdrop: tracing", false),
            Tool::Bpftrace => (true, "ready", true),
            Tool::Tcpdump => (false, "listening on", false),
            Tool::Dropwatch => (true, "Kernel monitoring activated", true),
            Tool::Noop => (false, super::noop::READY, false),
        };
        let t0 = Instant::now();
        let mut cmd = Command::new(&v.argv[0]);
        let cpus = super::online_cpus();
        if cpus > 1 {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    for c in (0..cpus).filter(|&c| c != avoid) {
                        libc::CPU_SET(c, &mut set);
                    }
                    libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .args(&v.argv[1..])
            .stdin(Stdio::piped())
            .stdout(if stdout_piped {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", v.argv[0]))?;
        let (tx, rx) = mpsc::channel();
        if let Some(o) = child.stdout.take() {
            lines(o, true, tx.clone());
        }
        lines(child.stderr.take().expect("piped"), false, tx);
        if tool == Tool::Dropwatch {
            // dropwatch is interactive: it monitors once told to start.
            if let Some(stdin) = child.stdin.as_mut() {
                let _ = stdin.write_all(b"start\n");
            }
        }
        let mut r = Running {
            tool,
            child,
            reaped: false,
            rx,
            seen: Vec::new(),
            ready: Duration::ZERO,
            ready_line: String::new(),
            cpu_at_ready: 0.0,
            progs_at_ready: BTreeMap::new(),
        };
        let deadline = t0 + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match r.rx.recv_timeout(left) {
                Ok((out, line)) => {
                    let ready = out == ready_on_stdout && line.contains(marker);
                    if ready {
                        r.ready = t0.elapsed();
                        r.ready_line = line.clone();
                        r.cpu_at_ready = cpu_of(r.child.id());
                        r.progs_at_ready = prog_stats::snapshot(r.child.id());
                    }
                    r.seen.push((out, line));
                    if ready {
                        return Ok(r);
                    }
                }
                Err(RecvTimeoutError::Timeout) => bail!("not ready after {READY_TIMEOUT:?}"),
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = r.wait(STOP_TIMEOUT);
                    let said: Vec<&str> = r
                        .seen
                        .iter()
                        .map(|(_, l)| l.trim())
                        .filter(|l| !l.is_empty())
                        .collect();
                    let said = said[said.len().saturating_sub(3)..].join("; ");
                    bail!("{} exited before it was ready: {said}", v.argv[0]);
                }
            }
        }
    }

    fn wait(&mut self, timeout: Duration) -> Result<libc::rusage> {
        let pid = self.child.id() as i32;
        let deadline = Instant::now() + timeout;
        loop {
            let mut status = 0;
            // SAFETY: zeroed rusage is valid output space.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 on our own child.
            let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
            if rc == pid {
                self.reaped = true;
                return Ok(ru);
            }
            if rc < 0 {
                bail!("waiting for {pid}: {}", std::io::Error::last_os_error());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("{:?} did not exit within {timeout:?} of SIGINT", self.tool);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGINT, wait, and read what it reported.
    pub fn stop(mut self) -> Result<Stopped> {
        let pid = self.child.id();
        let cpu_flood = cpu_of(pid) - self.cpu_at_ready;
        let prog_ns = prog_stats::ns_per_call(pid);
        let progs = prog_stats::ran(&self.progs_at_ready, &prog_stats::snapshot(pid));
        // The monitor's accounts are on its metrics page (its exit line
        // holds the drop path's only).
        let metrics = match self.tool {
            Tool::Kdrop => parse::metrics_url(&self.ready_line).map(|u| scrape(&u)),
            _ => None,
        }
        .transpose()?;
        // SAFETY: kill(2) on our own, not yet reaped child.
        unsafe { libc::kill(pid as i32, libc::SIGINT) };
        let ru = self.wait(STOP_TIMEOUT)?;
        let after: Vec<Line> = self.rx.iter().collect();
        // Lines printed per event after the readiness line (bpftrace's
        // printf); its map and blank lines are not events.
        let printed = after
            .iter()
            .filter(|(out, l)| *out && !l.is_empty() && !l.starts_with('@'))
            .count() as u64;
        let mut all: Vec<Line> = std::mem::take(&mut self.seen);
        all.extend(after);
        let lines: Vec<String> = all.into_iter().map(|(_, l)| l).collect();
        let mut s = Stopped {
            cpu_flood,
            prog_ns,
            progs,
            maxrss_kib: ru.ru_maxrss as u64,
            ..Default::default()
        };
        match self.tool {
            Tool::Kdrop => {
                s.accounts = parse::accounts(&lines);
                if let Some(page) = &metrics {
                    s.accounts.extend(parse::metric_accounts(page));
                }
                let drops = s
                    .accounts
                    .iter()
                    .find(|a| a.label == "drops")
                    .with_context(|| format!("no kdrop summary in {lines:?}"))?;
                let c = |k: &str| drops.get(k);
                // Records handed to userspace: the drops it printed (or
                // emitted, for the monitor) and every record the other
                // probes emitted (handshake packets followed, ...).
                let others: u64 = s
                    .accounts
                    .iter()
                    .filter(|a| a.label != "drops")
                    .map(|a| a.get("emitted"))
                    .sum();
                let own = drops.values.get("events").copied().unwrap_or(c("emitted"));
                s.to_user = Some(own + others);
                s.seen = Some(c("matched"));
                s.kdrop = Some([
                    c("matched"),
                    c("emitted"),
                    c("lost"),
                    c("sampled out") + c("capped"),
                ]);
            }
            Tool::Bpftrace => {
                s.counts = parse::bpftrace_counts(&lines);
                s.seen = Some(parse::bpftrace_total(&lines));
                s.to_user = Some(printed);
            }
            Tool::Tcpdump => {
                s.to_user = parse::tcpdump_stat(&lines, "packets captured");
                s.seen = parse::tcpdump_stat(&lines, "packets received by filter");
            }
            Tool::Dropwatch => s.seen = Some(parse::dropwatch_total(&lines)),
            Tool::Noop => {}
        }
        Ok(s)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// GET of a metrics page on this host (the monitor's, on loopback).
fn scrape(url: &str) -> Result<String> {
    let addr = url
        .strip_prefix("http://")
        .and_then(|r| r.split_once('/'))
        .map(|(a, _)| a)
        .with_context(|| format!("not a metrics address: {url}"))?;
    let mut s =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(STOP_TIMEOUT))?;
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .with_context(|| format!("reading {url}"))?;
    Ok(body)
}
