//! A guest's run from the host's side: its console kept in console.log and
//! the guest's own lines shown as they come, a bound on a hung guest, then
//! the verdict read from the log and status file the guest wrote into its
//! shared directory.
use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{is_kernel_message, reasons_of, rung_of, Booted, Kernel, VmResult};

/// Runs `cmd` (vng, or qemu itself) until the guest powers off, its output
/// into `console_path`; returns when the guest printed `xtask-vm: guest up`
/// and the whole run's time.
pub(super) fn watch(
    cmd: &mut Command,
    label: &str,
    console_path: &Path,
    timeout: Duration,
) -> Result<(Option<Duration>, Duration)> {
    let mut console = fs::File::create(console_path)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group: a timeout kills vng and the qemu under it.
    std::os::unix::process::CommandExt::process_group(cmd, 0);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                // A serial console ends its lines with \r\n.
                let line = line.trim_end_matches('\r').to_string();
                if tx.send(line).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);

    let mut boot = None;
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(line) => {
                writeln!(console, "{line}")?;
                // Kernel messages stay in console.log; the guest's own
                // output (tests, kdrop check) is shown as it comes.
                if !is_kernel_message(&line) {
                    if boot.is_none() && line.contains("xtask-vm: guest up") {
                        boot = Some(started.elapsed());
                    }
                    println!("[{label}] {line}");
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if started.elapsed() > timeout {
            timed_out = true;
            // SAFETY: kill(2) on the process group we created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            break;
        }
    }
    let status = child.wait()?;
    for r in readers {
        let _ = r.join();
    }
    if timed_out {
        eprintln!("xtask vm: {label} timed out after {timeout:?}");
    }
    eprintln!(
        "xtask vm: {label}'s {} exited: {status}",
        cmd.get_program().to_string_lossy()
    );
    Ok((boot, started.elapsed()))
}

/// The guest's verdict from what it wrote into `out`: `guest.log` (its
/// own log, not the console) and `status`.
pub(super) fn result(
    k: &'static Kernel,
    booted: &Booted,
    out: &Path,
    (boot, total): (Option<Duration>, Duration),
) -> VmResult {
    let label = k.label();
    let log = fs::read_to_string(out.join("guest.log")).unwrap_or_default();
    let guest_status = fs::read_to_string(out.join("status"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    // vng's own exit status says little (255 after a clean power-off with
    // the console fallback), nor does qemu's: the guest's status file is
    // the verdict.
    if guest_status.is_none() {
        eprintln!(
            "xtask vm: {label} wrote no status; see {}",
            out.join("console.log").display()
        );
    }
    // Skips are allowed per kernel version (tests/src/allowed_skips.rs).
    let tally = crate::tally::Tally::of(&log, k.name);
    VmResult {
        kernel: label,
        release: booted.release.clone(),
        rung: rung_of(&log),
        reasons: reasons_of(&log),
        tally,
        status: guest_status,
        boot: boot.unwrap_or(total),
        total,
        log: out.join("guest.log"),
    }
}
