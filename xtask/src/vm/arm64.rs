//! `cargo xtask vm --arch arm64`: Debian's arm64 kernel booted by
//! qemu-system-aarch64 (`-M virt`, TCG) on this x86_64 machine. An x86_64
//! guest shares this machine's filesystem; an arm64 guest cannot run its
//! binaries, so it gets a userland of its own: Debian's arm64 packages
//! (iproute2, iptables, nftables, conntrack, kmod, bpftool...) extracted by
//! mmdebstrap without running their maintainer scripts, and the kernel's
//! network, netfilter, virtio and 9p modules, all in one initramfs that is
//! the guest's root filesystem (`rdinit=/init`). This worktree (the tests
//! read files next to their sources) and the directories holding kdrop, the
//! tests and the guest's log come over 9p, as for x86_64. kdrop and the
//! integration tests are cross-built static (aarch64-unknown-linux-musl).
//!
//! Everything fetched (kernel, packages) comes from Debian's mirror through
//! apt and is cached under .cache/ by what it was made of: a second run
//! touches no network.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use super::{
    cache_dir, console, debian_mirror, guest_script, on_path, plan, prepare, snapshot,
    test_executables, vm_lock, Booted, Kernel, Options, VmResult,
};
use crate::{bootstrap, cross, root, run as run_cmd};

/// The guest's userland: what the guest script and the tests run (`sh`,
/// `ip`, `tc`, `iptables` legacy and nft, `nft`, `conntrack`, `modprobe`,
/// `sysctl`, `mount`, `setpriv`/`unshare`/`nsenter`, `setcap`, `bpftool`),
/// with their libraries as apt resolves them.
const PACKAGES: &[&str] = &[
    "dash",
    "coreutils",
    "grep",
    "sed",
    "mount",
    "util-linux",
    "procps",
    "kmod",
    "iproute2",
    "iptables",
    "nftables",
    "conntrack",
    "libcap2-bin",
    "bpftool",
    // causes.rs's cgroup test opens its connection from `python3 -c`.
    "python3-minimal",
];

/// Module directories the initramfs keeps of the package's ~290 MiB:
/// networking and netfilter, virtio and 9p (Debian's arm64 6.1 builds
/// virtio_pci, 9pnet_virtio and 9p as modules), and what they depend on.
/// drivers/net only at its top (veth, dummy, macvlan...), not its hardware
/// drivers.
const MODULE_DIRS: &[&str] = &[
    "kernel/net",
    "kernel/drivers/net",
    "kernel/drivers/virtio",
    "kernel/fs/9p",
    "kernel/fs/netfs",
    "kernel/fs/fscache",
    "kernel/lib",
    "kernel/crypto",
    "kernel/arch",
];

/// The guest's /init. Mounts what virtme-ng's init mounts for x86_64 guests
/// (tracefs too: the tests expect every kfree_skb rung to attach in a VM),
/// the 9p shares named on the kernel command line (`kdrop.share=<tag>:
/// <dir>:<ro|rw>`, in order), runs `kdrop.run` in `kdrop.cwd`, then powers
/// off (sysrq o: PSCI SYSTEM_OFF ends qemu).
const INIT: &str = r#"#!/bin/sh
# /init of kdrop's arm64 guest, written by `cargo xtask vm --arch arm64`.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing
mkdir -p /run/netns
ip link set lo up
modprobe -a virtio_pci 9pnet_virtio 9p || echo "init: no 9p modules"
for arg in $(cat /proc/cmdline); do
  case $arg in
    kdrop.share=*)
      spec=${arg#kdrop.share=}; tag=${spec%%:*}; rest=${spec#*:}
      dir=${rest%:*}; mode=${rest##*:}
      mkdir -p "$dir"
      mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,$mode" "$tag" "$dir" \
        || echo "init: mounting $tag at $dir failed" ;;
    kdrop.cwd=*) cwd=${arg#kdrop.cwd=} ;;
    kdrop.run=*) script=${arg#kdrop.run=} ;;
  esac
done
cd "${cwd:-/}"
sh "$script"
sync
echo o > /proc/sysrq-trigger
sleep 60
"#;

pub(super) fn target() -> &'static cross::Target {
    cross::target("aarch64-unknown-linux-musl").expect("cross::TARGETS has aarch64")
}

/// qemu-system-aarch64 (Debian's qemu-system-arm), mmdebstrap, cpio, depmod,
/// and qemu-user-static's qemu-aarch64-static to list the cross-built
/// tests' names on this machine.
pub(super) fn tools() -> Result<PathBuf> {
    bootstrap::apt_install(&[
        ("qemu-system-aarch64", "qemu-system-arm"),
        ("mmdebstrap", "mmdebstrap"),
        ("cpio", "cpio"),
        ("qemu-aarch64-static", "qemu-user-static"),
        ("depmod", "kmod"),
        ("dpkg-deb", "dpkg"),
    ])?;
    on_path("qemu-aarch64-static").context("qemu-user-static installed, but no qemu-aarch64-static")
}

/// Test files that drive what the arm64 userland does not have (containerd
/// and its CRI, buildah, kubectl's venv, promtool, tshark, bpftrace): they
/// run on the host and in the x86_64 guests. "Every file" on arm64 means
/// the others.
const HOST_ONLY: &[&str] = &[
    "calico",
    "image",
    "manifests",
    "monitor",
    "pods",
    "record",
    "route_query",
];

/// Every test file but HOST_ONLY's, when no test was named.
fn every_file() -> Result<Vec<String>> {
    let dir = root().join("tests/tests");
    let mut files: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".rs")
                .map(str::to_string)
        })
        .filter(|f| !HOST_ONLY.contains(&f.as_str()))
        .collect();
    files.sort();
    Ok(files)
}

pub(super) fn run(
    kernels: &[&'static Kernel],
    specs_of: &dyn Fn(&Kernel) -> Vec<String>,
    files: &[String],
    opts: &Options,
) -> Result<Vec<VmResult>> {
    let every;
    let files = if files.is_empty() {
        every = every_file()?;
        eprintln!(
            "xtask vm: arm64 runs every test file but {} (tools its userland has not)",
            HOST_ONLY.join(", ")
        );
        &every[..]
    } else {
        files
    };
    let runner = tools()?;
    let t = Instant::now();
    let kdrop = match &opts.kdrop {
        Some(bin) => bin.clone(),
        None => cross::build(target())?,
    };
    let tests = test_executables(files, Some(target()))?;
    eprintln!(
        "xtask vm: arm64 kdrop and tests built in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let _lock = vm_lock()?;
    let bin = cache_dir().join("vm/bin-arm64");
    let (kdrop, tests) = snapshot(&bin, &kdrop, &tests)?;
    let plans = kernels
        .iter()
        .map(|k| plan(&tests, &specs_of(k), Some(&runner)))
        .collect::<Result<Vec<_>>>()?;
    let mut results = Vec::new();
    for (k, plan) in kernels.iter().zip(plans) {
        let t = Instant::now();
        let booted = prepare(k)?;
        let initrd = initramfs(k, &booted)?;
        eprintln!(
            "xtask vm: {}'s kernel, userland and initramfs ready in {:.0} s",
            k.label(),
            t.elapsed().as_secs_f64()
        );
        let out = cache_dir().join("vm").join(k.label());
        let _ = fs::remove_dir_all(&out);
        fs::create_dir_all(&out)?;
        // The guest mounts each share at its real path: .cache may be a
        // symlink out of the worktree, which the guest would not follow.
        let out = fs::canonicalize(&out)?;
        let bin = fs::canonicalize(&bin)?;
        let kdrop = bin.join(kdrop.file_name().context("kdrop has no file name")?);
        let plan: Vec<_> = plan
            .into_iter()
            .map(|mut p| {
                p.exe = bin.join(p.exe.file_name().unwrap_or_default());
                p
            })
            .collect();
        let script = out.join("guest.sh");
        fs::write(&script, guest_script(&out, &kdrop, &plan, &opts.args, &[]))?;
        let shares = [
            ("src", root(), "ro"),
            ("bin", bin, "ro"),
            ("out", out.clone(), "rw"),
        ];
        let mut cmd = qemu(&booted, &initrd, &shares, &script)?;
        let console_path = out.join("console.log");
        eprintln!(
            "xtask vm: booting {} ({}) under qemu-system-aarch64 (TCG), console in {}",
            k.label(),
            booted.release,
            console_path.display()
        );
        let times = console::watch(&mut cmd, &k.label(), &console_path, opts.timeout())?;
        results.push(console::result(k, &booted, &out, times));
    }
    Ok(results)
}

/// The kernels and initramfs, ahead of a run (`cargo xtask test` fetches
/// while the host leg compiles; `super::prefetch` installed the tools).
pub(super) fn prefetch(kernels: &[&'static Kernel]) -> Result<()> {
    for k in kernels {
        initramfs(k, &prepare(k)?)?;
    }
    Ok(())
}

/// `-M virt` with 2 vCPUs and 2 GiB under TCG (KVM cannot run arm64 here),
/// the PL011 serial console on stdout, and `shares` as virtio-9p-pci
/// devices the guest's /init mounts in order.
fn qemu(
    booted: &Booted,
    initrd: &Path,
    shares: &[(&str, PathBuf, &str)],
    script: &Path,
) -> Result<Command> {
    let mut append = vec![
        "console=ttyAMA0".to_string(),
        "rdinit=/init".into(),
        "panic=-1".into(),
        "loglevel=4".into(),
    ];
    let mut cmd = Command::new("qemu-system-aarch64");
    // -cpu max with QEMU's own pointer-authentication algorithm: the
    // architected QARMA5 is costly to emulate (QEMU's
    // docs/system/arm/cpu-features.rst, `pauth-impdef`) and Debian's kernel
    // signs return addresses with it (CONFIG_ARM64_PTR_AUTH_KERNEL=y).
    cmd.args(["-machine", "virt", "-cpu", "max,pauth-impdef=on"])
        .args(["-smp", "2", "-m", "2G", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&booted.vmlinuz)
        .arg("-initrd")
        .arg(initrd);
    for (i, (tag, dir, mode)) in shares.iter().enumerate() {
        let dir = dir.display().to_string();
        if dir.contains(char::is_whitespace) || dir.contains(',') {
            bail!("{dir}: the guest's kernel command line cannot carry this path");
        }
        let ro = if *mode == "ro" { ",readonly=on" } else { "" };
        cmd.arg("-fsdev")
            .arg(format!("local,id=fs{i},path={dir},security_model=none{ro}"))
            .arg("-device")
            .arg(format!("virtio-9p-pci,fsdev=fs{i},mount_tag={tag}"));
        append.push(format!("kdrop.share={tag}:{dir}:{mode}"));
    }
    append.push(format!("kdrop.cwd={}", root().display()));
    append.push(format!("kdrop.run={}", script.display()));
    cmd.arg("-append").arg(append.join(" "));
    Ok(cmd)
}

/// FNV-1a: cache keys that stay the same from one build of xtask to the
/// next (std's hasher promises no such thing).
fn key(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.join("\n").bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The arm64 userland of `suite`: PACKAGES and their dependencies extracted
/// by mmdebstrap (`--variant=extract`: no maintainer script runs, so no
/// arm64 binary has to run here), then what those scripts would have set
/// up that the tests need. Cached by suite and package list.
fn rootfs(suite: &str) -> Result<(PathBuf, String)> {
    let base = cache_dir().join("vm/rootfs-arm64");
    // By what it is made of: a newer update of a package comes with a new
    // package list, or by removing the cache.
    let k = key(&[suite, &PACKAGES.join(","), "with updates"]);
    let dir = base.join(&k);
    if dir.join(".ready").is_file() {
        return Ok((dir, k));
    }
    let tmp = base.join(format!("{k}.tmp"));
    let _ = fs::remove_dir_all(&tmp);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&base)?;
    let sources = sources(suite)?;
    eprintln!("xtask vm: extracting {suite}'s arm64 packages from {sources:?}");
    run_cmd(
        Command::new("mmdebstrap")
            .args([
                "--mode=root",
                "--variant=extract",
                "--arch=arm64",
                "--quiet",
            ])
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(suite)
            .arg(&tmp)
            .args(&sources),
    )?;
    // Since trixie the packages keep everything under /usr and the
    // /bin, /sbin and /lib links come from an installation's usrmerge
    // step, which an extraction skips; bookworm's have real directories.
    for d in ["bin", "sbin", "lib"] {
        if fs::symlink_metadata(tmp.join(d)).is_err() {
            std::os::unix::fs::symlink(format!("usr/{d}"), tmp.join(d))?;
        }
    }
    // Debian's default iptables is the nft one (update-alternatives in
    // iptables' postinst, priority 20 over legacy's 10), as on this host.
    for name in [
        "iptables",
        "iptables-save",
        "iptables-restore",
        "ip6tables",
        "ip6tables-save",
        "ip6tables-restore",
    ] {
        std::os::unix::fs::symlink("xtables-nft-multi", tmp.join("usr/sbin").join(name))?;
    }
    // base-passwd's postinst writes these: root, and nobody for the caps
    // test's setpriv --reuid=65534.
    let etc = tmp.join("etc");
    fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    fs::write(etc.join("group"), "root:x:0:\nnogroup:x:65534:\n")?;
    fs::write(
        etc.join("nsswitch.conf"),
        "passwd: files\ngroup: files\nhosts: files\n",
    )?;
    fs::write(tmp.join(".ready"), "")?;
    fs::rename(&tmp, &dir)?;
    Ok((dir, k))
}

/// `suite` and its updates (`-updates`, `-security`) as this machine's apt
/// reaches them (`apt-get indextargets`): an x86_64 guest runs this
/// machine's own userland, updates included (its bpftool is bookworm's
/// security update, 6.1.192-2, not the release's 6.1.176-1). Just the
/// suite from Debian's mirror when apt has no line for it.
fn sources(suite: &str) -> Result<Vec<String>> {
    let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
    let out = Command::new("apt-get")
        .args(["indextargets", "--format", "$(SITE) $(RELEASE)"])
        .output()
        .context("running apt-get indextargets")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let updates = format!("{suite}-");
    let mut lines: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(site, rel)| {
            site.starts_with("http") && (*rel == suite || rel.starts_with(&updates))
        })
        .map(|(site, rel)| format!("deb [signed-by={keyring}] {site} {rel} main"))
        .collect();
    lines.sort();
    lines.dedup();
    if !lines.iter().any(|l| l.ends_with(&format!(" {suite} main"))) {
        let mirror = debian_mirror()?;
        lines.push(format!("deb [signed-by={keyring}] {mirror} {suite} main"));
    }
    Ok(lines)
}

/// The guest's root filesystem as one uncompressed cpio (`newc`): the
/// userland, the kernel's modules of MODULE_DIRS with their modules.dep,
/// and /init. Uncompressed: unpacking a compressed one costs the guest's
/// emulated CPU. Cached by userland, kernel release and /init.
fn initramfs(kernel: &Kernel, booted: &Booted) -> Result<PathBuf> {
    let (userland, userland_key) = rootfs(kernel.suite)?;
    let base = cache_dir().join("vm/rootfs-arm64");
    let mine = format!("initrd-{}-", kernel.label());
    let k = key(&[&userland_key, &booted.release, INIT, &MODULE_DIRS.join(",")]);
    let cpio = base.join(format!("{mine}{k}.cpio"));
    if cpio.is_file() {
        return Ok(cpio);
    }
    let stage = base.join(format!("stage-{k}"));
    let _ = fs::remove_dir_all(&stage);
    run_cmd(Command::new("cp").arg("-a").arg(&userland).arg(&stage))?;
    // The kernel package keeps them in lib/modules (6.1) or usr/lib/modules.
    let kroot = booted
        .vmlinuz
        .parent()
        .and_then(Path::parent)
        .context("vmlinuz is not in <root>/boot")?;
    let from = [kroot.join("lib/modules"), kroot.join("usr/lib/modules")]
        .into_iter()
        .map(|d| d.join(&booted.release))
        .find(|d| d.is_dir())
        .context("the kernel package has no modules")?;
    let to = stage.join("lib/modules").join(&booted.release);
    fs::create_dir_all(&to)?;
    for f in [
        "modules.builtin",
        "modules.builtin.modinfo",
        "modules.order",
    ] {
        fs::copy(from.join(f), to.join(f))?;
    }
    for dir in MODULE_DIRS {
        // drivers/net's hardware drivers are in its subdirectories.
        let deep = *dir != "kernel/drivers/net";
        copy_modules(&from.join(dir), &to.join(dir), deep)?;
    }
    run_cmd(
        Command::new("depmod")
            .arg("-b")
            .arg(&stage)
            .arg(&booted.release),
    )?;
    let init = stage.join("init");
    fs::write(&init, INIT)?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    for d in ["proc", "sys", "dev", "run", "tmp"] {
        fs::create_dir_all(stage.join(d))?;
    }
    // This kernel's older initramfs files (200 MiB each) go.
    for e in fs::read_dir(&base)?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with(&mine) {
            let _ = fs::remove_file(e.path());
        }
    }
    let tmp = base.join(format!("{mine}{k}.cpio.tmp"));
    run_cmd(
        Command::new("sh")
            .args([
                "-c",
                "find . | LC_ALL=C sort | cpio -o -H newc --quiet > \"$0\"",
            ])
            .arg(&tmp)
            .current_dir(&stage),
    )?;
    fs::rename(&tmp, &cpio)?;
    fs::remove_dir_all(&stage)?;
    Ok(cpio)
}

/// The `.ko` files under `from` (into its subdirectories if `deep`).
fn copy_modules(from: &Path, to: &Path, deep: bool) -> Result<()> {
    let Ok(entries) = fs::read_dir(from) else {
        return Ok(());
    };
    fs::create_dir_all(to)?;
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            if deep {
                copy_modules(&path, &to.join(e.file_name()), true)?;
            }
        } else if path.extension().is_some_and(|x| x == "ko" || x == "xz") {
            fs::copy(&path, to.join(e.file_name()))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_mounted_in_order_read_only_but_the_last() {
        let booted = Booted {
            release: "6.1.0-50-arm64".into(),
            vmlinuz: "/k/boot/vmlinuz-6.1.0-50-arm64".into(),
        };
        let shares = [
            ("src", PathBuf::from("/w"), "ro"),
            ("out", PathBuf::from("/w/.cache/vm/6.1-arm64"), "rw"),
        ];
        let cmd = qemu(&booted, Path::new("/i.cpio"), &shares, Path::new("/g.sh")).unwrap();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().to_string())
            .collect();
        let append = &args[args.iter().position(|a| a == "-append").unwrap() + 1];
        let src = append.find("kdrop.share=src:/w:ro").unwrap();
        let out = append
            .find("kdrop.share=out:/w/.cache/vm/6.1-arm64:rw")
            .unwrap();
        assert!(src < out, "{append}");
        assert!(append.contains("rdinit=/init") && append.ends_with("kdrop.run=/g.sh"));
        assert!(args.contains(&"local,id=fs0,path=/w,security_model=none,readonly=on".into()));
        assert!(
            args.contains(&"local,id=fs1,path=/w/.cache/vm/6.1-arm64,security_model=none".into())
        );
        let bad = [("src", PathBuf::from("/a b"), "ro")];
        assert!(qemu(&booted, Path::new("/i"), &bad, Path::new("/g")).is_err());
    }

    #[test]
    fn cache_keys_are_stable() {
        assert_eq!(key(&["bookworm", "dash"]), key(&["bookworm", "dash"]));
        assert_ne!(key(&["bookworm", "dash"]), key(&["bookworm", "bash"]));
        assert_eq!(key(&[]), "cbf29ce484222325");
    }
}
