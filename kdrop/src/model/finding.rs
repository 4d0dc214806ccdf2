//! kdrop's answer for one failed handshake.
use serde::Serialize;

/// Why a packet died and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable identifier, e.g. `rp_filter`, `no_socket`.
    pub cause: &'static str,
    pub summary: String,
    pub evidence: Vec<String>,
    pub fix: Vec<String>,
}
