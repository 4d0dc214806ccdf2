//! The tracers compared: kdrop in three settings and what a user would run
//! instead (bpftrace, tcpdump, dropwatch), each started, waited on until it
//! says it is ready, and stopped with SIGINT, with its CPU time and peak RSS.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::topo::{Topo, NODE_IF, OTHER_PORT, PORT};

/// How long a tool may take to become ready (bpftrace compiles first).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Kdrop,
    Bpftrace,
    Tcpdump,
    Dropwatch,
}

#[derive(Clone, Debug)]
pub struct Variant {
    pub key: &'static str,
    pub label: String,
    /// `None` for the no-tracer baseline.
    pub tool: Option<Tool>,
    pub argv: Vec<String>,
}

/// The bpftrace one-liners: drops counted by reason in the kernel, and one
/// line per drop (where and why), the closest to what kdrop prints. BEGIN
/// runs once every probe is attached: the readiness line.
pub const BPFTRACE_COUNT: &str =
    "BEGIN { printf(\"ready\\n\") } tracepoint:skb:kfree_skb { @[args->reason] = count(); }";
pub const BPFTRACE_PRINT: &str = "BEGIN { printf(\"ready\\n\") } \
     tracepoint:skb:kfree_skb { printf(\"%s %d\\n\", ksym(args->location), args->reason); }";

fn bpftrace(key: &'static str, label: &str, prog: &str) -> Variant {
    Variant {
        key,
        label: label.to_string(),
        tool: Some(Tool::Bpftrace),
        // The tracepoint's format file lives in tracefs, which this machine
        // does not mount: mount it in a private mount namespace, not on the
        // host. unshare and sh exec, so the pid is bpftrace's.
        argv: vec![
            "unshare".into(),
            "-m".into(),
            "--propagation".into(),
            "private".into(),
            "sh".into(),
            "-c".into(),
            // Already mounted (by someone on the host) is fine too.
            format!(
                "mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; exec bpftrace -e '{prog}'"
            ),
        ],
    }
}

pub fn variants(topo: &Topo, kdrop: &Path) -> Vec<Variant> {
    let kdrop_argv = |extra: &[&str]| {
        let mut v = vec![
            kdrop.display().to_string(),
            "--json".into(),
            "--netns".into(),
            topo.node.clone(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let port = PORT.to_string();
    let other = OTHER_PORT.to_string();
    let s = |x: &str| x.to_string();
    vec![
        Variant {
            key: "a",
            label: s("no tracer"),
            tool: None,
            argv: vec![],
        },
        Variant {
            key: "b",
            label: format!("kdrop, filter matches nothing (--port {other})"),
            tool: Some(Tool::Kdrop),
            argv: kdrop_argv(&["--port", &other]),
        },
        Variant {
            key: "c",
            label: format!("kdrop, every drop (--port {port})"),
            tool: Some(Tool::Kdrop),
            argv: kdrop_argv(&["--port", &port]),
        },
        Variant {
            key: "d",
            label: s("kdrop, every drop, --sample 100"),
            tool: Some(Tool::Kdrop),
            argv: kdrop_argv(&["--port", &port, "--sample", "100"]),
        },
        bpftrace(
            "e1",
            "bpftrace, kfree_skb count by reason (in kernel)",
            BPFTRACE_COUNT,
        ),
        bpftrace("e2", "bpftrace, kfree_skb printf per drop", BPFTRACE_PRINT),
        Variant {
            key: "f",
            label: s("tcpdump, SYN filter, on the node's eth0"),
            tool: Some(Tool::Tcpdump),
            argv: vec![
                s("ip"),
                s("netns"),
                s("exec"),
                topo.node.clone(),
                s("tcpdump"),
                s("-n"),
                s("-i"),
                s(NODE_IF),
                s("tcp[tcpflags] & tcp-syn != 0"),
            ],
        },
        Variant {
            key: "g",
            label: s("dropwatch -l kas"),
            tool: Some(Tool::Dropwatch),
            argv: vec![s("dropwatch"), s("-l"), s("kas")],
        },
    ]
}

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
    cpu_at_ready: f64,
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
    /// kdrop's counters: matched, emitted, lost, sampled out.
    pub kdrop: Option<[u64; 4]>,
    /// Nanoseconds per call of its BPF programs (with --prog-stats).
    pub prog_ns: Option<f64>,
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
fn cpu_of(pid: u32) -> f64 {
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
            Tool::Kdrop => (false, "kdrop: tracing", false),
            Tool::Bpftrace => (true, "ready", true),
            Tool::Tcpdump => (false, "listening on", false),
            Tool::Dropwatch => (true, "Kernel monitoring activated", true),
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
            cpu_at_ready: 0.0,
        };
        let deadline = t0 + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match r.rx.recv_timeout(left) {
                Ok((out, line)) => {
                    let ready = out == ready_on_stdout && line.contains(marker);
                    r.seen.push((out, line));
                    if ready {
                        r.ready = t0.elapsed();
                        r.cpu_at_ready = cpu_of(r.child.id());
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
        let prog_ns = super::prog_stats::ns_per_call(pid);
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
            maxrss_kib: ru.ru_maxrss as u64,
            ..Default::default()
        };
        match self.tool {
            Tool::Kdrop => {
                let c = kdrop_summary(&lines)
                    .with_context(|| format!("no kdrop summary in {lines:?}"))?;
                s.to_user = Some(c[0]);
                s.seen = Some(c[1]);
                s.kdrop = Some([c[1], c[2], c[3], c[4]]);
            }
            Tool::Bpftrace => {
                s.seen = Some(bpftrace_total(&lines));
                s.to_user = Some(printed);
            }
            Tool::Tcpdump => {
                s.to_user = tcpdump_stat(&lines, "packets captured");
                s.seen = tcpdump_stat(&lines, "packets received by filter");
            }
            Tool::Dropwatch => s.seen = Some(dropwatch_total(&lines)),
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

/// `kdrop: N events in Xs (matched M, emitted E, lost L[, sampled out S])`
/// as [N, M, E, L, S].
pub fn kdrop_summary(lines: &[String]) -> Option<[u64; 5]> {
    let line = lines
        .iter()
        .find(|l| l.contains(" events in ") && l.contains("(matched "))?;
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter(|s| !s.is_empty() && !s.contains('.'))
        .filter_map(|s| s.parse().ok())
        .collect();
    match nums[..] {
        [n, m, e, l] => Some([n, m, e, l, 0]),
        [n, m, e, l, s] => Some([n, m, e, l, s]),
        _ => None,
    }
}

/// Sum of bpftrace's `@[reason]: count` lines.
pub fn bpftrace_total(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter(|l| l.starts_with("@["))
        .filter_map(|l| l.rsplit_once(':'))
        .filter_map(|(_, n)| n.trim().parse::<u64>().ok())
        .sum()
}

/// `614963 packets captured` -> 614963.
pub fn tcpdump_stat(lines: &[String], what: &str) -> Option<u64> {
    lines
        .iter()
        .find(|l| l.trim_end().ends_with(what))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Sum of dropwatch's `N drops at LOCATION` lines.
pub fn dropwatch_total(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter(|l| l.contains(" drops at "))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_reports() {
        assert_eq!(
            kdrop_summary(&v(&[
                "kdrop: tracing x",
                "kdrop: 7 events in 2.1s (matched 9, emitted 7, lost 2)"
            ])),
            Some([7, 9, 7, 2, 0])
        );
        assert_eq!(
            kdrop_summary(&v(&[
                "kdrop: 3 events in 10.0s (matched 300, emitted 3, lost 0, sampled out 297)"
            ])),
            Some([3, 300, 3, 0, 297])
        );
        assert_eq!(kdrop_summary(&v(&["kdrop: tracing"])), None);
        assert_eq!(
            bpftrace_total(&v(&[
                "Attaching 2 probes...",
                "",
                "@[12]: 820288",
                "@[2]: 3"
            ])),
            820291
        );
        let td = v(&[
            "614963 packets captured",
            "616064 packets received by filter",
            "0 packets dropped by kernel",
        ]);
        assert_eq!(tcpdump_stat(&td, "packets captured"), Some(614963));
        assert_eq!(
            tcpdump_stat(&td, "packets received by filter"),
            Some(616064)
        );
        assert_eq!(
            dropwatch_total(&v(&["12 drops at ip_rcv+0x1a (0xffff)", "3 drops at x"])),
            15
        );
    }
}
