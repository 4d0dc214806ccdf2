//! One event loop for every mode: start the probes, read the ring buffer,
//! the ctnetlink destroy events and the timers, turn events into records
//! (`enrich`), hand them to the mode's [`Sink`], and at the end drain every
//! source (ring, sockets, held records) the same way.
pub mod arming;
mod capture;
mod lateness;
mod node_ports;
mod recording;
pub use self::recording::Recording;
pub mod replay;
mod ring;
mod watch;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context as _, Result};
use kdrop_common::{Filter, MonitorConfig};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::{mpsc, oneshot},
};

use kdrop_common::{Endpoint, Evidence, AF_INET, AF_INET6};

use self::{
    arming::{demands, Arming, ROUTE_REASONS},
    lateness::Lateness,
    recording::Line,
    ring::Ring,
};
use crate::{
    context::{
        ctevents::{CtEvents, StatusBits},
        netns,
        recording::Recorder,
        tape::TapeWriter,
        Live, NetnsRegistry,
    },
    enrich::{monotonic_ns, realtime_offset_ns, Enricher, Facts, ListenWatch, Refusals},
    kernel::facts::Reasons,
    model::{
        packet::{CtEvent, CtSeen, Event},
        record::DropRecord,
        stats::Stats,
    },
    probes::{self, nf, Demand, KernelSetup, Probes},
};

/// What a session is asked to do.
pub struct Options {
    pub filter: Filter,
    /// Monitor mode's aggregation and cap (zeroed: live tracing).
    pub monitor: MonitorConfig,
    pub ring_kib: u32,
    /// Listen to conntrack's NEW and DESTROY events (ctnetlink): follows
    /// forwarded NAT'd handshakes no local socket retransmits, at a cost per
    /// new connection the kernel tracks (it builds a message for each).
    pub conntrack_events: bool,
    /// Write an incident bundle (`kdrop record`).
    pub record: Option<recording::Recording>,
    /// Write each drop record's packet as pcapng (`--pcap`).
    pub pcap: Option<std::path::PathBuf>,
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
    /// SYNs the listen watch counted refused (monitor mode's metrics).
    fn refused(&mut self, _r: &Refusals) {}
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

/// What woke the loop.
enum Woke {
    Ring(Vec<Event>),
    Tick,
    Ct(Vec<CtEvent>),
    Scrape(Scrape),
}

pub struct Session {
    probes: Probes,
    arming: Arming,
    ring: Ring,
    ct_events: CtEvents,
    pub enricher: Enricher<Recorder<Live>>,
    /// The bundle being written, if recording.
    tape: Option<TapeWriter>,
    /// The pcapng being written, if asked for.
    capture: Option<capture::Capture>,
    /// Listeners refusing SYNs, from their namespaces' counters.
    watch: ListenWatch,
    /// The node ports `--port` also follows.
    node_ports: node_ports::NodePorts,
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
        let mut filter = o.filter;
        let mut live = Live::new()?;
        let traced = match o.filter.netns {
            0 => live.own_netns(),
            n => n,
        };
        // The "before" of the first netfilter drop, and the rules the node
        // ports are read from: mostly waiting on iptables-save and nft, done
        // while this thread parses BTF.
        let (setup, mut node_ports) = std::thread::scope(|s| {
            let rules = s.spawn(|| {
                live.prime_netfilter(traced);
                node_ports::follow(&mut live, traced, &mut filter)
            });
            let setup = KernelSetup::read();
            let node_ports = rules
                .join()
                .map_err(|_| anyhow!("reading the rules panicked"));
            anyhow::Ok((setup?, node_ports?))
        })?;
        filter.final_ack_reason = final_ack_reason(&setup.reasons);
        let namespaces = followed_namespaces(o.filter.netns)?;
        node_ports
            .left
            .extend(namespaces.first().and_then(node_ports::unfollowed));
        let mut probes = probes::load(
            &setup,
            &probes::Config {
                filter: &filter,
                monitor: &o.monitor,
                evidence: &evidence(&setup.reasons, o.pcap.is_some()),
                ring_kib: o.ring_kib,
                all_rungs: false,
            },
        )?;
        // After the load's peak (the parsed BTF freed): a first drop's
        // location, or a policy's pods, then cost no wait.
        crate::kernel::symbols::prefetch();
        live.ask_pod_labels_ahead();
        let ring = Ring::new(probes.take_events()?, o.record.is_some())?;
        let nf_rungs: HashMap<&'static str, String> = probes
            .reports
            .iter()
            .filter_map(|r| {
                let f = nf::FUNCS.iter().find(|f| f.point == r.point)?;
                Some((f.name, r.chosen()?.to_string()))
            })
            .collect();
        let enricher = Enricher::new(
            Recorder::new(live, o.record.is_some()),
            Facts {
                reasons: setup.reasons,
                ct_names: setup.ct_names,
                nf_rungs,
                realtime_offset_ns: realtime_offset_ns(),
            },
        );
        // Subscribed before the readiness line: NAT'd entries created from
        // then on are followed, and reported if they die unreplied.
        let ct_events = if o.conntrack_events {
            CtEvents::open(
                &namespaces,
                &filter.ports[..filter.n_ports as usize],
                StatusBits::from_names(&enricher.facts.ct_names),
                o.filter.netns != 0,
            )
        } else {
            CtEvents::default()
        };
        let mut s = Self {
            probes,
            arming: Arming::default(),
            ring,
            ct_events,
            enricher,
            tape: None,
            capture: None,
            watch: ListenWatch::new(filter.netns, &filter.ports[..filter.n_ports as usize]),
            node_ports,
            started: Instant::now(),
            sigint,
            sigterm,
        };
        if let Some(p) = &o.pcap {
            let offset = s.enricher.facts.realtime_offset_ns;
            s.capture = Some(capture::Capture::create(p, offset)?);
        }
        if let Some(r) = &o.record {
            let header = s.header(r);
            s.tape = Some(TapeWriter::create(&r.path, r.max_bytes, &header)?);
        }
        s.watch_baseline();
        Ok(s)
    }

    /// `skb:kfree_skb via tp_btf, ..., conntrack destroy events in N
    /// namespaces`: what the readiness line says is attached.
    pub fn describe(&self) -> String {
        let mut s = self.probes.describe();
        for p in &self.node_ports.followed {
            s.push_str(&format!(", {p} beside --port"));
        }
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
        m.extend(self.node_ports.left.iter().cloned());
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
        let mut lateness = Lateness::new(monotonic_ns());
        let ended = loop {
            let entered = monotonic_ns();
            let woke = tokio::select! {
                batch = self.ring.next_batch() => Woke::Ring(batch?),
                _ = tick.tick() => Woke::Tick,
                events = self.ct_events.next() => Woke::Ct(events),
                Some(reply) = next_scrape(&mut scrapes) => Woke::Scrape(reply),
                _ = self.sigint.recv() => break Ended::Signal,
                _ = self.sigterm.recv() => break Ended::Signal,
                _ = &mut sleep => break Ended::Deadline,
            };
            let since = lateness.since(entered, monotonic_ns());
            if self.on_woke(woke, since, sink)? == Control::Stop {
                break Ended::Sink;
            }
        };
        if ended != Ended::Sink {
            self.drain_all(sink);
        }
        Ok(ended)
    }

    /// One turn of the loop; what woke it may have waited since `since_ns`.
    fn on_woke(&mut self, woke: Woke, since_ns: u64, sink: &mut impl Sink) -> Result<Control> {
        Ok(match woke {
            Woke::Ring(batch) => self.deliver(batch, sink),
            Woke::Tick => {
                self.disarm_quiet()?;
                self.probes.follow_sweep(monotonic_ns())?;
                // What is on the ring first: a held RST's SYN-ACK drop may be.
                let batch = self.ring.drain();
                match self.deliver(batch, sink) {
                    Control::Stop => Control::Stop,
                    Control::Continue => self.watch_listeners(sink),
                }
            }
            Woke::Ct(events) => {
                // The SYNs that created those entries are on the ring
                // buffer already: follow them first.
                let batch = self.ring.drain();
                match self.deliver(batch, sink) {
                    Control::Stop => Control::Stop,
                    Control::Continue => self.deliver_ct(events, since_ns, sink),
                }
            }
            Woke::Scrape(reply) => {
                let _ = reply.send(sink.scrape(&self.probes));
                Control::Continue
            }
        })
    }

    /// At exit: what is on the ring, destroy events already queued on the
    /// sockets, and every record still held back.
    fn drain_all(&mut self, sink: &mut impl Sink) {
        let batch = self.ring.drain();
        if self.deliver(batch, sink) == Control::Stop {
            return;
        }
        let destroyed = self.ct_events.read_all();
        // At exit no handshake waits for its next SYN.
        if self.deliver_ct(destroyed, monotonic_ns(), sink) == Control::Stop {
            return;
        }
        let due = self.enricher.due(u64::MAX);
        self.taped(Line::Due { now: None });
        for r in due {
            if sink.record(r) == Control::Stop {
                return;
            }
        }
        sink.flush();
    }

    fn deliver(&mut self, batch: Vec<Event>, sink: &mut impl Sink) -> Control {
        let raw = self.ring.take_raw();
        let at = monotonic_ns();
        for (i, e) in batch.iter().enumerate() {
            if let (Event::Head(h), Some(c)) = (e, self.capture.as_mut()) {
                c.head(h);
            }
            if let Event::Retrans(_) = e {
                // A local socket retransmits its SYN or SYN-ACK: follow
                // what its next attempts meet.
                self.want(Demand::Handshakes);
            }
            for r in self.enricher.held_due_before(e) {
                if self.hand(r, sink) == Control::Stop {
                    return Control::Stop;
                }
            }
            let r = self.enricher.on_event(e);
            if let Some(bytes) = raw.get(i) {
                self.taped(Line::Ring {
                    at,
                    hex: recording::hex(bytes),
                });
            }
            if let Some(r) = r {
                if self.hand(r, sink) == Control::Stop {
                    return Control::Stop;
                }
            }
        }
        // Due as of when the batch was taken, not now: what came on the ring
        // while a slow batch was explained (a retransmission, the SYN-ACK's
        // drop) is not read yet, and a handshake is not overdue, nor a held
        // record due, before kdrop has read past its time.
        let due = self.enricher.due(at);
        self.taped(Line::Due { now: Some(at) });
        for r in due {
            if self.hand(r, sink) == Control::Stop {
                return Control::Stop;
            }
        }
        if self.tape_full() {
            return Control::Stop;
        }
        sink.flush()
    }

    fn deliver_ct(&mut self, events: Vec<CtEvent>, since_ns: u64, sink: &mut impl Sink) -> Control {
        for e in &events {
            let d = match e {
                CtEvent::New(seen) => {
                    self.follow_new(seen, since_ns);
                    continue;
                }
                CtEvent::Destroyed(d) => d,
            };
            let r = self.enricher.on_destroyed(d);
            self.taped(Line::CtDestroyed {
                at: monotonic_ns(),
                destroyed: d.clone(),
            });
            if let Some(r) = r {
                if self.hand(r, sink) == Control::Stop {
                    return Control::Stop;
                }
            }
        }
        if self.tape_full() {
            return Control::Stop;
        }
        sink.flush()
    }

    /// A NAT'd connection matching the filter started: follow it by its
    /// client's end, and arm what shows its next transmissions. Its event
    /// may have waited unread since `since_ns` (the ring drained first too).
    fn follow_new(&mut self, seen: &CtSeen, since_ns: u64) {
        let now = monotonic_ns();
        let late_ns = now.saturating_sub(since_ns);
        // Armed first: the tracker times the handshake by when its
        // retransmissions became visible.
        self.want(Demand::Handshakes);
        let ends = self.enricher.on_new(seen, now, late_ns);
        self.taped(Line::CtNew {
            now,
            late: late_ns,
            seen: seen.clone(),
        });
        for end in ends {
            let e = Endpoint::new(
                if end.is_ipv4() { AF_INET } else { AF_INET6 },
                &match end.ip() {
                    std::net::IpAddr::V4(a) => {
                        let mut b = [0u8; 16];
                        b[..4].copy_from_slice(&a.octets());
                        b
                    }
                    std::net::IpAddr::V6(a) => a.octets(),
                },
                end.port(),
            );
            if let Err(e) = self.probes.follow(&e, now) {
                log::debug!("following {end}: {e:#}");
            }
        }
    }

    /// A record to the sink, after arming what its connection's next
    /// packets need.
    fn hand(&mut self, r: DropRecord, sink: &mut impl Sink) -> Control {
        for d in demands(&r) {
            self.want(d);
        }
        if let Some(c) = self.capture.as_mut() {
            if let Err(e) = c.record(&r) {
                log::warn!("pcapng stopped: {e:#}");
                self.capture = None;
            }
        }
        sink.record(r)
    }

    /// Arms `d`'s points unless armed; a point that cannot be attached now
    /// costs its evidence, not the trace.
    fn want(&mut self, d: Demand) {
        if !self.probes.serves(d) || !self.arming.want(d, monotonic_ns()) {
            return;
        }
        match self.probes.arm(d) {
            Ok(n) => {
                log::debug!("armed {n} point(s) for {d}");
                if d == Demand::Handshakes && n > 0 {
                    self.watching(Some(monotonic_ns()));
                }
            }
            Err(e) => {
                log::warn!("arming the {d} points: {e:#}");
                self.arming.forget(d);
            }
        }
    }

    /// Disarms what nothing asked for lately.
    fn disarm_quiet(&mut self) -> Result<()> {
        for d in self.arming.quiet(monotonic_ns()) {
            self.probes
                .disarm(d)
                .with_context(|| format!("disarming the {d} points"))?;
            log::debug!("disarmed the {d} points");
            if d == Demand::Handshakes {
                self.watching(None);
            }
        }
        Ok(())
    }

    fn watching(&mut self, since: Option<u64>) {
        self.enricher.watching(since);
        self.taped(Line::Watched { since });
    }

    /// Ends the pcapng with what never reached it; its packet count.
    pub fn finish_capture(&mut self, stats: &Stats) -> Result<Option<u64>> {
        match self.capture.take() {
            Some(c) => {
                let n = c.written;
                c.finish(stats)?;
                Ok(Some(n))
            }
            None => Ok(None),
        }
    }

    /// The kernel's counters and the session's own, now.
    pub fn stats(&self) -> Result<Stats> {
        Ok(Stats {
            drops: self.probes.counters()?,
            egress: self.probes.egress_counters()?,
            verdicts: self.probes.verdict_counters()?,
            retrans: self.probes.retrans_counters()?,
            follow: self.probes.follow_stats()?,
            armed: self
                .probes
                .armed()
                .into_iter()
                .map(|(p, n, d)| (p.to_string(), n, d))
                .collect(),
            undecodable: self.ring.undecodable,
            ct_received: self.ct_events.received_destroyed,
            ct_overruns: self.ct_events.overruns,
            answered_by_tcp: self.enricher.answered_by_tcp,
            elapsed: self.started.elapsed(),
        })
    }
}

/// The raw reason of a refused final ACK (TCP_LISTEN_OVERFLOW) on this
/// kernel, or ABSENT.
fn final_ack_reason(reasons: &Reasons) -> u32 {
    reasons
        .value("TCP_LISTEN_OVERFLOW")
        .unwrap_or(kdrop_common::ABSENT)
}

/// Which drop reasons carry route lookups on this kernel; whether drops
/// carry their first bytes.
fn evidence(reasons: &Reasons, capture_head: bool) -> Evidence {
    let mut e = Evidence::zeroed();
    for name in ROUTE_REASONS {
        if let Some(v) = reasons.value(name) {
            e.add(v);
        }
    }
    e.route_without_reason = u32::from(reasons.is_empty());
    e.capture_head = u32::from(capture_head);
    e
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
