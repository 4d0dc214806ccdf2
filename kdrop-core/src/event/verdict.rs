//! Netfilter verdict records (kdrop-common/src/nf.rs): a netfilter function
//! returned NF_DROP for a packet the filter wants.
use kdrop_common::nf::{
    NfVerdictEvent, EVENT_NF_VERDICT, NF_FN_CONNTRACK_IN, NF_FN_IPT_DO_TABLE, NF_FN_NAT,
    NF_FN_NFT_DO_CHAIN,
};

use super::{addr, read, DecodeError};

use crate::model::{
    netfilter::{Family, Hook},
    packet::{NfFn, NfVerdict},
};

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

/// A verdict record (its header says so).
pub fn decode(data: &[u8]) -> Result<NfVerdict, DecodeError> {
    let e: NfVerdictEvent = read(data, EVENT_NF_VERDICT)?;
    let func = match e.func {
        NF_FN_CONNTRACK_IN => NfFn::ConntrackIn,
        NF_FN_NAT => NfFn::Nat,
        NF_FN_NFT_DO_CHAIN => NfFn::NftDoChain,
        NF_FN_IPT_DO_TABLE => NfFn::IptDoTable,
        f => return Err(DecodeError::UnknownFunction(f)),
    };
    Ok(NfVerdict {
        ts_ns: e.header.ts_ns,
        cpu: e.header.cpu,
        func,
        raw: e.verdict,
        netns: e.pkt.netns,
        saddr: addr(e.pkt.family, e.pkt.saddr)?,
        daddr: addr(e.pkt.family, e.pkt.daddr)?,
        sport: e.pkt.sport,
        dport: e.pkt.dport,
        hook: hook(e.hook),
        family: family(e.pf),
        table: name(&e.table),
        chain: name(&e.chain),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use kdrop_common::{EventHeader, PacketId, AF_INET, TCP_SYN};

    use super::*;
    use crate::model::netfilter::{Family, Hook};

    pub fn raw(func: u8, hook: u8, table: &str) -> NfVerdictEvent {
        let mut e = NfVerdictEvent {
            header: EventHeader {
                kind: EVENT_NF_VERDICT,
                cpu: 1,
                ts_ns: 1_000,
            },
            pkt: PacketId {
                netns: 7,
                ifindex: 2,
                sport: 40000,
                dport: 80,
                family: AF_INET,
                tcp_flags: TCP_SYN,
                ..PacketId::zeroed()
            },
            verdict: 0,
            func,
            hook,
            pf: 2,
            _pad: 0,
            table: [0; 32],
            chain: [0; 32],
        };
        e.pkt.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        e.pkt.daddr[..4].copy_from_slice(&[10, 0, 0, 2]);
        e.table[..table.len()].copy_from_slice(table.as_bytes());
        e
    }

    pub fn bytes(e: &NfVerdictEvent) -> Vec<u8> {
        // SAFETY: Pod.
        unsafe {
            std::slice::from_raw_parts((e as *const NfVerdictEvent).cast::<u8>(), size_of_val(e))
        }
        .to_vec()
    }

    /// Every value of the UAPI enums, from include/uapi/linux/netfilter.h
    /// (v6.18: NF_INET_PRE_ROUTING = 0 .. NF_INET_POST_ROUTING = 4;
    /// NFPROTO_INET 1, IPV4 2, ARP 3, NETDEV 5, BRIDGE 7, IPV6 10), and the
    /// first ones past them.
    #[test]
    fn hooks_and_families_are_the_uapi_numbers() {
        let hooks = [
            Hook::Prerouting,
            Hook::Input,
            Hook::Forward,
            Hook::Output,
            Hook::Postrouting,
        ];
        for (n, h) in hooks.into_iter().enumerate() {
            assert_eq!(hook(n as u8), Some(h));
        }
        assert_eq!(hook(5), None);
        for (pf, f) in [
            (1, Family::Inet),
            (2, Family::Ip),
            (3, Family::Arp),
            (5, Family::Netdev),
            (7, Family::Bridge),
            (10, Family::Ip6),
        ] {
            assert_eq!(family(pf), Some(f));
        }
        for pf in [0, 4, 6, 8, 9, 11] {
            assert_eq!(family(pf), None);
        }
    }

    #[test]
    fn decodes() {
        let v = decode(&bytes(&raw(NF_FN_IPT_DO_TABLE, 1, "filter"))).unwrap();
        assert_eq!(v.func, NfFn::IptDoTable);
        assert_eq!(v.hook, Some(Hook::Input));
        assert_eq!(v.family, Some(Family::Ip));
        assert_eq!(v.table.as_deref(), Some("filter"));
        assert_eq!(v.chain, None);
        assert_eq!(v.saddr.to_string(), "10.0.0.1");
        let mut e = raw(9, 1, "");
        assert_eq!(decode(&bytes(&e)), Err(DecodeError::UnknownFunction(9)));
        e.func = NF_FN_NAT;
        e.hook = 0xff;
        assert_eq!(decode(&bytes(&e)).unwrap().hook, None);
        assert!(decode(&bytes(&e)[..40]).is_err());
        // Through the record dispatch: the header's kind picks the decoder.
        assert!(matches!(
            super::super::decode(&bytes(&e)),
            Ok(crate::model::packet::Event::Verdict(_))
        ));
    }
}
