//! `kdrop lab`: a real incident reproduced in throwaway namespaces, traced by
//! kdrop and torn down, so a newcomer sees kdrop catch a real drop.
pub mod netlab;
pub mod rp_filter;

use std::{
    io::Write as _,
    net::{SocketAddr, TcpStream},
    process::ExitCode,
    time::Duration,
};

use anyhow::{bail, Result};
use kdrop_common::MonitorConfig;

use crate::{
    cli::{LabArgs, LabName},
    context::netns::in_netns,
    filter::build_filter,
    model::record::DropRecord,
    output, probes,
    session::{Control, Ended, Options, Session, Sink},
};

/// Keeps the first drop and ends the trace.
#[derive(Default)]
struct FirstDrop(Option<DropRecord>);

impl Sink for FirstDrop {
    fn record(&mut self, r: DropRecord) -> Control {
        if r.kind != "drop" {
            return Control::Continue;
        }
        self.0 = Some(r);
        Control::Stop
    }
}

pub async fn run(args: &LabArgs) -> Result<ExitCode> {
    probes::check_privileges()?;
    match args.name {
        LabName::RpFilter => rp_filter_lab(args.json).await,
    }
}

async fn rp_filter_lab(json: bool) -> Result<ExitCode> {
    let prefix = format!("kdrop-lab-{}-", std::process::id());
    let topo = rp_filter::RpFilter::lab(&prefix);
    eprintln!(
        "kdrop lab rp-filter: incident 1, a SYN on a secondary interface meets strict rp_filter"
    );
    let lab = topo.build()?;
    eprintln!(
        "  {}: {} {}/24 (primary, default route), {} {}/24 + pod {} (secondary, table 2),\n    \
         rules: 1024 fwmark 0x80/0x80 lookup main, 1536 from {} lookup 2; CONNMARK restores \
         0x80; src_valid_mark=1; rp_filter=1",
        lab.node.name,
        topo.primary_if,
        topo.node_primary,
        topo.secondary_if,
        topo.node_secondary,
        topo.pod_ip,
        topo.pod_ip,
    );
    eprintln!(
        "  {}: {} reaches the pod through {} (an NLB preserving client IPs)",
        lab.client.name, topo.client_ip, topo.secondary_if
    );

    let filter =
        build_filter(&[topo.port], &[], lab.node.inode()?, 0, false).map_err(anyhow::Error::msg)?;
    // Ctrl-C must still tear the lab down: the session ends on it, and the
    // guards drop on return.
    let mut session = Session::start(&Options {
        filter,
        monitor: MonitorConfig::zeroed(),
        ring_kib: 256,
        conntrack_events: true,
        record: None,
        pcap: None,
    })?;
    eprintln!(
        "kdrop: tracing {} in netns {}, port {}",
        session.describe(),
        lab.node.name,
        topo.port
    );

    let target = SocketAddr::from((topo.pod_ip, topo.port));
    // A listener on the pod address: the handshake can complete once fixed.
    let listener = in_netns(&lab.node.path(), move || {
        std::net::TcpListener::bind(target)
    })??;
    eprintln!("  client: connecting to {target} ...");
    let client = lab.client.path();
    // The connect blocks while the client retransmits; kdrop reports the
    // first SYN long before that, and deleting the namespace ends it.
    std::thread::spawn(move || {
        let _ = in_netns(&client, move || {
            TcpStream::connect_timeout(&target, Duration::from_secs(3))
        });
    });

    let mut first = FirstDrop::default();
    let ended = session
        .run(&mut first, Some(Duration::from_secs(5)), None)
        .await?;
    let Some(r) = first.0 else {
        if ended == Ended::Signal {
            bail!("interrupted; lab torn down");
        }
        bail!("no drop seen within 5 s: the lab did not reproduce the incident");
    };
    // A closed stdout (`kdrop lab rp-filter | head -1`) does not end the
    // lab early: the fix is still proven and everything torn down.
    let mut stdout = std::io::stdout().lock();
    let _ = output::write_record(&mut stdout, &r, json).and_then(|()| stdout.flush());

    // Prove the fix: apply kdrop's first fix command, connect again.
    if let Some(fix) = r.finding.as_ref().and_then(|f| f.fix.first()) {
        netlab::run("sh", &["-c", fix.cmd()])?;
        let client = lab.client.path();
        let connected = in_netns(&client, move || {
            TcpStream::connect_timeout(&target, Duration::from_secs(3))
        })?;
        match connected {
            Ok(_) => eprintln!("  applied `{fix}`: the handshake now completes"),
            Err(e) => eprintln!("  applied `{fix}`: the handshake still fails ({e})"),
        }
    }
    drop(listener);
    drop(session);
    drop(lab);
    eprintln!("  lab torn down: namespaces removed, programs detached");
    Ok(ExitCode::SUCCESS)
}
