//! A running trace: probes attached, events read off the ring buffer and
//! turned into records.
use std::{
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use kdrop_common::{Counters, Filter, AF_INET, AF_INET6};
use tokio::io::unix::AsyncFd;

use crate::{
    context::netns::{self, IfNames, NetnsRegistry},
    diagnosis::{self, DropFacts},
    event::{self, Drop, Event},
    kernel::Reasons,
    output::{rfc3339, DropRecord},
    probes::{self, KernelSetup, Probes},
    symbols::Symbols,
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
        let setup = KernelSetup::read()?;
        let mut probes = probes::load(&setup, filter, ring_kib, false)?;
        // SAFETY: the RingBuf owns its fd and lives inside the AsyncFd, so the
        // fd stays open for as long as it is registered.
        let events = unsafe { AsyncFd::register(probes.take_events()?) }
            .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
        Ok(Self {
            probes,
            events,
            enricher: Enricher::new(setup.reasons)?,
            started: Instant::now(),
            undecodable: 0,
            busy: false,
        })
    }

    pub fn describe(&self) -> String {
        self.probes.describe()
    }

    pub fn counters(&self) -> Result<Counters> {
        self.probes.counters()
    }

    /// Waits until records are available, then decodes all of them.
    pub async fn next_batch(&mut self) -> Result<Vec<Drop>> {
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
            let batch = Self::drain_ring(guard.get_inner_mut(), &mut self.undecodable);
            guard.clear_ready();
            if !batch.is_empty() {
                self.busy = batch.len() >= BUSY_BATCH;
                return Ok(batch);
            }
        }
    }

    /// Whatever is on the ring buffer now, without waiting.
    pub fn drain(&mut self) -> Vec<Drop> {
        Self::drain_ring(self.events.get_mut(), &mut self.undecodable)
    }

    fn drain_ring(ring: &mut RingBuf<MapData>, undecodable: &mut u64) -> Vec<Drop> {
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            match event::decode(&item) {
                Ok(Event::Drop(d)) => out.push(d),
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
}

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
    pub fn new(reasons: Reasons) -> Result<Self> {
        Ok(Self {
            reasons,
            registry: NetnsRegistry::new(),
            ifnames: IfNames::default(),
            own_netns: netns::own()?.inode,
            realtime_offset_ns: clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC),
            symbols: None,
            // 100k+ lines: read off the startup path.
            symbols_loading: Some(std::thread::spawn(Symbols::load)),
        })
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
        let epoch = (i128::from(d.ts_ns) + self.realtime_offset_ns).max(0) as u64;
        let mut r = DropRecord {
            ts: rfc3339(epoch),
            kind: "drop",
            netns: d.netns,
            netns_name: ns.and_then(|n| n.name),
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
            finding: None,
        };
        r.finding = diagnosis::explain(&DropFacts {
            reason: r.reason.as_deref(),
            ifname: &r.ifname,
            netns: r.netns_name.as_deref(),
            src: r.src(),
            dst: r.dst(),
            location: Some(&r.location),
        });
        r
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
        let mut c = Cidr::zeroed();
        match addr {
            std::net::IpAddr::V4(a) => {
                c.family = AF_INET;
                c.addr[..4].copy_from_slice(&a.octets());
            }
            std::net::IpAddr::V6(a) => {
                c.family = AF_INET6;
                c.addr = a.octets();
            }
        }
        c.prefix_len = *len;
        f.hosts[i] = c;
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
