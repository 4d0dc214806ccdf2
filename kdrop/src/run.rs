//! `kdrop [filters]`: live tracing until a signal, --duration or --count.
use std::{
    io::{self, Write as _},
    process::ExitCode,
    time::Duration,
};

use anyhow::Result;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    cli::{FilterArgs, TraceArgs},
    context::{
        ctevents::CtEvents,
        netns::{self, NetnsRegistry},
    },
    output::{self, DropRecord, Summary},
    probes,
    tracer::{self, Tracer},
    UserError,
};

/// Turns the command line into a kernel filter, resolving namespace and
/// interface names now so that a typo fails before anything is loaded.
pub fn resolve_filter(args: &FilterArgs) -> Result<kdrop_common::Filter> {
    let mut registry = NetnsRegistry::new();
    let ns = match &args.netns {
        Some(arg) => Some(netns::resolve_arg(arg, &mut registry).map_err(UserError)?),
        None => None,
    };
    let ifindex = match &args.iface {
        None => 0,
        Some(name) => {
            let lookup = |ns: &netns::Netns| {
                let n = name.clone();
                netns::in_netns(&ns.path, move || netns::ifindex(&n))
            };
            let found = match &ns {
                Some(ns) => lookup(ns).map_err(|e| UserError(format!("{e:#}")))?,
                None => netns::ifindex(name),
            };
            found.ok_or_else(|| {
                let place = match &args.netns {
                    Some(a) => format!("netns {a}"),
                    None => "kdrop's network namespace".into(),
                };
                UserError(format!("unknown interface {name} in {place}"))
            })?
        }
    };
    // An ifindex only means something inside one namespace.
    let netns_inode = match (&ns, ifindex) {
        (Some(ns), _) => ns.inode,
        (None, 0) => 0,
        (None, _) => netns::own()?.inode,
    };
    let mut f = tracer::build_filter(
        &args.ports,
        &args.hosts,
        netns_inode,
        ifindex,
        args.all_flags,
    )
    .map_err(UserError)?;
    f.sample_every = args.sample;
    Ok(f)
}

/// Where to listen for conntrack destroy events: the `--netns` namespace,
/// or kdrop's own and every namespace that exists now.
fn followed_namespaces(netns: u32) -> Result<Vec<netns::Netns>> {
    let mut registry = NetnsRegistry::new();
    if netns != 0 {
        return Ok(registry.lookup(netns).into_iter().collect());
    }
    let own = netns::own()?;
    let mut all = registry.all();
    all.retain(|n| n.inode != own.inode);
    all.insert(0, own);
    Ok(all)
}

pub async fn trace(args: &TraceArgs) -> Result<ExitCode> {
    for w in probes::check_privileges()? {
        log::warn!("{w}");
    }
    let filter = resolve_filter(&args.filter)?;
    // Handlers first: a signal right after the readiness line must still
    // take the orderly way out (summary, detach).
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut tracer = Tracer::start(&filter, args.ring_size)?;
    // Subscribed before the readiness line: entries created from then on
    // are reported when they die unreplied.
    let mut ct_events = CtEvents::open(
        &followed_namespaces(filter.netns)?,
        &filter.ports[..filter.n_ports as usize],
        tracer.enricher.seen_reply_bit(),
        filter.netns != 0,
    );
    let mut describe = tracer.describe();
    if !ct_events.is_empty() {
        describe.push_str(&format!(
            ", conntrack destroy events in {} namespace{}",
            ct_events.len(),
            if ct_events.len() == 1 { "" } else { "s" }
        ));
    }
    eprintln!("kdrop: tracing {describe}");
    for line in tracer.missing().iter().chain(&ct_events.notes) {
        eprintln!("kdrop: without {line}");
    }
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);

    let mut summary = Summary::default();
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let limit = args.count.unwrap_or(u64::MAX);
    let mut closed = false;

    let mut repeats = output::Repeats::default();
    // `last`: the trace ends, records held back are due now.
    let mut emit = |batch: Vec<crate::event::Event>,
                    last: bool,
                    tracer: &mut Tracer,
                    summary: &mut Summary,
                    out: &mut io::BufWriter<io::StdoutLock<'_>>|
     -> bool {
        // Stops at --count: events past it are not even explained.
        let mut write = |r: DropRecord, summary: &mut Summary| {
            summary.add(&r);
            repeats.write(out, &r, args.json).is_err() || summary.received >= limit
        };
        for e in &batch {
            if summary.received >= limit {
                return true;
            }
            if let Some(r) = tracer.enricher.on_event(e) {
                if write(r, summary) {
                    return true;
                }
            }
        }
        for r in tracer.enricher.due(last) {
            if write(r, summary) {
                return true;
            }
        }
        out.flush().is_err() || summary.received >= limit
    };
    // Held records (RSTs answering a SYN-ACK) come out on time when no
    // other event does.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            batch = tracer.next_batch() => {
                if emit(batch?, false, &mut tracer, &mut summary, &mut out) {
                    closed = true;
                    break;
                }
            }
            _ = tick.tick() => {
                // What is on the ring first: a held RST's SYN-ACK drop may be.
                let rest = tracer.drain();
                if emit(rest, false, &mut tracer, &mut summary, &mut out) {
                    closed = true;
                    break;
                }
            }
            destroyed = ct_events.next() => {
                // The SYNs that created those entries are on the ring buffer
                // already: follow them first.
                let rest = tracer.drain();
                let mut stop = emit(rest, false, &mut tracer, &mut summary, &mut out);
                for d in destroyed {
                    if stop || summary.received >= limit {
                        stop = true;
                        break;
                    }
                    let Some(r) = tracer.enricher.on_destroyed(&d) else {
                        continue;
                    };
                    summary.add(&r);
                    stop = output::write_record(&mut out, &r, args.json).is_err()
                        || out.flush().is_err();
                }
                if stop || summary.received >= limit {
                    closed = true;
                    break;
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut sleep => break,
        }
    }
    // Events already on the ring buffer when we were asked to stop still count.
    if !closed {
        let rest = tracer.drain();
        emit(rest, true, &mut tracer, &mut summary, &mut out);
    }
    let _ = out.flush();
    summary.undecodable = tracer.undecodable;
    let counters = tracer.counters()?;
    eprint!(
        "{}",
        summary.render(&counters, tracer.started.elapsed().as_secs_f64())
    );
    let eg = tracer.egress_counters()?;
    if eg.matched > 0 {
        eprintln!(
            "kdrop: handshake packets followed: matched {}, emitted {}, lost {}",
            eg.matched, eg.emitted, eg.lost
        );
    }
    let nf = tracer.probes().verdict_counters()?;
    if nf.matched > 0 {
        eprintln!(
            "kdrop: netfilter drop verdicts followed: matched {}, emitted {}, lost {}",
            nf.matched, nf.emitted, nf.lost
        );
    }
    if ct_events.received > 0 || ct_events.overruns > 0 {
        eprintln!(
            "kdrop: conntrack entries that died unreplied: received {}, socket overruns {}",
            ct_events.received, ct_events.overruns
        );
    }
    Ok(ExitCode::SUCCESS)
}
