//! `cargo xtask wheel`: the pip wheel. The static (musl) trainbpf binary,
//! with its eBPF object inside, as the package's one script, built by
//! maturin with `bindings = "bin"` (pyproject.toml). The binary needs no
//! libc, so one wheel carries both the manylinux and the musllinux tag and
//! installs on any x86_64 Linux pip; it depends on nothing.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, ensure};

use crate::{
    setup::setup,
    util::{probe, run, target_dir, workspace_root},
    vm::{MUSL, ensure_musl_target},
};

/// The maturin that builds the wheel, pinned so that a wheel's layout and
/// tags do not change under the project.
const MATURIN: &str = "1.16.0";

/// The wheel's platform tags. A static binary asks nothing of the machine's
/// libc, so it claims the oldest glibc line PyPI still takes for x86_64
/// (manylinux2014) and musl alike: pip on either picks it.
const TAGS: [&str; 2] = ["manylinux_2_17", "musllinux_1_2"];

/// Builds the wheel into target/wheels and returns its path.
pub fn build() -> Result<PathBuf> {
    setup()?;
    ensure_musl_target()?;
    let maturin = ensure_maturin()?;
    let out = target_dir()?.join("wheels");
    fs::create_dir_all(&out)?;
    // Only this build's wheel is left to be found (and installed) below.
    for old in wheels_in(&out)? {
        fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    run(Command::new(&maturin)
        .args(["build", "--release", "--target", MUSL, "--compatibility"])
        .args(TAGS)
        .arg("--out")
        .arg(&out)
        .current_dir(workspace_root()))?;
    let mut built = wheels_in(&out)?;
    ensure!(
        built.len() == 1,
        "maturin left {} wheels in {}, not one",
        built.len(),
        out.display()
    );
    Ok(built.remove(0))
}

fn wheels_in(dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("trainbpf-") && name.ends_with(".whl") {
            found.push(p);
        }
    }
    Ok(found)
}

/// A virtual environment under target/ holding the pinned maturin, made
/// once; pip installs from the machine's configured index. Returns maturin.
fn ensure_maturin() -> Result<PathBuf> {
    let venv = target_dir()?.join("xtask/maturin");
    let maturin = venv.join("bin/maturin");
    let have = probe(Command::new(&maturin).arg("--version"));
    if have.as_deref().map(str::trim) == Some(&format!("maturin {MATURIN}")) {
        return Ok(maturin);
    }
    eprintln!(
        "setup: installing maturin {MATURIN} into {}",
        venv.display()
    );
    // --clear: a venv left by another Python, or moved with its target/,
    // has scripts that name an interpreter that is gone.
    run(Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv))
    .context("creating a Python venv (Debian's system Python needs the python3-venv package)")?;
    run(Command::new(venv.join("bin/python3"))
        .args(["-m", "pip", "install", "--quiet"])
        .arg(format!("maturin=={MATURIN}")))?;
    Ok(maturin)
}
