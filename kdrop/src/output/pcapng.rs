//! pcapng blocks (https://www.ietf.org/archive/id/draft-ietf-opsawg-pcapng-02.html):
//! a section header, one interface per (namespace, interface), one
//! enhanced packet per record with its reason, location and cause in the
//! comment, and interface statistics with what never reached the file.
//! Bytes only; the file is the session's.

/// Packets start at the IP header (kdrop copies from `network_header`):
/// LINKTYPE_RAW, IPv4 or IPv6 by the version nibble.
pub const LINKTYPE_RAW: u16 = 101;

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 1;
const ISB: u32 = 5;
const EPB: u32 = 6;
const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_DESCRIPTION: u16 = 3;
const IF_TSRESOL: u16 = 9;
const ISB_OSDROP: u16 = 7;

fn option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&(value.len() as u16).to_le_bytes());
    out.extend_from_slice(value);
    pad(out);
}

fn pad(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// A block: type, total length, body, options, total length again.
fn block(kind: u32, body: &[u8], options: &[(u16, &[u8])]) -> Vec<u8> {
    let mut inner = body.to_vec();
    pad(&mut inner);
    if !options.is_empty() {
        for (code, value) in options {
            option(&mut inner, *code, value);
        }
        option(&mut inner, OPT_END, &[]);
    }
    let len = (inner.len() + 12) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&inner);
    out.extend_from_slice(&len.to_le_bytes());
    out
}

/// The section header: byte order, version 1.0, length unknown.
pub fn section_header(app: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&0x1A2B_3C4Du32.to_le_bytes());
    body.extend_from_slice(&1u16.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&(-1i64).to_le_bytes());
    block(SHB, &body, &[(SHB_USERAPPL, app.as_bytes())])
}

/// An interface whose packets start at the IP header, timestamps in ns.
pub fn interface(name: &str, description: &str, snaplen: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&LINKTYPE_RAW.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&snaplen.to_le_bytes());
    block(
        IDB,
        &body,
        &[
            (IF_NAME, name.as_bytes()),
            (IF_DESCRIPTION, description.as_bytes()),
            (IF_TSRESOL, &[9]),
        ],
    )
}

/// One packet of interface `iface` at `ts_ns` (Unix ns): `data` as
/// captured, `orig_len` its length on the wire.
pub fn packet(iface: u32, ts_ns: u64, data: &[u8], orig_len: u32, comment: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&iface.to_le_bytes());
    body.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
    body.extend_from_slice(&(ts_ns as u32).to_le_bytes());
    body.extend_from_slice(&(data.len() as u32).to_le_bytes());
    body.extend_from_slice(&orig_len.to_le_bytes());
    body.extend_from_slice(data);
    block(EPB, &body, &[(OPT_COMMENT, comment.as_bytes())])
}

/// Statistics of interface `iface` at `ts_ns`: `lost` packets that never
/// reached the file, and why.
pub fn statistics(iface: u32, ts_ns: u64, lost: u64, comment: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&iface.to_le_bytes());
    body.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
    body.extend_from_slice(&(ts_ns as u32).to_le_bytes());
    block(
        ISB,
        &body,
        &[
            (ISB_OSDROP, &lost.to_le_bytes()),
            (OPT_COMMENT, comment.as_bytes()),
        ],
    )
}

/// How much of `head` (bytes from the IP header) is the packet, and its
/// length: the IP header's own length field, capped at what was copied.
pub fn ip_lengths(head: &[u8]) -> (usize, u32) {
    let total = match head.first().map(|b| b >> 4) {
        Some(4) if head.len() >= 4 => u32::from(u16::from_be_bytes([head[2], head[3]])),
        Some(6) if head.len() >= 6 => 40 + u32::from(u16::from_be_bytes([head[4], head[5]])),
        _ => head.len() as u32,
    };
    ((total as usize).min(head.len()), total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], i: usize) -> u32 {
        u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
    }

    #[test]
    fn blocks_are_framed_and_padded() {
        for b in [
            section_header("kdrop"),
            interface("node/ens6", "netns node", 128),
            packet(0, 1 << 40, &[0x45, 0, 0, 40, 1], 40, "IP_RPFILTER"),
            statistics(0, 5, 3, "3 lost"),
        ] {
            assert_eq!(b.len() % 4, 0);
            assert_eq!(u32_at(&b, 4) as usize, b.len());
            assert_eq!(u32_at(&b, b.len() - 4) as usize, b.len());
        }
        let p = packet(2, (7u64 << 32) | 9, &[1, 2, 3], 60, "x");
        assert_eq!(u32_at(&p, 0), EPB);
        assert_eq!((u32_at(&p, 8), u32_at(&p, 12), u32_at(&p, 16)), (2, 7, 9));
        assert_eq!((u32_at(&p, 20), u32_at(&p, 24)), (3, 60));
    }

    #[test]
    fn lengths_from_the_ip_header() {
        let mut v4 = vec![0u8; 128];
        v4[0] = 0x45;
        v4[3] = 60;
        assert_eq!(ip_lengths(&v4), (60, 60));
        v4[2] = 5; // 1340 bytes: only 128 copied
        assert_eq!(ip_lengths(&v4), (128, 1340));
        let mut v6 = vec![0u8; 128];
        v6[0] = 0x60;
        v6[5] = 40;
        assert_eq!(ip_lengths(&v6), (80, 80));
        assert_eq!(ip_lengths(&[0u8; 8]), (8, 8));
    }
}
