//! What kdrop needs to know of the running kernel, read from its BTF
//! (struct member offsets, tracepoint argument positions, the drop-reason
//! and conntrack-status enums): the parser and the facts, from bytes the
//! shell reads (`kdrop::kernel`).
pub mod btf;
pub mod facts;
