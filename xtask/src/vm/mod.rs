//! `cargo xtask vm`: the integration suite on the Debian kernels users run,
//! each booted in QEMU under TCG by virtme-ng with this machine's filesystem
//! shared over 9p (facts in ../shared/notes/kernel.md: KVM hangs here, and
//! without --verbose the guest's output is lost, so the guest also writes
//! its log and exit status into a shared writable directory).
//!
//! Kernel packages come through apt with a private sources list, lists and
//! cache under .cache/kernels/ (git-ignored): the machine's own apt
//! configuration is only read, for the mirror it already uses. Once a kernel
//! is extracted there, later runs touch no network at all.
use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{bootstrap, root, run as run_cmd};

mod guest;
mod kernels;
mod log;
pub use kernels::*;
pub use log::*;

use guest::{guest_script, quote};

/// The kernels `cargo xtask test` (CI) boots: the oldest supported, the
/// first with drop reasons and module BTF, and the last before the
/// fib_validate_source reasons (fexit works there): every kernel the README
/// claims.
pub const CI_KERNELS: &[&str] = &["5.10", "6.1", "6.12"];

/// How much the test harness stretches its timeouts in a guest: eight kdrops
/// starting at once took 7 s in the 6.1 guest (well under a second here).
const TIME_SCALE: u32 = 4;

/// Bounds a hung guest; a full run takes a few minutes.
const VM_TIMEOUT: Duration = Duration::from_secs(30 * 60);

pub struct Options {
    /// Kernel names, or `all`; empty means all.
    pub kernels: Vec<String>,
    /// Integration tests to run: a file (tests/tests/<name>.rs) or one test
    /// in it (`drops::syn_to_closed_port_is_no_socket_v4_and_v6`); empty
    /// means every file.
    pub tests: Vec<String>,
    /// Each kernel's own CI subset (`Kernel::ci`) instead of `tests`.
    pub ci: bool,
    /// A kdrop already built (CI's static one); None builds the release
    /// binary.
    pub kdrop: Option<PathBuf>,
    /// Arguments for every test executable (a name filter, `--exact`, ...).
    pub args: Vec<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    let kernels = select(&opts.kernels)?;
    let specs_of = |k: &Kernel| -> Vec<String> {
        if opts.ci {
            k.ci.iter().map(|t| t.to_string()).collect()
        } else {
            opts.tests.clone()
        }
    };
    let kdrop = match &opts.kdrop {
        Some(bin) => bin.clone(),
        None => {
            crate::build()?;
            crate::kdrop_bin()
        }
    };
    let vng = vm_tools()?;
    let files: Vec<String> = kernels
        .iter()
        .flat_map(|k| specs_of(k))
        .map(|s| split_spec(&s).0.to_string())
        .collect();
    let tests = test_executables(&files)?;
    // One VM at a time on this machine, whichever worktree asks: TCG takes
    // both cores.
    let _lock = vm_lock()?;
    let (kdrop, tests) = snapshot(&kdrop, &tests)?;
    // Every kernel's plan before the first boot: a bad name fails at once.
    let plans = kernels
        .iter()
        .map(|k| plan(&tests, &specs_of(k)))
        .collect::<Result<Vec<_>>>()?;
    let mut results = Vec::new();
    for (k, plan) in kernels.into_iter().zip(plans) {
        let booted = prepare(k)?;
        results.push(boot_and_test(k, &booted, &vng, &kdrop, &plan, &opts.args)?);
    }
    eprintln!("\nxtask vm: results");
    for r in &results {
        eprintln!("  {}", r.line());
    }
    // The plain closing lines CI reads: one per kernel.
    for r in &results {
        println!("vm {} {}: {}", r.kernel, r.release, r.tally.line());
    }
    let bad: Vec<&str> = results
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.kernel)
        .collect();
    if !bad.is_empty() {
        bail!(
            "the suite failed (or skipped what it may not) on {}",
            bad.join(", ")
        );
    }
    if results.iter().all(|r| r.tally.passed == 0) {
        bail!("no test ran: does the filter match any test?");
    }
    Ok(())
}

/// Installs the VM tools, fetches and extracts `kernels` on a thread of its
/// own (network and disk, while the host leg compiles); `run` then finds
/// them ready. Joined before `run`, which would otherwise race it on the
/// same directories; started after the bootstrap's own apt installs.
pub fn prefetch(kernels: Vec<String>) -> PrefetchHandle {
    PrefetchHandle(std::thread::spawn(move || {
        vm_tools()?;
        for k in select(&kernels)? {
            prepare(k)?;
        }
        Ok(())
    }))
}

pub struct PrefetchHandle(std::thread::JoinHandle<Result<()>>);

impl PrefetchHandle {
    pub fn join(self) -> Result<()> {
        self.0
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the fetching thread panicked")))
    }
}

/// An exclusive lock on /run/lock/kdrop-vm.lock, held until dropped (the
/// kernel releases it if xtask dies).
fn vm_lock() -> Result<fs::File> {
    use std::os::fd::AsRawFd as _;
    let path = Path::new("/run/lock/kdrop-vm.lock");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock(2) on a file we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!("xtask vm: another VM run holds {}; waiting", path.display());
        // SAFETY: as above, blocking.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(f)
}

// ---------------------------------------------------------------------------
// Tools

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// qemu, the static busybox virtme-ng builds its initramfs with (Debian's 9p
/// and virtio drivers are modules), `file` (how it reads a kernel's version),
/// depmod; then virtme-ng itself from PyPI. Returns the `vng` to run.
fn vm_tools() -> Result<PathBuf> {
    bootstrap::apt_install(&[
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("file", "file"),
        ("depmod", "kmod"),
        ("dpkg-deb", "dpkg"),
    ])?;
    // busybox (dynamic) may provide the binary without being static.
    let static_busybox = Command::new("dpkg")
        .args(["-s", "busybox-static"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !static_busybox {
        bootstrap::apt_install_packages(&["busybox-static"])?;
    }
    if let Some(vng) = vng_path() {
        return Ok(vng);
    }
    let pip = |extra: &[&str]| {
        run_cmd(
            Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "virtme-ng"])
                .args(extra),
        )
    };
    // Debian's own python refuses system-wide installs (PEP 668).
    if pip(&[]).is_err() {
        pip(&["--break-system-packages"])?;
    }
    vng_path().context("virtme-ng installed, but no vng found")
}

fn vng_path() -> Option<PathBuf> {
    if let Some(p) = on_path("vng") {
        return Some(p);
    }
    // pip's scripts directory need not be on PATH (pyenv, --user).
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()?;
    let p = Path::new(String::from_utf8_lossy(&out.stdout).trim()).join("vng");
    p.is_file().then_some(p)
}

/// Copies kdrop and the test executables to `.cache/vm/bin`: the guest
/// reads them over 9p for minutes, and a build on the host meanwhile would
/// replace them under it (a 5.10 guest's kdrop died in ld.so that way).
fn snapshot(
    kdrop: &Path,
    tests: &[(String, PathBuf)],
) -> Result<(PathBuf, Vec<(String, PathBuf)>)> {
    let dir = root().join(".cache/vm/bin");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = |from: &Path, name: &str| -> Result<PathBuf> {
        let to = dir.join(name);
        fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        Ok(to)
    };
    let kdrop = copy(kdrop, "kdrop")?;
    let tests = tests
        .iter()
        .map(|(name, exe)| Ok((name.clone(), copy(exe, &format!("test-{name}"))?)))
        .collect::<Result<_>>()?;
    Ok((kdrop, tests))
}

/// The integration test executables, built as `cargo xtask test` builds them
/// (same profile, so CI reuses what the host run compiled).
fn test_executables(only: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let out = crate::cargo()
        .args(["test", "--no-run", "--package", "integration-tests"])
        .args(["--message-format", "json-render-diagnostics"])
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .context("building the integration tests")?;
    if !out.status.success() {
        bail!("building the integration tests failed: {}", out.status);
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let target = &msg["target"];
        let is_test_file = target["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if msg["reason"] != "compiler-artifact" || !is_test_file {
            continue;
        }
        if let (Some(name), Some(exe)) = (target["name"].as_str(), msg["executable"].as_str()) {
            exes.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    exes.sort();
    for want in only {
        if !exes.iter().any(|(n, _)| n == want) {
            let known: Vec<&str> = exes.iter().map(|(n, _)| n.as_str()).collect();
            bail!(
                "no integration test file {want} (have: {})",
                known.join(", ")
            );
        }
    }
    if !only.is_empty() {
        exes.retain(|(n, _)| only.contains(n));
    }
    if exes.is_empty() {
        bail!("cargo built no integration test executable");
    }
    Ok(exes)
}

/// `drops::syn_to_closed_port` → (`drops`, Some(name)); `drops` → (`drops`, None).
fn split_spec(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once("::") {
        Some((file, name)) => (file, Some(name)),
        None => (spec, None),
    }
}

/// One test executable to run in a guest, and the tests of it to run
/// (`--exact` names; empty: all of them).
pub struct Planned {
    pub file: String,
    pub exe: PathBuf,
    pub names: Vec<String>,
}

/// Groups `specs` by file, in the executables' order. A named test must
/// exist (`--list` on the host): a renamed test would otherwise be
/// "filtered out" in the guest and the subset would shrink unseen.
fn plan(exes: &[(String, PathBuf)], specs: &[String]) -> Result<Vec<Planned>> {
    let mut out: Vec<Planned> = Vec::new();
    for (file, exe) in exes {
        let mine: Vec<Option<&str>> = specs
            .iter()
            .map(|s| split_spec(s))
            .filter(|(f, _)| f == file)
            .map(|(_, n)| n)
            .collect();
        if mine.is_empty() && !specs.is_empty() {
            continue;
        }
        let names: Vec<String> = if mine.contains(&None) {
            Vec::new()
        } else {
            mine.iter().flatten().map(|n| n.to_string()).collect()
        };
        if !names.is_empty() {
            let listed = Command::new(exe)
                .args(["--list", "--format", "terse"])
                .output()
                .with_context(|| format!("listing the tests of {}", exe.display()))?;
            let listed = String::from_utf8_lossy(&listed.stdout);
            for n in &names {
                if !listed.lines().any(|l| l == format!("{n}: test")) {
                    bail!("the VM subset names {file}::{n}, which {file}.rs does not have");
                }
            }
        }
        out.push(Planned {
            file: file.clone(),
            exe: exe.clone(),
            names,
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Booting

fn boot_and_test(
    k: &'static Kernel,
    booted: &Booted,
    vng: &Path,
    kdrop: &Path,
    tests: &[Planned],
    args: &[String],
) -> Result<VmResult> {
    let out = cache_dir().join("vm").join(k.name);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let script = out.join("guest.sh");
    fs::write(&script, guest_script(&out, kdrop, tests, args))?;
    let console_path = out.join("console.log");
    let mut console = fs::File::create(&console_path)?;

    eprintln!(
        "xtask vm: booting {} ({}) under TCG, console in {}",
        k.name,
        booted.release,
        console_path.display()
    );
    let mut cmd = Command::new(vng);
    cmd.arg("--run")
        .arg(&booted.vmlinuz)
        .args([
            "--disable-kvm",
            "--force-9p",
            "--memory",
            "2G",
            "--cpus",
            "2",
        ])
        .arg("--verbose")
        .arg("--rwdir")
        .arg(&out)
        .arg("--cwd")
        .arg(root())
        .arg("--exec")
        .arg(format!("sh {}", quote(&script.display().to_string())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group: a timeout kills vng and the qemu under it.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {vng:?}"))?;
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
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
                    println!("[{}] {line}", k.name);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if started.elapsed() > VM_TIMEOUT {
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
    let total = started.elapsed();
    if timed_out {
        eprintln!("xtask vm: {} timed out after {VM_TIMEOUT:?}", k.name);
    }

    let log = fs::read_to_string(out.join("guest.log")).unwrap_or_default();
    let guest_status = fs::read_to_string(out.join("status"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    // vng's own exit status says little here (255 after a clean power-off
    // with the console fallback): the guest's status file is the verdict.
    if guest_status.is_none() {
        eprintln!(
            "xtask vm: {} wrote no status (vng: {status}); see {}",
            k.name,
            console_path.display()
        );
    }
    let tally = crate::tally::Tally::of(&log, k.name);
    Ok(VmResult {
        kernel: k.name,
        release: booted.release.clone(),
        rung: rung_of(&log),
        reasons: reasons_of(&log),
        tally,
        status: guest_status,
        boot: boot.unwrap_or(total),
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_kernels() {
        let names = |v: &[&str]| {
            select(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map(|ks| ks.iter().map(|k| k.name).collect::<Vec<_>>())
        };
        assert_eq!(names(&[]).unwrap(), ["5.10", "6.1", "6.12"]);
        assert_eq!(names(&["all"]).unwrap(), ["5.10", "6.1", "6.12"]);
        assert_eq!(names(&["6.1", "5.10", "6.1"]).unwrap(), ["6.1", "5.10"]);
        let e = names(&["4.19"]).unwrap_err().to_string();
        assert!(e.contains("unknown kernel 4.19"), "{e}");
    }

    #[test]
    fn parses_the_guest_log() {
        let log = "\
kernel      5.10.0-32-amd64
kfree_skb   no reason argument: drops are reported without a kernel reason
probe       skb:kfree_skb (drop path): using tp_btf
              tp_btf     attached
test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 9.1s
SKIP nft_do_chain_verdict: no-module-btf (no nft_do_chain return point)
test result: FAILED. 8 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 20s
";
        assert_eq!(
            crate::tally::Tally::of(log, "5.10").line(),
            "12 passed, 2 failed, 1 skipped"
        );
        assert_eq!(rung_of(log), "skb:kfree_skb via tp_btf");
        assert_eq!(reasons_of(log), "none (kfree_skb has no reason)");
        assert_eq!(rung_of(""), "no rung (kdrop check failed?)");
    }

    #[test]
    fn kernel_messages_are_told_apart() {
        assert!(is_kernel_message(
            "[   14.565543] virtme-ng-init: script exited"
        ));
        assert!(!is_kernel_message("test result: ok. 1 passed"));
        assert!(!is_kernel_message("[6.1] x"));
        assert!(!is_kernel_message("[ ] x"));
    }
}
