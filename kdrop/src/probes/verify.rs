//! The programs the ladders try first, verified side by side before the
//! ladders walk: the verifier is most of a start (on 6.18, kfree_skb's
//! program ~40 ms, the route lookup's ~37 ms, the rest ~25 ms, one after
//! another on one core).
use std::sync::Mutex;

use aya::{
    programs::{BtfTracePoint, FExit, Program, ProgramError},
    Btf as AyaBtf, Ebpf,
};

use super::ladder::{Attach, Point, Rung, DROP_PATH};

/// Loads each point's first rung, when it is tp_btf or fexit and ready, on
/// as many threads as there are CPUs. A refusal is left to the ladder: it
/// loads again and says why (`attach::load_one` skips what is loaded).
pub fn verify_ahead(ebpf: &mut Ebpf, btf: &AyaBtf, points: &[&Point], forced: Option<Rung>) {
    let first: Vec<Attach> = points
        .iter()
        .filter_map(|p| {
            let (attach, ready) = p.rungs.first()?;
            let skipped = forced.is_some_and(|f| p.name == DROP_PATH && f != attach.rung());
            let typed = matches!(attach, Attach::TpBtf { .. } | Attach::FExit { .. });
            (ready.is_ok() && typed && !skipped).then_some(*attach)
        })
        .collect();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(first.len());
    if workers < 2 {
        return;
    }
    let mut progs: Vec<(usize, &mut Program)> = ebpf
        .programs_mut()
        .filter_map(|(name, p)| Some((first.iter().position(|a| a.prog() == name)?, p)))
        .collect();
    // In the ladders' order: the drop path, the largest, first.
    progs.sort_by_key(|(i, _)| *i);
    let queue = Mutex::new(progs.into_iter());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let next = queue.lock().ok().and_then(|mut q| q.next());
                let Some((i, prog)) = next else { break };
                if let Err(e) = load(prog, btf, &first[i]) {
                    log::debug!("{}: left to its ladder: {e}", first[i].prog());
                }
            });
        }
    });
}

fn load(prog: &mut Program, btf: &AyaBtf, attach: &Attach) -> Result<(), ProgramError> {
    match *attach {
        Attach::TpBtf { tp, .. } => <&mut BtfTracePoint>::try_from(prog)?.load(tp, btf),
        Attach::FExit { func, .. } => <&mut FExit>::try_from(prog)?.load(func, btf),
        _ => Ok(()),
    }
}
