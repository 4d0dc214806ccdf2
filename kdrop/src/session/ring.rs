//! Reading the ring buffer: batches of records, decoded in ring order.
use std::time::Duration;

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::{event, model::packet::Event};

/// The longest a record waits for the reader when it was not allowed to
/// wake it (kdrop-ebpf/src/drop.rs, wakeup_flags).
const READ_TICK: Duration = Duration::from_millis(20);
/// A batch at least this large means a flood...
const BUSY_BATCH: usize = 32;
/// ...and the reader then pauses this long between reads (the default ring
/// holds ~12k records: 2 ms of a 500k/s flood fits several times over).
const BUSY_PAUSE: Duration = Duration::from_millis(2);

pub struct Ring {
    events: AsyncFd<RingBuf<MapData>>,
    /// Records that did not decode (a kernel/userspace mismatch).
    pub undecodable: u64,
    /// The last batch was large: pause before the next read.
    busy: bool,
    /// When recording: each decoded record's bytes, in batch order.
    raw: Option<Vec<Vec<u8>>>,
}

impl Ring {
    /// `keep_raw`: keep each record's bytes for the bundle.
    pub fn new(ring: RingBuf<MapData>, keep_raw: bool) -> Result<Self> {
        // SAFETY: the RingBuf owns its fd and lives inside the AsyncFd, so
        // the fd stays open for as long as it is registered.
        let events = unsafe { AsyncFd::register(ring) }
            .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
        Ok(Self {
            events,
            undecodable: 0,
            busy: false,
            raw: keep_raw.then(Vec::new),
        })
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
            let batch = drain_ring(guard.get_inner_mut(), &mut self.undecodable, &mut self.raw);
            guard.clear_ready();
            if !batch.is_empty() {
                self.busy = batch.len() >= BUSY_BATCH;
                return Ok(batch);
            }
        }
    }

    /// Whatever is on the ring buffer now, without waiting.
    pub fn drain(&mut self) -> Vec<Event> {
        drain_ring(self.events.get_mut(), &mut self.undecodable, &mut self.raw)
    }

    /// The bytes of the records decoded since the last call, in order
    /// (empty unless recording).
    pub fn take_raw(&mut self) -> Vec<Vec<u8>> {
        self.raw.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

/// Events in ring order.
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    undecodable: &mut u64,
    raw: &mut Option<Vec<Vec<u8>>>,
) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        match event::decode(&item) {
            Ok(e) => {
                if let Some(raw) = raw.as_mut() {
                    raw.push(item.to_vec());
                }
                out.push(e)
            }
            Err(e) => {
                *undecodable += 1;
                log::debug!("{e}");
            }
        }
    }
    out
}
