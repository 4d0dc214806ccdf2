//! Plain data shared by every part of kdrop: what the kernel reported,
//! what the node looks like, what kdrop concluded. No I/O, no logic beyond
//! what the data says about itself; `context` fills it, `diagnosis` reads
//! it, `output` renders it.
pub mod cause;
pub mod finding;
pub mod listen;
pub mod neighbour;
pub mod netfilter;
pub mod packet;
pub mod pod;
pub mod policy;
pub mod progs;
pub mod record;
pub mod routing;
pub mod stats;
pub mod time;
