//! A running trace: probes attached, events read off the ring buffer and
//! turned into records.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use kdrop_common::{Counters, Filter, MonitorConfig, AF_INET, AF_INET6, TCP_ACK, TCP_SYN};
use tokio::io::unix::AsyncFd;

use crate::{
    context::{
        ctevents,
        netfilter::NetfilterContext,
        netns::{self, IfNames, NetnsRegistry},
        routing::ContextCache,
    },
    diagnosis::{
        self, conntrack,
        handshake::{self, BridgeFacts, CtBits, Dead, Flow, Reset, Tracker},
        routing, DropFacts, Finding,
    },
    event::{self, Ct, Drop, Event, Tuple},
    kernel::{CtNames, Reasons},
    output::{rfc3339, CtRecord, DropRecord, LookupRecord, TupleRecord},
    probes::{self, KernelSetup, Probes},
    symbols::Symbols,
    verdict::{self, NfFn, VerdictLog},
};

pub struct Tracer {
    probes: Probes,
    events: AsyncFd<RingBuf<MapData>>,
    pub enricher: Enricher,
    pub started: Instant,
    pub undecodable: u64,
    /// The last batch was large: pause before the next read.
    busy: bool,
}

/// The longest a record waits for the reader when it was not allowed to
/// wake it (kdrop-ebpf/src/drop.rs, wakeup_flags).
const READ_TICK: Duration = Duration::from_millis(20);

/// A batch at least this large means a flood...
const BUSY_BATCH: usize = 32;
/// ...and the reader then pauses this long between reads (the default ring
/// holds ~12k records: 2 ms of a 500k/s flood fits several times over).
const BUSY_PAUSE: Duration = Duration::from_millis(2);

impl Tracer {
    /// Reads the kernel, loads and attaches; returns once tracing.
    pub fn start(filter: &Filter, ring_kib: u32) -> Result<Self> {
        Self::start_with(filter, &MonitorConfig::zeroed(), ring_kib)
    }

    /// `start` in monitor mode: aggregation, sampling, cap.
    pub fn start_with(filter: &Filter, monitor: &MonitorConfig, ring_kib: u32) -> Result<Self> {
        let setup = KernelSetup::read()?;
        let mut probes = probes::load_with(&setup, filter, monitor, ring_kib, false)?;
        // SAFETY: the RingBuf owns its fd and lives inside the AsyncFd, so the
        // fd stays open for as long as it is registered.
        let events = unsafe { AsyncFd::register(probes.take_events()?) }
            .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
        let mut enricher = Enricher::new(setup.reasons, setup.ct_names)?;
        enricher.prime_netfilter(filter.netns);
        enricher.nf_rungs = probes
            .reports
            .iter()
            .filter_map(|r| {
                let f = crate::nfprobe::FUNCS.iter().find(|f| f.point == r.point)?;
                Some((f.name, r.chosen()?.to_string()))
            })
            .collect();
        Ok(Self {
            probes,
            events,
            enricher,
            started: Instant::now(),
            undecodable: 0,
            busy: false,
        })
    }

    pub fn describe(&self) -> String {
        self.probes.describe()
    }

    /// Optional probe points that did not attach, with why.
    pub fn missing(&self) -> Vec<String> {
        self.probes.missing()
    }

    pub fn counters(&self) -> Result<Counters> {
        self.probes.counters()
    }

    pub fn egress_counters(&self) -> Result<Counters> {
        self.probes.egress_counters()
    }

    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    /// Waits until records are available, then decodes all of them.
    pub async fn next_batch(&mut self) -> Result<Vec<Event>> {
        if self.busy {
            // Under a flood, let records pile up for a moment: the kernel
            // wakes the reader whenever a record lands where the reader had
            // caught up to (bpf_ringbuf_commit,
            // https://github.com/torvalds/linux/blob/v6.18/kernel/bpf/ringbuf.c),
            // and each wakeup is an irq_work IPI on the dropping CPU (an exit
            // in a VM). One drop at a time still reaches the reader at once.
            tokio::time::sleep(BUSY_PAUSE).await;
            let batch = self.drain();
            self.busy = batch.len() >= BUSY_BATCH;
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
        loop {
            // Records that were not allowed to wake us (the kernel side wakes
            // the reader at most once a millisecond per CPU) are picked up
            // on this tick.
            let Ok(guard) = tokio::time::timeout(READ_TICK, self.events.readable_mut()).await
            else {
                let batch = self.drain();
                if !batch.is_empty() {
                    self.busy = batch.len() >= BUSY_BATCH;
                    return Ok(batch);
                }
                continue;
            };
            let mut guard = guard?;
            let batch = Self::drain_ring(
                guard.get_inner_mut(),
                &mut self.undecodable,
                &mut self.enricher.verdicts,
            );
            guard.clear_ready();
            if !batch.is_empty() {
                self.busy = batch.len() >= BUSY_BATCH;
                return Ok(batch);
            }
        }
    }

    /// Whatever is on the ring buffer now, without waiting.
    pub fn drain(&mut self) -> Vec<Event> {
        Self::drain_ring(
            self.events.get_mut(),
            &mut self.undecodable,
            &mut self.enricher.verdicts,
        )
    }

    /// Events in ring order; netfilter verdict records go to `verdicts`,
    /// where the drop each one precedes picks it up.
    fn drain_ring(
        ring: &mut RingBuf<MapData>,
        undecodable: &mut u64,
        verdicts: &mut VerdictLog,
    ) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            match verdict::decode(&item) {
                Some(Ok(v)) => {
                    verdicts.push(v);
                    continue;
                }
                Some(Err(e)) => {
                    *undecodable += 1;
                    log::debug!("{e}");
                    continue;
                }
                None => {}
            }
            match event::decode(&item) {
                Ok(e) => out.push(e),
                Err(e) => {
                    *undecodable += 1;
                    log::debug!("{e}");
                }
            }
        }
        out
    }
}

/// Adds names to events: reason, namespace, interface, code location, time.
pub struct Enricher {
    reasons: Reasons,
    registry: NetnsRegistry,
    ifnames: IfNames,
    own_netns: u32,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC: bpf_ktime_get_ns() is monotonic.
    realtime_offset_ns: i128,
    symbols: Option<Symbols>,
    symbols_loading: Option<JoinHandle<Result<Symbols>>>,
    contexts: ContextCache,
    ct_names: CtNames,
    ct_bits: CtBits,
    tracker: Tracker,
    /// One diagnosis per distinct drop while the context stays the same: a
    /// flood of identical drops costs one.
    findings: HashMap<FindingKey, Option<Finding>>,
    netfilter: NetfilterContext,
    /// Netfilter verdicts waiting for their drop.
    pub verdicts: VerdictLog,
    /// The rung each netfilter function's verdicts come through.
    pub nf_rungs: HashMap<&'static str, String>,
    /// Who held a clashing reply tuple (`conntrack -L`), for a second: a
    /// burst of clashes on one tuple costs one process, not one each.
    reply_holders: HashMap<(u32, Tuple), (Instant, Option<String>)>,
}

type FindingKey = (u64, u32, u32, u32, Ipv4Addr, Ipv4Addr, u32, Option<i32>);
const FINDINGS_CACHED: usize = 4096;

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

impl Enricher {
    pub fn new(reasons: Reasons, ct_names: CtNames) -> Result<Self> {
        let bit = |n: &str| ct_names.bit(n).unwrap_or(0);
        let ct_bits = CtBits {
            seen_reply: bit("SEEN_REPLY"),
            src_nat: bit("SRC_NAT"),
            dst_nat: bit("DST_NAT"),
        };
        Ok(Self {
            ct_names,
            ct_bits,
            tracker: Tracker::default(),
            reasons,
            registry: NetnsRegistry::new(),
            ifnames: IfNames::default(),
            own_netns: netns::own()?.inode,
            realtime_offset_ns: clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC),
            symbols: None,
            // 100k+ lines: read off the startup path.
            symbols_loading: Some(std::thread::spawn(Symbols::load)),
            contexts: ContextCache::default(),
            findings: HashMap::new(),
            netfilter: NetfilterContext::new(),
            verdicts: VerdictLog::default(),
            nf_rungs: HashMap::new(),
            reply_holders: HashMap::new(),
        })
    }

    /// Reads the rulesets of the traced namespace (or kdrop's own) now, so
    /// that the first NETFILTER_DROP has counters from before it.
    pub fn prime_netfilter(&mut self, netns: u32) {
        let inode = if netns == 0 { self.own_netns } else { netns };
        if let Some(ns) = self.registry.lookup(inode) {
            self.netfilter.prime(&ns);
        }
    }

    /// `enum skb_drop_reason` name of a raw value.
    pub fn reason_name(&self, raw: u32) -> Option<String> {
        self.reasons.name(raw)
    }

    fn symbols(&mut self) -> &Symbols {
        if let Some(h) = self.symbols_loading.take() {
            let syms = match h.join() {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    log::warn!("no kernel symbols, locations stay addresses: {e:#}");
                    Symbols::default()
                }
                Err(_) => Symbols::default(),
            };
            self.symbols = Some(syms);
        }
        self.symbols.get_or_insert_with(Symbols::default)
    }

    /// Records for one event: a drop is always one; a packet leaving a
    /// device is one when it shows a handshake died unanswered.
    pub fn on_event(&mut self, e: &Event) -> Option<DropRecord> {
        match e {
            Event::Drop(d) => Some(self.enrich(d)),
            Event::Egress(p) => match self.tracker.on_egress(p, &self.ct_bits)? {
                Dead::Unanswered(flow) => Some(self.unanswered(&flow, None)),
                Dead::LoopedBack(pair) => Some(self.unanswered(&pair.0, Some(&pair.1))),
            },
        }
    }

    /// "reset" records: RSTs answering a SYN-ACK, held `RESET_GRACE_NS`
    /// in case the SYN-ACK's own drop (which says more) follows; all of
    /// them with `all`, when tracing ends.
    pub fn due(&mut self, all: bool) -> Vec<DropRecord> {
        let now = if all {
            u64::MAX
        } else {
            clock_ns(libc::CLOCK_MONOTONIC).max(0) as u64
        };
        let resets = self.tracker.due_resets(now);
        resets.iter().map(|r| self.reset(r)).collect()
    }

    /// A SYN-ACK answered by a RST, as an event of kind "reset".
    fn reset(&mut self, r: &Reset) -> DropRecord {
        let ns = self.registry.lookup(r.rst.netns);
        let ifname = self
            .ifnames
            .get(ns.as_ref(), self.own_netns, r.rst.netns, r.rst.ifindex);
        let at = self.registry.lookup(r.syn_ack_at.netns);
        let syn_ack_dev = self.ifnames.get(
            at.as_ref(),
            self.own_netns,
            r.syn_ack_at.netns,
            r.syn_ack_at.ifindex,
        );
        let name = |n: Option<&netns::Netns>, inode: u32| {
            n.and_then(|n| n.name.clone())
                .unwrap_or_else(|| inode.to_string())
        };
        let (rst_ns, syn_ack_ns) = (
            name(ns.as_ref(), r.rst.netns),
            name(at.as_ref(), r.syn_ack_at.netns),
        );
        let seen = handshake::reset_seen(r, &syn_ack_dev, &syn_ack_ns, &ifname, &rst_ns);
        let dnat = r
            .flow
            .as_ref()
            .filter(|f| f.ct.is_some_and(|c| c.status & self.ct_bits.dst_nat != 0));
        let finding = match dnat {
            Some(flow) => self.hairpin(flow, &r.syn_ack, &seen),
            None => None,
        }
        .unwrap_or_else(|| handshake::reset(r, &seen));
        // The handshake as the client started it, when kdrop saw it.
        let t = r
            .flow
            .as_ref()
            .map_or(r.rst.tuple, |f| f.ct.map_or(f.orig, |c| c.orig));
        let epoch = (i128::from(r.rst.ts_ns) + self.realtime_offset_ns).max(0) as u64;
        DropRecord {
            ts: rfc3339(epoch),
            kind: "reset",
            netns: r.rst.netns,
            netns_name: ns.as_ref().and_then(|n| n.name.clone()),
            ifname,
            ifindex: r.rst.ifindex,
            family: if t.src.is_ipv4() { "ipv4" } else { "ipv6" },
            saddr: t.src.ip(),
            sport: t.src.port(),
            daddr: t.dst.ip(),
            dport: t.dst.port(),
            tcp_flags: event::tcp_flags(r.rst.tcp_flags),
            reason: None,
            location: String::new(),
            mark: r.rst.mark,
            route_lookups: Vec::new(),
            ct: r
                .flow
                .as_ref()
                .and_then(|f| f.ct.as_ref())
                .map(|c| self.ct_record(c)),
            netfilter: None,
            finding: Some(finding),
        }
    }

    /// The SYN-ACK of a DNAT'd handshake left un-NAT'd: the hairpin
    /// finding, with `kernel` (the refused SYN-ACK's drop, or the client's
    /// RST) as its first evidence.
    fn hairpin(&mut self, flow: &Flow, syn_ack: &Tuple, kernel: &str) -> Option<Finding> {
        let ns = self.registry.lookup(flow.netns)?;
        let ctx = self.contexts.get(&ns).ok()?;
        let status = flow
            .ct
            .map(|c| self.ct_names.status(c.status))
            .unwrap_or_default();
        let bridge = BridgeFacts {
            br_netfilter_loaded: std::path::Path::new("/sys/module/br_netfilter").exists(),
            call_iptables: ctx.confs.bridge_nf_call_iptables,
        };
        handshake::hairpin(
            syn_ack,
            flow,
            &status,
            &ctx.tables,
            &bridge,
            kernel,
            &Self::netns_exec(ns.name.as_ref()),
        )
    }

    /// The status bit that marks an answered entry (the uapi value when the
    /// kernel's BTF does not name it).
    pub fn seen_reply_bit(&self) -> u32 {
        match self.ct_bits.seen_reply {
            0 => ctevents::IPS_SEEN_REPLY,
            b => b,
        }
    }

    /// A conntrack entry that died without a reply: an "unanswered" record
    /// for the handshake kdrop followed with that tuple, unless it was
    /// answered or already reported.
    pub fn on_destroyed(&mut self, d: &ctevents::Destroyed) -> Option<DropRecord> {
        let flow = self.tracker.on_destroyed(&d.ct)?;
        let mut r = self.unanswered(&flow, None);
        let netns = self
            .registry
            .lookup(d.netns)
            .and_then(|n| n.name)
            .unwrap_or_else(|| d.netns.to_string());
        let line = format!(
            "conntrack: the entry {} -> {} (reply {} -> {}) died without ever seeing a reply in netns {netns}{}, status [{}] (ctnetlink destroy event: timed out or deleted)",
            d.ct.orig.src,
            d.ct.orig.dst,
            d.ct.reply.src,
            d.ct.reply.dst,
            d.tcp_state
                .map(|s| format!(", state {}", ctevents::tcp_state_name(s)))
                .unwrap_or_default(),
            self.ct_names.status(d.ct.status).join(",")
        );
        if let Some(f) = r.finding.as_mut() {
            f.evidence.push(line);
        }
        Some(r)
    }

    fn ct_record(&self, ct: &Ct) -> CtRecord {
        let t = |t: &Tuple| TupleRecord {
            src: t.src.to_string(),
            dst: t.dst.to_string(),
        };
        CtRecord {
            orig: t(&ct.orig),
            reply: t(&ct.reply),
            status: self.ct_names.status(ct.status),
            mark: ct.mark,
            zone: ct.zone,
        }
    }

    fn netns_exec(name: Option<&String>) -> String {
        name.map(|n| format!("ip netns exec {n} "))
            .unwrap_or_default()
    }

    /// A handshake that died silently, as an event of kind "unanswered";
    /// `back` is the same SYN come back DNAT'd (incident 4).
    fn unanswered(&mut self, flow: &Flow, back: Option<&Flow>) -> DropRecord {
        let ns = self.registry.lookup(flow.netns);
        let ifname = self
            .ifnames
            .get(ns.as_ref(), self.own_netns, flow.netns, flow.ifindex);
        let tables = ns
            .as_ref()
            .and_then(|n| self.contexts.get(n).ok())
            .map(|c| c.tables.clone())
            .unwrap_or_default();
        let exec = Self::netns_exec(ns.as_ref().and_then(|n| n.name.as_ref()));
        let finding = match back {
            Some(back) => {
                let status = back
                    .ct
                    .map(|c| self.ct_names.status(c.status))
                    .unwrap_or_default();
                handshake::looped_back(flow, back, &status, &tables, &exec)
            }
            None => {
                let status = flow
                    .ct
                    .map(|c| self.ct_names.status(c.status))
                    .unwrap_or_default();
                handshake::unanswered(flow, &self.ct_bits, &status, &tables, &exec)
            }
        };
        let epoch = (i128::from(flow.last_ns) + self.realtime_offset_ns).max(0) as u64;
        DropRecord {
            ts: rfc3339(epoch),
            kind: "unanswered",
            netns: flow.netns,
            netns_name: ns.as_ref().and_then(|n| n.name.clone()),
            ifname,
            ifindex: flow.ifindex,
            family: if flow.orig.src.is_ipv4() {
                "ipv4"
            } else {
                "ipv6"
            },
            saddr: flow.orig.src.ip(),
            sport: flow.orig.src.port(),
            daddr: flow.orig.dst.ip(),
            dport: flow.orig.dst.port(),
            tcp_flags: "SYN".into(),
            reason: None,
            location: String::new(),
            mark: 0,
            route_lookups: Vec::new(),
            ct: back
                .and_then(|b| b.ct.as_ref())
                .or(flow.ct.as_ref())
                .map(|c| self.ct_record(c)),
            netfilter: None,
            finding: Some(finding),
        }
    }

    /// A refused SYN-ACK that is the reply side of a DNAT'd SYN seen leaving.
    fn explain_hairpin(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        // Before 5.17 (no reasons) the place says as much: tcp_v4_rcv and
        // tcp_v6_rcv free a segment no socket takes at their `discard_it`
        // (https://github.com/torvalds/linux/blob/v5.10/net/ipv4/tcp_ipv4.c),
        // and this SYN-ACK's tuple is one no local socket can have: its SYN
        // went to the DNAT'd address.
        let no_socket = match r.reason.as_deref() {
            Some(reason) => reason == "NO_SOCKET",
            None => ["tcp_v4_rcv+", "tcp_v6_rcv+"]
                .iter()
                .any(|f| r.location.starts_with(f)),
        };
        if !no_socket || d.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN | TCP_ACK {
            return None;
        }
        let syn_ack = Tuple {
            src: SocketAddr::new(d.saddr, d.sport),
            dst: SocketAddr::new(d.daddr, d.dport),
        };
        let flow = self.tracker.dnat_reply(&syn_ack)?.clone();
        let kernel = format!(
            "kernel: {} at {} in netns {}: no socket for {} -> {}, so it answers with a RST",
            match r.reason {
                Some(_) => "drop reason NO_SOCKET",
                None => "no drop reason on this kernel, freed by TCP's receive path",
            },
            r.location,
            r.netns_name.clone().unwrap_or_else(|| r.netns.to_string()),
            syn_ack.src,
            syn_ack.dst
        );
        self.hairpin(&flow, &syn_ack, &kernel)
    }

    pub fn enrich(&mut self, d: &Drop) -> DropRecord {
        let ns = self.registry.lookup(d.netns);
        let ifname = self
            .ifnames
            .get(ns.as_ref(), self.own_netns, d.netns, d.ifindex);
        let reason = self.reasons.name(d.reason);
        let location = self
            .symbols()
            .resolve(d.location)
            .unwrap_or_else(|| format!("{:#x}", d.location));
        let verdicts = self.verdicts.take_for(d);
        let rungs = &self.nf_rungs;
        let rung = |f: NfFn| {
            rungs
                .get(f.name())
                .cloned()
                .unwrap_or_else(|| "probe".into())
        };
        // Without a reason (before 5.17) the kernel's NF_DROP verdict, or
        // a free in nf_hook_slow, is what says netfilter dropped it.
        let netfilter = match reason.as_deref() {
            Some("NETFILTER_DROP") => self.netfilter.attribute(ns.as_ref(), d, &verdicts, &rung),
            None if !verdicts.is_empty() || diagnosis::netfilter_location(&location) => {
                self.netfilter.attribute(ns.as_ref(), d, &verdicts, &rung)
            }
            _ => None,
        };
        let epoch = (i128::from(d.ts_ns) + self.realtime_offset_ns).max(0) as u64;
        let mut r = DropRecord {
            ts: rfc3339(epoch),
            kind: "drop",
            netns: d.netns,
            netns_name: ns.as_ref().and_then(|n| n.name.clone()),
            ifname,
            ifindex: d.ifindex,
            family: if d.saddr.is_ipv4() { "ipv4" } else { "ipv6" },
            saddr: d.saddr,
            sport: d.sport,
            daddr: d.daddr,
            dport: d.dport,
            tcp_flags: event::tcp_flags(d.tcp_flags),
            reason,
            location,
            mark: d.mark,
            route_lookups: Vec::new(),
            ct: None,
            finding: None,
            netfilter,
        };
        r.ct = d.ct.as_ref().map(|c| self.ct_record(c));
        r.route_lookups = d
            .fib
            .iter()
            .map(|l| LookupRecord {
                table: l.table,
                err: l.err,
                src: l.src,
                dst: l.dst,
                iif: l.iif,
                oif: l.oif,
                mark: l.mark,
                dev: (l.err == 0 && l.res_ifindex != 0).then(|| {
                    self.ifnames
                        .get(ns.as_ref(), self.own_netns, d.netns, l.res_ifindex)
                }),
                gw: l.gw,
            })
            .collect();
        r.finding = self
            .explain_routing(d, &r, ns.as_ref())
            .or_else(|| self.explain_hairpin(d, &r))
            .or_else(|| self.explain_conntrack_drop(d, &r))
            .or_else(|| {
                diagnosis::explain(&DropFacts {
                    reason: r.reason.as_deref(),
                    ifname: &r.ifname,
                    netns: r.netns_name.as_deref(),
                    src: r.src(),
                    dst: r.dst(),
                    location: Some(&r.location),
                    netfilter: r.netfilter.as_ref(),
                })
            });
        if d.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK {
            // This drop is the record for the SYN-ACK: not also a "reset".
            self.tracker.syn_ack_dropped(&Tuple {
                src: SocketAddr::new(d.saddr, d.sport),
                dst: SocketAddr::new(d.daddr, d.dport),
            });
        }
        r
    }

    fn reply_holder(&mut self, ns: &netns::Netns, reply: &Tuple) -> Option<String> {
        const FRESH: Duration = Duration::from_secs(1);
        let key = (ns.inode, *reply);
        if let Some((at, holder)) = self.reply_holders.get(&key) {
            if at.elapsed() < FRESH {
                return holder.clone();
            }
        }
        if self.reply_holders.len() > FINDINGS_CACHED {
            self.reply_holders.clear();
        }
        let holder = crate::context::netfilter::reply_holder(&ns.path, reply);
        self.reply_holders
            .insert(key, (Instant::now(), holder.clone()));
        holder
    }

    /// A drop conntrack itself made (its statistics moved): a NAT port
    /// clash at confirmation or a full table.
    fn explain_conntrack_drop(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        let moved = r.netfilter.as_ref()?.conntrack.as_ref()?;
        let snap = self.netfilter.latest(d.netns);
        let rules = snap
            .map(|s| conntrack::nat_rules(&s.tables))
            .unwrap_or_default();
        let status =
            d.ct.map(|c| self.ct_names.status(c.status))
                .unwrap_or_default();
        let netns = r.netns_name.clone().unwrap_or_else(|| r.netns.to_string());
        // Who holds the reply tuple this entry wanted (only for a clash).
        let holder = match (&d.ct, self.registry.lookup(d.netns)) {
            (Some(ct), Some(ns)) if moved.after.insert_failed > moved.before.insert_failed => {
                self.reply_holder(&ns, &ct.reply)
            }
            _ => None,
        };
        conntrack::explain(&conntrack::CtDrop {
            moved,
            ct: d.ct.as_ref(),
            bits: &self.ct_bits,
            status: &status,
            nat_rules: &rules,
            kernel: format!(
                "kernel drop reason {} at {}",
                r.reason.as_deref().unwrap_or("NETFILTER_DROP"),
                r.location
            ),
            netns_exec: &Self::netns_exec(r.netns_name.as_ref()),
            netns: &netns,
            holder,
        })
    }

    /// Reverse-path and martian drops, with the namespace's routing context.
    fn explain_routing(
        &mut self,
        d: &Drop,
        r: &DropRecord,
        ns: Option<&netns::Netns>,
    ) -> Option<Finding> {
        let reason = r.reason.as_deref();
        // No reason at all (5.10): only what fib_validate_source or the drop
        // location can tell (routing::derive_reason).
        // NOT_SPECIFIED (before 6.13 for martians, e.g. 6.1) the same way.
        let derivable = d.src_check.is_some() || r.location.starts_with("ip_rcv_finish_core");
        match reason {
            Some("NOT_SPECIFIED") | None if derivable => {}
            Some(reason) if routing::REASONS.contains(&reason) => {}
            _ => return None,
        }
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (d.saddr, d.daddr) else {
            return None;
        };
        let ns = ns?;
        let ctx = match self.contexts.get(ns) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("routing context of netns {}: {e:#}", ns.inode);
                return None;
            }
        };
        let key = (
            ctx.generation,
            d.netns,
            d.ifindex,
            d.mark,
            src,
            dst,
            d.reason,
            d.src_check,
        );
        if let Some(f) = self.findings.get(&key) {
            return f.clone();
        }
        let exec = r
            .netns_name
            .as_ref()
            .map(|n| format!("ip netns exec {n} "))
            .unwrap_or_default();
        let f = routing::explain(
            &routing::RouteDrop {
                reason,
                location: &r.location,
                iif: d.ifindex,
                src,
                dst,
                mark: d.mark,
                fib: &d.fib,
                netns_exec: &exec,
                src_check: d.src_check,
            },
            &ctx.tables,
            &ctx.confs,
        );
        if self.findings.len() > FINDINGS_CACHED {
            self.findings.clear();
        }
        self.findings.insert(key, f.clone());
        f
    }
}

/// Builds the kernel filter from resolved arguments.
pub fn build_filter(
    ports: &[u16],
    hosts: &[(std::net::IpAddr, u8)],
    netns: u32,
    ifindex: u32,
    all_flags: bool,
) -> Result<Filter, String> {
    use kdrop_common::{Cidr, MAX_HOSTS, MAX_PORTS, TCP_SYN};
    if ports.len() > MAX_PORTS {
        return Err(format!("at most {MAX_PORTS} --port values"));
    }
    if hosts.len() > MAX_HOSTS {
        return Err(format!("at most {MAX_HOSTS} --host values"));
    }
    let mut f = Filter::zeroed();
    for (i, p) in ports.iter().enumerate() {
        f.ports[i] = *p;
    }
    f.n_ports = ports.len() as u32;
    for (i, (addr, len)) in hosts.iter().enumerate() {
        f.hosts[i] = match addr {
            std::net::IpAddr::V4(a) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&a.octets());
                Cidr::new(AF_INET, b, *len)
            }
            std::net::IpAddr::V6(a) => Cidr::new(AF_INET6, a.octets(), *len),
        };
    }
    f.n_hosts = hosts.len() as u32;
    f.netns = netns;
    f.ifindex = ifindex;
    // SYN is set on both handshake packets, SYN and SYN-ACK.
    f.tcp_flags_any = if all_flags { 0 } else { TCP_SYN };
    Ok(f)
}

/// How long to wait for the kernel side after the last batch on shutdown.
pub const DRAIN_GRACE: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_from_args() {
        let f = build_filter(
            &[3306, 80],
            &[("10.0.0.0".parse().unwrap(), 8)],
            7,
            3,
            false,
        )
        .unwrap();
        assert_eq!(&f.ports[..2], &[3306, 80]);
        assert_eq!(f.n_ports, 2);
        assert_eq!(f.n_hosts, 1);
        assert_eq!(f.hosts[0].family, AF_INET);
        assert_eq!(&f.hosts[0].addr[..4], &[10, 0, 0, 0]);
        assert_eq!(f.hosts[0].prefix_len, 8);
        assert_eq!(
            (f.netns, f.ifindex, f.tcp_flags_any),
            (7, 3, kdrop_common::TCP_SYN)
        );
        assert_eq!(build_filter(&[], &[], 0, 0, true).unwrap().tcp_flags_any, 0);
        assert!(build_filter(&[1; 17], &[], 0, 0, false).is_err());
    }
}
