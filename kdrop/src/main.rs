use std::process::ExitCode;

use clap::Parser as _;
use kdrop::{
    cli::{Cli, Command},
    UserError,
};

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().filter_or("KDROP_LOG", "warn"))
        .format_target(false)
        .init();
    // Before the runtime's threads: they inherit what this thread holds.
    let raised = kdrop::startup::raise();
    if raised != Default::default() {
        log::debug!("raised at start: {raised:?}");
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kdrop: {} (see kdrop --help)", usage_error_line(&e));
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kdrop: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Some(Command::Check) => kdrop::check::run(),
        Some(Command::Lab(args)) => rt.block_on(kdrop::lab::run(&args)),
        Some(Command::Monitor(args)) => rt.block_on(kdrop::monitor::run(&args)),
        Some(Command::Record(args)) => rt.block_on(kdrop::trace::record(&args)),
        Some(Command::Explain(args)) => kdrop::trace::explain(&args),
        None => rt.block_on(kdrop::trace::run(&cli.trace)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kdrop: {e:#}");
            if e.downcast_ref::<UserError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// clap's message without its `error: ` prefix and usage block: one line.
fn usage_error_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}
