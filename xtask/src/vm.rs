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

/// A Debian kernel the matrix boots.
pub struct Kernel {
    /// What `--kernel` takes.
    pub name: &'static str,
    /// The Debian release whose `linux-image-amd64` it is.
    pub suite: &'static str,
}

pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "5.10",
        suite: "bullseye",
    },
    Kernel {
        name: "6.1",
        suite: "bookworm",
    },
    Kernel {
        name: "6.12",
        suite: "trixie",
    },
];

/// The kernels `cargo xtask test` (CI) boots: the oldest supported, and
/// the first with drop reasons and module BTF.
pub const CI_KERNELS: &[&str] = &["5.10", "6.1"];

/// What CI runs in each VM: the incidents' labs, every probe rung (the
/// netfilter verdict rungs only attach there), and the DaemonSet's capabilities (5.10 charges maps to RLIMIT_MEMLOCK). The rest
/// (monitor, accounting, torture, lifecycle) exercises userspace that does
/// not change with the kernel; it runs on the host, and in VMs on demand.
pub const CI_TESTS: &[&str] = &[
    "caps",
    "drops",
    "routing",
    "conntrack",
    "netfilter",
    "nf_verdicts",
];

/// How much the test harness stretches its timeouts in a guest: eight kdrops
/// starting at once took 7 s in the 6.1 guest (well under a second here).
const TIME_SCALE: u32 = 4;

/// Bounds a hung guest; a full run takes a few minutes.
const VM_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Modules the suite's namespaces and rules need. Debian builds them as
/// modules; the kernel would autoload most, loading them up front makes a
/// missing one show in the log instead of as a strange test failure.
const MODULES: &[&str] = &[
    "veth",
    "bridge",
    "br_netfilter",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_nat",
    "nf_tables",
    "nft_compat",
    "nft_ct",
    "nft_nat",
    "nft_chain_nat",
    "xt_tcpudp",
    "xt_conntrack",
    "xt_mark",
    "xt_MASQUERADE",
    "ip_tables",
    "iptable_filter",
    "iptable_nat",
    "iptable_raw",
    "ip6_tables",
    "ip6table_filter",
];

pub struct Options {
    /// Kernel names, or `all`; empty means all.
    pub kernels: Vec<String>,
    /// Integration test files to run (tests/tests/<name>.rs); empty means all.
    pub tests: Vec<String>,
    /// Arguments for every test executable (a name filter, `--exact`, ...).
    pub args: Vec<String>,
}

pub fn select(names: &[String]) -> Result<Vec<&'static Kernel>> {
    if names.is_empty() || names.iter().any(|n| n == "all") {
        return Ok(KERNELS.iter().collect());
    }
    let mut out: Vec<&'static Kernel> = Vec::new();
    for n in names {
        let k = KERNELS.iter().find(|k| k.name == n).with_context(|| {
            let known: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
            format!(
                "unknown kernel {n}: choose from {} or all",
                known.join(", ")
            )
        })?;
        if !out.iter().any(|o| o.name == k.name) {
            out.push(k);
        }
    }
    Ok(out)
}

pub fn run(opts: &Options) -> Result<()> {
    let kernels = select(&opts.kernels)?;
    crate::build()?;
    let vng = vm_tools()?;
    let tests = test_executables(&opts.tests)?;
    // One VM at a time on this machine, whichever worktree asks: TCG takes
    // both cores.
    let _lock = vm_lock()?;
    let (kdrop, tests) = snapshot(&tests)?;
    let mut results = Vec::new();
    for k in kernels {
        let booted = prepare(k)?;
        results.push(boot_and_test(k, &booted, &vng, &kdrop, &tests, &opts.args)?);
    }
    eprintln!("\nxtask vm: results");
    for r in &results {
        eprintln!("  {}", r.line());
    }
    let passed: u32 = results.iter().map(|r| r.passed).sum();
    let failed: u32 = results.iter().map(|r| r.failed).sum();
    let bad: Vec<&str> = results
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.kernel)
        .collect();
    // The plain closing line CI reads: totals over every kernel.
    println!("vm: {passed} passed, {failed} failed");
    if !bad.is_empty() {
        bail!("the suite failed on {}", bad.join(", "));
    }
    if passed == 0 {
        bail!("no test ran: does the filter match any test?");
    }
    Ok(())
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
fn snapshot(tests: &[(String, PathBuf)]) -> Result<(PathBuf, Vec<(String, PathBuf)>)> {
    let dir = root().join(".cache/vm/bin");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = |from: &Path, name: &str| -> Result<PathBuf> {
        let to = dir.join(name);
        fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        Ok(to)
    };
    let kdrop = copy(&crate::kdrop_bin(), "kdrop")?;
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

// ---------------------------------------------------------------------------
// Kernel packages

fn cache_dir() -> PathBuf {
    root().join(".cache")
}

/// A kernel extracted and ready to boot.
pub struct Booted {
    /// `uname -r` of the kernel, e.g. `6.1.0-56-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// The kernel from the cache, or fetched, extracted and depmod'ed into it.
fn prepare(k: &Kernel) -> Result<Booted> {
    let dir = cache_dir().join("kernels").join(k.name);
    let stamp = dir.join("ready");
    let rootfs = dir.join("root");
    if let Ok(release) = fs::read_to_string(&stamp) {
        let release = release.trim().to_string();
        let vmlinuz = rootfs.join(format!("boot/vmlinuz-{release}"));
        if vmlinuz.is_file() {
            eprintln!("xtask vm: {} cached ({release})", k.name);
            return Ok(Booted { release, vmlinuz });
        }
    }
    let deb = download(k, &dir)?;
    let tmp = dir.join("root.tmp");
    let _ = fs::remove_dir_all(&tmp);
    let _ = fs::remove_dir_all(&rootfs);
    run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
    fs::rename(&tmp, &rootfs)?;
    // Debian 12's package keeps modules in lib/modules, Debian 13's in
    // usr/lib/modules (xz-compressed); virtme-ng finds either next to the
    // kernel image and shares them with the guest. modules.dep is not in the
    // package: depmod makes it.
    let base = [rootfs.clone(), rootfs.join("usr")]
        .into_iter()
        .find(|b| b.join("lib/modules").is_dir())
        .context("the kernel package has no lib/modules")?;
    let release = fs::read_dir(base.join("lib/modules"))?
        .flatten()
        .find_map(|e| e.file_name().into_string().ok())
        .context("no kernel release under lib/modules")?;
    run_cmd(Command::new("depmod").arg("-b").arg(&base).arg(&release))?;
    let vmlinuz = rootfs.join(format!("boot/vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        bail!("{} has no {}", deb.display(), vmlinuz.display());
    }
    fs::write(&stamp, format!("{release}\n"))?;
    Ok(Booted { release, vmlinuz })
}

/// The mirror this machine's apt already uses for Debian (its own release's
/// suite), so the private sources reach the same place.
fn debian_mirror() -> Result<String> {
    let os = fs::read_to_string("/etc/os-release").unwrap_or_default();
    let codename = os
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_default();
    let out = Command::new("apt-get")
        .args(["indextargets", "--format", "$(SITE) $(RELEASE)"])
        .output()
        .context("running apt-get indextargets")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let sites: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(site, _)| site.starts_with("http"))
        .collect();
    sites
        .iter()
        .find(|(_, rel)| *rel == codename)
        .or_else(|| sites.iter().find(|(_, rel)| !rel.contains('-')))
        .map(|(site, _)| site.trim_end_matches('/').to_string())
        .context("apt has no Debian mirror configured (apt-get indextargets lists none)")
}

/// `linux-image-amd64`'s kernel package of `k.suite`, through apt with a
/// private sources list, lists and cache: `<dir>/<package>.deb`.
fn download(k: &Kernel, dir: &Path) -> Result<PathBuf> {
    if let Some(deb) = cached_deb(dir) {
        return Ok(deb);
    }
    let apt = dir.join("apt");
    for sub in ["lists/partial", "cache/archives/partial", "sources.list.d"] {
        fs::create_dir_all(apt.join(sub))?;
    }
    let mirror = debian_mirror()?;
    let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
    fs::write(
        apt.join("sources.list"),
        format!("deb [signed-by={keyring}] {mirror} {} main\n", k.suite),
    )?;
    let opts: Vec<String> = [
        ("Dir::Etc::SourceList", apt.join("sources.list")),
        ("Dir::Etc::SourceParts", apt.join("sources.list.d")),
        ("Dir::State::Lists", apt.join("lists")),
        ("Dir::Cache", apt.join("cache")),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={}", v.display()))
    .chain([
        // Only the package index: no AppStream metadata, no sandbox user
        // (the directories are root's).
        "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_string(),
        "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".to_string(),
        "APT::Sandbox::User=root".to_string(),
    ])
    .flat_map(|o| ["-o".to_string(), o])
    .collect();
    eprintln!("xtask vm: fetching {}'s kernel from {mirror}", k.suite);
    run_cmd(Command::new("apt-get").args(&opts).args(["-qq", "update"]))?;
    let out = Command::new("apt-cache")
        .args(&opts)
        .args(["depends", "linux-image-amd64"])
        .output()
        .context("running apt-cache")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let package = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .with_context(|| format!("{} has no linux-image-amd64: {text}", k.suite))?
        .to_string();
    run_cmd(
        Command::new("apt-get")
            .args(&opts)
            .args(["-qq", "download", &package])
            .current_dir(dir),
    )?;
    cached_deb(dir).with_context(|| format!("apt-get download {package} left no .deb"))
}

fn cached_deb(dir: &Path) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "deb")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("linux-image-"))
        })
}

// ---------------------------------------------------------------------------
// Booting

pub struct VmResult {
    pub kernel: &'static str,
    pub release: String,
    /// `kdrop check`'s chosen rung for skb:kfree_skb, as the guest printed it.
    pub rung: String,
    pub reasons: String,
    pub passed: u32,
    pub failed: u32,
    /// None when the guest never wrote its status (crash, timeout).
    pub status: Option<i32>,
    pub boot: Duration,
    pub total: Duration,
}

impl VmResult {
    pub fn ok(&self) -> bool {
        self.status == Some(0) && self.failed == 0
    }

    pub fn line(&self) -> String {
        format!(
            "{:<5} {:<24} {}: {}; drop reasons: {}; {} passed, {} failed; boot {:.0} s, total {:.0} s",
            self.kernel,
            self.release,
            if self.ok() { "PASS" } else { "FAIL" },
            self.rung,
            self.reasons,
            self.passed,
            self.failed,
            self.boot.as_secs_f64(),
            self.total.as_secs_f64(),
        )
    }
}

/// Single quotes for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The script the guest runs: modules, `kdrop check`, each test executable;
/// everything to the console and to `<out>/guest.log`, the exit status to
/// `<out>/status`.
fn guest_script(out: &Path, kdrop: &Path, tests: &[(String, PathBuf)], args: &[String]) -> String {
    let args: Vec<String> = args.iter().map(|a| quote(a)).collect();
    let mut s = String::new();
    s.push_str("#!/bin/sh\n# Written by `cargo xtask vm`; runs inside the VM.\n");
    s.push_str("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
    s.push_str(&format!(
        "export KDROP_BIN={}\n",
        quote(&kdrop.display().to_string())
    ));
    // TCG runs kdrop's startup several times slower than the host, and the
    // tests start many at once: stretch the harness's bounds.
    s.push_str(&format!("export KDROP_TEST_TIME_SCALE={TIME_SCALE}\n"));
    s.push_str(&format!("out={}\n", quote(&out.display().to_string())));
    s.push_str("main() {\n");
    s.push_str(
        "  echo \"xtask-vm: guest up after $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r)\"\n",
    );
    s.push_str(&format!("  for m in {}; do\n", MODULES.join(" ")));
    s.push_str("    modprobe \"$m\" 2>/dev/null || missing=\"${missing:-} $m\"\n");
    s.push_str("  done\n");
    s.push_str("  [ -n \"${missing:-}\" ] && echo \"xtask-vm: modules not loaded:$missing\"\n");
    s.push_str("  echo 'xtask-vm: kdrop check'\n");
    s.push_str("  \"$KDROP_BIN\" check\n");
    s.push_str("  rc=0\n");
    for (name, exe) in tests {
        s.push_str(&format!("  echo 'xtask-vm: test file {name}'\n"));
        s.push_str("  t0=$(date +%s)\n");
        s.push_str(&format!(
            "  {} {} || rc=1\n",
            quote(&exe.display().to_string()),
            args.join(" ")
        ));
        s.push_str(&format!(
            "  echo \"xtask-vm: test file {name} took $(( $(date +%s) - t0 )) s\"\n"
        ));
    }
    s.push_str("  echo \"$rc\" > \"$out/status\"\n");
    s.push_str("}\n");
    s.push_str("main 2>&1 | tee \"$out/guest.log\"\n");
    s
}

fn boot_and_test(
    k: &'static Kernel,
    booted: &Booted,
    vng: &Path,
    kdrop: &Path,
    tests: &[(String, PathBuf)],
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
    let (passed, failed) = test_counts(&log);
    Ok(VmResult {
        kernel: k.name,
        release: booted.release.clone(),
        rung: rung_of(&log),
        reasons: reasons_of(&log),
        passed,
        failed,
        status: guest_status,
        boot: boot.unwrap_or(total),
        total,
    })
}

/// `[   14.565543] virtme-ng-init: ...`
fn is_kernel_message(line: &str) -> bool {
    // printk's `[%5lu.%06lu]`.
    let Some((stamp, _)) = line
        .trim_start()
        .strip_prefix('[')
        .and_then(|l| l.split_once(']'))
    else {
        return false;
    };
    stamp.trim().split_once('.').is_some_and(|(s, us)| {
        !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && us.len() == 6
            && us.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Sums libtest's `test result: ok. 5 passed; 0 failed; ...` lines.
pub fn test_counts(log: &str) -> (u32, u32) {
    let mut passed = 0;
    let mut failed = 0;
    for line in log.lines() {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            continue;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let n: u32 = n.parse().unwrap_or(0);
            match what {
                "passed" => passed += n,
                "failed" => failed += n,
                _ => {}
            }
        }
    }
    (passed, failed)
}

/// `probe       skb:kfree_skb (drop path): using tp_btf` → `kfree_skb via tp_btf`.
pub fn rung_of(log: &str) -> String {
    let rungs: Vec<String> = log
        .lines()
        .filter_map(|l| l.strip_prefix("probe"))
        .filter_map(|l| {
            let (point, rest) = l.trim().split_once(' ')?;
            let rung = rest.split_once(": using ")?.1;
            Some(format!("{point} via {}", rung.trim()))
        })
        .collect();
    if rungs.is_empty() {
        "no rung (kdrop check failed?)".into()
    } else {
        rungs.join(", ")
    }
}

/// Whether `kdrop check` found a reason argument in kfree_skb.
pub fn reasons_of(log: &str) -> String {
    match log.lines().find_map(|l| l.strip_prefix("kfree_skb")) {
        Some(l) if l.contains("no reason argument") => "none (kfree_skb has no reason)".into(),
        Some(l) if l.contains("reason #") => "yes".into(),
        Some(l) => l.trim().to_string(),
        None => "unknown".into(),
    }
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
test result: FAILED. 8 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 20s
";
        assert_eq!(test_counts(log), (13, 2));
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

    #[test]
    fn quotes_for_sh() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
