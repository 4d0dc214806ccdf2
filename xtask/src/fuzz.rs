//! `cargo xtask fuzz`: the fuzz targets in fuzz/ (libFuzzer, built as
//! cargo-fuzz builds them),
//! each for a bounded time. `cargo xtask test` runs each for a few seconds
//! (`FUZZ_SECS_IN_TEST`) after the host's suite. The targets link
//! kdrop-core alone (the parsers, decoding, BTF and the diagnosis; no aya,
//! tokio or clap): the sanitizer build takes about a minute on two cores.
use std::process::Command;

use anyhow::Result;

use crate::{bootstrap, root, run};

pub const TARGETS: &[&str] = &["decode", "btf", "netlink", "iptables_save", "nft_json"];

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// Seconds per target.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// Only this target (decode: ring buffer records; btf: the BTF parser;
    /// netlink: rtnetlink and ctnetlink messages; iptables_save, nft_json:
    /// the rule dumps).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    target: Option<String>,
    /// An optimised build: minutes longer to build, several times more runs
    /// per second; worth it for long runs. `cargo xtask test` uses the
    /// unoptimised one (67 s from nothing on two cores).
    #[arg(long)]
    release: bool,
}

/// Seconds per target in `cargo xtask test`.
pub const FUZZ_SECS_IN_TEST: u64 = 5;

impl Opts {
    /// Every target for `secs` seconds.
    pub fn bounded(secs: u64) -> Self {
        Opts {
            secs,
            target: None,
            release: false,
        }
    }
}

/// What cargo-fuzz 0.13 passes for libFuzzer with AddressSanitizer
/// (src/project.rs there), so no cargo-fuzz has to be compiled first (that
/// took CI three minutes). Unlike cargo-fuzz: debug assertions always on
/// (its `-a`: integer overflow in a parser is a finding), the dev profile
/// unless `--release`, and the default codegen units (its
/// `-Ccodegen-units=1` makes an optimised build slower still).
const RUSTFLAGS: &str = "-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
    -Cllvm-args=-sanitizer-coverage-stack-depth \
    --cfg fuzzing -Cdebug-assertions -Zsanitizer=address";

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

pub fn run_all(o: &Opts) -> Result<()> {
    bootstrap::run()?;
    let tc = bootstrap::ebpf_toolchain();
    let targets: Vec<&str> = TARGETS
        .iter()
        .copied()
        .filter(|t| o.target.as_deref().is_none_or(|x| x == *t))
        .collect();
    // libFuzzer needs nightly (-Z sanitizer); without nightly, stable with
    // RUSTC_BOOTSTRAP does the same. The explicit --target keeps the flags
    // off build scripts, as cargo-fuzz does.
    let mut cmd = Command::new("rustup");
    cmd.args(["run", tc.name(), "cargo", "build", "--bins"])
        .args(o.release.then_some("--release"))
        .args(["--manifest-path", "fuzz/Cargo.toml", "--target", TRIPLE])
        .env(
            "RUSTFLAGS",
            RUSTFLAGS.split_whitespace().collect::<Vec<_>>().join(" "),
        );
    if tc.needs_bootstrap() {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    run(&mut cmd)?;
    let profile = if o.release { "release" } else { "debug" };
    let bin_dir = root().join("fuzz/target").join(TRIPLE).join(profile);
    for t in targets {
        let corpus = root().join("fuzz/corpus").join(t);
        std::fs::create_dir_all(&corpus)?;
        // A valid input to start from: random bytes rarely get past a
        // header with a magic number and section offsets.
        std::fs::write(corpus.join("seed"), seed(t))?;
        run(Command::new(bin_dir.join(t))
            .arg(&corpus)
            .arg(format!("-max_total_time={}", o.secs)))?;
    }
    Ok(())
}

fn seed(target: &str) -> Vec<u8> {
    match target {
        "decode" => drop_record(),
        "netlink" => route_message(),
        "iptables_save" => b"*filter\n:INPUT ACCEPT [3:180]\n[1:60] -A INPUT -s 10.0.0.3/32 -p tcp -m tcp \
            --dport 6109 -j DROP\nCOMMIT\n"
            .to_vec(),
        "nft_json" => br#"{"nftables":[{"table":{"family":"inet","name":"t","handle":1}},{"chain":{"family":"inet","table":"t","name":"input","handle":1,"type":"filter","hook":"input","prio":0,"policy":"accept"}},{"rule":{"family":"inet","table":"t","chain":"input","handle":2,"expr":[{"match":{"op":"==","left":{"payload":{"protocol":"tcp","field":"dport"}},"right":6202}},{"drop":null}]}}]}"#
            .to_vec(),
        _ => small_btf(),
    }
}

/// A ring buffer record as kdrop-ebpf writes it: an IPv4 SYN drop, a
/// `kdrop_common::DropEvent` laid out by the crate itself (its size follows
/// the struct).
fn drop_record() -> Vec<u8> {
    use kdrop_common::{DropEvent, EVENT_DROP};
    // SAFETY: DropEvent is #[repr(C)] plain integers and byte arrays: all
    // zeroes is a valid value.
    let mut e: DropEvent = unsafe { std::mem::zeroed() };
    e.header.kind = EVENT_DROP;
    e.header.ts_ns = 42;
    e.location = 0xffff_ffff_8100_0000;
    e.reason = 16;
    e.pkt.netns = 4026532000;
    e.pkt.ifindex = 3;
    e.pkt.saddr[..4].copy_from_slice(&[198, 51, 100, 7]);
    e.pkt.daddr[..4].copy_from_slice(&[10, 0, 2, 20]);
    e.pkt.sport = 40000;
    e.pkt.dport = 8080;
    e.pkt.family = 2; // AF_INET
    e.pkt.tcp_flags = 0x02; // SYN
                            // SAFETY: reading the bytes of a plain #[repr(C)] value.
    unsafe {
        std::slice::from_raw_parts(
            (&raw const e).cast::<u8>(),
            std::mem::size_of::<DropEvent>(),
        )
    }
    .to_vec()
}

/// A netlink message as the kernel sends it: an RTM_NEWROUTE for
/// 10.0.0.0/24 via 10.0.0.1, table main (rtnetlink(7)).
fn route_message() -> Vec<u8> {
    let mut attrs = Vec::new();
    for (ty, v) in [
        (1u16, [10u8, 0, 0, 0]),
        (5, [10, 0, 0, 1]),
        (15, [254, 0, 0, 0]),
    ] {
        attrs.extend(8u16.to_ne_bytes());
        attrs.extend(ty.to_ne_bytes()); // RTA_DST, RTA_GATEWAY, RTA_TABLE
        attrs.extend(v);
    }
    let rtmsg = [2u8, 24, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0]; // AF_INET /24 main boot universe unicast
    let len = 16 + rtmsg.len() + attrs.len();
    let mut m = Vec::new();
    m.extend((len as u32).to_ne_bytes());
    m.extend(24u16.to_ne_bytes()); // RTM_NEWROUTE
    m.extend([0u8; 10]); // flags, seq, pid
    m.extend(rtmsg);
    m.extend(attrs);
    m
}

/// A small BTF blob with the kinds kdrop looks at: an int, pointers, a
/// struct sk_buff with members, enum skb_drop_reason, a typedef and a
/// function prototype (format: https://docs.kernel.org/bpf/btf.html).
fn small_btf() -> Vec<u8> {
    let mut strings = vec![0u8];
    let mut s = |name: &str| {
        let off = strings.len() as u32;
        strings.extend(name.as_bytes());
        strings.push(0);
        off
    };
    let (int, skb, head, mark, reason) = (
        s("int"),
        s("sk_buff"),
        s("head"),
        s("mark"),
        s("skb_drop_reason"),
    );
    let (not_spec, rpf, u32_name) = (
        s("SKB_DROP_REASON_NOT_SPECIFIED"),
        s("SKB_DROP_REASON_IP_RPFILTER"),
        s("u32"),
    );
    let mut t: Vec<u8> = Vec::new();
    let ty = |t: &mut Vec<u8>, name: u32, kind: u32, vlen: u32, size_or_type: u32| {
        t.extend(name.to_le_bytes());
        t.extend(((kind << 24) | vlen).to_le_bytes());
        t.extend(size_or_type.to_le_bytes());
    };
    let words = |t: &mut Vec<u8>, ws: &[u32]| ws.iter().for_each(|w| t.extend(w.to_le_bytes()));
    ty(&mut t, int, 1, 0, 4); // 1: int
    words(&mut t, &[32]);
    ty(&mut t, 0, 2, 0, 1); // 2: int *
    ty(&mut t, skb, 4, 2, 16); // 3: struct sk_buff { int *head; int mark; }
    words(&mut t, &[head, 2, 0, mark, 1, 64]);
    ty(&mut t, reason, 6, 2, 4); // 4: enum skb_drop_reason
    words(&mut t, &[not_spec, 2, rpf, 16]);
    ty(&mut t, u32_name, 8, 0, 1); // 5: typedef int u32
    ty(&mut t, 0, 13, 2, 0); // 6: void (struct sk_buff *, enum skb_drop_reason)
    words(&mut t, &[0, 7, 0, 4]);
    ty(&mut t, 0, 2, 0, 3); // 7: struct sk_buff *
    let mut out = Vec::new();
    out.extend(0xeb9fu16.to_le_bytes());
    out.extend([1, 0]); // version, flags
    for w in [24, 0, t.len() as u32, t.len() as u32, strings.len() as u32] {
        out.extend(w.to_le_bytes());
    }
    out.extend(t);
    out.extend(strings);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_have_the_right_shape() {
        assert_eq!(
            drop_record().len(),
            std::mem::size_of::<kdrop_common::DropEvent>()
        );
        let d = drop_record();
        assert_eq!(u32::from_ne_bytes(d[..4].try_into().unwrap()), 1);
        let m = route_message();
        assert_eq!(
            u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize,
            m.len()
        );
        for t in TARGETS {
            assert!(!seed(t).is_empty(), "{t}");
        }
        let b = small_btf();
        assert_eq!(&b[..2], &[0x9f, 0xeb]);
        let type_len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        let str_len = u32::from_le_bytes(b[20..24].try_into().unwrap()) as usize;
        assert_eq!(b.len(), 24 + type_len + str_len);
    }
}
