//! One variant in one round: start the tool, run the workload once, stop
//! the tool, check what must hold (kdrop's accounts, the healthy traffic's
//! health), and express the work done per CPU second and per wall second.
use anyhow::{bail, Result};

use super::{
    health::{self, Counters},
    routed::{Routed, Work},
    tools::{Running, Stopped},
    topo::Topo,
    variants::Variant,
    Opts,
};

/// What a workload's tables call things.
pub struct Kind {
    pub key: &'static str,
    pub title: &'static str,
    /// The unit of work, as the tables print it.
    pub unit: &'static str,
    /// The CPU-time figure's column, and whose CPU time it divides by.
    pub lead: &'static str,
    pub wall: &'static str,
}

pub const FLOOD: Kind = Kind {
    key: "flood",
    title: "SYN flood through a veth, the node drops with iptables",
    unit: "SYN",
    lead: "pps per flood CPU s",
    wall: "pps (wall)",
};
pub const H1: Kind = Kind {
    key: "h1",
    title: "h1: 64-byte UDP datagrams, client -> router (forwarding) -> server, none dropped",
    unit: "pkt",
    lead: "pkts per sender CPU s",
    wall: "pkts/s (wall)",
};
pub const H2: Kind = Kind {
    key: "h2",
    title: "h2: TCP connection churn (connect, write 1 byte, close) through the router",
    unit: "conn",
    lead: "conns per client+server CPU s",
    wall: "conns/s (wall)",
};
pub const H3: Kind = Kind {
    key: "h3",
    title: "h3: one TCP bulk stream (64 KiB writes, the server discards) through the router",
    unit: "MB",
    lead: "MB per client+server CPU s",
    wall: "MB/s (wall)",
};

/// The workload a round runs.
#[derive(Clone, Copy)]
pub enum Load<'a> {
    Flood(&'a Topo),
    Healthy(&'a Routed, Work),
}

impl Load<'_> {
    pub fn kind(&self) -> &'static Kind {
        match self {
            Load::Flood(_) => &FLOOD,
            Load::Healthy(_, Work::Udp) => &H1,
            Load::Healthy(_, Work::Churn) => &H2,
            Load::Healthy(_, Work::Stream) => &H3,
        }
    }
}

/// One variant in one round.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Units of work per second of the CPU time of the threads doing it
    /// (see Kind::lead), which holds the kernel's path for every packet
    /// (softirq in their context): what CPUs given to the workload alone
    /// would do. Other work on the shared machine hardly moves it.
    pub rate_cpu: f64,
    /// The same per second of wall time: what this machine did, with
    /// whatever else ran on the workload's CPUs meanwhile.
    pub rate: f64,
    /// Each over the baselines right before and after.
    pub ratio_cpu: f64,
    pub ratio: f64,
    pub ready_ms: Option<f64>,
    pub stopped: Option<Stopped>,
    pub secs: f64,
    /// Units of work done in this run.
    pub units: f64,
    /// TCP segments retransmitted in the workload's namespaces.
    pub retrans: u64,
    /// Of the run's wall time: how much the workload's threads ran (both
    /// on one CPU: at most 1) and how long the client waited, runnable, for
    /// the CPU (others' work, or its own server's).
    pub on_cpu: f64,
    pub client_waited: f64,
    /// Share of the workload CPUs' softirq work that ksoftirqd did, out of
    /// the lead threads' CPU time plus it.
    pub softirqd: f64,
}

/// A healthy run that was not: the measurement would include drops.
#[derive(Debug)]
pub struct Unhealthy(pub String);

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unhealthy {}

pub fn measure(v: &Variant, load: Load, o: &Opts) -> Result<Sample> {
    let tracer = match v.tool {
        Some(_) => Some(Running::start(v, o.cpu)?),
        None => None,
    };
    let ready_ms = tracer.as_ref().map(|t| t.ready.as_secs_f64() * 1e3);
    let mut s = match load {
        Load::Flood(topo) => {
            let before = topo.dropped()?;
            let sent = topo.flood(o.secs, o.count, Some(o.cpu))?;
            let dropped = topo.dropped()? - before;
            let secs = sent.elapsed.as_secs_f64();
            let stopped = tracer.map(Running::stop).transpose()?;
            if let Some([m, ..]) = stopped.as_ref().and_then(|s| s.kdrop) {
                // When it matches every drop, against the independent count.
                if v.key != "b" && m != dropped {
                    bail!(
                        "({}) kdrop matched {m}, the node's DROP rule counted {dropped}",
                        v.key
                    );
                }
            }
            Sample {
                rate_cpu: dropped as f64 / sent.cpu.as_secs_f64().max(1e-9),
                rate: dropped as f64 / secs,
                on_cpu: sent.cpu.as_secs_f64() / secs.max(1e-9),
                units: dropped as f64,
                secs,
                stopped,
                ..blank()
            }
        }
        Load::Healthy(routed, work) => {
            let cpus = [o.cpu];
            let before = Counters::read(&routed.all())?;
            let sirq0 = health::softirqd_secs(&cpus);
            let done = routed.run(work, o.secs, o.count, o.cpu)?;
            let sirq = health::softirqd_secs(&cpus) - sirq0;
            let after = Counters::read(&routed.all())?;
            let stopped = tracer.map(Running::stop).transpose()?;
            let drops = after.drops_since(&before);
            if !drops.is_empty() || done.received != done.sent {
                return Err(Unhealthy(format!(
                    "({}/{}) the healthy workload was not: sent {}, received {}; counters moved: {}",
                    load.kind().key,
                    v.key,
                    done.sent,
                    done.received,
                    if drops.is_empty() { "none".into() } else { drops.join(", ") }
                ))
                .into());
            }
            // The sender's thread carries every packet's whole path (the
            // receiver only copies datagrams out); for TCP both ends send.
            let lead = match work {
                Work::Udp => done.client_cpu,
                Work::Churn | Work::Stream => done.client_cpu + done.server_cpu,
            }
            .as_secs_f64();
            let units = match work {
                Work::Stream => done.received as f64 / 1e6,
                Work::Udp | Work::Churn => done.received as f64,
            };
            let secs = done.elapsed.as_secs_f64();
            Sample {
                rate_cpu: units / lead.max(1e-9),
                rate: units / secs.max(1e-9),
                units,
                secs,
                stopped,
                retrans: after.moved(&before, health::RETRANS),
                softirqd: sirq / (lead + sirq).max(1e-9),
                on_cpu: (done.client_cpu + done.server_cpu).as_secs_f64() / secs.max(1e-9),
                client_waited: done.client_wait.as_secs_f64() / secs.max(1e-9),
                ..blank()
            }
        }
    };
    s.ready_ms = ready_ms;
    if let Some(st) = &s.stopped {
        for a in &st.accounts {
            a.check()
                .map_err(|e| anyhow::anyhow!("({}/{}) {e}", load.kind().key, v.key))?;
        }
    }
    Ok(s)
}

fn blank() -> Sample {
    Sample {
        rate_cpu: 0.0,
        rate: 0.0,
        ratio_cpu: 1.0,
        ratio: 1.0,
        ready_ms: None,
        stopped: None,
        secs: 0.0,
        units: 0.0,
        retrans: 0,
        softirqd: 0.0,
        on_cpu: 0.0,
        client_waited: 0.0,
    }
}
