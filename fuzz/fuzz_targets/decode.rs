//! Ring buffer records: whatever bytes arrive, `decode` returns an event or
//! an error, never panics, and a decoded event renders.
#![no_main]

use kdrop::event::{decode, tcp_flags, Event};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Event::Drop(d)) = decode(data) {
        let _ = tcp_flags(d.tcp_flags);
        let _ = format!("{d:?} {}", d.saddr);
    }
});
