//! The incident bundle on disk (docs/bundle.md): gzip-compressed JSON
//! lines, a [`Header`] first, then [`Line`]s in the order the session met
//! them, the accounting last. Writing and reading only; what the lines
//! mean is the session's (recording) and the replay node's.
use std::{
    collections::HashMap,
    fs::File,
    io::{self, BufRead as _, BufReader, BufWriter, Write},
    path::Path,
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use flate2::{read::MultiGzDecoder, write::GzEncoder, Compression};
use kdrop_common::{Counters, FollowStats};
use serde::{Deserialize, Serialize};

use crate::{
    kernel::facts::{CtNames, Reasons},
    model::{
        packet::{CtSeen, Destroyed},
        stats::Stats,
    },
};

/// The bundle's schema. Readers accept every version up to theirs;
/// a change that old readers would misread takes a new number.
pub const SCHEMA: u32 = 1;
/// What the first line's `format` says.
pub const FORMAT: &str = "kdrop-bundle";

/// What was true for the whole recording.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub schema: u32,
    /// kdrop's version that wrote it.
    pub kdrop: String,
    /// `uname -r`, `uname -v` and the node's name.
    pub kernel_release: String,
    pub kernel_version: String,
    pub hostname: String,
    /// CLOCK_REALTIME ns when recording began.
    pub started_realtime_ns: u64,
    /// The kernel's `enum skb_drop_reason` and conntrack status names.
    pub reasons: Reasons,
    pub ct_names: CtNames,
    /// The rung each netfilter function's verdicts came through.
    pub nf_rungs: HashMap<String, String>,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC at start: event times in RFC 3339.
    pub realtime_offset_ns: i128,
    /// What the readiness line said was attached, and what was missing.
    pub probes: String,
    pub missing: Vec<String>,
    /// The command line's filter and output, as given.
    pub args: Vec<String>,
    /// `--count`: the live run printed at most this many records.
    pub count: Option<u64>,
}

/// One step of the session, in the order it happened.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Line {
    /// A ring buffer record as the kernel wrote it (hex), read at `at`
    /// (CLOCK_MONOTONIC ns).
    Ring { at: u64, hex: String },
    /// A ctnetlink NEW event (a NAT'd entry confirmed), handled at `now`,
    /// the session busy `late` ns before it read it (absent: recorded
    /// before kdrop measured it).
    CtNew {
        now: u64,
        #[serde(default)]
        late: u64,
        seen: CtSeen,
    },
    /// The points that show SYNs leaving devices were armed at `since`
    /// (None: disarmed): when a retransmission could be seen.
    Watched { since: Option<u64> },
    /// A ctnetlink DESTROY event of an entry that never saw a reply.
    CtDestroyed { at: u64, destroyed: Destroyed },
    /// Held records were looked at with this clock (None: all released,
    /// at exit).
    Due { now: Option<u64> },
    /// The listen watch polled at `now`, watching `netns` (0: every
    /// namespace with a listener on `ports`) and `ports` (empty: all).
    Listen {
        now: u64,
        netns: u32,
        ports: Vec<u16>,
    },
    /// What the node answered to question `q` (a JSON array: the method
    /// and its arguments), from this line on, until another answer.
    Answer { q: String, a: serde_json::Value },
    /// A large answer (a routing context, a netfilter snapshot), once,
    /// referred to by `id` from answers.
    Blob { id: u64, v: serde_json::Value },
    /// The accounting at the end.
    Stats(StatsLine),
    /// Recording stopped before the run did: the size cap.
    Truncated { reason: String },
}

/// Kernel counters of one source.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct CountersLine {
    pub matched: u64,
    pub emitted: u64,
    pub lost: u64,
    pub sampled_out: u64,
    pub capped: u64,
}

impl From<&Counters> for CountersLine {
    fn from(c: &Counters) -> Self {
        Self {
            matched: c.matched,
            emitted: c.emitted,
            lost: c.lost,
            sampled_out: c.sampled_out,
            capped: c.capped,
        }
    }
}

impl From<&CountersLine> for Counters {
    fn from(c: &CountersLine) -> Self {
        Counters {
            matched: c.matched,
            emitted: c.emitted,
            lost: c.lost,
            sampled_out: c.sampled_out,
            capped: c.capped,
        }
    }
}

/// [`Stats`] as the bundle keeps it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatsLine {
    pub drops: CountersLine,
    pub egress: CountersLine,
    pub verdicts: CountersLine,
    pub retrans: CountersLine,
    pub follow_admitted: u64,
    pub follow_inserted: u64,
    pub follow_full: u64,
    /// On-demand points armed: name, how often, for how many ns.
    pub armed: Vec<(String, u32, u64)>,
    pub undecodable: u64,
    pub ct_received: u64,
    pub ct_overruns: u64,
    #[serde(default)]
    pub answered_by_tcp: u64,
    pub elapsed_ns: u64,
}

impl From<&Stats> for StatsLine {
    fn from(s: &Stats) -> Self {
        Self {
            drops: (&s.drops).into(),
            egress: (&s.egress).into(),
            verdicts: (&s.verdicts).into(),
            retrans: (&s.retrans).into(),
            follow_admitted: s.follow.admitted,
            follow_inserted: s.follow.inserted,
            follow_full: s.follow.full,
            armed: s
                .armed
                .iter()
                .map(|(p, n, d)| (p.clone(), *n, d.as_nanos() as u64))
                .collect(),
            undecodable: s.undecodable,
            ct_received: s.ct_received,
            ct_overruns: s.ct_overruns,
            answered_by_tcp: s.answered_by_tcp,
            elapsed_ns: s.elapsed.as_nanos() as u64,
        }
    }
}

impl From<&StatsLine> for Stats {
    fn from(s: &StatsLine) -> Self {
        Stats {
            drops: (&s.drops).into(),
            egress: (&s.egress).into(),
            verdicts: (&s.verdicts).into(),
            retrans: (&s.retrans).into(),
            follow: FollowStats {
                admitted: s.follow_admitted,
                inserted: s.follow_inserted,
                full: s.follow_full,
            },
            armed: s
                .armed
                .iter()
                .map(|(p, n, d)| (p.clone(), *n, Duration::from_nanos(*d)))
                .collect(),
            undecodable: s.undecodable,
            ct_received: s.ct_received,
            ct_overruns: s.ct_overruns,
            answered_by_tcp: s.answered_by_tcp,
            elapsed: Duration::from_nanos(s.elapsed_ns),
        }
    }
}

impl StatsLine {
    /// Matched records that never reached the bundle, per source: lost
    /// (ring full), sampled out, capped; and what userspace lost.
    pub fn loss(&self) -> String {
        let src = |name: &str, c: &CountersLine| {
            format!(
                "{name}: {} matched, {} recorded, {} lost (ring full), {} sampled out, {} capped",
                c.matched, c.emitted, c.lost, c.sampled_out, c.capped
            )
        };
        [
            src("drops", &self.drops),
            src("egress", &self.egress),
            src("netfilter verdicts", &self.verdicts),
            src("retransmissions", &self.retrans),
            format!(
                "ctnetlink: {} destroy events read, {} socket overruns; {} undecodable ring records",
                self.ct_received, self.ct_overruns, self.undecodable
            ),
        ]
        .join("\n")
    }

    /// Matched records of every source that never reached the bundle.
    pub fn missing(&self) -> u64 {
        [&self.drops, &self.egress, &self.verdicts, &self.retrans]
            .iter()
            .map(|c| c.lost + c.sampled_out + c.capped)
            .sum::<u64>()
            + self.ct_overruns
            + self.undecodable
    }
}

/// Bytes written so far, after compression.
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A bundle being written.
pub struct TapeWriter {
    gz: GzEncoder<Counting<BufWriter<File>>>,
    /// Stop taking lines past this many compressed bytes.
    cap: u64,
    pub full: bool,
}

impl TapeWriter {
    pub fn create(path: &Path, cap: u64, header: &Header) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let counting = Counting {
            inner: BufWriter::new(file),
            written: 0,
        };
        let mut w = Self {
            gz: GzEncoder::new(counting, Compression::default()),
            cap,
            full: false,
        };
        w.json(header)?;
        Ok(w)
    }

    fn json<T: Serialize>(&mut self, v: &T) -> Result<()> {
        serde_json::to_writer(&mut self.gz, v).context("writing the bundle")?;
        self.gz.write_all(b"\n").context("writing the bundle")?;
        Ok(())
    }

    /// Appends a line; past the size cap, marks the bundle full instead.
    pub fn write(&mut self, line: &Line) -> Result<()> {
        if self.full {
            return Ok(());
        }
        self.json(line)?;
        if self.gz.get_ref().written >= self.cap {
            self.full = true;
            self.json(&Line::Truncated {
                reason: format!("size cap of {} bytes reached", self.cap),
            })?;
        }
        Ok(())
    }

    /// The accounting, then the end of the gzip stream.
    pub fn finish(mut self, stats: &Stats) -> Result<u64> {
        self.json(&Line::Stats(stats.into()))?;
        let mut counting = self.gz.finish().context("finishing the bundle")?;
        counting.flush().context("writing the bundle")?;
        Ok(counting.written)
    }
}

/// A bundle read back: its header and its lines; `cut` says why reading
/// stopped early (a recording killed before it finished).
pub struct Tape {
    pub header: Header,
    pub lines: Vec<Line>,
    pub cut: Option<String>,
}

/// Reads a whole bundle. A damaged or unfinished tail ends the lines read
/// so far (and says so in `cut`); a wrong header is an error.
pub fn read(path: &Path) -> Result<Tape> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut lines = BufReader::new(MultiGzDecoder::new(BufReader::new(file))).lines();
    let first = match lines.next() {
        Some(Ok(l)) => l,
        Some(Err(e)) => bail!("{} is not a kdrop bundle: {e}", path.display()),
        None => bail!("{} is empty", path.display()),
    };
    let header: Header = serde_json::from_str(&first)
        .with_context(|| format!("{} is not a kdrop bundle (bad header)", path.display()))?;
    if header.format != FORMAT {
        bail!(
            "{} is not a kdrop bundle (format {:?})",
            path.display(),
            header.format
        );
    }
    if header.schema > SCHEMA {
        bail!(
            "{} has schema {}; this kdrop reads up to {SCHEMA}: use a newer kdrop",
            path.display(),
            header.schema
        );
    }
    let mut out = Vec::new();
    let mut cut = None;
    for (n, l) in lines.enumerate() {
        let l = match l {
            Ok(l) => l,
            Err(e) => {
                cut = Some(format!("line {}: {e}", n + 2));
                break;
            }
        };
        match serde_json::from_str::<Line>(&l) {
            Ok(line) => out.push(line),
            Err(e) => {
                cut = Some(format!("line {}: {e}", n + 2));
                break;
            }
        }
    }
    Ok(Tape {
        header,
        lines: out,
        cut,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_round_trip() {
        let s = StatsLine {
            drops: CountersLine {
                matched: 10,
                emitted: 7,
                lost: 2,
                sampled_out: 1,
                capped: 0,
            },
            ct_overruns: 3,
            ..Default::default()
        };
        let back = StatsLine::from(&Stats::from(&s));
        assert_eq!(back.drops.matched, 10);
        assert_eq!(back.missing(), 6);
        assert!(s.loss().contains("drops: 10 matched, 7 recorded, 2 lost"));
    }

    fn header() -> Header {
        Header {
            format: FORMAT.into(),
            schema: SCHEMA,
            kdrop: "test".into(),
            kernel_release: "6.18".into(),
            kernel_version: String::new(),
            hostname: "node".into(),
            started_realtime_ns: 0,
            reasons: Reasons::from_pairs([("IP_RPFILTER", 16)]),
            ct_names: CtNames::default(),
            nf_rungs: HashMap::new(),
            realtime_offset_ns: 0,
            probes: String::new(),
            missing: vec![],
            args: vec![],
            count: None,
        }
    }

    #[test]
    fn the_size_cap_ends_the_bundle_readably() {
        let path = std::env::temp_dir().join(format!("kdrop-tape-{}", std::process::id()));
        let mut w = TapeWriter::create(&path, 1, &header()).unwrap();
        w.write(&Line::Due { now: Some(1) }).unwrap();
        assert!(w.full);
        w.write(&Line::Due { now: Some(2) }).unwrap();
        w.finish(&Stats::default()).unwrap();
        let t = read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(t.header.reasons.name(16).as_deref(), Some("IP_RPFILTER"));
        assert!(t.cut.is_none());
        assert!(matches!(t.lines[0], Line::Due { now: Some(1) }));
        assert!(matches!(t.lines[1], Line::Truncated { .. }));
        assert!(matches!(t.lines[2], Line::Stats(_)));
        assert_eq!(t.lines.len(), 3, "nothing past the cap");
    }

    #[test]
    fn newer_schemas_and_other_files_are_refused() {
        let path = std::env::temp_dir().join(format!("kdrop-tape2-{}", std::process::id()));
        let mut h = header();
        h.schema = SCHEMA + 1;
        TapeWriter::create(&path, 1 << 20, &h)
            .unwrap()
            .finish(&Stats::default())
            .unwrap();
        let e = read(&path).err().unwrap();
        assert!(format!("{e:#}").contains("use a newer kdrop"), "{e:#}");
        std::fs::write(&path, b"plain text").unwrap();
        assert!(format!("{:#}", read(&path).err().unwrap()).contains("not a kdrop bundle"));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn lines_are_tagged() {
        let l = Line::Due { now: Some(5) };
        assert_eq!(serde_json::to_string(&l).unwrap(), r#"{"t":"due","now":5}"#);
        let l: Line = serde_json::from_str(r#"{"t":"ring","at":1,"hex":"00ff"}"#).unwrap();
        assert!(matches!(l, Line::Ring { at: 1, ref hex } if hex == "00ff"));
    }

    /// Bundles recorded before the session measured how late it read a NEW
    /// event replay it as read at once, as those sessions took it.
    #[test]
    fn a_ct_new_line_without_its_lateness_is_read_as_on_time() {
        let old = r#"{"t":"ct_new","now":7,"seen":{"netns":9,"ct":{
            "orig":{"src":"10.0.0.1:40000","dst":"10.96.0.10:80"},
            "reply":{"src":"10.1.0.5:8080","dst":"10.0.0.1:40000"},
            "status":8,"mark":0,"zone":0,"ctinfo":0},"tcp_state":null,"timeout_s":120}}"#;
        let l: Line = serde_json::from_str(old).unwrap();
        assert!(matches!(l, Line::CtNew { now: 7, late: 0, ref seen } if seen.netns == 9));
        let text = serde_json::to_string(&l).unwrap();
        assert!(text.contains(r#""now":7,"late":0,"#), "{text}");
    }
}
