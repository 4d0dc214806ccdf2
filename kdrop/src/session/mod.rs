//! One event loop for every mode: start the probes, read the ring buffer,
//! the ctnetlink destroy events and the timers, turn events into records
//! (`enrich`), hand them to the mode's [`Sink`], and at the end drain every
//! source (ring, sockets, held records) the same way.
mod ring;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use kdrop_common::{Filter, MonitorConfig};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::{mpsc, oneshot},
};

use self::ring::Ring;
use crate::{
    context::{ctevents::CtEvents, netns, Live, NetnsRegistry},
    enrich::{realtime_offset_ns, Enricher, Facts},
    model::{record::DropRecord, stats::Stats},
    probes::{self, nf, KernelSetup, Probes},
};

/// What a session is asked to do.
pub struct Options {
    pub filter: Filter,
    /// Monitor mode's aggregation and cap (zeroed: live tracing).
    pub monitor: MonitorConfig,
    pub ring_kib: u32,
}

/// What the mode wants after a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Continue,
    /// Enough (`--count` reached, output closed): nothing more is
    /// delivered, not even what is still on the ring at exit.
    Stop,
}

/// Where a mode's records go.
pub trait Sink {
    fn record(&mut self, r: DropRecord) -> Control;
    /// After each batch of records.
    fn flush(&mut self) -> Control {
        Control::Continue
    }
    /// A metrics scrape (monitor mode): the exposition text.
    fn scrape(&mut self, _probes: &Probes) -> String {
        String::new()
    }
}

/// A metrics scrape request: the reply goes back on the channel.
pub type Scrape = oneshot::Sender<String>;

/// Why the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Signal,
    Deadline,
    /// The sink said `Stop`.
    Sink,
}

/// How often records held back (RSTs answering a SYN-ACK) are looked at
/// when no other event comes.
const TICK: Duration = Duration::from_millis(100);

pub struct Session {
    probes: Probes,
    ring: Ring,
    ct_events: CtEvents,
    pub enricher: Enricher<Live>,
    pub started: Instant,
    // Installed before the readiness line: a signal right after it must
    // still take the orderly way out (summary, detach).
    sigint: Signal,
    sigterm: Signal,
}

impl Session {
    /// Reads the kernel, loads and attaches, subscribes to conntrack
    /// destroy events; returns once tracing.
    pub fn start(o: &Options) -> Result<Self> {
        let sigint = signal(SignalKind::interrupt())?;
        let sigterm = signal(SignalKind::terminate())?;
        let setup = KernelSetup::read()?;
        let mut probes = probes::load_with(&setup, &o.filter, &o.monitor, o.ring_kib, false)?;
        let ring = Ring::new(probes.take_events()?)?;
        let nf_rungs: HashMap<&'static str, String> = probes
            .reports
            .iter()
            .filter_map(|r| {
                let f = nf::FUNCS.iter().find(|f| f.point == r.point)?;
                Some((f.name, r.chosen()?.to_string()))
            })
            .collect();
        let mut live = Live::new()?;
        let traced = match o.filter.netns {
            0 => live.own_netns(),
            n => n,
        };
        live.prime_netfilter(traced);
        let enricher = Enricher::new(
            live,
            Facts {
                reasons: setup.reasons,
                ct_names: setup.ct_names,
                nf_rungs,
                realtime_offset_ns: realtime_offset_ns(),
            },
        );
        // Subscribed before the readiness line: entries created from then
        // on are reported when they die unreplied.
        let ct_events = CtEvents::open(
            &followed_namespaces(o.filter.netns)?,
            &o.filter.ports[..o.filter.n_ports as usize],
            enricher.seen_reply_bit(),
            o.filter.netns != 0,
        );
        Ok(Self {
            probes,
            ring,
            ct_events,
            enricher,
            started: Instant::now(),
            sigint,
            sigterm,
        })
    }

    /// `skb:kfree_skb via tp_btf, ..., conntrack destroy events in N
    /// namespaces`: what the readiness line says is attached.
    pub fn describe(&self) -> String {
        let mut s = self.probes.describe();
        let n = self.ct_events.len();
        if n != 0 {
            s.push_str(&format!(
                ", conntrack destroy events in {n} namespace{}",
                if n == 1 { "" } else { "s" }
            ));
        }
        s
    }

    /// What could not be attached or followed, and why.
    pub fn missing(&self) -> Vec<String> {
        let mut m = self.probes.missing();
        m.extend(self.ct_events.notes.iter().cloned());
        m
    }

    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    /// Runs until a signal, `duration`, or the sink has enough; then, unless
    /// the sink stopped it, drains every source into the sink. Scrape
    /// requests (monitor mode) are answered by the sink in between.
    pub async fn run(
        &mut self,
        sink: &mut impl Sink,
        duration: Option<Duration>,
        mut scrapes: Option<&mut mpsc::Receiver<Scrape>>,
    ) -> Result<Ended> {
        let deadline = duration.map(|d| tokio::time::Instant::now() + d);
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ended = loop {
            tokio::select! {
                batch = self.ring.next_batch() => {
                    let batch = batch?;
                    if self.deliver(batch, sink) == Control::Stop {
                        break Ended::Sink;
                    }
                }
                _ = tick.tick() => {
                    // What is on the ring first: a held RST's SYN-ACK drop may be.
                    let batch = self.ring.drain();
                    if self.deliver(batch, sink) == Control::Stop {
                        break Ended::Sink;
                    }
                }
                destroyed = self.ct_events.next() => {
                    // The SYNs that created those entries are on the ring
                    // buffer already: follow them first.
                    let batch = self.ring.drain();
                    if self.deliver(batch, sink) == Control::Stop
                        || self.deliver_destroyed(destroyed, sink) == Control::Stop
                    {
                        break Ended::Sink;
                    }
                }
                Some(reply) = next_scrape(&mut scrapes) => {
                    let _ = reply.send(sink.scrape(&self.probes));
                }
                _ = self.sigint.recv() => break Ended::Signal,
                _ = self.sigterm.recv() => break Ended::Signal,
                _ = &mut sleep => break Ended::Deadline,
            }
        };
        if ended != Ended::Sink {
            self.drain_all(sink);
        }
        Ok(ended)
    }

    /// At exit: what is on the ring, destroy events already queued on the
    /// sockets, and every record still held back.
    fn drain_all(&mut self, sink: &mut impl Sink) {
        let batch = self.ring.drain();
        if self.deliver(batch, sink) == Control::Stop {
            return;
        }
        let destroyed = self.ct_events.read_all();
        if self.deliver_destroyed(destroyed, sink) == Control::Stop {
            return;
        }
        for r in self.enricher.due(true) {
            if sink.record(r) == Control::Stop {
                return;
            }
        }
        sink.flush();
    }

    fn deliver(
        &mut self,
        batch: Vec<crate::model::packet::Event>,
        sink: &mut impl Sink,
    ) -> Control {
        for e in &batch {
            if let Some(r) = self.enricher.on_event(e) {
                if sink.record(r) == Control::Stop {
                    return Control::Stop;
                }
            }
        }
        for r in self.enricher.due(false) {
            if sink.record(r) == Control::Stop {
                return Control::Stop;
            }
        }
        sink.flush()
    }

    fn deliver_destroyed(
        &mut self,
        destroyed: Vec<crate::model::packet::Destroyed>,
        sink: &mut impl Sink,
    ) -> Control {
        for d in &destroyed {
            if let Some(r) = self.enricher.on_destroyed(d) {
                if sink.record(r) == Control::Stop {
                    return Control::Stop;
                }
            }
        }
        sink.flush()
    }

    /// The kernel's counters and the session's own, now.
    pub fn stats(&self) -> Result<Stats> {
        Ok(Stats {
            drops: self.probes.counters()?,
            egress: self.probes.egress_counters()?,
            verdicts: self.probes.verdict_counters()?,
            undecodable: self.ring.undecodable,
            ct_received: self.ct_events.received,
            ct_overruns: self.ct_events.overruns,
            elapsed: self.started.elapsed(),
        })
    }
}

async fn next_scrape(scrapes: &mut Option<&mut mpsc::Receiver<Scrape>>) -> Option<Scrape> {
    match scrapes {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Where to listen for conntrack destroy events: the `--netns` namespace,
/// or kdrop's own and every namespace that exists now.
fn followed_namespaces(netns: u32) -> Result<Vec<netns::Netns>> {
    let mut registry = NetnsRegistry::new();
    if netns != 0 {
        return Ok(registry.lookup(netns).into_iter().collect());
    }
    let own = netns::own().context("kdrop's own network namespace")?;
    let mut all = registry.all();
    all.retain(|n| n.inode != own.inode);
    all.insert(0, own);
    Ok(all)
}
