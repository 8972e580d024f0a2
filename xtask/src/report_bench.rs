//! `cargo xtask gen-recording` and `cargo xtask bench-report`: a large
//! synthetic recording made with the real writer, and what `trainbpf report`
//! costs on it (wall time and peak RSS). Also the headless browser the HTML
//! report's test renders pages with.
//!
//! The generator is an example of the trainbpf crate
//! (`trainbpf/examples/gen_recording.rs`), not code here: it needs
//! trainbpf's writer and structs, and building trainbpf builds the eBPF
//! object, which needs the toolchain `setup` installs. xtask itself must
//! build without it, so it runs the example through cargo after `setup`.

use std::{
    ffi::OsString,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    setup::setup,
    util::{cargo, probe, run, target_dir},
};

pub struct GenOptions {
    pub hours: f64,
    pub procs: usize,
    pub batch_mib: u32,
    pub output: PathBuf,
}

/// Builds the generator (release) and runs it.
pub fn gen_recording(o: &GenOptions) -> Result<()> {
    setup()?;
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "--release", "-p", "trainbpf"])
        .args(["--example", "gen_recording", "--"])
        .args(["--hours", &o.hours.to_string()])
        .args(["--procs", &o.procs.to_string()])
        .args(["--batch-mib", &o.batch_mib.to_string()])
        .arg("-o")
        .arg(absolute(&o.output)?);
    run(&mut cmd)
}

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

/// One timed run of a command: wall seconds and the child's peak RSS.
struct Measured {
    secs: f64,
    max_rss_kb: u64,
}

/// Runs `cmd` with its stdout discarded and reaps it with wait4(2), whose
/// rusage gives the child's own peak resident set (`ru_maxrss`, kB).
fn measure(cmd: &mut Command) -> Result<Measured> {
    let start = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data, filled in by wait4.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; `child` is not waited on elsewhere
    // (dropping a std Child does not reap it).
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let secs = start.elapsed().as_secs_f64();
    ensure!(r == pid, "wait4: {}", std::io::Error::last_os_error());
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed (wait status {status})"
    );
    Ok(Measured {
        secs,
        max_rss_kb: ru.ru_maxrss as u64,
    })
}

pub struct BenchOptions {
    pub hours: f64,
    pub procs: usize,
    pub runs: usize,
}

/// Generates the recordings (the default workload, and a heavier one with
/// 128 MiB batches for headroom), then times `report` on each: text, JSON,
/// and the HTML and Perfetto files. Writes target/bench-report/results.md.
pub fn bench_report(o: &BenchOptions) -> Result<()> {
    ensure!(o.runs >= 1, "--runs must be at least 1");
    setup()?;
    run(cargo()
        .args(["build", "--release", "-p", "trainbpf"])
        .args(["--bin", "trainbpf", "--example", "gen_recording"]))?;
    let target = target_dir()?;
    let bin = target.join("release/trainbpf");
    let gen_bin = target.join("release/examples/gen_recording");
    let dir = target.join("bench-report");
    fs::create_dir_all(&dir)?;

    let mut md = String::new();
    let _ = writeln!(
        md,
        "Machine: {} CPUs, {}; kernel {}; trainbpf {} (release).\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_total().unwrap_or_else(|| "memory unknown".into()),
        probe(Command::new("uname").arg("-r"))
            .unwrap_or_default()
            .trim(),
        source_state(),
    );
    let _ = writeln!(
        md,
        "| workload | file | memory records (per second) | report | wall (median of {}) | peak RSS (max) |\n|---|---|---|---|---|---|",
        o.runs
    );
    for (label, batch) in [("default", 24u32), ("heavy (128 MiB batches)", 128)] {
        let rec = dir.join(format!("{}h-{}p-{batch}m.rec", o.hours, o.procs));
        eprintln!("bench-report: generating {} ({label})", rec.display());
        let out = Command::new(&gen_bin)
            .args(["--hours", &o.hours.to_string()])
            .args(["--procs", &o.procs.to_string()])
            .args(["--batch-mib", &batch.to_string()])
            .arg("-o")
            .arg(&rec)
            .output()
            .context("running gen_recording")?;
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        eprint!("{said}");
        ensure!(out.status.success(), "gen_recording failed");
        let records = said
            .split("; ")
            .find_map(|p| p.split(", ").find(|q| q.contains("memory records")))
            .map(|p| p.trim().replace(" memory records", ""))
            .unwrap_or_default();
        let size = fs::metadata(&rec)?.len();
        let html = dir.join("report.html");
        let trace = dir.join("trace.json");
        let arms: [(&str, Vec<OsString>); 3] = [
            ("text", vec!["--no-color".into()]),
            ("--format json", vec!["--format=json".into()]),
            (
                "--html and --perfetto",
                vec![
                    "--html".into(),
                    html.clone().into(),
                    "--perfetto".into(),
                    trace.clone().into(),
                ],
            ),
        ];
        for (arm, args) in arms {
            let mut runs = Vec::new();
            for _ in 0..o.runs {
                let m = measure(Command::new(&bin).arg("report").arg(&rec).args(&args))?;
                eprintln!(
                    "bench-report: {label}, report {arm}: {:.2} s, {} MB peak RSS",
                    m.secs,
                    m.max_rss_kb / 1024
                );
                runs.push(m);
            }
            let mut secs: Vec<f64> = runs.iter().map(|m| m.secs).collect();
            secs.sort_by(f64::total_cmp);
            let median = secs[secs.len() / 2];
            let rss = runs.iter().map(|m| m.max_rss_kb).max().unwrap_or(0);
            let _ = writeln!(
                md,
                "| {label} | {:.0} MB | {records} | {arm} | {median:.2} s | {:.0} MB |",
                size as f64 / 1e6,
                rss as f64 / 1024.0
            );
        }
    }
    let _ = writeln!(
        md,
        "\nBudget: under 5 s and under 500 MB peak RSS for the default 24-hour, 8-process recording."
    );
    let out = dir.join("results.md");
    fs::write(&out, &md)?;
    println!("{md}");
    eprintln!("bench-report: wrote {}", out.display());
    Ok(())
}

fn mem_total() -> Option<String> {
    let s = fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(format!("{:.0} GiB RAM", kb as f64 / 1024.0 / 1024.0))
}

/// The commit measured, and whether the tree had changes on top of it.
fn source_state() -> String {
    let rev = probe(
        Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .current_dir(crate::util::workspace_root()),
    )
    .map(|s| s.trim().to_string())
    .unwrap_or_else(|| "unknown commit".into());
    let dirty = probe(
        Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no"])
            .current_dir(crate::util::workspace_root()),
    )
    .is_some_and(|s| !s.trim().is_empty());
    if dirty {
        format!("{rev} with local changes")
    } else {
        rev
    }
}

/// Debian's Chromium for the HTML report's browser test, installed when
/// missing; a second or two when it is there already.
pub fn ensure_chromium() -> Result<()> {
    ensure_debian_package(
        "chromium",
        "/usr/bin/chromium",
        "the HTML report's browser test renders with it",
    )
}

/// Debian's Go for `report --pprof`'s test, which reads the profile with
/// `go tool pprof` (tests/e2e/pprof.rs).
pub fn ensure_go() -> Result<()> {
    ensure_debian_package(
        "golang-go",
        "/usr/bin/go",
        "the pprof test reads the profile with `go tool pprof`",
    )
}

/// Debian's Prometheus server for `record --metrics`' test, which scrapes
/// the recorder and queries the kill through its HTTP API
/// (tests/e2e/metrics.rs). Its recommends (exporters) are not needed;
/// the package's service is started by nothing here: the test runs its
/// own server.
pub fn ensure_prometheus() -> Result<()> {
    ensure_debian_package_with(
        "prometheus",
        "/usr/bin/prometheus",
        "the metrics test scrapes the recorder with a real Prometheus",
        &["--no-install-recommends"],
    )
}

/// Installs a Debian package unless `path`, which it provides, is there.
fn ensure_debian_package(package: &str, path: &str, why: &str) -> Result<()> {
    ensure_debian_package_with(package, path, why, &[])
}

/// The same, with more arguments to `apt-get install`. The packages come
/// from wherever the machine's apt sources point.
fn ensure_debian_package_with(package: &str, path: &str, why: &str, extra: &[&str]) -> Result<()> {
    if Path::new(path).exists() {
        eprintln!("setup: {package}: already present");
        return Ok(());
    }
    if !crate::util::is_root() {
        bail!("{why}: run as root, or `apt-get install {package}`");
    }
    eprintln!("setup: installing {package} ({why})");
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    // An image's package lists can be missing or stale: update once, on
    // the first failure.
    let install = || {
        let mut c = apt(&["install", "-y", "-q"]);
        c.args(extra).arg(package);
        c
    };
    if run(&mut install()).is_err() {
        run(&mut apt(&["update", "-q"]))?;
        run(&mut install())?;
    }
    ensure!(
        Path::new(path).exists(),
        "apt-get installed {package} but {path} is missing"
    );
    Ok(())
}
