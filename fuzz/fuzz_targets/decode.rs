//! Ring buffer records: whatever bytes arrive, `decode` returns an event or
//! an error, never panics, and a decoded event renders.
#![no_main]

use kdrop_core::{
    event::decode,
    model::packet::{tcp_flags, Event},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(Event::Drop(d)) => {
            let _ = tcp_flags(d.tcp_flags);
            let _ = format!("{d:?} {}", d.saddr);
        }
        Ok(e) => {
            let _ = format!("{e:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
