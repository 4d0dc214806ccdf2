//! Capabilities as /proc shows them, for the tests that run kdrop as the
//! DaemonSet does (caps.rs, image.rs).

/// A capability's bit in `/proc/PID/status` (include/uapi/linux/capability.h),
/// by its name in either case, with or without `cap_`.
pub fn cap_bit(name: &str) -> u64 {
    let name = name.to_ascii_lowercase();
    match name.strip_prefix("cap_").unwrap_or(&name) {
        "dac_read_search" => 1 << 2,
        "net_admin" => 1 << 12,
        "sys_ptrace" => 1 << 19,
        "sys_admin" => 1 << 21,
        "sys_resource" => 1 << 24,
        "perfmon" => 1 << 38,
        "bpf" => 1 << 39,
        other => panic!("capability {other} not known to the tests"),
    }
}

/// A hexadecimal field of `/proc/PID/status` (`CapEff:`, `CapBnd:`, ...).
pub fn status_hex(status: &str, key: &str) -> u64 {
    let v = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"));
    u64::from_str_radix(v.trim(), 16).unwrap()
}

/// RLIMIT_MEMLOCK's soft and hard limits of process `pid`, as
/// `/proc/PID/limits` says them (`unlimited` or bytes).
pub fn memlock(pid: u32) -> [String; 2] {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .unwrap_or_else(|| panic!("no memlock line in {limits}"));
    let mut v = line.split_whitespace().skip(3).map(str::to_string);
    [v.next().unwrap(), v.next().unwrap()]
}
