use which::which;

/// Building this crate for BPF needs bpf-linker; rebuild when it changes (e.g.
/// `cargo xtask bootstrap` rebuilt it against a new libLLVM).
fn main() {
    let linker = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/bpf-linker");
    if linker.exists() {
        println!("cargo:rerun-if-changed={}", linker.display());
    } else if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
