//! Facts about the running kernel, read once at load time: its BTF (struct
//! member offsets, tracepoint argument positions, the drop-reason and
//! conntrack-status enums; parsed by the core), its symbols, the classic
//! tracepoints' layouts.
pub use kdrop_core::kernel::{btf, facts};
pub mod btf_file;
pub mod symbols;
pub mod tracefs;
