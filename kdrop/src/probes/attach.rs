//! Walking a point's ladder: load and attach each rung until one holds,
//! keeping why the others were refused.
use std::path::Path;

use anyhow::{Context as _, Result};
use aya::{
    programs::{BtfTracePoint, FExit, KProbe, RawTracePoint, TracePoint},
    Btf as AyaBtf, Ebpf,
};

use super::ladder::{Attach, Outcome, Point, ProbeReport, Rung, DROP_PATH};

pub fn attach_ladder(
    ebpf: &mut Ebpf,
    btf: &AyaBtf,
    point: &Point,
    all_rungs: bool,
    forced: Option<Rung>,
) -> ProbeReport {
    let mut report = ProbeReport {
        point: point.name,
        what: point.what,
        rungs: Vec::new(),
    };
    for (attach, ready) in &point.rungs {
        let rung = attach.rung();
        if let Some(f) = forced.filter(|f| point.name == DROP_PATH && *f != rung) {
            report
                .rungs
                .push((rung, Outcome::Refused(format!("KDROP_RUNG={f} set"))));
            continue;
        }
        if report.chosen().is_some() && !all_rungs {
            report.rungs.push((rung, Outcome::NotTried));
            continue;
        }
        let result = match ready {
            Err(why) => Err(anyhow::anyhow!("{why}")),
            Ok(()) => attach_one(ebpf, btf, attach),
        };
        let outcome = match result {
            Ok(()) => Outcome::Attached,
            Err(e) => Outcome::Refused(short_error(&e)),
        };
        report.rungs.push((rung, outcome));
    }
    report
}

fn attach_one(ebpf: &mut Ebpf, btf: &AyaBtf, attach: &Attach) -> Result<()> {
    match *attach {
        Attach::TpBtf { prog, tp } => {
            let p: &mut BtfTracePoint = program(ebpf, prog)?;
            p.load(tp, btf)?;
            p.attach()?;
        }
        Attach::RawTp { prog, tp } => {
            let p: &mut RawTracePoint = program(ebpf, prog)?;
            p.load()?;
            p.attach(tp)?;
        }
        Attach::Tracepoint {
            prog,
            category,
            name,
        } => {
            let p: &mut TracePoint = program(ebpf, prog)?;
            p.load()?;
            p.attach(category, name)?;
        }
        Attach::FExit { prog, func } => {
            let p: &mut FExit = program(ebpf, prog)?;
            p.load(func, btf)?;
            p.attach()?;
        }
        Attach::KRetProbe { prog, func, entry } => {
            // Before loading: a kernel without kprobes (this CI host) would
            // verify the program only to refuse the attach, and keep it.
            let pmu = Path::new("/sys/bus/event_source/devices/kprobe/type");
            if !pmu.exists() {
                anyhow::bail!("no kprobes in this kernel ({} is missing)", pmu.display());
            }
            // The kretprobe first: a call entered between the two attaches
            // must not leave saved arguments that nothing pops.
            let p: &mut KProbe = program(ebpf, prog)?;
            p.load()?;
            let ret = p.attach(func, 0)?;
            if let Some(entry) = entry {
                let attached = program::<KProbe>(ebpf, entry).and_then(|k| {
                    k.load()?;
                    k.attach(func, 0)?;
                    Ok(())
                });
                if let Err(e) = attached {
                    let _ = program::<KProbe>(ebpf, prog)?.detach(ret);
                    return Err(e.context(format!("kprobe {entry}")));
                }
            }
        }
    }
    Ok(())
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))?;
    Ok(p.try_into()?)
}

/// First line of an error chain: verifier logs can run to thousands of lines.
/// A verifier log's last line says what it refused (its first lines are
/// often notes), so that one is kept too.
fn short_error(e: &anyhow::Error) -> String {
    let s = format!("{e:#}");
    let mut lines = s.lines().filter(|l| !l.trim().is_empty());
    let first: String = lines.next().unwrap_or("").chars().take(240).collect();
    if s.lines().count() > 1 {
        log::debug!("{s}");
    }
    // The log ends with the instruction count; the refusal is just before.
    let last: Vec<&str> = lines
        .filter(|l| {
            !["processed ", "verification time", "stack depth", ": "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    match last.last() {
        Some(l) if s.contains("Verifier output") => {
            format!("{first} ... {}", l.chars().take(160).collect::<String>())
        }
        _ => first,
    }
}
