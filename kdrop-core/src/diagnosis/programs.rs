//! Drops by programs on the packet's path: a tc filter (TC_INGRESS,
//! TC_EGRESS: `tcf_classify` said TC_ACT_SHOT, freed in
//! `__netif_receive_skb_core` / `sch_handle_egress`, v6.18
//! https://github.com/torvalds/linux/blob/v6.18/net/core/dev.c), an XDP
//! program (XDP: generic XDP's XDP_DROP), a cgroup program
//! (BPF_CGROUP_EGRESS) or a socket filter (SOCKET_FILTER). Names the
//! device, hook, filter and program, and the agent that owns it; a fix only
//! when no agent does (it would put the program back).
use super::fix_kinds::Kind;
use crate::model::cause::Cause;
use crate::model::{
    finding::{Finding, Fix},
    packet::Tuple,
    progs::{Agent, CgroupProgs, HookProgs, ProgInfo, TcFilter, XdpProg},
};

/// Drop reasons a program on the path gives.
pub const REASONS: [&str; 5] = [
    "TC_INGRESS",
    "TC_EGRESS",
    "XDP",
    "BPF_CGROUP_EGRESS",
    "SOCKET_FILTER",
];

/// What diagnosis needs about a drop by a program.
#[derive(Clone, Debug)]
pub struct ProgDrop<'a> {
    pub reason: &'a str,
    /// `kernel drop reason X at LOC`.
    pub kernel: String,
    pub tuple: Tuple,
    /// `SYN`, `ACK`, ... as records print them.
    pub flags: &'a str,
    pub netns: &'a str,
    pub netns_exec: &'a str,
    /// The device's programs on the hook the reason names (None: unread).
    pub hook: Option<&'a HookProgs>,
    /// For BPF_CGROUP_EGRESS: the sending socket's cgroup programs.
    pub cgroup: Option<&'a CgroupProgs>,
}

/// A BPF program as evidence: id, name, tag, pins, agent, holders.
pub fn prog_text(p: &ProgInfo) -> String {
    let mut s = format!(
        "BPF program id {} ({}) name {} tag {}",
        p.id,
        p.prog_type,
        if p.name.is_empty() { "-" } else { &p.name },
        p.tag
    );
    if !p.pinned.is_empty() {
        s += &format!(", pinned at {}", p.pinned.join(", "));
    }
    if let Some(a) = &p.agent {
        s += &format!(", loaded by {} ({})", a.name, a.evidence);
    }
    if !p.holders.is_empty() {
        let h: Vec<String> = p
            .holders
            .iter()
            .map(|h| format!("{} (pid {})", h.comm, h.pid))
            .collect();
        s += &format!(", held open by {}", h.join(", "));
    }
    s
}

/// A tc filter as `tc filter show` prints its head.
pub fn filter_text(f: &TcFilter) -> String {
    let mut s = format!(
        "filter protocol {} pref {} {} chain {} handle {}",
        f.protocol, f.pref, f.kind, f.chain, f.handle
    );
    if let Some(b) = &f.bpf {
        if let Some(n) = &b.name {
            s += &format!(" {n}");
        }
        if b.direct_action {
            s += " direct-action";
        }
        if let Some(id) = b.prog_id {
            s += &format!(" id {id}");
        }
        if let Some(t) = &b.tag {
            s += &format!(" tag {t}");
        }
        if let Some(code) = &b.bytecode {
            s += &format!(" bytecode '{code}'");
        }
    }
    s
}

/// The program of a filter (cls_bpf eBPF), if described.
fn filter_prog<'a>(f: &TcFilter, progs: &'a [ProgInfo]) -> Option<&'a ProgInfo> {
    let id = f.bpf.as_ref()?.prog_id?;
    progs.iter().find(|p| p.id == id)
}

fn xdp_flag(x: &XdpProg) -> &'static str {
    match x.mode.as_str() {
        "generic" => "xdpgeneric",
        "native" => "xdpdrv",
        "offload" => "xdpoffload",
        _ => "xdp",
    }
}

/// The finding for a drop by a program, or None for other reasons.
pub fn explain(d: &ProgDrop) -> Option<Finding> {
    if !REASONS.contains(&d.reason) {
        return None;
    }
    let packet = format!("{} {} -> {}", d.flags, d.tuple.src, d.tuple.dst);
    match (d.reason, d.hook, d.cgroup) {
        ("TC_INGRESS" | "TC_EGRESS", Some(h), _) => Some(tc(d, h, &packet)),
        ("XDP", Some(h), _) => Some(xdp(d, h, &packet)),
        ("BPF_CGROUP_EGRESS", _, Some(c)) if !c.progs.is_empty() => Some(cgroup(d, c, &packet)),
        _ => Some(unnamed(d, &packet)),
    }
}

/// What can be done about the program(s) that dropped it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Remedy<'a> {
    /// An agent owns the program: change the policy there.
    Agent(&'a Agent),
    /// A bpf link holds it: it goes when its holders close it.
    Link(u32),
    /// Nothing holds it but its attachment: detach it.
    Detach,
    /// Several programs ran: which one dropped it is unknown.
    Unknown(usize),
}

/// The cgroup programs' remedy: one program's, or none for several.
fn cgroup_remedy(c: &CgroupProgs) -> Remedy<'_> {
    match c.progs.as_slice() {
        [p] => match (&p.prog.agent, p.link_id) {
            (Some(a), _) => Remedy::Agent(a),
            (None, Some(l)) => Remedy::Link(l),
            (None, None) => Remedy::Detach,
        },
        progs => Remedy::Unknown(progs.len()),
    }
}

fn cgroup(d: &ProgDrop, c: &CgroupProgs, packet: &str) -> Finding {
    let who = c
        .owner
        .as_ref()
        .map(|o| format!("{} (pid {})", o.comm, o.pid))
        .unwrap_or_else(|| "the sending socket".into());
    let mut evidence = vec![
        d.kernel.clone(),
        format!(
            "the socket {} belongs to {who}, in cgroup {}",
            d.tuple.src, c.cgroup
        ),
    ];
    for p in &c.progs {
        evidence.push(format!(
            "cgroup {} on {}{}: {}",
            c.hook,
            p.attached_to,
            p.link_id
                .map(|l| format!(" (bpf link {l})"))
                .unwrap_or_default(),
            prog_text(&p.prog)
        ));
    }
    let names: Vec<String> = c
        .progs
        .iter()
        .map(|p| format!("{} id {} on {}", p.prog.name, p.prog.id, p.attached_to))
        .collect();
    let (fix, fix_notes) = cgroup_repair(c, cgroup_remedy(c));
    Finding {
        cause: Cause::BpfCgroup,
        summary: format!(
            "{packet} dropped by the cgroup {} BPF program of {who}: {}",
            c.hook,
            names.join(", ")
        ),
        evidence,
        fix,
        fix_notes,
        // `effective`: programs attached to a parent cgroup run here too.
        inspect: vec![format!("bpftool cgroup show {} effective", c.cgroup)],
        ..Finding::default()
    }
}

/// The cgroup remedy as commands and notes.
fn cgroup_repair(c: &CgroupProgs, remedy: Remedy) -> (Vec<Fix>, Vec<String>) {
    match (remedy, c.progs.first()) {
        (Remedy::Agent(a), _) => (Vec::new(), vec![agent_note(a)]),
        (Remedy::Link(l), _) => (
            Vec::new(),
            vec![format!(
                "attached through bpf link {l}: it goes when its holders (evidence) close it"
            )],
        ),
        (Remedy::Detach, Some(p)) => (
            vec![Kind::CgroupDetach.fix(format!(
                "bpftool cgroup detach {} {} id {}",
                p.attached_to, c.hook, p.prog.id
            ))],
            vec![format!(
                "detaching removes everything the program does for the sockets of {}",
                p.attached_to
            )],
        ),
        (_, _) => (
            Vec::new(),
            vec![format!(
                "kdrop cannot tell which of the {} programs returned the drop",
                c.progs.len()
            )],
        ),
    }
}

/// `the program belongs to cilium (...): change the policy in cilium`.
fn agent_note(a: &Agent) -> String {
    format!(
        "the program belongs to {} ({}): change the policy in {}",
        a.name, a.evidence, a.name
    )
}

/// The tc hook's programs, in the order the kernel runs them: tcx
/// programs first, the tc filters only when tcx said TC_ACT_UNSPEC
/// (`sch_handle_ingress` and `sch_handle_egress`, net/core/dev.c, v6.6 to
/// v6.18).
fn tc_evidence(d: &ProgDrop, h: &HookProgs) -> Vec<String> {
    let (dev, hook) = (&h.dev, &h.hook);
    let mut evidence = vec![d.kernel.clone()];
    for id in &h.tcx {
        let p = h.progs.iter().find(|p| p.id == *id);
        evidence.push(format!(
            "tcx {hook} on {dev}: {}",
            p.map_or(format!("BPF program id {id}"), prog_text)
        ));
    }
    for f in &h.tc {
        evidence.push(format!("tc {hook} on {dev}: {}", filter_text(f)));
        if let Some(p) = filter_prog(f, &h.progs) {
            evidence.push(format!("its program: {}", prog_text(p)));
        }
    }
    evidence
}

/// Summary, repair and notes.
type Said = (String, Vec<Fix>, Vec<String>);

/// One tc filter: delete it, unless an agent owns its program.
fn tc_filter(d: &ProgDrop, h: &HookProgs, f: &TcFilter, packet: &str) -> Said {
    let (dev, hook, ns) = (&h.dev, &h.hook, d.netns);
    let prog = filter_prog(f, &h.progs);
    let summary = format!(
        "{packet} dropped by the tc {hook} filter on {dev} in netns {ns}: pref {} {} handle {}{}",
        f.pref,
        f.kind,
        f.handle,
        prog.map(|p| format!(" (program {} id {})", p.name, p.id))
            .unwrap_or_default()
    );
    if let Some(a) = prog.and_then(|p| p.agent.as_ref()) {
        let note = format!(
            "the filter's program belongs to {} ({}): change the policy in {} rather than the \
             filter, which it would put back",
            a.name, a.evidence, a.name
        );
        return (summary, Vec::new(), vec![note]);
    }
    let chain = if f.chain != 0 {
        format!(" chain {}", f.chain)
    } else {
        String::new()
    };
    let fix = Kind::TcFilterDelete.fix(format!(
        "{}tc filter del dev {dev} {hook} protocol {} pref {} handle {} {}{chain}",
        d.netns_exec, f.protocol, f.pref, f.handle, f.kind,
    ));
    let note = format!(
        "deleting the filter removes whatever else it did on {dev}; no agent kdrop knows claims it"
    );
    (summary, vec![fix], vec![note])
}

/// One tcx program: held by a link, so only its owner detaches it.
fn tcx_program(d: &ProgDrop, h: &HookProgs, id: u32, packet: &str) -> Said {
    let (dev, hook, ns) = (&h.dev, &h.hook, d.netns);
    let p = h.progs.iter().find(|p| p.id == id);
    let note = match p.and_then(|p| p.agent.as_ref()) {
        Some(a) => format!(
            "the program belongs to {} ({}): change the policy in {}",
            a.name, a.evidence, a.name
        ),
        None => "a tcx program is held by a bpf link: detach it through the link's owner \
                 (evidence names its holders)"
            .into(),
    };
    (
        format!(
            "{packet} dropped by the tcx {hook} program on {dev} in netns {ns}: {}",
            p.map_or(format!("id {id}"), |p| format!("{} id {}", p.name, p.id))
        ),
        Vec::new(),
        vec![note],
    )
}

fn tc(d: &ProgDrop, h: &HookProgs, packet: &str) -> Finding {
    let (dev, hook, ns) = (&h.dev, &h.hook, d.netns);
    let candidates = h.tc.len() + h.tcx.len();
    let (summary, fix, fix_notes) = match (h.tc.as_slice(), h.tcx.as_slice()) {
        ([f], []) => tc_filter(d, h, f, packet),
        ([], [id]) => tcx_program(d, h, *id, packet),
        _ => (
            format!(
                "{packet} dropped by one of the {candidates} tc {hook} programs on {dev} in \
                 netns {ns}"
            ),
            Vec::new(),
            vec![format!(
                "kdrop cannot tell which of the {candidates} returned the drop: the evidence \
                 lists them in the order the kernel runs them"
            )],
        ),
    };
    let summary = if candidates == 0 {
        format!(
            "{packet} dropped at tc {hook} on {dev} in netns {ns}, by a filter or program \
             no longer attached"
        )
    } else {
        summary
    };
    Finding {
        cause: Cause::TcFilter,
        summary,
        evidence: tc_evidence(d, h),
        fix,
        fix_notes,
        inspect: vec![
            format!("{}tc filter show dev {dev} {hook}", d.netns_exec),
            format!("{}bpftool net show dev {dev}", d.netns_exec),
        ],
        ..Finding::default()
    }
}

/// The XDP programs' remedy: their agent's, else detaching the only one;
/// `None` for several, or none left.
fn xdp_remedy(h: &HookProgs) -> Option<Remedy<'_>> {
    let agent = h
        .xdp
        .iter()
        .filter_map(|x| h.progs.iter().find(|p| p.id == x.prog_id))
        .find_map(|p| p.agent.as_ref());
    match (agent, h.xdp.as_slice()) {
        (Some(a), _) => Some(Remedy::Agent(a)),
        (None, [_]) => Some(Remedy::Detach),
        _ => None,
    }
}

fn xdp(d: &ProgDrop, h: &HookProgs, packet: &str) -> Finding {
    let (dev, ns) = (&h.dev, d.netns);
    let mut evidence = vec![d.kernel.clone()];
    for x in &h.xdp {
        let p = h.progs.iter().find(|p| p.id == x.prog_id);
        evidence.push(format!(
            "XDP ({}) on {dev}: {}",
            x.mode,
            p.map_or(format!("BPF program id {}", x.prog_id), prog_text)
        ));
    }
    let (fix, fix_notes) = match (xdp_remedy(h), h.xdp.first()) {
        (Some(Remedy::Agent(a)), _) => (
            Vec::new(),
            vec![format!(
                "the XDP program belongs to {} ({}): change the policy in {}",
                a.name, a.evidence, a.name
            )],
        ),
        (Some(Remedy::Detach), Some(x)) => (
            vec![Kind::XdpDetach.fix(format!(
                "{}ip link set dev {dev} {} off",
                d.netns_exec,
                xdp_flag(x)
            ))],
            vec![format!(
                "detaching removes everything the program does on {dev}"
            )],
        ),
        _ => (Vec::new(), Vec::new()),
    };
    Finding {
        cause: Cause::XdpProgram,
        summary: xdp_summary(h, packet, ns),
        evidence,
        fix,
        fix_notes,
        inspect: vec![format!("{}ip -d link show dev {dev}", d.netns_exec)],
        ..Finding::default()
    }
}

/// The XDP programs by name, or that none is attached any more.
fn xdp_summary(h: &HookProgs, packet: &str, ns: &str) -> String {
    let dev = &h.dev;
    let names: Vec<String> = h
        .xdp
        .iter()
        .map(|x| {
            h.progs
                .iter()
                .find(|p| p.id == x.prog_id)
                .map_or(format!("id {}", x.prog_id), |p| {
                    format!("{} id {}", p.name, p.id)
                })
        })
        .collect();
    if names.is_empty() {
        format!("{packet} dropped by XDP on {dev} in netns {ns}, by a program no longer attached")
    } else {
        format!(
            "{packet} dropped by the XDP program on {dev} in netns {ns}: {}",
            names.join(", ")
        )
    }
}

/// Cgroup programs and socket filters, or a tc/XDP drop whose device could
/// not be read: the reason and where to look.
fn unnamed(d: &ProgDrop, packet: &str) -> Finding {
    let (cause, summary, inspect) = match d.reason {
        "BPF_CGROUP_EGRESS" => (
            Cause::BpfCgroup,
            format!("{packet} dropped by a cgroup egress BPF program of the sending socket's cgroup"),
            vec!["bpftool cgroup tree".to_string()],
        ),
        "SOCKET_FILTER" => (
            Cause::SocketFilter,
            format!("{packet} dropped by a socket filter (SO_ATTACH_FILTER / SO_ATTACH_BPF) of the receiving socket"),
            // ss cannot show a TCP socket's filter: it names the
            // listeners' processes, one of which attached it.
            vec![format!("{}ss -tlnp", d.netns_exec)],
        ),
        "XDP" => (
            Cause::XdpProgram,
            format!("{packet} dropped by an XDP program in netns {}", d.netns),
            vec![format!("{}ip -d link", d.netns_exec)],
        ),
        hook => (
            Cause::TcFilter,
            format!("{packet} dropped by a tc filter ({hook}) in netns {}", d.netns),
            // `tc filter show` needs a device; bpftool lists every one's.
            vec![format!("{}bpftool net show", d.netns_exec)],
        ),
    };
    Finding {
        cause,
        summary,
        evidence: vec![d.kernel.clone()],
        inspect,
        ..Finding::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::progs::{CgroupProg, ClsBpf};

    fn filter(pref: u16, prog: Option<u32>) -> TcFilter {
        TcFilter {
            dev: "s0".into(),
            ifindex: 2,
            hook: "ingress".into(),
            kind: "bpf".into(),
            pref,
            protocol: "all".into(),
            handle: "0x1".into(),
            chain: 0,
            bpf: Some(ClsBpf {
                direct_action: true,
                prog_id: prog,
                name: prog.map(|_| "drop.o:[tc]".into()),
                tag: prog.map(|_| "abababababababab".into()),
                bytecode: prog.is_none().then(|| "2,6 0 0 0,6 0 0 2".into()),
                in_hw: false,
            }),
        }
    }

    fn prog(id: u32, agent: Option<&str>) -> ProgInfo {
        ProgInfo {
            id,
            prog_type: "sched_cls".into(),
            name: "cil_from_netdev".into(),
            tag: "abababababababab".into(),
            load_time_ns: 0,
            loaded_at_unix: None,
            created_by_uid: 0,
            map_ids: vec![],
            pinned: vec!["/sys/fs/bpf/cilium/devices/s0/links/cil_from_netdev".into()],
            agent: agent.map(|a| Agent {
                name: a.into(),
                evidence: "pinned at /sys/fs/bpf/cilium/devices/s0/links/cil_from_netdev".into(),
            }),
            holders: vec![],
            cilium_metrics: None,
        }
    }

    fn drop<'a>(h: Option<&'a HookProgs>, reason: &'a str) -> ProgDrop<'a> {
        ProgDrop {
            reason,
            kernel: "kernel drop reason TC_INGRESS at __netif_receive_skb_core+0x1".into(),
            tuple: Tuple {
                src: "10.1.0.1:41000".parse().unwrap(),
                dst: "10.1.0.2:80".parse().unwrap(),
            },
            flags: "SYN",
            netns: "srv",
            netns_exec: "ip netns exec srv ",
            hook: h,
            cgroup: None,
        }
    }

    fn hook(tc: Vec<TcFilter>, progs: Vec<ProgInfo>) -> HookProgs {
        HookProgs {
            dev: "s0".into(),
            ifindex: 2,
            hook: "ingress".into(),
            tc,
            progs,
            tcx: vec![],
            xdp: vec![],
        }
    }

    #[test]
    fn one_classic_filter_is_named_and_deleted() {
        let h = hook(vec![filter(49152, None)], vec![]);
        let f = explain(&drop(Some(&h), "TC_INGRESS")).unwrap();
        assert_eq!(f.cause, "tc_filter");
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by the tc ingress filter on s0 in netns \
             srv: pref 49152 bpf handle 0x1"
        );
        assert_eq!(
            f.evidence[1],
            "tc ingress on s0: filter protocol all pref 49152 bpf chain 0 handle 0x1 \
             direct-action bytecode '2,6 0 0 0,6 0 0 2'"
        );
        assert_eq!(
            f.fix,
            vec![
                "ip netns exec srv tc filter del dev s0 ingress protocol all pref 49152 handle \
                 0x1 bpf"
                    .to_string()
            ]
        );
    }

    #[test]
    fn an_agents_program_gets_a_note_not_a_fix() {
        let h = hook(vec![filter(1, Some(42))], vec![prog(42, Some("cilium"))]);
        let f = explain(&drop(Some(&h), "TC_INGRESS")).unwrap();
        assert!(f
            .summary
            .ends_with("pref 1 bpf handle 0x1 (program cil_from_netdev id 42)"));
        assert!(f.fix.is_empty());
        assert!(f.fix_notes[0].starts_with("the filter's program belongs to cilium (pinned at"));
        assert!(f.evidence[2].starts_with(
            "its program: BPF program id 42 (sched_cls) name cil_from_netdev tag abababababababab, pinned at"
        ));
    }

    #[test]
    fn several_filters_are_candidates_without_a_fix() {
        let h = hook(vec![filter(1, None), filter(2, None)], vec![]);
        let f = explain(&drop(Some(&h), "TC_INGRESS")).unwrap();
        assert!(f.summary.contains("one of the 2 tc ingress programs on s0"));
        assert!(f.fix.is_empty());
        let none = hook(vec![], vec![]);
        let f = explain(&drop(Some(&none), "TC_INGRESS")).unwrap();
        assert!(f.summary.ends_with("no longer attached"), "{}", f.summary);
    }

    #[test]
    fn xdp_cgroup_and_socket_filters() {
        let mut h = hook(vec![], vec![]);
        h.hook = "xdp".into();
        h.xdp = vec![XdpProg {
            mode: "generic".into(),
            prog_id: 7,
        }];
        let f = explain(&drop(Some(&h), "XDP")).unwrap();
        assert_eq!(f.cause, "xdp_program");
        assert_eq!(
            f.fix,
            vec!["ip netns exec srv ip link set dev s0 xdpgeneric off".to_string()]
        );
        assert_eq!(
            explain(&drop(None, "BPF_CGROUP_EGRESS")).unwrap().cause,
            "bpf_cgroup"
        );
        assert_eq!(
            explain(&drop(None, "SOCKET_FILTER")).unwrap().cause,
            "socket_filter"
        );
        assert!(explain(&drop(None, "NO_SOCKET")).is_none());
    }

    /// A program with no pins, agent or holders, as a tc or XDP test loads it.
    fn bare(id: u32, prog_type: &str, name: &str) -> ProgInfo {
        let mut p = prog(id, None);
        p.prog_type = prog_type.into();
        p.name = name.into();
        p.pinned.clear();
        p
    }

    fn xdp_hook(mode: &str, progs: Vec<ProgInfo>) -> HookProgs {
        let mut h = hook(vec![], progs);
        h.hook = "xdp".into();
        h.xdp = vec![XdpProg {
            mode: mode.into(),
            prog_id: 7,
        }];
        h
    }

    fn xdp_drop(h: &HookProgs) -> ProgDrop<'_> {
        let mut d = drop(Some(h), "XDP");
        d.kernel = "kernel drop reason XDP at do_xdp_generic+0x1f2".into();
        d
    }

    #[test]
    fn a_program_names_its_holders_only_when_it_has_some() {
        let mut p = bare(42, "sched_cls", "drop_syn");
        assert_eq!(
            prog_text(&p),
            "BPF program id 42 (sched_cls) name drop_syn tag abababababababab"
        );
        p.holders = vec![crate::model::listen::ProcessRef {
            pid: 4321,
            comm: "loader".into(),
            cmdline: "loader --attach s0".into(),
        }];
        assert_eq!(
            prog_text(&p),
            "BPF program id 42 (sched_cls) name drop_syn tag abababababababab, held open by \
             loader (pid 4321)"
        );
    }

    /// Plain `xdp off` detaches the driver mode where the driver has one:
    /// the fix names the mode the program runs in.
    #[test]
    fn an_xdp_program_is_detached_in_the_mode_it_runs_in() {
        for (mode, flag) in [
            ("generic", "xdpgeneric"),
            ("native", "xdpdrv"),
            ("offload", "xdpoffload"),
        ] {
            let h = xdp_hook(mode, vec![]);
            assert_eq!(
                explain(&xdp_drop(&h)).unwrap().fix,
                vec![format!("ip netns exec srv ip link set dev s0 {flag} off")],
                "{mode}"
            );
        }
    }

    #[test]
    fn an_xdp_program_nobody_claims_is_named_and_detached() {
        let h = xdp_hook("generic", vec![bare(7, "xdp", "xdp_drop")]);
        let f = explain(&xdp_drop(&h)).unwrap();
        assert_eq!(f.cause, "xdp_program");
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by the XDP program on s0 in netns srv: \
             xdp_drop id 7"
        );
        assert_eq!(
            f.evidence,
            vec![
                "kernel drop reason XDP at do_xdp_generic+0x1f2".to_string(),
                "XDP (generic) on s0: BPF program id 7 (xdp) name xdp_drop tag abababababababab"
                    .to_string(),
            ]
        );
        assert_eq!(
            f.fix,
            vec!["ip netns exec srv ip link set dev s0 xdpgeneric off".to_string()]
        );
        assert_eq!(
            f.fix_notes,
            vec!["detaching removes everything the program does on s0".to_string()]
        );
        assert_eq!(
            f.inspect,
            vec!["ip netns exec srv ip -d link show dev s0".to_string()]
        );
    }

    /// The agent would attach it again: change its policy instead.
    #[test]
    fn an_agents_xdp_program_gets_a_note_not_a_fix() {
        let mut p = prog(7, Some("cilium"));
        p.prog_type = "xdp".into();
        p.name = "cil_xdp_entry".into();
        let h = xdp_hook("generic", vec![p]);
        let f = explain(&xdp_drop(&h)).unwrap();
        assert!(f.fix.is_empty());
        assert_eq!(
            f.fix_notes,
            vec!["the XDP program belongs to cilium (pinned at \
                 /sys/fs/bpf/cilium/devices/s0/links/cil_from_netdev): change the policy in \
                 cilium"
                .to_string()]
        );
    }

    #[test]
    fn one_tcx_program_is_named_with_its_agent() {
        let mut h = hook(vec![], vec![prog(42, Some("cilium"))]);
        h.tcx = vec![42];
        let f = explain(&drop(Some(&h), "TC_INGRESS")).unwrap();
        assert_eq!(f.cause, "tc_filter");
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by the tcx ingress program on s0 in netns \
             srv: cil_from_netdev id 42"
        );
        assert_eq!(
            f.evidence,
            vec![
                "kernel drop reason TC_INGRESS at __netif_receive_skb_core+0x1".to_string(),
                "tcx ingress on s0: BPF program id 42 (sched_cls) name cil_from_netdev tag \
                 abababababababab, pinned at /sys/fs/bpf/cilium/devices/s0/links/cil_from_netdev, \
                 loaded by cilium (pinned at /sys/fs/bpf/cilium/devices/s0/links/cil_from_netdev)"
                    .to_string(),
            ]
        );
        assert!(f.fix.is_empty());
        assert_eq!(
            f.fix_notes,
            vec!["the program belongs to cilium (pinned at \
                 /sys/fs/bpf/cilium/devices/s0/links/cil_from_netdev): change the policy in \
                 cilium"
                .to_string()]
        );
        assert_eq!(
            f.inspect,
            vec![
                "ip netns exec srv tc filter show dev s0 ingress".to_string(),
                "ip netns exec srv bpftool net show dev s0".to_string(),
            ]
        );
    }

    /// tc filters and tcx programs on one hook are all candidates.
    #[test]
    fn a_tc_filter_and_a_tcx_program_are_both_candidates() {
        let mut h = hook(vec![filter(1, None)], vec![prog(42, None)]);
        h.tcx = vec![42];
        let f = explain(&drop(Some(&h), "TC_INGRESS")).unwrap();
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by one of the 2 tc ingress programs on s0 \
             in netns srv"
        );
        assert!(f.fix.is_empty());
        // tcx runs first; the tc filters only when it says TC_ACT_UNSPEC.
        let order: Vec<&str> = f.evidence[1..]
            .iter()
            .map(|l| l.split(" on ").next().unwrap())
            .collect();
        assert_eq!(order, ["tcx ingress", "tc ingress"]);
    }

    /// The remedy's facts: an agent's program is its agent's, a bare one
    /// is detached, a linked one goes with its link, several are unknown.
    #[test]
    fn the_remedy_follows_who_holds_the_program() {
        let h = xdp_hook("generic", vec![bare(7, "xdp", "xdp_drop")]);
        assert_eq!(xdp_remedy(&h), Some(Remedy::Detach));
        let h = xdp_hook("native", vec![prog(7, Some("cilium"))]);
        let agent = h.progs[0].agent.as_ref().unwrap();
        assert_eq!(xdp_remedy(&h), Some(Remedy::Agent(agent)));
        let one = CgroupProg {
            attached_to: "/sys/fs/cgroup/app".into(),
            link_id: Some(4),
            prog: bare(9, "cgroup_skb", "deny"),
        };
        let mut c = CgroupProgs {
            owner: None,
            cgroup: "/sys/fs/cgroup/app".into(),
            hook: "egress".into(),
            progs: vec![one.clone()],
        };
        assert_eq!(cgroup_remedy(&c), Remedy::Link(4));
        c.progs.push(one);
        assert_eq!(cgroup_remedy(&c), Remedy::Unknown(2));
    }

    /// Without a program read from the cgroup, the finding says where to
    /// look rather than naming one.
    #[test]
    fn a_cgroup_drop_without_programs_read_points_at_the_cgroup_tree() {
        let c = CgroupProgs {
            owner: None,
            cgroup: "/sys/fs/cgroup/app".into(),
            hook: "egress".into(),
            progs: vec![],
        };
        let mut d = drop(None, "BPF_CGROUP_EGRESS");
        d.kernel = "kernel drop reason BPF_CGROUP_EGRESS at ip_finish_output+0x2c".into();
        d.cgroup = Some(&c);
        let f = explain(&d).unwrap();
        assert_eq!(f.cause, "bpf_cgroup");
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by a cgroup egress BPF program of the \
             sending socket's cgroup"
        );
        assert_eq!(
            f.evidence,
            vec!["kernel drop reason BPF_CGROUP_EGRESS at ip_finish_output+0x2c".to_string()]
        );
        assert!(f.fix.is_empty());
        assert_eq!(f.inspect, vec!["bpftool cgroup tree".to_string()]);
    }

    #[test]
    fn a_program_drop_on_an_unread_device_names_the_reason_and_netns() {
        let mut d = drop(None, "XDP");
        d.kernel = "kernel drop reason XDP at do_xdp_generic+0x1f2".into();
        let f = explain(&d).unwrap();
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by an XDP program in netns srv"
        );
        assert_eq!(
            f.evidence,
            vec!["kernel drop reason XDP at do_xdp_generic+0x1f2".to_string()]
        );
        assert_eq!(f.inspect, vec!["ip netns exec srv ip -d link".to_string()]);
        let f = explain(&drop(None, "TC_INGRESS")).unwrap();
        assert_eq!(f.cause, "tc_filter");
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by a tc filter (TC_INGRESS) in netns srv"
        );
        // Without a device `tc filter show` prints nothing.
        assert_eq!(f.inspect, ["ip netns exec srv bpftool net show"]);
        let f = explain(&drop(None, "SOCKET_FILTER")).unwrap();
        assert_eq!(f.cause, "socket_filter");
        assert_eq!(f.inspect, ["ip netns exec srv ss -tlnp"]);
    }

    #[test]
    fn a_cgroup_program_is_named_with_where_it_is_attached() {
        let mut p = prog(9, None);
        p.name = "kdt_drop".into();
        p.prog_type = "cgroup_skb".into();
        p.pinned.clear();
        let c = CgroupProgs {
            owner: Some(crate::model::listen::ProcessRef {
                pid: 77,
                comm: "curl".into(),
                cmdline: "curl x".into(),
            }),
            cgroup: "/sys/fs/cgroup/app".into(),
            hook: "egress".into(),
            progs: vec![crate::model::progs::CgroupProg {
                attached_to: "/sys/fs/cgroup/app".into(),
                link_id: None,
                prog: p,
            }],
        };
        let mut d = drop(None, "BPF_CGROUP_EGRESS");
        d.kernel = "kernel drop reason BPF_CGROUP_EGRESS at ip_finish_output+0x2c".into();
        d.cgroup = Some(&c);
        let f = explain(&d).unwrap();
        assert_eq!(f.cause, "bpf_cgroup");
        assert_eq!(
            f.summary,
            "SYN 10.1.0.1:41000 -> 10.1.0.2:80 dropped by the cgroup egress BPF program of curl \
             (pid 77): kdt_drop id 9 on /sys/fs/cgroup/app"
        );
        assert_eq!(
            f.fix,
            vec!["bpftool cgroup detach /sys/fs/cgroup/app egress id 9".to_string()]
        );
        assert_eq!(
            f.evidence,
            vec![
                "kernel drop reason BPF_CGROUP_EGRESS at ip_finish_output+0x2c".to_string(),
                "the socket 10.1.0.1:41000 belongs to curl (pid 77), in cgroup \
                 /sys/fs/cgroup/app"
                    .to_string(),
                "cgroup egress on /sys/fs/cgroup/app: BPF program id 9 (cgroup_skb) name \
                 kdt_drop tag abababababababab"
                    .to_string(),
            ]
        );
        assert_eq!(
            f.fix_notes,
            vec![
                "detaching removes everything the program does for the sockets of \
                 /sys/fs/cgroup/app"
                    .to_string()
            ]
        );
        assert_eq!(
            f.inspect,
            vec!["bpftool cgroup show /sys/fs/cgroup/app effective".to_string()]
        );
        let mut linked = c.clone();
        linked.progs[0].link_id = Some(3);
        d.cgroup = Some(&linked);
        assert!(explain(&d).unwrap().fix.is_empty());
    }
}
