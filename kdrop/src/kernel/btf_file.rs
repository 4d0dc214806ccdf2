//! BTF read from the kernel's files (/sys/kernel/btf/vmlinux and its
//! modules, or KDROP_BTF), parsed by the core.
use std::{fs, path::Path, sync::Arc};

use anyhow::{Context as _, Result};

use super::btf::Btf;

/// vmlinux's BTF (or a whole BTF file).
pub fn read(path: &Path) -> Result<Btf> {
    let data = fs::read(path).with_context(|| format!("reading BTF {}", path.display()))?;
    Btf::parse(&data, None).with_context(|| format!("parsing BTF {}", path.display()))
}

/// Module BTF from /sys/kernel/btf/<module>, on top of vmlinux's.
pub fn read_split(path: &Path, base: Arc<Btf>) -> Result<Btf> {
    let data = fs::read(path).with_context(|| format!("reading BTF {}", path.display()))?;
    Btf::parse(&data, Some(base)).with_context(|| format!("parsing BTF {}", path.display()))
}
