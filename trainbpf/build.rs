use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

/// Builds the eBPF object with the pinned nightly named in `.ebpf-toolchain`
/// (installed by `cargo xtask setup`), and embeds it in this crate.
fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let root = metadata.workspace_root.as_std_path();
    let pin_file = root.join(".ebpf-toolchain");
    println!("cargo:rerun-if-changed={}", pin_file.display());
    let pin = std::fs::read_to_string(&pin_file)
        .with_context(|| format!("reading {}", pin_file.display()))?;
    let pin = pin.trim().to_string();
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "trainbpf-ebpf")
        .ok_or_else(|| anyhow!("trainbpf-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::Custom(&pin),
    )
}
