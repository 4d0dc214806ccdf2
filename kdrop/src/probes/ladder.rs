//! The probe points and their ladders: for each point, the rungs best
//! first (fexit, kretprobe, tp_btf, raw_tp, tracepoint) and what each
//! needs from the kernel; and whether the point stays attached or is armed
//! only on demand.
use std::fmt;

use anyhow::Result;
use kdrop_common::KfreeSkbArgs;

use super::{
    nf::{self, NfSetup},
    setup::KernelSetup,
};
use crate::UserError;

/// `KDROP_RUNG=tp_btf|raw_tp|tracepoint` restricts the drop path to one rung
/// (to test each rung on a kernel that offers several).
pub fn forced_rung() -> Result<Option<Rung>> {
    let Some(v) = std::env::var_os("KDROP_RUNG") else {
        return Ok(None);
    };
    let v = v.to_string_lossy();
    [Rung::TpBtf, Rung::RawTp, Rung::Tracepoint]
        .into_iter()
        .find(|r| r.to_string() == v)
        .map(Some)
        .ok_or_else(|| {
            UserError(format!(
                "KDROP_RUNG={v}: not a rung (tp_btf, raw_tp, tracepoint)"
            ))
            .into()
        })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    TpBtf,
    RawTp,
    Tracepoint,
    FExit,
    KRetProbe,
}

impl fmt::Display for Rung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rung::TpBtf => "tp_btf",
            Rung::RawTp => "raw_tp",
            Rung::Tracepoint => "tracepoint",
            Rung::FExit => "fexit",
            Rung::KRetProbe => "kretprobe",
        })
    }
}

/// What happened on one rung.
#[derive(Clone, Debug)]
pub enum Outcome {
    Attached,
    /// Loaded, to be attached when its demand arms it (see
    /// attach::attach_ladder).
    Deferred,
    Refused(String),
    NotTried,
}

/// One probe point and its ladder, best rung first.
#[derive(Clone, Debug)]
pub struct ProbeReport {
    pub point: &'static str,
    pub what: &'static str,
    /// `None`: attached for the whole trace; else armed on this demand.
    pub demand: Option<Demand>,
    pub rungs: Vec<(Rung, Outcome)>,
}

impl ProbeReport {
    pub fn chosen(&self) -> Option<Rung> {
        self.rungs
            .iter()
            .find(|(_, o)| matches!(o, Outcome::Attached | Outcome::Deferred))
            .map(|(r, _)| *r)
    }
}

/// How a rung attaches its program.
#[derive(Clone, Copy, Debug)]
pub enum Attach {
    TpBtf {
        prog: &'static str,
        tp: &'static str,
    },
    RawTp {
        prog: &'static str,
        tp: &'static str,
    },
    Tracepoint {
        prog: &'static str,
        category: &'static str,
        name: &'static str,
    },
    FExit {
        prog: &'static str,
        func: &'static str,
    },
    /// `entry`: a kprobe saving the arguments for the kretprobe.
    KRetProbe {
        prog: &'static str,
        func: &'static str,
        entry: Option<&'static str>,
    },
}

impl Attach {
    /// The program the rung attaches (a kretprobe's, not its entry's).
    pub fn prog(&self) -> &'static str {
        match *self {
            Attach::TpBtf { prog, .. }
            | Attach::RawTp { prog, .. }
            | Attach::Tracepoint { prog, .. }
            | Attach::FExit { prog, .. }
            | Attach::KRetProbe { prog, .. } => prog,
        }
    }

    pub fn rung(&self) -> Rung {
        match self {
            Attach::TpBtf { .. } => Rung::TpBtf,
            Attach::RawTp { .. } => Rung::RawTp,
            Attach::Tracepoint { .. } => Rung::Tracepoint,
            Attach::FExit { .. } => Rung::FExit,
            Attach::KRetProbe { .. } => Rung::KRetProbe,
        }
    }
}

/// Why an on-demand point is armed: it serves one kind of evidence, and is
/// attached only while a matching anomaly asks for that kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Demand {
    /// Route lookups and source validation: for reverse-path, martian and
    /// no-route drops (armed by such a drop; the retransmission carries the
    /// kernel's own lookups).
    Routes,
    /// Handshake packets leaving devices: for handshakes that die without a
    /// drop where kdrop runs (armed by a retransmission, a refused SYN-ACK,
    /// a DNAT'd connection kdrop follows).
    Handshakes,
    /// Netfilter's own verdicts: for NETFILTER_DROP (armed by one).
    Verdicts,
}

impl fmt::Display for Demand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Demand::Routes => "routes",
            Demand::Handshakes => "handshakes",
            Demand::Verdicts => "verdicts",
        })
    }
}

/// A probe point: its rungs best first, each with what it needs from the
/// kernel (`Err` says why that rung cannot even be tried).
pub struct Point<'a> {
    pub name: &'static str,
    pub what: &'static str,
    /// kdrop cannot work without it; other points degrade.
    pub required: bool,
    /// Evidence for live tracing only: `kdrop monitor` does not attach it.
    pub trace_only: bool,
    /// `None`: always attached (it fires only on an anomaly). Otherwise
    /// every healthy packet would pay for it: armed on this demand only.
    pub demand: Option<Demand>,
    pub rungs: Vec<(Attach, Result<(), &'a str>)>,
}

pub const DROP_PATH: &str = "skb:kfree_skb";

fn ok_or_why<T>(r: &Result<T, String>) -> Result<(), &str> {
    r.as_ref().map(|_| ()).map_err(String::as_str)
}

/// `prog_btf` through tp_btf, then `prog_raw` as a raw tracepoint.
fn tracepoint_rungs<'a>(
    tp: &'static str,
    prog_btf: &'static str,
    prog_raw: &'static str,
    ready: Result<(), &'a str>,
) -> Vec<(Attach, Result<(), &'a str>)> {
    vec![
        (Attach::TpBtf { prog: prog_btf, tp }, ready),
        (Attach::RawTp { prog: prog_raw, tp }, ready),
    ]
}

pub fn points<'a>(
    setup: &'a KernelSetup,
    fields: &'a Result<KfreeSkbArgs, String>,
) -> Vec<Point<'a>> {
    let args = ok_or_why(&setup.kfree_skb_args);
    let fib = ok_or_why(&setup.fib_lookup_args);
    let fvs = ok_or_why(&setup.fib_validate_source);
    let egress = ok_or_why(&setup.net_dev_queue);
    let mut drop_rungs = tracepoint_rungs("kfree_skb", "kfree_skb_btf", "kfree_skb_raw", args);
    drop_rungs.push((
        Attach::Tracepoint {
            prog: "kfree_skb_tp",
            category: "skb",
            name: "kfree_skb",
        },
        ok_or_why(fields),
    ));
    let mut fib_rungs = tracepoint_rungs(
        "fib_table_lookup",
        "fib_table_lookup_btf",
        "fib_table_lookup_raw",
        fib,
    );
    // The classic record carries computed fields, not the pointers the
    // program reads.
    fib_rungs.push((
        Attach::Tracepoint {
            prog: "",
            category: "fib",
            name: "fib_table_lookup",
        },
        Err("not implemented: its record has no flowi4/nexthop pointers"),
    ));
    vec![
        Point {
            name: DROP_PATH,
            what: "drop path",
            required: true,
            trace_only: false,
            demand: None,
            rungs: drop_rungs,
        },
        Point {
            name: "tcp:tcp_retransmit_skb",
            what: "SYNs local sockets retransmit",
            required: false,
            trace_only: false,
            demand: None,
            rungs: tracepoint_rungs(
                "tcp_retransmit_skb",
                "tcp_retransmit_skb_btf",
                "tcp_retransmit_skb_raw",
                ok_or_why(&setup.sockets.retrans_skb),
            ),
        },
        Point {
            name: "tcp:tcp_retransmit_synack",
            what: "SYN-ACKs local listeners retransmit",
            required: false,
            trace_only: false,
            demand: None,
            rungs: tracepoint_rungs(
                "tcp_retransmit_synack",
                "tcp_retransmit_synack_btf",
                "tcp_retransmit_synack_raw",
                ok_or_why(&setup.sockets.retrans_synack),
            ),
        },
        Point {
            name: "sock:inet_sock_set_state",
            what: "connects given up in SYN-SENT (short client timeouts)",
            required: false,
            trace_only: false,
            // Fires on every TCP state change, a few per connection, not per
            // packet; the program returns after two compares unless a
            // SYN-SENT socket closes (BENCHMARKS.md, healthy traffic).
            demand: None,
            rungs: tracepoint_rungs(
                "inet_sock_set_state",
                "inet_sock_set_state_btf",
                "inet_sock_set_state_raw",
                ok_or_why(&setup.sockets.set_state),
            ),
        },
        Point {
            name: "fib:fib_table_lookup",
            what: "route lookups (reverse-path evidence)",
            required: false,
            trace_only: false,
            demand: Some(Demand::Routes),
            rungs: fib_rungs,
        },
        Point {
            name: "fib_validate_source (return)",
            what: "source validation result (reason on kernels without one)",
            required: false,
            trace_only: false,
            demand: Some(Demand::Routes),
            rungs: vec![
                (
                    Attach::FExit {
                        prog: "fib_validate_source_fexit",
                        func: "fib_validate_source",
                    },
                    fvs,
                ),
                (
                    Attach::KRetProbe {
                        prog: "fib_validate_source_kretprobe",
                        func: "fib_validate_source",
                        entry: Some("fib_validate_source_kprobe"),
                    },
                    Ok(()),
                ),
            ],
        },
        Point {
            name: "net:net_dev_queue",
            what: "handshake packets leaving devices (unanswered SYNs, NAT)",
            required: false,
            trace_only: false,
            demand: Some(Demand::Handshakes),
            rungs: tracepoint_rungs(
                "net_dev_queue",
                "net_dev_queue_btf",
                "net_dev_queue_raw",
                egress,
            ),
        },
    ]
    .into_iter()
    .chain(nf_points(&setup.nf))
    .collect()
}

/// Netfilter verdicts: fexit, else kretprobe (with a kprobe for the
/// arguments), per function.
fn nf_points(nf: &NfSetup) -> Vec<Point<'_>> {
    nf::FUNCS
        .iter()
        .zip(&nf.funcs)
        .map(|(f, facts)| {
            let facts = facts.as_ref().map_err(String::as_str);
            let fexit = facts.and_then(|f| f.fexit.as_ref().map(|_| ()).map_err(String::as_str));
            Point {
                name: f.point,
                what: f.what,
                required: false,
                trace_only: true,
                demand: Some(Demand::Verdicts),
                rungs: vec![
                    (
                        Attach::FExit {
                            prog: f.fexit,
                            func: f.name,
                        },
                        fexit,
                    ),
                    (
                        Attach::KRetProbe {
                            prog: f.kretprobe,
                            func: f.name,
                            entry: Some(f.kprobe),
                        },
                        facts.map(|_| ()),
                    ),
                ],
            }
        })
        .collect()
}

pub fn outcome_text(o: &Outcome) -> String {
    match o {
        Outcome::Attached => "attached".into(),
        Outcome::Deferred => "loaded, attached when armed (not tried at start: each attach and \
                              detach of a kretprobe patches a function every packet crosses)"
            .into(),
        Outcome::Refused(why) => format!("refused: {why}"),
        Outcome::NotTried => "not tried (a better rung attached)".into(),
    }
}
