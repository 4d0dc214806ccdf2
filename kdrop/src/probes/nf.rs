//! Load-time facts for the netfilter verdict probes (kdrop-ebpf/src/
//! nfverdict.rs): where each traced function's BTF lives (vmlinux, or the
//! module's split BTF under /sys/kernel/btf when netfilter is built as
//! modules, as on Debian), which argument holds what, and the offsets of
//! what the programs read. A function kdrop cannot place is not traced, and
//! `kdrop check` says why.
use std::{collections::HashMap, path::Path, sync::Arc};

use kdrop_common::{
    nf::{
        NfFnArgs, NfProbes, NF_FNS, NF_FN_CONNTRACK_IN, NF_FN_IPT_DO_TABLE, NF_FN_NAT,
        NF_FN_NFT_DO_CHAIN,
    },
    ABSENT,
};

use crate::kernel::{
    btf::{Btf, Kind},
    facts::offset,
};

/// A traced netfilter function.
pub struct NfFunc {
    pub name: &'static str,
    /// The module that holds it on kernels that build netfilter as modules.
    pub module: &'static str,
    /// Its argument count, which the fexit program is built for.
    pub nargs: usize,
    pub id: u8,
    /// The probe point's name and what its verdict says (`kdrop check`).
    pub point: &'static str,
    pub what: &'static str,
    /// Probe names (`kdrop check`, `KDROP_RUNG`-free ladder).
    pub fexit: &'static str,
    pub kprobe: &'static str,
    pub kretprobe: &'static str,
}

/// Signatures: kdrop-ebpf/src/main.rs cites them per kernel version.
pub const FUNCS: [NfFunc; NF_FNS] = [
    NfFunc {
        name: "nf_conntrack_in",
        point: "nf_conntrack_in (return)",
        module: "nf_conntrack",
        nargs: 2,
        id: NF_FN_CONNTRACK_IN,
        what: "conntrack's verdict (table full, entry not created)",
        fexit: "nf_conntrack_in_fexit",
        kprobe: "nf_conntrack_in_kprobe",
        kretprobe: "nf_conntrack_in_kretprobe",
    },
    NfFunc {
        name: "nf_nat_inet_fn",
        point: "nf_nat_inet_fn (return)",
        module: "nf_nat",
        nargs: 3,
        id: NF_FN_NAT,
        what: "the NAT step's verdict (no address or port to map to)",
        fexit: "nf_nat_inet_fn_fexit",
        kprobe: "nf_nat_inet_fn_kprobe",
        kretprobe: "nf_nat_inet_fn_kretprobe",
    },
    NfFunc {
        name: "nft_do_chain",
        point: "nft_do_chain (return)",
        module: "nf_tables",
        nargs: 2,
        id: NF_FN_NFT_DO_CHAIN,
        what: "nftables / iptables-nft verdict (table, chain, hook)",
        fexit: "nft_do_chain_fexit",
        kprobe: "nft_do_chain_kprobe",
        kretprobe: "nft_do_chain_kretprobe",
    },
    NfFunc {
        name: "ipt_do_table",
        point: "ipt_do_table (return)",
        module: "ip_tables",
        nargs: 3,
        id: NF_FN_IPT_DO_TABLE,
        what: "iptables-legacy verdict (table, hook)",
        fexit: "ipt_do_table_fexit",
        kprobe: "ipt_do_table_kprobe",
        kretprobe: "ipt_do_table_kretprobe",
    },
];

/// What kdrop knows about one function on this kernel.
#[derive(Clone, Debug)]
pub struct FnFacts {
    /// `vmlinux BTF`, `/sys/kernel/btf/nf_tables (module BTF)`, or the
    /// cited signature when the kernel has no BTF for it.
    pub source: String,
    /// Can fexit attach (aya attaches to vmlinux functions only)?
    pub fexit: Result<(), String>,
}

/// Everything for the verdict programs.
pub struct NfSetup {
    pub probes: NfProbes,
    /// Per `FUNCS` entry: what is known, or why it cannot be traced.
    pub funcs: Vec<Result<FnFacts, String>>,
}

/// Where a function's BTF was found.
enum Found {
    Vmlinux(u32),
    Module(Arc<Btf>, u32),
}

/// `5.10.0-32-amd64` -> (5, 10).
pub fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(['.', '-']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Argument positions by parameter type, from BTF.
pub fn args_from_types(types: &[String]) -> NfFnArgs {
    let mut a = NfFnArgs::zeroed();
    for (i, t) in types.iter().enumerate() {
        let i = i as u32;
        match t.as_str() {
            "struct sk_buff *" => a.skb = i,
            "struct nf_hook_state *" => a.state = i,
            "struct nft_pktinfo *" => a.pkt = i,
            "void *" | "struct xt_table *" => a.priv_ = i,
            _ => {}
        }
    }
    a
}

/// Argument positions from the signature when the kernel has no BTF for
/// the function (5.10: no module BTF before 5.11). ipt_do_table was
/// reordered in v5.16 to be a hook function
/// (https://github.com/torvalds/linux/blob/v5.15/net/ipv4/netfilter/ip_tables.c
/// `ipt_do_table(skb, state, table)`, v5.16: `(priv, skb, state)`).
pub fn args_from_signature(id: u8, version: Option<(u32, u32)>) -> Result<NfFnArgs, String> {
    let mut a = NfFnArgs::zeroed();
    match id {
        NF_FN_CONNTRACK_IN => (a.skb, a.state) = (0, 1),
        NF_FN_NAT => (a.priv_, a.skb, a.state) = (0, 1, 2),
        NF_FN_IPT_DO_TABLE => match version {
            Some(v) if v < (5, 16) => (a.skb, a.state, a.priv_) = (0, 1, 2),
            Some(_) => (a.priv_, a.skb, a.state) = (0, 1, 2),
            None => return Err("kernel version unknown: argument order unknown".into()),
        },
        _ => {
            return Err("its struct nft_pktinfo is only described by module BTF, \
                        which this kernel does not have"
                .into())
        }
    }
    Ok(a)
}

/// The arguments `id` needs, all within the three the probes save.
fn check_args(f: &NfFunc, a: &NfFnArgs) -> Result<(), String> {
    let need: &[(&str, u32)] = match f.id {
        NF_FN_NFT_DO_CHAIN => &[("pkt", a.pkt), ("chain", a.priv_)],
        _ => &[("skb", a.skb), ("state", a.state)],
    };
    for (what, i) in need {
        if *i == ABSENT || *i > 2 {
            return Err(format!(
                "{}: no {what} among its first three arguments",
                f.name
            ));
        }
    }
    Ok(())
}

impl NfSetup {
    pub fn read(vmlinux: &Arc<Btf>, release: &str) -> Self {
        let mut modules: HashMap<&str, Option<Arc<Btf>>> = HashMap::new();
        let mut module_btf = |m: &'static str| -> Option<Arc<Btf>> {
            modules
                .entry(m)
                .or_insert_with(|| {
                    let path = Path::new("/sys/kernel/btf").join(m);
                    path.exists()
                        .then(|| crate::kernel::btf_file::read_split(&path, vmlinux.clone()).ok())
                        .flatten()
                        .map(Arc::new)
                })
                .clone()
        };
        let mut p = NfProbes::zeroed();
        // `hook` is an unsigned int on 5.10 and a u8 since v5.16
        // (include/linux/netfilter.h): the programs read its first byte,
        // which on little-endian machines is the value either way.
        p.state_hook = offset(vmlinux, "nf_hook_state", "hook", 1)
            .or_else(|_| offset(vmlinux, "nf_hook_state", "hook", 4))
            .unwrap_or(ABSENT);
        p.state_pf = offset(vmlinux, "nf_hook_state", "pf", 1).unwrap_or(ABSENT);
        let version = release_version(release);
        let mut funcs = Vec::new();
        for f in &FUNCS {
            let found = match vmlinux.find(f.name, Kind::Func) {
                Some(id) => Some(Found::Vmlinux(id)),
                None => module_btf(f.module)
                    .and_then(|b| Some(Found::Module(b.clone(), b.find(f.name, Kind::Func)?))),
            };
            let facts = match &found {
                Some(found) => {
                    let (btf, id, source): (&Btf, u32, String) = match found {
                        Found::Vmlinux(id) => (vmlinux, *id, "vmlinux BTF".into()),
                        Found::Module(b, id) => {
                            (b, *id, format!("/sys/kernel/btf/{} (module BTF)", f.module))
                        }
                    };
                    let types: Vec<String> = btf
                        .params(id)
                        .unwrap_or_default()
                        .iter()
                        .map(|&t| btf.type_name(t))
                        .collect();
                    let args = args_from_types(&types);
                    fill_offsets(&mut p, f, btf);
                    let fexit = match found {
                        Found::Module(..) => Err(format!(
                            "{} is in module {}: fexit on a module function needs the \
                             module's BTF object at load (attach_btf_obj_fd), which \
                             kdrop's aya 0.14 does not pass",
                            f.name, f.module
                        )),
                        Found::Vmlinux(_) if types.len() != f.nargs => Err(format!(
                            "{} has {} arguments here, the fexit program reads {}",
                            f.name,
                            types.len(),
                            f.nargs
                        )),
                        Found::Vmlinux(_) => Ok(()),
                    };
                    check_args(f, &args).map(|()| {
                        p.args[usize::from(f.id)] = args;
                        FnFacts { source, fexit }
                    })
                }
                None if !Path::new("/sys/module").join(f.module).exists() => {
                    Err(format!("{} is not loaded (nothing uses it yet)", f.module))
                }
                None => args_from_signature(f.id, version)
                    .map_err(|e| format!("no BTF for {}: {e}", f.name))
                    .and_then(|args| {
                        check_args(f, &args)?;
                        if f.id == NF_FN_IPT_DO_TABLE {
                            // struct xt_table may still be in vmlinux BTF.
                            fill_offsets(&mut p, f, vmlinux);
                        }
                        p.args[usize::from(f.id)] = args;
                        Ok(FnFacts {
                            source: format!(
                                "its signature (no BTF for {}: module {} has none)",
                                f.name, f.module
                            ),
                            fexit: Err(format!("no BTF for {}", f.name)),
                        })
                    }),
            };
            if let Some(missing) = needs_offsets(f, &p).err().filter(|_| facts.is_ok()) {
                funcs.push(Err(missing));
                p.args[usize::from(f.id)] = NfFnArgs::zeroed();
                continue;
            }
            funcs.push(facts);
        }
        NfSetup { probes: p, funcs }
    }
}

/// Struct offsets from the BTF that describes the function's own types
/// (include/net/netfilter/nf_tables.h: nft_pktinfo, nft_chain, nft_table;
/// include/linux/netfilter/x_tables.h: xt_table; as of v6.18, and 5.10's
/// nft_pktinfo with the state under `xt`).
fn fill_offsets(p: &mut NfProbes, f: &NfFunc, btf: &Btf) {
    match f.id {
        NF_FN_NFT_DO_CHAIN => {
            p.pkt_skb = offset(btf, "nft_pktinfo", "skb", 8).unwrap_or(ABSENT);
            p.pkt_state = offset(btf, "nft_pktinfo", "state", 8)
                .or_else(|_| offset(btf, "nft_pktinfo", "xt.state", 8))
                .unwrap_or(ABSENT);
            p.chain_name = offset(btf, "nft_chain", "name", 8).unwrap_or(ABSENT);
            p.chain_table = offset(btf, "nft_chain", "table", 8).unwrap_or(ABSENT);
            p.nft_table_name = offset(btf, "nft_table", "name", 8).unwrap_or(ABSENT);
        }
        NF_FN_IPT_DO_TABLE => {
            p.xt_table_name = offset(btf, "xt_table", "name", 32).unwrap_or(ABSENT);
        }
        _ => {}
    }
}

/// The offsets without which a function's record would be empty.
fn needs_offsets(f: &NfFunc, p: &NfProbes) -> Result<(), String> {
    let need: &[(&str, u32)] = match f.id {
        NF_FN_NFT_DO_CHAIN => &[
            ("nft_pktinfo.skb", p.pkt_skb),
            ("nft_pktinfo.state", p.pkt_state),
        ],
        _ => &[],
    };
    for (what, off) in need {
        if *off == ABSENT {
            return Err(format!("{}: {what} not found in BTF", f.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_by_type() {
        // v6.x ipt_do_table(void *priv, struct sk_buff *skb, const struct nf_hook_state *state)
        let a = args_from_types(&types(&[
            "void *",
            "struct sk_buff *",
            "struct nf_hook_state *",
        ]));
        assert_eq!((a.priv_, a.skb, a.state, a.pkt), (0, 1, 2, ABSENT));
        // v5.10 ipt_do_table(skb, state, struct xt_table *table)
        let a = args_from_types(&types(&[
            "struct sk_buff *",
            "struct nf_hook_state *",
            "struct xt_table *",
        ]));
        assert_eq!((a.skb, a.state, a.priv_), (0, 1, 2));
        let a = args_from_types(&types(&["struct nft_pktinfo *", "void *"]));
        assert_eq!((a.pkt, a.priv_, a.skb), (0, 1, ABSENT));
        assert!(check_args(&FUNCS[2], &a).is_ok());
        assert!(check_args(&FUNCS[0], &a).is_err());
    }

    #[test]
    fn signatures_without_btf() {
        let old = args_from_signature(NF_FN_IPT_DO_TABLE, Some((5, 10))).unwrap();
        assert_eq!((old.skb, old.state, old.priv_), (0, 1, 2));
        let new = args_from_signature(NF_FN_IPT_DO_TABLE, Some((6, 1))).unwrap();
        assert_eq!((new.priv_, new.skb, new.state), (0, 1, 2));
        assert!(args_from_signature(NF_FN_IPT_DO_TABLE, None).is_err());
        assert!(args_from_signature(NF_FN_NFT_DO_CHAIN, Some((5, 10))).is_err());
        let ct = args_from_signature(NF_FN_CONNTRACK_IN, Some((5, 10))).unwrap();
        assert!(check_args(&FUNCS[0], &ct).is_ok());
    }

    #[test]
    fn versions() {
        assert_eq!(release_version("5.10.0-32-amd64"), Some((5, 10)));
        assert_eq!(release_version("6.18.44-fc-v595\n"), Some((6, 18)));
        assert_eq!(release_version("6"), None);
    }

    #[test]
    fn table_matches_ids() {
        for (i, f) in FUNCS.iter().enumerate() {
            assert_eq!(usize::from(f.id), i, "{}", f.name);
        }
    }
}
