//! Decoding ring buffer records (kdrop-common's `#[repr(C)]` types) into
//! owned events. Pure: bytes in, `model::packet` values out; a short or
//! malformed record is an error, never a panic.
pub mod verdict;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use kdrop_common::{
    nf::EVENT_NF_VERDICT, CtInfo, CtTuple, DropEvent, EventHeader, FibLookup, PacketEvent, AF_INET,
    AF_INET6, EVENT_DROP, EVENT_EGRESS, FIB_PER_EVENT, FIB_RECENT, FIB_WINDOW_NS,
};

use crate::model::packet::{Ct, Drop, Event, Lookup, Packet, Tuple};

impl From<&FibLookup> for Lookup {
    fn from(f: &FibLookup) -> Self {
        Lookup {
            ts_ns: f.ts_ns,
            table: f.tb_id,
            err: f.err,
            iif: f.iif,
            oif: f.oif,
            mark: f.mark,
            src: Ipv4Addr::from(f.saddr),
            dst: Ipv4Addr::from(f.daddr),
            res_ifindex: f.res_ifindex,
            gw: (f.gw_family == AF_INET).then(|| Ipv4Addr::from(f.gw)),
            scope: f.scope,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    Short {
        kind: u32,
        len: usize,
    },
    UnknownKind(u32),
    BadFamily(u8),
    /// A verdict record naming a function kdrop does not follow.
    UnknownFunction(u8),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Short { kind, len } => write!(f, "record of kind {kind} too short ({len} bytes)"),
            Self::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            Self::BadFamily(fam) => write!(f, "unknown address family {fam}"),
            Self::UnknownFunction(n) => write!(f, "verdict record of unknown function {n}"),
        }
    }
}

impl std::error::Error for DecodeError {}

fn read<T: Copy>(data: &[u8], kind: u32) -> Result<T, DecodeError> {
    if data.len() < size_of::<T>() {
        return Err(DecodeError::Short {
            kind,
            len: data.len(),
        });
    }
    // SAFETY: length checked; T is a repr(C) Pod type; unaligned read.
    Ok(unsafe { std::ptr::read_unaligned(data.as_ptr().cast::<T>()) })
}

fn addr(family: u8, bytes: [u8; 16]) -> Result<IpAddr, DecodeError> {
    match family {
        AF_INET => Ok(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        AF_INET6 => Ok(IpAddr::V6(Ipv6Addr::from(bytes))),
        f => Err(DecodeError::BadFamily(f)),
    }
}

fn ct(family: u8, c: &CtInfo) -> Result<Option<Ct>, DecodeError> {
    if c.present == 0 {
        return Ok(None);
    }
    let tuple = |t: &CtTuple| -> Result<Tuple, DecodeError> {
        Ok(Tuple {
            src: SocketAddr::new(addr(family, t.saddr)?, t.sport),
            dst: SocketAddr::new(addr(family, t.daddr)?, t.dport),
        })
    };
    Ok(Some(Ct {
        orig: tuple(&c.orig)?,
        reply: tuple(&c.reply)?,
        status: c.status,
        mark: c.mark,
        zone: c.zone,
        ctinfo: c.ctinfo,
    }))
}

/// The dropped packet's own route lookups out of the CPU ring the kernel
/// copied (`ring[next]` is the oldest), oldest first, at most
/// `FIB_PER_EVENT`: those at most `FIB_WINDOW_NS` before the drop (same CPU,
/// same softirq), for the packet's addresses forward (its route) or swapped
/// (the reverse-path check), with a result in the drop's namespace or no
/// result (a lookup that finds nothing does not say where it ran). A lookup
/// whose result lives in another namespace is the sender's, on a veth.
pub fn route_lookups(e: &DropEvent) -> Vec<Lookup> {
    if e.fib_valid == 0 || e.family != AF_INET {
        return Vec::new();
    }
    let (s, d) = (&e.saddr[..4], &e.daddr[..4]);
    (0..FIB_RECENT)
        .map(|i| &e.fib[(e.fib_next as usize + i) % FIB_RECENT])
        .filter(|l| {
            let age = e.header.ts_ns.checked_sub(l.ts_ns);
            let fresh = l.ts_ns != 0 && age.is_some_and(|a| a < FIB_WINDOW_NS);
            let forward = l.saddr == s && l.daddr == d;
            let reverse = l.saddr == d && l.daddr == s;
            fresh && (forward || reverse) && (l.netns == 0 || l.netns == e.netns)
        })
        .take(FIB_PER_EVENT)
        .map(Lookup::from)
        .collect()
}

/// Decodes one ring buffer record.
pub fn decode(data: &[u8]) -> Result<Event, DecodeError> {
    let header: EventHeader = read(data, 0)?;
    match header.kind {
        EVENT_DROP => {
            let e: DropEvent = read(data, header.kind)?;
            Ok(Event::Drop(Drop {
                ts_ns: e.header.ts_ns,
                cpu: e.header.cpu,
                location: e.location,
                reason: e.reason,
                netns: e.netns,
                ifindex: e.ifindex,
                mark: e.mark,
                saddr: addr(e.family, e.saddr)?,
                daddr: addr(e.family, e.daddr)?,
                sport: e.sport,
                dport: e.dport,
                tcp_flags: e.tcp_flags,
                fib: route_lookups(&e),
                ct: ct(e.family, &e.ct)?,
                src_check: (e.src_check_seen != 0).then_some(e.src_check_ret),
            }))
        }
        EVENT_EGRESS => {
            let e: PacketEvent = read(data, header.kind)?;
            Ok(Event::Egress(Packet {
                ts_ns: e.header.ts_ns,
                netns: e.netns,
                ifindex: e.ifindex,
                mark: e.mark,
                tuple: Tuple {
                    src: SocketAddr::new(addr(e.family, e.saddr)?, e.sport),
                    dst: SocketAddr::new(addr(e.family, e.daddr)?, e.dport),
                },
                tcp_flags: e.tcp_flags,
                ct: ct(e.family, &e.ct)?,
            }))
        }
        EVENT_NF_VERDICT => verdict::decode(data).map(Event::Verdict),
        k => Err(DecodeError::UnknownKind(k)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::model::packet::tcp_flags;
    use kdrop_common::{ABSENT, TCP_ACK, TCP_RST, TCP_SYN};

    use super::*;

    pub fn raw_v4(saddr: [u8; 4], daddr: [u8; 4], sport: u16, dport: u16) -> DropEvent {
        let mut s = [0; 16];
        let mut d = [0; 16];
        s[..4].copy_from_slice(&saddr);
        d[..4].copy_from_slice(&daddr);
        DropEvent {
            header: EventHeader {
                kind: EVENT_DROP,
                cpu: 1,
                ts_ns: 42,
            },
            location: 0xffff_ffff_8100_0000,
            reason: 16,
            netns: 4026532000,
            ifindex: 3,
            mark: 0,
            saddr: s,
            daddr: d,
            sport,
            dport,
            family: AF_INET,
            tcp_flags: TCP_SYN,
            _pad: [0; 2],
            fib_valid: 0,
            fib_next: 0,
            fib: [FibLookup::zeroed(); FIB_RECENT],
            ct: CtInfo::zeroed(),
            src_check_ret: 0,
            src_check_seen: 0,
        }
    }

    pub fn bytes(e: &DropEvent) -> Vec<u8> {
        // SAFETY: DropEvent is Pod.
        unsafe {
            std::slice::from_raw_parts((e as *const DropEvent).cast::<u8>(), size_of::<DropEvent>())
        }
        .to_vec()
    }

    #[test]
    fn decodes_v4_drop() {
        let e = raw_v4([198, 51, 100, 7], [10, 0, 2, 20], 40000, 8080);
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(d.saddr, "198.51.100.7".parse::<IpAddr>().unwrap());
        assert_eq!(d.ct, None);
        assert_eq!(d.daddr, "10.0.2.20".parse::<IpAddr>().unwrap());
        assert_eq!(
            (d.sport, d.dport, d.reason, d.ifindex),
            (40000, 8080, 16, 3)
        );
        assert_eq!(d.netns, 4026532000);
    }

    /// A lookup of `src -> dst` at `ts_ns`.
    fn lookup(ts_ns: u64, src: [u8; 4], dst: [u8; 4]) -> FibLookup {
        FibLookup {
            ts_ns,
            tb_id: 254,
            saddr: src,
            daddr: dst,
            ..FibLookup::zeroed()
        }
    }

    #[test]
    fn decodes_route_lookups() {
        let mut e = raw_v4([198, 51, 100, 7], [10, 0, 2, 20], 40000, 8080);
        e.header.ts_ns = 1_000_000_000;
        e.fib_valid = 1;
        e.fib_next = 5;
        // The reverse-path lookup (swapped addresses) fails in table 255...
        e.fib[5] = FibLookup {
            tb_id: 255,
            err: -11,
            iif: 1,
            ..lookup(999_000_000, [10, 0, 2, 20], [198, 51, 100, 7])
        };
        // ...and finds a gateway in the main table.
        e.fib[6] = FibLookup {
            res_ifindex: 2,
            gw: [10, 0, 1, 1],
            gw_family: AF_INET,
            netns: 4026532000,
            ..lookup(999_000_100, [10, 0, 2, 20], [198, 51, 100, 7])
        };
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(d.fib.len(), 2);
        assert_eq!(d.fib[0].table, 255);
        assert_eq!(d.fib[0].err, -11);
        assert_eq!(d.fib[0].gw, None);
        assert_eq!(d.fib[1].table, 254);
        assert_eq!(d.fib[1].gw, Some(Ipv4Addr::new(10, 0, 1, 1)));
        assert_eq!(d.fib[1].dst, Ipv4Addr::new(198, 51, 100, 7));
        // Not a copy of the ring: nothing.
        e.fib_valid = 0;
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert!(d.fib.is_empty());
    }

    #[test]
    fn route_lookups_are_the_packets_own_oldest_first() {
        let (c, s) = ([198, 51, 100, 7], [10, 0, 2, 20]);
        let mut e = raw_v4(c, s, 40000, 8080);
        e.header.ts_ns = 50_000_000;
        e.fib_valid = 1;
        // The ring wrapped: slot 14 is the oldest, slot 13 the newest.
        e.fib_next = 14;
        for (slot, ts) in [
            (14, 41_000_001),
            (15, 41_000_002),
            (0, 41_000_003),
            (13, 49_999_999),
        ] {
            e.fib[slot] = lookup(ts, c, s);
        }
        // Other packets, a stale lookup, a lookup after the drop (not
        // possible on one CPU, never trusted), another namespace's result.
        e.fib[1] = lookup(45_000_000, c, [10, 0, 2, 21]);
        e.fib[2] = lookup(39_999_999, c, s);
        e.fib[3] = lookup(50_000_001, c, s);
        e.fib[4] = FibLookup {
            netns: 4026532999,
            ..lookup(45_000_000, s, c)
        };
        let got: Vec<u64> = route_lookups(&e).iter().map(|l| l.ts_ns).collect();
        assert_eq!(got, [41_000_001, 41_000_002, 41_000_003, 49_999_999]);
        // The same namespace's result, or none, counts.
        e.fib[4].netns = e.netns;
        assert_eq!(route_lookups(&e).len(), 5);
        // A corrupt cursor never reads past the ring.
        e.fib_next = u32::MAX;
        assert_eq!(route_lookups(&e).len(), 5);
    }

    #[test]
    fn route_lookups_keep_at_most_fib_per_event() {
        let (c, s) = ([198, 51, 100, 7], [10, 0, 2, 20]);
        let mut e = raw_v4(c, s, 40000, 8080);
        e.header.ts_ns = 50_000_000;
        e.fib_valid = 1;
        for (i, l) in e.fib.iter_mut().enumerate() {
            *l = lookup(45_000_000 + i as u64, c, s);
        }
        let got = route_lookups(&e);
        assert_eq!(got.len(), FIB_PER_EVENT);
        assert_eq!(got[0].ts_ns, 45_000_000);
    }

    #[test]
    fn decodes_conntrack_entry() {
        let mut e = raw_v4([10, 244, 1, 5], [10, 244, 1, 9], 43534, 80);
        e.ct.present = 1;
        e.ct.status = 0b10_1000; // CONFIRMED | DST_NAT
        let t = |s: [u8; 4], sp, d: [u8; 4], dp| {
            let mut x = CtTuple::zeroed();
            x.saddr[..4].copy_from_slice(&s);
            x.daddr[..4].copy_from_slice(&d);
            x.sport = sp;
            x.dport = dp;
            x
        };
        e.ct.orig = t([10, 244, 1, 5], 43534, [10, 96, 0, 10], 80);
        e.ct.reply = t([10, 244, 1, 9], 80, [10, 244, 1, 5], 43534);
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        let ct = d.ct.unwrap();
        assert_eq!(ct.orig.dst.to_string(), "10.96.0.10:80");
        assert_eq!(ct.reply.src.to_string(), "10.244.1.9:80");
        assert_eq!(ct.reply.reversed().dst.to_string(), "10.244.1.9:80");
        assert_eq!(ct.status, 0b10_1000);
    }

    #[test]
    fn decodes_v6_drop() {
        let mut e = raw_v4([0; 4], [0; 4], 1, 2);
        e.family = AF_INET6;
        e.saddr = "2001:db8::7".parse::<Ipv6Addr>().unwrap().octets();
        e.daddr = "fd00::1".parse::<Ipv6Addr>().unwrap().octets();
        e.reason = ABSENT;
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(d.saddr.to_string(), "2001:db8::7");
        assert_eq!(d.daddr.to_string(), "fd00::1");
        assert_eq!(d.reason, ABSENT);
    }

    #[test]
    fn rejects_bad_records() {
        assert!(matches!(decode(&[]), Err(DecodeError::Short { .. })));
        let e = raw_v4([1, 2, 3, 4], [5, 6, 7, 8], 1, 2);
        let b = bytes(&e);
        assert!(matches!(decode(&b[..40]), Err(DecodeError::Short { .. })));
        let mut bad = e;
        bad.header.kind = 77;
        assert_eq!(decode(&bytes(&bad)), Err(DecodeError::UnknownKind(77)));
        let mut bad = e;
        bad.family = 9;
        assert_eq!(decode(&bytes(&bad)), Err(DecodeError::BadFamily(9)));
    }

    #[test]
    fn flags() {
        assert_eq!(tcp_flags(TCP_SYN), "SYN");
        assert_eq!(tcp_flags(TCP_SYN | TCP_ACK), "SYN|ACK");
        assert_eq!(tcp_flags(TCP_RST | TCP_ACK), "RST|ACK");
        assert_eq!(tcp_flags(0), "none");
    }
}
