//! `cargo xtask bench`: what watching a job costs the job.
//!
//! Workloads (xtask/bench/workload.c, built with gcc here) time their own
//! work and print it, so a tool's start-up and shutdown stay out of the
//! figure. Each workload runs under each tool in turn, round after round
//! (A B C D A B C D ...), so that a slow spell of the machine hits every arm
//! alike; the table gives medians, ratios to the untraced median of the
//! same run, and the median of each round's ratio (which a slow spell that
//! spans a round disturbs less). While a tool runs, its process is sampled
//! from /proc for CPU and RSS.
//!
//! G1 is an allocation-heavy CUDA job (xtask/bench/cuda_loop.c: cuMemAlloc
//! and cuMemFree between a step's work, as PyTorch without its caching
//! allocator) on the stand-in driver (tests/gpu/standin_cuda.c), which runs
//! everywhere; G2 is the same loop on the machine's own driver, run only
//! where an NVIDIA GPU is present.
//!
//! Tools: `trainbpf record`, and with `--stacks` (stacks go on by
//! default only if they cost W1 one thread and steady growth at most 5%),
//! a bpftrace script doing the nearest equivalent work (a fault count per
//! process in a kernel map, plus `oom:mark_victim`), and
//! `perf record -e exceptions:page_fault_user`.

mod bystander;
mod lifecycle;
pub(crate) mod proc;
mod report;
mod scale;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};

use self::{
    proc::{Watched, text},
    report::{RunInfo, render},
};

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
    /// Workload ids to run (`W1-1`, `W1-N`, `W3`, `W4`, `W5`, `W6`, `G1`,
    /// `G2`, the bystanders `B1` to `B4`, `L1`, start-up and exit, and
    /// `A1`, `record --all` on a crowded node); empty: all.
    pub only: Vec<String>,
}

/// This invocation's own directory, removed when it ends: the pinned
/// recorder and workload, and the recordings (each deleted after its run, so
/// that the writeback of a big perf.data cannot slow the arm that follows).
/// Per process, because a second bench on the same machine (a CI smoke run
/// beside a full one) overwrote a shared one's recorder mid-run.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let tmp = std::env::temp_dir();
        // A bench that was killed left its directory (and a copy of the
        // recorder) behind: remove those whose process is gone.
        for e in fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("trainbpf-bench."))
            else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        let dir = tmp.join(format!("trainbpf-bench.{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The nearest bpftrace equivalent of trainbpf's probes: a fault count per
/// process kept in a kernel map (trainbpf adds to a per-process map entry
/// on `exceptions:page_fault_user` too), and the OOM victim.
const BPFTRACE_PROG: &str = "tracepoint:exceptions:page_fault_user { @faults[pid] = count(); }
tracepoint:oom:mark_victim { printf(\"oom victim %d\\n\", args->pid); }";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tool {
    Untraced,
    Trainbpf,
    TrainbpfNoStacks,
    Bpftrace,
    Perf,
    /// A recorder tracing a sleeping job, the workload outside it.
    Bystander,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Untraced => "untraced",
            Tool::Trainbpf => "trainbpf record",
            Tool::TrainbpfNoStacks => "trainbpf record --no-stacks",
            Tool::Bpftrace => "bpftrace",
            Tool::Perf => "perf record",
            Tool::Bystander => "beside trainbpf record -- sleep",
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
    /// W1-1, W1-N, W3, W4, W5, W6: the key the targets refer to.
    id: &'static str,
    title: String,
    /// The C workload's mode and arguments, or the Python script's, or the
    /// CUDA loop's (where `STANDIN` stands for the stand-in driver's path).
    args: Vec<String>,
    python: bool,
    cuda: bool,
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
    /// The job's CPU (user + system, workers included) for the same work:
    /// the whole run, or per step for W4. Probes run in the job's context,
    /// so their cost shows here even when a busy machine blurs the time.
    job_cpu_s: f64,
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
    // A smoke run must not overwrite the figures of a full one.
    let out = out_dir.join(if opts.smoke { "smoke.md" } else { "results.md" });
    let scratch = Scratch::new()?;
    // A copy, so that a rebuild during a long run cannot swap the recorder
    // between arms.
    let pinned = scratch.0.join("trainbpf");
    fs::copy(&bin, &pinned).with_context(|| format!("copying {}", bin.display()))?;
    let source = source_state();
    let workload = build_workload(&scratch.0)?;
    let (cuda_loop, standin) = build_cuda(&scratch.0)?;
    let python_script = workspace_root().join("xtask/bench/pyheavy.py");

    let mut tools = vec![Tool::Untraced, Tool::Trainbpf, Tool::TrainbpfNoStacks];
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
        bin: pinned,
        workload,
        python_script,
        cuda_loop,
        standin,
        scratch: scratch.0.clone(),
        clk_tck: clock_ticks(),
    };
    let nproc = thread::available_parallelism().map_or(1, |n| n.get());
    let mut plan = plan(opts.smoke, nproc, w4_secs, &tools);
    plan.extend(bystander::plan(opts.smoke, nproc));
    if !has_gpu() {
        plan.retain(|w| w.id != "G2");
        notes.push("G2 skipped: no NVIDIA GPU (/dev/nvidiactl) on this machine".into());
    }
    let chosen =
        |id: &str| opts.only.is_empty() || opts.only.iter().any(|o| o.eq_ignore_ascii_case(id));
    let (l1, a1) = (chosen("L1"), chosen("A1"));
    if !opts.only.is_empty() {
        let mut known: Vec<&str> = plan.iter().map(|w| w.id).collect();
        known.extend(["L1", "A1"]);
        for id in &opts.only {
            ensure!(
                known.iter().any(|k| k.eq_ignore_ascii_case(id)),
                "--only {id}: no such workload (there are {})",
                known.join(", ")
            );
        }
        plan.retain(|w| opts.only.iter().any(|id| w.id.eq_ignore_ascii_case(id)));
    }
    let load_before = loadavg();
    let started = Instant::now();
    let mut results = Vec::new();
    let render_now = |results: &[(&Workload, BTreeMap<Tool, Vec<Sample>>)], notes: &[String]| {
        render(&RunInfo {
            smoke: opts.smoke,
            runs,
            nproc,
            w4_secs,
            minutes: started.elapsed().as_secs_f64() / 60.0,
            load_before: load_before.clone(),
            load_after: loadavg(),
            source: source.clone(),
            notes: notes.to_vec(),
            results,
        })
    };
    for (i, w) in plan.iter().enumerate() {
        let mut samples: BTreeMap<Tool, Vec<Sample>> = BTreeMap::new();
        for round in 1..=runs {
            for &tool in &w.tools {
                settle(opts.smoke);
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
        // Written after each workload, so that a run cut short (a full one
        // takes over half an hour on a shared machine) keeps what it measured.
        let mut partial = notes.clone();
        if i + 1 < plan.len() {
            partial.push(format!(
                "incomplete: {} of {} workloads measured so far",
                i + 1,
                plan.len()
            ));
        }
        fs::write(&out, render_now(&results, &partial))
            .with_context(|| format!("writing {}", out.display()))?;
    }

    let mut md = render_now(&results, &notes);
    if l1 {
        md.push_str(&lifecycle::measure(&ctx, runs)?);
    }
    if a1 {
        let crowd = scale::build(&scratch.0)?;
        md.push_str(&ctx.scale(opts.smoke, &crowd)?);
    }
    fs::write(&out, &md).with_context(|| format!("writing {}", out.display()))?;
    println!("{md}");
    eprintln!("bench: written to {}", out.display());
    Ok(())
}

/// What each workload runs: a fixed amount of work, so the time is the figure.
fn plan(smoke: bool, nproc: usize, w4_secs: u64, tools: &[Tool]) -> Vec<Workload> {
    // 64 MiB a pass: 16,384 faults. 100 passes is about 2.5 s on one core
    // here, long enough that a tool's attach jitter is noise.
    let passes = if smoke { 4 } else { 100 };
    let forks = if smoke { 16 } else { 200 };
    // W5: 1 GiB of new memory in fresh 256 MiB processes, about 10 s at
    // 100 MB/s; WORK paces it there (measured on the project's 2-core VM).
    let (grow_total, grow_round) = if smoke { (32, 16) } else { (1024, 256) };
    const GROW_WORK: &str = "35000";
    // W6: about 5 s of Python here.
    let py_iters = if smoke { 100 } else { 8000 };
    // G1/G2: steps of about 50 ms here (W4's), each with 100 allocations
    // and frees: 4,000 driver calls a second.
    let (gpu_steps, gpu_pairs, gpu_work) = if smoke { (3, 10, 50) } else { (60, 100, 1800) };
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    // Stacks on and off side by side where the stacks rule judges them (W1
    // one thread, steady growth) and for Python; elsewhere, off.
    let no_stacks: Vec<Tool> = tools
        .iter()
        .copied()
        .filter(|&t| t != Tool::TrainbpfNoStacks)
        .collect();
    // bpftrace and perf are left out of W4 to W6: their W1 figures compare
    // the tools already, and these runs are long.
    let ours: Vec<Tool> = tools
        .iter()
        .copied()
        .filter(|t| matches!(t, Tool::Untraced | Tool::Trainbpf | Tool::TrainbpfNoStacks))
        .collect();
    vec![
        Workload {
            id: "W1-1",
            title: "W1 fault storm, 1 thread".into(),
            args: s(&["faults", "1", &passes.to_string(), "64"]),
            python: false,
            cuda: false,
            metric: Metric::Elapsed,
            tools: tools.to_vec(),
        },
        Workload {
            id: "W1-N",
            title: format!("W1 fault storm, {nproc} threads"),
            args: s(&["faults", &nproc.to_string(), &passes.to_string(), "64"]),
            python: false,
            cuda: false,
            metric: Metric::Elapsed,
            tools: no_stacks.clone(),
        },
        Workload {
            id: "W3",
            title: format!("W3 fork storm, {forks} workers x 16 MiB"),
            args: s(&["forks", &forks.to_string(), "16", &nproc.to_string()]),
            python: false,
            cuda: false,
            metric: Metric::Elapsed,
            tools: no_stacks.clone(),
        },
        Workload {
            id: "W4",
            title: format!("W4 steady job, {w4_secs} s (step time)"),
            args: s(&["steady", &w4_secs.to_string()]),
            python: false,
            cuda: false,
            metric: Metric::StepMedian,
            tools: ours
                .iter()
                .copied()
                .filter(|&t| t != Tool::TrainbpfNoStacks)
                .collect(),
        },
        Workload {
            id: "W5",
            title: format!(
                "W5 steady growth, {grow_total} MiB new (fresh process per {grow_round} MiB)"
            ),
            args: s(&[
                "grow",
                &grow_total.to_string(),
                &grow_round.to_string(),
                GROW_WORK,
            ]),
            python: false,
            cuda: false,
            metric: Metric::Elapsed,
            tools: ours.clone(),
        },
        Workload {
            id: "W6",
            title: format!("W6 Python-heavy, {py_iters} iterations"),
            args: s(&[&py_iters.to_string()]),
            python: true,
            cuda: false,
            metric: Metric::Elapsed,
            tools: ours.clone(),
        },
        Workload {
            id: "G1",
            title: format!(
                "G1 CUDA allocation loop, stand-in driver, {gpu_pairs} cuMemAlloc/cuMemFree pairs a step (step time)"
            ),
            args: s(&[
                "STANDIN",
                &gpu_steps.to_string(),
                &gpu_pairs.to_string(),
                &gpu_work.to_string(),
            ]),
            python: false,
            cuda: true,
            metric: Metric::StepMedian,
            tools: ours.clone(),
        },
        Workload {
            id: "G2",
            title: format!(
                "G2 CUDA allocation loop, the machine's driver, {gpu_pairs} cuMemAlloc/cuMemFree pairs a step (step time)"
            ),
            args: s(&[
                "libcuda.so.1",
                &gpu_steps.to_string(),
                &gpu_pairs.to_string(),
                &gpu_work.to_string(),
            ]),
            python: false,
            cuda: true,
            metric: Metric::StepMedian,
            tools: ours,
        },
    ]
}

/// The CUDA loop and the stand-in driver it loads (G1), built with gcc.
fn build_cuda(out_dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let exe = out_dir.join("cuda_loop");
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(workspace_root().join("xtask/bench/cuda_loop.c"))
        .arg("-ldl"))
    .context("building the CUDA loop needs gcc")?;
    // Under its driver's name, in a directory of its own: the recorder
    // meets it only when the loop maps it, as a runtime's dlopen.
    let lib_dir = out_dir.join("standin");
    fs::create_dir_all(&lib_dir)?;
    let lib = lib_dir.join("libcuda.so.1");
    run(Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(workspace_root().join("tests/gpu/standin_cuda.c"))
        .arg("-lpthread"))
    .context("building the stand-in driver needs gcc")?;
    Ok((exe, lib))
}

/// An NVIDIA driver's control node: the real-driver arm can run.
fn has_gpu() -> bool {
    Path::new("/dev/nvidiactl").exists()
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

/// Before each run: the last one's aftermath is not the next one's cost.
/// perf leaves tens of MB of dirty pages behind it (written back while the
/// next arm runs, unless synced now), and the kernel frees an exited
/// recorder's BPF maps and ring buffer in a workqueue; in one run here an
/// untraced W3 run right after perf's took 0.98 s against 0.73 to 0.82 s for
/// the others. Every arm gets the same pause, the untraced one too.
fn settle(smoke: bool) {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    if !smoke {
        thread::sleep(Duration::from_secs(1));
    }
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

/// The interpreter W6 runs on, by absolute path: the image's own CPython.
const PYTHON: &str = "/usr/bin/python3";

struct Ctx {
    bin: PathBuf,
    workload: PathBuf,
    python_script: PathBuf,
    cuda_loop: PathBuf,
    standin: PathBuf,
    scratch: PathBuf,
    clk_tck: f64,
}

impl Ctx {
    /// The job's command line: the C workload or the Python one.
    fn job_argv(&self, w: &Workload) -> Vec<std::ffi::OsString> {
        let mut argv: Vec<std::ffi::OsString> = if w.python {
            vec![PYTHON.into(), self.python_script.clone().into()]
        } else if w.cuda {
            vec![self.cuda_loop.clone().into()]
        } else {
            vec![self.workload.clone().into()]
        };
        argv.extend(w.args.iter().map(|a| {
            if w.cuda && a == "STANDIN" {
                self.standin.clone().into()
            } else {
                a.into()
            }
        }));
        argv
    }

    fn workload_cmd(&self, w: &Workload) -> Command {
        let argv = self.job_argv(w);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
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
            Tool::Trainbpf => self.trainbpf(w, true),
            Tool::TrainbpfNoStacks => self.trainbpf(w, false),
            Tool::Bpftrace => self.bpftrace(w),
            Tool::Perf => self.perf(w),
            Tool::Bystander => self.bystander(w),
        }
    }

    fn trainbpf(&self, w: &Workload, stacks: bool) -> Result<Sample> {
        let rec = self.scratch.join("bench.rec");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["record", "-o"]).arg(&rec);
        if !stacks {
            cmd.arg("--no-stacks");
        }
        cmd.arg("--").args(self.job_argv(w));
        let mut p = Watched::spawn(&mut cmd, true)?;
        // Printed once the probes are attached, just before the job starts.
        let ready = p.wait_for("trainbpf: recording to", Duration::from_secs(60))?;
        let done = p.finish()?;
        done.check("trainbpf record")?;
        let r = done.result()?;
        let usage = done.usage(ready, r.at, self.clk_tck);

        let events = Command::new(&self.bin)
            .args(["report", "--format=events"])
            .arg(&rec)
            .output()?;
        ensure!(
            events.status.success(),
            "trainbpf report --format events failed: {}",
            String::from_utf8_lossy(&events.stderr)
        );
        let events = events.stdout.iter().filter(|&&b| b == b'\n').count() as u64;
        let json = Command::new(&self.bin)
            .args(["report", "--format=json"])
            .arg(&rec)
            .output()?;
        ensure!(
            json.status.success(),
            "trainbpf report --format json failed: {}",
            String::from_utf8_lossy(&json.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&json.stdout)?;
        let lost = json["lost_events"]
            .as_u64()
            .context("trainbpf report --format json has no lost_events")?;
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
        // SIGINT: bpftrace detaches and prints its maps, like Ctrl-C.
        bt.interrupt()?;
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
        let data = self.scratch.join("perf.data");
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-e", "exceptions:page_fault_user", "-o"])
            .arg(&data)
            .arg("--")
            .args(self.job_argv(w));
        let ready = Instant::now();
        let done = Watched::spawn(&mut cmd, true)?.finish()?;
        done.check("perf record")?;
        let r = done.result()?;
        let usage = done.usage(ready, r.at, self.clk_tck);
        // `[ perf record: Captured and wrote 85.1 MB perf.data (1000000 samples) ]`;
        // perf leaves the count out when it is 0, which happened here (a
        // 0.02 MB perf.data for 1.6 M faults): that is every fault lost.
        let summary = done
            .lines
            .iter()
            .find(|l| l.err && l.text.contains("perf record: Captured and wrote"))
            .with_context(|| format!("perf record printed no summary:\n{}", text(&done.lines)))?;
        let samples = summary
            .text
            .rsplit_once('(')
            .and_then(|(_, tail)| tail.split_once(" samples)")?.0.parse::<u64>().ok())
            .unwrap_or(0);
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
    let cpu = r.get("cpu_s")?;
    let (metric_s, job_cpu_s) = match w.metric {
        Metric::Elapsed => (elapsed_s, cpu),
        Metric::StepMedian => (r.get("step_median_s")?, cpu / r.get("steps")?.max(1.0)),
    };
    Ok(Sample {
        metric_s,
        elapsed_s,
        job_cpu_s,
        events,
        lost,
        bytes,
        usage,
    })
}
