//! `kdrop [filters]`: live tracing until a signal, --duration or --count;
//! text or JSON lines on stdout, the summary on stderr. `kdrop record`
//! does the same and writes a bundle; `kdrop explain` prints a bundle's
//! run again, the same way, from the bundle alone.
use std::{
    io::{self, BufWriter, StdoutLock, Write as _},
    process::ExitCode,
};

use anyhow::Result;
use kdrop_common::MonitorConfig;

use crate::{
    cli::{ExplainArgs, RecordArgs, TraceArgs},
    context::tape,
    filter,
    model::{record::DropRecord, stats::Stats},
    output::{json::JsonLines, summary::Summary, text::Repeats},
    probes,
    session::{replay::replay, Control, Options, Recording, Session, Sink},
    UserError,
};

/// Records to stdout until `--count`; a closed stdout ends the trace
/// quietly.
struct Out<'a> {
    out: BufWriter<StdoutLock<'a>>,
    json: bool,
    repeats: Repeats,
    json_lines: JsonLines,
    summary: Summary,
    limit: u64,
}

impl Sink for Out<'_> {
    fn record(&mut self, mut r: DropRecord) -> Control {
        self.summary.add(&r);
        let closed = if self.json {
            self.json_lines.write(&mut self.out, &mut r).is_err()
        } else {
            self.repeats.write(&mut self.out, &r, false).is_err()
        };
        if closed || self.summary.received >= self.limit {
            Control::Stop
        } else {
            Control::Continue
        }
    }

    fn flush(&mut self) -> Control {
        match self.out.flush() {
            Ok(()) => Control::Continue,
            Err(_) => Control::Stop,
        }
    }
}

impl<'a> Out<'a> {
    fn new(json: bool, limit: Option<u64>) -> Self {
        Out {
            out: BufWriter::new(io::stdout().lock()),
            json,
            repeats: Repeats::default(),
            json_lines: JsonLines::default(),
            summary: Summary::default(),
            limit: limit.unwrap_or(u64::MAX),
        }
    }
}

pub async fn run(args: &TraceArgs) -> Result<ExitCode> {
    trace(args, None).await
}

/// `kdrop record -o FILE`: tracing, and the bundle.
pub async fn record(args: &RecordArgs) -> Result<ExitCode> {
    let recording = Recording {
        path: args.output.clone(),
        max_bytes: args.max_size << 20,
        args: std::env::args().skip(1).collect(),
        count: args.trace.count,
    };
    trace(&args.trace, Some(recording)).await
}

/// `kdrop explain FILE`: the recorded run's loss, then its records and
/// summary, as it printed them.
pub fn explain(args: &ExplainArgs) -> Result<ExitCode> {
    let tape = tape::read(&args.bundle).map_err(|e| UserError(format!("{e:#}")))?;
    let h = &tape.header;
    let mut err = io::stderr();
    let _ = writeln!(
        err,
        "kdrop: explaining a run recorded on {} (Linux {}), kdrop {}: {}",
        h.hostname, h.kernel_release, h.kdrop, h.probes
    );
    // Loss first: what the findings below cannot show.
    let footer = tape.lines.iter().rev().find_map(|l| match l {
        tape::Line::Stats(s) => Some(s.clone()),
        _ => None,
    });
    match &footer {
        Some(s) => {
            let _ = writeln!(
                err,
                "kdrop: {} matched records never reached the bundle",
                s.missing()
            );
            for line in s.loss().lines() {
                let _ = writeln!(err, "kdrop:   {line}");
            }
        }
        None => {
            let _ = writeln!(
                err,
                "kdrop: the bundle has no accounting: recording was cut short{}",
                tape.cut
                    .as_ref()
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default()
            );
        }
    }
    let mut out = Out::new(args.json, h.count);
    let replayed = replay(&tape, &mut out, args.pcap.as_deref())?;
    let _ = out.out.flush();
    if let (Some(n), Some(p)) = (replayed.pcap_written, &args.pcap) {
        let _ = writeln!(err, "kdrop: wrote {n} packets to {}", p.display());
    }
    if let Some(t) = &replayed.truncated {
        let _ = writeln!(err, "kdrop: recording stopped early: {t}");
    }
    if replayed.unanswered > 0 {
        let _ = writeln!(
            err,
            "kdrop: {} questions had no answer in the bundle",
            replayed.unanswered
        );
    }
    let stats = footer.as_ref().map(Stats::from).unwrap_or_default();
    out.summary.undecodable = stats.undecodable + replayed.undecodable;
    let _ = err.write_all(out.summary.render(&stats).as_bytes());
    Ok(ExitCode::SUCCESS)
}

async fn trace(args: &TraceArgs, record: Option<Recording>) -> Result<ExitCode> {
    for w in probes::check_privileges()? {
        log::warn!("{w}");
    }
    let filter = filter::resolve(&args.filter)?;
    let path = record.as_ref().map(|r| r.path.clone());
    let mut session = Session::start(&Options {
        filter,
        monitor: MonitorConfig::zeroed(),
        ring_kib: args.ring_size,
        conntrack_events: !args.no_conntrack_events,
        record,
        pcap: args.pcap.clone(),
    })?;
    eprintln!("kdrop: tracing {}", session.describe());
    for line in session.missing() {
        eprintln!("kdrop: without {line}");
    }
    let mut out = Out::new(args.json, args.count);
    session.run(&mut out, args.duration, None).await?;
    let _ = out.out.flush();
    let stats = session.stats()?;
    if let Some(n) = session.finish_capture(&stats)? {
        let path = args.pcap.clone().unwrap_or_default();
        eprintln!("kdrop: wrote {n} packets to {}", path.display());
    }
    if let Some(bytes) = session.finish_recording(&stats)? {
        let path = path.unwrap_or_default();
        eprintln!("kdrop: recorded {} ({bytes} bytes)", path.display());
    }
    out.summary.undecodable = stats.undecodable;
    // Not eprint!: `kdrop 2>&1 | head` closes stderr too.
    let _ = io::stderr().write_all(out.summary.render(&stats).as_bytes());
    Ok(ExitCode::SUCCESS)
}
