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

const LAB_PORT: u16 = 8080;

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
        "  {}: {} {}/24 (default route, primary), {} {}/24 with pod address {}, rp_filter=1",
        lab.node.name,
        topo.primary_if,
        topo.node_primary,
        topo.secondary_if,
        topo.node_secondary,
        topo.pod_ip
    );
    eprintln!(
        "  {}: {} reaches the pod through {} (like an NLB preserving client IPs)",
        lab.client.name, topo.client_ip, topo.secondary_if
    );

    let filter =
        build_filter(&[LAB_PORT], &[], lab.node.inode()?, 0, false).map_err(anyhow::Error::msg)?;
    let mut tracer = Tracer::start(&filter, 256)?;
    eprintln!(
        "kdrop: tracing {} in netns {}, port {LAB_PORT}",
        tracer.describe(),
        lab.node.name
    );

    let target = SocketAddr::from((topo.pod_ip, LAB_PORT));
    let client = lab.client.path();
    eprintln!("  client: connecting to {target} ...");
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
    let mut stdout = std::io::stdout().lock();
    for d in batch.iter().take(1) {
        let r = tracer.enricher.enrich(d);
        output::write_record(&mut stdout, &r, json)?;
        if !json {
            if let Some(f) = &r.finding {
                for line in output::finding_lines(f) {
                    writeln!(stdout, "{line}")?;
                }
            }
        }
    }
    stdout.flush()?;
    drop(tracer);
    drop(lab);
    eprintln!("  lab torn down: namespaces removed, programs detached");
    Ok(ExitCode::SUCCESS)
}
