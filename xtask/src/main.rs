//! Developer tasks for trainbpf, run as `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`). Every task installs what it needs first, so a fresh
//! clone needs nothing but rustup, python3 and a C compiler.

mod setup;
mod tasks;
mod util;

use std::{ffi::OsString, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "trainbpf developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the pinned eBPF toolchain (nightly with rust-src, bpf-linker
    /// linked to its LLVM) and mount tracefs; seconds when already done.
    Setup,
    /// Setup, then build trainbpf (debug) and print the binary's path.
    Build,
    /// As root: setup, build, fmt and clippy, then the whole test suite.
    Test {
        /// Skip `cargo fmt --check` and `cargo clippy -D warnings`.
        #[arg(long)]
        no_lint: bool,
        /// Passed to `cargo test --workspace` as they are, e.g. a test name
        /// filter and `-- --nocapture`.
        #[arg(last = true)]
        cargo_test_args: Vec<OsString>,
    },
    /// As root: build, record the bundled example being OOM-killed in a
    /// 300 MiB memory limit, then print the report.
    Demo,
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

fn run(task: Task) -> anyhow::Result<()> {
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
    }
}
