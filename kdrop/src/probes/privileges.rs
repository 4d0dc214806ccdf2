//! What kdrop may do here, checked before touching BPF.
use crate::UserError;

/// Checks the effective capabilities (/proc/self/status) before touching BPF.
/// Loading and attaching needs CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN); naming
/// interfaces in other namespaces needs setns, i.e. CAP_SYS_ADMIN: without it
/// kdrop still traces, and says what it cannot do.
pub fn check_privileges() -> Result<Vec<String>, UserError> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |c: u32| eff & (1 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        return Err(UserError(
            "needs root, or CAP_BPF and CAP_PERFMON, to load its eBPF programs \
             (try: sudo kdrop ...)"
                .into(),
        ));
    }
    let mut warnings = Vec::new();
    if !has(CAP_SYS_ADMIN) {
        warnings.push(
            "no CAP_SYS_ADMIN: interfaces in other network namespaces are shown by index".into(),
        );
    }
    if !has(CAP_NET_ADMIN) {
        warnings.push("no CAP_NET_ADMIN: routing and netfilter context is unavailable".into());
    }
    Ok(warnings)
}
