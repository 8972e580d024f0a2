use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

use std::{path::Path, process::Command};

/// Builds the eBPF object with the pinned nightly named in `.ebpf-toolchain`
/// (installed by `cargo xtask setup`), and embeds it in this crate.
fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let root = metadata.workspace_root.as_std_path();
    println!("cargo:rustc-env=TRAINBPF_COMMIT={}", commit(root));
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

/// The commit the binary is built from, for `--version` (a wheel or a
/// static copy on a cluster says which source it is): the checkout's HEAD,
/// or "unknown" outside a git checkout. Rerun when HEAD or the branch it
/// names moves, so a new commit is never shown as the old one.
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let Some(hash) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    hash
}
