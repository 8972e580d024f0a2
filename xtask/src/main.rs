//! Developer tasks for trainbpf, run as `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`). Every task installs what it needs first, so a fresh
//! clone needs nothing but rustup, python3 and a C compiler.

mod bench;
mod deps;
mod fuzz;
mod gpu_check;
mod manifests;
mod privilege;
mod report_bench;
mod setup;
mod soak;
mod tasks;
mod torch;
mod util;
mod vm;
mod wheel;

use std::{ffi::OsString, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    about = "trainbpf developer tasks",
    after_help = "Root tasks run as they are as root. Started by another user, they build \
                  as that user, then re-run themselves under sudo."
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the pinned eBPF toolchain (nightly with rust-src and clippy, bpf-linker
    /// linked to its LLVM) and mount tracefs; seconds when already done.
    Setup,
    /// Setup, then build trainbpf (debug) and print the binary's path.
    Build,
    /// Root: setup, build, fmt, unused dependencies and clippy, then the
    /// whole test suite.
    Test {
        /// Skip `cargo fmt --check`, the unused-dependency check and
        /// `cargo clippy -D warnings`.
        #[arg(long)]
        no_lint: bool,
        /// Passed to `cargo test --workspace` as they are, e.g. a test name
        /// filter and `-- --nocapture`.
        #[arg(last = true)]
        cargo_test_args: Vec<OsString>,
    },
    /// Validate deploy/kubernetes/ against Kubernetes' schemas, offline
    /// (kubernetes-validate, installed once into a venv under target/);
    /// `test` runs it.
    Manifests,
    /// Fail on a dependency the workspace declares and no code uses
    /// (cargo-shear, installed once); `test` runs it with the lints.
    Deps,
    /// Build the pip wheel (static binary, eBPF object inside) with a pinned
    /// maturin into target/wheels, and print its path.
    Wheel,
    /// Root: build, record the bundled example being OOM-killed in a
    /// 300 MiB memory limit, then print the report.
    Demo,
    /// Root: overhead benchmark. Each workload runs untraced,
    /// under trainbpf (with and without --stacks where the stacks rule asks),
    /// bpftrace and perf, interleaved; writes
    /// target/bench/results.md (smoke.md with --smoke) and prints it. About
    /// 35 minutes in full.
    Bench {
        /// A few seconds in all, on the debug build: proves every tool still
        /// runs (for CI); the figures mean nothing and nothing is asserted.
        #[arg(long)]
        smoke: bool,
        /// Runs of each arm [default: 5, or 1 with --smoke].
        #[arg(long)]
        runs: Option<usize>,
        /// Seconds of one W4 (steady job) run [default: 180, or 2 with --smoke].
        #[arg(long)]
        w4_secs: Option<u64>,
        /// Only these workloads, by id: W1-1, W1-N, W3, W4, W5 (steady
        /// growth), W6 (Python-heavy), G1 (CUDA allocation loop on the
        /// stand-in driver), G2 (the same on the machine's driver, with a
        /// GPU), B1 to B4 (a fault storm, a getppid loop, a fork storm and
        /// a waitpid loop outside the job, beside a recorder tracing
        /// `sleep`), L1 (the recorder's start-up and exit, in parts), A1
        /// (`record --all` beside 10,000 processes and 1,000 forks a
        /// second) (comma-separated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// Write a large synthetic recording with trainbpf's real writer: a
    /// training job with re-spawned DataLoader workers and a few OOM kills
    /// (trainbpf/examples/gen_recording.rs).
    GenRecording {
        /// Hours of recording.
        #[arg(long, default_value_t = 24.0)]
        hours: f64,
        /// Processes in the job: the trainer and its workers.
        #[arg(long, default_value_t = 8)]
        procs: usize,
        /// MiB each worker allocates and frees per batch (the record rate).
        #[arg(long, default_value_t = 24)]
        batch_mib: u32,
        #[arg(short, long)]
        output: std::path::PathBuf,
    },
    /// Time `trainbpf report` (text, JSON, HTML and Perfetto) and its peak
    /// RSS on generated 24-hour recordings; writes
    /// target/bench-report/results.md (BENCHMARKS.md quotes it).
    BenchReport {
        #[arg(long, default_value_t = 24.0)]
        hours: f64,
        #[arg(long, default_value_t = 8)]
        procs: usize,
        /// Runs of each measurement.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Boot Debian's kernel (it has kprobes) under qemu with a static
    /// trainbpf, cause a memory-cgroup OOM kill in the guest and check that
    /// the oom_kill_process probe gave points, totalpages and the trigger.
    Vm {
        /// Kernel line: 5.10 (bullseye), 6.1 (bookworm) or 6.12 (trixie),
        /// or `all` for each of them in turn, one boot each.
        #[arg(long, default_value = "6.1")]
        kernel: String,
        /// The Debian suite to take the kernel from, for a line not above.
        #[arg(long)]
        suite: Option<String>,
        /// The Debian archive to fetch from [default: the first Debian
        /// archive in this machine's apt sources].
        #[arg(long)]
        mirror: Option<String>,
        /// Seconds each guest gets from boot to power-off.
        #[arg(long, default_value_t = 240)]
        timeout: u64,
    },
    /// Root, on a machine with an NVIDIA GPU: record real PyTorch CUDA
    /// jobs (default allocator, expandable_segments, cudaMallocAsync; a
    /// pin_memory DataLoader) and compare trainbpf's GPU ledger with
    /// torch.cuda.memory_reserved() and NVML; writes DIR/gpu-check.md.
    /// Not run in CI (no GPU there): without a GPU, an importable torch or
    /// torch.cuda.is_available() it fails at once and says which
    /// (docs/gpu.md).
    GpuCheck {
        /// The Python that has torch. xtask's own re-run under sudo keeps
        /// the user's PATH; a `sudo cargo xtask` typed by hand has sudo's
        /// secure_path instead: pass --python "$(which python3)".
        #[arg(long, default_value = "python3")]
        python: std::path::PathBuf,
        /// Where the records, reports and gpu-check.md go
        /// [default: target/gpu-check].
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// A prebuilt trainbpf binary to record with; skips setup and the
        /// build, so the machine needs no cargo or eBPF toolchain (run from
        /// the checkout's root where xtask was built elsewhere).
        #[arg(long)]
        bin: Option<std::path::PathBuf>,
    },
    /// Fuzz the recording decoder (reader, decoder, model, renderers) with
    /// cargo-fuzz/libFuzzer for a while; installs cargo-fuzz and the pinned
    /// nightly first. Fails on any crash, leak or allocation over 64 MiB
    /// (docs/fuzzing.md).
    Fuzz {
        /// Seconds of fuzzing, the build not counted.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Root: record a busy job (memory churn, forks, execs) for a while
    /// and check that the recorder's own RSS stays flat: a least-squares
    /// slope after the warm-up of at most 1 MiB per 10 minutes. Writes
    /// target/soak/rss.csv (BENCHMARKS.md quotes the 10-minute figure).
    Soak {
        /// Minutes measured, after a warm-up of a quarter of that (5-60 s).
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
        /// Processes allocating and freeing memory in the job.
        #[arg(long, default_value_t = 4)]
        workers: u32,
    },
}

fn main() -> ExitCode {
    // The error chain alone: an expected failure (not root, a failed test)
    // needs no backtrace, even where RUST_BACKTRACE is set.
    match run(Cli::parse().task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

impl Task {
    /// A task that needs root: its name and why.
    fn needs_root(&self) -> Option<(&'static str, &'static str)> {
        Some(match self {
            Task::Test { .. } => ("test", "the privileged tests"),
            Task::Demo => ("demo", "recording"),
            Task::Bench { .. } => ("bench", "tracing the workloads"),
            Task::Soak { .. } => ("soak", "recording"),
            Task::GpuCheck { .. } => ("gpu-check", "recording"),
            _ => return None,
        })
    }

    /// What a root task builds, done first as the invoking user.
    fn build_as_user(&self) -> anyhow::Result<()> {
        match self {
            Task::Test {
                no_lint,
                cargo_test_args,
            } => tasks::test_build(
                !no_lint,
                privilege::cargo_args_before_dashdash(cargo_test_args),
            )
            .map(drop),
            Task::Bench { smoke: false, .. } => tasks::build_release().map(drop),
            Task::GpuCheck { bin: Some(_), .. } => Ok(()),
            _ => tasks::build().map(drop),
        }
    }
}

fn run(task: Task) -> anyhow::Result<()> {
    if let Some((name, why)) = task.needs_root() {
        privilege::become_root(name, why, || task.build_as_user())?;
    }
    match task {
        Task::Setup => setup::setup(),
        Task::Build => {
            let bin = tasks::build()?;
            // Alone on stdout (progress goes to stderr): `BIN=$(cargo xtask build)`.
            println!("{}", bin.display());
            Ok(())
        }
        Task::Test {
            no_lint,
            cargo_test_args,
        } => tasks::test(!no_lint, &cargo_test_args),
        Task::Demo => tasks::demo(),
        Task::Wheel => {
            // Alone on stdout, as `build` prints the binary.
            println!("{}", wheel::build()?.display());
            Ok(())
        }
        Task::Deps => deps::check(),
        Task::Manifests => manifests::validate(),
        Task::Bench {
            smoke,
            runs,
            w4_secs,
            only,
        } => bench::bench(bench::Options {
            smoke,
            runs,
            w4_secs,
            only,
        }),
        Task::GenRecording {
            hours,
            procs,
            batch_mib,
            output,
        } => report_bench::gen_recording(&report_bench::GenOptions {
            hours,
            procs,
            batch_mib,
            output,
        }),
        Task::BenchReport { hours, procs, runs } => {
            report_bench::bench_report(&report_bench::BenchOptions { hours, procs, runs })
        }
        Task::Vm {
            kernel,
            suite,
            mirror,
            timeout,
        } => vm::vm(&vm::Options {
            kernel,
            suite,
            mirror,
            timeout: std::time::Duration::from_secs(timeout),
        }),
        Task::GpuCheck { python, out, bin } => {
            gpu_check::gpu_check(&gpu_check::Options { python, out, bin })
        }
        Task::Fuzz { seconds } => fuzz::fuzz(&fuzz::Options { seconds }),
        Task::Soak { minutes, workers } => soak::soak(&soak::Options { minutes, workers }),
    }
}
