//! `cargo xtask fuzz`: the fuzz targets in fuzz/ (cargo-fuzz, libFuzzer),
//! each for a bounded time. On demand, not in CI: the sanitizer build of
//! kdrop and its dependencies alone takes minutes on two cores.
use std::process::Command;

use anyhow::Result;

use crate::{bootstrap, root, run};

pub const TARGETS: &[&str] = &["decode", "btf"];

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// Seconds per target.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// Only this target (decode: ring buffer records; btf: the BTF parser).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    target: Option<String>,
}

fn have_cargo_fuzz() -> bool {
    Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn run_all(o: &Opts) -> Result<()> {
    // kdrop's build.rs builds the eBPF object: it needs bpf-linker.
    bootstrap::run()?;
    if !have_cargo_fuzz() {
        run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let tc = bootstrap::ebpf_toolchain();
    for t in TARGETS
        .iter()
        .filter(|t| o.target.as_deref().is_none_or(|x| x == **t))
    {
        let corpus = root().join("fuzz/corpus").join(t);
        std::fs::create_dir_all(&corpus)?;
        // A valid input to start from: random bytes rarely get past a
        // header with a magic number and section offsets.
        std::fs::write(corpus.join("seed"), seed(t))?;
        let mut cmd = Command::new("rustup");
        // libFuzzer needs nightly (-Z sanitizer); without nightly, stable
        // with RUSTC_BOOTSTRAP does the same.
        cmd.args(["run", tc.name(), "cargo", "fuzz", "run", t])
            .arg(&corpus)
            .args(["--", &format!("-max_total_time={}", o.secs)]);
        if tc.needs_bootstrap() {
            cmd.env("RUSTC_BOOTSTRAP", "1");
        }
        run(&mut cmd)?;
    }
    Ok(())
}

fn seed(target: &str) -> Vec<u8> {
    match target {
        "decode" => drop_record(),
        _ => small_btf(),
    }
}

/// A ring buffer record as kdrop-ebpf writes it: an IPv4 SYN drop
/// (kdrop_common::DropEvent, 80 bytes, little-endian).
fn drop_record() -> Vec<u8> {
    let mut r = Vec::new();
    r.extend(1u32.to_le_bytes()); // kind: EVENT_DROP
    r.extend(0u32.to_le_bytes()); // cpu
    r.extend(42u64.to_le_bytes()); // ts_ns
    r.extend(0xffff_ffff_8100_0000u64.to_le_bytes()); // location
    for v in [16u32, 4026532000, 3, 0] {
        r.extend(v.to_le_bytes()); // reason, netns, ifindex, mark
    }
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&[198, 51, 100, 7]);
    r.extend(addr);
    addr[..4].copy_from_slice(&[10, 0, 2, 20]);
    r.extend(addr);
    r.extend(40000u16.to_le_bytes());
    r.extend(8080u16.to_le_bytes());
    r.extend([2, 0x02, 0, 0]); // AF_INET, SYN, padding
    r
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
        // DropEvent's size (kdrop-common's layout test pins it).
        assert_eq!(drop_record().len(), 80);
        let b = small_btf();
        assert_eq!(&b[..2], &[0x9f, 0xeb]);
        let type_len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        let str_len = u32::from_le_bytes(b[20..24].try_into().unwrap()) as usize;
        assert_eq!(b.len(), 24 + type_len + str_len);
    }
}
