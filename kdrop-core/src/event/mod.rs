//! Decoding ring buffer records (kdrop-common's `#[repr(C)]` types) into
//! owned events. Pure: bytes in, `model::packet` values out; a short or
//! malformed record is an error, never a panic.
pub mod verdict;

use std::{
    borrow::Cow,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use kdrop_common::{
    nf::EVENT_NF_VERDICT, AbandonEvent, CtInfo, CtTuple, DropEvent, EventHeader, FibLookup,
    HeadEvent, PacketEvent, PacketId, RoutedDropEvent, ABSENT, AF_INET, AF_INET6, EVENT_ABANDON,
    EVENT_DROP, EVENT_DROP_ROUTED, EVENT_EGRESS, EVENT_HEAD, EVENT_RETRANS, FIB_PER_EVENT,
    FIB_RECENT, FIB_WINDOW_NS,
};

use crate::model::packet::{Abandon, Ct, Drop, Event, Head, Lookup, Packet, Tuple};

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
pub fn route_lookups(e: &RoutedDropEvent) -> Vec<Lookup> {
    let d = &e.drop;
    if d.fib_next == u32::MAX || d.pkt.family != AF_INET {
        return Vec::new();
    }
    let (src, dst) = (&d.pkt.saddr[..4], &d.pkt.daddr[..4]);
    (0..FIB_RECENT)
        .map(|i| &e.fib[(d.fib_next as usize + i) % FIB_RECENT])
        .filter(|l| {
            let age = d.header.ts_ns.checked_sub(l.ts_ns);
            let fresh = l.ts_ns != 0 && age.is_some_and(|a| a < FIB_WINDOW_NS);
            let forward = l.saddr == src && l.daddr == dst;
            let reverse = l.saddr == dst && l.daddr == src;
            fresh && (forward || reverse) && (l.netns == 0 || l.netns == d.pkt.netns)
        })
        .take(FIB_PER_EVENT)
        .map(Lookup::from)
        .collect()
}

fn tuple(p: &PacketId) -> Result<Tuple, DecodeError> {
    Ok(Tuple {
        src: SocketAddr::new(addr(p.family, p.saddr)?, p.sport),
        dst: SocketAddr::new(addr(p.family, p.daddr)?, p.dport),
    })
}

fn drop(e: &DropEvent, fib: Vec<Lookup>) -> Result<Drop, DecodeError> {
    let p = &e.pkt;
    Ok(Drop {
        ts_ns: e.header.ts_ns,
        cpu: e.header.cpu,
        location: e.location,
        reason: e.reason,
        netns: p.netns,
        ifindex: p.ifindex,
        mark: p.mark,
        saddr: addr(p.family, p.saddr)?,
        daddr: addr(p.family, p.daddr)?,
        sport: p.sport,
        dport: p.dport,
        tcp_flags: p.tcp_flags,
        isn: p.isn,
        fib,
        ct: ct(p.family, &e.ct)?,
        src_check: (e.src_check_seen != 0).then_some(e.src_check_ret),
        src_mac: (e.src_mac_seen != 0).then_some(e.src_mac),
    })
}

fn packet(e: &PacketEvent) -> Result<Packet, DecodeError> {
    Ok(Packet {
        ts_ns: e.header.ts_ns,
        netns: e.pkt.netns,
        ifindex: e.pkt.ifindex,
        mark: e.pkt.mark,
        tuple: tuple(&e.pkt)?,
        tcp_flags: e.pkt.tcp_flags,
        isn: e.pkt.isn,
        ct: ct(e.pkt.family, &e.ct)?,
    })
}

fn abandon(e: &AbandonEvent) -> Result<Abandon, DecodeError> {
    Ok(Abandon {
        packet: Packet {
            ts_ns: e.header.ts_ns,
            netns: e.pkt.netns,
            ifindex: 0,
            mark: 0,
            tuple: tuple(&e.pkt)?,
            tcp_flags: e.pkt.tcp_flags,
            isn: e.pkt.isn,
            ct: None,
        },
        err: e.err,
        retransmits: (e.retransmits != ABSENT).then_some(e.retransmits),
    })
}

/// The bytes a drop record gained when drops began to carry their source
/// MAC (`DropEvent::src_mac`, `src_mac_seen`, `_pad`, after `ct`).
const SRC_MAC_BYTES: usize = 8;

/// A drop record of the layout before `src_mac` (a bundle recorded then),
/// padded to today's with no MAC seen; any other record as it is.
fn upgraded(data: &[u8], kind: u32) -> Cow<'_, [u8]> {
    let at = size_of::<DropEvent>() - SRC_MAC_BYTES;
    let old = match kind {
        EVENT_DROP => size_of::<DropEvent>() - SRC_MAC_BYTES,
        EVENT_DROP_ROUTED => size_of::<RoutedDropEvent>() - SRC_MAC_BYTES,
        _ => return Cow::Borrowed(data),
    };
    if data.len() != old {
        return Cow::Borrowed(data);
    }
    let mut v = Vec::with_capacity(data.len() + SRC_MAC_BYTES);
    v.extend_from_slice(&data[..at]);
    v.extend_from_slice(&[0; SRC_MAC_BYTES]);
    v.extend_from_slice(&data[at..]);
    Cow::Owned(v)
}

/// Decodes one ring buffer record.
pub fn decode(data: &[u8]) -> Result<Event, DecodeError> {
    let header: EventHeader = read(data, 0)?;
    let buf = upgraded(data, header.kind);
    let data: &[u8] = &buf;
    match header.kind {
        EVENT_DROP => {
            let e: DropEvent = read(data, header.kind)?;
            Ok(Event::Drop(drop(&e, Vec::new())?))
        }
        EVENT_DROP_ROUTED => {
            let e: RoutedDropEvent = read(data, header.kind)?;
            Ok(Event::Drop(drop(&e.drop, route_lookups(&e))?))
        }
        EVENT_EGRESS => Ok(Event::Egress(packet(&read(data, header.kind)?)?)),
        EVENT_RETRANS => Ok(Event::Retrans(packet(&read(data, header.kind)?)?)),
        EVENT_ABANDON => Ok(Event::Abandon(abandon(&read(data, header.kind)?)?)),
        EVENT_NF_VERDICT => verdict::decode(data).map(Event::Verdict),
        EVENT_HEAD => {
            let e: HeadEvent = read(data, header.kind)?;
            Ok(Event::Head(Head {
                cpu: e.header.cpu,
                ts_ns: e.header.ts_ns,
                bytes: e.bytes.to_vec(),
            }))
        }
        k => Err(DecodeError::UnknownKind(k)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::model::packet::tcp_flags;
    use kdrop_common::{ABSENT, TCP_ACK, TCP_RST, TCP_SYN};

    use super::*;

    pub fn raw_v4(saddr: [u8; 4], daddr: [u8; 4], sport: u16, dport: u16) -> DropEvent {
        let mut pkt = PacketId {
            netns: 4026532000,
            ifindex: 3,
            sport,
            dport,
            family: AF_INET,
            tcp_flags: TCP_SYN,
            ..PacketId::zeroed()
        };
        pkt.saddr[..4].copy_from_slice(&saddr);
        pkt.daddr[..4].copy_from_slice(&daddr);
        DropEvent {
            header: EventHeader {
                kind: EVENT_DROP,
                cpu: 1,
                ts_ns: 42,
            },
            pkt,
            location: 0xffff_ffff_8100_0000,
            reason: 16,
            src_check_ret: 0,
            src_check_seen: 0,
            fib_next: u32::MAX,
            ct: CtInfo::zeroed(),
            src_mac: [0; 6],
            src_mac_seen: 0,
            _pad: 0,
        }
    }

    /// The same drop with an empty ring of route lookups.
    fn routed(mut drop: DropEvent) -> RoutedDropEvent {
        drop.header.kind = EVENT_DROP_ROUTED;
        drop.fib_next = 0;
        RoutedDropEvent {
            drop,
            fib: [FibLookup::zeroed(); FIB_RECENT],
        }
    }

    pub fn bytes<T: Copy>(e: &T) -> Vec<u8> {
        // SAFETY: the record types are Pod.
        unsafe { std::slice::from_raw_parts((e as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
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

    /// The neighbour's MAC the kernel copied; none when it says it saw none.
    #[test]
    fn decodes_the_source_mac() {
        let mut e = raw_v4([198, 51, 100, 7], [10, 0, 2, 20], 40000, 8080);
        e.src_mac = [2, 0, 0, 0, 0xe7, 3];
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(d.src_mac, None, "src_mac_seen is 0");
        e.src_mac_seen = 1;
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(d.src_mac, Some([2, 0, 0, 0, 0xe7, 3]));
    }

    /// Records written before drops carried their MAC (bundles) are 8
    /// bytes shorter: read as they were, with no MAC; a routed one keeps
    /// its lookups, which follow the drop part.
    #[test]
    fn decodes_drops_recorded_before_the_source_mac() {
        let e = raw_v4([198, 51, 100, 7], [10, 0, 2, 20], 40000, 8080);
        let old = bytes(&e)[..size_of::<DropEvent>() - SRC_MAC_BYTES].to_vec();
        let Ok(Event::Drop(d)) = decode(&old) else {
            panic!()
        };
        assert_eq!((d.sport, d.src_mac), (40000, None));
        let mut r = routed(e);
        r.drop.header.ts_ns = 1_000_000;
        r.fib[0] = lookup(999_000, [10, 0, 2, 20], [198, 51, 100, 7]);
        let whole = bytes(&r);
        let at = size_of::<DropEvent>() - SRC_MAC_BYTES;
        let old = [&whole[..at], &whole[size_of::<DropEvent>()..]].concat();
        let Ok(Event::Drop(d)) = decode(&old) else {
            panic!()
        };
        assert_eq!((d.fib.len(), d.src_mac), (1, None));
        assert_eq!(d.fib[0].dst, Ipv4Addr::new(198, 51, 100, 7));
        // Shorter still: an error, not a guess.
        assert!(decode(&old[..old.len() - 1]).is_err());
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
        let mut e = routed(raw_v4([198, 51, 100, 7], [10, 0, 2, 20], 40000, 8080));
        e.drop.header.ts_ns = 1_000_000_000;
        e.drop.fib_next = 5;
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
        e.drop.fib_next = u32::MAX;
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert!(d.fib.is_empty());
    }

    #[test]
    fn route_lookups_are_the_packets_own_oldest_first() {
        let (c, s) = ([198, 51, 100, 7], [10, 0, 2, 20]);
        let mut e = routed(raw_v4(c, s, 40000, 8080));
        e.drop.header.ts_ns = 50_000_000;
        // The ring wrapped: slot 14 is the oldest, slot 13 the newest.
        e.drop.fib_next = 14;
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
        e.fib[4].netns = e.drop.pkt.netns;
        assert_eq!(route_lookups(&e).len(), 5);
        // A corrupt cursor never reads past the ring.
        e.drop.fib_next = u32::MAX - 1;
        assert_eq!(route_lookups(&e).len(), 5);
    }

    /// The window's edge, half-matching addresses and an empty slot
    /// (cargo-mutants found them unchecked): a lookup exactly FIB_WINDOW_NS
    /// old is another packet's,
    /// and a slot never written (ts 0) is nothing, even for a drop in the
    /// first window after boot whose addresses it happens to hold.
    #[test]
    fn route_lookups_window_edge_and_empty_slots() {
        let (c, s) = ([198, 51, 100, 7], [10, 0, 2, 20]);
        let mut e = routed(raw_v4(c, s, 40000, 8080));
        e.drop.header.ts_ns = 50_000_000;
        e.fib[0] = lookup(50_000_000 - FIB_WINDOW_NS, c, s);
        e.fib[1] = lookup(50_000_000 - FIB_WINDOW_NS + 1, c, s);
        // Half a reverse lookup (from the server, to someone else) is not one.
        e.fib[2] = lookup(45_000_000, s, [10, 0, 2, 99]);
        e.fib[3] = lookup(45_000_001, [10, 0, 2, 99], c);
        let got: Vec<u64> = route_lookups(&e).iter().map(|l| l.ts_ns).collect();
        assert_eq!(got, [50_000_000 - FIB_WINDOW_NS + 1]);
        let mut e = routed(raw_v4(c, s, 40000, 8080));
        e.drop.header.ts_ns = 1_000;
        e.fib[0] = lookup(0, c, s);
        assert!(route_lookups(&e).is_empty());
    }

    /// What fib_validate_source returned, only when the probe saw it.
    #[test]
    fn source_check_only_when_seen() {
        let mut e = raw_v4([198, 51, 100, 7], [10, 0, 2, 20], 40000, 8080);
        e.src_check_ret = -18;
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(d.src_check, None);
        e.src_check_seen = 1;
        let Ok(Event::Drop(d)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(d.src_check, Some(-18));
    }

    #[test]
    fn decode_errors_say_what_was_wrong() {
        let cases = [
            (
                DecodeError::Short { kind: 3, len: 7 },
                "record of kind 3 too short (7 bytes)",
            ),
            (DecodeError::UnknownKind(99), "unknown record kind 99"),
            (DecodeError::BadFamily(7), "unknown address family 7"),
            (
                DecodeError::UnknownFunction(9),
                "verdict record of unknown function 9",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }

    #[test]
    fn route_lookups_keep_at_most_fib_per_event() {
        let (c, s) = ([198, 51, 100, 7], [10, 0, 2, 20]);
        let mut e = routed(raw_v4(c, s, 40000, 8080));
        e.drop.header.ts_ns = 50_000_000;
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
        e.pkt.family = AF_INET6;
        e.pkt.saddr = "2001:db8::7".parse::<Ipv6Addr>().unwrap().octets();
        e.pkt.daddr = "fd00::1".parse::<Ipv6Addr>().unwrap().octets();
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
        bad.pkt.family = 9;
        assert_eq!(decode(&bytes(&bad)), Err(DecodeError::BadFamily(9)));
        // A routed drop's kind on a bare drop's bytes: too short.
        let mut short = e;
        short.header.kind = EVENT_DROP_ROUTED;
        assert!(matches!(
            decode(&bytes(&short)),
            Err(DecodeError::Short { .. })
        ));
    }

    #[test]
    fn decodes_retransmissions_and_egress_packets() {
        let d = raw_v4([10, 0, 0, 1], [10, 96, 0, 10], 43534, 80);
        let mut e = PacketEvent {
            header: EventHeader {
                kind: EVENT_RETRANS,
                cpu: 0,
                ts_ns: 7,
            },
            pkt: d.pkt,
            ct: CtInfo::zeroed(),
        };
        let Ok(Event::Retrans(p)) = decode(&bytes(&e)) else {
            panic!()
        };
        assert_eq!(p.tuple.src.to_string(), "10.0.0.1:43534");
        assert_eq!(p.tuple.dst.to_string(), "10.96.0.10:80");
        assert_eq!((p.netns, p.tcp_flags, p.ct), (4026532000, TCP_SYN, None));
        e.header.kind = EVENT_EGRESS;
        assert!(matches!(decode(&bytes(&e)), Ok(Event::Egress(_))));
    }

    #[test]
    fn flags() {
        assert_eq!(tcp_flags(TCP_SYN), "SYN");
        assert_eq!(tcp_flags(TCP_SYN | TCP_ACK), "SYN|ACK");
        assert_eq!(tcp_flags(TCP_RST | TCP_ACK), "RST|ACK");
        assert_eq!(tcp_flags(0), "none");
    }
}
