//! What the node looks like around an event: namespaces and their names,
//! interfaces inside them.
pub mod netfilter;
pub mod netns;

pub use netns::{in_netns, Netns, NetnsRegistry};
