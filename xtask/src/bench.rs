//! `cargo xtask bench`: what watching a job costs the job (issue 5).
//!
//! Workloads (xtask/bench/workload.c, built with gcc here) time their own
//! work and print it, so a tool's start-up and shutdown stay out of the
//! figure. Each workload runs under each tool in turn, round after round
//! (A B C D A B C D ...), so that a slow spell of the machine hits every arm
//! alike; the table gives medians, and ratios to the untraced median of the
//! same run. While a tool runs, its process is sampled from /proc for CPU
//! and RSS.
//!
//! Tools: `trainbpf record`, a bpftrace script doing the nearest equivalent
//! work (a fault count per process in a kernel map, plus `oom:mark_victim`),
//! and `perf record -e exceptions:page_fault_user`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    setup::setup,
    tasks,
    util::{cargo, probe, require_root, run, status, target_dir, workspace_root},
};

pub struct Options {
    /// A few seconds in all: proves every tool still runs; figures mean nothing.
    pub smoke: bool,
    /// Runs of each arm; default 5 (1 with `smoke`).
    pub runs: Option<usize>,
    /// Length of one W4 run, seconds; default 180 (2 with `smoke`).
    pub w4_secs: Option<u64>,
}

/// Where tools write their recordings; removed after each run, so that the
/// writeback of a big perf.data cannot slow the arm that follows it.
const SCRATCH: &str = "/tmp/trainbpf-bench";

/// The nearest bpftrace equivalent of trainbpf's probes: a fault count per
/// process kept in a kernel map (trainbpf adds to a per-process map entry
/// on `exceptions:page_fault_user` too), and the OOM victim.
const BPFTRACE_PROG: &str = "tracepoint:exceptions:page_fault_user { @faults[pid] = count(); }
tracepoint:oom:mark_victim { printf(\"oom victim %d\\n\", args->pid); }";

/// How often a tool's CPU and RSS are read from /proc.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tool {
    Untraced,
    Trainbpf,
    Bpftrace,
    Perf,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Untraced => "untraced",
            Tool::Trainbpf => "trainbpf record",
            Tool::Bpftrace => "bpftrace",
            Tool::Perf => "perf record",
        }
    }
}

/// What the ratio compares: the whole run (W1, W3) or the median step (W4).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Metric {
    Elapsed,
    StepMedian,
}

struct Workload {
    /// W1-1, W1-N, W3, W4: the key the targets refer to.
    id: &'static str,
    title: String,
    args: Vec<String>,
    metric: Metric,
    tools: Vec<Tool>,
}

/// What the workload printed: `key=value` pairs, and when the line came,
/// which is when the job's work ended.
struct JobResult {
    values: BTreeMap<String, f64>,
    at: Instant,
}

impl JobResult {
    fn get(&self, key: &str) -> Result<f64> {
        self.values
            .get(key)
            .copied()
            .with_context(|| format!("the workload printed no {key}="))
    }
}

/// One run of one arm.
struct Sample {
    /// The figure the ratio compares, seconds.
    metric_s: f64,
    /// The workload's own run time, seconds: the denominator of rates.
    elapsed_s: f64,
    events: Option<u64>,
    lost: Option<u64>,
    bytes: Option<u64>,
    usage: Option<Usage>,
}

/// A tool process's CPU and memory while it watched the job.
#[derive(Clone, Copy)]
struct Usage {
    /// CPU while the job ran (from attach to the job's result), share of one core.
    cpu_frac: f64,
    /// CPU over the tool's whole life, start-up and shutdown included, seconds.
    cpu_total_s: f64,
    /// VmHWM: the most the tool ever held, start-up included.
    peak_rss_kb: u64,
    /// The most it held while the job ran.
    job_rss_kb: u64,
    /// RSS growth from a tenth of the way into the job to its end: a leak
    /// shows here, the one-off touch of the ring buffer's pages does not.
    rss_growth_kb: i64,
}

pub fn bench(opts: Options) -> Result<()> {
    require_root("bench", "tracing the workloads needs root")?;
    let runs = opts.runs.unwrap_or(if opts.smoke { 1 } else { 5 });
    ensure!(runs >= 1, "--runs must be at least 1");
    let w4_secs = opts.w4_secs.unwrap_or(if opts.smoke { 2 } else { 180 });

    // The smoke run takes the debug build that `cargo xtask test` made: a
    // release build would cost CI a minute, for figures nobody reads.
    let bin = if opts.smoke {
        tasks::build()?
    } else {
        setup()?;
        run(cargo().args(["build", "--release", "--package", "trainbpf"]))?;
        target_dir()?.join("release/trainbpf")
    };
    let out_dir = target_dir()?.join("bench");
    fs::create_dir_all(&out_dir)?;
    // A copy, so that a rebuild during a long run cannot swap the recorder
    // between arms.
    let pinned = out_dir.join("trainbpf");
    fs::copy(&bin, &pinned).with_context(|| format!("copying {}", bin.display()))?;
    let bin = pinned;
    let source = source_state();
    let workload = build_workload(&out_dir)?;
    fs::create_dir_all(SCRATCH)?;

    let mut tools = vec![Tool::Untraced, Tool::Trainbpf];
    let mut notes = Vec::new();
    match ensure_bpftrace() {
        Ok(()) => tools.push(Tool::Bpftrace),
        Err(why) => notes.push(format!("bpftrace skipped: {why}")),
    }
    match probe(Command::new("perf").arg("--version")) {
        Some(_) => tools.push(Tool::Perf),
        None => notes.push("perf record skipped: no `perf` on PATH".to_string()),
    }
    for n in &notes {
        eprintln!("bench: {n}");
    }

    let ctx = Ctx {
        bin,
        workload,
        clk_tck: clock_ticks(),
    };
    let nproc = thread::available_parallelism().map_or(1, |n| n.get());
    let plan = plan(opts.smoke, nproc, w4_secs, &tools);
    let load_before = loadavg();
    let started = Instant::now();
    let mut results = Vec::new();
    for w in &plan {
        let mut samples: BTreeMap<Tool, Vec<Sample>> = BTreeMap::new();
        for round in 1..=runs {
            for &tool in &w.tools {
                eprintln!(
                    "bench: {} under {}, run {round}/{runs}",
                    w.title,
                    tool.name()
                );
                let s = ctx
                    .run_arm(tool, w)
                    .with_context(|| format!("{} under {} (run {round})", w.title, tool.name()))?;
                eprintln!("bench:   {:.4} s", s.metric_s);
                samples.entry(tool).or_default().push(s);
            }
        }
        results.push((w, samples));
    }

    let md = render(&RunInfo {
        smoke: opts.smoke,
        runs,
        nproc,
        w4_secs,
        minutes: started.elapsed().as_secs_f64() / 60.0,
        load_before,
        load_after: loadavg(),
        source,
        notes,
        results: &results,
    });
    let path = out_dir.join("results.md");
    fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    eprintln!("bench: written to {}", path.display());
    Ok(())
}

/// What each workload runs: a fixed amount of work, so the time is the figure.
fn plan(smoke: bool, nproc: usize, w4_secs: u64, tools: &[Tool]) -> Vec<Workload> {
    // 64 MiB a pass: 16,384 faults. 100 passes is about 2.5 s on one core
    // here, long enough that a tool's attach jitter is noise.
    let passes = if smoke { 4 } else { 100 };
    let forks = if smoke { 16 } else { 200 };
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        Workload {
            id: "W1-1",
            title: "W1 fault storm, 1 thread".into(),
            args: s(&["faults", "1", &passes.to_string(), "64"]),
            metric: Metric::Elapsed,
            tools: tools.to_vec(),
        },
        Workload {
            id: "W1-N",
            title: format!("W1 fault storm, {nproc} threads"),
            args: s(&["faults", &nproc.to_string(), &passes.to_string(), "64"]),
            metric: Metric::Elapsed,
            tools: tools.to_vec(),
        },
        Workload {
            id: "W3",
            title: format!("W3 fork storm, {forks} workers x 16 MiB"),
            args: s(&["forks", &forks.to_string(), "16", &nproc.to_string()]),
            metric: Metric::Elapsed,
            tools: tools.to_vec(),
        },
        // bpftrace and perf are left out of W4: their W1 figures compare the
        // tools already, and each arm of W4 costs minutes.
        Workload {
            id: "W4",
            title: format!("W4 steady job, {w4_secs} s (step time)"),
            args: s(&["steady", &w4_secs.to_string()]),
            metric: Metric::StepMedian,
            tools: tools
                .iter()
                .copied()
                .filter(|t| matches!(t, Tool::Untraced | Tool::Trainbpf))
                .collect(),
        },
    ]
}

fn build_workload(out_dir: &Path) -> Result<PathBuf> {
    let src = workspace_root().join("xtask/bench/workload.c");
    let exe = out_dir.join("workload");
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src))
    .context("building the bench workload needs gcc")?;
    Ok(exe)
}

/// bpftrace is a comparison, not a dependency: install it when missing, and
/// say why when that fails rather than fail the bench.
fn ensure_bpftrace() -> Result<(), String> {
    if probe(Command::new("bpftrace").arg("--version")).is_some() {
        return Ok(());
    }
    eprintln!("bench: bpftrace missing; installing it");
    let installed = status(
        Command::new("apt-get")
            .args(["install", "-y", "bpftrace"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    );
    match installed {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("`apt-get install -y bpftrace` failed ({s})")),
        Err(e) => return Err(format!("{e:#}")),
    }
    probe(Command::new("bpftrace").arg("--version"))
        .map(|_| ())
        .ok_or_else(|| "bpftrace still does not run after installing it".to_string())
}

/// The commit trainbpf was built from, and whether its sources had
/// uncommitted changes: a figure is only worth what it was measured on.
fn source_state() -> String {
    let git = |args: &[&str]| probe(Command::new("git").args(args).current_dir(workspace_root()));
    let Some(rev) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "an unknown commit".into();
    };
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "trainbpf",
        "trainbpf-ebpf",
        "trainbpf-common",
    ])
    .is_some_and(|s| !s.trim().is_empty());
    format!(
        "commit {}{}",
        rev.trim(),
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    )
}

fn clock_ticks() -> f64 {
    probe(Command::new("getconf").arg("CLK_TCK"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

struct Ctx {
    bin: PathBuf,
    workload: PathBuf,
    clk_tck: f64,
}

impl Ctx {
    fn workload_cmd(&self, w: &Workload) -> Command {
        let mut cmd = Command::new(&self.workload);
        cmd.args(&w.args);
        cmd
    }

    fn run_arm(&self, tool: Tool, w: &Workload) -> Result<Sample> {
        match tool {
            Tool::Untraced => {
                let job = Watched::spawn(&mut self.workload_cmd(w), false)?.finish()?;
                job.check("the workload")?;
                let r = job.result()?;
                sample(w, &r, None, None, None, None)
            }
            Tool::Trainbpf => self.trainbpf(w),
            Tool::Bpftrace => self.bpftrace(w),
            Tool::Perf => self.perf(w),
        }
    }

    fn trainbpf(&self, w: &Workload) -> Result<Sample> {
        let rec = Path::new(SCRATCH).join("bench.rec");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["record", "-o"])
            .arg(&rec)
            .arg("--")
            .arg(&self.workload)
            .args(&w.args);
        let mut p = Watched::spawn(&mut cmd, true)?;
        // Printed once the probes are attached, just before the job starts.
        let ready = p.wait_for("trainbpf: recording to", Duration::from_secs(60))?;
        let done = p.finish()?;
        done.check("trainbpf record")?;
        let r = done.result()?;
        let usage = done.usage(ready, r.at, self.clk_tck);

        let events = Command::new(&self.bin)
            .args(["report", "--events"])
            .arg(&rec)
            .output()?;
        ensure!(
            events.status.success(),
            "trainbpf report --events failed: {}",
            String::from_utf8_lossy(&events.stderr)
        );
        let events = events.stdout.iter().filter(|&&b| b == b'\n').count() as u64;
        let json = Command::new(&self.bin)
            .args(["report", "--json"])
            .arg(&rec)
            .output()?;
        ensure!(
            json.status.success(),
            "trainbpf report --json failed: {}",
            String::from_utf8_lossy(&json.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&json.stdout)?;
        let lost = json["lost_events"]
            .as_u64()
            .context("trainbpf report --json has no lost_events")?;
        let bytes = fs::metadata(&rec)?.len();
        fs::remove_file(&rec)?;
        sample(w, &r, Some(events), Some(lost), Some(bytes), Some(usage))
    }

    fn bpftrace(&self, w: &Workload) -> Result<Sample> {
        let mut bt = Watched::spawn(Command::new("bpftrace").args(["-e", BPFTRACE_PROG]), true)?;
        // bpftrace compiles the script first (a second or two of CPU); the job
        // starts once it says the probes are attached.
        let ready = bt.wait_for("Attaching", Duration::from_secs(120))?;
        let job = Watched::spawn(&mut self.workload_cmd(w), false)?.finish()?;
        let bt_pid = bt.child.id();
        // SIGINT: bpftrace detaches and prints its maps, like Ctrl-C.
        run(Command::new("kill").args(["-INT", &bt_pid.to_string()]))?;
        let done = bt.finish()?;
        // Checked after bpftrace is stopped, so a failed job leaves no
        // bpftrace behind.
        job.check("the workload")?;
        done.check("bpftrace")?;
        let r = job.result()?;
        let usage = done.usage(ready, r.at, self.clk_tck);

        // `@faults[PID]: N`, one line per process seen.
        let events = done
            .lines
            .iter()
            .filter(|l| !l.err && l.text.starts_with("@faults["))
            .filter_map(|l| l.text.rsplit_once(": ")?.1.trim().parse::<u64>().ok())
            .sum();
        // Lost: none to count. A map count has no buffer to overflow.
        sample(w, &r, Some(events), None, None, Some(usage))
    }

    fn perf(&self, w: &Workload) -> Result<Sample> {
        let data = Path::new(SCRATCH).join("perf.data");
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-e", "exceptions:page_fault_user", "-o"])
            .arg(&data)
            .arg("--")
            .arg(&self.workload)
            .args(&w.args);
        let ready = Instant::now();
        let done = Watched::spawn(&mut cmd, true)?.finish()?;
        done.check("perf record")?;
        let r = done.result()?;
        let usage = done.usage(ready, r.at, self.clk_tck);
        // `[ perf record: Captured and wrote 85.1 MB perf.data (1000000 samples) ]`
        let samples = done
            .lines
            .iter()
            .filter(|l| l.err)
            .find_map(|l| {
                let (_, tail) = l.text.rsplit_once('(')?;
                tail.split_once(" samples)")?.0.parse::<u64>().ok()
            })
            .with_context(|| {
                format!(
                    "perf record printed no sample count:\n{}",
                    text(&done.lines)
                )
            })?;
        // perf's own loss counter missed most of what vanished in trials here
        // (1,549 reported lost, a million faults absent), so the job's own
        // fault count is the reference.
        let lost = missing(&r, samples)?;
        let bytes = fs::metadata(&data)?.len();
        fs::remove_file(&data)?;
        sample(w, &r, Some(samples), Some(lost), Some(bytes), Some(usage))
    }
}

/// Faults the job took (its own getrusage count) that a tool did not see.
fn missing(r: &JobResult, seen: u64) -> Result<u64> {
    Ok((r.get("minflt")? as u64).saturating_sub(seen))
}

fn sample(
    w: &Workload,
    r: &JobResult,
    events: Option<u64>,
    lost: Option<u64>,
    bytes: Option<u64>,
    usage: Option<Usage>,
) -> Result<Sample> {
    let elapsed_s = r.get("elapsed_s")?;
    let metric_s = match w.metric {
        Metric::Elapsed => elapsed_s,
        Metric::StepMedian => r.get("step_median_s")?,
    };
    Ok(Sample {
        metric_s,
        elapsed_s,
        events,
        lost,
        bytes,
        usage,
    })
}

// ------------------------------------------------------------- processes

struct Line {
    at: Instant,
    err: bool,
    text: String,
}

/// A child whose stdout and stderr lines are timestamped as they come, and
/// whose CPU and RSS are sampled while it runs.
struct Watched {
    child: Child,
    lines: mpsc::Receiver<Line>,
    seen: Vec<Line>,
    sampler: Option<Sampler>,
}

struct Finished {
    status: ExitStatus,
    lines: Vec<Line>,
    samples: Vec<ProcSample>,
}

impl Watched {
    fn spawn(cmd: &mut Command, sample: bool) -> Result<Watched> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        forward_lines(out, false, tx.clone());
        forward_lines(err, true, tx);
        let sampler = sample.then(|| Sampler::start(child.id()));
        Ok(Watched {
            child,
            lines,
            seen: Vec::new(),
            sampler,
        })
    }

    /// Waits for a line containing `needle`; fails if the process closes
    /// its output (exits) first, or on timeout.
    fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.text.contains(needle);
                    let at = l.at;
                    self.seen.push(l);
                    if hit {
                        return Ok(at);
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    bail!(
                        "no {needle:?} from {:?} ({}); it printed:\n{}",
                        self.child,
                        if e == mpsc::RecvTimeoutError::Timeout {
                            "timed out"
                        } else {
                            "it exited"
                        },
                        text(&self.seen)
                    );
                }
            }
        }
    }

    fn finish(mut self) -> Result<Finished> {
        // Ends when both pipes are closed: the process and whatever it ran
        // are done writing.
        self.seen.extend(self.lines.iter());
        let status = self.child.wait()?;
        let samples = self.sampler.map(Sampler::finish).unwrap_or_default();
        Ok(Finished {
            status,
            lines: self.seen,
            samples,
        })
    }
}

fn forward_lines(pipe: impl Read + Send + 'static, err: bool, tx: mpsc::Sender<Line>) {
    thread::spawn(move || {
        let mut pipe = BufReader::new(pipe);
        let mut buf = Vec::new();
        // Bytes, not `lines()`: one line that isn't UTF-8 must not end the
        // reading, or the lines after it (perf's summary) would be lost.
        while matches!(pipe.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = Line {
                at: Instant::now(),
                err,
                text: String::from_utf8_lossy(&buf).trim_end().to_string(),
            };
            buf.clear();
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

fn text(lines: &[Line]) -> String {
    lines.iter().map(|l| format!("  {}\n", l.text)).collect()
}

impl Finished {
    fn check(&self, what: &str) -> Result<()> {
        ensure!(
            self.status.success(),
            "{what} failed ({}); it printed:\n{}",
            self.status,
            text(&self.lines)
        );
        Ok(())
    }

    /// The workload's `elapsed_s=... ` line.
    fn result(&self) -> Result<JobResult> {
        let line = self
            .lines
            .iter()
            .rev()
            .find(|l| !l.err && l.text.starts_with("elapsed_s="))
            .with_context(|| format!("the workload printed no result:\n{}", text(&self.lines)))?;
        let values = line
            .text
            .split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect();
        Ok(JobResult {
            values,
            at: line.at,
        })
    }

    /// CPU and RSS while the job ran: samples from `from` (the tool attached)
    /// to `to` (the job printed its result).
    fn usage(&self, from: Instant, to: Instant, clk_tck: f64) -> Usage {
        let all = &self.samples;
        let window: Vec<&ProcSample> = all.iter().filter(|s| s.at >= from && s.at <= to).collect();
        let cpu_frac = match (window.first(), window.last()) {
            (Some(a), Some(b)) if b.at > a.at => {
                (b.cpu_ticks - a.cpu_ticks) as f64 / clk_tck / (b.at - a.at).as_secs_f64()
            }
            _ => 0.0,
        };
        let rss_growth_kb = match window.last() {
            Some(last) => last.rss_kb as i64 - window[window.len() / 10].rss_kb as i64,
            None => 0,
        };
        Usage {
            cpu_frac,
            cpu_total_s: all.last().map_or(0.0, |s| s.cpu_ticks as f64 / clk_tck),
            peak_rss_kb: all.iter().map(|s| s.hwm_kb).max().unwrap_or(0),
            job_rss_kb: window.iter().map(|s| s.rss_kb).max().unwrap_or(0),
            rss_growth_kb,
        }
    }
}

struct ProcSample {
    at: Instant,
    /// utime + stime, clock ticks.
    cpu_ticks: u64,
    rss_kb: u64,
    /// VmHWM: the peak RSS so far.
    hwm_kb: u64,
}

/// Reads a process's CPU and memory from /proc every [`SAMPLE_EVERY`] until
/// it is gone or told to stop.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Vec<ProcSample>>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                // None once the process has exited: a zombie has no VmRSS.
                let Some(s) = read_proc(pid) else { break };
                out.push(s);
                thread::sleep(SAMPLE_EVERY);
            }
            out
        });
        Sampler { stop, handle }
    }

    fn finish(self) -> Vec<ProcSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

fn read_proc(pid: u32) -> Option<ProcSample> {
    let at = Instant::now();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`, which may itself hold spaces: state is
    // field 3, utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let cpu_ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> Option<u64> {
        let v = status.lines().find_map(|l| l.strip_prefix(key))?;
        v.split_whitespace().next()?.parse().ok()
    };
    Some(ProcSample {
        at,
        cpu_ticks,
        rss_kb: kb("VmRSS:")?,
        hwm_kb: kb("VmHWM:")?,
    })
}

// ---------------------------------------------------------------- report

struct RunInfo<'a> {
    smoke: bool,
    runs: usize,
    nproc: usize,
    w4_secs: u64,
    minutes: f64,
    load_before: String,
    load_after: String,
    source: String,
    notes: Vec<String>,
    results: &'a [(&'a Workload, BTreeMap<Tool, Vec<Sample>>)],
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Medians of one arm's runs; the figures the table and the targets read.
struct Summary {
    metric_s: f64,
    ratio: f64,
    events_per_s: Option<f64>,
    lost: Option<u64>,
    cpu_frac: Option<f64>,
    cpu_total_s: Option<f64>,
    peak_rss_kb: Option<u64>,
    job_rss_kb: Option<u64>,
    rss_growth_kb: Option<i64>,
    bytes_per_min: Option<f64>,
}

fn summarize(samples: &[Sample], baseline: f64) -> Summary {
    let med = |f: &dyn Fn(&Sample) -> Option<f64>| median(samples.iter().filter_map(f).collect());
    let metric_s = med(&|s| Some(s.metric_s)).unwrap_or(0.0);
    let usage = |f: fn(&Usage) -> f64| med(&|s: &Sample| s.usage.as_ref().map(f));
    Summary {
        metric_s,
        ratio: metric_s / baseline,
        events_per_s: med(&|s| Some(s.events? as f64 / s.elapsed_s)),
        // Summed, not a median: one run that lost events is worth seeing.
        lost: samples.iter().map(|s| s.lost).sum(),
        cpu_frac: usage(|u| u.cpu_frac),
        cpu_total_s: usage(|u| u.cpu_total_s),
        // The worst run, for the memory ceiling and for growth.
        peak_rss_kb: worst(samples, |u| u.peak_rss_kb),
        job_rss_kb: worst(samples, |u| u.job_rss_kb),
        rss_growth_kb: worst(samples, |u| u.rss_growth_kb),
        bytes_per_min: med(&|s| Some(s.bytes? as f64 / s.elapsed_s * 60.0)),
    }
}

fn worst<T: Ord>(samples: &[Sample], f: fn(&Usage) -> T) -> Option<T> {
    samples.iter().filter_map(|s| s.usage.as_ref().map(f)).max()
}

fn or_dash<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "–".into())
}

fn fmt_time(s: f64) -> String {
    if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// Thousands separated by commas, for event rates in the hundreds of thousands.
fn fmt_count(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mb(bytes: f64) -> String {
    format!("{:.2} MB", bytes / 1e6)
}

/// /proc's kB are KiB.
fn kb(kib: u64) -> String {
    mb(kib as f64 * 1024.0)
}

fn kb_signed(kib: i64) -> String {
    format!("{:+.2} MB", kib as f64 * 1024.0 / 1e6)
}

fn render(info: &RunInfo) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "# trainbpf overhead benchmark{}\n",
        if info.smoke {
            " (smoke run: figures are meaningless)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        w,
        "runs per arm: {}, interleaved; medians; ratio to the untraced median of this run. \
         {} CPUs; W4 runs {} s each; took {:.1} min; load average {} before, {} after. \
         trainbpf from {}. MB = 10^6 bytes.\n",
        info.runs,
        info.nproc,
        info.w4_secs,
        info.minutes,
        info.load_before,
        info.load_after,
        info.source
    );
    let _ = writeln!(
        w,
        "| workload | tool | median time | ratio | events/s | lost | recorder CPU | recorder RSS | bytes/min |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
    let mut summaries: BTreeMap<(&'static str, Tool), Summary> = BTreeMap::new();
    for (wl, by_tool) in info.results {
        let Some(baseline) = by_tool
            .get(&Tool::Untraced)
            .and_then(|s| median(s.iter().map(|s| s.metric_s).collect()))
        else {
            continue;
        };
        for (&tool, samples) in by_tool {
            let s = summarize(samples, baseline);
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |",
                wl.title,
                tool.name(),
                fmt_time(s.metric_s),
                s.ratio,
                or_dash(s.events_per_s, fmt_count),
                or_dash(s.lost, |v| fmt_count(v as f64)),
                match (s.cpu_frac, s.cpu_total_s) {
                    (Some(f), Some(t)) => format!("{:.2}% ({t:.2} s total)", f * 100.0),
                    _ => "–".into(),
                },
                match (s.peak_rss_kb, s.job_rss_kb, s.rss_growth_kb) {
                    (Some(p), Some(j), Some(g)) =>
                        format!("{} peak; {} in job, {}", kb(p), kb(j), kb_signed(g)),
                    _ => "–".into(),
                },
                or_dash(s.bytes_per_min, mb),
            );
            summaries.insert((wl.id, tool), s);
        }
    }
    let _ = writeln!(
        w,
        "\nmedian time: the workload's own time (W4: its median step). events/s: trainbpf, \
         records in the recording (every process on the machine, not only the job); bpftrace, \
         faults counted in its map (every process); perf, samples written. lost: trainbpf, \
         `lost_events` of `trainbpf report --json`; perf, faults the job counted itself \
         (getrusage) that perf did not record; summed over runs; bpftrace counts in a map, which \
         cannot overflow. recorder CPU: the \
         tool's CPU while the job ran as a share of one core (its whole life in brackets). \
         recorder RSS: worst of the runs: peak (VmHWM, start-up included), most while the job \
         ran, and growth from a tenth into the job to its end.\n"
    );

    let _ = writeln!(
        w,
        "## Targets (issue 5){}\n",
        if info.smoke {
            ": not judged on a smoke run"
        } else {
            ""
        }
    );
    let _ = writeln!(w, "| target | measured | met |\n|---|---|---|");
    let ours = |id: &'static str| summaries.get(&(id, Tool::Trainbpf));
    let mut target = |what: &str, measured: Option<String>, met: Option<bool>| {
        let verdict = match (info.smoke, met) {
            (true, _) => "–",
            (false, Some(true)) => "yes",
            (false, Some(false)) => "**no**",
            (false, None) => "not measured",
        };
        let _ = writeln!(
            w,
            "| {what} | {} | {verdict} |",
            measured.unwrap_or_else(|| "–".into())
        );
    };
    let s = ours("W1-1");
    target(
        "W1 one thread ≤ 1.10×",
        s.map(|s| format!("{:.3}×", s.ratio)),
        s.map(|s| s.ratio <= 1.10),
    );
    let s = ours("W1-N");
    target(
        "W1 all cores ≤ 1.20×, zero lost",
        s.map(|s| format!("{:.3}×, {} lost", s.ratio, s.lost.unwrap_or(0))),
        s.map(|s| s.ratio <= 1.20 && s.lost == Some(0)),
    );
    let s = ours("W3");
    target(
        "W3 ≤ 1.05×",
        s.map(|s| format!("{:.3}×", s.ratio)),
        s.map(|s| s.ratio <= 1.05),
    );
    let s = ours("W4");
    target(
        "W4 step time ≤ 1% slower",
        s.map(|s| format!("{:+.2}%", (s.ratio - 1.0) * 100.0)),
        s.map(|s| s.ratio <= 1.01),
    );
    target(
        "W4 recorder ≤ 1% of a core",
        s.and_then(|s| Some(format!("{:.2}%", s.cpu_frac? * 100.0))),
        s.and_then(|s| Some(s.cpu_frac? <= 0.01)),
    );
    // "Flat": growth while the job ran stays under 1 MB.
    target(
        "W4 recorder RSS ≤ 50 MB, flat",
        s.and_then(|s| {
            Some(format!(
                "{} peak (start-up included); {} while the job ran, {} over a run",
                kb(s.peak_rss_kb?),
                kb(s.job_rss_kb?),
                kb_signed(s.rss_growth_kb?)
            ))
        }),
        s.and_then(|s| {
            Some(s.peak_rss_kb? as f64 * 1024.0 <= 50e6 && s.rss_growth_kb? as f64 * 1024.0 <= 1e6)
        }),
    );
    target(
        "W4 recording ≤ 1 MB/min",
        s.and_then(|s| Some(format!("{}/min", mb(s.bytes_per_min?)))),
        s.and_then(|s| Some(s.bytes_per_min? <= 1e6)),
    );

    let _ = writeln!(w, "\n## Every run\n");
    let _ = writeln!(
        w,
        "| workload | tool | time of each run, in order |\n|---|---|---|"
    );
    for (wl, by_tool) in info.results {
        for (tool, samples) in by_tool {
            let times: Vec<String> = samples.iter().map(|s| fmt_time(s.metric_s)).collect();
            let _ = writeln!(
                w,
                "| {} | {} | {} |",
                wl.title,
                tool.name(),
                times.join(", ")
            );
        }
    }
    for n in &info.notes {
        let _ = writeln!(w, "\nNote: {n}");
    }
    md
}
