//! Cilium's drop counters, read from its `cilium_metrics` map: a per-CPU
//! hash of `struct metrics_key` (8 bytes: `__u8 reason`, `__u8 dir:2`, ...)
//! to `struct metrics_value { __u64 count; __u64 bytes; }` (cilium
//! bpf/lib/common.h, bpf/lib/metrics.h). The map is found among the maps of
//! a program on the hook where the packet died, by its name.
use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{bail, Context as _, Result};

use super::bpf_progs::{bpf, get_u32, get_u64, put_u32, put_u64};
use crate::model::progs::CiliumCount;

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
pub const MAP_NAME: &str = "cilium_metrics";
const KEY_SIZE: usize = 8;
const VALUE_SIZE: usize = 16;
/// The map holds at most 1024 keys (reason × direction, and line/file in
/// newer Cilium): a bound on the walk.
const MAX_KEYS: usize = 65536;

fn map_fd(id: u32) -> Result<OwnedFd> {
    let mut attr = [0u8; 16];
    put_u32(&mut attr, 0, id);
    let fd = bpf(BPF_MAP_GET_FD_BY_ID, &mut attr).with_context(|| format!("BPF map {id}"))?;
    // SAFETY: the kernel returned a new descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `struct bpf_map_info`: type @0, key_size @8, value_size @12, name[16] @24.
fn map_info(fd: &OwnedFd) -> Result<(u32, u32, u32, String)> {
    let mut info = [0u8; 96];
    let mut attr = [0u8; 16];
    put_u32(&mut attr, 0, fd.as_raw_fd() as u32);
    put_u32(&mut attr, 4, info.len() as u32);
    put_u64(&mut attr, 8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).context("bpf_map_info")?;
    let name = &info[24..40];
    let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
    Ok((
        get_u32(&info, 0).unwrap_or_default(),
        get_u32(&info, 8).unwrap_or_default(),
        get_u32(&info, 12).unwrap_or_default(),
        String::from_utf8_lossy(&name[..end]).into_owned(),
    ))
}

/// The CPUs a per-CPU value has a slot for: /sys/devices/system/cpu/possible.
fn possible_cpus() -> Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .context("/sys/devices/system/cpu/possible")?;
    // `0-3`, `0,2-5`: the highest CPU number, plus one.
    let mut n = 0;
    for part in s.trim().split(',') {
        let hi = part.rsplit('-').next().unwrap_or(part);
        n = n.max(hi.parse::<usize>().context("cpu/possible")? + 1);
    }
    Ok(n)
}

/// Which of `map_ids` is Cilium's metrics map (by name, type and sizes).
pub fn find(map_ids: &[u32]) -> Option<(u32, OwnedFd)> {
    map_ids.iter().find_map(|&id| {
        let fd = map_fd(id).ok()?;
        let (ty, key, value, name) = map_info(&fd).ok()?;
        (name == MAP_NAME
            && ty == BPF_MAP_TYPE_PERCPU_HASH
            && key as usize == KEY_SIZE
            && value as usize == VALUE_SIZE)
            .then_some((id, fd))
    })
}

/// The map's drop counts (reason ≠ 0) by reason and direction, summed
/// over CPUs and over the keys' other fields (source line and file).
pub fn read(fd: &OwnedFd) -> Result<Vec<CiliumCount>> {
    let cpus = possible_cpus()?;
    let mut sums: BTreeMap<(u8, u8), u64> = BTreeMap::new();
    let mut key = [0u8; KEY_SIZE];
    let mut next = [0u8; KEY_SIZE];
    let mut value = vec![0u8; VALUE_SIZE * cpus];
    let mut first = true;
    for _ in 0..MAX_KEYS {
        // BPF_MAP_GET_NEXT_KEY: map_fd @0, key @8 (0: the first), next_key @16.
        let mut attr = [0u8; 24];
        put_u32(&mut attr, 0, fd.as_raw_fd() as u32);
        if !first {
            put_u64(&mut attr, 8, key.as_ptr() as u64);
        }
        put_u64(&mut attr, 16, next.as_mut_ptr() as u64);
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(counts(sums)),
            Err(e) => return Err(e).context("walking cilium_metrics"),
        }
        first = false;
        key = next;
        // BPF_MAP_LOOKUP_ELEM: map_fd @0, key @8, value @16.
        let mut attr = [0u8; 32];
        put_u32(&mut attr, 0, fd.as_raw_fd() as u32);
        put_u64(&mut attr, 8, key.as_ptr() as u64);
        put_u64(&mut attr, 16, value.as_mut_ptr() as u64);
        if bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).is_err() {
            continue; // deleted meanwhile
        }
        let (reason, dir) = (key[0], key[1] & 0b11);
        if reason == 0 {
            continue; // forwarded
        }
        let packets: u64 = (0..cpus)
            .filter_map(|c| get_u64(&value, c * VALUE_SIZE))
            .sum();
        *sums.entry((reason, dir)).or_default() += packets;
    }
    bail!("cilium_metrics has more than {MAX_KEYS} keys")
}

fn counts(sums: BTreeMap<(u8, u8), u64>) -> Vec<CiliumCount> {
    sums.into_iter()
        .map(|((reason, dir), packets)| CiliumCount {
            reason,
            dir,
            packets,
        })
        .collect()
}
