use which::which;

/// Rebuild the eBPF object when bpf-linker changes: cargo doesn't see it as
/// a dependency, and a stale link step would hide a new linker's fixes.
fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
