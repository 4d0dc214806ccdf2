//! Telling one transmission of a SYN, seen leaving several devices, from
//! the next.
use crate::model::packet::Packet;

/// The same SYN seen leaving several devices (pod veth, bridge, port) within
/// this long is one transmission, unless it leaves a device that
/// transmission already left (a retransmission, whatever its spacing). A
/// client retransmits its SYN 1 s after the first at the earliest
/// (TCP_TIMEOUT_INIT, v6.18
/// https://github.com/torvalds/linux/blob/v6.18/include/net/tcp.h), unless a
/// sock_ops program lowers it, and then the device tells. 150 ms was too
/// short: a guest under TCG took longer from the client pod's device to the
/// node's, and one SYN counted twice made a verdict a transmission early.
const SAME_TRANSMISSION_NS: u64 = 500_000_000;
/// The devices one transmission was seen leaving, at most this many (more:
/// time alone tells a retransmission).
const CROSSED_MAX: usize = 4;

/// The devices (namespace, ifindex) the flow's last transmission left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crossed {
    devices: [(u32, u32); CROSSED_MAX],
    len: u8,
}

impl Crossed {
    /// Is `p`, seen after the flow's last sighting at `last_ns`, another
    /// transmission? Remembers where it was seen either way.
    pub(super) fn another(&mut self, p: &Packet, last_ns: u64) -> bool {
        // A socket's retransmission has no device (ifindex 0).
        let device = (p.ifindex != 0).then_some((p.netns, p.ifindex));
        let another = device.is_some_and(|d| self.contains(d))
            || p.ts_ns.saturating_sub(last_ns) >= SAME_TRANSMISSION_NS;
        if another {
            *self = Self::default();
        }
        if let Some(d) = device {
            self.add(d);
        }
        another
    }

    fn contains(&self, dev: (u32, u32)) -> bool {
        self.devices[..usize::from(self.len)].contains(&dev)
    }

    fn add(&mut self, dev: (u32, u32)) {
        if usize::from(self.len) < CROSSED_MAX && !self.contains(dev) {
            self.devices[usize::from(self.len)] = dev;
            self.len += 1;
        }
    }
}
