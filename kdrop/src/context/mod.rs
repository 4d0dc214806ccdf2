//! What the node looks like around an event: namespaces and their names,
//! interfaces, routing tables and rules, sysctls, netfilter counters.
pub mod ctevents;
pub mod netfilter;
pub mod netlink;
pub mod netns;
pub mod routing;
pub mod sysctl;

pub use netns::{in_netns, Netns, NetnsRegistry};
