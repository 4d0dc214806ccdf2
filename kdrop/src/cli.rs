//! Command-line interface.
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use clap::{Args, Parser, Subcommand};

/// kdrop explains why TCP handshakes die inside this Linux node: every dropped
/// SYN or SYN-ACK with its 5-tuple, namespace, interface and kernel drop reason.
#[derive(Debug, Parser)]
#[command(name = "kdrop", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub trace: TraceArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Say what this kernel allows: BTF, program types, and for each probe
    /// point the rung kdrop would use and why the ones above it were refused.
    Check,
    /// Reproduce a real incident in throwaway network namespaces, trace it
    /// with kdrop and tear it down.
    Lab(LabArgs),
    /// Run until stopped, cheaply: count every matched drop in the kernel,
    /// serve the counts to Prometheus, write a bounded sample of detailed
    /// events (with findings) as JSON lines.
    Monitor(MonitorArgs),
    /// Trace as `kdrop` does and write an incident bundle: the kernel's
    /// records as received, the node's answers, the accounting.
    Record(RecordArgs),
    /// Print what a recorded run printed, from its bundle alone: any
    /// machine, any user, no BPF.
    Explain(ExplainArgs),
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// The bundle to write (gzip-compressed JSON lines, docs/bundle.md).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,

    /// Stop recording once the bundle holds this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_size: u64,

    #[command(flatten)]
    pub trace: TraceArgs,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A bundle written by `kdrop record`.
    #[arg(value_name = "FILE")]
    pub bundle: PathBuf,

    /// One JSON object per line on stdout.
    #[arg(long)]
    pub json: bool,

    /// Write the recorded packets (a bundle recorded with --pcap) as
    /// pcapng, as the live run did.
    #[arg(long, value_name = "FILE.pcapng")]
    pub pcap: Option<PathBuf>,
}

/// What the kernel lets through: the same flags for `kdrop` and `kdrop monitor`.
#[derive(Debug, Default, Args)]
pub struct FilterArgs {
    /// Only packets to or from this port (repeatable, up to 16).
    #[arg(short, long = "port", value_name = "PORT", value_parser = parse_port)]
    pub ports: Vec<u16>,

    /// Only packets to or from this address or CIDR (repeatable, up to 4).
    #[arg(long = "host", value_name = "ADDR|CIDR", value_parser = parse_cidr)]
    pub hosts: Vec<(IpAddr, u8)>,

    /// Only packets in this network namespace: a name under /run/netns, a
    /// path (/proc/PID/ns/net) or an inode number.
    #[arg(long, value_name = "NAME|PATH")]
    pub netns: Option<String>,

    /// Only packets on this interface (of --netns if given, else kdrop's own).
    #[arg(long, value_name = "NAME")]
    pub iface: Option<String>,

    /// Every dropped TCP packet, not only handshake packets (SYN, SYN-ACK).
    #[arg(long)]
    pub all_flags: bool,

    /// Emit 1 in N matched drops as an event, chosen in the kernel per CPU
    /// (the others are counted as sampled out); 1 emits all.
    #[arg(long, visible_alias = "sample-every", value_name = "N", default_value_t = 1,
          value_parser = parse_sample)]
    pub sample: u32,
}

#[derive(Debug, Args)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub filter: FilterArgs,

    /// Address of the Prometheus endpoint (GET /metrics). Loopback by
    /// default: exposing it is a decision, e.g. --listen 0.0.0.0:9464.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,

    /// At most N detailed events per second per CPU (0: no cap).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub events_per_sec: u32,

    /// Append the JSON lines to FILE instead of writing them to stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Most kdrop_drops_total series; later label sets count into one
    /// series whose labels are all "overflow".
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub max_series: u32,

    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Ring buffer size in KiB (a power of two, at least 4).
    #[arg(long, value_name = "KIB", default_value_t = 256, value_parser = parse_ring_kib)]
    pub ring_size: u32,

    /// Also follow forwarded NAT'd handshakes through conntrack's events
    /// (ctnetlink NEW and DESTROY): the kernel then builds a message for
    /// every new connection it tracks, a cost on healthy traffic.
    #[arg(long)]
    pub conntrack_events: bool,
}

#[derive(Debug, Args)]
pub struct LabArgs {
    /// Which incident to reproduce.
    #[arg(value_enum, default_value_t = LabName::RpFilter)]
    pub name: LabName,
    /// Print events as JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabName {
    /// Incident 1: strict rp_filter drops a SYN that arrives on a secondary
    /// interface when the way back to the client is via the primary one.
    RpFilter,
}

#[derive(Debug, Default, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub filter: FilterArgs,

    /// One JSON object per line on stdout.
    #[arg(long)]
    pub json: bool,

    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Stop after this many events.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,

    /// Ring buffer size in KiB (a power of two, at least 4).
    #[arg(long, value_name = "KIB", default_value_t = 1024, value_parser = parse_ring_kib)]
    pub ring_size: u32,

    /// Do not listen to conntrack's events (ctnetlink NEW and DESTROY): no
    /// cost per new connection, but a forwarded NAT'd handshake that dies
    /// without a drop or a local retransmission here goes unnamed.
    #[arg(long)]
    pub no_conntrack_events: bool,

    /// Also write each dropped packet's first 128 bytes (copied in the
    /// kernel) as pcapng, with its reason, location and cause in the
    /// packet comment.
    #[arg(long, value_name = "FILE.pcapng")]
    pub pcap: Option<PathBuf>,
}

fn parse_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) => Err("port 0 matches nothing".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("not a port (1-65535): {s}")),
    }
}

/// `10.0.0.0/8`, `2001:db8::/32`, or a bare address (a /32 or /128).
pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("not an address or CIDR: {s}"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|&l| l <= max)
            .ok_or_else(|| format!("bad prefix length in {s} (0-{max})"))?,
    };
    Ok((addr, len))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("not a number of seconds: {s}"))?;
    if !(secs > 0.0 && secs.is_finite() && secs < 1e9) {
        return Err(format!(
            "duration must be a positive number of seconds: {s}"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_ring_kib(s: &str) -> Result<u32, String> {
    let kib: u32 = s.parse().map_err(|_| format!("not a size in KiB: {s}"))?;
    if kib < 4 || !kib.is_power_of_two() || kib > 1 << 20 {
        return Err(format!(
            "ring size must be a power of two between 4 and 1048576 KiB: {s}"
        ));
    }
    Ok(kib)
}

fn parse_sample(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "sample must be a whole number from 1 (every packet) to {}: {s}",
            u32::MAX
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert_eq!(
            parse_cidr("10.1.0.0/16").unwrap(),
            ("10.1.0.0".parse().unwrap(), 16)
        );
        assert_eq!(
            parse_cidr("2001:db8::1").unwrap(),
            ("2001:db8::1".parse().unwrap(), 128)
        );
        assert_eq!(
            parse_cidr("192.0.2.7").unwrap(),
            ("192.0.2.7".parse().unwrap(), 32)
        );
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("10.0.0.0/").is_err());
        assert!(parse_cidr("nope").is_err());
        assert!(parse_cidr("::/129").is_err());
    }

    #[test]
    fn ports_and_durations() {
        assert_eq!(parse_port("3306"), Ok(3306));
        assert!(parse_port("0").is_err());
        assert!(parse_port("65536").is_err());
        assert!(parse_port("-1").is_err());
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("NaN").is_err());
        assert!(parse_duration("-3").is_err());
        assert_eq!(parse_ring_kib("64"), Ok(64));
        assert!(parse_ring_kib("100").is_err());
        assert_eq!(parse_sample("100"), Ok(100));
        assert_eq!(parse_sample("1"), Ok(1));
        assert!(parse_sample("0").is_err());
        assert!(parse_sample("-5").is_err());
        assert!(parse_sample("1/100").is_err());
    }

    #[test]
    fn cli_parses() {
        let c = Cli::try_parse_from(["kdrop", "--port", "3306", "-p", "80", "--json"]).unwrap();
        assert_eq!(c.trace.filter.ports, [3306, 80]);
        assert!(c.trace.json);
        assert!(c.command.is_none());
        let c = Cli::try_parse_from(["kdrop", "record", "-o", "b.kdrop", "-p", "80", "--json"])
            .unwrap();
        let Some(Command::Record(r)) = c.command else {
            panic!("not record")
        };
        assert_eq!(
            (r.trace.filter.ports.as_slice(), r.max_size),
            (&[80][..], 64)
        );
        assert!(r.trace.json);
        assert!(
            Cli::try_parse_from(["kdrop", "record"]).is_err(),
            "-o is required"
        );
        let c = Cli::try_parse_from(["kdrop", "explain", "b.kdrop", "--json"]).unwrap();
        assert!(matches!(c.command, Some(Command::Explain(e)) if e.json));
        let c = Cli::try_parse_from(["kdrop", "check"]).unwrap();
        assert!(matches!(c.command, Some(Command::Check)));
        assert!(Cli::try_parse_from(["kdrop", "--port", "http"]).is_err());
        assert!(Cli::try_parse_from(["kdrop", "--count", "0"]).is_err());
        assert_eq!(
            Cli::try_parse_from(["kdrop"]).unwrap().trace.filter.sample,
            1
        );
        let c = Cli::try_parse_from(["kdrop", "--sample", "100"]).unwrap();
        assert_eq!(c.trace.filter.sample, 100);
    }

    #[test]
    fn monitor_parses() {
        let c = Cli::try_parse_from(["kdrop", "monitor", "-p", "80"]).unwrap();
        let Some(Command::Monitor(m)) = c.command else {
            panic!("not monitor")
        };
        assert_eq!(
            m.listen,
            "127.0.0.1:9464".parse().unwrap(),
            "loopback by default"
        );
        assert_eq!((m.filter.sample, m.events_per_sec), (1, 100));
        // One sampling knob for both modes; monitor's old name still works.
        let c = Cli::try_parse_from(["kdrop", "monitor", "--sample-every", "10"]).unwrap();
        assert!(matches!(c.command, Some(Command::Monitor(m)) if m.filter.sample == 10));
        assert_eq!(m.filter.ports, [80]);
        let c = Cli::try_parse_from(["kdrop", "monitor", "--listen", "[::]:9000"]).unwrap();
        assert!(matches!(c.command, Some(Command::Monitor(m)) if m.listen.port() == 9000));
        assert!(Cli::try_parse_from(["kdrop", "monitor", "--listen", "nope"]).is_err());
        assert!(Cli::try_parse_from(["kdrop", "monitor", "--sample-every", "0"]).is_err());
        assert!(Cli::try_parse_from(["kdrop", "monitor", "--max-series", "1"]).is_err());
    }
}
