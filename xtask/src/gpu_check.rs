//! `cargo xtask gpu-check`: real PyTorch CUDA jobs under `trainbpf record`,
//! with the GPU ledger compared to what PyTorch and NVML say (docs/gpu.md).
//!
//! The stand-in tests (tests/e2e/gpu/ledger.rs) prove the uprobes, the collector
//! and the ledger against a fake `libcuda.so.1`. Whether a real driver's
//! calls reach the probed symbols at all only a real GPU can show, so this
//! runs `xtask/gpu/torch_job.py` once per allocator mode and puts the
//! figures side by side. It needs an NVIDIA GPU, its driver and a CUDA build
//! of PyTorch, so it is not run in CI; without them it fails at once and
//! says which is missing.

use std::{
    collections::BTreeSet,
    env,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    tasks,
    util::{probe, require_root, target_dir, workspace_root},
};

const MIB: u64 = 1 << 20;
/// One mode's job: torch's import and CUDA start take seconds; a run that
/// takes minutes is stuck.
const JOB_TIMEOUT: Duration = Duration::from_secs(300);
/// After SIGTERM (which record forwards to the job), before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// The job script, relative to the workspace root.
const SCRIPT: &str = "xtask/gpu/torch_job.py";

pub struct Options {
    /// The Python interpreter: a name looked up on PATH, or a path.
    pub python: PathBuf,
    /// Where the records, reports and gpu-check.md go [target/gpu-check].
    pub out: Option<PathBuf>,
    /// A prebuilt trainbpf to record with: no setup and no build, so no
    /// cargo or eBPF toolchain is needed (a GPU machine that has neither).
    pub bin: Option<PathBuf>,
}

/// PyTorch's CUDA allocator, as PYTORCH_CUDA_ALLOC_CONF selects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Default,
    Expandable,
    Async,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Default, Mode::Expandable, Mode::Async];

    /// The script's argument and the files' stem.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::Expandable => "expandable",
            Mode::Async => "async",
        }
    }

    /// The PYTORCH_CUDA_ALLOC_CONF the script sets.
    fn alloc_conf(self) -> Option<&'static str> {
        match self {
            Mode::Default => None,
            Mode::Expandable => Some("expandable_segments:True"),
            Mode::Async => Some("backend:cudaMallocAsync"),
        }
    }

    /// `torch.cuda.get_allocator_backend()` in this mode.
    fn backend(self) -> &'static str {
        match self {
            Mode::Async => "cudaMallocAsync",
            _ => "native",
        }
    }

    /// The caching allocators reserve memory through calls the uprobes
    /// see (cuMemAlloc, cuMemCreate), so the ledger holds at least
    /// `memory_reserved()`. The cudaMallocAsync pool grows inside the
    /// driver; only allocations from it (cuMemAllocAsync) are calls, so the
    /// ledger follows `memory_allocated()` (the pool's used memory) there.
    fn reference(self) -> &'static str {
        match self {
            Mode::Async => "allocated",
            _ => "reserved",
        }
    }

    fn conf_text(self) -> String {
        match self.alloc_conf() {
            None => "unset".to_string(),
            Some(c) => format!("`{c}`"),
        }
    }
}

pub fn gpu_check(opts: &Options) -> Result<()> {
    // What the machine lacks first: these need no root and no build, and
    // are what most machines (CI included) fail on.
    let gpus = require_gpu()?;
    let python = resolve_python(&opts.python)?;
    let root = repo_root()?;
    let script = root.join(SCRIPT);
    let torch = probe_torch(&python, &script)?;
    require_root(
        "gpu-check",
        "recording the PyTorch jobs needs root (uprobes on libcuda)",
    )?;
    let bin = match &opts.bin {
        // As given: no setup, no build, no cargo.
        Some(b) => {
            let b = absolute(b)?;
            ensure!(b.is_file(), "--bin {}: no such file", b.display());
            b
        }
        None => tasks::build()?,
    };
    let out = match (&opts.out, &opts.bin) {
        (Some(d), _) => absolute(d)?,
        // target_dir() asks cargo, which a --bin machine may not have.
        (None, Some(_)) => root.join("target/gpu-check"),
        (None, None) => target_dir()?.join("gpu-check"),
    };
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    // What `doctor` says about this machine's eBPF support goes beside the
    // figures: it is the first question when record cannot load at all.
    if let Some(d) = probe(Command::new(&bin).arg("doctor")) {
        fs::write(out.join("doctor.txt"), d)?;
    }

    let mut results = Vec::new();
    for mode in Mode::ALL {
        eprintln!(
            "gpu-check: {} allocator (PYTORCH_CUDA_ALLOC_CONF {})",
            mode.name(),
            mode.alloc_conf().unwrap_or("unset")
        );
        let outcome = run_mode(&bin, &python, &root, &script, &out, mode)
            .and_then(|(torch, report)| compare(mode, &torch, &report))
            .map_err(|e| format!("{e:#}"));
        if let Err(e) = &outcome {
            eprintln!("gpu-check: {}: {e}", mode.name());
        }
        results.push(ModeResult { mode, outcome });
    }

    let machine = Machine {
        gpus,
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        python: python.display().to_string(),
        torch: probe_summary(&torch),
    };
    let md = render(&machine, &results);
    let path = out.join("gpu-check.md");
    fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    eprintln!("gpu-check: written to {}", path.display());
    let failed = failures(&results);
    ensure!(
        failed == 0,
        "{failed} check(s) failed or run(s) did not complete; see {}",
        path.display()
    );
    Ok(())
}

/// The checkout holding the job script: the one xtask was built in, else
/// the current directory (a prebuilt xtask carried to another machine,
/// run from a copy of the checkout at another path).
fn repo_root() -> Result<PathBuf> {
    if workspace_root().join(SCRIPT).is_file() {
        return Ok(workspace_root().to_path_buf());
    }
    let cwd = env::current_dir()?;
    ensure!(
        cwd.join(SCRIPT).is_file(),
        "no {SCRIPT} under {} (where xtask was built) or under the current \
         directory {}: run from the checkout's root",
        workspace_root().display(),
        cwd.display()
    );
    Ok(cwd)
}

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        env::current_dir()?.join(p)
    })
}

// --- What the machine must have -------------------------------------------

/// The GPUs `nvidia-smi` lists, or a clear failure.
fn require_gpu() -> Result<Vec<String>> {
    let on_path = which(Path::new("nvidia-smi")).is_some();
    let listed = on_path
        .then(|| {
            probe(Command::new("nvidia-smi").args([
                "--query-gpu=index,name,driver_version,memory.total",
                "--format=csv,noheader",
            ]))
        })
        .flatten();
    let nodes = nvidia_nodes(Path::new("/dev"));
    let problems = gpu_problems(on_path, listed.as_deref(), &nodes);
    if !problems.is_empty() {
        bail!(
            "no usable NVIDIA GPU on this machine: {}. gpu-check runs real \
             PyTorch CUDA jobs, so it needs a GPU with its driver loaded; it is \
             not run in CI (docs/gpu.md)",
            problems.join("; ")
        );
    }
    Ok(listed
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// `nvidia0`, `nvidia1`, …: the per-GPU device nodes (not nvidiactl,
/// nvidia-uvm).
fn nvidia_nodes(dev: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dev)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    v.sort();
    v
}

/// Why this machine cannot run the check; empty when it can.
fn gpu_problems(smi_on_path: bool, smi_listed: Option<&str>, nodes: &[String]) -> Vec<String> {
    let mut p = Vec::new();
    if !smi_on_path {
        p.push("`nvidia-smi` is not on PATH".to_string());
    } else {
        match smi_listed {
            None => p.push("`nvidia-smi` failed (is the NVIDIA driver loaded?)".to_string()),
            Some(s) if s.trim().is_empty() => p.push("`nvidia-smi` lists no GPU".to_string()),
            Some(_) => {}
        }
    }
    if nodes.is_empty() {
        p.push("there is no /dev/nvidia0 (nor any /dev/nvidiaN)".to_string());
    }
    p
}

/// A program name looked up on PATH, or a path made absolute (not
/// canonicalised: a virtual environment's `bin/python` is a link whose own
/// path selects the environment).
fn which(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return absolute(p).ok().filter(|a| a.is_file());
    }
    env::split_paths(&env::var_os("PATH")?)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

fn resolve_python(py: &Path) -> Result<PathBuf> {
    which(py).with_context(|| {
        format!(
            "no Python interpreter `{}` (under sudo, PATH is sudo's secure_path: \
             pass --python \"$(which python3)\" from the environment that has torch)",
            py.display()
        )
    })
}

/// `torch_job.py --probe`: torch's version, and whether CUDA works.
fn probe_torch(python: &Path, script: &Path) -> Result<Value> {
    let out = Command::new(python)
        .arg(script)
        .arg("--probe")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("").trim().to_string();
    match out.status.code() {
        Some(0) => {}
        Some(3) => bail!(
            "torch is not importable by {} ({last}); install a CUDA build of \
             PyTorch there, or pass --python PATH to an interpreter that has one",
            python.display()
        ),
        _ => bail!(
            "{} {SCRIPT} --probe failed ({}): {stderr}",
            python.display(),
            out.status
        ),
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let info = tagged_line(&stdout, "PROBE")
        .with_context(|| format!("{SCRIPT} --probe printed no PROBE line: {stdout}"))?;
    if info["available"] != true {
        let why = match info["cuda"].as_str() {
            None => "this torch is a CPU-only build".to_string(),
            Some(v) => format!(
                "torch is built for CUDA {v} but finds no usable GPU (a driver too \
                 old for it, CUDA_VISIBLE_DEVICES, or /dev/nvidia* permissions)"
            ),
        };
        bail!(
            "torch.cuda.is_available() is False for torch {} under {}: {why}",
            info["torch"].as_str().unwrap_or("?"),
            python.display()
        );
    }
    Ok(info)
}

fn probe_summary(p: &Value) -> String {
    format!(
        "torch {} (CUDA {}), {} device(s), cuda:0 {}",
        p["torch"].as_str().unwrap_or("?"),
        p["cuda"].as_str().unwrap_or("?"),
        p["devices"],
        p["device_name"].as_str().unwrap_or("?"),
    )
}

/// The JSON after `TAG ` on the last line that starts with it.
fn tagged_line(stdout: &str, tag: &str) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
        .and_then(|j| serde_json::from_str(j).ok())
}

// --- One mode's run ---------------------------------------------------------

/// Records the job in one mode; returns its TORCH line and the report.
fn run_mode(
    bin: &Path,
    python: &Path,
    root: &Path,
    script: &Path,
    out: &Path,
    mode: Mode,
) -> Result<(Value, Value)> {
    let rec = out.join(format!("{}.rec", mode.name()));
    let json_path = out.join(format!("{}.json", mode.name()));
    for stale in [&rec, &json_path] {
        match fs::remove_file(stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    let mut cmd = Command::new(bin);
    cmd.args(["record", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(python)
        .arg(script)
        .arg(mode.name())
        // The script sets it per mode; the caller's must not leak in.
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    eprintln!(
        "+ {} record -o {} -- {} {} {}",
        bin.display(),
        rec.display(),
        python.display(),
        script.display(),
        mode.name()
    );
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    // The job's stdout comes through record's; echoed as it comes, kept
    // for the TORCH line.
    let pipe = child.stdout.take().context("record's stdout")?;
    let reader = thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            eprintln!("  | {line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let status = wait_or_stop(&mut child)?;
    let stdout = reader.join().unwrap_or_default();
    let status = status.with_context(|| {
        format!(
            "the {} job did not finish within {} s; stopped it",
            mode.name(),
            JOB_TIMEOUT.as_secs()
        )
    })?;
    ensure!(
        status.success(),
        "`trainbpf record` exited with {status} (the job's status, or record's own \
         failure: if the eBPF programs could not be loaded, its messages above and \
         `trainbpf doctor` say why)"
    );
    let torch = tagged_line(&stdout, "TORCH").context("the job printed no TORCH line")?;
    ensure!(rec.is_file(), "record wrote no {}", rec.display());

    let report = Command::new(bin)
        .args(["report", "--format=json"])
        .arg(&rec)
        .stderr(Stdio::inherit())
        .output()
        .context("running trainbpf report --format json")?;
    ensure!(
        report.status.success(),
        "`trainbpf report --format json {}` failed",
        rec.display()
    );
    fs::write(&json_path, &report.stdout)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let report: Value = serde_json::from_slice(&report.stdout)
        .context("trainbpf report --format json: not JSON")?;
    Ok((torch, report))
}

/// The child's status, or None when it ran past JOB_TIMEOUT (then it has
/// been stopped: SIGTERM, which record forwards to the job, then SIGKILL).
fn wait_or_stop(child: &mut Child) -> Result<Option<ExitStatus>> {
    if let Some(s) = wait_for(child, JOB_TIMEOUT)? {
        return Ok(Some(s));
    }
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    if wait_for(child, STOP_GRACE)?.is_none() {
        child.kill()?;
        child.wait()?;
    }
    Ok(None)
}

fn wait_for(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if start.elapsed() >= limit {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

// --- The comparison (pure: unit-tested on fixtures) -------------------------

/// The job's own figures, from its TORCH line.
#[derive(Debug)]
struct Torch {
    pid: Option<u64>,
    backend: Option<String>,
    alloc_conf: Option<String>,
    reserved: u64,
    max_reserved: u64,
    allocated: u64,
    max_allocated: u64,
    device_used: Option<u64>,
    batch_bytes: u64,
    batches: u64,
    pinned_batches: u64,
}

impl Torch {
    fn parse(v: &Value) -> Result<Torch> {
        let n = |k: &str| {
            v[k].as_u64()
                .with_context(|| format!("the TORCH line has no integer `{k}`: {v}"))
        };
        Ok(Torch {
            pid: v["pid"].as_u64(),
            backend: v["backend"].as_str().map(str::to_string),
            alloc_conf: v["alloc_conf"].as_str().map(str::to_string),
            reserved: n("reserved_bytes")?,
            max_reserved: n("max_reserved_bytes")?,
            allocated: n("allocated_bytes")?,
            max_allocated: n("max_allocated_bytes")?,
            device_used: v["device_used_bytes"].as_u64(),
            batch_bytes: n("batch_bytes")?,
            batches: n("batches")?,
            pinned_batches: n("pinned_batches")?,
        })
    }

    /// The figure the ledger is held against, at the end and at the peak.
    fn reference(&self, mode: Mode) -> (u64, u64) {
        match mode {
            Mode::Async => (self.allocated, self.max_allocated),
            _ => (self.reserved, self.max_reserved),
        }
    }
}

/// NVML's per-process figure, as the report compares it.
#[derive(Debug, Clone, Copy)]
struct Nvml {
    samples: u64,
    last: u64,
    ledger: u64,
    difference: i64,
    peak: u64,
}

/// One job process: its ledger, if it called the CUDA driver.
#[derive(Debug, Clone)]
struct Proc {
    pid: u64,
    comm: String,
    role: &'static str,
    /// Listed in `gpu.processes`.
    in_gpu: bool,
    contexts: u64,
    device_peak: u64,
    device_end: u64,
    device_allocs: u64,
    pinned_peak: u64,
    nvml: Option<Nvml>,
}

#[derive(Debug)]
struct Check {
    what: String,
    /// None: could not be measured here (not a failure).
    ok: Option<bool>,
    detail: String,
}

#[derive(Debug)]
struct Comparison {
    mode: Mode,
    torch: Torch,
    main: Proc,
    others: Vec<Proc>,
    gpu_lost: u64,
    lost: u64,
    attach: Vec<String>,
    unused_sources: Vec<String>,
    checks: Vec<Check>,
}

struct ModeResult {
    mode: Mode,
    outcome: Result<Comparison, String>,
}

/// Device memory the ledger sees allocated outside torch's allocator, which
/// the async check (the ledger against `memory_allocated()`) must allow:
/// right after the context is made, `cuMemAlloc` calls of 64 MiB, 128 KiB
/// and 1 KiB (a library's own workspace), 67,240,960 bytes, the same in all
/// three modes of the one GPU run in docs/gpu.md. One run on one GPU and
/// driver: the async check's detail prints the ledger's excess over
/// `memory_allocated()`, the figure that confirms or corrects this on the
/// next run on a GPU.
const OUTSIDE_ALLOCATOR: u64 = 67_240_960;

/// Slack for figures that round differently on each side (the async pool's
/// granularity, NVML's sample instant): 8 MiB or 1%.
fn slack(x: u64) -> u64 {
    (8 * MIB).max(x / 100)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn compare(mode: Mode, torch: &Value, report: &Value) -> Result<Comparison> {
    let t = Torch::parse(torch)?;
    let gpu = &report["gpu"];
    let gprocs = gpu["processes"]
        .as_array()
        .context("the report has no gpu.processes")?;
    let root = report["job"]["pid"]
        .as_u64()
        .context("the report has no job.pid")?;

    // The job's processes, by birth; any GPU process the tree missed after.
    let mut seen = BTreeSet::new();
    let mut listed: Vec<(u64, String)> = Vec::new();
    for p in report["processes"].as_array().into_iter().flatten() {
        let pid = u(&p["pid"]);
        if seen.insert(pid) {
            listed.push((pid, p["comm"].as_str().unwrap_or("?").to_string()));
        }
    }
    for g in gprocs {
        let pid = u(&g["pid"]);
        if seen.insert(pid) {
            listed.push((pid, g["comm"].as_str().unwrap_or("?").to_string()));
        }
    }
    // The Python process is the job's root unless a wrapper (a shell that
    // does not exec) sits between: then it is the pid the job printed.
    let main_pid = t.pid.filter(|p| seen.contains(p)).unwrap_or(root);
    if !seen.contains(&main_pid) {
        listed.insert(0, (main_pid, "?".to_string()));
    }
    let procs: Vec<Proc> = listed
        .into_iter()
        .map(|(pid, comm)| {
            let g = gprocs.iter().find(|g| u(&g["pid"]) == pid);
            let role = if pid == main_pid {
                "main"
            } else if comm == "pt_data_worker" {
                "DataLoader worker"
            } else {
                "other"
            };
            let f = |k: &str| g.map_or(0, |g| u(&g[k]));
            Proc {
                pid,
                comm: g
                    .and_then(|g| g["comm"].as_str())
                    .map_or(comm, str::to_string),
                role,
                in_gpu: g.is_some(),
                contexts: f("contexts"),
                device_peak: f("device_bytes_peak"),
                device_end: f("device_bytes_end"),
                device_allocs: g.map_or(0, |g| u(&g["device"]["allocs"])),
                pinned_peak: f("pinned_bytes_peak"),
                nvml: g.and_then(|g| {
                    let n = &g["nvml"];
                    Some(Nvml {
                        samples: n["samples"].as_u64()?,
                        last: n["last_bytes"].as_u64()?,
                        ledger: n["ledger_bytes"].as_u64()?,
                        difference: n["difference_bytes"].as_i64()?,
                        peak: n["peak_bytes"].as_u64()?,
                    })
                }),
            }
        })
        .collect();
    let (main, others): (Vec<Proc>, Vec<Proc>) = procs.into_iter().partition(|p| p.pid == main_pid);
    let main = main.into_iter().next().expect("main_pid was listed");

    let attach: Vec<String> = gpu["attach"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let missing: Vec<&str> = a["missing"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let mut s = format!(
                "`{}` (found by {}): {} symbol(s) probed",
                a["path"].as_str().unwrap_or("?"),
                a["found_by"].as_str().unwrap_or("?"),
                u(&a["attached"])
            );
            if !missing.is_empty() {
                let _ = write!(s, "; not exported: {}", missing.join(", "));
            }
            if let Some(e) = a["error"].as_str() {
                let _ = write!(s, "; error: {e}");
            }
            s
        })
        .collect();
    let probed = gpu["attach"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|a| u(&a["attached"]) > 0 && a["error"].is_null());
    let unused_sources = gpu["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["used"] == false)
        .map(|s| {
            format!(
                "{}: {}",
                s["source"].as_str().unwrap_or("?"),
                s["detail"].as_str().unwrap_or("")
            )
        })
        .collect();
    let gpu_lost = u(&gpu["lost_events"]);
    let lost = u(&report["lost_events"]);

    let mut checks = Vec::new();
    let mut check =
        |what: String, ok: Option<bool>, detail: String| checks.push(Check { what, ok, detail });

    let backend = t.backend.as_deref().unwrap_or("unknown");
    check(
        format!("torch ran the {} allocator", mode.backend()),
        Some(backend == mode.backend() && t.alloc_conf.as_deref() == mode.alloc_conf()),
        format!(
            "get_allocator_backend() = {backend}, PYTORCH_CUDA_ALLOC_CONF = {}",
            t.alloc_conf.as_deref().unwrap_or("unset")
        ),
    );
    check(
        "libcuda was probed".to_string(),
        Some(probed),
        if attach.is_empty() {
            "no libcuda.so* file was found to attach to".to_string()
        } else {
            attach.join("; ")
        },
    );
    let (ref_end, ref_peak) = t.reference(mode);
    let seen_device = main.device_allocs > 0;
    check(
        "the ledger saw the main process's device allocations".to_string(),
        Some(seen_device),
        if seen_device {
            format!("{} allocation call(s)", main.device_allocs)
        } else if !main.in_gpu {
            format!(
                "the main process (pid {}) is not in gpu.processes at all, while torch \
                 reserved {}: no probed call was seen",
                main.pid,
                bytes(t.max_reserved)
            )
        } else {
            format!(
                "zero device allocations while torch reserved {}: the allocations do \
                 not reach the probed symbols (see docs/gpu.md, what is unverified)",
                bytes(t.max_reserved)
            )
        },
    );
    let (end_ok, peak_ok, rule) = match mode {
        // Below by the rounding slack at most; above by that and what the
        // runtime allocated outside the pool.
        Mode::Async => (
            main.device_end + slack(ref_end) >= ref_end
                && main.device_end <= ref_end + slack(ref_end) + OUTSIDE_ALLOCATOR,
            main.device_peak + slack(ref_peak) >= ref_peak,
            "≈ memory_allocated() (the pool's used memory), plus the 64.1 MiB allocated outside it",
        ),
        _ => (
            main.device_end >= ref_end,
            main.device_peak >= ref_peak,
            "≥ memory_reserved()",
        ),
    };
    check(
        format!("ledger device memory at the end {rule}"),
        Some(end_ok),
        format!(
            "ledger {} vs {} {} ({}{})",
            bytes(main.device_end),
            mode.reference(),
            bytes(ref_end),
            signed(main.device_end as i64 - ref_end as i64),
            if mode == Mode::Async {
                // The measurement OUTSIDE_ALLOCATOR awaits.
                ": the excess is what was allocated outside the pool"
            } else {
                ""
            }
        ),
    );
    check(
        "ledger device peak ≥ torch's peak".to_string(),
        Some(peak_ok),
        format!(
            "ledger {} vs max {} {} ({})",
            bytes(main.device_peak),
            mode.reference(),
            bytes(ref_peak),
            signed(main.device_peak as i64 - ref_peak as i64)
        ),
    );
    check(
        "the main process made a CUDA context".to_string(),
        Some(main.contexts >= 1),
        format!("{} context(s)", main.contexts),
    );
    let with_ctx: Vec<String> = others
        .iter()
        .filter(|p| p.contexts > 0)
        .map(|p| format!("{} ({}, {})", p.pid, p.comm, p.role))
        .collect();
    let workers = others
        .iter()
        .filter(|p| p.role == "DataLoader worker")
        .count();
    check(
        "no other process made a CUDA context".to_string(),
        Some(with_ctx.is_empty()),
        if with_ctx.is_empty() {
            format!(
                "{} other job process(es), {workers} of them DataLoader workers: none \
                 touched CUDA",
                others.len()
            )
        } else {
            format!("context(s) in {}", with_ctx.join(", "))
        },
    );
    check(
        "pinned host memory of at least one batch".to_string(),
        (t.pinned_batches > 0).then_some(main.pinned_peak >= t.batch_bytes),
        format!(
            "ledger pinned peak {}; one batch is {}, {} of {} batches came pinned",
            bytes(main.pinned_peak),
            bytes(t.batch_bytes),
            t.pinned_batches,
            t.batches
        ),
    );
    check(
        "NVML's per-process figure ≥ the ledger".to_string(),
        main.nvml
            .map(|n| n.difference + slack(n.ledger) as i64 >= 0),
        match main.nvml {
            Some(n) => format!(
                "NVML {} at its last sample, the ledger {} then: {} (the context and the \
                 driver's own memory, or the async pool's cache)",
                bytes(n.last),
                bytes(n.ledger),
                signed(n.difference)
            ),
            None => "NVML never listed the main process (NVML not loaded, or a PID \
                     namespace NVML does not see through): not compared"
                .to_string(),
        },
    );
    check(
        "no GPU events lost".to_string(),
        Some(gpu_lost == 0),
        format!("gpu.lost_events {gpu_lost}; lost_events (all kinds) {lost}"),
    );

    Ok(Comparison {
        mode,
        torch: t,
        main,
        others,
        gpu_lost,
        lost,
        attach,
        unused_sources,
        checks,
    })
}

/// Failed checks, plus modes that did not complete.
fn failures(results: &[ModeResult]) -> usize {
    results
        .iter()
        .map(|r| match &r.outcome {
            Ok(c) => c.checks.iter().filter(|c| c.ok == Some(false)).count(),
            Err(_) => 1,
        })
        .sum()
}

// --- The table ----------------------------------------------------------------

struct Machine {
    gpus: Vec<String>,
    kernel: String,
    python: String,
    torch: String,
}

fn bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= MIB {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    } else if b >= 1024 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn signed(d: i64) -> String {
    let s = if d < 0 { "-" } else { "+" };
    format!("{s}{}", bytes(d.unsigned_abs()))
}

fn mark(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "ok",
        Some(false) => "FAIL",
        None => "n/a",
    }
}

fn render(m: &Machine, results: &[ModeResult]) -> String {
    let mut w = String::new();
    let _ = writeln!(w, "# trainbpf gpu-check\n");
    let _ = writeln!(
        w,
        "Real PyTorch CUDA jobs (`{SCRIPT}`) recorded by `trainbpf record`; the GPU \
         ledger of the job's main process against `torch.cuda` and NVML \
         (docs/gpu.md). Sizes in binary units.\n"
    );
    for g in &m.gpus {
        let _ = writeln!(w, "- GPU: {g}");
    }
    let _ = writeln!(w, "- kernel: {}", m.kernel);
    let _ = writeln!(w, "- Python: `{}`, {}\n", m.python, m.torch);
    let _ = writeln!(w, "{}", summary(results));
    for r in results {
        match &r.outcome {
            Ok(c) => w.push_str(&section(c)),
            Err(e) => {
                let _ = writeln!(
                    w,
                    "## {}: PYTORCH_CUDA_ALLOC_CONF {}\n\nThe run did not complete: {e}\n",
                    r.mode.name(),
                    r.mode.conf_text()
                );
            }
        }
    }
    w
}

fn summary(results: &[ModeResult]) -> String {
    let mut w = String::new();
    let _ = writeln!(
        w,
        "| mode | PYTORCH_CUDA_ALLOC_CONF | torch, end / peak | ledger device, end / peak | \
         ledger − torch, end | NVML − ledger | pinned peak | contexts, main / others | \
         GPU lost | checks |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let c = match &r.outcome {
            Ok(c) => c,
            Err(_) => {
                let _ = writeln!(
                    w,
                    "| {} | {} | – | – | – | – | – | – | – | run failed |",
                    r.mode.name(),
                    r.mode.conf_text()
                );
                continue;
            }
        };
        let (ref_end, ref_peak) = c.torch.reference(c.mode);
        let failed = c.checks.iter().filter(|k| k.ok == Some(false)).count();
        let passed = c.checks.iter().filter(|k| k.ok == Some(true)).count();
        let _ = writeln!(
            w,
            "| {} | {} | {} {} / {} | {} / {} | {} | {} | {} | {} / {} | {} | {} |",
            c.mode.name(),
            c.mode.conf_text(),
            c.mode.reference(),
            bytes(ref_end),
            bytes(ref_peak),
            bytes(c.main.device_end),
            bytes(c.main.device_peak),
            signed(c.main.device_end as i64 - ref_end as i64),
            c.main
                .nvml
                .map_or("not listed".to_string(), |n| signed(n.difference)),
            bytes(c.main.pinned_peak),
            c.main.contexts,
            c.others.iter().map(|p| p.contexts).sum::<u64>(),
            c.gpu_lost,
            if failed == 0 {
                format!("{passed} ok")
            } else {
                format!("**{failed} FAILED**, {passed} ok")
            },
        );
    }
    w
}

fn section(c: &Comparison) -> String {
    let mut w = String::new();
    let t = &c.torch;
    let m = &c.main;
    let _ = writeln!(
        w,
        "## {}: PYTORCH_CUDA_ALLOC_CONF {}\n",
        c.mode.name(),
        c.mode.conf_text()
    );
    let _ = writeln!(
        w,
        "| | torch (`torch.cuda`) | ledger, main process (pid {}) | NVML, main process |",
        m.pid
    );
    let _ = writeln!(w, "|---|---|---|---|");
    let nvml_end = m.nvml.map_or("not listed".to_string(), |n| {
        format!(
            "{} (ledger then {}, {}; {} samples)",
            bytes(n.last),
            bytes(n.ledger),
            signed(n.difference),
            n.samples
        )
    });
    let _ = writeln!(
        w,
        "| device memory, end | reserved {}, allocated {} | {} | {nvml_end} |",
        bytes(t.reserved),
        bytes(t.allocated),
        bytes(m.device_end)
    );
    let _ = writeln!(
        w,
        "| device memory, peak | reserved {}, allocated {} | {} | {} |",
        bytes(t.max_reserved),
        bytes(t.max_allocated),
        bytes(m.device_peak),
        m.nvml.map_or("–".to_string(), |n| bytes(n.peak))
    );
    let _ = writeln!(
        w,
        "| pinned host memory, peak | {} batches of {} ({} pinned) | {} | – |",
        t.batches,
        bytes(t.batch_bytes),
        t.pinned_batches,
        bytes(m.pinned_peak)
    );
    let _ = writeln!(
        w,
        "| device in use, whole GPU | {} (cudaMemGetInfo, every process) | | |\n",
        t.device_used.map_or("?".to_string(), bytes)
    );

    let _ = writeln!(
        w,
        "| pid | comm | role | in gpu.processes | contexts | device peak | device end | pinned peak | NVML last |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
    for p in std::iter::once(m).chain(&c.others) {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.pid,
            p.comm,
            p.role,
            if p.in_gpu { "yes" } else { "no" },
            p.contexts,
            bytes(p.device_peak),
            bytes(p.device_end),
            bytes(p.pinned_peak),
            p.nvml.map_or("–".to_string(), |n| bytes(n.last))
        );
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "Lost: {} GPU event(s), {} in all.\n", c.gpu_lost, c.lost);
    for a in &c.attach {
        let _ = writeln!(w, "- libcuda: {a}");
    }
    for s in &c.unused_sources {
        let _ = writeln!(w, "- not used: {s}");
    }
    let _ = writeln!(w, "\n| check | result | detail |\n|---|---|---|");
    for k in &c.checks {
        let _ = writeln!(w, "| {} | {} | {} |", k.what, mark(k.ok), k.detail);
    }
    let _ = writeln!(w);
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A report as `trainbpf report --format json` writes it, cut down to what the
    /// check reads: the shape of a stand-in recording's report
    /// (tests/e2e/gpu/ledger.rs), with the figures a default-allocator torch run
    /// would give: 3 × 256 MiB, one freed (cached), 512 MiB, a 20 MiB
    /// segment for the 4 MiB matmul operands and cuBLAS's workspace, and
    /// 2 MiB of small blocks; two DataLoader workers that never touch CUDA.
    const REPORT: &str = include_str!("../gpu/fixtures/report-default.json");

    fn torch_line(mode: Mode) -> Value {
        let reserved = match mode {
            Mode::Async => 1300 * MIB,
            _ => 1302 * MIB,
        };
        json!({
            "mode": mode.name(), "alloc_conf": mode.alloc_conf(),
            "backend": mode.backend(), "pid": 4242,
            "reserved_bytes": reserved, "max_reserved_bytes": reserved,
            "allocated_bytes": 1036 * MIB, "max_allocated_bytes": 1068 * MIB,
            "device_used_bytes": 1830 * MIB, "device_total_bytes": 150_000 * MIB,
            "batch_bytes": 16 * MIB, "batches": 8, "pinned_batches": 8,
        })
    }

    fn report() -> Value {
        serde_json::from_str(REPORT).unwrap()
    }

    fn check<'a>(c: &'a Comparison, what: &str) -> &'a Check {
        c.checks
            .iter()
            .find(|k| k.what.contains(what))
            .unwrap_or_else(|| panic!("no check {what:?}: {:#?}", c.checks))
    }

    #[test]
    fn a_full_ledger_passes_and_the_table_shows_it() {
        let c = compare(Mode::Default, &torch_line(Mode::Default), &report()).unwrap();
        for k in &c.checks {
            assert_ne!(k.ok, Some(false), "{k:?}");
        }
        assert_eq!(c.main.pid, 4242);
        assert_eq!(c.main.device_end, 1302 * MIB);
        assert_eq!(c.main.contexts, 1);
        // Two workers (no GPU entry) and ldconfig, which torch's import runs.
        assert_eq!(c.others.len(), 3);
        let workers: Vec<_> = c
            .others
            .iter()
            .filter(|p| p.role == "DataLoader worker")
            .collect();
        assert_eq!(workers.len(), 2);
        assert!(workers.iter().all(|p| !p.in_gpu && p.contexts == 0));
        assert_eq!(
            check(&c, "other process").detail,
            "3 other job process(es), 2 of them DataLoader workers: none touched CUDA"
        );
        assert_eq!(
            check(&c, "at the end").detail,
            "ledger 1.27 GiB vs reserved 1.27 GiB (+0 B)"
        );
        assert_eq!(check(&c, "NVML").ok, Some(true));
        assert!(check(&c, "NVML").detail.contains("+512.0 MiB"));

        let results = [ModeResult {
            mode: Mode::Default,
            outcome: Ok(c),
        }];
        assert_eq!(failures(&results), 0);
        let md = render(
            &Machine {
                gpus: vec!["0, NVIDIA H200, 570.86.15, 143771 MiB".into()],
                kernel: "6.8.0".into(),
                python: "/usr/bin/python3".into(),
                torch: "torch 2.5.1".into(),
            },
            &results,
        );
        eprintln!("{md}");
        assert!(md.contains(
            "| default | unset | reserved 1.27 GiB / 1.27 GiB | 1.27 GiB / 1.27 GiB | +0 B | \
             +512.0 MiB | 64.0 MiB | 1 / 0 | 0 | 10 ok |"
        ));
        assert!(md.contains(
            "| 4242 | python3 | main | yes | 1 | 1.27 GiB | 1.27 GiB | 64.0 MiB | 1.77 GiB |"
        ));
        assert!(md.contains(
            "| 4250 | pt_data_worker | DataLoader worker | no | 0 | 0 B | 0 B | 0 B | – |"
        ));
        assert!(md.contains("- libcuda: `/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15` (found by ldconfig): 22 symbol(s) probed; not exported: cuCtxCreate_v4"));
        assert!(md.contains("- not used: ioctl: "));
    }

    #[test]
    fn zero_device_allocations_while_torch_reserved_is_the_failure_to_see() {
        let mut r = report();
        let main = &mut r["gpu"]["processes"][0];
        for k in ["device_bytes_peak", "device_bytes_end"] {
            main[k] = json!(0);
        }
        main["device"]["allocs"] = json!(0);
        main["nvml"]["ledger_bytes"] = json!(0);
        main["nvml"]["difference_bytes"] = json!(1814 * MIB);
        let c = compare(Mode::Default, &torch_line(Mode::Default), &r).unwrap();
        let k = check(&c, "saw the main process");
        assert_eq!(k.ok, Some(false));
        assert!(
            k.detail
                .starts_with("zero device allocations while torch reserved 1.27 GiB"),
            "{}",
            k.detail
        );
        assert_eq!(check(&c, "at the end").ok, Some(false));
        assert_eq!(check(&c, "peak").ok, Some(false));
        let results = [ModeResult {
            mode: Mode::Default,
            outcome: Ok(c),
        }];
        assert_eq!(failures(&results), 3);
        assert!(summary(&results).contains("**3 FAILED**, 7 ok"));
    }

    #[test]
    fn the_async_pool_is_held_against_allocated_not_reserved() {
        // cudaMallocAsync: the pool reserved more than was allocated from
        // it, and the ledger follows what was allocated.
        let mut r = report();
        let main = &mut r["gpu"]["processes"][0];
        main["device_bytes_end"] = json!(1036 * MIB);
        main["device_bytes_peak"] = json!(1068 * MIB);
        let mut t = torch_line(Mode::Async);
        t["reserved_bytes"] = json!(1600 * MIB);
        let c = compare(Mode::Async, &t, &r).unwrap();
        let k = check(&c, "at the end");
        assert_eq!(
            k.what,
            "ledger device memory at the end ≈ memory_allocated() (the pool's used memory), plus the 64.1 MiB allocated outside it"
        );
        assert_eq!(k.ok, Some(true), "{k:?}");
        assert_eq!(check(&c, "peak").ok, Some(true));
        // Within 8 MiB passes, beyond fails.
        let mut r2 = r.clone();
        r2["gpu"]["processes"][0]["device_bytes_end"] = json!(1020 * MIB);
        let c = compare(Mode::Async, &t, &r2).unwrap();
        assert_eq!(check(&c, "at the end").ok, Some(false));
        // 64 MiB allocated outside the pool (right after the context, as
        // seen on a GPU) passes; more than that and the slack fails.
        let mut r3 = r.clone();
        r3["gpu"]["processes"][0]["device_bytes_end"] = json!(1036 * MIB + 67_240_960);
        let c = compare(Mode::Async, &t, &r3).unwrap();
        assert_eq!(check(&c, "at the end").ok, Some(true));
        r3["gpu"]["processes"][0]["device_bytes_end"] = json!((1036 + 64 + 20) * MIB);
        let c = compare(Mode::Async, &t, &r3).unwrap();
        assert_eq!(check(&c, "at the end").ok, Some(false));
        // The same ledger in a caching-allocator mode is below reserved.
        let c = compare(Mode::Expandable, &torch_line(Mode::Expandable), &r).unwrap();
        assert_eq!(check(&c, "at the end").ok, Some(false));
        // A backend other than the mode's is caught.
        let c = compare(Mode::Async, &torch_line(Mode::Default), &r).unwrap();
        assert_eq!(check(&c, "allocator").ok, Some(false));
    }

    #[test]
    fn a_worker_with_a_context_lost_events_and_missing_nvml_are_reported() {
        let mut r = report();
        let g = &mut r["gpu"];
        g["processes"].as_array_mut().unwrap().push(json!({
            "pid": 4250, "comm": "pt_data_worker", "contexts": 1,
            "device_bytes_peak": 2 * MIB, "device_bytes_end": 2 * MIB,
            "pinned_bytes_peak": 0, "device": {"allocs": 1}, "nvml": null,
        }));
        g["processes"][0]["nvml"] = Value::Null;
        g["lost_events"] = json!(3);
        let c = compare(Mode::Default, &torch_line(Mode::Default), &r).unwrap();
        let k = check(&c, "other process");
        assert_eq!(k.ok, Some(false));
        assert_eq!(
            k.detail,
            "context(s) in 4250 (pt_data_worker, DataLoader worker)"
        );
        assert_eq!(check(&c, "NVML").ok, None, "not measured is not a failure");
        assert_eq!(check(&c, "lost").ok, Some(false));
        let results = [ModeResult {
            mode: Mode::Default,
            outcome: Ok(c),
        }];
        assert_eq!(failures(&results), 2);
        let s = summary(&results);
        assert!(s.contains("| not listed | 64.0 MiB | 1 / 1 | 3 |"), "{s}");
    }

    #[test]
    fn a_missing_main_process_and_a_failed_run() {
        let mut r = report();
        r["gpu"]["processes"] = json!([]);
        r["gpu"]["attach"] = json!([]);
        let c = compare(Mode::Default, &torch_line(Mode::Default), &r).unwrap();
        let k = check(&c, "saw the main process");
        assert_eq!(k.ok, Some(false));
        assert!(
            k.detail.contains("not in gpu.processes at all"),
            "{}",
            k.detail
        );
        assert_eq!(check(&c, "libcuda").ok, Some(false));

        let results = [
            ModeResult {
                mode: Mode::Default,
                outcome: Ok(c),
            },
            ModeResult {
                mode: Mode::Async,
                outcome: Err("the job printed no TORCH line".into()),
            },
        ];
        let md = render(
            &Machine {
                gpus: vec![],
                kernel: "k".into(),
                python: "p".into(),
                torch: "t".into(),
            },
            &results,
        );
        assert!(md.contains(
            "| async | `backend:cudaMallocAsync` | – | – | – | – | – | – | – | run failed |"
        ));
        assert!(md.contains("The run did not complete: the job printed no TORCH line"));
        assert!(failures(&results) >= 1);
        // A TORCH line without its figures is an error, not zeros.
        let e = compare(Mode::Default, &json!({"pid": 1}), &report()).unwrap_err();
        assert!(format!("{e}").contains("reserved_bytes"), "{e}");
    }

    #[test]
    fn no_gpu_is_said_clearly() {
        let p = gpu_problems(false, None, &[]);
        assert_eq!(
            p,
            [
                "`nvidia-smi` is not on PATH",
                "there is no /dev/nvidia0 (nor any /dev/nvidiaN)"
            ]
        );
        assert_eq!(
            gpu_problems(true, None, &["nvidia0".into()]),
            ["`nvidia-smi` failed (is the NVIDIA driver loaded?)"]
        );
        assert!(
            gpu_problems(
                true,
                Some("0, NVIDIA H200, 570, 143771 MiB\n"),
                &["nvidia0".into()]
            )
            .is_empty()
        );
    }

    /// A fresh directory under the system temp dir, for one test.
    fn scratch(name: &str) -> PathBuf {
        let d = env::temp_dir().join(format!("gpu-check-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// An executable shell script.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn torch_missing_or_without_cuda_is_said_clearly() {
        let d = scratch("probe");
        let job = workspace_root().join(SCRIPT);
        let no_torch = script(
            &d,
            "no-torch",
            "echo \"torch is not importable: ModuleNotFoundError: No module named 'torch'\" >&2; exit 3",
        );
        let e = format!("{:#}", probe_torch(&no_torch, &job).unwrap_err());
        assert!(e.starts_with("torch is not importable by "), "{e}");
        assert!(e.contains("No module named 'torch'"), "{e}");
        let cpu = script(
            &d,
            "cpu-torch",
            r#"echo 'PROBE {"torch": "2.5.1+cpu", "cuda": null, "available": false, "devices": 0}'"#,
        );
        let e = format!("{:#}", probe_torch(&cpu, &job).unwrap_err());
        assert!(
            e.starts_with("torch.cuda.is_available() is False for torch 2.5.1+cpu under ")
                && e.ends_with("this torch is a CPU-only build"),
            "{e}"
        );
        let no_dev = script(
            &d,
            "no-device",
            r#"echo 'PROBE {"torch": "2.5.1", "cuda": "12.4", "available": false, "devices": 0}'"#,
        );
        let e = format!("{:#}", probe_torch(&no_dev, &job).unwrap_err());
        assert!(
            e.contains("built for CUDA 12.4 but finds no usable GPU"),
            "{e}"
        );
        let ok = script(
            &d,
            "ok",
            r#"echo 'PROBE {"torch": "2.5.1", "cuda": "12.4", "available": true, "devices": 1, "device_name": "NVIDIA H200"}'"#,
        );
        let v = probe_torch(&ok, &job).unwrap();
        assert_eq!(
            probe_summary(&v),
            "torch 2.5.1 (CUDA 12.4), 1 device(s), cuda:0 NVIDIA H200"
        );
        let e = format!(
            "{:#}",
            resolve_python(Path::new("no-such-python-here")).unwrap_err()
        );
        assert!(e.contains("pass --python"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    /// The plumbing of one mode's run, with stand-ins for trainbpf (it runs
    /// the job, then reports the fixture) and for Python (it prints a
    /// TORCH line among other output).
    #[test]
    fn a_run_reads_the_torch_line_through_record_and_saves_the_report() {
        let d = scratch("run");
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("gpu/fixtures/report-default.json");
        let bin = script(
            &d,
            "trainbpf",
            &format!(
                "case \"$1\" in\n\
                 record) rec=\"$3\"; shift 4; \"$@\"; st=$?; : > \"$rec\"; exit $st;;\n\
                 report) cat '{}';;\n\
                 esac",
                fixture.display()
            ),
        );
        let line = torch_line(Mode::Expandable).to_string();
        let py = script(
            &d,
            "python",
            &format!(
                "[ \"$2\" = expandable ] || exit 9\n\
                 [ -z \"$PYTORCH_CUDA_ALLOC_CONF\" ] || exit 8\n\
                 echo 'epoch 0'; echo 'TORCH {line}'; echo done"
            ),
        );
        let (torch, report) =
            run_mode(&bin, &py, &d, Path::new("job.py"), &d, Mode::Expandable).unwrap();
        assert_eq!(torch, torch_line(Mode::Expandable));
        assert_eq!(report["job"]["pid"], 4242);
        assert!(d.join("expandable.rec").is_file());
        assert_eq!(
            fs::read_to_string(d.join("expandable.json")).unwrap(),
            fs::read_to_string(&fixture).unwrap()
        );
        let c = compare(Mode::Expandable, &torch, &report).unwrap();
        assert_eq!(check(&c, "allocator").ok, Some(true));

        // A job that fails, and one that prints no TORCH line.
        let e = format!(
            "{:#}",
            run_mode(&bin, &py, &d, Path::new("job.py"), &d, Mode::Async).unwrap_err()
        );
        assert!(
            e.starts_with("`trainbpf record` exited with exit status: 9"),
            "{e}"
        );
        let quiet = script(&d, "quiet", "echo nothing to see");
        let e = format!(
            "{:#}",
            run_mode(&bin, &quiet, &d, Path::new("job.py"), &d, Mode::Default).unwrap_err()
        );
        assert_eq!(e, "the job printed no TORCH line");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn device_nodes_and_tagged_lines() {
        let d = scratch("dev");
        for n in [
            "nvidia0",
            "nvidia3",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia",
            "null",
        ] {
            fs::write(d.join(n), "").unwrap();
        }
        assert_eq!(nvidia_nodes(&d), ["nvidia0", "nvidia3"]);
        fs::remove_dir_all(&d).unwrap();

        let out = "noise\nTORCH {\"a\": 1}\nTORCHX {}\nTORCH {\"a\": 2}\nmore\n";
        assert_eq!(tagged_line(out, "TORCH"), Some(json!({"a": 2})));
        assert_eq!(tagged_line("TORCH not json", "TORCH"), None);
        assert_eq!(tagged_line("", "PROBE"), None);
    }
}
