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
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    cli::{LabArgs, LabName},
    context::netns::in_netns,
    output, probes,
    tracer::{build_filter, Tracer},
};

pub async fn run(args: &LabArgs) -> Result<ExitCode> {
    probes::check_privileges()?;
    match args.name {
        LabName::RpFilter => rp_filter_lab(args.json).await,
    }
}

async fn rp_filter_lab(json: bool) -> Result<ExitCode> {
    // Ctrl-C must still tear the lab down: the guards drop on return.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
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
    let mut tracer = Tracer::start(&filter, 256)?;
    eprintln!(
        "kdrop: tracing {} in netns {}, port {}",
        tracer.describe(),
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

    let batch = tokio::select! {
        b = tokio::time::timeout(Duration::from_secs(5), tracer.next_batch()) => match b {
            Ok(b) => b?,
            Err(_) => bail!("no drop seen within 5 s: the lab did not reproduce the incident"),
        },
        _ = sigint.recv() => bail!("interrupted; lab torn down"),
        _ = sigterm.recv() => bail!("terminated; lab torn down"),
    };
    let Some(r) = batch
        .iter()
        .flat_map(|e| tracer.enricher.on_event(e))
        .find(|r| r.kind == "drop")
    else {
        bail!("no drop in the first batch");
    };
    let mut stdout = std::io::stdout().lock();
    output::write_record(&mut stdout, &r, json)?;
    stdout.flush()?;

    // Prove the fix: apply kdrop's first fix command, connect again.
    if let Some(fix) = r.finding.as_ref().and_then(|f| f.fix.first()) {
        netlab::run("sh", &["-c", fix])?;
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
    drop(tracer);
    drop(lab);
    eprintln!("  lab torn down: namespaces removed, programs detached");
    Ok(ExitCode::SUCCESS)
}
