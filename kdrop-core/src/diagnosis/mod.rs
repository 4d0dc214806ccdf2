//! Pure logic: events and snapshots of the node in, findings out. No I/O,
//! no clock: everything here runs from recorded events in tests.
//!
//! - `reason`: a finding from the kernel's drop reason alone;
//! - `routing`: reverse-path and martian drops with the routing tables
//!   (`reverse_path`: the kernel's reverse lookup for the packet);
//! - `conntrack`: conntrack's own drops (NAT port clash, full table);
//! - `handshake`: handshakes followed through NAT that died silently;
//! - `netfilter`: which rule, policy or conntrack drop it was;
//! - `kube`: Kubernetes names from kube-proxy's rules, and its own drops;
//! - `calico`: Calico's network policy drops, in Kubernetes terms;
//! - `rpfilter6`: an IPv6 rpfilter / fib rule's drop with the way back;
//! - `way_back`: the next hop of a repair route through the input device
//!   (the neighbour the packet came from);
//! - `names`: the pods a connection involves, named in the summary;
//! - `fix_kinds`: every kind of repair command, and the test that applies it.
pub mod calico;
pub mod cilium;
pub mod conntrack;
pub mod fix_kinds;
pub mod forwarding;
pub mod handshake;
pub mod kube;
pub mod kube_router;
pub mod listen;
pub mod listen_watch;
pub mod names;
pub mod netfilter;
pub mod netpol;
pub mod no_route;
pub mod programs;
pub mod reason;
pub mod reverse_path;
pub mod routes;
pub mod routing;
pub mod rp_filter;
pub mod rpfilter6;
pub mod way_back;

pub use self::reason::{explain, netfilter_location, reason_evidence, DropFacts};
