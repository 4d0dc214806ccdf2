//! A neighbour (ARP / NDP) entry, as `ip neigh show` prints it: NUD_*
//! state bits of include/uapi/linux/neighbour.h.
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// One neighbour entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Neighbour {
    pub dst: IpAddr,
    pub ifindex: u32,
    /// The device's name in the entry's namespace (`ifN` if it is gone).
    pub dev: String,
    /// NUD_* bits (`state_names` spells them).
    pub state: u16,
    /// Link-layer address, `aa:bb:cc:dd:ee:ff`; none while unresolved.
    pub lladdr: Option<String>,
    /// NTF_ROUTER: the neighbour announced itself as a router (IPv6).
    pub router: bool,
    /// Solicitations sent for it so far (NDA_PROBES).
    pub probes: Option<u32>,
}

pub const NUD_INCOMPLETE: u16 = 0x01;
pub const NUD_REACHABLE: u16 = 0x02;
pub const NUD_STALE: u16 = 0x04;
pub const NUD_DELAY: u16 = 0x08;
pub const NUD_PROBE: u16 = 0x10;
pub const NUD_FAILED: u16 = 0x20;
pub const NUD_NOARP: u16 = 0x40;
pub const NUD_PERMANENT: u16 = 0x80;

const NAMES: [(u16, &str); 8] = [
    (NUD_INCOMPLETE, "INCOMPLETE"),
    (NUD_REACHABLE, "REACHABLE"),
    (NUD_STALE, "STALE"),
    (NUD_DELAY, "DELAY"),
    (NUD_PROBE, "PROBE"),
    (NUD_FAILED, "FAILED"),
    (NUD_NOARP, "NOARP"),
    (NUD_PERMANENT, "PERMANENT"),
];

/// The state's names in `ip neigh`'s order (`NONE` for 0).
pub fn state_names(state: u16) -> Vec<&'static str> {
    if state == 0 {
        return vec!["NONE"];
    }
    NAMES
        .iter()
        .filter(|(bit, _)| state & bit != 0)
        .map(|(_, n)| *n)
        .collect()
}

impl Neighbour {
    pub fn state_text(&self) -> String {
        state_names(self.state).join(" ")
    }

    /// No answer to the solicitations: packets to it are dropped.
    pub fn failed(&self) -> bool {
        self.state & NUD_FAILED != 0
    }

    /// Still asking (packets queue until it resolves or fails).
    pub fn incomplete(&self) -> bool {
        self.state & NUD_INCOMPLETE != 0
    }
}
