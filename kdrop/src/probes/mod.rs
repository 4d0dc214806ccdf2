//! kdrop's kernel side from userspace: what the running kernel offers
//! (setup), the probe points and their ladders (ladder), loading and
//! attaching (load, attach), the maps (maps), privileges.
pub mod attach;
pub mod ladder;
pub mod load;
pub mod maps;
pub mod nf;
pub mod privileges;
pub mod setup;

use aya::Ebpf;

pub use self::{
    ladder::{outcome_text, Outcome, ProbeReport, Rung},
    load::{load, load_with},
    privileges::check_privileges,
    setup::{btf_path, KernelSetup},
};

/// Loaded programs and maps. Dropping it detaches and unloads everything.
pub struct Probes {
    pub ebpf: Ebpf,
    pub reports: Vec<ProbeReport>,
}

impl Probes {
    /// `fib_validate_source (return), the source validation result: fexit
    /// refused: ...; kretprobe refused: ...` for each point that did not attach.
    pub fn missing(&self) -> Vec<String> {
        self.reports
            .iter()
            .filter(|r| r.chosen().is_none())
            .map(|r| {
                let why: Vec<String> = r
                    .rungs
                    .iter()
                    .map(|(rung, o)| format!("{rung} {}", outcome_text(o)))
                    .collect();
                format!("{} ({}): {}", r.point, r.what, why.join("; "))
            })
            .collect()
    }

    /// `skb:kfree_skb via tp_btf, ...`: the points that attached.
    pub fn describe(&self) -> String {
        self.reports
            .iter()
            .filter_map(|r| Some(format!("{} via {}", r.point, r.chosen()?)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
