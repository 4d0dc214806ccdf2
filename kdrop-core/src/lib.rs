//! kdrop's pure core: what a dropped handshake means, with no runtime, no
//! kernel and no I/O. Events and snapshots of the node in, findings out.
//! Its dependencies (kdrop-common without aya, serde) are all it can use:
//! no async runtime, aya, libc or file and process access, so the compiler keeps
//! the layering `kdrop` (the shell: probes, node I/O, event loop, CLI)
//! relies on (ARCHITECTURE.md).

// Plain data shared by everything.
pub mod model;
// The ring buffer's records (kdrop-common) as owned events.
pub mod event;
// The node's rules and conntrack messages, read from their text or bytes.
pub mod parse;
// The kernel's BTF, and the facts kdrop loads its programs with.
pub mod kernel;
// Events and snapshots in, findings out.
pub mod diagnosis;
