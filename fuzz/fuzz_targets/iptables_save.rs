//! `iptables-save -c` output: any text parses to tables or an error, never
//! a panic, in every backend and family.
#![no_main]

use kdrop_core::{
    parse::iptables_save::parse_save,
    model::netfilter::{Backend, Family},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for (backend, family) in [
        (Backend::IptablesLegacy, Family::Ip),
        (Backend::IptablesNft, Family::Ip6),
    ] {
        let _ = format!("{:?}", parse_save(&text, backend, family, "fuzz"));
    }
});
