//! Helpers shared by the tasks: running commands, finding the workspace.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

use anyhow::{Context, Result, bail, ensure};

/// The workspace root; xtask lives one level below it.
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is a workspace member")
}

/// `cargo` for a nested command on this workspace. It inherits the outer
/// RUSTUP_TOOLCHAIN, so it uses the toolchain that started xtask.
pub fn cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root());
    cmd
}

/// `cargo install` for host tooling (bpf-linker, cargo-shear), built by the
/// default toolchain: nothing the outer `cargo xtask` chose for this
/// workspace (toolchain, compiler, target, flags, target dir) applies to it.
pub fn cargo_install() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("install");
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTUP_TOOLCHAIN_SOURCE",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// The target directory as cargo resolves it (CARGO_TARGET_DIR, config or
/// the default), so that paths we print are where cargo really wrote.
pub fn target_dir() -> Result<PathBuf> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run `cargo metadata`")?;
    ensure!(out.status.success(), "`cargo metadata` failed");
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let dir = meta["target_directory"]
        .as_str()
        .context("`cargo metadata` gave no target_directory")?;
    Ok(PathBuf::from(dir))
}

/// Runs `cmd` with its output streaming to the terminal; fails unless it
/// exits 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = status(cmd)?;
    if !status.success() {
        bail!("`{}` failed ({status})", show(cmd));
    }
    Ok(())
}

/// Runs `cmd` with its output streaming to the terminal.
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    eprintln!("+ {}", show(cmd));
    cmd.status()
        .with_context(|| format!("cannot run `{}`", show(cmd)))
}

/// Runs `cmd` silently for a check: its stdout if it exits 0, else None
/// (a missing program included).
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn show(cmd: &Command) -> String {
    let mut words = vec![cmd.get_program().to_string_lossy().into_owned()];
    words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// Effective uid 0. Read from /proc so that xtask needs no libc binding.
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let uids = s.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            // Real, effective, saved, filesystem.
            Some(uids.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Fails, never skips: a privileged run that quietly skipped its privileged
/// parts would pass without having tested anything. (main re-runs a root
/// task under sudo first; this guards the task itself.)
pub fn require_root(task: &str, why: &str) -> Result<()> {
    if !is_root() {
        bail!("{why} (eBPF programs, memory cgroups): run `cargo xtask {task}` as root");
    }
    Ok(())
}
