//! `--pcap FILE.pcapng`: each drop record's packet, as the kernel copied
//! it, with the record's reason, location and cause in the comment.
use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    io::{BufWriter, Write as _},
    path::Path,
};

use anyhow::{Context as _, Result};
use kdrop_common::HEAD_BYTES;

use crate::{
    model::{packet::Head, record::DropRecord, stats::Stats},
    output::pcapng,
};

/// Packets waiting for their record (a drop may be held a moment).
const HEADS_KEPT: usize = 4096;

pub struct Capture {
    out: BufWriter<File>,
    /// Interface ids by (namespace, ifindex).
    ifaces: HashMap<(u32, u32), u32>,
    heads: HashMap<(u32, u64), Vec<u8>>,
    order: VecDeque<(u32, u64)>,
    realtime_offset_ns: i128,
    pub written: u64,
    /// Drop records whose bytes never came (the copy's reservation failed).
    pub without_bytes: u64,
}

impl Capture {
    pub fn create(path: &Path, realtime_offset_ns: i128) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::new(file);
        out.write_all(&pcapng::section_header(concat!(
            "kdrop ",
            env!("CARGO_PKG_VERSION")
        )))
        .context("writing the pcapng")?;
        Ok(Self {
            out,
            ifaces: HashMap::new(),
            heads: HashMap::new(),
            order: VecDeque::new(),
            realtime_offset_ns,
            written: 0,
            without_bytes: 0,
        })
    }

    /// A packet's bytes, until its record comes.
    pub fn head(&mut self, h: &Head) {
        if self.order.len() >= HEADS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.heads.remove(&old);
            }
        }
        let key = (h.cpu, h.ts_ns);
        self.order.push_back(key);
        self.heads.insert(key, h.bytes.clone());
    }

    /// The record's packet, if its bytes came.
    pub fn record(&mut self, r: &DropRecord) -> Result<()> {
        let Some(key) = r.packet else { return Ok(()) };
        let Some(bytes) = self.heads.remove(&key) else {
            self.without_bytes += 1;
            return Ok(());
        };
        let iface = match self.ifaces.get(&(r.netns, r.ifindex)) {
            Some(id) => *id,
            None => {
                let id = self.ifaces.len() as u32;
                let ns = r.netns_name.clone().unwrap_or_else(|| r.netns.to_string());
                let block = pcapng::interface(
                    &format!("{ns}/{}", r.ifname),
                    &format!(
                        "netns {ns} (inode {}), interface {} (index {})",
                        r.netns, r.ifname, r.ifindex
                    ),
                    HEAD_BYTES as u32,
                );
                self.out.write_all(&block).context("writing the pcapng")?;
                self.ifaces.insert((r.netns, r.ifindex), id);
                id
            }
        };
        let (caplen, orig) = pcapng::ip_lengths(&bytes);
        let ts = (i128::from(key.1) + self.realtime_offset_ns).max(0) as u64;
        let block = pcapng::packet(iface, ts, &bytes[..caplen], orig, &comment(r));
        self.out.write_all(&block).context("writing the pcapng")?;
        self.written += 1;
        Ok(())
    }

    /// What never reached the file, in the first interface's statistics.
    pub fn finish(mut self, stats: &Stats) -> Result<()> {
        let d = &stats.drops;
        let lost = d.lost + d.sampled_out + d.capped + self.without_bytes;
        if !self.ifaces.is_empty() {
            let text = format!(
                "kdrop: {} drops matched, {} in this file; {lost} never reached it ({} lost with the ring full, {} sampled out, {} capped, {} without their bytes)",
                d.matched, self.written, d.lost, d.sampled_out, d.capped, self.without_bytes
            );
            let now = (i128::from(crate::enrich::monotonic_ns()) + self.realtime_offset_ns).max(0);
            let block = pcapng::statistics(0, now as u64, lost, &text);
            self.out.write_all(&block).context("writing the pcapng")?;
        }
        self.out.flush().context("writing the pcapng")
    }
}

/// `IP_RPFILTER at ip_rcv_finish_core+0x1a3; rp_filter_strict: <summary>`.
fn comment(r: &DropRecord) -> String {
    let mut c = format!(
        "{} at {}",
        r.reason.as_deref().unwrap_or("no drop reason"),
        r.location
    );
    if let Some(f) = &r.finding {
        c.push_str(&format!("; {}: {}", f.cause, f.summary));
    }
    c
}
