//! `kdrop monitor`: always on, cheap. The kernel counts every matched drop
//! by (reason, netns, interface, port) and turns only a sample of them,
//! under a per-second cap, into detailed events; kdrop serves the counts
//! to Prometheus and writes the sampled events' findings as JSON lines.
pub mod http;
mod labels;

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    io::{self, Write},
    process::ExitCode,
};

use anyhow::Result;
use kdrop_common::MonitorConfig;
use tokio::{net::TcpListener, sync::mpsc};

use self::labels::Labels;
use crate::{
    cli::MonitorArgs,
    enrich::Refusals,
    filter,
    model::record::DropRecord,
    output::{
        self,
        metrics::{
            self, EgressCounts, EventCounts, FollowCounts, ListenCounts, ListenLabels,
            PolicyLabels, ProbeState, Snapshot,
        },
    },
    probes::{self, Outcome, Probes},
    session::{Control, Options, Scrape, Session, Sink},
    UserError,
};

/// Causes kept as their own `kdrop_findings_total` series; the set is small
/// and fixed in code, this only bounds a surprise.
const MAX_CAUSES: usize = 64;
/// Listeners kept as their own `kdrop_listen_*_total` series; later ones
/// count into one whose labels are all `overflow`.
const MAX_LISTENERS: usize = 1024;
/// The same for `kdrop_network_policy_denials_total`'s protected pods.
const MAX_POLICY_SERIES: usize = 1024;

/// JSON lines out (while the output stays open), findings counted, scrapes
/// answered from the kernel's maps.
struct Monitor {
    out: Box<dyn Write>,
    writing: bool,
    findings: BTreeMap<String, u64>,
    /// The listen watch's refusals, by listener.
    listen: BTreeMap<ListenLabels, ListenCounts>,
    /// Network policy denials, by protected pod and direction.
    policy: BTreeMap<PolicyLabels, u64>,
    labels: Labels,
}

impl Monitor {
    fn count_finding(&mut self, r: &DropRecord) {
        let Some(f) = &r.finding else { return };
        let known = self.findings.contains_key(f.cause.id());
        let cause = if known || self.findings.len() < MAX_CAUSES - 1 {
            f.cause.id()
        } else {
            metrics::OVERFLOW
        };
        *self.findings.entry(cause.to_string()).or_insert(0) += 1;
        if let Some(p) = &r.network_policy {
            let mut labels = PolicyLabels {
                pod: p.protected_pod.clone().unwrap_or_default(),
                direction: p.direction.into(),
                port: p.port.to_string(),
                verdict: p.verdict.into(),
                policy: p.policy.clone().unwrap_or_default(),
            };
            if !self.policy.contains_key(&labels) && self.policy.len() + 1 >= MAX_POLICY_SERIES {
                labels = PolicyLabels::overflow();
            }
            *self.policy.entry(labels).or_insert(0) += 1;
        }
    }

    /// Everything a scrape shows, read from the kernel now.
    fn snapshot(&mut self, p: &Probes) -> Result<Snapshot> {
        let c = p.counters()?;
        let g = p.egress_counters()?;
        let counts = |c: kdrop_common::Counters| EgressCounts {
            matched: c.matched,
            emitted: c.emitted,
            lost: c.lost,
            capped: c.capped,
        };
        let follow = p.follow_stats()?;
        let mut drops = BTreeMap::new();
        for (k, v) in p.aggregate()? {
            // The overflow key exists from the start; show it only once used.
            if k.overflow != 0 && v == 0 {
                continue;
            }
            *drops.entry(self.labels.of(&k)).or_insert(0) += v;
        }
        let probes = p
            .reports
            .iter()
            .flat_map(|r| {
                r.rungs.iter().map(|(rung, o)| ProbeState {
                    point: r.point.to_string(),
                    rung: rung.to_string(),
                    attached: matches!(o, Outcome::Attached | Outcome::Deferred),
                })
            })
            .collect();
        Ok(Snapshot {
            drops,
            findings: self.findings.clone(),
            listen: self.listen.clone(),
            policy: self.policy.clone(),
            events: EventCounts {
                matched: c.matched,
                emitted: c.emitted,
                lost: c.lost,
                sampled_out: c.sampled_out,
                capped: c.capped,
            },
            egress: counts(g),
            retrans: counts(p.retrans_counters()?),
            verdicts: counts(p.verdict_counters()?),
            follow: FollowCounts {
                inserted: follow.inserted,
                map_full: follow.full,
                admitted: follow.admitted,
            },
            probes,
        })
    }
}

impl Sink for Monitor {
    fn refused(&mut self, r: &Refusals) {
        let mut labels = self.labels.listener(r.netns, r.port);
        if !self.listen.contains_key(&labels) && self.listen.len() + 1 >= MAX_LISTENERS {
            let o = || metrics::OVERFLOW.to_string();
            labels = ListenLabels {
                netns: o(),
                pod: o(),
                port: o(),
            };
        }
        let c = self.listen.entry(labels).or_default();
        c.accept += r.moved.listen_overflows;
        c.syn += r.moved.req_q_full_drop;
        c.cookies += r.moved.req_q_full_do_cookies;
    }

    fn record(&mut self, r: DropRecord) -> Control {
        self.count_finding(&r);
        if self.writing && output::write_record(&mut self.out, &r, true).is_err() {
            // The metrics are the point: keep serving them.
            log::warn!("event output closed; metrics continue");
            self.writing = false;
        }
        Control::Continue
    }

    fn flush(&mut self) -> Control {
        if self.writing && self.out.flush().is_err() {
            self.writing = false;
        }
        Control::Continue
    }

    fn scrape(&mut self, probes: &Probes) -> String {
        match self.snapshot(probes) {
            Ok(s) => metrics::render(&s),
            Err(e) => {
                log::warn!("reading kdrop's maps: {e:#}");
                String::new()
            }
        }
    }
}

pub async fn run(args: &MonitorArgs) -> Result<ExitCode> {
    for w in probes::check_privileges()? {
        log::warn!("{w}");
    }
    let filter = filter::resolve(&args.filter)?;
    let out: Box<dyn Write> = match &args.output {
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
    let sample_every = filter.sample_every;
    let mut session = Session::start(&Options {
        filter,
        monitor: MonitorConfig {
            aggregate: 1,
            events_per_sec: args.events_per_sec,
        },
        ring_kib: args.ring_size,
        conntrack_events: args.conntrack_events,
        record: None,
        pcap: None,
    })?;
    let mut monitor = Monitor {
        out,
        writing: true,
        findings: BTreeMap::new(),
        listen: BTreeMap::new(),
        policy: BTreeMap::new(),
        labels: Labels::new(
            args.max_series as usize,
            session.enricher.facts.reasons.clone(),
        )?,
    };
    let (tx, mut scrapes) = mpsc::channel::<Scrape>(16);
    tokio::spawn(http::serve(listener, tx));
    let cap = match args.events_per_sec {
        0 => "no cap".to_string(),
        n => format!("at most {n}/s per CPU"),
    };
    eprintln!(
        "kdrop: tracing {} (monitor: metrics on http://{addr}/metrics; events: 1 in {sample_every} drops, {cap})",
        session.describe(),
    );
    for line in session.missing() {
        eprintln!("kdrop: without {line}");
    }
    session
        .run(&mut monitor, args.duration, Some(&mut scrapes))
        .await?;
    let s = session.stats()?;
    let c = s.drops;
    eprintln!(
        "kdrop: monitor stopped after {:.1}s (matched {}, emitted {}, lost {}, sampled out {}, capped {})",
        s.elapsed.as_secs_f64(),
        c.matched,
        c.emitted,
        c.lost,
        c.sampled_out,
        c.capped
    );
    Ok(ExitCode::SUCCESS)
}
