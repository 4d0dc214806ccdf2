//! On-demand points: attached while their evidence is wanted, detached
//! otherwise, so healthy traffic does not pay for them.
use std::time::{Duration, Instant};

use anyhow::Result;
use aya::Ebpf;

use super::{
    attach::{attach_loaded, detach, Link},
    ladder::{Attach, Demand},
};

/// A point as loaded: its chosen rung, and whether it is attached now.
pub struct PointState {
    pub name: &'static str,
    pub demand: Option<Demand>,
    chosen: Option<Attach>,
    link: Option<Link>,
    /// Times armed, and for how long in all.
    pub armed_times: u32,
    armed_since: Option<Instant>,
    armed_total: Duration,
}

impl PointState {
    pub fn new(
        name: &'static str,
        demand: Option<Demand>,
        chosen: Option<(Attach, Option<Link>)>,
    ) -> Self {
        let (chosen, link) = match chosen {
            Some((a, l)) => (Some(a), l),
            None => (None, None),
        };
        Self {
            name,
            demand,
            chosen,
            link,
            armed_times: 0,
            armed_since: None,
            armed_total: Duration::ZERO,
        }
    }

    /// Did a rung attach at load time (or load, to attach when armed)?
    pub fn available(&self) -> bool {
        self.chosen.is_some()
    }

    pub fn attached(&self) -> bool {
        self.link.is_some()
    }

    /// Attaches the chosen rung again; false when there is none or it is
    /// attached already.
    pub fn arm(&mut self, ebpf: &mut Ebpf) -> Result<bool> {
        let Some(attach) = self.chosen.filter(|_| self.link.is_none()) else {
            return Ok(false);
        };
        let link = attach_loaded(ebpf, &attach).inspect_err(|_| {
            // Not tried again: a rung loaded, not test-attached at start
            // (a kretprobe), that the kernel refuses now.
            self.chosen = None;
        })?;
        self.link = Some(link);
        self.armed_times += 1;
        self.armed_since = Some(Instant::now());
        Ok(true)
    }

    /// Detaches it; the program stays loaded for the next arming.
    pub fn disarm(&mut self, ebpf: &mut Ebpf) -> Result<bool> {
        let Some(link) = self.link.take() else {
            return Ok(false);
        };
        if let Some(since) = self.armed_since.take() {
            self.armed_total += since.elapsed();
        }
        detach(ebpf, link)?;
        Ok(true)
    }

    /// How long it has been armed in all, up to now.
    pub fn armed_for(&self) -> Duration {
        self.armed_total + self.armed_since.map_or(Duration::ZERO, |s| s.elapsed())
    }
}
