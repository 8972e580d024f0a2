//! `cargo xtask manifests`, and a step of `cargo xtask test`: validates
//! deploy/kubernetes/ offline against Kubernetes' own OpenAPI schemas with
//! PyPI's `kubernetes-validate`, which bundles them (no cluster here, and
//! kubeconform is not packaged). trainbpf/tests/deploy_manifests.rs checks
//! what a schema cannot: the command line against record's CLI, and that
//! the kustomization names every manifest.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, ensure};

use crate::util::{probe, run, target_dir, workspace_root};

/// Pinned, so that a new release's schemas or rules never fail a build
/// that changed nothing here.
const VERSION: &str = "1.37.0";

/// The oldest and newest Kubernetes schemas it bundles: a field the
/// manifests use must exist in both.
const KUBERNETES: &[&str] = &["1.25.0", "1.37.0"];

pub fn validate() -> Result<()> {
    let python = ensure_validator()?;
    let files = manifests(&workspace_root().join("deploy/kubernetes"))?;
    for k8s in KUBERNETES {
        let mut cmd = Command::new(&python);
        cmd.args(["-m", "kubernetes_validate", "--strict", "-k", k8s])
            .args(&files);
        eprintln!("+ kubernetes-validate --strict -k {k8s} deploy/kubernetes/*.yaml");
        let out = cmd.output().context("running kubernetes-validate")?;
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        eprint!("{text}");
        // A kind it has no schema for is only a warning to it, and would
        // pass unchecked.
        ensure!(
            out.status.success() && !text.lines().any(|l| l.starts_with("WARN")),
            "deploy/kubernetes/ does not validate against Kubernetes {k8s}'s schemas ({})",
            out.status
        );
    }
    Ok(())
}

/// The Kubernetes objects: the YAML files beside kustomization.yaml, which
/// has no schema there (trainbpf's test checks it lists them all). The
/// overlays below hold patches, not objects.
fn manifests(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| {
        p.extension().is_some_and(|e| e == "yaml")
            && p.file_name().is_some_and(|n| n != "kustomization.yaml")
    });
    files.sort();
    ensure!(!files.is_empty(), "no manifests in {}", dir.display());
    Ok(files)
}

/// A virtual environment under target/ holding the pinned validator, made
/// once; pip installs from the machine's configured index. Returns its
/// Python.
fn ensure_validator() -> Result<PathBuf> {
    let venv = target_dir()?.join("xtask/kubernetes-validate");
    let python = venv.join("bin/python3");
    let installed = probe(Command::new(&python).args(["-m", "kubernetes_validate", "--version"]));
    if installed.as_deref().map(str::trim) == Some(VERSION) {
        eprintln!("setup: kubernetes-validate {VERSION}: already present");
        return Ok(python);
    }
    eprintln!(
        "setup: installing kubernetes-validate {VERSION} into {}",
        venv.display()
    );
    // --clear: a venv left by another Python, or moved with its target/,
    // has scripts that name an interpreter that is gone.
    run(Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv))
    .context("creating a Python venv (Debian's system Python needs the python3-venv package)")?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet"])
        .arg(format!("kubernetes-validate=={VERSION}")))?;
    Ok(python)
}
