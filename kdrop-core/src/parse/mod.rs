//! Parsers of what kdrop reads from the node, as text or bytes: the shell
//! (`kdrop::context`) runs the tools and reads the sockets, these turn
//! their output into the model.
pub mod ctnetlink;
pub mod iptables_save;
pub mod nft_json;
pub mod nft_render;
pub mod rtnetlink;
