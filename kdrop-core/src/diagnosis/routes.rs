//! The routing tables as the kernel reads them: policy rules matched
//! against a flow, the longest prefix in a table, and both printed as
//! `ip rule` / `ip route` print them. Pure.
use std::net::{IpAddr, Ipv4Addr};

use crate::model::routing::{Route, Rule, Tables, FR_ACT_TO_TBL, RTN_LOCAL};

pub const RT_TABLE_LOCAL: u32 = 255;
pub const RT_TABLE_MAIN: u32 = 254;
pub const RT_TABLE_DEFAULT: u32 = 253;

pub fn table_name(t: u32) -> String {
    match t {
        RT_TABLE_LOCAL => "local".into(),
        RT_TABLE_MAIN => "main".into(),
        RT_TABLE_DEFAULT => "default".into(),
        t => t.to_string(),
    }
}

/// `1024: from all fwmark 0x80/0x80 lookup main`, as `ip rule` says it.
pub fn rule_text(r: &Rule) -> String {
    format!("{}:{}", r.priority, rule_spec(r))
}

/// The rule's selector and action (` from all to 10.0.0.0/8 unreachable`),
/// which `ip rule add` and `ip rule del` read back.
pub fn rule_spec(r: &Rule) -> String {
    let mut s = String::new();
    if r.invert {
        s.push_str(" not");
    }
    // iproute2 leaves out a host prefix's length, /32 or /128, on both
    // (ip/iprule.c, print_rule).
    let prefix = |a: IpAddr, len: u8| {
        let host = if a.is_ipv4() { 32 } else { 128 };
        if len == host {
            a.to_string()
        } else {
            format!("{a}/{len}")
        }
    };
    match r.src {
        Some((a, len)) => s.push_str(&format!(" from {}", prefix(a, len))),
        None => s.push_str(" from all"),
    }
    if let Some((a, len)) = r.dst {
        s.push_str(&format!(" to {}", prefix(a, len)));
    }
    if let Some(m) = r.fwmark {
        match r.fwmask {
            Some(mask) if mask != u32::MAX => s.push_str(&format!(" fwmark {m:#x}/{mask:#x}")),
            _ => s.push_str(&format!(" fwmark {m:#x}")),
        }
    }
    if let Some(i) = &r.iifname {
        s.push_str(&format!(" iif {i}"));
    }
    if let Some(o) = &r.oifname {
        s.push_str(&format!(" oif {o}"));
    }
    match r.action {
        FR_ACT_TO_TBL => s.push_str(&format!(" lookup {}", table_name(r.table))),
        2 => s.push_str(&format!(" goto {}", r.goto.unwrap_or(0))),
        3 => s.push_str(" nop"),
        6 => s.push_str(" blackhole"),
        7 => s.push_str(" unreachable"),
        8 => s.push_str(" prohibit"),
        a => s.push_str(&format!(" action {a}")),
    }
    s
}

fn in_prefix(addr: Ipv4Addr, net: IpAddr, len: u8) -> bool {
    let IpAddr::V4(net) = net else { return false };
    let len = u32::from(len.min(32));
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(addr) & mask == u32::from(net) & mask
}

/// The flow of a lookup: what a policy rule's selector is matched against.
#[derive(Clone, Copy, Debug)]
pub struct Flow<'a> {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub mark: u32,
    pub iif: &'a str,
}

/// Does rule `r` select `f` (net/core/fib_rules.c `fib_rule_match` and
/// net/ipv4/fib_rules.c `fib4_rule_match`)?
pub fn rule_matches(r: &Rule, f: &Flow) -> bool {
    let hit = r.iifname.as_deref().is_none_or(|i| i == f.iif)
        && r.oifname.is_none()
        && r.fwmark
            .is_none_or(|m| (m ^ f.mark) & r.fwmask.unwrap_or(u32::MAX) == 0)
        && r.src.is_none_or(|(a, l)| in_prefix(f.src, a, l))
        && r.dst.is_none_or(|(a, l)| in_prefix(f.dst, a, l));
    hit != r.invert
}

/// Longest-prefix match in one table (lowest metric among equals).
pub fn lookup(routes: &[Route], table: u32, dst: Ipv4Addr) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.table == table)
        .filter(|r| match r.dst {
            None => r.dst_len == 0,
            Some(net) => in_prefix(dst, net, r.dst_len),
        })
        .max_by(|a, b| a.dst_len.cmp(&b.dst_len).then(b.priority.cmp(&a.priority)))
}

/// `default via 10.0.1.1 dev eth0` / `local 1.2.3.4 dev kube-ipvs0`.
pub fn route_text(r: &Route, t: &Tables) -> String {
    let dst = match r.dst {
        None => "default".to_string(),
        Some(a) if r.dst_len == 32 => a.to_string(),
        Some(a) => format!("{a}/{}", r.dst_len),
    };
    let mut s = if r.kind == RTN_LOCAL {
        format!("local {dst}")
    } else {
        dst
    };
    if let Some(gw) = r.gateway {
        s.push_str(&format!(" via {gw}"));
    }
    if let Some(oif) = r.oif {
        s.push_str(&format!(" dev {}", t.link_name(oif)));
    }
    s
}
