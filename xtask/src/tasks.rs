//! `cargo xtask build`, `test` and `demo`.

use std::{ffi::OsString, fs, io, path::PathBuf, process::Command};

use anyhow::{Context, Result, ensure};

use crate::{
    privilege::cargo_args_before_dashdash,
    setup::{pinned_toolchain, rustup, setup},
    util::{cargo, require_root, run, status, target_dir, workspace_root},
};

/// Setup, then a debug build of trainbpf; trainbpf/build.rs builds the eBPF
/// crate through aya-build. Returns the binary's absolute path.
pub fn build() -> Result<PathBuf> {
    setup()?;
    run(cargo().args(["build", "--package", "trainbpf"]))?;
    let bin = target_dir()?.join("debug/trainbpf");
    ensure!(bin.is_file(), "the build produced no {}", bin.display());
    Ok(bin)
}

/// A release build of trainbpf (the full benchmark's); returns its path.
pub fn build_release() -> Result<PathBuf> {
    setup()?;
    run(cargo().args(["build", "--release", "--package", "trainbpf"]))?;
    Ok(target_dir()?.join("release/trainbpf"))
}

/// All that `test` builds and checks without root: formatting, the binary,
/// clippy and the test binaries. A user runs it before sudo re-runs the
/// task, so that the build output stays theirs.
/// Returns the binary and the wheel.
pub fn test_build(lint: bool, cargo_args: &[OsString]) -> Result<(PathBuf, PathBuf)> {
    // Formatting and unused dependencies first: they take a second each
    // (once cargo-shear is installed) and need no build.
    if lint {
        run(cargo().args(["fmt", "--all", "--", "--check"]))?;
        crate::deps::check()?;
    }
    // deploy/kubernetes/ against the schemas: a few seconds, no build.
    crate::manifests::validate()?;
    let bin = build()?;
    if lint {
        // trainbpf-ebpf cannot be checked for the host: it is no_std with its
        // own panic handler and uses nightly features, and a workspace-wide
        // check unifies trainbpf-common's std-using features into it.
        run(cargo()
            .args(["clippy", "--workspace", "--exclude", "trainbpf-ebpf"])
            .args(["--all-targets", "--", "-D", "warnings"]))?;
        clippy_ebpf()?;
    }
    run(cargo()
        .args(["test", "--workspace", "--no-run"])
        .args(cargo_args))?;
    // The wheel test installs it into a fresh venv and records with it.
    let wheel = crate::wheel::build()?;
    Ok((bin, wheel))
}

/// Clippy on trainbpf-ebpf, checked as aya-build (trainbpf/build.rs) builds
/// it: the pinned nightly, bpfel, `core` from source, release, and the
/// host's `bpf_target_arch`, which picks aya-ebpf's register layout. Only
/// this package is named, so trainbpf-common gets the features the eBPF
/// side builds it with, not the host's. A target directory of its own:
/// these flags would otherwise rebuild what the other builds share.
fn clippy_ebpf() -> Result<()> {
    let pin = pinned_toolchain()?;
    let target_dir = target_dir()?.join("xtask").join("ebpf-clippy");
    let arch = std::env::consts::ARCH;
    let mut cmd = rustup();
    cmd.current_dir(workspace_root())
        .args(["run", &pin, "cargo", "clippy", "--package", "trainbpf-ebpf"])
        .args(["--bins", "--release", "--target", "bpfel-unknown-none"])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "-D", "warnings"])
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\""),
        );
    // Chosen by the cargo that started xtask, for its own toolchain.
    for var in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTDOC"] {
        cmd.env_remove(var);
    }
    run(&mut cmd)
}

pub fn test(lint: bool, cargo_test_args: &[OsString]) -> Result<()> {
    require_root("test", "the privileged tests need root")?;
    let (bin, wheel) = test_build(lint, cargo_args_before_dashdash(cargo_test_args))?;
    // The HTML report's test renders the page in a real browser.
    crate::report_bench::ensure_chromium()?;
    // `report --pprof`'s test reads the profile with `go tool pprof`.
    crate::report_bench::ensure_go()?;
    // `record --metrics`' test scrapes the recorder with Prometheus.
    crate::report_bench::ensure_prometheus()?;
    // The Root Cause test runs a real torchrun.
    let torchrun = crate::torch::ensure()?;
    run(cargo()
        // Every test binary runs even after one fails: a CI log should show
        // all that is broken, not the first.
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(cargo_test_args)
        // The end-to-end tests drive the binary built above, and fail rather
        // than skip when they cannot do their privileged parts.
        .env("TRAINBPF_BIN", &bin)
        .env("TRAINBPF_WHEEL", &wheel)
        .env("TRAINBPF_TORCHRUN", &torchrun)
        .env("TRAINBPF_PRIVILEGED_REQUIRED", "1")
        // The suite is written for plain root, as CI runs it: under sudo,
        // `record` would run every job as the user sudo came from. The
        // tests that check that set these themselves.
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("SUDO_USER"))
}

pub fn demo() -> Result<()> {
    require_root("demo", "recording the demo needs root")?;
    let bin = build()?;
    // The recorder creates its file as the user who ran sudo, and a
    // target/ made by `sudo cargo` is root's: the demo gets a directory
    // of theirs.
    let dir = target_dir()?.join("demo");
    fs::create_dir_all(&dir)?;
    ensure!(
        fs::symlink_metadata(&dir)?.is_dir(),
        "{} is not a directory",
        dir.display()
    );
    let id = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    if let (Some(uid), Some(gid)) = (id("SUDO_UID"), id("SUDO_GID")) {
        std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))?;
    }
    let rec = dir.join("demo.rec");
    // A file left by an earlier run must not pass for this run's record.
    match fs::remove_file(&rec) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }

    eprintln!(
        "demo: recording examples/train.py in a 300 MiB memory limit; a worker will be OOM-killed"
    );
    let recorded = status(
        Command::new(&bin)
            .args(["record", "--memory-limit", "300M", "-o"])
            .arg(&rec)
            .args(["--", "python3", "examples/train.py"])
            .current_dir(workspace_root()),
    )?;
    // The job is meant to die, so record's own exit status (the job's) is not
    // a verdict; the record file and the report are.
    eprintln!("demo: record exited ({recorded})");
    ensure!(rec.is_file(), "record wrote no {}", rec.display());
    run(Command::new(&bin).arg("report").arg(&rec)).context("the report of the demo record failed")
}
