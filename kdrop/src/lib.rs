//! kdrop: why did this TCP handshake die inside this node?
pub mod btf;
pub mod check;
pub mod cli;
pub mod context;
pub mod diagnosis;
pub mod event;
pub mod kernel;
pub mod lab;
pub mod monitor;
pub mod netfilter;
pub mod nfprobe;
pub mod output;
pub mod probes;
pub mod run;
pub mod symbols;
pub mod tracer;
pub mod verdict;

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
