//! kdrop's kernel side from userspace: what the running kernel offers
//! (setup), the probe points and their ladders (ladder), aya's loader
//! (loader), loading (load, verify)
//! and attaching (attach), the maps (maps), privileges.
pub mod arm;
pub mod attach;
pub mod ladder;
pub mod load;
pub mod loader;
pub mod maps;
pub mod nf;
pub mod privileges;
pub mod setup;
pub mod verify;

use anyhow::Result;
use aya::Ebpf;

pub use self::{
    ladder::{outcome_text, Demand, Outcome, ProbeReport, Rung},
    load::{load, Config},
    privileges::check_privileges,
    setup::{btf_path, KernelSetup},
};

/// Loaded programs and maps. Dropping it detaches and unloads everything.
pub struct Probes {
    pub ebpf: Ebpf,
    pub reports: Vec<ProbeReport>,
    points: Vec<arm::PointState>,
}

impl Probes {
    /// `fib_validate_source (return), the source validation result: fexit
    /// refused: ...; kretprobe refused: ...` for each point that did not attach.
    pub fn missing(&self) -> Vec<String> {
        self.reports
            .iter()
            .filter(|r| r.chosen().is_none())
            .map(|r| {
                let why: Vec<String> = r
                    .rungs
                    .iter()
                    .map(|(rung, o)| format!("{rung} {}", outcome_text(o)))
                    .collect();
                format!("{} ({}): {}", r.point, r.what, why.join("; "))
            })
            .collect()
    }

    /// `skb:kfree_skb via tp_btf, ...; on demand: fib:fib_table_lookup via
    /// tp_btf (routes), ...`: the points that attached, those always
    /// attached first.
    pub fn describe(&self) -> String {
        let list = |on_demand: bool| {
            self.reports
                .iter()
                .filter(|r| r.demand.is_some() == on_demand)
                .filter_map(|r| {
                    let via = format!("{} via {}", r.point, r.chosen()?);
                    Some(match r.demand {
                        Some(d) => format!("{via} ({d})"),
                        None => via,
                    })
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (always, demand) = (list(false), list(true));
        if demand.is_empty() {
            always
        } else {
            format!("{always}; on demand: {demand}")
        }
    }

    /// Arms every available point of `demand`; how many were armed now.
    pub fn arm(&mut self, demand: Demand) -> Result<usize> {
        let mut n = 0;
        let mut refused = Vec::new();
        for p in self.points.iter_mut().filter(|p| p.demand == Some(demand)) {
            // One point the kernel refuses does not keep the others off.
            match p.arm(&mut self.ebpf) {
                Ok(armed) => n += usize::from(armed),
                Err(e) => refused.push(format!("{}: {e:#}", p.name)),
            }
        }
        if refused.is_empty() {
            return Ok(n);
        }
        let why = refused.join("; ");
        if n == 0 {
            anyhow::bail!("{why}");
        }
        log::warn!("arming the {demand} points: left without {why}");
        Ok(n)
    }

    /// Disarms every point of `demand`.
    pub fn disarm(&mut self, demand: Demand) -> Result<()> {
        for p in self.points.iter_mut().filter(|p| p.demand == Some(demand)) {
            p.disarm(&mut self.ebpf)?;
        }
        Ok(())
    }

    /// Does any available point serve `demand`?
    pub fn serves(&self, demand: Demand) -> bool {
        self.points
            .iter()
            .any(|p| p.demand == Some(demand) && p.available())
    }

    /// For each on-demand point that was armed: its name, how often, and
    /// how long in all.
    pub fn armed(&self) -> Vec<(&'static str, u32, std::time::Duration)> {
        self.points
            .iter()
            .filter(|p| p.armed_times > 0)
            .map(|p| (p.name, p.armed_times, p.armed_for()))
            .collect()
    }
}
