//! A dead handshake explained: hairpin without reverse NAT, asymmetric
//! return path, LB loopback, unanswered, SYN-ACK answered by a RST.
use crate::model::cause::Cause;
use std::net::IpAddr;

use super::tracker::{errno, CtBits, Flow, GaveUp, Reset};
use crate::diagnosis::fix_kinds::Kind;
use crate::model::{
    finding::Finding,
    packet::{Ct, Tuple},
    routing::Tables,
};

/// Deletes the entry whose original tuple is `t` (in the namespace `ns`
/// runs commands in): a retry of the same 5-tuple would otherwise keep the
/// entry made before the repair, and its translation.
pub fn clear_entry(ns: &str, t: &Tuple) -> String {
    format!(
        "{ns}conntrack -D{} -p tcp --orig-src {} --orig-port-src {} --orig-dst {} --orig-port-dst {}",
        family_flag(t),
        t.src.ip(),
        t.src.port(),
        t.dst.ip(),
        t.dst.port()
    )
}

/// `conntrack -L` of the entry whose original tuple is `t`.
pub fn show_entry(ns: &str, t: &Tuple) -> String {
    format!(
        "{ns}conntrack -L{} -p tcp --orig-src {} --orig-port-src {} --orig-dst {} --orig-port-dst {}",
        family_flag(t),
        t.src.ip(),
        t.src.port(),
        t.dst.ip(),
        t.dst.port()
    )
}

/// `-f ipv6` for an IPv6 tuple: conntrack(8) lists and deletes IPv4 by
/// default.
fn family_flag(t: &Tuple) -> &'static str {
    if t.src.is_ipv4() {
        ""
    } else {
        " -f ipv6"
    }
}

/// A conntrack entry as evidence: both tuples and the status bits.
pub(crate) fn ct_text(ct: &Ct, status: &[String]) -> String {
    format!(
        "orig {} -> {}, reply {} -> {}, status [{}]",
        ct.orig.src,
        ct.orig.dst,
        ct.reply.src,
        ct.reply.dst,
        status.join(",")
    )
}

pub fn transmissions(flow: &Flow) -> String {
    let secs = (flow.last_ns.saturating_sub(flow.first_ns)) as f64 / 1e9;
    let mut s = if flow.syns == 1 {
        "1 transmission of the SYN, not answered".to_string()
    } else if flow.first_unseen {
        format!(
            "{} transmissions of the same SYN, none answered (counted by the client's socket: \
             kdrop saw {})",
            flow.syns,
            if flow.first_ns == flow.last_ns {
                "the last".to_string()
            } else {
                format!("those of the last {secs:.1}s")
            }
        )
    } else {
        format!(
            "{} transmissions of the same SYN over {secs:.1}s, none answered",
            flow.syns
        )
    };
    match flow.gave_up {
        Some(GaveUp::Socket(err)) => {
            s.push_str("; then the client's connect() ended in SYN-SENT: ");
            s.push_str(&gave_up_text(err));
        }
        Some(GaveUp::Silent { waited_ns }) => s.push_str(&format!(
            "; no retransmission came in the {:.1}s after the last, though the next was due \
             (Linux doubles the gap from 1 s): the client gave up, a connect timeout as short \
             as that (or its retransmissions stopped reaching this host)",
            waited_ns as f64 / 1e9
        )),
        None => {}
    }
    s
}

/// How a connect() ended in SYN-SENT, from the socket's `sk_err`.
fn gave_up_text(err: i32) -> String {
    match err {
        0 => "the application closed it (a connect timeout, or it gave up)".into(),
        errno::ETIMEDOUT => "the kernel gave up (ETIMEDOUT: net.ipv4.tcp_syn_retries spent)".into(),
        errno::EHOSTUNREACH => "an ICMP host unreachable answered it (EHOSTUNREACH)".into(),
        errno::ENETUNREACH => "an ICMP network unreachable answered it (ENETUNREACH)".into(),
        e => format!("error {e} (sk_err)"),
    }
}

/// The evidence line of a RST answering a SYN-ACK: where each left.
pub fn reset_seen(
    r: &Reset,
    syn_ack_dev: &str,
    syn_ack_ns: &str,
    rst_dev: &str,
    rst_ns: &str,
) -> String {
    let ms = r.rst.ts_ns.saturating_sub(r.syn_ack_at.ts_ns) as f64 / 1e6;
    format!(
        "the SYN-ACK {} -> {} left {syn_ack_dev} in netns {syn_ack_ns}; {ms:.1} ms later {} \
         answered it with a RST, which left {rst_dev} in netns {rst_ns}",
        r.syn_ack.src,
        r.syn_ack.dst,
        r.syn_ack.dst.ip()
    )
}

/// A SYN-ACK answered by a RST, with no NAT kdrop saw to blame.
pub fn reset(r: &Reset, seen: &str) -> Finding {
    let (server, client) = (r.syn_ack.src, r.syn_ack.dst);
    let syn = match &r.flow {
        Some(f) => format!(
            "{} (SYN {} -> {})",
            transmissions(f).replace(", none answered", ""),
            f.orig.src,
            f.orig.dst
        ),
        None => format!("kdrop did not see a SYN {client} -> {server} leave any device it follows"),
    };
    Finding {
        cause: Cause::SynAckReset,
        summary: format!(
            "the SYN-ACK {server} -> {client} was answered by a RST: {} has no socket waiting for it",
            client.ip()
        ),
        evidence: vec![
            seen.to_string(),
            syn,
            format!(
                "a SYN-ACK is refused with a RST when no socket of {} is in SYN-SENT for {server}: \
                 its SYN went to another address (a translation the reply did not undo), it \
                 gave up before the SYN-ACK came, or it never had one (a half-open port scan)",
                client.ip()
            ),
        ],
        ..Finding::default()
    }
}

/// A SYN sent `UNANSWERED_AFTER` times without an answer, explained.
pub fn unanswered(
    flow: &Flow,
    bits: &CtBits,
    status: &[String],
    t: &Tables,
    dnat_ns: &str,
) -> Finding {
    let dev = t.link_name(flow.ifindex);
    let sent = transmissions(flow);
    match flow.ct {
        Some(ct) if ct.status & bits.dst_nat != 0 && ct.status & bits.src_nat == 0 => asymmetric(
            &ct,
            &dev,
            vec![
                format!("conntrack: {} (UNREPLIED)", ct_text(&ct, status)),
                sent,
            ],
            dnat_ns,
        ),
        _ => Finding {
            cause: Cause::Unanswered,
            summary: format!(
                "SYN {} -> {} sent {} out of {dev} without an answer",
                flow.orig.src,
                flow.orig.dst,
                if flow.syns == 1 {
                    "once".to_string()
                } else {
                    format!("{} times", flow.syns)
                }
            ),
            evidence: vec![sent],
            ..Finding::default()
        },
    }
}

/// A DNAT'd SYN (`ct`, no SNAT) sent out `dev` whose reply did not come back
/// through this host; `seen` is what showed it (first evidence).
pub fn asymmetric(ct: &Ct, dev: &str, mut seen: Vec<String>, dnat_ns: &str) -> Finding {
    let (client, service, backend) = (ct.orig.src, ct.orig.dst, ct.reply.src);
    seen.push(format!(
        "no SNAT: {backend} sees {} as the source and answers it directly, bypassing this \
         host, so the reply is never un-DNAT'd",
        client.ip()
    ));
    Finding {
        cause: Cause::AsymmetricReturnPath,
        summary: format!(
            "SYN {client} -> {service} was DNAT'd to {backend} and sent out {dev}, but no reply \
             came back through this host: asymmetric return path"
        ),
        evidence: seen,
        fix: vec![
            Kind::ReturnPathMasquerade.fix(format!(
                "{dnat_ns}{} -t nat -A POSTROUTING -d {}/{} -p tcp --dport {} -j MASQUERADE",
                iptables_for(backend.ip()),
                backend.ip(),
                host_prefix(backend.ip()),
                backend.port()
            )),
            Kind::ConntrackDeleteEntry.fix(clear_entry(dnat_ns, &ct.orig)),
        ],
        fix_notes: vec![
            format!(
                "with the masquerade {backend} answers this host, which un-NATs the reply; the \
                 entry made before it has no SNAT, so the client's retries from {client} fail \
                 until it is deleted (the second command)"
            ),
            format!(
                "or, outside this node: route {} back through this host on {}'s side (the \
                 router or gateway between them)",
                client.ip(),
                backend.ip()
            ),
        ],
        inspect: vec![show_entry(dnat_ns, &ct.orig)],
        ..Finding::default()
    }
}

/// The iptables command of an address's family.
pub(super) fn iptables_for(a: IpAddr) -> &'static str {
    if a.is_ipv4() {
        "iptables"
    } else {
        "ip6tables"
    }
}

/// The prefix length of one host of an address's family.
pub(super) fn host_prefix(a: IpAddr) -> u8 {
    if a.is_ipv4() {
        32
    } else {
        128
    }
}
