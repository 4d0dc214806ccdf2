//! Reading the programs' maps: the ring buffer, the per-CPU counters, monitor
//! mode's aggregation, the followed connections.
use anyhow::{Context as _, Result};
use aya::maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf};
use kdrop_common::{
    AggKey, Counters, Endpoint, FollowStats, FollowValue, COUNTERS_KEY, EGRESS_COUNTERS_KEY,
    FOLLOW_BY_USER, RETRANS_COUNTERS_KEY,
};

use super::Probes;

/// How long a connection stays followed: a handshake's retransmissions span
/// about 30 s (tcp_syn_retries 6) before the client gives up; its last
/// answers come within this.
pub const FOLLOW_TTL_NS: u64 = 60_000_000_000;

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

    /// Retransmission record counters summed over CPUs.
    pub fn retrans_counters(&self) -> Result<Counters> {
        self.counters_at(RETRANS_COUNTERS_KEY)
    }

    /// The followed connections' accounting, summed over CPUs.
    pub fn follow_stats(&self) -> Result<FollowStats> {
        let map = self
            .ebpf
            .map("FOLLOW_STATS")
            .context("FOLLOW_STATS map missing")?;
        let arr = PerCpuArray::<_, FollowStats>::try_from(map)?;
        let mut sum = FollowStats::default();
        for s in arr.get(&0, 0)?.iter() {
            sum.admitted += s.admitted;
            sum.inserted += s.inserted;
            sum.full += s.full;
        }
        Ok(sum)
    }

    /// Follows a connection by its client's end from now on (userspace's
    /// own reasons: a conntrack entry, a drop).
    pub fn follow(&mut self, e: &Endpoint, now_ns: u64) -> Result<()> {
        let map = self.ebpf.map_mut("FOLLOW").context("FOLLOW map missing")?;
        let mut follow = HashMap::<_, Endpoint, FollowValue>::try_from(map)?;
        let v = FollowValue {
            since_ns: now_ns,
            by: FOLLOW_BY_USER,
            _pad: 0,
        };
        follow.insert(e, v, 0).context("following a connection")?;
        self.set_follow_live(1)
    }

    /// Forgets endpoints followed for longer than `FOLLOW_TTL_NS` and tells
    /// the programs how many are left (none: no map lookups per packet).
    pub fn follow_sweep(&mut self, now_ns: u64) -> Result<()> {
        let map = self.ebpf.map_mut("FOLLOW").context("FOLLOW map missing")?;
        let mut follow = HashMap::<_, Endpoint, FollowValue>::try_from(map)?;
        let entries: Vec<(Endpoint, FollowValue)> = follow.iter().filter_map(Result::ok).collect();
        let mut live = 0u64;
        for (k, v) in entries {
            if now_ns.saturating_sub(v.since_ns) > FOLLOW_TTL_NS {
                // Gone already is as good.
                let _ = follow.remove(&k);
            } else {
                live += 1;
            }
        }
        self.set_follow_live(live)
    }

    fn set_follow_live(&mut self, n: u64) -> Result<()> {
        let map = self
            .ebpf
            .map_mut("FOLLOW_LIVE")
            .context("FOLLOW_LIVE map missing")?;
        let mut live = Array::<_, u64>::try_from(map)?;
        live.set(0, n, 0)?;
        Ok(())
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
