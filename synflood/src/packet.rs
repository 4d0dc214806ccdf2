//! Building one Ethernet + IPv4 + TCP SYN frame.
use crate::Flood;

const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const TCP_LEN: usize = 20;
pub const FRAME_LEN: usize = ETH_LEN + IP_LEN + TCP_LEN;

/// RFC 1071 ones' complement sum, folded, not yet complemented.
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for pair in data.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        acc += u32::from(word);
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

fn checksum(data: &[u8], acc: u32) -> u16 {
    !(sum16(data, acc) as u16)
}

/// A SYN `f.src:sport -> f.dst:f.dport` with sequence number `seq`.
pub fn syn_frame(f: &Flood, sport: u16, seq: u32) -> [u8; FRAME_LEN] {
    let mut b = [0u8; FRAME_LEN];
    b[0..6].copy_from_slice(&f.dst_mac);
    b[6..12].copy_from_slice(&f.src_mac);
    b[12..14].copy_from_slice(&0x0800u16.to_be_bytes());

    let ip = &mut b[ETH_LEN..ETH_LEN + IP_LEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((IP_LEN + TCP_LEN) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&(seq as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64; // TTL
    ip[9] = 6; // TCP
    ip[12..16].copy_from_slice(&f.src.octets());
    ip[16..20].copy_from_slice(&f.dst.octets());
    let c = checksum(ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());

    let tcp = &mut b[ETH_LEN + IP_LEN..];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&f.dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[12] = (TCP_LEN as u8 / 4) << 4;
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    // Pseudo-header: addresses, protocol, TCP length.
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&f.src.octets());
    pseudo[4..8].copy_from_slice(&f.dst.octets());
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&(TCP_LEN as u16).to_be_bytes());
    let c = checksum(tcp, sum16(&pseudo, 0));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use super::*;

    fn flood() -> Flood {
        Flood {
            ifname: "c0".into(),
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: Ipv4Addr::new(10, 250, 0, 1),
            dst: Ipv4Addr::new(10, 250, 0, 2),
            dport: 8080,
            sport_base: 1024,
            sport_span: 1000,
            count: 1,
            duration: Duration::from_secs(1),
            cpu: None,
        }
    }

    #[test]
    fn frame_fields() {
        let b = syn_frame(&flood(), 40000, 7);
        assert_eq!(&b[0..6], &[2, 0, 0, 0, 0, 2]);
        assert_eq!(&b[12..14], &[0x08, 0x00]);
        assert_eq!(&b[26..30], &[10, 250, 0, 1]);
        assert_eq!(&b[30..34], &[10, 250, 0, 2]);
        assert_eq!(u16::from_be_bytes([b[34], b[35]]), 40000);
        assert_eq!(u16::from_be_bytes([b[36], b[37]]), 8080);
        assert_eq!(u32::from_be_bytes([b[38], b[39], b[40], b[41]]), 7);
        assert_eq!(b[47], 0x02);
    }

    #[test]
    fn checksums_verify() {
        let b = syn_frame(&flood(), 51234, 0xdead_beef);
        // A header with its checksum in place sums to all ones.
        assert_eq!(sum16(&b[14..34], 0), 0xffff);
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&b[26..30]);
        pseudo[4..8].copy_from_slice(&b[30..34]);
        pseudo[9] = 6;
        pseudo[11] = 20;
        assert_eq!(sum16(&b[34..], sum16(&pseudo, 0)), 0xffff);
        // RFC 1071's worked example: 0001 f203 f4f5 f6f7 -> sum ddf2.
        assert_eq!(
            sum16(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7], 0),
            0xddf2
        );
    }
}
