//! The kdrop binary under test: started, read line by line, stopped.
use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::*;

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

/// Each line `r` gives, read on a thread of its own until it ends or the
/// receiver goes.
pub fn line_reader(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
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
        let stdout = line_reader(child.stdout.take().unwrap());
        let stderr = line_reader(child.stderr.take().unwrap());
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

    /// The first event `want` accepts, failing the test after `timeout`
    /// (scaled by KDROP_TEST_TIME_SCALE, see `bound`): as JSON, for
    /// `expect_record_within`, which the tests use.
    fn expect_event_within(
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
        panic!(
            "no event for {what} within {limit:?}; saw {seen:?}; kdrop said, stopped now: {:#?}",
            self.interrupted_stderr()
        )
    }

    /// Everything kdrop wrote on stderr since it started tracing, up to its
    /// exit summary (counters, losses) after a SIGINT: what a failing test
    /// needs to tell a lost event from a verdict never made. Bounded; the
    /// child is reaped by `Drop`.
    fn interrupted_stderr(&self) -> Vec<String> {
        if let Some(c) = &self.child {
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        }
        let deadline = Instant::now() + bound(Duration::from_secs(5));
        let mut said = self.stderr_seen.clone();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stderr.recv_timeout(left) {
                Ok(line) => said.push(line),
                Err(_) => break,
            }
        }
        said
    }

    /// The first record `want` accepts, failing the test after
    /// EVENT_TIMEOUT. Every line read must fit the schema (`Record`).
    pub fn expect_record(&self, what: &str, want: impl Fn(&Record) -> bool) -> Record {
        self.expect_record_within(what, EVENT_TIMEOUT, want)
    }

    /// The first record `want` accepts, failing the test after `timeout`
    /// (scaled, see `bound`).
    pub fn expect_record_within(
        &self,
        what: &str,
        timeout: Duration,
        want: impl Fn(&Record) -> bool,
    ) -> Record {
        let e = self.expect_event_within(what, timeout, |e| want(&Record::from_value(e)));
        Record::from_value(&e)
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
                let _ = child.wait();
                // What it said meanwhile: what it was doing.
                let stderr: Vec<String> = self.stderr.try_iter().collect();
                panic!(
                    "kdrop did not exit within {:?} of signal {signal}; its stderr since it \
                     started tracing: {stderr:#?}",
                    bound(Duration::from_secs(10))
                );
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

    /// Events the other sources lost (`kdrop: <what>: matched M, emitted
    /// E, lost L`), by source, where any was lost.
    pub fn other_losses(&self) -> Vec<(String, u64)> {
        self.stderr
            .iter()
            .filter_map(|l| {
                let (what, rest) = l.strip_prefix("kdrop: ")?.split_once(": matched ")?;
                let lost = rest.rsplit_once(", lost ")?.1.parse().ok()?;
                (lost > 0).then(|| (what.to_string(), lost))
            })
            .collect()
    }

    /// Every line of stdout as a record (each must fit the schema).
    pub fn records(&self) -> Vec<Record> {
        self.stdout.iter().map(|l| Record::parse(l)).collect()
    }
}
