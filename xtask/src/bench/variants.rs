//! What the bench compares: the no-tracer baseline, kdrop in several
//! settings and what a user would run instead (bpftrace, tcpdump,
//! dropwatch), for the SYN flood and for the healthy workloads.
use std::path::Path;

use super::{
    routed,
    topo::{Topo, NODE_IF, OTHER_PORT, PORT},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Kdrop,
    Bpftrace,
    Tcpdump,
    Dropwatch,
    /// A program that returns at once on kdrop's points (noop.rs).
    Noop,
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

/// `floor`: the no-op program's command line (noop.rs), or why there is
/// none.
pub fn flood(topo: &Topo, kdrop: &Path, floor: Result<Vec<String>, String>) -> Vec<Variant> {
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
            key: "n",
            label: s("no-op program on kdrop's points (the floor)"),
            tool: Some(Tool::Noop),
            argv: floor.unwrap_or_else(|why| vec![format!("n/a: {why}")]),
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

/// The healthy workloads' variants, the same for each. `points` is the
/// bpftrace program on kdrop's own points, or why there is none.
pub fn healthy(kdrop: &Path, router: &str, points: &Result<String, String>) -> Vec<Variant> {
    let kdrop_argv = |extra: &[&str]| {
        let mut v = vec![kdrop.display().to_string()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let port = routed::PORT.to_string();
    let other = OTHER_PORT.to_string();
    let s = |x: &str| x.to_string();
    let filter = format!("tcp port {port} and tcp[tcpflags] & (tcp-syn|tcp-rst) != 0");
    vec![
        Variant {
            key: "base",
            label: s("no tracer"),
            tool: None,
            argv: vec![],
        },
        Variant {
            key: "kd-none",
            label: format!("kdrop --port {other} (matches nothing)"),
            tool: Some(Tool::Kdrop),
            argv: kdrop_argv(&["--json", "--port", &other]),
        },
        Variant {
            key: "kd-match",
            label: format!("kdrop --port {port} (the traffic's port)"),
            tool: Some(Tool::Kdrop),
            argv: kdrop_argv(&["--json", "--port", &port]),
        },
        Variant {
            key: "mon",
            label: s("kdrop monitor"),
            tool: Some(Tool::Kdrop),
            // Port 0: the kernel picks a free one; the readiness line says
            // which.
            argv: kdrop_argv(&["monitor", "--listen", "127.0.0.1:0"]),
        },
        bpftrace(
            "bt-kfree",
            "bpftrace, kfree_skb count by reason",
            BPFTRACE_COUNT,
        ),
        match points {
            Ok(prog) => bpftrace("bt-points", "bpftrace, count on kdrop's points", prog),
            Err(why) => Variant {
                key: "bt-points",
                label: s("bpftrace, count on kdrop's points"),
                tool: Some(Tool::Bpftrace),
                argv: vec![format!("n/a: {why}")],
            },
        },
        Variant {
            key: "tcpdump",
            label: format!("tcpdump, kdrop's filter, router (port {port})"),
            tool: Some(Tool::Tcpdump),
            argv: vec![
                s("ip"),
                s("netns"),
                s("exec"),
                router.to_string(),
                s("tcpdump"),
                s("-n"),
                s("-i"),
                s("any"),
                filter,
            ],
        },
    ]
}

/// The bpftrace program a variant runs, if it runs one.
pub fn bpftrace_prog(v: &Variant) -> Option<&str> {
    if v.tool != Some(Tool::Bpftrace) {
        return None;
    }
    let sh = v.argv.last()?;
    let (_, prog) = sh.split_once("exec bpftrace -e '")?;
    prog.strip_suffix('\'')
}
