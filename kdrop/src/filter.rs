//! `--port/--host/--netns/--iface/--all-flags/--sample` into the filter the
//! kernel programs apply, for every mode. Names are resolved here, so a
//! typo fails before anything is loaded.
use std::net::IpAddr;

use anyhow::Result;
use kdrop_common::{Cidr, Filter, AF_INET, AF_INET6, MAX_HOSTS, MAX_PORTS, TCP_SYN};

use crate::{
    cli::FilterArgs,
    context::netns::{self, NetnsRegistry},
    UserError,
};

/// Turns the command line into a kernel filter, resolving namespace and
/// interface names now so that a typo fails before anything is loaded.
pub fn resolve(args: &FilterArgs) -> Result<Filter> {
    let mut registry = NetnsRegistry::new();
    let ns = match &args.netns {
        Some(arg) => Some(netns::resolve_arg(arg, &mut registry).map_err(UserError)?),
        None => None,
    };
    let ifindex = match &args.iface {
        None => 0,
        Some(name) => {
            let lookup = |ns: &netns::Netns| {
                let n = name.clone();
                netns::in_netns(&ns.path, move || netns::ifindex(&n))
            };
            let found = match &ns {
                Some(ns) => lookup(ns).map_err(|e| UserError(format!("{e:#}")))?,
                None => netns::ifindex(name),
            };
            found.ok_or_else(|| {
                let place = match &args.netns {
                    Some(a) => format!("netns {a}"),
                    None => "kdrop's network namespace".into(),
                };
                UserError(format!("unknown interface {name} in {place}"))
            })?
        }
    };
    // An ifindex only means something inside one namespace.
    let netns_inode = match (&ns, ifindex) {
        (Some(ns), _) => ns.inode,
        (None, 0) => 0,
        (None, _) => netns::own()?.inode,
    };
    let mut f = build_filter(
        &args.ports,
        &args.hosts,
        netns_inode,
        ifindex,
        args.all_flags,
    )
    .map_err(UserError)?;
    f.sample_every = args.sample;
    Ok(f)
}

/// Builds the kernel filter from resolved arguments.
pub fn build_filter(
    ports: &[u16],
    hosts: &[(IpAddr, u8)],
    netns: u32,
    ifindex: u32,
    all_flags: bool,
) -> Result<Filter, String> {
    if ports.len() > MAX_PORTS {
        return Err(format!("at most {MAX_PORTS} --port values"));
    }
    if hosts.len() > MAX_HOSTS {
        return Err(format!("at most {MAX_HOSTS} --host values"));
    }
    let mut f = Filter::zeroed();
    for (i, p) in ports.iter().enumerate() {
        f.ports[i] = *p;
    }
    f.n_ports = ports.len() as u32;
    for (i, (addr, len)) in hosts.iter().enumerate() {
        f.hosts[i] = match addr {
            IpAddr::V4(a) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&a.octets());
                Cidr::new(AF_INET, b, *len)
            }
            IpAddr::V6(a) => Cidr::new(AF_INET6, a.octets(), *len),
        };
    }
    f.n_hosts = hosts.len() as u32;
    f.netns = netns;
    f.ifindex = ifindex;
    // SYN is set on both handshake packets, SYN and SYN-ACK.
    f.tcp_flags_any = if all_flags { 0 } else { TCP_SYN };
    Ok(f)
}

/// Adds `extra` to the filter's ports, as many as fit; returns those
/// that did not.
pub fn add_ports(f: &mut Filter, extra: &[u16]) -> Vec<u16> {
    let mut left = Vec::new();
    for &p in extra {
        let n = f.n_ports as usize;
        if f.ports[..n].contains(&p) {
            continue;
        }
        if n == MAX_PORTS {
            left.push(p);
            continue;
        }
        f.ports[n] = p;
        f.n_ports += 1;
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_from_args() {
        let f = build_filter(
            &[3306, 80],
            &[("10.0.0.0".parse().unwrap(), 8)],
            7,
            3,
            false,
        )
        .unwrap();
        assert_eq!(&f.ports[..2], &[3306, 80]);
        assert_eq!(f.n_ports, 2);
        assert_eq!(f.n_hosts, 1);
        assert_eq!(f.hosts[0].family, AF_INET);
        assert_eq!(&f.hosts[0].addr[..4], &[10, 0, 0, 0]);
        assert_eq!(f.hosts[0].prefix_len, 8);
        assert_eq!(
            (f.netns, f.ifindex, f.tcp_flags_any),
            (7, 3, kdrop_common::TCP_SYN)
        );
        assert_eq!(build_filter(&[], &[], 0, 0, true).unwrap().tcp_flags_any, 0);
        assert!(build_filter(&[1; 17], &[], 0, 0, false).is_err());
    }

    #[test]
    fn added_ports_fit_or_come_back() {
        let mut f = build_filter(&[80], &[], 0, 0, false).unwrap();
        assert!(add_ports(&mut f, &[30080, 80, 30080]).is_empty());
        assert_eq!(&f.ports[..f.n_ports as usize], &[80, 30080]);
        let more: Vec<u16> = (1..=MAX_PORTS as u16).collect();
        let left = add_ports(&mut f, &more);
        assert_eq!(f.n_ports as usize, MAX_PORTS);
        assert_eq!(left, [15, 16]);
    }
}
