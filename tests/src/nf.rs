//! Netfilter in the labs: which iptables a test drives, and br_netfilter
//! for the bridge labs.
use std::sync::Mutex;

use crate::{ns_name, Ns};

/// The iptables flavour a lab's rules are written with.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Legacy,
    Nft,
}

impl Backend {
    /// `iptables-legacy`, `ip6tables-nft`, ...
    pub fn tool(self, v6: bool) -> String {
        let fam = if v6 { "ip6tables" } else { "iptables" };
        match self {
            Backend::Legacy => format!("{fam}-legacy"),
            Backend::Nft => format!("{fam}-nft"),
        }
    }

    /// The `backend` kdrop reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Legacy => "iptables-legacy",
            Backend::Nft => "iptables-nft",
        }
    }

    /// kdrop's evidence line for the rule-counter method.
    pub fn counters_method(self, v6: bool) -> String {
        format!("rule counters ({}-save -c)", self.tool(v6))
    }

    /// A letter for namespace names.
    pub fn tag(self) -> &'static str {
        match self {
            Backend::Legacy => "l",
            Backend::Nft => "n",
        }
    }
}

/// `iptables ARGS` (split on spaces) of backend `b` in `ns`.
pub fn ipt(ns: &Ns, b: Backend, v6: bool, args: &str) {
    let args: Vec<&str> = args.split_whitespace().collect();
    ns.exec(&b.tool(v6), &args)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Plain `iptables ARGS` (split on whitespace) in `ns`: a lab's own rules,
/// with whichever backend `iptables` is here.
pub fn iptables(ns: &Ns, args: &str) {
    let args: Vec<&str> = args.split_whitespace().collect();
    ns.exec("iptables", &args)
        .unwrap_or_else(|e| panic!("iptables {}: {e:#}", args.join(" ")));
}

/// A ruleset loaded with `nft -f` from a file removed afterwards (`nft -f
/// -` would need a pipe).
pub fn nft(ns: &Ns, name: &str, text: &str) {
    let path = std::env::temp_dir().join(format!("{}.nft", ns_name(name)));
    std::fs::write(&path, text).unwrap();
    let r = ns.exec("nft", &["-f", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    r.unwrap_or_else(|e| panic!("{e:#}"));
}

/// br_netfilter must be there for bridged packets to meet iptables; loaded
/// here if missing, unloaded again after. The bridge tests of one process
/// take turns so that one never unloads it under another (test binaries
/// run one after the other).
pub struct BrNetfilter {
    loaded_here: bool,
    _turn: std::sync::MutexGuard<'static, ()>,
}

static BRIDGE_TURN: Mutex<()> = Mutex::new(());

impl BrNetfilter {
    pub fn ensure() -> Self {
        let turn = BRIDGE_TURN.lock().unwrap_or_else(|e| e.into_inner());
        let present = || std::path::Path::new("/proc/sys/net/bridge").exists();
        let mut loaded_here = false;
        if !present() {
            let out = std::process::Command::new("modprobe")
                .arg("br_netfilter")
                .output();
            loaded_here = out.as_ref().is_ok_and(|o| o.status.success());
            assert!(
                present(),
                "br_netfilter is neither built in nor loadable: {out:?}"
            );
        }
        BrNetfilter {
            loaded_here,
            _turn: turn,
        }
    }
}

impl Drop for BrNetfilter {
    fn drop(&mut self) {
        if self.loaded_here {
            let _ = std::process::Command::new("modprobe")
                .args(["-r", "br_netfilter"])
                .status();
        }
    }
}
