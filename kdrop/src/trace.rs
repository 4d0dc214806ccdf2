//! `kdrop [filters]`: live tracing until a signal, --duration or --count;
//! text or JSON lines on stdout, the summary on stderr.
use std::{
    io::{self, BufWriter, StdoutLock, Write as _},
    process::ExitCode,
};

use anyhow::Result;
use kdrop_common::MonitorConfig;

use crate::{
    cli::TraceArgs,
    filter,
    model::record::DropRecord,
    output::{summary::Summary, text::Repeats},
    probes,
    session::{Control, Options, Session, Sink},
};

/// Records to stdout until `--count`; a closed stdout ends the trace
/// quietly.
struct Out<'a> {
    out: BufWriter<StdoutLock<'a>>,
    json: bool,
    repeats: Repeats,
    summary: Summary,
    limit: u64,
}

impl Sink for Out<'_> {
    fn record(&mut self, r: DropRecord) -> Control {
        self.summary.add(&r);
        let closed = self.repeats.write(&mut self.out, &r, self.json).is_err();
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

pub async fn run(args: &TraceArgs) -> Result<ExitCode> {
    for w in probes::check_privileges()? {
        log::warn!("{w}");
    }
    let filter = filter::resolve(&args.filter)?;
    let mut session = Session::start(&Options {
        filter,
        monitor: MonitorConfig::zeroed(),
        ring_kib: args.ring_size,
        conntrack_events: !args.no_conntrack_events,
    })?;
    eprintln!("kdrop: tracing {}", session.describe());
    for line in session.missing() {
        eprintln!("kdrop: without {line}");
    }
    let stdout = io::stdout();
    let mut out = Out {
        out: BufWriter::new(stdout.lock()),
        json: args.json,
        repeats: Repeats::default(),
        summary: Summary::default(),
        limit: args.count.unwrap_or(u64::MAX),
    };
    session.run(&mut out, args.duration, None).await?;
    let _ = out.out.flush();
    let stats = session.stats()?;
    out.summary.undecodable = stats.undecodable;
    // Not eprint!: `kdrop 2>&1 | head` closes stderr too.
    let _ = io::stderr().write_all(out.summary.render(&stats).as_bytes());
    Ok(ExitCode::SUCCESS)
}
