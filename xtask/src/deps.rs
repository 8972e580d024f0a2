//! `cargo xtask deps`, and a lint step of `cargo xtask test`: every
//! dependency the workspace declares is used. cargo-shear (crates.io) parses
//! each member's sources and fails on a dependency none of them imports,
//! `[workspace.dependencies]` entries that no member takes included. It
//! reads sources only (no build), so it takes a second; it is installed
//! once, at a fixed version.
//!
//! fuzz/ is a workspace of its own, built by cargo-fuzz, and not checked.

use std::process::Command;

use anyhow::{Context, Result};

use crate::util::{cargo, cargo_install, probe, run};

/// Not 1.14: its locked dependencies need a newer rustc than CI's stable.
const CARGO_SHEAR_VERSION: &str = "1.13.0";

pub fn check() -> Result<()> {
    cargo_shear()?;
    run(cargo().arg("shear")).context(
        "a dependency is declared that no code uses: put it to use or remove it \
         (`cargo shear --fix` removes it); one used in a way cargo-shear cannot \
         see goes in `[package.metadata.cargo-shear] ignored`, with a comment \
         saying how it is used",
    )
}

/// cargo-shear at [`CARGO_SHEAR_VERSION`], installed unless cargo's list
/// of installed tools already has it. Its `--version` says "dev", so the
/// list is what names the version.
fn cargo_shear() -> Result<()> {
    let listed = format!("cargo-shear v{CARGO_SHEAR_VERSION}:");
    let installed = || {
        probe(Command::new("cargo").args(["install", "--list"]))
            .is_some_and(|list| list.lines().any(|l| l.starts_with(&listed)))
            && probe(Command::new("cargo").args(["shear", "--version"])).is_some()
    };
    if installed() {
        eprintln!("deps: cargo-shear {CARGO_SHEAR_VERSION}: already present");
        return Ok(());
    }
    eprintln!("deps: installing cargo-shear {CARGO_SHEAR_VERSION} (about a minute)");
    run(cargo_install().args(["cargo-shear", "--version", CARGO_SHEAR_VERSION, "--locked"]))?;
    anyhow::ensure!(
        installed(),
        "cargo-shear was installed but `cargo install --list` does not show {CARGO_SHEAR_VERSION}, \
         or `cargo shear` does not run"
    );
    Ok(())
}
