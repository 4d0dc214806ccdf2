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
pub mod kernel;
#[cfg(feature = "runtime")]
pub mod probes;

// The process's capabilities and limits, raised before anything else.
pub mod startup;

// The pure core: the records, decoding, parsers and the reasoning, in a
// crate of their own (no runtime, no I/O); the shell's paths stay.
pub use kdrop_core::{diagnosis, event, model};

// The node, and enrichment: the node's answers meet the reasoning.
pub mod context;
pub mod enrich;
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
