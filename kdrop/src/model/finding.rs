//! kdrop's answer for one failed handshake.
use serde::Serialize;

/// Why a packet died and what to do about it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable identifier, e.g. `rp_filter_strict`, `no_socket`.
    pub cause: &'static str,
    pub summary: String,
    pub evidence: Vec<String>,
    /// Commands that repair it, run as written, in order, on this node: a
    /// new connection then succeeds (every one is applied by a test). Empty
    /// when the repair lies outside the node (`fix_notes` says where).
    pub fix: Vec<String>,
    /// Other repairs, each a list of commands that works on its own
    /// instead of `fix`.
    pub fix_or: Vec<Vec<String>>,
    /// What to know before repairing: caveats, repairs outside the node
    /// (which object to change, and how), why the obvious repair would not
    /// work.
    pub fix_notes: Vec<String>,
    /// Read-only commands that show the evidence for yourself.
    pub inspect: Vec<String>,
}
