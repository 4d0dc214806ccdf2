//! What runs on a device's packet path and can drop: tc filters on the
//! clsact (or ingress) qdisc (RTM_GETTFILTER dump; cls_bpf's program id,
//! name, tag, direct-action and classic bytecode), tcx programs (kernels
//! 6.6+), and the XDP program (IFLA_XDP of RTM_GETLINK). Layouts: `struct
//! tcmsg`, TCA_*, TCA_BPF_* (include/uapi/linux/rtnetlink.h, pkt_cls.h) and
//! IFLA_XDP_* (if_link.h); tc's own printing (iproute2 tc/f_bpf.c, f_u32.c)
//! for handles and protocols.
use std::path::Path;

use anyhow::Result;

use super::{
    bpf_progs::tcx_progs,
    netlink::{attrs, str_of, u32_of, Socket, NLM_F_DUMP},
    netns::{ifname, in_netns},
};

pub use crate::model::progs::{ClsBpf, DeviceProgs, TcFilter, XdpProg};

const RTM_GETLINK: u16 = 18;
const RTM_GETTFILTER: u16 = 46;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_CHAIN: u16 = 11;
const TCA_BPF_OPS_LEN: u16 = 4;
const TCA_BPF_OPS: u16 = 5;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_FLAGS_GEN: u16 = 9;
const TCA_BPF_TAG: u16 = 10;
const TCA_BPF_ID: u16 = 11;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
const TCA_CLS_FLAGS_IN_HW: u32 = 1 << 2;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;
/// TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS), as tc sends
/// for `ingress` / `egress`; the kernel maps it to the ingress qdisc too.
const PARENT_INGRESS: u32 = 0xffff_fff2;
const PARENT_EGRESS: u32 = 0xffff_fff3;

/// The protocol as tc names it (iproute2 lib/ll_proto.c, common ones).
pub fn protocol_name(proto: u16) -> String {
    match proto {
        0x0003 => "all".into(),
        0x0800 => "ip".into(),
        0x86dd => "ipv6".into(),
        0x0806 => "arp".into(),
        0x8100 => "802.1Q".into(),
        0x88a8 => "802.1ad".into(),
        p => format!("0x{p:04x}"),
    }
}

/// The handle as tc prints it for `kind`: u32's `htid:hash:node` with empty
/// zero parts (f_u32.c `sprint_u32_handle`), else hex.
pub fn handle_text(kind: &str, handle: u32) -> String {
    if kind != "u32" {
        return format!("0x{handle:x}");
    }
    let (htid, hash, node) = (handle >> 20, (handle >> 12) & 0xff, handle & 0xfff);
    let mut s = String::new();
    if htid != 0 {
        s += &format!("{htid:x}:");
    }
    if hash != 0 {
        s += &format!("{hash:x}");
    }
    if node != 0 {
        s += &format!(":{node:x}");
    }
    s
}

/// Classic BPF `struct sock_filter` array (code u16, jt u8, jf u8, k u32)
/// as tc prints it: count, then `code jt jf k` separated by commas.
fn bytecode_text(ops: &[u8], count: Option<u32>) -> String {
    let insns: Vec<String> = ops
        .chunks_exact(8)
        .map(|c| {
            let code = u16::from_ne_bytes([c[0], c[1]]);
            let k = u32::from_ne_bytes([c[4], c[5], c[6], c[7]]);
            format!("{code} {} {} {k}", c[2], c[3])
        })
        .collect();
    let n = count.map_or(insns.len(), |n| n as usize);
    format!("{n},{}", insns.join(","))
}

fn parse_cls_bpf(opts: &[u8]) -> ClsBpf {
    let mut b = ClsBpf {
        direct_action: false,
        prog_id: None,
        name: None,
        tag: None,
        bytecode: None,
        in_hw: false,
    };
    let mut ops_len = None;
    for (ty, v) in attrs(opts) {
        match ty {
            TCA_BPF_ID => b.prog_id = u32_of(v),
            TCA_BPF_NAME => b.name = Some(str_of(v)),
            TCA_BPF_TAG => b.tag = Some(v.iter().map(|x| format!("{x:02x}")).collect()),
            TCA_BPF_FLAGS => {
                b.direct_action = u32_of(v).is_some_and(|f| f & TCA_BPF_FLAG_ACT_DIRECT != 0)
            }
            TCA_BPF_FLAGS_GEN => b.in_hw = u32_of(v).is_some_and(|f| f & TCA_CLS_FLAGS_IN_HW != 0),
            TCA_BPF_OPS_LEN => {
                ops_len = v
                    .get(..2)
                    .map(|l| u32::from(u16::from_ne_bytes([l[0], l[1]])))
            }
            TCA_BPF_OPS => b.bytecode = Some(bytecode_text(v, None)),
            _ => {}
        }
    }
    if let (Some(n), Some(text)) = (ops_len, &b.bytecode) {
        // The count tc prints is TCA_BPF_OPS_LEN's.
        let rest = text.split_once(',').map_or("", |(_, r)| r);
        b.bytecode = Some(format!("{n},{rest}"));
    }
    b
}

/// Parses one RTM_NEWTFILTER payload; `None` for the per-priority head
/// message (handle 0, no filter) and for garbage.
pub fn parse_filter(p: &[u8], hook: &str) -> Option<TcFilter> {
    // struct tcmsg: family u8, pad u8, pad u16, ifindex i32, handle u32, parent u32, info u32.
    let ifindex = u32_of(p.get(4..8)?)?;
    let handle = u32_of(p.get(8..12)?)?;
    let info = u32_of(p.get(16..20)?)?;
    if handle == 0 {
        return None;
    }
    let (mut kind, mut chain, mut opts) = (None, 0, None);
    for (ty, v) in attrs(p.get(20..)?) {
        match ty {
            TCA_KIND => kind = Some(str_of(v)),
            TCA_CHAIN => chain = u32_of(v).unwrap_or(0),
            TCA_OPTIONS => opts = Some(v),
            _ => {}
        }
    }
    let kind = kind?;
    // tcm_info = TC_H_MAKE(pref << 16, protocol in network byte order).
    let proto = u16::from_be((info & 0xffff) as u16);
    Some(TcFilter {
        dev: String::new(),
        ifindex,
        hook: hook.to_string(),
        pref: (info >> 16) as u16,
        protocol: protocol_name(proto),
        handle: handle_text(&kind, handle),
        chain,
        bpf: (kind == "bpf").then(|| parse_cls_bpf(opts.unwrap_or(&[]))),
        kind,
    })
}

/// XDP programs from an RTM_NEWLINK payload's IFLA_XDP.
pub fn parse_xdp(link: &[u8]) -> Vec<XdpProg> {
    let Some(rest) = link.get(16..) else {
        return Vec::new();
    };
    let Some((_, xdp)) = attrs(rest).find(|(t, _)| *t == IFLA_XDP) else {
        return Vec::new();
    };
    attrs(xdp)
        .filter_map(|(t, v)| {
            let mode = match t {
                IFLA_XDP_DRV_PROG_ID => "native",
                IFLA_XDP_SKB_PROG_ID => "generic",
                IFLA_XDP_HW_PROG_ID => "offload",
                _ => return None,
            };
            Some(XdpProg {
                mode: mode.to_string(),
                prog_id: u32_of(v)?,
            })
        })
        .collect()
}

/// tc filters on `ifindex`'s ingress or egress hook, in the calling
/// thread's namespace. A device without a clsact/ingress qdisc has none.
pub fn tc_filters(ifindex: u32, ingress: bool) -> Result<Vec<TcFilter>> {
    let (parent, hook) = if ingress {
        (PARENT_INGRESS, "ingress")
    } else {
        (PARENT_EGRESS, "egress")
    };
    let mut body = vec![0u8; 20];
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    body[12..16].copy_from_slice(&parent.to_ne_bytes());
    let sock = Socket::open(0, false)?;
    let msgs = match sock.request(RTM_GETTFILTER, NLM_F_DUMP, &body)? {
        Ok(m) => m,
        // No such qdisc (EINVAL/ENOENT): nothing attached.
        Err(e) if e == libc::EINVAL || e == libc::ENOENT => return Ok(Vec::new()),
        Err(e) => return Err(std::io::Error::from_raw_os_error(e).into()),
    };
    let dev = ifname(ifindex).unwrap_or_else(|| format!("if{ifindex}"));
    Ok(msgs
        .iter()
        .filter_map(|p| parse_filter(p, hook))
        .map(|mut f| {
            f.dev = dev.clone();
            f
        })
        .collect())
}

/// XDP programs on `ifindex` (RTM_GETLINK for that one device).
pub fn xdp_progs(ifindex: u32) -> Result<Vec<XdpProg>> {
    let mut body = vec![0u8; 16];
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    let sock = Socket::open(0, false)?;
    let msgs = sock
        .request(RTM_GETLINK, 0, &body)?
        .map_err(std::io::Error::from_raw_os_error)?;
    Ok(msgs.first().map(|p| parse_xdp(p)).unwrap_or_default())
}

/// tc, tcx and XDP programs of one device, in the calling thread's namespace.
pub fn device_progs(ifindex: u32) -> Result<DeviceProgs> {
    let mut tc = tc_filters(ifindex, true)?;
    tc.extend(tc_filters(ifindex, false)?);
    Ok(DeviceProgs {
        dev: ifname(ifindex).unwrap_or_else(|| format!("if{ifindex}")),
        ifindex,
        tc,
        tcx_ingress: tcx_progs(ifindex, true)?,
        tcx_egress: tcx_progs(ifindex, false)?,
        xdp: xdp_progs(ifindex)?,
    })
}

/// `device_progs` inside the namespace at `netns`.
pub fn device_progs_in(netns: &Path, ifindex: u32) -> Result<DeviceProgs> {
    in_netns(netns, move || device_progs(ifindex))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::netlink::{messages, tests::msg};

    fn tcmsg(ifindex: u32, handle: u32, pref: u16, proto: u16) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        h[8..12].copy_from_slice(&handle.to_ne_bytes());
        let info = (u32::from(pref) << 16) | u32::from(proto.to_be());
        h[16..20].copy_from_slice(&info.to_ne_bytes());
        h
    }

    #[test]
    fn parses_cls_bpf_and_u32() {
        let mut opts = Vec::new();
        crate::context::netlink::put_attr(&mut opts, TCA_BPF_ID, &42u32.to_ne_bytes());
        crate::context::netlink::put_attr(&mut opts, TCA_BPF_FLAGS, &1u32.to_ne_bytes());
        crate::context::netlink::put_attr(&mut opts, TCA_BPF_TAG, &[0xab; 8]);
        crate::context::netlink::put_attr(&mut opts, TCA_BPF_NAME, b"prog.o:[tc]\0");
        let m = msg(
            44,
            &tcmsg(3, 1, 49152, 0x0003),
            &[
                (TCA_KIND, b"bpf\0"),
                (TCA_OPTIONS, &opts),
                (TCA_CHAIN, &0u32.to_ne_bytes()),
            ],
        );
        let f = parse_filter(messages(&m).next().unwrap().1, "ingress").unwrap();
        assert_eq!(
            (f.pref, f.protocol.as_str(), f.handle.as_str()),
            (49152, "all", "0x1")
        );
        let b = f.bpf.unwrap();
        assert!(b.direct_action);
        assert_eq!(
            (b.prog_id, b.tag.as_deref()),
            (Some(42), Some("abababababababab"))
        );
        // Classic bytecode.
        let mut opts = Vec::new();
        crate::context::netlink::put_attr(&mut opts, TCA_BPF_OPS_LEN, &2u16.to_ne_bytes());
        let ops = [[40u8, 0, 0, 0, 12, 0, 0, 0], [6, 0, 0, 0, 2, 0, 0, 0]].concat();
        crate::context::netlink::put_attr(&mut opts, TCA_BPF_OPS, &ops);
        let m = msg(
            44,
            &tcmsg(3, 2, 10, 0x0800),
            &[(TCA_KIND, b"bpf\0"), (TCA_OPTIONS, &opts)],
        );
        let f = parse_filter(messages(&m).next().unwrap().1, "egress").unwrap();
        assert_eq!(f.protocol, "ip");
        assert_eq!(
            f.bpf.unwrap().bytecode.as_deref(),
            Some("2,40 0 0 12,6 0 0 2")
        );
        // The head message of a priority has no handle.
        let m = msg(44, &tcmsg(3, 0, 10, 0x0800), &[(TCA_KIND, b"bpf\0")]);
        assert_eq!(parse_filter(messages(&m).next().unwrap().1, "egress"), None);
        assert_eq!(handle_text("u32", 0x8000_0800), "800::800");
        assert_eq!(handle_text("u32", 0x8000_0000), "800:");
        assert_eq!(handle_text("matchall", 0x1f), "0x1f");
        assert_eq!(protocol_name(0x1234), "0x1234");
    }

    #[test]
    fn parses_xdp_modes() {
        let mut xdp = Vec::new();
        crate::context::netlink::put_attr(&mut xdp, 2, &[2]);
        crate::context::netlink::put_attr(&mut xdp, IFLA_XDP_SKB_PROG_ID, &7u32.to_ne_bytes());
        let m = msg(16, &[0; 16], &[(3, b"eth0\0"), (IFLA_XDP, &xdp)]);
        let x = parse_xdp(messages(&m).next().unwrap().1);
        assert_eq!(
            x,
            vec![XdpProg {
                mode: "generic".into(),
                prog_id: 7
            }]
        );
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..96 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 19 + 1) as u8).collect();
            let _ = parse_filter(&junk, "ingress");
            let _ = parse_xdp(&junk);
            let _ = parse_cls_bpf(&junk);
            let _ = bytecode_text(&junk, Some(3));
        }
    }

    #[test]
    fn reads_loopback() {
        let d = device_progs(1).unwrap();
        assert_eq!((d.dev.as_str(), d.ifindex), ("lo", 1));
    }
}
