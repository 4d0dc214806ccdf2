//! Walking a point's ladder: load and attach each rung until one holds,
//! keeping why the others were refused.
use std::path::Path;

use anyhow::{Context as _, Result};
use aya::{
    programs::{
        fexit::FExitLinkId, kprobe::KProbeLinkId, raw_trace_point::RawTracePointLinkId,
        tp_btf::BtfTracePointLinkId, trace_point::TracePointLinkId, BtfTracePoint, FExit, KProbe,
        RawTracePoint, TracePoint,
    },
    Btf as AyaBtf, Ebpf,
};

use super::ladder::{Attach, Outcome, Point, ProbeReport, Rung, DROP_PATH};
use crate::kernel::btf::Kind;

/// A rung's program(s) attached: what detaching needs.
pub enum Link {
    TpBtf(&'static str, BtfTracePointLinkId),
    RawTp(&'static str, RawTracePointLinkId),
    Tracepoint(&'static str, TracePointLinkId),
    FExit(&'static str, FExitLinkId),
    KRetProbe {
        ret: (&'static str, KProbeLinkId),
        entry: Option<(&'static str, KProbeLinkId)>,
    },
}

/// The point's rungs best first, each loaded and attached until one holds
/// (with `all_rungs`, every one: `kdrop check`). Returns what happened on
/// each, and the chosen rung with its link. An on-demand point's kretprobe
/// is only loaded, and attached when armed: attached to see that it holds
/// and detached at once, it patched a function every forwarded packet
/// crosses (nft_do_chain, ipt_do_table, fib_validate_source) at every
/// start. In the 6.1 and 6.12 TCG guests that patching under forwarded
/// traffic panics the kernel (as fexit's does: maybe QEMU's, maybe the
/// kernels'; branch repro/kretprobe-teardown-6.1), and a start now does
/// none of it.
pub fn attach_ladder(
    ebpf: &mut Ebpf,
    btf: &AyaBtf,
    point: &Point,
    all_rungs: bool,
    forced: Option<Rung>,
) -> (ProbeReport, Option<(Attach, Option<Link>)>) {
    let mut report = ProbeReport {
        point: point.name,
        what: point.what,
        demand: point.demand,
        rungs: Vec::new(),
    };
    let mut chosen = None;
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
        let defer =
            point.demand.is_some() && !all_rungs && matches!(attach, Attach::KRetProbe { .. });
        let result = match ready {
            Err(why) => Err(anyhow::anyhow!("{why}")),
            Ok(()) if defer => load_one(ebpf, btf, attach).map(|()| None),
            Ok(()) => {
                load_one(ebpf, btf, attach).and_then(|()| attach_loaded(ebpf, attach).map(Some))
            }
        };
        let outcome = match result {
            Ok(link) => {
                let deferred = link.is_none();
                if chosen.is_none() {
                    chosen = Some((*attach, link));
                }
                if deferred {
                    Outcome::Deferred
                } else {
                    Outcome::Attached
                }
            }
            Err(e) => Outcome::Refused(short_error(&e)),
        };
        report.rungs.push((rung, outcome));
    }
    (report, chosen)
}

/// The type `load_one` has aya look up by name in the BTF it is given, and
/// its kind: tp_btf's typedef `btf_trace_<tp>`
/// (aya-0.14.0/src/programs/tp_btf.rs:66-67), fexit's function
/// (aya-0.14.0/src/programs/fexit.rs:77). Both go through
/// `Btf::id_by_type_name_kind` (aya-obj-0.3.0/src/btf/btf.rs:446), which
/// reads names, kinds and ids only: a skeleton BTF with these types at the
/// kernel's ids serves (`load::attach_btf`). The other rungs read no BTF.
pub fn btf_lookup(attach: &Attach) -> Option<(String, Kind)> {
    match *attach {
        Attach::TpBtf { tp, .. } => Some((format!("btf_trace_{tp}"), Kind::Typedef)),
        Attach::FExit { func, .. } => Some((func.to_string(), Kind::Func)),
        Attach::RawTp { .. } | Attach::Tracepoint { .. } | Attach::KRetProbe { .. } => None,
    }
}

/// Loads (verifies) a rung's program(s) once: tp_btf and fexit programs
/// may have been loaded already (`verify::verify_ahead`).
fn load_one(ebpf: &mut Ebpf, btf: &AyaBtf, attach: &Attach) -> Result<()> {
    match *attach {
        Attach::TpBtf { prog, tp } => {
            let p = program::<BtfTracePoint>(ebpf, prog)?;
            if p.fd().is_err() {
                p.load(tp, btf)?;
            }
        }
        Attach::RawTp { prog, .. } => program::<RawTracePoint>(ebpf, prog)?.load()?,
        Attach::Tracepoint { prog, .. } => program::<TracePoint>(ebpf, prog)?.load()?,
        Attach::FExit { prog, func } => {
            let p = program::<FExit>(ebpf, prog)?;
            if p.fd().is_err() {
                p.load(func, btf)?;
            }
        }
        Attach::KRetProbe { prog, entry, .. } => {
            // Before loading: a kernel without kprobes (this CI host) would
            // verify the program only to refuse the attach, and keep it.
            let pmu = Path::new("/sys/bus/event_source/devices/kprobe/type");
            if !pmu.exists() {
                anyhow::bail!("no kprobes in this kernel ({} is missing)", pmu.display());
            }
            program::<KProbe>(ebpf, prog)?.load()?;
            if let Some(entry) = entry {
                program::<KProbe>(ebpf, entry)?
                    .load()
                    .with_context(|| format!("kprobe {entry}"))?;
            }
        }
    }
    Ok(())
}

/// Attaches a rung whose program(s) are loaded: at start, and each time an
/// on-demand point is armed.
pub fn attach_loaded(ebpf: &mut Ebpf, attach: &Attach) -> Result<Link> {
    Ok(match *attach {
        Attach::TpBtf { prog, .. } => {
            Link::TpBtf(prog, program::<BtfTracePoint>(ebpf, prog)?.attach()?)
        }
        Attach::RawTp { prog, tp } => {
            Link::RawTp(prog, program::<RawTracePoint>(ebpf, prog)?.attach(tp)?)
        }
        Attach::Tracepoint {
            prog,
            category,
            name,
        } => Link::Tracepoint(
            prog,
            program::<TracePoint>(ebpf, prog)?.attach(category, name)?,
        ),
        Attach::FExit { prog, .. } => Link::FExit(prog, program::<FExit>(ebpf, prog)?.attach()?),
        Attach::KRetProbe { prog, func, entry } => {
            // The kretprobe first: a call entered between the two attaches
            // must not leave saved arguments that nothing pops.
            let ret = program::<KProbe>(ebpf, prog)?.attach(func, 0)?;
            let entry = match entry {
                None => None,
                Some(entry) => {
                    match program::<KProbe>(ebpf, entry).and_then(|k| Ok(k.attach(func, 0)?)) {
                        Ok(id) => Some((entry, id)),
                        Err(e) => {
                            let _ = program::<KProbe>(ebpf, prog)?.detach(ret);
                            return Err(e.context(format!("kprobe {entry}")));
                        }
                    }
                }
            };
            Link::KRetProbe {
                ret: (prog, ret),
                entry,
            }
        }
    })
}

/// Detaches what `attach_loaded` attached; the program stays loaded.
pub fn detach(ebpf: &mut Ebpf, link: Link) -> Result<()> {
    match link {
        Link::TpBtf(prog, id) => program::<BtfTracePoint>(ebpf, prog)?.detach(id)?,
        Link::RawTp(prog, id) => program::<RawTracePoint>(ebpf, prog)?.detach(id)?,
        Link::Tracepoint(prog, id) => program::<TracePoint>(ebpf, prog)?.detach(id)?,
        Link::FExit(prog, id) => program::<FExit>(ebpf, prog)?.detach(id)?,
        Link::KRetProbe { ret, entry } => {
            // The entry kprobe first, the mirror of attaching.
            if let Some((prog, id)) = entry {
                program::<KProbe>(ebpf, prog)?.detach(id)?;
            }
            program::<KProbe>(ebpf, ret.0)?.detach(ret.1)?;
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
