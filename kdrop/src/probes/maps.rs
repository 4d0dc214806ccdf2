//! Reading the programs' maps: the ring buffer, the per-CPU counters, monitor
//! mode's aggregation.
use anyhow::{Context as _, Result};
use aya::maps::{PerCpuArray, PerCpuHashMap, RingBuf};
use kdrop_common::{AggKey, Counters, COUNTERS_KEY, EGRESS_COUNTERS_KEY};

use super::Probes;

impl Probes {
    pub fn take_events(&mut self) -> Result<RingBuf<aya::maps::MapData>> {
        let map = self.ebpf.take_map("EVENTS").context("EVENTS map missing")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Drop counters summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        self.counters_at(COUNTERS_KEY)
    }

    /// Egress handshake packet counters summed over CPUs.
    pub fn egress_counters(&self) -> Result<Counters> {
        self.counters_at(EGRESS_COUNTERS_KEY)
    }

    /// Netfilter verdict record counters summed over CPUs.
    pub fn verdict_counters(&self) -> Result<Counters> {
        self.counters_at(kdrop_common::NF_VERDICT_COUNTERS_KEY)
    }

    fn counters_at(&self, key: u32) -> Result<Counters> {
        let map = self.ebpf.map("COUNTERS").context("COUNTERS map missing")?;
        let arr = PerCpuArray::<_, Counters>::try_from(map)?;
        let mut sum = Counters::default();
        for c in arr.get(&key, 0)?.iter() {
            sum.matched += c.matched;
            sum.emitted += c.emitted;
            sum.lost += c.lost;
            sum.sampled_out += c.sampled_out;
            sum.capped += c.capped;
        }
        Ok(sum)
    }

    /// Monitor mode's per-key drop counts, summed over CPUs.
    pub fn aggregate(&self) -> Result<Vec<(AggKey, u64)>> {
        let map = self
            .ebpf
            .map("AGGREGATE")
            .context("AGGREGATE map missing")?;
        let agg = PerCpuHashMap::<_, AggKey, u64>::try_from(map)?;
        let mut out = Vec::new();
        for item in agg.iter() {
            // A key deleted mid-walk is skipped; nothing deletes here.
            let Ok((k, v)) = item else { continue };
            out.push((k, v.iter().sum()));
        }
        Ok(out)
    }
}
