//! `kdrop check`: what this kernel allows, and what kdrop would do with it.
use std::process::ExitCode;

use anyhow::Result;
use kdrop_common::{Evidence, Filter, MonitorConfig, ABSENT};

use crate::{
    output::Lines,
    probes::{self, outcome_text, KernelSetup},
};

/// One line of the report; nothing once stdout is closed (`kdrop check |
/// head`): the check goes on to its verdict, its exit code.
macro_rules! say {
    ($out:ident, $($arg:tt)*) => {
        $out.line(format_args!($($arg)*))
    };
}

pub fn run() -> Result<ExitCode> {
    let mut out = Lines::new(std::io::stdout().lock());
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    say!(out, "kernel      {}", release.trim());
    let warnings = probes::check_privileges()?;
    say!(
        out,
        "privileges  {}",
        if warnings.is_empty() {
            "ok".to_string()
        } else {
            warnings.join("; ")
        }
    );
    let setup = KernelSetup::read()?;
    let size = std::fs::metadata(&setup.btf_path).map_or(0, |m| m.len());
    // enum skb_drop_reason came with 5.17 (Debian 11's 5.10 has none).
    let reasons = if setup.reasons.is_empty() {
        "no enum skb_drop_reason (drop reasons need 5.17+)".to_string()
    } else {
        format!(
            "{} drop reasons in enum skb_drop_reason",
            setup.reasons.len()
        )
    };
    say!(
        out,
        "btf         {} ({:.1} MiB), {reasons}",
        setup.btf_path.display(),
        size as f64 / (1 << 20) as f64,
    );
    match &setup.kfree_skb_args {
        Ok(a) if a.reason == ABSENT => {
            say!(
                out,
                "kfree_skb   no reason argument: drops are reported without a kernel reason"
            )
        }
        Ok(a) => say!(
            out,
            "kfree_skb   TP_PROTO args: skb #{}, location #{}, reason #{}",
            a.skb,
            a.location,
            a.reason
        ),
        Err(e) => say!(out, "kfree_skb   {e}"),
    }
    if let Err(e) = &setup.kfree_skb_fields {
        say!(out, "tracefs     {e}");
    }
    match &setup.conntrack {
        Ok(from) => {
            say!(
                out,
                "conntrack   struct nf_conn from {from}: entries are read off packets"
            )
        }
        Err(e) => say!(
            out,
            "conntrack   {e}: packets are reported without their entry"
        ),
    }
    let mut ok = true;
    let mut nf_rungs = Vec::new();
    let config = probes::Config {
        filter: &Filter::zeroed(),
        monitor: &MonitorConfig::zeroed(),
        evidence: &Evidence::zeroed(),
        ring_kib: 64,
        all_rungs: true,
    };
    match probes::load(&setup, &config) {
        Ok(p) => {
            for f in &crate::probes::nf::FUNCS {
                let r = p.reports.iter().find(|r| r.point == f.point);
                nf_rungs.push((f.name, r.and_then(|r| r.chosen()).map(|c| c.to_string())));
            }
            for r in &p.reports {
                let chosen = r.chosen().map_or("none".into(), |c| c.to_string());
                let when = match r.demand {
                    None => String::new(),
                    Some(d) => format!(", armed on demand ({d})"),
                };
                say!(
                    out,
                    "probe       {} ({}{when}): using {chosen}",
                    r.point,
                    r.what
                );
                for (rung, o) in &r.rungs {
                    say!(
                        out,
                        "              {:<10} {}",
                        rung.to_string(),
                        outcome_text(o)
                    );
                }
            }
        }
        Err(e) => {
            ok = false;
            say!(out, "probe       skb:kfree_skb (drop path): {e:#}");
        }
    }
    // NETFILTER_DROP attribution: methods in the order kdrop tries them.
    for (i, m) in crate::context::netfilter::describe_methods(&nf_rungs)
        .iter()
        .enumerate()
    {
        let head = if i == 0 { "netfilter" } else { "" };
        say!(out, "{head:<12}{m}");
    }
    say!(
        out,
        "verdict     {}",
        if ok {
            "kdrop can trace drops here"
        } else {
            "kdrop cannot work here"
        }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
