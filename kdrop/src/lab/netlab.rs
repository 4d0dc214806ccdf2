//! Throwaway network namespaces for labs and tests: created with iproute2,
//! removed when the guard drops (also on error and panic).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::context::netns::{in_netns, inode_of, NETNS_DIR};

/// Runs `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    run("ip", args)
}

/// Runs a command to completion, failing with its stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A named network namespace under /run/netns, deleted on drop.
#[derive(Debug)]
pub struct Ns {
    pub name: String,
}

impl Ns {
    pub fn new(name: &str) -> Result<Self> {
        // A leftover from a killed run would make `add` fail.
        let _ = ip(&["netns", "del", name]);
        ip(&["netns", "add", name])?;
        let ns = Ns {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        // New namespaces may copy the host's conf/all and conf/default
        // (net.core.devconf_inherit_init_net): pin what labs depend on.
        for (k, v) in [
            ("net/ipv4/conf/all/rp_filter", "0"),
            ("net/ipv4/conf/default/rp_filter", "0"),
            ("net/ipv4/conf/all/accept_local", "0"),
            ("net/ipv4/conf/all/route_localnet", "0"),
            ("net/ipv4/conf/all/src_valid_mark", "0"),
        ] {
            ns.sysctl(k, v)?;
        }
        Ok(ns)
    }

    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    pub fn inode(&self) -> Result<u32> {
        inode_of(&self.path())
    }

    /// `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A command inside the namespace (`ip netns exec`).
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Result<()> {
        let mut all = vec!["netns", "exec", &self.name, cmd];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Writes /proc/sys/<key> as seen from inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = Path::new("/proc/sys").join(key);
        let v = value.to_string();
        in_netns(&self.path(), move || fs::write(&path, v))?
            .with_context(|| format!("sysctl {key}={value} in {}", self.name))
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("kdrop: cleaning up netns {}: {e:#}", self.name);
        }
    }
}

/// A veth pair with one end in each namespace, MACs given so that tests can
/// pin neighbour entries.
pub fn veth(a: &Ns, a_if: &str, a_mac: &str, b: &Ns, b_if: &str, b_mac: &str) -> Result<()> {
    ip(&[
        "link", "add", a_if, "address", a_mac, "netns", &a.name, "type", "veth", "peer", "name",
        b_if, "address", b_mac, "netns", &b.name,
    ])?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])
}
