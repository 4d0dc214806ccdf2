//! kdrop's answer for one failed handshake.
use serde::{Serialize, Serializer};

pub use super::cause::Cause;

/// Why a packet died and what to do about it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Why, as a stable id in JSON (`rp_filter_strict`, `no_socket`).
    pub cause: Cause,
    pub summary: String,
    pub evidence: Vec<String>,
    /// Commands that repair it, run as written, in order, on this node: a
    /// new connection then succeeds (every one is applied by a test). Empty
    /// when the repair lies outside the node (`fix_notes` says where).
    pub fix: Vec<Fix>,
    /// Other repairs, each a list of commands that works on its own
    /// instead of `fix`.
    pub fix_or: Vec<Vec<Fix>>,
    /// What to know before repairing: caveats, repairs outside the node
    /// (which object to change, and how), why the obvious repair would not
    /// work.
    pub fix_notes: Vec<String>,
    /// Read-only commands that show the evidence for yourself.
    pub inspect: Vec<String>,
}

/// One repair command and the kind of repair it is. Built only by
/// `diagnosis::fix_kinds::Kind::fix` (a unit test there scans the sources
/// for any other caller of `Fix::new`), so every command a finding can
/// carry is of a kind listed there, with the integration test that applies
/// it. Written out as the command alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fix {
    kind: &'static str,
    cmd: String,
}

impl Fix {
    /// `kind` is the stable name of a `diagnosis::fix_kinds::Kind`.
    pub fn new(kind: &'static str, cmd: String) -> Self {
        Fix { kind, cmd }
    }

    /// The kind's stable name (README's table of repairs).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    pub fn cmd(&self) -> &str {
        &self.cmd
    }
}

impl std::ops::Deref for Fix {
    type Target = str;
    fn deref(&self) -> &str {
        &self.cmd
    }
}

impl std::fmt::Display for Fix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.cmd)
    }
}

impl Serialize for Fix {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.cmd)
    }
}

impl PartialEq<str> for Fix {
    fn eq(&self, other: &str) -> bool {
        self.cmd == other
    }
}

impl PartialEq<&str> for Fix {
    fn eq(&self, other: &&str) -> bool {
        self.cmd == *other
    }
}

impl PartialEq<String> for Fix {
    fn eq(&self, other: &String) -> bool {
        &self.cmd == other
    }
}
