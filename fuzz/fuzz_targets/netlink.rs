//! rtnetlink and ctnetlink messages: whatever bytes arrive, each parser
//! returns a value or nothing, never panics.
#![no_main]

use kdrop_core::parse::{ctnetlink::parse as ct_parse, rtnetlink as netlink};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = format!("{:?}", netlink::parse_link(data));
    let _ = format!("{:?}", netlink::parse_addr(data));
    let _ = format!("{:?}", netlink::parse_route(data));
    let _ = format!("{:?}", netlink::parse_rule(data));
    let _ = format!("{:?}", ct_parse(data, 4026531840));
});
