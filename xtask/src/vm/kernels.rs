//! The Debian kernels the matrix boots: fetched through apt with a private
//! sources list, extracted and depmod'ed under .cache/kernels/.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{root, run as run_cmd};

/// The architecture a guest runs: x86_64 guests share this machine's
/// filesystem (virtme-ng), arm64 guests boot a Debian arm64 userland of
/// their own (`super::arm64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    #[value(name = "arm64", alias = "aarch64")]
    Arm64,
}

impl Arch {
    /// Debian's name for it (`linux-image-<arch>`, `[arch=...]`).
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }
}

/// A Debian kernel the matrix boots.
pub struct Kernel {
    /// What `--kernel` takes.
    pub name: &'static str,
    pub arch: Arch,
    /// The Debian release whose `linux-image-<arch>` it is.
    pub suite: &'static str,
    /// What `cargo xtask test` (CI) runs on it: a file, or `file::test`.
    /// A guest under TCG runs kdrop's startup and every `ip`/`iptables`
    /// some 15 to 40 times slower than the host (a netfilter test: 4 s on
    /// the host for 16, 20 s each on 6.1), so CI runs in each VM what
    /// depends on that kernel, and the whole suite runs on the host. The
    /// rest of the files run in VMs on demand (`cargo xtask vm`).
    pub ci: &'static [&'static str],
}

/// On every kernel, each for what differs between kernels (the rest of
/// the suite runs on the host, and on every kernel with `cargo xtask vm`).
macro_rules! every_kernel {
    ($($more:literal),* $(,)?) => {
        &[
            // The kernel's reasons, tracepoint arguments and program types
            // against its own BTF (`bpftool btf dump`): the oracle the other
            // tests expect by.
            "oracle",
            // The DaemonSet's capabilities: 5.10 charges maps to
            // RLIMIT_MEMLOCK, later kernels to the memory cgroup.
            "caps",
            // The netfilter verdict points: kretprobe or fexit, module BTF
            // or none, NF_DROP or a free inside nft_do_chain, per kernel.
            "nf_verdicts",
            // Every rung of skb:kfree_skb this kernel attaches (tp_btf,
            // raw_tp, tracepoint): each a program its verifier must take.
            "drops::every_attachable_rung_reports_the_drop",
            // The plainest drop: NO_SOCKET, or no reason before 5.17.
            "drops::syn_to_closed_port_is_no_socket_v4_and_v6",
            // Incident 1: fib_validate_source's result by fexit (6.12) or
            // kretprobe (5.10, 6.1), IP_RPFILTER only since 5.18.
            "routing::incident1_names_rule_route_and_rp_filter_and_the_sysctl_fix_works",
            // Incident 3: the martian check, named by the kernel only since
            // 6.13 (IP_LOCAL_SOURCE): derived on every kernel of the matrix.
            "routing::incident3_local_source_martian_and_its_fix",
            // Incident 2: the hairpin's SYN-ACK freed by tcp_v4_rcv, its NAT
            // entry read off skb->_nfct with this kernel's nf_conn layout.
            "conntrack::incident2_hairpin_syn_ack_skips_reverse_nat_and_the_masquerade_fix_works",
            // Silent deaths seen from the node alone: tcp_retransmit_synack's
            // request socket and its rcv_isn offset (this kernel's layout),
            // a repeated SYN's free (reason or none).
            "silent::a_lost_syn_ack_seen_from_the_servers_namespace_alone_client_giving_up_after_1s",
            "silent::a_lost_syn_ack_seen_from_the_servers_namespace_alone_client_giving_up_after_3s",
            // Incident 4 by the Service port: kube-proxy's rules restored
            // whole, the node's conntrack dump filtered by CTA_FILTER (5.9+).
            "incidents_traced::incident4_node_alone_by_the_service_port_with_kube_proxy_1s",
            // ctnetlink's messages and attributes, which grew by version.
            "ctnetlink",
            $($more),*
        ]
    };
}

pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "5.10",
        arch: Arch::X86_64,
        suite: "bullseye",
        // No drop reasons: every cause is derived (the return code of
        // fib_validate_source, nf_hook_slow, tcp_v4_rcv); no module BTF.
        ci: every_kernel!(
            // The filter has no reason to go on (e3d0820 was found here).
            "drops::non_handshake_drops_need_all_flags",
            // conntrack's INVALID on the way back, without a reason.
            "conntrack::incident5_asymmetric_return_path_and_its_fix",
            // A rule's drop known only from nf_hook_slow and ipt_do_table's
            // verdict (no NETFILTER_DROP).
            "netfilter::input_drop_legacy",
            // conntrack's INVALID dropped by a rule, told without a reason.
            "netfilter::conntrack_invalid_legacy",
        ),
    },
    Kernel {
        name: "6.1",
        arch: Arch::X86_64,
        suite: "bookworm",
        // Drop reasons and module BTF, nft_do_chain still returning NF_DROP.
        ci: every_kernel!(
            // The classic tracepoint rung alone, tracefs unmounted: kdrop
            // mounts it and reads the `reason` field from this kernel's
            // format file (every_kernel's rung test covers the others).
            "drops::tracepoint_rung_mounts_tracefs_when_needed",
            // nft_do_chain's verdict by kretprobe with the module's BTF:
            // only 6.1 of the matrix has both (5.10 no module BTF, 6.12
            // frees inside nft_do_chain).
            "netfilter::nft_rule_drop",
            // The same for iptables-nft's rules.
            "netfilter::input_drop_nft",
            // That verdict without counters (nft's listing refused): the
            // table named by the kernel, why not the rule by the readings.
            "netfilter::a_tool_that_fails_is_named_in_the_finding",
            // conntrack's insert failure (__nf_conntrack_confirm): its
            // statistics, not a verdict, name it, with this kernel's
            // nf_conn layout for the clashing entry.
            "conntrack::snat_port_clash_is_conntrack_insert_failed_and_widening_the_range_fixes_it",
        ),
    },
    Kernel {
        name: "6.12",
        arch: Arch::X86_64,
        suite: "trixie",
        // fib_validate_source by fexit (every_kernel's routing tests).
        ci: every_kernel!(
            // nft_do_chain frees the packet itself (NF_STOLEN, no NF_DROP
            // verdict): the allowed skip, and the rule named by counters.
            "netfilter::nft_rule_drop",
            // The rule walker whose verdict still comes on 6.12:
            // ipt_do_table by kretprobe.
            "netfilter::input_drop_legacy",
        ),
    },
    Kernel {
        name: "6.1",
        arch: Arch::Arm64,
        suite: "bookworm",
        // The same kernel built for arm64 (`cargo xtask vm --arch arm64`):
        // the kprobe programs read arm64's pt_regs, its BTF has its own
        // layouts; fexit is refused there for another reason than on
        // x86_64 (no ftrace direct calls on arm64 6.1: ENOTSUPP).
        ci: every_kernel!(),
    },
    Kernel {
        name: "6.12",
        arch: Arch::Arm64,
        suite: "trixie",
        // On demand (`--arch arm64 --kernel 6.12`), with trixie's userland:
        // x86_64 6.12's, for the same reasons, with arm64's pt_regs and
        // trampolines (fexit attaches there since 6.4).
        ci: every_kernel!("netfilter::nft_rule_drop", "netfilter::input_drop_legacy"),
    },
];

impl Kernel {
    /// Its name in closing lines and cache directories: the version, and
    /// the architecture when it is not x86_64 (`6.1-arm64`).
    pub fn label(&self) -> String {
        match self.arch {
            Arch::X86_64 => self.name.to_string(),
            arch => format!("{}-{}", self.name, arch.debian()),
        }
    }
}

pub fn select(names: &[String], arch: Arch) -> Result<Vec<&'static Kernel>> {
    let of_arch = || KERNELS.iter().filter(move |k| k.arch == arch);
    if names.is_empty() || names.iter().any(|n| n == "all") {
        return Ok(of_arch().collect());
    }
    let mut out: Vec<&'static Kernel> = Vec::new();
    for n in names {
        let k = of_arch().find(|k| k.name == n).with_context(|| {
            let known: Vec<&str> = of_arch().map(|k| k.name).collect();
            format!(
                "unknown {} kernel {n}: choose from {} or all",
                arch.debian(),
                known.join(", ")
            )
        })?;
        if !out.iter().any(|o| o.name == k.name) {
            out.push(k);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Kernel packages

pub(super) fn cache_dir() -> PathBuf {
    root().join(".cache")
}

/// A kernel extracted and ready to boot.
pub struct Booted {
    /// `uname -r` of the kernel, e.g. `6.1.0-56-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// The kernel from the cache, or fetched, extracted and depmod'ed into it.
pub(super) fn prepare(k: &Kernel) -> Result<Booted> {
    let dir = cache_dir().join("kernels").join(k.label());
    let stamp = dir.join("ready");
    let rootfs = dir.join("root");
    if let Ok(release) = fs::read_to_string(&stamp) {
        let release = release.trim().to_string();
        let vmlinuz = rootfs.join(format!("boot/vmlinuz-{release}"));
        if vmlinuz.is_file() {
            eprintln!("xtask vm: {} cached ({release})", k.label());
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
pub(super) fn debian_mirror() -> Result<String> {
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

/// `linux-image-<arch>`'s kernel package of `k.suite`, through apt with a
/// private sources list, lists and cache: `<dir>/<package>.deb`. Another
/// architecture's package needs no change to dpkg's own architectures:
/// `[arch=...]` and `APT::Architecture` make apt read only its index.
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
        format!(
            "deb [arch={} signed-by={keyring}] {mirror} {} main\n",
            k.arch.debian(),
            k.suite
        ),
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
        format!("APT::Architecture={}", k.arch.debian()),
        format!("APT::Architectures={}", k.arch.debian()),
    ])
    .flat_map(|o| ["-o".to_string(), o])
    .collect();
    eprintln!("xtask vm: fetching {}'s kernel from {mirror}", k.suite);
    run_cmd(Command::new("apt-get").args(&opts).args(["-qq", "update"]))?;
    let meta = format!("linux-image-{}", k.arch.debian());
    let out = Command::new("apt-cache")
        .args(&opts)
        .args(["depends", &meta])
        .output()
        .context("running apt-cache")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let package = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .with_context(|| format!("{} has no {meta}: {text}", k.suite))?
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
