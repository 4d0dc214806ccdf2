//! Where things are in the running kernel: struct member offsets and
//! tracepoint argument positions, resolved from its BTF at load time (Rust
//! eBPF has no CO-RE) and handed to the programs as read-only globals.
use crate::ABSENT;

/// Byte offsets of the kernel struct members the programs read, resolved from
/// the running kernel's BTF at load time (Rust eBPF has no CO-RE).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `sk_buff.head` (`unsigned char *`).
    pub skb_head: u32,
    /// `sk_buff.network_header` (`__u16`, relative to `head`).
    pub skb_network_header: u32,
    /// `sk_buff.protocol` (`__be16`).
    pub skb_protocol: u32,
    /// `sk_buff.dev` (`struct net_device *`).
    pub skb_dev: u32,
    /// `sk_buff.sk` (`struct sock *`).
    pub skb_sk: u32,
    /// `sk_buff.skb_iif` (`int`): the ifindex the packet arrived on.
    pub skb_iif: u32,
    /// `sk_buff.mark` (`__u32`).
    pub skb_mark: u32,
    /// `net_device.ifindex` (`int`).
    pub dev_ifindex: u32,
    /// `net_device.nd_net.net` (`struct net *`).
    pub dev_net: u32,
    /// `sock.__sk_common.skc_net.net` (`struct net *`).
    pub sk_net: u32,
    /// `net.ns.inum` (`unsigned int`): the netns inode number.
    pub net_inum: u32,
    /// `flowi4.__fl_common.flowic_oif` (`int`).
    pub fl4_oif: u32,
    /// `flowi4.__fl_common.flowic_iif` (`int`).
    pub fl4_iif: u32,
    /// `flowi4.__fl_common.flowic_mark` (`__u32`).
    pub fl4_mark: u32,
    /// `flowi4.saddr` (`__be32`).
    pub fl4_saddr: u32,
    /// `flowi4.daddr` (`__be32`).
    pub fl4_daddr: u32,
    /// `fib_nh_common.nhc_dev` (`struct net_device *`).
    pub nhc_dev: u32,
    /// `fib_nh_common.nhc_gw` (union; IPv4 in its first 4 bytes).
    pub nhc_gw: u32,
    /// `fib_nh_common.nhc_gw_family` (`u8`).
    pub nhc_gw_family: u32,
    /// `fib_nh_common.nhc_scope` (`unsigned char`).
    pub nhc_scope: u32,
    /// `sk_buff.mac_header` (`__u16`, relative to `head`; `~0` when unset).
    pub skb_mac_header: u32,
    /// `sk_buff._nfct` (`unsigned long`: `struct nf_conn *` | ctinfo).
    pub skb_nfct: u32,
    /// `nf_conn.tuplehash[0].tuple`; the reply tuple follows at
    /// `+ ct_tuplehash_size`.
    pub ct_tuple: u32,
    pub ct_tuplehash_size: u32,
    /// Within `struct nf_conntrack_tuple`: `src.u3`, `src.u.all`,
    /// `dst.u3`, `dst.u.all`, `dst.protonum`.
    pub tuple_src_addr: u32,
    pub tuple_src_port: u32,
    pub tuple_dst_addr: u32,
    pub tuple_dst_port: u32,
    pub tuple_protonum: u32,
    /// `nf_conn.status` (`unsigned long`), `nf_conn.mark` (`u32`),
    /// `nf_conn.zone.id` (`u16`).
    pub ct_status: u32,
    pub ct_mark: u32,
    pub ct_zone: u32,
    /// `sock.__sk_common` and `request_sock.__req_common` (`struct
    /// sock_common`), and within `struct sock_common`: `skc_daddr`,
    /// `skc_rcv_saddr` (`__be32`), `skc_dport` (`__be16`), `skc_num`
    /// (`__u16`, host order), `skc_family` (`unsigned short`), `skc_state`
    /// (`unsigned char`), `skc_v6_daddr`, `skc_v6_rcv_saddr` (`struct
    /// in6_addr`), `skc_net.net` (`struct net *`).
    pub sk_common: u32,
    pub req_common: u32,
    pub skc_daddr: u32,
    pub skc_rcv_saddr: u32,
    pub skc_dport: u32,
    pub skc_num: u32,
    pub skc_family: u32,
    pub skc_state: u32,
    pub skc_v6_daddr: u32,
    pub skc_v6_rcv_saddr: u32,
    pub skc_net: u32,
    /// The client's initial sequence number and how its connect() ended, for
    /// the handshake tracepoints: `tcp_sock.snd_una` (`u32`: the SYN's
    /// sequence number while SYN-SENT, `tcp_connect_init`),
    /// `tcp_request_sock.rcv_isn` (`u32`), `inet_connection_sock.
    /// icsk_retransmits` (`__u8`), `sock.sk_err` (`int`), each from the
    /// start of the socket (include/linux/tcp.h, include/net/inet_connection_sock.h,
    /// include/net/sock.h as of v6.18).
    pub tcp_snd_una: u32,
    pub req_rcv_isn: u32,
    pub icsk_retransmits: u32,
    pub sk_err: u32,
}

impl Offsets {
    pub const fn zeroed() -> Self {
        Self {
            skb_head: ABSENT,
            skb_network_header: ABSENT,
            skb_protocol: ABSENT,
            skb_dev: ABSENT,
            skb_sk: ABSENT,
            skb_iif: ABSENT,
            skb_mark: ABSENT,
            dev_ifindex: ABSENT,
            dev_net: ABSENT,
            sk_net: ABSENT,
            net_inum: ABSENT,
            fl4_oif: ABSENT,
            fl4_iif: ABSENT,
            fl4_mark: ABSENT,
            fl4_saddr: ABSENT,
            fl4_daddr: ABSENT,
            nhc_dev: ABSENT,
            nhc_gw: ABSENT,
            nhc_gw_family: ABSENT,
            nhc_scope: ABSENT,
            skb_mac_header: ABSENT,
            skb_nfct: ABSENT,
            ct_tuple: ABSENT,
            ct_tuplehash_size: ABSENT,
            tuple_src_addr: ABSENT,
            tuple_src_port: ABSENT,
            tuple_dst_addr: ABSENT,
            tuple_dst_port: ABSENT,
            tuple_protonum: ABSENT,
            ct_status: ABSENT,
            ct_mark: ABSENT,
            ct_zone: ABSENT,
            sk_common: ABSENT,
            req_common: ABSENT,
            skc_daddr: ABSENT,
            skc_rcv_saddr: ABSENT,
            skc_dport: ABSENT,
            skc_num: ABSENT,
            skc_family: ABSENT,
            skc_state: ABSENT,
            skc_v6_daddr: ABSENT,
            skc_v6_rcv_saddr: ABSENT,
            skc_net: ABSENT,
            tcp_snd_una: ABSENT,
            req_rcv_isn: ABSENT,
            icsk_retransmits: ABSENT,
            sk_err: ABSENT,
        }
    }
}

/// Where the `skb:kfree_skb` arguments are. For tp_btf and raw_tp these are
/// indexes into the `TP_PROTO` arguments; for the classic tracepoint they are
/// byte offsets into the trace record (from its `format` file). `ABSENT` when
/// the kernel does not pass it (no `reason` before 5.17).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KfreeSkbArgs {
    pub skb: u32,
    pub location: u32,
    pub reason: u32,
    /// The reason value that means "consumed, not dropped" (`SKB_CONSUMED`),
    /// `ABSENT` if the kernel has none.
    pub consumed: u32,
}

impl KfreeSkbArgs {
    pub const fn zeroed() -> Self {
        Self {
            skb: ABSENT,
            location: ABSENT,
            reason: ABSENT,
            consumed: ABSENT,
        }
    }
}

/// Where the `fib:fib_table_lookup` arguments are: `TP_PROTO` indexes for
/// tp_btf/raw_tp. `ABSENT` when the kernel does not pass one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FibLookupArgs {
    pub tb_id: u32,
    pub flp: u32,
    pub nhc: u32,
    pub err: u32,
}

impl FibLookupArgs {
    pub const fn zeroed() -> Self {
        Self {
            tb_id: ABSENT,
            flp: ABSENT,
            nhc: ABSENT,
            err: ABSENT,
        }
    }
}

/// Argument positions (`TP_PROTO` indexes, from BTF) of the TCP
/// handshake tracepoints: `tcp_retransmit_skb(sk, skb[, err])` (the
/// `err` argument came in v6.11) and `tcp_retransmit_synack(sk, req)`
/// (https://github.com/torvalds/linux/blob/v6.18/include/trace/events/tcp.h),
/// `inet_sock_set_state(sk, oldstate, newstate)` (since v4.16,
/// https://github.com/torvalds/linux/blob/v6.18/include/trace/events/sock.h).
/// `ABSENT` when the kernel has no such tracepoint or argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetransArgs {
    pub skb_sk: u32,
    pub synack_sk: u32,
    pub synack_req: u32,
    pub state_sk: u32,
    pub state_old: u32,
    pub state_new: u32,
    pub _pad: [u32; 2],
}

impl RetransArgs {
    pub const fn zeroed() -> Self {
        Self {
            skb_sk: ABSENT,
            synack_sk: ABSENT,
            synack_req: ABSENT,
            state_sk: ABSENT,
            state_old: ABSENT,
            state_new: ABSENT,
            _pad: [0; 2],
        }
    }
}
