//! What the kernel reported, decoded into owned values: dropped packets,
//! handshake packets leaving devices, netfilter drop verdicts, and the
//! conntrack entries and route lookups they carried.
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::netfilter::{Family, Hook};

/// A dropped TCP packet as the kernel reported it, before any enrichment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drop {
    pub ts_ns: u64,
    pub cpu: u32,
    pub location: u64,
    /// Raw `enum skb_drop_reason`; `kdrop_common::ABSENT` when the kernel has none.
    pub reason: u32,
    pub netns: u32,
    pub ifindex: u32,
    pub mark: u32,
    pub saddr: IpAddr,
    pub daddr: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub tcp_flags: u8,
    /// The client's ISN of the handshake (kdrop_common::handshake_isn; 0:
    /// unknown, as in bundles recorded before it was).
    #[serde(default)]
    pub isn: u32,
    /// The kernel's route lookups for this packet, oldest first (IPv4).
    pub fib: Vec<Lookup>,
    /// The conntrack entry the packet carried.
    pub ct: Option<Ct>,
    /// What `fib_validate_source` returned for this packet (0 or -errno),
    /// where the fexit/kretprobe rung is attached.
    pub src_check: Option<i32>,
    /// The Ethernet source address it arrived with: the neighbour that
    /// sent it (none for a packet this host sent, or from a bundle recorded
    /// before drops carried it).
    #[serde(default)]
    pub src_mac: Option<[u8; 6]>,
}

/// `02:00:00:00:e7:03`, as `ip neigh` writes a link-layer address.
pub fn mac_text(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// One direction of a conntrack entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Tuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

impl Tuple {
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
        }
    }
}

/// A conntrack entry as the packet carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ct {
    pub orig: Tuple,
    pub reply: Tuple,
    /// `enum ip_conntrack_status` bits.
    pub status: u32,
    pub mark: u32,
    pub zone: u16,
    pub ctinfo: u8,
}

/// A handshake packet handed to a device for transmission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Packet {
    pub ts_ns: u64,
    pub netns: u32,
    pub ifindex: u32,
    pub mark: u32,
    pub tuple: Tuple,
    pub tcp_flags: u8,
    /// As `Drop::isn`.
    #[serde(default)]
    pub isn: u32,
    pub ct: Option<Ct>,
}

/// A local client socket whose connect() ended in SYN-SENT: `packet` is its
/// SYN as the socket would send it (no device, no entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abandon {
    pub packet: Packet,
    /// `sk_err`: 0 when the application closed it (a connect timeout),
    /// ETIMEDOUT when the kernel gave up, ECONNREFUSED after a RST, ...
    pub err: i32,
    /// The SYN's retransmissions, when the kernel says.
    pub retransmits: Option<u32>,
}

/// One FIB table lookup, as `fib:fib_table_lookup` reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lookup {
    pub ts_ns: u64,
    pub table: u32,
    /// 0 or a negative errno.
    pub err: i32,
    pub iif: u32,
    pub oif: u32,
    pub mark: u32,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// Result device, 0 if none.
    pub res_ifindex: u32,
    pub gw: Option<Ipv4Addr>,
    pub scope: u8,
}

/// A conntrack entry destroyed, as ctnetlink reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destroyed {
    /// The namespace whose socket received it.
    pub netns: u32,
    pub ct: Ct,
    pub tcp_state: Option<u8>,
}

/// A live conntrack entry as ctnetlink showed it: announced when it was
/// confirmed (a NEW event), or found by a lookup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtSeen {
    /// The namespace whose conntrack table holds it.
    pub netns: u32,
    pub ct: Ct,
    /// `enum tcp_conntrack`, when the message carried the TCP state.
    pub tcp_state: Option<u8>,
    /// Seconds left before the entry times out, when the message said.
    pub timeout_s: Option<u32>,
}

/// What a ctnetlink event socket read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CtEvent {
    /// An entry confirmed (its first packet passed the last hook).
    New(CtSeen),
    Destroyed(Destroyed),
}

/// One record off the ring buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    Drop(Drop),
    Egress(Packet),
    /// A SYN or SYN-ACK a local socket retransmitted (no conntrack entry,
    /// no interface).
    Retrans(Packet),
    /// A local client's connect() ended in SYN-SENT.
    Abandon(Abandon),
    /// Precedes the drop it explains on the ring buffer.
    Verdict(NfVerdict),
    /// A dropped packet's first bytes (`--pcap`), just before its drop.
    Head(Head),
}

/// The first bytes of a dropped packet from its IP header, and the drop's
/// CPU and kernel timestamp (which pair it with its [`Drop`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub cpu: u32,
    pub ts_ns: u64,
    pub bytes: Vec<u8>,
}

/// `SYN`, `SYN|ACK`, `RST|ACK`: the flags set, in header order.
pub fn tcp_flags(flags: u8) -> String {
    const NAMES: [&str; 8] = ["FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"];
    // Handshake flags read best first.
    const ORDER: [usize; 8] = [1, 0, 2, 3, 4, 5, 6, 7];
    let set: Vec<&str> = ORDER
        .iter()
        .filter(|&&i| flags & (1 << i) != 0)
        .map(|&i| NAMES[i])
        .collect();
    if set.is_empty() {
        "none".into()
    } else {
        set.join("|")
    }
}

/// Which function returned NF_DROP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfVerdict {
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
