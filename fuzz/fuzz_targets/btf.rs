//! Kernel BTF: kdrop parses /sys/kernel/btf/vmlinux (or a KDROP_BTF file) at
//! every start. Malformed input must be an error, never a panic or a hang,
//! for the parser and for the lookups kdrop makes in what it parsed.
#![no_main]

use kdrop_core::kernel::{btf::Btf, facts as kernel};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(btf) = Btf::parse(data, None) else {
        return;
    };
    // What kdrop reads at load time.
    let _ = kernel::offsets(&btf);
    let reasons = kernel::Reasons::from_btf(&btf);
    let _ = kernel::kfree_skb_args(&btf, &reasons);
    // And the accessors, over the first ids.
    for id in 0..64 {
        let _ = btf.name(id);
        let _ = btf.kind(id);
        let _ = btf.resolve(id);
        let _ = btf.size_of(id);
        let _ = btf.members(id);
        let _ = btf.enum_values(id);
        let _ = btf.params(id);
        let _ = btf.type_name(id);
    }
});
