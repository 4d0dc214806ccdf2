//! An IPv4 drop's reverse-path lookup, as the kernel made it for the packet
//! (`fib:fib_table_lookup`) or answers it when asked afterwards (netlink):
//! the drop as `routing` explains it, the lookups that are its own, and
//! their evidence lines. Pure.
use std::net::{IpAddr, Ipv4Addr};

use super::{
    routes::{table_name, RT_TABLE_LOCAL},
    way_back::Sender,
};
use crate::model::{
    packet::Lookup,
    routing::{RouteLookup, RouteQuery, RouteType, Tables},
};

pub const LOOPBACK_IFINDEX: u32 = 1;

/// A dropped IPv4 packet with what the kernel said about it.
#[derive(Clone, Debug)]
pub struct RouteDrop<'a> {
    pub reason: Option<&'a str>,
    pub location: &'a str,
    pub iif: u32,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub mark: u32,
    pub fib: &'a [Lookup],
    /// `ip netns exec NAME ` prefix for commands, or empty.
    pub netns_exec: &'a str,
    /// What `fib_validate_source` returned for the packet (fexit/kretprobe).
    pub src_check: Option<i32>,
    /// The same reverse lookup asked of the kernel afterwards (netlink), for
    /// a drop that came before the route-lookup probe was armed.
    pub asked: Option<&'a (RouteQuery, RouteLookup)>,
    /// The neighbour that handed the packet to the node: the next hop of a
    /// route back through the input device.
    pub sender: Sender<'a>,
}

/// The reverse-path lookups in the kernel's evidence: addresses swapped,
/// from loopback for a packet to this host, from the forward route's output
/// device for a forwarded one (`__mkroute_input` passes `FIB_RES_OIF`, and
/// `__fib_validate_source` sets `flowi4_iif = oif ? : LOOPBACK_IFINDEX`:
/// net/ipv4/route.c and fib_frontend.c, v6.18).
fn reverse_lookups<'a>(d: &'a RouteDrop) -> impl Iterator<Item = &'a Lookup> + 'a {
    // A local delivery's source check passes oif 0, whatever device its
    // local route names.
    let forward_oif = d
        .fib
        .iter()
        .find(|l| {
            l.src == d.src
                && l.dst == d.dst
                && l.err == 0
                && l.res_ifindex != 0
                && l.table != RT_TABLE_LOCAL
        })
        .map(|l| l.res_ifindex);
    d.fib.iter().filter(move |l| {
        l.dst == d.src
            && l.src == d.dst
            && (l.iif == LOOPBACK_IFINDEX || Some(l.iif) == forward_oif)
    })
}

fn errno_text(err: i32) -> String {
    match -err {
        11 => "no match".into(),
        101 => "network unreachable".into(),
        113 => "no route to host".into(),
        e => format!("error {e}"),
    }
}

pub(super) struct Evidence {
    pub lines: Vec<String>,
    /// The reverse lookup that answered: (table, result ifindex, gateway).
    pub answer: Option<(u32, u32, Option<Ipv4Addr>)>,
    /// Local address: (table it was found in, its device).
    pub local: Option<u32>,
}

/// The reverse lookup asked of the kernel now (netlink), when no lookup
/// from the drop itself is at hand: its evidence line and what it found.
fn asked_evidence(d: &RouteDrop, t: &Tables, ev: &mut Evidence) {
    let Some((q, answer)) = d.asked else {
        return;
    };
    let mark = match q.mark {
        Some(m) if m != 0 => format!(", mark {m:#x}"),
        _ => String::new(),
    };
    let from = q.src.map(|s| format!(" from {s}")).unwrap_or_default();
    let found = match answer {
        RouteLookup::Found(a) => {
            let dev = a.oif.map_or_else(|| "?".into(), |i| t.link_name(i));
            let via = match a.gateway {
                Some(g) => format!(" via {g}"),
                None => String::new(),
            };
            let gw = match a.gateway {
                Some(IpAddr::V4(g)) => Some(g),
                _ => None,
            };
            let devices = a.devices();
            let all = if devices.len() > 1 {
                let names: Vec<String> = devices.iter().map(|&i| t.link_name(i)).collect();
                format!(" (next hops on {})", names.join(", "))
            } else {
                String::new()
            };
            if let Some(oif) = a.oif {
                ev.answer = Some((a.table, oif, gw));
                if a.kind == RouteType::Local {
                    ev.local = Some(oif);
                }
            }
            format!("table {} → dev {dev}{via}{all}", table_name(a.table))
        }
        RouteLookup::Failed { name, .. } => format!("no route ({name})"),
    };
    ev.lines.push(format!(
        "kernel, asked now through netlink as fib_validate_source asks (this drop came before \
         kdrop armed its route-lookup probe; the retransmission carries the kernel's own): \
         reverse lookup of {}{from}{mark}: {found}",
        d.src
    ));
}

/// Kernel evidence lines for the reverse lookup, and what it found.
pub(super) fn reverse_evidence(d: &RouteDrop, t: &Tables) -> Evidence {
    let mut ev = Evidence {
        lines: Vec::new(),
        answer: None,
        local: None,
    };
    let mark = match d.fib.iter().find(|l| l.dst == d.src) {
        Some(l) if l.mark != 0 => format!(", mark {:#x}", l.mark),
        _ => String::new(),
    };
    let mut steps = Vec::new();
    for l in reverse_lookups(d) {
        if l.err == 0 {
            let dev = t.link_name(l.res_ifindex);
            let via = l.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            steps.push(format!("table {} → dev {dev}{via}", table_name(l.table)));
            ev.answer = Some((l.table, l.res_ifindex, l.gw));
            if l.table == RT_TABLE_LOCAL {
                ev.local = Some(l.res_ifindex);
            }
            break;
        }
        steps.push(format!(
            "table {}: {}",
            table_name(l.table),
            errno_text(l.err)
        ));
    }
    if steps.is_empty() {
        asked_evidence(d, t, &mut ev);
    } else {
        ev.lines.push(format!(
            "kernel: reverse lookup of {} (from {}{mark}): {}",
            d.src,
            d.dst,
            steps.join("; ")
        ));
    }
    ev
}
