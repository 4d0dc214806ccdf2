//! The script a guest runs: modules, `kdrop check`, then the test files,
//! those that must run alone first, the rest in lanes.
use std::path::{Path, PathBuf};

use super::{Planned, GUEST_CONTROL_HANDSHAKES, TIME_SCALE};

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

/// Single quotes for sh.
pub(super) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Test files that must not run beside another: nf_verdicts and
/// conntrack_table shrink the global nf_conntrack_max to the count of their
/// own namespace, and a SYN of another test meanwhile could meet a full
/// table.
const ALONE: &[&str] = &["nf_verdicts", "conntrack_table"];

/// Test files that must not run beside each other, so one lane runs them
/// one after the other: each traces incident 5's Service port (80) in
/// every namespace with the same addresses (172.17.0.50 -> 10.1.58.158 and
/// their IPv6 twins), so each kdrop also sees the other file's packets. In
/// 6.1's second whole-suite run they overlapped and four tests named the
/// other file's device (`sent out c0` for `eth0`); the host runs files one
/// at a time. Likewise the files with a containerd of their own
/// (tests/src/containerd.rs): every one gives its pods the same subnet, and
/// calico, cilium and kube_router trace and monitor the same policy ports
/// (5432-5434) in every namespace: in 6.12's whole-suite run at `b0b6178`
/// calico's monitor counted cilium's tc drops of port 5432 as a fourth
/// denial series.
const SAME_LANE: &[&[&str]] = &[
    &["incidents_traced", "ipv6"],
    &["calico", "cilium", "kube_router", "pods", "image"],
];

/// Timed starts of kdrop in each guest, before the tests.
const START_RUNS: &str = "1 2 3";

/// How many test files a guest runs at once after the `ALONE` ones. The
/// tests wait on retransmissions between kdrop starts that keep the vCPUs
/// busy: two lanes overlap those waits (5.10's subset: 344 s -> 245 s).
const LANES: usize = 2;

/// The script the guest runs: modules, `kdrop check`, the `ALONE` test
/// files, then the rest from a queue in `LANES` lanes (most tests first);
/// everything to the console and to `<out>/guest.log`, the exit status to
/// `<out>/status`. `copies` are read from tmpfs meanwhile (copies.rs).
pub(super) fn guest_script(
    out: &Path,
    kdrop: &Path,
    tests: &[Planned],
    args: &[String],
    copies: &[PathBuf],
) -> String {
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
    s.push_str(&format!(
        "export KDROP_CONTROL_HANDSHAKES={GUEST_CONTROL_HANDSHAKES}\n"
    ));
    // Each test's time in the log (libtest's --report-time, unstable: the
    // guest runs no compiler, the variable only unlocks the flag), so a
    // subset that outgrows CI's budget shows which test did.
    s.push_str("export RUSTC_BOOTSTRAP=1\n");
    s.push_str(&format!("out={}\n", quote(&out.display().to_string())));
    // One test file: its time, and its name in $out/failed if it failed
    // (lanes are subshells: a variable would not come back).
    s.push_str("run_file() {\n");
    s.push_str("  name=$1; shift\n");
    s.push_str("  echo \"xtask-vm: test file $name\"\n");
    s.push_str("  t0=$(date +%s)\n");
    s.push_str("  \"$@\" || echo \"$name\" >> \"$out/failed\"\n");
    s.push_str("  echo \"xtask-vm: test file $name took $(( $(date +%s) - t0 )) s\"\n");
    s.push_str("}\n");
    // A lane takes the next job nobody claimed (mkdir is atomic).
    s.push_str("lane() {\n");
    s.push_str("  for j in \"$out\"/queue/*.sh; do\n");
    s.push_str("    mkdir \"$j.claimed\" 2>/dev/null && . \"$j\"\n");
    s.push_str("  done\n");
    s.push_str("}\n");
    s.push_str("main() {\n");
    s.push_str(
        "  echo \"xtask-vm: guest up after $(cut -d' ' -f1 /proc/uptime) s, kernel $(uname -r)\"\n",
    );
    // One modprobe for all (each process start is slow under TCG); one by
    // one only to name what is missing.
    let modules = MODULES.join(" ");
    s.push_str(&format!(
        "  modprobe -a {modules} 2>/dev/null || for m in {modules}; do\n"
    ));
    s.push_str("    modprobe \"$m\" 2>/dev/null || missing=\"${missing:-} $m\"\n");
    s.push_str("  done\n");
    s.push_str("  [ -n \"${missing:-}\" ] && echo \"xtask-vm: modules not loaded:$missing\"\n");
    if !copies.is_empty() {
        copy_and_bind(&mut s, copies);
    }
    s.push_str("  echo 'xtask-vm: kdrop check'\n");
    s.push_str("  \"$KDROP_BIN\" check\n");
    // Issue 29's start time in this guest: spawn to "kdrop: tracing", as the
    // host's figure is taken (the date calls' own cost included), three
    // times; BENCHMARKS.md keeps the lines.
    s.push_str(&format!("  for i in {}; do\n", START_RUNS));
    s.push_str("    t0=$(date +%s%N)\n");
    s.push_str("    \"$KDROP_BIN\" --port 9 --duration 1 2>&1 | while IFS= read -r l; do\n");
    s.push_str("      case \"$l\" in *'kdrop: tracing'*)\n");
    s.push_str(
        "        echo \"xtask-vm: kdrop start to tracing $(( ($(date +%s%N) - t0) / 1000000 )) ms\";;\n",
    );
    s.push_str("      esac\n");
    s.push_str("    done\n");
    s.push_str("  done\n");
    s.push_str("  rm -rf \"$out/queue\" \"$out/failed\"; mkdir \"$out/queue\"\n");
    let command = |t: &Planned| -> String {
        let mut line = vec![
            "run_file".to_string(),
            quote(&t.file),
            quote(&t.exe.display().to_string()),
            "-Zunstable-options".into(),
            "--report-time".into(),
        ];
        line.extend(args.iter().cloned());
        if !t.names.is_empty() {
            line.extend(t.names.iter().map(|n| quote(n)));
            line.push("--exact".into());
        }
        line.join(" ")
    };
    let (alone, mut queued): (Vec<&Planned>, Vec<&Planned>) =
        tests.iter().partition(|t| ALONE.contains(&t.file.as_str()));
    for t in alone {
        s.push_str(&format!("  {}\n", command(t)));
    }
    // Most named tests first, so the longest jobs start early and the lanes
    // end close together (the whole files of the CI subsets, oracle and
    // caps, are short: they count as one).
    queued.sort_by_key(|t| std::cmp::Reverse(t.names.len().max(1)));
    // A job is one file, or the files of a SAME_LANE group in a row (at
    // the place of its first).
    let group = |f: &str| SAME_LANE.iter().position(|g| g.contains(&f));
    let mut jobs: Vec<Vec<&Planned>> = Vec::new();
    for t in queued {
        let joined =
            group(&t.file).and_then(|g| jobs.iter_mut().find(|j| group(&j[0].file) == Some(g)));
        match joined {
            Some(j) => j.push(t),
            None => jobs.push(vec![t]),
        }
    }
    for (i, job) in jobs.iter().enumerate() {
        for (n, t) in job.iter().enumerate() {
            s.push_str(&format!(
                "  echo {} {} \"$out/queue/{i:02}.sh\"\n",
                quote(&command(t)),
                if n == 0 { ">" } else { ">>" }
            ));
        }
    }
    for _ in 0..LANES {
        s.push_str("  lane & lanes=\"${lanes:-} $!\"\n");
    }
    s.push_str("  wait $lanes\n");
    s.push_str("  if [ -s \"$out/failed\" ]; then echo 1; else echo 0; fi > \"$out/status\"\n");
    s.push_str("}\n");
    s.push_str("main 2>&1 | tee \"$out/guest.log\"\n");
    s
}

/// Where the guest keeps its copies (a tmpfs of its own) and the fstab
/// that binds them.
const COPIES: &str = "/run/xtask-vm-files";
/// The tmpfs's source name, by which its binds are counted.
const COPIES_FS: &str = "xtask-vm-files";

/// Copies `files` into a tmpfs and binds each copy over its original: one
/// `cp` and one `mount -a` for all (each exec is slow under TCG). A file
/// that cannot be copied or bound is read over 9p as before.
fn copy_and_bind(s: &mut String, files: &[PathBuf]) {
    let quoted: Vec<String> = files
        .iter()
        .map(|p| quote(&p.display().to_string()))
        .collect();
    s.push_str(&format!(
        "  mkdir -p {COPIES} && mount -t tmpfs -o mode=0755 {COPIES_FS} {COPIES}\n"
    ));
    s.push_str(&format!(
        "  cp --parents --preserve=mode {} {COPIES}/ 2>/dev/null\n",
        quoted.join(" ")
    ));
    s.push_str(&format!("  cat > {COPIES}.fstab <<'FSTAB'\n"));
    for f in files {
        let f = fstab_path(&f.display().to_string());
        s.push_str(&format!("{COPIES}{f} {f} none bind 0 0\n"));
    }
    s.push_str("FSTAB\n");
    s.push_str(&format!("  mount -a -T {COPIES}.fstab 2>/dev/null\n"));
    // The tmpfs itself is one of the mounts of that source.
    s.push_str(&format!(
        "  echo \"xtask-vm: $(( $(grep -c ' - tmpfs {COPIES_FS} ' /proc/self/mountinfo) - 1 )) of {} files (kdrop, the tools, their libraries) read from tmpfs copies\"\n",
        files.len()
    ));
}

/// A path as fstab(5) spells it: blanks and backslashes octal-escaped.
fn fstab_path(p: &str) -> String {
    p.chars()
        .map(|c| match c {
            ' ' | '\t' | '\n' | '\\' => format!("\\{:03o}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn guest_runs_nf_verdicts_alone_then_queues_the_longest_first() {
        let planned = |file: &str, names: &[&str]| Planned {
            file: file.to_string(),
            exe: PathBuf::from(format!("/x/test-{file}")),
            names: names.iter().map(|n| n.to_string()).collect(),
        };
        let tests = [
            planned("caps", &[]),
            planned("drops", &["a", "b", "c"]),
            planned("nf_verdicts", &[]),
            planned("routing", &["d"]),
        ];
        let s = guest_script(Path::new("/o"), Path::new("/k"), &tests, &[], &[]);
        let alone = s.find("run_file 'nf_verdicts'").unwrap();
        let queue: Vec<&str> = s
            .lines()
            .filter(|l| l.contains("/queue/"))
            .filter_map(|l| l.split("/x/test-").nth(1)?.split('\'').next())
            .collect();
        assert_eq!(queue, ["drops", "caps", "routing"]);
        assert!(alone < s.find("/queue/00.sh").unwrap());
        assert!(s.contains(
            "  run_file 'nf_verdicts' '/x/test-nf_verdicts' -Zunstable-options --report-time\n"
        ));
        assert!(s.contains(r"'\''a'\'' '\''b'\'' '\''c'\'' --exact"));
        assert_eq!(s.matches("  lane & lanes=").count(), LANES);
        assert!(s.find("  wait $lanes\n").unwrap() < s.find("$out/status").unwrap());
        assert!(!s.contains("tmpfs"), "nothing to copy, no tmpfs");
        // kdrop's start timed after `kdrop check`, before any test.
        let timed = s.find("xtask-vm: kdrop start to tracing").unwrap();
        assert!(s.find("\" check\n").unwrap() < timed && timed < alone);
        assert!(s.contains("--port 9 --duration 1 2>&1 | while"));
    }

    #[test]
    fn same_lane_files_share_one_job() {
        let planned = |file: &str| Planned {
            file: file.to_string(),
            exe: PathBuf::from(format!("/x/test-{file}")),
            names: Vec::new(),
        };
        let tests = [
            planned("drops"),
            planned("incidents_traced"),
            planned("ipv6"),
            planned("routing"),
        ];
        let s = guest_script(Path::new("/o"), Path::new("/k"), &tests, &[], &[]);
        let jobs: Vec<(&str, &str)> = s
            .lines()
            .filter(|l| l.contains("/queue/"))
            .filter_map(|l| {
                let file = l.split("/x/test-").nth(1)?.split('\'').next()?;
                let job = l.split("/queue/").nth(1)?.split('.').next()?;
                Some((job, file))
            })
            .collect();
        assert_eq!(
            jobs,
            [
                ("00", "drops"),
                ("01", "incidents_traced"),
                ("01", "ipv6"),
                ("02", "routing")
            ]
        );
        assert!(s.contains(" >> \"$out/queue/01.sh\""));
    }

    #[test]
    fn copies_are_bound_before_kdrop_check() {
        let tests = [Planned {
            file: "caps".into(),
            exe: PathBuf::from("/x/test-caps"),
            names: Vec::new(),
        }];
        let copies = [PathBuf::from("/usr/bin/ip"), PathBuf::from("/k/it's a\\b")];
        let s = guest_script(Path::new("/o"), Path::new("/k"), &tests, &[], &copies);
        let cp = s
            .find(concat!(
                "  cp --parents --preserve=mode '/usr/bin/ip' '/k/it'\\''s a\\b' ",
                "/run/xtask-vm-files/ 2>/dev/null\n"
            ))
            .unwrap();
        let fstab = s
            .find(concat!(
                "  cat > /run/xtask-vm-files.fstab <<'FSTAB'\n",
                "/run/xtask-vm-files/usr/bin/ip /usr/bin/ip none bind 0 0\n",
                "/run/xtask-vm-files/k/it's\\040a\\134b /k/it's\\040a\\134b none bind 0 0\n",
                "FSTAB\n  mount -a -T /run/xtask-vm-files.fstab 2>/dev/null\n"
            ))
            .unwrap();
        let tmpfs = s
            .find("mount -t tmpfs -o mode=0755 xtask-vm-files")
            .unwrap();
        assert!(tmpfs < cp && cp < fstab);
        assert!(fstab < s.find("\" check\n").unwrap());
        assert!(s.contains(" of 2 files (kdrop, the tools, their libraries) read from tmpfs"));
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
