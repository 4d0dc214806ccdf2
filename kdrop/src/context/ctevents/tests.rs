//! ctnetlink messages built by hand as ctnetlink_conntrack_event and
//! ctnetlink_fill_info lay them out, for the parser and for the kernel
//! filter (which runs in this kernel, on a socketpair).
use std::{
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::Result;

use super::{cbpf::attach, parse::*, *};
use crate::model::packet::CtSeen;

pub fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(((4 + payload.len()) as u16).to_ne_bytes());
    v.extend(ty.to_ne_bytes());
    v.extend(payload);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

pub fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    nla(ty | NLA_F_NESTED, &parts.concat())
}

fn ip_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

pub fn tuple_attr(ty: u16, src: SocketAddr, dst: SocketAddr, proto: u8) -> Vec<u8> {
    let (s, d) = if src.is_ipv4() {
        (CTA_IP_V4_SRC, CTA_IP_V4_DST)
    } else {
        (CTA_IP_V6_SRC, CTA_IP_V6_DST)
    };
    nested(
        ty,
        &[
            nested(
                CTA_TUPLE_IP,
                &[nla(s, &ip_bytes(src.ip())), nla(d, &ip_bytes(dst.ip()))],
            ),
            nested(
                CTA_TUPLE_PROTO,
                &[
                    nla(CTA_PROTO_NUM, &[proto]),
                    nla(CTA_PROTO_SRC_PORT, &src.port().to_be_bytes()),
                    nla(CTA_PROTO_DST_PORT, &dst.port().to_be_bytes()),
                ],
            ),
        ],
    )
}

/// nlmsghdr + nfgenmsg + `attrs`.
pub fn ct_msg(ty: u16, flags: u16, family: u8, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend(((ATTRS_AT + attrs.len()) as u32).to_ne_bytes());
    m.extend(ty.to_ne_bytes());
    m.extend(flags.to_ne_bytes());
    m.extend(0u32.to_ne_bytes());
    m.extend(0u32.to_ne_bytes());
    m.extend([family, 0, 0, 0]);
    m.extend(attrs);
    m
}

/// What an event message holds.
#[derive(Clone)]
pub struct Entry {
    pub orig: (SocketAddr, SocketAddr),
    pub reply: (SocketAddr, SocketAddr),
    pub proto: u8,
    /// None: no CTA_STATUS at all.
    pub status: Option<u32>,
    pub tcp_state: Option<u8>,
    pub timeout: Option<u32>,
    pub mark: u32,
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Client 172.16.0.50:45008 -> VIP 10.0.58.158:8005, DNAT'd to
/// 10.0.0.13:8005 (incident 5), TCP, status `status`.
pub fn incident5(status: u32) -> Entry {
    Entry {
        orig: (sa("172.16.0.50:45008"), sa("10.0.58.158:8005")),
        reply: (sa("10.0.0.13:8005"), sa("172.16.0.50:45008")),
        proto: IPPROTO_TCP,
        status: Some(status),
        tcp_state: Some(1),
        timeout: Some(120),
        mark: 7,
    }
}

impl Entry {
    pub fn attrs(&self) -> Vec<u8> {
        let mut a = vec![
            tuple_attr(CTA_TUPLE_ORIG, self.orig.0, self.orig.1, self.proto),
            tuple_attr(CTA_TUPLE_REPLY, self.reply.0, self.reply.1, self.proto),
            nla(CTA_ZONE, &0u16.to_be_bytes()),
            nla(CTA_ID, &0x1234u32.to_be_bytes()),
        ];
        if let Some(s) = self.status {
            a.push(nla(CTA_STATUS, &s.to_be_bytes()));
        }
        if let Some(t) = self.timeout {
            a.push(nla(CTA_TIMEOUT, &t.to_be_bytes()));
        }
        if let Some(st) = self.tcp_state {
            a.push(nested(
                CTA_PROTOINFO,
                &[nested(
                    CTA_PROTOINFO_TCP,
                    &[nla(CTA_PROTOINFO_TCP_STATE, &[st])],
                )],
            ));
        }
        a.push(nla(CTA_MARK, &self.mark.to_be_bytes()));
        a.concat()
    }

    fn family(&self) -> u8 {
        if self.orig.0.is_ipv4() {
            libc::AF_INET as u8
        } else {
            libc::AF_INET6 as u8
        }
    }

    /// As the destroy group receives it.
    pub fn destroy(&self) -> Vec<u8> {
        ct_msg(
            ct_type(IPCTNL_MSG_CT_DELETE),
            0,
            self.family(),
            &self.attrs(),
        )
    }

    /// As the new group receives it.
    pub fn new_event(&self) -> Vec<u8> {
        self.new_with(NLM_F_CREATE | NLM_F_EXCL)
    }

    /// A NEW message with other flags (0: an update).
    pub fn new_with(&self, flags: u16) -> Vec<u8> {
        ct_msg(
            ct_type(IPCTNL_MSG_CT_NEW),
            flags,
            self.family(),
            &self.attrs(),
        )
    }
}

const CTA_ID: u16 = 12;
const CONFIRMED: u32 = 1 << 3;
const CONFIRMED_DNAT: u32 = CONFIRMED | IPS_DST_NAT;

/// Sends `msgs` through a socketpair whose reader carries `prog`, returning
/// the indexes of the ones the kernel let through.
fn through_filter(prog: &[libc::sock_filter], msgs: &[Vec<u8>]) -> Result<Vec<usize>> {
    let mut sv = [0; 2];
    // SAFETY: sv receives two fds.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, sv.as_mut_ptr()) } != 0 {
        return Err(anyhow::anyhow!(
            "socketpair: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: both fds are ours.
    let (tx, rx) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    attach(&rx, prog)?;
    for (i, m) in msgs.iter().enumerate() {
        // The index rides in the sequence number.
        let mut m = m.clone();
        m[8..12].copy_from_slice(&(i as u32).to_ne_bytes());
        // SAFETY: m is valid for its length.
        let n = unsafe { libc::send(tx.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
        assert_eq!(
            n,
            m.len() as isize,
            "send: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe {
            libc::recv(
                rx.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            break;
        }
        got.push(u32::from_ne_bytes(buf[8..12].try_into().unwrap()) as usize);
    }
    Ok(got)
}

#[test]
fn parses_destroy_and_new_events() {
    let dead = incident5(CONFIRMED_DNAT);
    let mut buf = dead.destroy();
    // UDP: skipped.
    buf.extend(
        Entry {
            proto: 17,
            ..incident5(CONFIRMED_DNAT)
        }
        .destroy(),
    );
    buf.extend(dead.new_event());
    // An update (NEW without CREATE|EXCL): skipped.
    buf.extend(dead.new_with(0));
    let got = parse(&buf, 9);
    assert_eq!(got.len(), 2, "{got:?}");
    let CtEvent::Destroyed(d) = &got[0] else {
        panic!("{got:?}")
    };
    assert_eq!(d.netns, 9);
    assert_eq!(d.ct.orig.src.to_string(), "172.16.0.50:45008");
    assert_eq!(d.ct.orig.dst.to_string(), "10.0.58.158:8005");
    assert_eq!(d.ct.reply.src.to_string(), "10.0.0.13:8005");
    assert_eq!(d.ct.reply.dst.to_string(), "172.16.0.50:45008");
    assert_eq!(d.ct.status, CONFIRMED_DNAT);
    assert_eq!(d.ct.mark, 7);
    assert_eq!(d.tcp_state, Some(1));
    assert_eq!(tcp_state_name(1), "SYN_SENT");
    let CtEvent::New(n) = &got[1] else {
        panic!("{got:?}")
    };
    assert_eq!(n.ct, d.ct);
    assert_eq!((n.tcp_state, n.timeout_s), (Some(1), Some(120)));
}

#[test]
fn parses_ipv6_and_missing_attributes() {
    let v6 = Entry {
        orig: (sa("[fd00:1::1]:40000"), sa("[fd00:1::100]:80")),
        reply: (sa("[fd00:2::2]:8080"), sa("[fd00:1::1]:40000")),
        tcp_state: None,
        timeout: None,
        ..incident5(CONFIRMED_DNAT)
    };
    let got = parse(&v6.new_event(), 3);
    let [CtEvent::New(CtSeen {
        ct,
        tcp_state: None,
        timeout_s: None,
        ..
    })] = got.as_slice()
    else {
        panic!("{got:?}")
    };
    assert_eq!(ct.orig.dst.to_string(), "[fd00:1::100]:80");
    assert_eq!(ct.reply.src.to_string(), "[fd00:2::2]:8080");
    // Cut short anywhere: no panic, and nothing half-read.
    let m = incident5(CONFIRMED_DNAT).destroy();
    for cut in 0..m.len() {
        assert!(parse(&m[..cut], 9).is_empty(), "cut at {cut}");
    }
}

#[test]
fn reads_netlink_errors() {
    let mut m = Vec::new();
    m.extend(36u32.to_ne_bytes());
    m.extend(NLMSG_ERROR.to_ne_bytes());
    m.extend(0u16.to_ne_bytes());
    m.extend(5u32.to_ne_bytes());
    m.extend(0u32.to_ne_bytes());
    m.extend((-libc::ENOENT).to_ne_bytes());
    m.extend([0u8; 16]);
    let msgs: Vec<Msg> = messages(&m).collect();
    assert_eq!(msgs.len(), 1);
    assert_eq!((msgs[0].seq, msgs[0].error()), (5, Some(-libc::ENOENT)));
    assert!(parse(&m, 1).is_empty());
}

/// Destroy messages: only unreplied TCP on the ports asked for.
#[test]
fn the_kernel_filter_passes_only_unreplied_tcp_destroys_on_the_ports_asked_for() {
    let msgs = [
        incident5(CONFIRMED_DNAT).destroy(),                  // 0: passes
        incident5(CONFIRMED_DNAT | IPS_SEEN_REPLY).destroy(), // 1: answered
        Entry {
            proto: 17,
            ..incident5(CONFIRMED_DNAT)
        }
        .destroy(), // 2: UDP
        // 3: an update (NEW without CREATE|EXCL).
        incident5(CONFIRMED_DNAT).new_with(0),
        // 4: no status: passes, userspace decides.
        Entry {
            status: None,
            ..incident5(CONFIRMED_DNAT)
        }
        .destroy(),
    ];
    let any = filter_program(&[], StatusBits::UAPI);
    assert_eq!(through_filter(&any, &msgs).unwrap(), [0, 4]);
    // The service port, the backend port (reply source), the client port.
    for port in [8005, 45008] {
        let f = filter_program(&[1, port, 2], StatusBits::UAPI);
        assert_eq!(through_filter(&f, &msgs).unwrap(), [0, 4], "port {port}");
    }
    let other = filter_program(&[80, 443], StatusBits::UAPI);
    assert!(through_filter(&other, &msgs).unwrap().is_empty());
    // Sixteen ports: far jumps still resolve.
    let many: Vec<u16> = (1..=15).chain([8005]).collect();
    let f = filter_program(&many, StatusBits::UAPI);
    assert!(f.len() > 64);
    assert_eq!(through_filter(&f, &msgs).unwrap(), [0, 4]);
}

/// NEW messages: only entries just created, NAT'd, unreplied, TCP, on the
/// ports asked for.
#[test]
fn the_kernel_filter_passes_only_new_natted_tcp_on_the_ports_asked_for() {
    let dnat = incident5(CONFIRMED_DNAT);
    // A connection masqueraded on its way out: only SRC_NAT.
    let snat = Entry {
        reply: (sa("10.0.0.13:8005"), sa("10.0.0.1:45008")),
        orig: (sa("172.16.0.50:45008"), sa("10.0.0.13:8005")),
        ..incident5(CONFIRMED | IPS_SRC_NAT)
    };
    let msgs = [
        dnat.new_event(),                 // 0: passes
        incident5(CONFIRMED).new_event(), // 1: no NAT
        Entry {
            proto: 17,
            ..dnat.clone()
        }
        .new_event(), // 2: UDP
        incident5(CONFIRMED_DNAT | IPS_SEEN_REPLY).new_event(), // 3: answered
        dnat.new_with(0),                 // 4: an update
        dnat.new_with(NLM_F_CREATE),      // 5: not EXCL
        snat.new_event(),                 // 6: passes
        Entry {
            status: None,
            ..dnat.clone()
        }
        .new_event(), // 7: status unknown
        incident5(CONFIRMED_DNAT).destroy(), // 8: a destroy
        // 9: DNAT'd, other ports.
        Entry {
            orig: (sa("172.16.0.50:45009"), sa("10.0.58.158:80")),
            reply: (sa("10.0.0.13:8080"), sa("172.16.0.50:45009")),
            ..dnat.clone()
        }
        .new_event(),
    ];
    let any = filter_program(&[], StatusBits::UAPI);
    assert_eq!(through_filter(&any, &msgs).unwrap(), [0, 6, 8, 9]);
    // The service port (orig destination) or the backend port (reply source).
    for port in [8005, 45008] {
        let f = filter_program(&[port], StatusBits::UAPI);
        assert_eq!(through_filter(&f, &msgs).unwrap(), [0, 6, 8], "port {port}");
    }
    for port in [80, 8080, 45009] {
        let f = filter_program(&[443, port], StatusBits::UAPI);
        assert_eq!(through_filter(&f, &msgs).unwrap(), [9], "port {port}");
    }
    assert!(
        through_filter(&filter_program(&[443], StatusBits::UAPI), &msgs)
            .unwrap()
            .is_empty()
    );
    // Only DST_NAT asked for: the masqueraded one stays out.
    let dst_only = StatusBits {
        nat: IPS_DST_NAT,
        ..StatusBits::UAPI
    };
    assert_eq!(
        through_filter(&filter_program(&[], dst_only), &msgs).unwrap(),
        [0, 8, 9]
    );
    // No NAT bit at all: no NEW message passes.
    let none = StatusBits {
        nat: 0,
        ..StatusBits::UAPI
    };
    assert_eq!(
        through_filter(&filter_program(&[], none), &msgs).unwrap(),
        [8]
    );
}

/// The bits are the caller's, not the uapi constants baked in.
#[test]
fn the_kernel_filter_tests_the_status_bits_it_is_given() {
    let bits = StatusBits {
        seen_reply: 1 << 9,
        nat: 1 << 10,
    };
    let msgs = [
        incident5(1 << 10).new_event(),              // 0: "NAT'd"
        incident5(IPS_DST_NAT).new_event(),          // 1: not by these bits
        incident5((1 << 10) | (1 << 9)).new_event(), // 2: "answered"
        incident5(IPS_SEEN_REPLY).destroy(),         // 3: unreplied by these bits
        incident5(1 << 9).destroy(),                 // 4: "answered"
    ];
    assert_eq!(
        through_filter(&filter_program(&[], bits), &msgs).unwrap(),
        [0, 3]
    );
}

#[test]
fn status_bits_fall_back_to_uapi() {
    assert_eq!(
        StatusBits::from_names(&crate::kernel::facts::CtNames::default()),
        StatusBits::UAPI
    );
    // A kernel that numbered them otherwise, and had no SRC_NAT.
    let named = crate::kernel::facts::CtNames {
        status_bits: vec![(7, "SEEN_REPLY".into()), (9, "DST_NAT".into())],
    };
    assert_eq!(
        StatusBits::from_names(&named),
        StatusBits {
            seen_reply: 1 << 7,
            nat: (1 << 9) | IPS_SRC_NAT
        }
    );
}
