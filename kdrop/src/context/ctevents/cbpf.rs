//! The classic BPF filter each event socket carries: DELETE messages of TCP
//! entries without SEEN_REPLY; NEW messages (flagged CREATE|EXCL) of TCP
//! entries without SEEN_REPLY and with a NAT bit; and, with `--port`, only
//! those one of whose ports is asked for (see the module above for why
//! these tests and not others).
use std::os::fd::{AsRawFd as _, OwnedFd};

use super::{
    parse::{
        ct_type, ATTRS_AT, CTA_PROTO_DST_PORT, CTA_PROTO_NUM, CTA_PROTO_SRC_PORT, CTA_STATUS,
        CTA_TUPLE_ORIG, CTA_TUPLE_PROTO, CTA_TUPLE_REPLY, IPCTNL_MSG_CT_DELETE, IPCTNL_MSG_CT_NEW,
        IPPROTO_TCP, NLM_F_CREATE, NLM_F_EXCL,
    },
    StatusBits,
};

#[derive(Clone, Copy)]
enum Ins {
    Stmt(u16, u32),
    /// `if A == k goto label`.
    JeqTo(u32, usize),
    /// `if A != k goto label`.
    JneTo(u32, usize),
    /// `if A & k goto label`.
    JsetTo(u32, usize),
    /// `goto label`.
    JaTo(usize),
    Label(usize),
}

const ACCEPT: usize = 0;
const REJECT: usize = 1;
const DESTROYED: usize = 2;
const TUPLES: usize = 3;
/// Labels of the port tests (four of them) start here.
const PORTS: usize = 4;

fn ld_abs_h(off: u32) -> Ins {
    Ins::Stmt((libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16, off)
}
fn ld_imm(k: u32) -> Ins {
    Ins::Stmt((libc::BPF_LD | libc::BPF_IMM) as u16, k)
}
fn ldx_imm(k: u32) -> Ins {
    Ins::Stmt((libc::BPF_LDX | libc::BPF_IMM) as u16, k)
}
fn ld_mem(m: u32) -> Ins {
    Ins::Stmt((libc::BPF_LD | libc::BPF_MEM) as u16, m)
}
fn st_mem(m: u32) -> Ins {
    Ins::Stmt(libc::BPF_ST as u16, m)
}
/// A &= k.
fn and(k: u32) -> Ins {
    Ins::Stmt((libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16, k)
}
fn tax() -> Ins {
    Ins::Stmt((libc::BPF_MISC | libc::BPF_TAX) as u16, 0)
}
/// A = offset of the attribute of type X in the stream starting at A (0 if none).
fn nlattr() -> Ins {
    Ins::Stmt(
        (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        (libc::SKF_AD_OFF + libc::SKF_AD_NLATTR) as u32,
    )
}
/// A = offset of the attribute of type X nested in the attribute at A.
fn nlattr_nest() -> Ins {
    Ins::Stmt(
        (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        (libc::SKF_AD_OFF + libc::SKF_AD_NLATTR_NEST) as u32,
    )
}
/// A = the payload of the attribute at X (after its 4-byte header).
fn ld_payload(size: u32) -> Ins {
    Ins::Stmt((libc::BPF_LD | size | libc::BPF_IND) as u16, 4)
}

/// nlmsg_type and nlmsg_flags are in host order; BPF_H loads big-endian.
fn as_loaded(v: u16) -> u32 {
    u32::from(u16::from_be_bytes(v.to_ne_bytes()))
}

/// The filter: DELETE messages of TCP entries without SEEN_REPLY; NEW
/// messages flagged CREATE|EXCL of TCP entries without SEEN_REPLY and with
/// one of `bits.nat`; with `ports`, one of the entry's ports among them.
/// What it cannot read passes, for userspace to decide: a DELETE message
/// without a status (still tested on its ports), a message without a
/// tuple. A NEW message without a status is not known to be NAT'd: it
/// does not pass.
pub fn filter_program(ports: &[u16], bits: StatusBits) -> Vec<libc::sock_filter> {
    let created = NLM_F_CREATE | NLM_F_EXCL;
    // CTA_STATUS: X = its offset, or 0 (then A = 0 too).
    let status = [
        ld_imm(ATTRS_AT as u32),
        ldx_imm(CTA_STATUS.into()),
        nlattr(),
    ];
    let mut p = vec![
        ld_abs_h(4),
        Ins::JeqTo(as_loaded(ct_type(IPCTNL_MSG_CT_DELETE)), DESTROYED),
        Ins::JneTo(as_loaded(ct_type(IPCTNL_MSG_CT_NEW)), REJECT),
        // NEW: an entry created, not an update (ctnetlink_conntrack_event,
        // https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_netlink.c).
        ld_abs_h(6),
        and(as_loaded(created)),
        Ins::JneTo(as_loaded(created), REJECT),
    ];
    p.extend(status);
    p.extend([
        Ins::JeqTo(0, REJECT),
        tax(),
        // be32: BPF_W loads it as the host value.
        ld_payload(libc::BPF_W),
        Ins::JsetTo(bits.seen_reply, REJECT),
        Ins::JsetTo(bits.nat, TUPLES),
        Ins::JaTo(REJECT),
        Ins::Label(DESTROYED),
    ]);
    p.extend(status);
    p.extend([
        // No status (older kernels sent none on destroy): the ports decide.
        Ins::JeqTo(0, TUPLES),
        tax(),
        ld_payload(libc::BPF_W),
        Ins::JsetTo(bits.seen_reply, REJECT),
        Ins::Label(TUPLES),
    ]);
    // M[0], M[1]: the proto attribute of the original and reply tuples.
    for (slot, tuple) in [(0, CTA_TUPLE_ORIG), (1, CTA_TUPLE_REPLY)] {
        p.extend([
            ld_imm(ATTRS_AT as u32),
            ldx_imm(tuple.into()),
            nlattr(),
            Ins::JeqTo(0, ACCEPT),
            ldx_imm(CTA_TUPLE_PROTO.into()),
            nlattr_nest(),
            Ins::JeqTo(0, ACCEPT),
            st_mem(slot),
        ]);
    }
    p.extend([
        ld_mem(0),
        ldx_imm(CTA_PROTO_NUM.into()),
        nlattr_nest(),
        Ins::JeqTo(0, ACCEPT),
        tax(),
        ld_payload(libc::BPF_B),
        Ins::JneTo(IPPROTO_TCP.into(), REJECT),
    ]);
    if ports.is_empty() {
        p.push(Ins::JeqTo(u32::from(IPPROTO_TCP), ACCEPT));
    } else {
        for slot in [0, 1] {
            for which in [CTA_PROTO_SRC_PORT, CTA_PROTO_DST_PORT] {
                p.extend([ld_mem(slot), ldx_imm(which.into()), nlattr_nest()]);
                // No such port attribute: on to the next one.
                let next = PORTS + (slot as usize) * 2 + usize::from(which == CTA_PROTO_DST_PORT);
                p.extend([Ins::JeqTo(0, next), tax(), ld_payload(libc::BPF_H)]);
                for port in ports {
                    p.push(Ins::JeqTo((*port).into(), ACCEPT));
                }
                p.push(Ins::Label(next));
            }
        }
    }
    p.extend([
        Ins::Label(REJECT),
        Ins::Stmt((libc::BPF_RET | libc::BPF_K) as u16, 0),
        Ins::Label(ACCEPT),
        Ins::Stmt((libc::BPF_RET | libc::BPF_K) as u16, u32::MAX),
    ]);
    assemble(&p)
}

/// Conditional jumps become a short skip over an unconditional `ja`, whose
/// 32-bit offset reaches any label (jt/jf are 8 bits).
fn assemble(p: &[Ins]) -> Vec<libc::sock_filter> {
    let size = |i: &Ins| match i {
        Ins::Label(_) => 0,
        Ins::Stmt(..) | Ins::JaTo(_) => 1,
        _ => 2,
    };
    let mut at = std::collections::HashMap::new();
    let mut pc = 0usize;
    for i in p {
        if let Ins::Label(l) = i {
            at.insert(*l, pc);
        }
        pc += size(i);
    }
    let mut out = Vec::with_capacity(pc);
    let jmp = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | code | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    for i in p {
        let mut cond = |code: u32, k: u32, take_on_true: bool, label: usize| {
            // The `ja` sits right after the test: run it when the test says
            // so, skip it otherwise.
            let (jt, jf) = if take_on_true { (0, 1) } else { (1, 0) };
            out.push(jmp(code, k, jt, jf));
            let here = out.len() + 1;
            out.push(jmp(libc::BPF_JA, (at[&label] - here) as u32, 0, 0));
        };
        match *i {
            Ins::Stmt(code, k) => out.push(libc::sock_filter {
                code,
                jt: 0,
                jf: 0,
                k,
            }),
            Ins::JeqTo(k, l) => cond(libc::BPF_JEQ, k, true, l),
            Ins::JneTo(k, l) => cond(libc::BPF_JEQ, k, false, l),
            Ins::JsetTo(k, l) => cond(libc::BPF_JSET, k, true, l),
            Ins::JaTo(l) => {
                let here = out.len() + 1;
                out.push(jmp(libc::BPF_JA, (at[&l] - here) as u32, 0, 0));
            }
            Ins::Label(_) => {}
        }
    }
    out
}

/// Attaches `prog` to the socket `fd`.
pub fn attach(fd: &OwnedFd, prog: &[libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: fprog points at `prog`, alive for the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
