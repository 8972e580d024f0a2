//! PyTorch for the torchrun test: torch from the machine's configured pip
//! index (PyPI's wheel, run on the CPU), pinned, in a virtual environment
//! under target/ made once. The end-to-end test runs that environment's
//! `torchrun` with two ranks over gloo (`tests/e2e/torchrun.rs`).

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::util::{probe, run, target_dir};

/// The torch the test is written against: its error file's format and its
/// agent's Root Cause block.
const TORCH: &str = "2.15.0";

/// Makes the environment if it lacks this torch; returns its `torchrun`.
pub fn ensure() -> Result<PathBuf> {
    let venv = target_dir()?.join("xtask/torch");
    let python = venv.join("bin/python3");
    let torchrun = venv.join("bin/torchrun");
    let have = probe(Command::new(&python).args([
        "-c",
        "import importlib.metadata as m; print(m.version('torch'))",
    ]));
    // Made by this Python: a venv of another may be out of the test
    // user's reach.
    let base_ok = std::fs::read_to_string(venv.join("pyvenv.cfg")).is_ok_and(|c| {
        !c.lines()
            .any(|l| l.starts_with("home") && l.contains("/root/"))
    });
    if have.as_deref().map(str::trim) == Some(TORCH) && torchrun.is_file() && base_ok {
        return Ok(torchrun);
    }
    eprintln!(
        "setup: installing torch {TORCH} into {} (a few GB, once)",
        venv.display()
    );
    // --clear: a venv left by another Python has scripts that name an
    // interpreter that is gone. The system's Python where there is one:
    // the test runs torchrun as an unprivileged user, who cannot reach an
    // interpreter under root's home (pyenv's).
    let base = if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    run(Command::new(base)
        .args(["-m", "venv", "--clear"])
        .arg(&venv))
    .context("creating a Python venv (Debian's system Python needs the python3-venv package)")?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--no-cache-dir"])
        .arg(format!("torch=={TORCH}")))
    .context("installing torch from the configured pip index")?;
    Ok(torchrun)
}
