//! `kdrop check`: what this kernel allows, and what kdrop would do with it.
use std::process::ExitCode;

use anyhow::Result;
use kdrop_common::{Filter, ABSENT};

use crate::probes::{self, outcome_text, KernelSetup};

pub fn run() -> Result<ExitCode> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("kernel      {}", release.trim());
    let warnings = probes::check_privileges()?;
    println!(
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
    println!(
        "btf         {} ({:.1} MiB), {reasons}",
        setup.btf_path.display(),
        size as f64 / (1 << 20) as f64,
    );
    match &setup.kfree_skb_args {
        Ok(a) if a.reason == ABSENT => {
            println!("kfree_skb   no reason argument: drops are reported without a kernel reason")
        }
        Ok(a) => println!(
            "kfree_skb   TP_PROTO args: skb #{}, location #{}, reason #{}",
            a.skb, a.location, a.reason
        ),
        Err(e) => println!("kfree_skb   {e}"),
    }
    if let Err(e) = &setup.kfree_skb_fields {
        println!("tracefs     {e}");
    }
    match &setup.conntrack {
        Ok(from) => {
            println!("conntrack   struct nf_conn from {from}: entries are read off packets")
        }
        Err(e) => println!("conntrack   {e}: packets are reported without their entry"),
    }
    let mut ok = true;
    let mut nf_rungs = Vec::new();
    match probes::load(&setup, &Filter::zeroed(), 64, true) {
        Ok(p) => {
            for f in &crate::probes::nf::FUNCS {
                let r = p.reports.iter().find(|r| r.point == f.point);
                nf_rungs.push((f.name, r.and_then(|r| r.chosen()).map(|c| c.to_string())));
            }
            for r in &p.reports {
                let chosen = r.chosen().map_or("none".into(), |c| c.to_string());
                println!("probe       {} ({}): using {chosen}", r.point, r.what);
                for (rung, o) in &r.rungs {
                    println!("              {:<10} {}", rung.to_string(), outcome_text(o));
                }
            }
        }
        Err(e) => {
            ok = false;
            println!("probe       skb:kfree_skb (drop path): {e:#}");
        }
    }
    // NETFILTER_DROP attribution: methods in the order kdrop tries them.
    for (i, m) in crate::context::netfilter::describe_methods(&nf_rungs)
        .iter()
        .enumerate()
    {
        let head = if i == 0 { "netfilter" } else { "" };
        println!("{head:<12}{m}");
    }
    println!(
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
