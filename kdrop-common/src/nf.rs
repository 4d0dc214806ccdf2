//! Netfilter verdicts as the kernel returned them: the return value of
//! `nf_conntrack_in`, `nf_nat_inet_fn`, `nft_do_chain` and `ipt_do_table`
//! for a packet they dropped, recorded by fexit or kretprobe programs and
//! correlated with the drop in userspace (same CPU, same packet, just
//! before the free: `nf_hook_slow` frees the skb right after the hook
//! function returned NF_DROP).
use crate::{EventHeader, PacketId, ABSENT};

/// `EventHeader.kind` of a netfilter verdict record.
pub const EVENT_NF_VERDICT: u32 = 3;

/// `NfVerdictEvent.func` values, also indexes of `NfProbes::args`.
pub const NF_FN_CONNTRACK_IN: u8 = 0;
pub const NF_FN_NAT: u8 = 1;
pub const NF_FN_NFT_DO_CHAIN: u8 = 2;
pub const NF_FN_IPT_DO_TABLE: u8 = 3;
pub const NF_FNS: usize = 4;

/// Netfilter verdict codes, UAPI (include/uapi/linux/netfilter.h, as of
/// v6.18: https://github.com/torvalds/linux/blob/v6.18/include/uapi/linux/netfilter.h#L10):
/// the low byte of a hook's return value is the verdict, NF_DROP is 0.
pub const NF_VERDICT_MASK: u32 = 0xff;
pub const NF_DROP: u32 = 0;

/// Bytes kept of a table or chain name (xt_table.name is 32 bytes,
/// XT_TABLE_MAXNAMELEN; nftables names are longer but rarely).
pub const NF_NAME_LEN: usize = 32;

/// A netfilter function returned NF_DROP for a TCP packet that passed the
/// filter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfVerdictEvent {
    pub header: EventHeader,
    pub pkt: PacketId,
    /// The raw return value (verdict in the low byte, errno above it).
    pub verdict: u32,
    /// `NF_FN_*`.
    pub func: u8,
    /// `nf_hook_state.hook` (`enum nf_inet_hooks`), `NF_UNKNOWN` if unread.
    pub hook: u8,
    /// `nf_hook_state.pf` (NFPROTO_*), `NF_UNKNOWN` if unread.
    pub pf: u8,
    pub _pad: u8,
    /// NUL-terminated; empty when the function has none or it is unread.
    pub table: [u8; NF_NAME_LEN],
    pub chain: [u8; NF_NAME_LEN],
}

pub const NF_UNKNOWN: u8 = 0xff;

/// Which argument of a traced function holds what (indexes from BTF, or
/// from a cited signature on kernels without module BTF); `ABSENT` when
/// the function has no such argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfFnArgs {
    /// `struct sk_buff *`.
    pub skb: u32,
    /// `const struct nf_hook_state *`.
    pub state: u32,
    /// `struct nft_pktinfo *` (nft_do_chain): skb and state are inside.
    pub pkt: u32,
    /// `void *priv`: the `struct nft_chain *` of nft_do_chain, the
    /// `struct xt_table *` of ipt_do_table.
    pub priv_: u32,
}

impl NfFnArgs {
    pub const fn zeroed() -> Self {
        Self {
            skb: ABSENT,
            state: ABSENT,
            pkt: ABSENT,
            priv_: ABSENT,
        }
    }
}

/// Load-time facts for the verdict programs: argument positions and the
/// offsets (from vmlinux and module BTF) of what they read.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfProbes {
    pub args: [NfFnArgs; NF_FNS],
    /// `nf_hook_state.hook`, `.pf` (`u8` each).
    pub state_hook: u32,
    pub state_pf: u32,
    /// `nft_pktinfo.skb`; `nft_pktinfo.state` (6.x) or `.xt.state` (5.10).
    pub pkt_skb: u32,
    pub pkt_state: u32,
    /// `nft_chain.name` (`char *`), `nft_chain.table`, `nft_table.name`.
    pub chain_name: u32,
    pub chain_table: u32,
    pub nft_table_name: u32,
    /// `xt_table.name` (`char[32]`).
    pub xt_table_name: u32,
}

impl NfProbes {
    pub const fn zeroed() -> Self {
        Self {
            args: [NfFnArgs::zeroed(); NF_FNS],
            state_hook: ABSENT,
            state_pf: ABSENT,
            pkt_skb: ABSENT,
            pkt_state: ABSENT,
            chain_name: ABSENT,
            chain_table: ABSENT,
            nft_table_name: ABSENT,
            xt_table_name: ABSENT,
        }
    }
}

/// Depth of the per-CPU stack of arguments a kprobe saves for its
/// kretprobe: a REJECT sends a RST through the output hooks from inside
/// the hook, and a softirq can interrupt a process-context hook.
pub const NF_ARG_DEPTH: usize = 8;

/// One function's saved arguments on one CPU (kretprobe rung).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfArgStack {
    /// Calls entered and not yet returned; may exceed `NF_ARG_DEPTH`
    /// (those calls keep no arguments).
    pub depth: u32,
    pub _pad: u32,
    /// Three arguments and the `bpf_ktime_get_ns()` of the call.
    pub slots: [[u64; 4]; NF_ARG_DEPTH],
}

/// A saved call older than this is one whose return the kretprobe missed:
/// the stack is reset. A hook function runs for microseconds, but it can
/// print: nf_conntrack_in warns "table full, dropping packet" before it
/// returns NF_DROP, and printk to a serial console takes milliseconds (tens
/// under emulation; a 10 ms bound lost that very verdict in the 6.1 VM).
pub const NF_ARG_STALE_NS: u64 = 1_000_000_000;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: repr(C), integers and arrays only, explicit padding.
    unsafe impl aya::Pod for NfVerdictEvent {}
    unsafe impl aya::Pod for NfFnArgs {}
    unsafe impl aya::Pod for NfProbes {}
    unsafe impl aya::Pod for NfArgStack {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_hidden_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<NfVerdictEvent>(), 16 + 56 + 8 + 2 * NF_NAME_LEN);
        assert_eq!(size_of::<NfFnArgs>(), 16);
        assert_eq!(size_of::<NfProbes>(), 16 * NF_FNS + 8 * 4);
        assert_eq!(size_of::<NfArgStack>(), 8 + 32 * NF_ARG_DEPTH);
    }
}
