//! Facts about the running kernel, read once at load time: its BTF (struct
//! member offsets, tracepoint argument positions, the drop-reason and
//! conntrack-status enums), its symbols, the classic tracepoints' layouts.
pub mod btf;
pub mod facts;
pub mod symbols;
pub mod tracefs;
