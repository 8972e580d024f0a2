//! `cargo xtask setup`: the eBPF toolchain, installed once, then checked in
//! seconds. aya-build (in trainbpf/build.rs) builds the eBPF crate with the
//! nightly pinned in `.ebpf-toolchain`, which needs rust-src (for
//! `-Z build-std=core`) and a bpf-linker built against that nightly's LLVM;
//! `cargo xtask test` lints the crate with that nightly's clippy.

use std::{
    fs::{self, File},
    io::{self, Read},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, ensure};

use crate::util::{cargo_install, is_root, probe, run, target_dir, workspace_root};

const BPF_LINKER_VERSION: &str = "0.13.0";
const TRACEFS: &str = "/sys/kernel/tracing";

pub fn setup() -> Result<()> {
    let pin = pinned_toolchain()?;
    nightly(&pin)?;
    bpf_linker(&pin)?;
    tracefs();
    Ok(())
}

/// The pinned nightly alone, installed if missing, and its name: what
/// cargo-fuzz needs for its sanitizers; the fuzz target builds no eBPF.
pub fn pinned_nightly() -> Result<String> {
    let pin = pinned_toolchain()?;
    nightly(&pin)?;
    Ok(pin)
}

/// The nightly named in `.ebpf-toolchain`, the one place it is pinned.
pub fn pinned_toolchain() -> Result<String> {
    let path = workspace_root().join(".ebpf-toolchain");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let pin = text.trim();
    ensure!(!pin.is_empty(), "{} is empty", path.display());
    Ok(pin.to_owned())
}

pub fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    // A missing toolchain must fail the checks below, not be installed
    // implicitly without rust-src.
    cmd.env("RUSTUP_AUTO_INSTALL", "0");
    cmd
}

fn nightly(pin: &str) -> Result<()> {
    let sysroot = probe(rustup().args(["run", pin, "rustc", "--print", "sysroot"]));
    match sysroot.map(|s| PathBuf::from(s.trim())) {
        Some(root) if root.join("lib/rustlib/src/rust/library").is_dir() => {
            eprintln!("setup: toolchain {pin} with rust-src: already present");
        }
        Some(_) => {
            run(rustup().args(["component", "add", "rust-src", "--toolchain", pin]))?;
            eprintln!("setup: toolchain {pin}: added rust-src");
        }
        None => {
            run(rustup()
                .args(["toolchain", "install", pin, "--profile", "minimal"])
                .args(["--component", "rust-src", "--component", "clippy"])
                // Installing a toolchain must not replace rustup itself.
                .arg("--no-self-update"))?;
            eprintln!("setup: toolchain {pin} with rust-src and clippy: installed");
            return Ok(());
        }
    }
    // Added on its own for a toolchain installed before the eBPF crate was
    // linted.
    if probe(rustup().args(["run", pin, "cargo-clippy", "--version"])).is_some() {
        eprintln!("setup: clippy for {pin}: already present");
    } else {
        run(rustup().args(["component", "add", "clippy", "--toolchain", pin]))?;
        eprintln!("setup: clippy for {pin}: added");
    }
    Ok(())
}

/// bpf-linker has no rpath to the nightly's libLLVM, so it only runs where
/// `rustup run` puts the toolchain's lib dir on the library path (as
/// aya-build runs it); the check runs it the same way. A bpf-linker linked to
/// another nightly's LLVM fails to load here and is rebuilt.
fn bpf_linker(pin: &str) -> Result<()> {
    let working = || {
        probe(rustup().args(["run", pin, "bpf-linker", "--version"]))
            .is_some_and(|out| out.split_whitespace().nth(1) == Some(BPF_LINKER_VERSION))
    };
    if working() {
        eprintln!("setup: bpf-linker {BPF_LINKER_VERSION} for {pin}: already present");
        return Ok(());
    }

    let major = llvm_major(pin)?;
    let prefix = llvm_prefix(pin)?;
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against {pin}'s LLVM {major} (about a minute)"
    );
    let mut install = cargo_install();
    install
        .args(["bpf-linker", "--version", BPF_LINKER_VERSION, "--locked"])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        // Cargo skips a version it has already installed, even one that no
        // longer loads because its nightly's libLLVM changed or went away.
        .arg("--force")
        .env("LLVM_PREFIX", &prefix);
    run(&mut install)?;
    ensure!(
        working(),
        "bpf-linker was installed but `rustup run {pin} bpf-linker --version` does not \
         report {BPF_LINKER_VERSION}; is another bpf-linker earlier on PATH?"
    );
    eprintln!("setup: bpf-linker {BPF_LINKER_VERSION} for {pin}: installed");
    Ok(())
}

/// "LLVM version: 22.1.4" in `rustc -vV` → 22; bpf-linker's `llvm-<major>`
/// feature must match it.
fn llvm_major(pin: &str) -> Result<u32> {
    let vv = probe(rustup().args(["run", pin, "rustc", "-vV"]))
        .with_context(|| format!("`rustup run {pin} rustc -vV` failed"))?;
    let version = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))
        .context("no \"LLVM version\" in `rustc -vV`")?;
    let major = version.trim().split('.').next().unwrap_or_default();
    major
        .parse()
        .with_context(|| format!("bad LLVM version {version:?}"))
}

/// A directory whose `lib/libLLVM.so` is the nightly's own libLLVM, to give
/// bpf-linker's build as LLVM_PREFIX: distributions rarely ship the LLVM a
/// nightly uses, and linking to the nightly's copy keeps the two in step.
fn llvm_prefix(pin: &str) -> Result<PathBuf> {
    let sysroot = probe(rustup().args(["run", pin, "rustc", "--print", "sysroot"]))
        .with_context(|| format!("`rustup run {pin} rustc --print sysroot` failed"))?;
    let libdir = Path::new(sysroot.trim()).join("lib");
    let libllvm = find_libllvm(&libdir)?;

    let prefix = target_dir()?.join("xtask").join(format!("llvm-{pin}"));
    let link = prefix.join("lib/libLLVM.so");
    fs::create_dir_all(prefix.join("lib"))?;
    match fs::remove_file(&link) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    symlink(&libllvm, &link)
        .with_context(|| format!("linking {} to {}", link.display(), libllvm.display()))?;
    Ok(prefix)
}

/// The shared object itself (`libLLVM.so.22.1-rust-1.97.0-nightly`), not the
/// `libLLVM-22-….so` next to it, which is a linker script.
fn find_libllvm(libdir: &Path) -> Result<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(libdir).with_context(|| format!("reading {}", libdir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("libLLVM") && name.contains(".so") && is_elf(&path) {
            found.push(path);
        }
    }
    found.sort();
    found
        .pop()
        .with_context(|| format!("no libLLVM shared object in {}", libdir.display()))
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// Tracepoints are attached through tracefs, which some machines do not
/// mount at boot. Not fatal: only recording needs it, and says so itself.
fn tracefs() {
    let mounted = fs::read_to_string("/proc/mounts").is_ok_and(|mounts| {
        mounts.lines().any(|l| {
            let f: Vec<_> = l.split_whitespace().collect();
            f.get(1) == Some(&TRACEFS) && f.get(2) == Some(&"tracefs")
        })
    });
    if mounted {
        eprintln!("setup: tracefs at {TRACEFS}: already mounted");
    } else if !is_root() {
        eprintln!("setup: tracefs at {TRACEFS}: not mounted, and mounting needs root; skipped");
    } else {
        let mount = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", TRACEFS])
            .status();
        match mount {
            Ok(s) if s.success() => eprintln!("setup: tracefs at {TRACEFS}: mounted"),
            Ok(s) => eprintln!("setup: tracefs at {TRACEFS}: mount failed ({s}); continuing"),
            Err(e) => eprintln!("setup: tracefs at {TRACEFS}: cannot run mount ({e}); continuing"),
        }
    }
}
