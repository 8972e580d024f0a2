//! `cargo xtask fuzz`: the recording decoder under libFuzzer (cargo-fuzz),
//! for a given time. Installs what it needs: the pinned nightly and
//! cargo-fuzz. docs/fuzzing.md.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    setup::pinned_nightly,
    util::{cargo, probe, run, workspace_root},
};

const CARGO_FUZZ_VERSION: &str = "0.13.2";
const TARGET: &str = "recording";

pub struct Options {
    pub seconds: u64,
}

pub fn fuzz(o: &Options) -> Result<()> {
    ensure!(o.seconds > 0, "--seconds must be at least 1");
    // The fuzz target links trainbpf-report alone: no eBPF object, so no
    // bpf-linker; the nightly is for libFuzzer's sanitizers.
    let pin = pinned_nightly()?;
    cargo_fuzz()?;
    let root = workspace_root();
    let corpus = root.join("fuzz/corpus").join(TARGET);
    let artifacts = root.join("fuzz/artifacts").join(TARGET);
    std::fs::create_dir_all(&artifacts)?;
    run(cargo()
        .args([
            "run",
            "--quiet",
            "--package",
            "trainbpf-report",
            "--example",
            "fuzz_seeds",
            "--",
        ])
        .arg(&corpus))?;

    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        // cargo-fuzz's nested cargo builds inherit the toolchain from here.
        .env("RUSTUP_TOOLCHAIN", &pin)
        .args(["fuzz", "run", TARGET])
        .arg(&corpus)
        .args(["--", &format!("-max_total_time={}", o.seconds)])
        // No single allocation may reach 64 MiB (the reader holds at most
        // 1.25 frames of 16 MiB), and the whole process stays under 2 GiB.
        .args(["-malloc_limit_mb=64", "-rss_limit_mb=2048", "-timeout=10"])
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!(
        "+ RUSTUP_TOOLCHAIN={pin} cargo fuzz run {TARGET} {} -- -max_total_time={} ...",
        corpus.display(),
        o.seconds
    );
    let started = Instant::now();
    let mut child = cmd.spawn().context("cannot run `cargo fuzz`")?;
    let stderr = child.stderr.take().expect("piped");
    let mut execs: Option<u64> = None;
    let mut last_status = String::new();
    for line in BufReader::new(stderr).lines() {
        let line = line?;
        // The final stats: "stat::number_of_executed_units: 123456".
        if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
            execs = n.trim().parse().ok();
        }
        // Progress lines ("#1234 NEW cov: ... exec/s: ...") are many: show
        // the pulses (at powers of two) and the end, and everything else.
        let progress = line.starts_with('#') && line.contains(" exec/s: ");
        if progress {
            last_status = line.clone();
        }
        if !progress || line.contains("pulse") || line.contains("DONE") {
            eprintln!("{line}");
        }
    }
    let status = child.wait()?;
    let secs = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "the fuzzer failed ({status}); the input that broke it is under {} (docs/fuzzing.md says how to replay it)",
            artifacts.display()
        );
    }
    let execs = execs.context("the fuzzer printed no final stats")?;
    let corpus_len = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
    eprintln!("{last_status}");
    println!(
        "fuzz: {execs} executions of `{TARGET}` in {:.0} s of fuzzing ({:.0}/s), {corpus_len} inputs in the corpus, no crash, no leak, no allocation over 64 MiB",
        o.seconds,
        execs as f64 / o.seconds as f64
    );
    eprintln!("fuzz: {secs:.0} s in all, the build included");
    Ok(())
}

/// cargo-fuzz, installed once from crates.io at a fixed version.
fn cargo_fuzz() -> Result<()> {
    let have = probe(Command::new("cargo").args(["fuzz", "--version"]));
    if have
        .as_deref()
        .is_some_and(|v| v.split_whitespace().nth(1) == Some(CARGO_FUZZ_VERSION))
    {
        eprintln!("fuzz: cargo-fuzz {CARGO_FUZZ_VERSION}: already present");
        return Ok(());
    }
    run(Command::new("cargo").args([
        "install",
        "cargo-fuzz",
        "--locked",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))?;
    Ok(())
}
