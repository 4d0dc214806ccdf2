//! Types shared by the eBPF programs and userspace.
//!
//! Everything here crosses the kernel/user boundary byte for byte: `#[repr(C)]`,
//! integers and arrays only, padding spelled out, no bools or enums. Userspace
//! gets `aya::Pod` impls with the `user` feature.
#![no_std]

pub mod event;
pub mod filter;
pub mod monitor;
pub mod nf;
pub mod offsets;

pub use self::{event::*, filter::*, monitor::*, offsets::*};

/// `Offset` value for a member the running kernel does not have.
pub const ABSENT: u32 = u32::MAX;

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are repr(C), made of integers and arrays, with
    // explicit padding fields: every bit pattern is valid.
    unsafe impl aya::Pod for Offsets {}
    unsafe impl aya::Pod for KfreeSkbArgs {}
    unsafe impl aya::Pod for RetransArgs {}
    unsafe impl aya::Pod for Cidr {}
    unsafe impl aya::Pod for Filter {}
    unsafe impl aya::Pod for Endpoint {}
    unsafe impl aya::Pod for FollowValue {}
    unsafe impl aya::Pod for FollowStats {}
    unsafe impl aya::Pod for Evidence {}
    unsafe impl aya::Pod for EventHeader {}
    unsafe impl aya::Pod for PacketId {}
    unsafe impl aya::Pod for DropEvent {}
    unsafe impl aya::Pod for HeadEvent {}
    unsafe impl aya::Pod for RoutedDropEvent {}
    unsafe impl aya::Pod for Counters {}
    unsafe impl aya::Pod for FibLookupArgs {}
    unsafe impl aya::Pod for FibLookup {}
    unsafe impl aya::Pod for FibRecent {}
    unsafe impl aya::Pod for CtTuple {}
    unsafe impl aya::Pod for CtInfo {}
    unsafe impl aya::Pod for PacketEvent {}
    unsafe impl aya::Pod for AbandonEvent {}
    unsafe impl aya::Pod for SrcCheck {}
    unsafe impl aya::Pod for MonitorConfig {}
    unsafe impl aya::Pod for AggKey {}
    unsafe impl aya::Pod for LimiterState {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut out = [0; 16];
        out[..4].copy_from_slice(&a);
        out
    }

    fn cidr(a: [u8; 4], len: u8) -> Cidr {
        Cidr::new(AF_INET, v4(a), len)
    }

    #[test]
    fn cidr_contains() {
        let c = cidr([10, 1, 2, 0], 23);
        assert!(c.contains(AF_INET, &v4([10, 1, 3, 255])));
        assert!(c.contains(AF_INET, &v4([10, 1, 2, 0])));
        assert!(!c.contains(AF_INET, &v4([10, 1, 4, 0])));
        assert!(!c.contains(AF_INET6, &v4([10, 1, 2, 0])));
        assert!(cidr([0, 0, 0, 0], 0).contains(AF_INET, &v4([1, 2, 3, 4])));
        let host = cidr([192, 0, 2, 7], 32);
        assert!(host.contains(AF_INET, &v4([192, 0, 2, 7])));
        assert!(!host.contains(AF_INET, &v4([192, 0, 2, 6])));
    }

    #[test]
    fn layouts_have_no_hidden_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<Offsets>(), 47 * 4);
        assert_eq!(size_of::<RetransArgs>(), 32);
        assert_eq!(size_of::<Endpoint>(), 20);
        assert_eq!(size_of::<FollowValue>(), 16);
        assert_eq!(size_of::<FollowStats>(), 24);
        assert_eq!(size_of::<Evidence>(), 40);
        assert_eq!(size_of::<PacketId>(), 56);
        assert_eq!(size_of::<FibLookup>(), 56);
        assert_eq!(size_of::<FibRecent>(), 8 + 56 * FIB_RECENT);
        assert_eq!(size_of::<Cidr>(), 36);
        assert_eq!(
            size_of::<Filter>(),
            2 * MAX_PORTS + 36 * MAX_HOSTS + 16 + 4 + 4 + 4
        );
        assert_eq!(
            core::mem::offset_of!(Filter, sample_every),
            2 * MAX_PORTS + 36 * MAX_HOSTS + 16 + 4
        );
        assert_eq!(size_of::<EventHeader>(), 16);
        assert_eq!(size_of::<DropEvent>(), 16 + 56 + 8 + 16 + 96 + 8);
        assert_eq!(
            size_of::<RoutedDropEvent>(),
            size_of::<DropEvent>() + 56 * FIB_RECENT
        );
        assert_eq!(size_of::<CtTuple>(), 40);
        assert_eq!(size_of::<CtInfo>(), 96);
        assert_eq!(size_of::<PacketEvent>(), 16 + 56 + 96);
        assert_eq!(size_of::<AbandonEvent>(), 16 + 56 + 8);
        assert_eq!(size_of::<Counters>(), 40);
        assert_eq!(size_of::<MonitorConfig>(), 8);
        assert_eq!(size_of::<HeadEvent>(), 16 + HEAD_BYTES);
        assert_eq!(size_of::<AggKey>(), 16);
        assert_eq!(size_of::<LimiterState>(), 16);
    }

    #[test]
    fn the_final_acks_reason_skips_the_flags_test() {
        let mut f = Filter::zeroed();
        f.tcp_flags_any = TCP_SYN;
        // Unset: every reason keeps the flags test (0 is NOT_SPECIFIED).
        assert_eq!(f.drop_flags(0), TCP_SYN);
        f.final_ack_reason = 70;
        assert_eq!(f.drop_flags(70), 0);
        assert_eq!(f.drop_flags(71), TCP_SYN);
    }

    #[test]
    fn route_reasons_bitmap() {
        let mut e = Evidence::zeroed();
        e.add(16);
        e.add(89);
        e.add(255);
        e.add(300);
        assert!(e.wants_routes(16, true) && e.wants_routes(89, true) && e.wants_routes(255, true));
        assert!(!e.wants_routes(17, true) && !e.wants_routes(300, true));
        assert!(!e.wants_routes(16, false));
        e.route_without_reason = 1;
        assert!(e.wants_routes(0, false));
    }

    #[test]
    fn endpoints_ignore_bytes_past_an_ipv4_address() {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&[10, 0, 0, 1]);
        let mut b = a;
        b[9] = 7;
        assert_eq!(
            Endpoint::new(AF_INET, &a, 80),
            Endpoint::new(AF_INET, &b, 80)
        );
        assert_ne!(
            Endpoint::new(AF_INET6, &a, 80),
            Endpoint::new(AF_INET6, &b, 80)
        );
    }

    #[test]
    fn service_ports() {
        // SYN: the destination; SYN-ACK: the source; else the lower.
        assert_eq!(service_port(TCP_SYN, 40000, 80), 80);
        assert_eq!(service_port(TCP_SYN | TCP_ACK, 80, 40000), 80);
        assert_eq!(service_port(TCP_SYN | TCP_ECE | TCP_CWR, 40000, 8080), 8080);
        assert_eq!(service_port(TCP_RST | TCP_ACK, 40000, 443), 443);
        assert_eq!(service_port(TCP_ACK, 22, 51000), 22);
    }

    #[test]
    fn every_packet_of_one_handshake_names_the_clients_isn() {
        let isn = 0x8000_0000u32;
        // The client's SYN, the server's SYN-ACK (its own ISN in seq).
        assert_eq!(handshake_isn(TCP_SYN, isn, 0), isn);
        assert_eq!(handshake_isn(TCP_SYN | TCP_ECE | TCP_CWR, isn, 0), isn);
        assert_eq!(handshake_isn(TCP_SYN | TCP_ACK, 77, isn + 1), isn);
        // No listener: RST|ACK acknowledging the SYN.
        assert_eq!(handshake_isn(TCP_RST | TCP_ACK, 0, isn + 1), isn);
        // The client refusing a SYN-ACK (seq = its ack), its final ACK.
        assert_eq!(handshake_isn(TCP_RST, isn + 1, 0), isn);
        assert_eq!(handshake_isn(TCP_ACK, isn + 1, 78), isn);
        // Wrapping at both ends of the sequence space.
        assert_eq!(handshake_isn(TCP_SYN | TCP_ACK, 1, 0), u32::MAX);
        assert_eq!(handshake_isn(TCP_RST, 0, 0), u32::MAX);
    }
}
