//! Everything read from the running kernel before loading: BTF, struct
//! offsets, tracepoint argument positions, drop reasons, conntrack's layout,
//! and which netfilter functions can be followed.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result};
use kdrop_common::{FibLookupArgs, KfreeSkbArgs, Offsets};

use super::{loader::EarlyLoader, nf::NfSetup};
use crate::{
    kernel::{
        btf::{Btf, Kind},
        facts, tracefs,
    },
    UserError,
};

/// Where kernel BTF comes from; `KDROP_BTF` points elsewhere (kernels without
/// /sys/kernel/btf, e.g. with a BTFHub file).
pub fn btf_path() -> PathBuf {
    std::env::var_os("KDROP_BTF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/kernel/btf/vmlinux"))
}

/// Everything read from the kernel before loading.
pub struct KernelSetup {
    pub btf_path: PathBuf,
    pub btf: Arc<Btf>,
    pub offsets: Offsets,
    pub reasons: facts::Reasons,
    pub kfree_skb_args: Result<KfreeSkbArgs, String>,
    pub kfree_skb_fields: Result<KfreeSkbArgs, String>,
    pub fib_lookup_args: Result<FibLookupArgs, String>,
    /// Where struct nf_conn came from, or why conntrack cannot be read.
    pub conntrack: Result<String, String>,
    pub ct_names: facts::CtNames,
    pub net_dev_queue: Result<(), String>,
    /// fexit needs the function in BTF and a trampoline for all its
    /// arguments (6 on 6.1, more on newer kernels: the load says).
    pub fib_validate_source: Result<(), String>,
    /// The netfilter functions whose verdicts kdrop records.
    pub nf: NfSetup,
    /// Where the socket tracepoints (retransmissions, connects ended in
    /// SYN-SENT) pass the socket, and whether each can be used.
    pub sockets: facts::SocketPoints,
    /// aya's loader, built while the rest is read.
    pub loader: EarlyLoader,
}

impl KernelSetup {
    pub fn read() -> Result<Self> {
        let btf_path = btf_path();
        if !btf_path.exists() {
            return Err(UserError(format!(
                "no kernel BTF at {}: kdrop needs a kernel built with CONFIG_DEBUG_INFO_BTF=y, \
                 or KDROP_BTF=<file> pointing at this kernel's BTF",
                btf_path.display()
            ))
            .into());
        }
        let loader = EarlyLoader::start();
        let btf = Arc::new(crate::kernel::btf_file::read(&btf_path)?);
        let mut offsets =
            facts::offsets(&btf).context("resolving kernel struct offsets from BTF")?;
        let conntrack = conntrack_offsets(&mut offsets, &btf);
        let ct_names = facts::CtNames::from_btf(&btf);
        let reasons = facts::Reasons::from_btf(&btf);
        let kfree_skb_args = facts::kfree_skb_args(&btf, &reasons).map_err(|e| format!("{e:#}"));
        let kfree_skb_fields = tracefs::kfree_skb_fields(&reasons).map_err(|e| format!("{e:#}"));
        let fib_lookup_args = facts::fib_lookup_args(&btf, &offsets).map_err(|e| format!("{e:#}"));
        let net_dev_queue = facts::net_dev_queue_args(&btf).map_err(|e| format!("{e:#}"));
        let fib_validate_source = btf
            .find("fib_validate_source", Kind::Func)
            .map(|_| ())
            .ok_or_else(|| "fib_validate_source is not in BTF (inlined or renamed?)".to_string());
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let nf = NfSetup::read(&btf, &release);
        let sockets = facts::socket_points(&btf, &offsets);
        Ok(Self {
            btf_path,
            btf,
            offsets,
            reasons,
            kfree_skb_args,
            kfree_skb_fields,
            fib_lookup_args,
            conntrack,
            ct_names,
            net_dev_queue,
            fib_validate_source,
            nf,
            sockets,
            loader,
        })
    }
}

/// nf_conn offsets from vmlinux, or from the nf_conntrack module's BTF when
/// conntrack is a module (Debian kernels).
fn conntrack_offsets(offsets: &mut Offsets, vmlinux: &Arc<Btf>) -> Result<String, String> {
    if vmlinux.find("nf_conn", Kind::Struct).is_some() {
        return facts::conntrack_offsets(offsets, vmlinux)
            .map(|()| "vmlinux BTF".into())
            .map_err(|e| format!("{e:#}"));
    }
    let module = Path::new("/sys/kernel/btf/nf_conntrack");
    if !module.exists() {
        return Err("nf_conntrack is not loaded (no struct nf_conn in BTF)".into());
    }
    let btf = crate::kernel::btf_file::read_split(module, vmlinux.clone())
        .map_err(|e| format!("{e:#}"))?;
    facts::conntrack_offsets(offsets, &btf)
        .map(|()| format!("{} (module BTF)", module.display()))
        .map_err(|e| format!("{e:#}"))
}
