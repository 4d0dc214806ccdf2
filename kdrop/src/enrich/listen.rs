//! Findings that need the listener's or the device's side: a listen
//! overflow (the final ACK refused, or a SYN unanswered because the accept
//! queue was full), a duplicate SYN, a drop by a tc filter or an XDP
//! program.
use std::net::SocketAddr;

use super::Enricher;
use crate::{
    context::Node,
    diagnosis::{
        handshake::{findings::transmissions, Flow},
        listen::{self, Seen},
        programs::{self, ProgDrop},
    },
    model::{
        finding::Finding,
        packet::{Drop, Tuple},
        record::DropRecord,
    },
};

impl<N: Node> Enricher<N> {
    /// A SYN unanswered because the listener it went to had no room, or
    /// None when the listener (found in any namespace) shows no overflow.
    pub(super) fn unanswered_listener(&mut self, flow: &Flow) -> Option<Finding> {
        let found = self.node.listener(flow.netns, flow.wire.dst)?;
        listen::overflow(&found, &flow.wire, &Seen::Unanswered(transmissions(flow)))
    }

    /// TCP_LISTEN_OVERFLOW (the final ACK refused) with the listener's side;
    /// a SYN freed as NOT_SPECIFIED by TCP's receive path (a duplicate).
    pub(super) fn explain_listen(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        let t = Tuple {
            src: SocketAddr::new(d.saddr, d.sport),
            dst: SocketAddr::new(d.daddr, d.dport),
        };
        let syn = r.tcp_flags.contains("SYN") && !r.tcp_flags.contains("ACK");
        let tcp_rcv = ["tcp_v4_rcv+", "tcp_v6_rcv+"]
            .iter()
            .any(|f| r.location.starts_with(f));
        match r.reason.as_deref() {
            Some("TCP_LISTEN_OVERFLOW") => {
                // The client believed the connection open: its later RSTs
                // do not refuse a SYN-ACK.
                self.tracker.final_ack_seen(&t.reversed(), d.ts_ns);
                let found = self.node.listener(d.netns, t.dst)?;
                let line = format!(
                    "kernel drop reason TCP_LISTEN_OVERFLOW at {} in netns {}",
                    r.location, found.netns_name
                );
                listen::overflow(&found, &t, &Seen::FinalAck(line))
            }
            Some("NOT_SPECIFIED") if syn && tcp_rcv => {
                // Without a request socket it repeated nothing: a TIME_WAIT
                // socket of the same tuple answered it (see `tcp_freed`).
                let pending = self.node.request_pending(d.netns, t.dst, t.src);
                (pending != Some(false)).then(|| listen::duplicate_syn(&t, &r.location, pending))
            }
            // Without drop reasons (before 5.17) every free there has none
            // (a closed port's SYN too): only the request socket it repeats,
            // seen now, makes it a duplicate.
            None if syn && tcp_rcv => {
                let pending = self.node.request_pending(d.netns, t.dst, t.src);
                (pending == Some(true))
                    .then(|| listen::duplicate_syn_freed(&t, &r.location, pending, false))
            }
            _ => None,
        }
    }

    /// A drop by a tc filter, an XDP program, a cgroup program or a socket
    /// filter: what was on the device's hook.
    pub(super) fn explain_program(&mut self, d: &Drop, r: &DropRecord) -> Option<Finding> {
        // Generic XDP frees an XDP_DROP'd packet with plain kfree_skb
        // (NOT_SPECIFIED; no reason before 5.17) in do_xdp_generic, v6.18
        // https://github.com/torvalds/linux/blob/v6.18/net/core/dev.c: the
        // place names it.
        let reason = match r.reason.as_deref() {
            Some("NOT_SPECIFIED") | None if r.location.starts_with("do_xdp_generic+") => "XDP",
            Some(reason) if programs::REASONS.contains(&reason) => reason,
            _ => return None,
        };
        let hook = match reason {
            "TC_INGRESS" => Some("ingress"),
            "TC_EGRESS" => Some("egress"),
            "XDP" => Some("xdp"),
            _ => None,
        };
        let progs = hook.and_then(|h| self.node.hook_programs(d.netns, d.ifindex, h));
        let src = SocketAddr::new(d.saddr, d.sport);
        let cgroup = (reason == "BPF_CGROUP_EGRESS")
            .then(|| self.node.cgroup_programs(d.netns, src, "egress"))
            .flatten();
        let ns = self.netns_name(d.netns);
        programs::explain(&ProgDrop {
            reason,
            kernel: format!(
                "kernel drop reason {} at {}",
                r.reason.as_deref().unwrap_or("(none)"),
                r.location
            ),
            tuple: Tuple {
                src: SocketAddr::new(d.saddr, d.sport),
                dst: SocketAddr::new(d.daddr, d.dport),
            },
            flags: &r.tcp_flags,
            netns: &ns.display(),
            netns_exec: &ns.exec(),
            hook: progs.as_ref(),
            cgroup: cgroup.as_ref(),
        })
    }
}
