//! `cargo xtask soak`: the recorder's own memory under a long, busy job.
//!
//! Records a job that keeps the event rate high (processes growing and
//! shrinking their memory, forks, execs) for a warm-up plus the measured
//! span, samples the recorder's VmRSS (with its helper children's, the
//! frames' namer and the CPython reader) every two seconds, fits a
//! least-squares line to the samples after the warm-up, and fails unless the
//! slope is about zero: at most 1 MiB per 10 minutes (over a span shorter
//! than 10 minutes, at most 1 MiB over the span, so that a short CI run
//! still catches a leak without failing on noise). BENCHMARKS.md has the
//! 10-minute figure.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    tasks,
    util::{require_root, target_dir},
};

pub struct Options {
    /// The measured span, after the warm-up.
    pub minutes: f64,
    /// Processes churning memory in the job.
    pub workers: u32,
}

/// The job: `workers` processes each forking a child that touches 5-20 MiB
/// and exits, then allocating, touching and freeing 8-48 MiB themselves, in
/// a loop (each cycle crosses the recorder's 4 MiB threshold several times),
/// one process forking short-lived children, and one spawning `/bin/true`
/// (an exec), until the deadline.
const JOB: &str = r#"
import os, random, sys, time
end = time.time() + float(sys.argv[1])
workers = int(sys.argv[2])

def churn(seed):
    r = random.Random(seed)
    n = 0
    while time.time() < end:
        # A short-lived child that grows (fork, exec-less start, memory
        # records, exit), then the worker itself grows and shrinks.
        pid = os.fork()
        if pid == 0:
            b = b"x" * (r.randint(5, 20) << 20)
            os._exit(0)
        os.waitpid(pid, 0)
        b = b"x" * (r.randint(8, 48) << 20)
        time.sleep(0.005)
        del b
        time.sleep(0.005)
        n += 1
    return n

def forker():
    n = 0
    while time.time() < end:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        n += 1
        time.sleep(0.002)
    return n

def execer():
    n = 0
    while time.time() < end:
        pid = os.posix_spawn("/bin/true", ["true"], os.environ)
        os.waitpid(pid, 0)
        n += 1
        time.sleep(0.05)
    return n

kids = []
for i in range(workers + 2):
    pid = os.fork()
    if pid == 0:
        n = churn(i) if i < workers else (forker() if i == workers else execer())
        print(f"child {i}: {n} cycles", flush=True)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
"#;

const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// The slope allowed, per 10 minutes.
const LIMIT_KB_PER_10MIN: f64 = 1024.0;

pub fn soak(o: &Options) -> Result<()> {
    require_root("soak", "recording needs root")?;
    ensure!(o.minutes > 0.0, "--minutes must be positive");
    let bin = tasks::build()?;
    let dir = target_dir()?.join("soak");
    fs::create_dir_all(&dir)?;
    let rec = dir.join("soak.rec");
    let _ = fs::remove_file(&rec);
    let span_s = o.minutes * 60.0;
    // A minute of warm-up for a long run (the allocator, the kernel's maps
    // and the collector's tables fill); a quarter of a short one.
    let warmup_s = (span_s / 4.0).clamp(5.0, 60.0);
    let job_s = warmup_s + span_s;
    eprintln!(
        "soak: recording a busy job for {:.0} s ({warmup_s:.0} s warm-up, then {span_s:.0} s measured), {} memory-churning processes, a forker and an execer",
        job_s, o.workers
    );
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let started = Instant::now();
    let mut child = Command::new(&bin)
        .arg("record")
        .arg("-o")
        .arg(&rec)
        .args(["--", python, "-c", JOB])
        .arg(format!("{job_s}"))
        .arg(o.workers.to_string())
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    let pid = child.id();
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut csv = String::from("seconds,vmrss_kb,recording_bytes\n");
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        let t = started.elapsed().as_secs_f64();
        // Only while the job runs: the recorder's shutdown is not the soak.
        if t < job_s
            && let Some(kb) = vmrss_kb(pid).map(|own| {
                own + crate::bench::proc::helpers(pid)
                    .into_iter()
                    .filter_map(vmrss_kb)
                    .sum::<u64>()
            })
        {
            samples.push((t, kb));
            let bytes = fs::metadata(&rec).map(|m| m.len()).unwrap_or(0);
            let _ = writeln!(csv, "{t:.1},{kb},{bytes}");
        }
        thread::sleep(SAMPLE_EVERY);
    };
    fs::write(dir.join("rss.csv"), &csv)?;
    ensure!(
        status.success(),
        "trainbpf record (and its job) failed: {status}"
    );
    let measured: Vec<(f64, u64)> = samples
        .iter()
        .copied()
        .filter(|&(t, _)| t >= warmup_s)
        .collect();
    ensure!(
        measured.len() >= 5,
        "only {} RSS samples after the warm-up",
        measured.len()
    );
    let slope = slope_kb_per_s(&measured);
    let per_10min_kb = slope * 600.0;
    // Over a short span, 1 MiB over the span (noise over a minute is not a
    // leak); from 10 minutes on, 1 MiB per 10 minutes.
    let limit_kb = LIMIT_KB_PER_10MIN * (10.0 / o.minutes).max(1.0);
    let (lo, hi) = measured
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &(_, kb)| (lo.min(kb), hi.max(kb)));
    let first = measured[0].1;
    let last = measured[measured.len() - 1].1;
    let rec_bytes = fs::metadata(&rec).map(|m| m.len()).unwrap_or(0);
    let (events, lost) = report_counts(&bin, &rec)?;
    let mib = |kb: f64| kb / 1024.0;
    let summary = format!(
        "soak: {:.1} min measured after {warmup_s:.0} s of warm-up; {events} events recorded ({:.0}/s), {lost} lost, {:.0} MB of recording; recorder VmRSS (its helpers' added) {:.1} MiB at the start of the span, {:.1} MiB at its end (min {:.1}, max {:.1}); slope {:+.3} MiB per 10 min (limit {:.1})",
        span_s / 60.0,
        events as f64 / job_s,
        rec_bytes as f64 / 1e6,
        mib(first as f64),
        mib(last as f64),
        mib(lo as f64),
        mib(hi as f64),
        mib(per_10min_kb),
        mib(limit_kb),
    );
    fs::write(dir.join("summary.txt"), format!("{summary}\n"))?;
    println!("{summary}");
    eprintln!(
        "soak: samples in {}, the recording in {}",
        dir.join("rss.csv").display(),
        rec.display()
    );
    if per_10min_kb > limit_kb {
        bail!(
            "the recorder's RSS grows {:+.2} MiB per 10 min under load (limit {:.1}): a leak",
            mib(per_10min_kb),
            mib(limit_kb)
        );
    }
    // `report` read it above; it is large, and kept only on failure.
    let _ = fs::remove_file(&rec);
    Ok(())
}

fn vmrss_kb(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Slope of kB over seconds: the median of the slopes between every two
/// samples (Theil-Sen). A leak moves every pair; a transient peak (a
/// symbolizer re-reading a library's line tables, freed two seconds
/// later) moves only the pairs that touch it, where a least-squares fit
/// of a one-minute span read one such peak near its end as a leak.
fn slope_kb_per_s(points: &[(f64, u64)]) -> f64 {
    let mut slopes = Vec::new();
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 as f64 - a.1 as f64) / (b.0 - a.0));
            }
        }
    }
    if slopes.is_empty() {
        return 0.0;
    }
    slopes.sort_by(f64::total_cmp);
    let m = slopes.len() / 2;
    if slopes.len() % 2 == 1 {
        slopes[m]
    } else {
        (slopes[m - 1] + slopes[m]) / 2.0
    }
}

/// Events and lost events, from `trainbpf report --format json`.
fn report_counts(bin: &Path, rec: &Path) -> Result<(u64, u64)> {
    let out = Command::new(bin)
        .arg("report")
        .arg(rec)
        .arg("--format=json")
        .stderr(Stdio::inherit())
        .output()
        .context("running trainbpf report")?;
    ensure!(
        out.status.success(),
        "trainbpf report failed on the soak's recording: {}",
        out.status
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok((
        v["recording"]["events"].as_u64().unwrap_or(0),
        v["lost_events"].as_u64().unwrap_or(0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_flat_noise() {
        let line: Vec<(f64, u64)> = (0..50).map(|i| (i as f64 * 2.0, 1000 + i * 4)).collect();
        assert!((slope_kb_per_s(&line) - 2.0).abs() < 1e-9);
        let flat: Vec<(f64, u64)> = (0..50)
            .map(|i| (i as f64 * 2.0, if i % 2 == 0 { 1000 } else { 1010 }))
            .collect();
        assert!(slope_kb_per_s(&flat).abs() < 0.1);
        // Flat with a transient peak near its end: flat.
        let mut peak: Vec<(f64, u64)> = (0..30).map(|i| (i as f64 * 2.0, 84_000)).collect();
        peak[27].1 = 88_000;
        assert!(
            slope_kb_per_s(&peak).abs() < 1.0,
            "{}",
            slope_kb_per_s(&peak)
        );
        // A leak under noise is still a leak.
        let leak: Vec<(f64, u64)> = (0..30)
            .map(|i| {
                (
                    i as f64 * 2.0,
                    80_000 + i * 40 + if i % 3 == 0 { 500 } else { 0 },
                )
            })
            .collect();
        assert!(
            (slope_kb_per_s(&leak) - 20.0).abs() < 2.0,
            "{}",
            slope_kb_per_s(&leak)
        );
    }
}
