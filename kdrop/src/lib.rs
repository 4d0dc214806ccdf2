//! kdrop: why did this TCP handshake die inside this node?
// The modes: thin, over the session.
pub mod check;
pub mod cli;
pub mod lab;
pub mod monitor;
pub mod trace;

// One event loop, the filter every mode uses.
pub mod filter;
pub mod session;

// Kernel side: load-time facts, probes, decoding what the programs send.
pub mod event;
pub mod kernel;
pub mod probes;

// The node, the reasoning, the records.
pub mod context;
pub mod diagnosis;
pub mod enrich;
pub mod model;
pub mod output;

/// An error in what the user asked for (bad flag value, unknown namespace,
/// missing privileges or BTF): one line, exit code 2.
#[derive(Debug)]
pub struct UserError(pub String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}
