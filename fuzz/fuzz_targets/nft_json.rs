//! `nft -j list ruleset` output: any text parses to tables or an error,
//! never a panic.
#![no_main]

use kdrop_core::parse::nft_json::parse_ruleset;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = format!("{:?}", parse_ruleset(&String::from_utf8_lossy(data)));
});
