//! kdrop: why did this TCP handshake die inside this node?
// The modes: thin, over the session.
#[cfg(feature = "runtime")]
pub mod check;
#[cfg(feature = "runtime")]
pub mod cli;
#[cfg(feature = "runtime")]
pub mod lab;
#[cfg(feature = "runtime")]
pub mod monitor;
#[cfg(feature = "runtime")]
pub mod trace;

// One event loop, the filter every mode uses.
#[cfg(feature = "runtime")]
pub mod filter;
#[cfg(feature = "runtime")]
pub mod session;

// Kernel side: load-time facts, probes, decoding what the programs send.
pub mod event;
pub mod kernel;
#[cfg(feature = "runtime")]
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
