//! Netfilter verdict records (kdrop-common/src/nf.rs) decoded, kept for a
//! moment, and handed to the drop they explain: same CPU, same namespace,
//! same addresses and ports, recorded at most `WINDOW_NS` before the free
//! (`nf_hook_slow` frees the packet right after the verdict, so the record
//! is always ahead of its drop on the ring buffer).
use std::{
    collections::VecDeque,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use kdrop_common::{
    nf::{
        NfVerdictEvent, EVENT_NF_VERDICT, NF_FN_CONNTRACK_IN, NF_FN_IPT_DO_TABLE, NF_FN_NAT,
        NF_FN_NFT_DO_CHAIN,
    },
    EventHeader, AF_INET, AF_INET6,
};

use crate::{
    event::Drop,
    netfilter::{Family, Hook},
};

/// How long before its drop a verdict may be (same softirq: microseconds).
pub const WINDOW_NS: u64 = 10_000_000;
/// Records kept waiting for their drop.
const KEPT: usize = 256;

/// Which function returned NF_DROP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NfFn {
    ConntrackIn,
    Nat,
    NftDoChain,
    IptDoTable,
}

impl NfFn {
    pub fn name(self) -> &'static str {
        match self {
            NfFn::ConntrackIn => "nf_conntrack_in",
            NfFn::Nat => "nf_nat_inet_fn",
            NfFn::NftDoChain => "nft_do_chain",
            NfFn::IptDoTable => "ipt_do_table",
        }
    }
}

/// One NF_DROP verdict as the kernel returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub ts_ns: u64,
    pub cpu: u32,
    pub func: NfFn,
    /// The raw return value.
    pub raw: u32,
    pub netns: u32,
    pub saddr: IpAddr,
    pub daddr: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub hook: Option<Hook>,
    pub family: Option<Family>,
    pub table: Option<String>,
    pub chain: Option<String>,
}

/// `enum nf_inet_hooks`, UAPI (include/uapi/linux/netfilter.h as of v6.18:
/// https://github.com/torvalds/linux/blob/v6.18/include/uapi/linux/netfilter.h#L42).
pub fn hook(n: u8) -> Option<Hook> {
    Some(match n {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        _ => return None,
    })
}

/// `NFPROTO_*`, UAPI (include/uapi/linux/netfilter.h, same version).
pub fn family(pf: u8) -> Option<Family> {
    Some(match pf {
        1 => Family::Inet,
        2 => Family::Ip,
        3 => Family::Arp,
        5 => Family::Netdev,
        7 => Family::Bridge,
        10 => Family::Ip6,
        _ => return None,
    })
}

fn name(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    (end > 0).then(|| String::from_utf8_lossy(&bytes[..end]).into_owned())
}

fn addr(family: u8, b: [u8; 16]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(b))),
        _ => None,
    }
}

/// `None` for other records; `Some(Err)` for a verdict record that is
/// short or malformed.
pub fn decode(data: &[u8]) -> Option<Result<Verdict, String>> {
    if data.len() < size_of::<EventHeader>() {
        return None;
    }
    // SAFETY: length checked; Pod; unaligned read.
    let h: EventHeader = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
    if h.kind != EVENT_NF_VERDICT {
        return None;
    }
    if data.len() < size_of::<NfVerdictEvent>() {
        return Some(Err(format!(
            "verdict record too short ({} bytes)",
            data.len()
        )));
    }
    // SAFETY: as above.
    let e: NfVerdictEvent = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
    let func = match e.func {
        NF_FN_CONNTRACK_IN => NfFn::ConntrackIn,
        NF_FN_NAT => NfFn::Nat,
        NF_FN_NFT_DO_CHAIN => NfFn::NftDoChain,
        NF_FN_IPT_DO_TABLE => NfFn::IptDoTable,
        f => return Some(Err(format!("verdict record of unknown function {f}"))),
    };
    let (Some(saddr), Some(daddr)) = (addr(e.family, e.saddr), addr(e.family, e.daddr)) else {
        return Some(Err(format!("verdict record of family {}", e.family)));
    };
    Some(Ok(Verdict {
        ts_ns: e.header.ts_ns,
        cpu: e.header.cpu,
        func,
        raw: e.verdict,
        netns: e.netns,
        saddr,
        daddr,
        sport: e.sport,
        dport: e.dport,
        hook: hook(e.hook),
        family: family(e.pf),
        table: name(&e.table),
        chain: name(&e.chain),
    }))
}

/// Verdicts waiting for their drop.
#[derive(Default)]
pub struct VerdictLog {
    recent: VecDeque<Verdict>,
}

impl VerdictLog {
    pub fn push(&mut self, v: Verdict) {
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(v);
    }

    /// The verdicts for this drop, innermost first (the order they
    /// returned in), taken out of the log.
    pub fn take_for(&mut self, d: &Drop) -> Vec<Verdict> {
        let (mine, rest): (Vec<Verdict>, Vec<Verdict>) =
            self.recent.drain(..).partition(|v| belongs(v, d));
        // Records older than any drop they could still explain go.
        self.recent = rest
            .into_iter()
            .filter(|v| v.ts_ns.saturating_add(WINDOW_NS) >= d.ts_ns || v.ts_ns > d.ts_ns)
            .collect();
        mine
    }
}

fn belongs(v: &Verdict, d: &Drop) -> bool {
    v.cpu == d.cpu
        && v.netns == d.netns
        && v.ts_ns <= d.ts_ns
        && d.ts_ns - v.ts_ns <= WINDOW_NS
        && (v.saddr, v.sport, v.daddr, v.dport) == (d.saddr, d.sport, d.daddr, d.dport)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kdrop_common::TCP_SYN;

    fn raw(func: u8, hook: u8, table: &str) -> NfVerdictEvent {
        let mut e = NfVerdictEvent {
            header: EventHeader {
                kind: EVENT_NF_VERDICT,
                cpu: 1,
                ts_ns: 1_000,
            },
            verdict: 0,
            netns: 7,
            ifindex: 2,
            mark: 0,
            saddr: [0; 16],
            daddr: [0; 16],
            sport: 40000,
            dport: 80,
            family: AF_INET,
            tcp_flags: TCP_SYN,
            func,
            hook,
            pf: 2,
            _pad: [0; 7],
            table: [0; 32],
            chain: [0; 32],
        };
        e.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        e.daddr[..4].copy_from_slice(&[10, 0, 0, 2]);
        e.table[..table.len()].copy_from_slice(table.as_bytes());
        e
    }

    fn bytes(e: &NfVerdictEvent) -> Vec<u8> {
        // SAFETY: Pod.
        unsafe {
            std::slice::from_raw_parts((e as *const NfVerdictEvent).cast::<u8>(), size_of_val(e))
        }
        .to_vec()
    }

    fn drop_at(ts_ns: u64, cpu: u32, sport: u16) -> Drop {
        Drop {
            ts_ns,
            cpu,
            location: 0,
            reason: 0,
            netns: 7,
            ifindex: 2,
            mark: 0,
            saddr: "10.0.0.1".parse().unwrap(),
            daddr: "10.0.0.2".parse().unwrap(),
            sport,
            dport: 80,
            tcp_flags: TCP_SYN,
            fib: Vec::new(),
            ct: None,
            src_check: None,
        }
    }

    #[test]
    fn decodes() {
        let v = decode(&bytes(&raw(NF_FN_IPT_DO_TABLE, 1, "filter")))
            .unwrap()
            .unwrap();
        assert_eq!(v.func, NfFn::IptDoTable);
        assert_eq!(v.hook, Some(Hook::Input));
        assert_eq!(v.family, Some(Family::Ip));
        assert_eq!(v.table.as_deref(), Some("filter"));
        assert_eq!(v.chain, None);
        assert_eq!(v.saddr.to_string(), "10.0.0.1");
        let mut e = raw(9, 1, "");
        assert!(decode(&bytes(&e)).unwrap().is_err());
        e.func = NF_FN_NAT;
        e.hook = 0xff;
        assert_eq!(decode(&bytes(&e)).unwrap().unwrap().hook, None);
        assert!(decode(&bytes(&e)[..40]).unwrap().is_err());
        let mut other = e;
        other.header.kind = 1;
        assert!(decode(&bytes(&other)).is_none());
    }

    #[test]
    fn pairs_with_its_own_drop_only() {
        let v = decode(&bytes(&raw(NF_FN_NFT_DO_CHAIN, 1, "kdt")))
            .unwrap()
            .unwrap();
        let mut log = VerdictLog::default();
        log.push(v.clone());
        // Another CPU, another port, before the verdict: not it.
        assert!(log.take_for(&drop_at(2_000, 0, 40000)).is_empty());
        assert!(log.take_for(&drop_at(2_000, 1, 40001)).is_empty());
        assert!(log.take_for(&drop_at(500, 1, 40000)).is_empty());
        let got = log.take_for(&drop_at(2_000, 1, 40000));
        assert_eq!(got, vec![v.clone()]);
        // Taken: a second drop of the same tuple does not reuse it.
        assert!(log.take_for(&drop_at(3_000, 1, 40000)).is_empty());
        // Too old for its drop, and then forgotten.
        log.push(v);
        assert!(log
            .take_for(&drop_at(1_000 + WINDOW_NS + 1, 1, 40000))
            .is_empty());
        assert!(log.recent.is_empty());
    }

    #[test]
    fn bounded() {
        let mut log = VerdictLog::default();
        let v = decode(&bytes(&raw(NF_FN_CONNTRACK_IN, 0, "")))
            .unwrap()
            .unwrap();
        for _ in 0..KEPT + 10 {
            log.push(v.clone());
        }
        assert_eq!(log.recent.len(), KEPT);
    }
}
