//! `kdrop monitor`: always on, cheap. The kernel counts every matched drop
//! by (reason, netns, interface, port) and turns only a sample of them,
//! under a per-second cap, into detailed events; kdrop serves the counts
//! to Prometheus and writes the sampled events' findings as JSON lines.
pub mod http;
pub mod metrics;
pub mod pods;

use std::{
    collections::{BTreeMap, HashMap},
    fs::OpenOptions,
    io::{self, Write},
    process::ExitCode,
};

use anyhow::Result;
use kdrop_common::{AggKey, MonitorConfig};
use tokio::{
    net::TcpListener,
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};

use self::{
    metrics::{DropLabels, EgressCounts, EventCounts, ProbeState, SeriesCap, Snapshot},
    pods::Pods,
};
use crate::{
    cli::MonitorArgs,
    context::netns::{self, IfNames, NetnsRegistry},
    output::{self, DropRecord},
    probes::{self, Outcome},
    run::resolve_filter,
    tracer::Tracer,
    UserError,
};

/// Names for the kernel's aggregation keys, fixed when first seen so that
/// every series stays a monotonic counter.
struct Labels {
    keys: HashMap<AggKey, DropLabels>,
    cap: SeriesCap,
    pods: Pods,
    registry: NetnsRegistry,
    ifnames: IfNames,
    own_netns: u32,
}

impl Labels {
    fn new(max_series: usize) -> Result<Self> {
        Ok(Self {
            keys: HashMap::new(),
            cap: SeriesCap::new(max_series),
            pods: Pods::default(),
            registry: NetnsRegistry::new(),
            ifnames: IfNames::default(),
            own_netns: netns::own()?.inode,
        })
    }

    fn of(&mut self, k: &AggKey, tracer: &Tracer) -> DropLabels {
        if let Some(l) = self.keys.get(k) {
            return l.clone();
        }
        let labels = if k.overflow != 0 {
            DropLabels::overflow()
        } else {
            let ns = self.registry.lookup(k.netns);
            DropLabels {
                reason: tracer
                    .enricher
                    .reason_name(k.reason)
                    .unwrap_or_else(|| "unknown".into()),
                netns: ns
                    .as_ref()
                    .and_then(|n| n.name.clone())
                    .unwrap_or_else(|| k.netns.to_string()),
                pod: self.pods.label(k.netns),
                ifname: self
                    .ifnames
                    .get(ns.as_ref(), self.own_netns, k.netns, k.ifindex),
                port: k.port.to_string(),
            }
        };
        let placed = self.cap.place(labels);
        self.keys.insert(*k, placed.clone());
        placed
    }
}

/// Everything a scrape shows, read from the kernel now.
fn snapshot(
    tracer: &Tracer,
    labels: &mut Labels,
    findings: &BTreeMap<String, u64>,
) -> Result<Snapshot> {
    let p = tracer.probes();
    let c = p.counters()?;
    let g = p.egress_counters()?;
    let mut drops = BTreeMap::new();
    for (k, v) in p.aggregate()? {
        // The overflow key exists from the start; show it only once used.
        if k.overflow != 0 && v == 0 {
            continue;
        }
        *drops.entry(labels.of(&k, tracer)).or_insert(0) += v;
    }
    let probes = p
        .reports
        .iter()
        .flat_map(|r| {
            r.rungs.iter().map(|(rung, o)| ProbeState {
                point: r.point.to_string(),
                rung: rung.to_string(),
                attached: matches!(o, Outcome::Attached),
            })
        })
        .collect();
    Ok(Snapshot {
        drops,
        findings: findings.clone(),
        events: EventCounts {
            matched: c.matched,
            emitted: c.emitted,
            lost: c.lost,
            sampled_out: c.sampled_out,
            capped: c.capped,
        },
        egress: EgressCounts {
            matched: g.matched,
            emitted: g.emitted,
            lost: g.lost,
            capped: g.capped,
        },
        probes,
    })
}

/// Causes kept as their own `kdrop_findings_total` series; the set is small
/// and fixed in code, this only bounds a surprise.
const MAX_CAUSES: usize = 64;

fn count_finding(findings: &mut BTreeMap<String, u64>, r: &DropRecord) {
    let Some(f) = &r.finding else { return };
    let cause = if findings.contains_key(f.cause) || findings.len() < MAX_CAUSES - 1 {
        f.cause
    } else {
        metrics::OVERFLOW
    };
    *findings.entry(cause.to_string()).or_insert(0) += 1;
}

pub async fn run(args: &MonitorArgs) -> Result<ExitCode> {
    for w in probes::check_privileges()? {
        log::warn!("{w}");
    }
    let filter = resolve_filter(&args.filter)?;
    let mut out: Box<dyn Write> = match &args.output {
        None => Box::new(io::BufWriter::new(io::stdout())),
        Some(path) => Box::new(io::BufWriter::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| UserError(format!("cannot write {}: {e}", path.display())))?,
        )),
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| UserError(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr()?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let config = MonitorConfig {
        aggregate: 1,
        events_per_sec: args.events_per_sec,
    };
    let mut tracer = Tracer::start_with(&filter, &config, args.ring_size)?;
    let mut labels = Labels::new(args.max_series as usize)?;
    let (tx, mut scrapes) = mpsc::channel::<http::Scrape>(16);
    tokio::spawn(http::serve(listener, tx));
    let cap = match args.events_per_sec {
        0 => "no cap".to_string(),
        n => format!("at most {n}/s per CPU"),
    };
    eprintln!(
        "kdrop: tracing {} (monitor: metrics on http://{addr}/metrics; events: 1 in {} drops, {cap})",
        tracer.describe(),
        filter.sample_every,
    );
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);

    let mut findings = BTreeMap::new();
    let mut writing = true;
    let mut emit = |batch: Vec<crate::event::Event>,
                    tracer: &mut Tracer,
                    findings: &mut BTreeMap<String, u64>| {
        let records = batch
            .iter()
            .filter_map(|e| tracer.enricher.on_event(e))
            .collect::<Vec<_>>();
        for r in records.into_iter().chain(tracer.enricher.due(false)) {
            count_finding(findings, &r);
            if writing && output::write_record(&mut out, &r, true).is_err() {
                // The metrics are the point: keep serving them.
                log::warn!("event output closed; metrics continue");
                writing = false;
            }
        }
        if writing && out.flush().is_err() {
            writing = false;
        }
    };
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            batch = tracer.next_batch() => emit(batch?, &mut tracer, &mut findings),
            // Held records (RSTs answering a SYN-ACK) come out on time.
            _ = tick.tick() => {
                let rest = tracer.drain();
                emit(rest, &mut tracer, &mut findings)
            }
            Some(reply) = scrapes.recv() => {
                let body = match snapshot(&tracer, &mut labels, &findings) {
                    Ok(s) => metrics::render(&s),
                    Err(e) => {
                        log::warn!("reading kdrop's maps: {e:#}");
                        continue;
                    }
                };
                let _ = reply.send(body);
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut sleep => break,
        }
    }
    let rest = tracer.drain();
    emit(rest, &mut tracer, &mut findings);
    let c = tracer.counters()?;
    eprintln!(
        "kdrop: monitor stopped after {:.1}s (matched {}, emitted {}, lost {}, sampled out {}, capped {})",
        tracer.started.elapsed().as_secs_f64(),
        c.matched,
        c.emitted,
        c.lost,
        c.sampled_out,
        c.capped
    );
    Ok(ExitCode::SUCCESS)
}
