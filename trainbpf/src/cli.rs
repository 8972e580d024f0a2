//! Command-line surface: clap's structs, each turned once into the options
//! its command takes (`record::RecordOptions`, `report::ReportOptions`).

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

mod record_args;
mod report_args;

pub use record_args::RecordArgs;
pub use report_args::{Only, ReportArgs};

/// `--version`: the release, and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TRAINBPF_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "trainbpf",
    version = VERSION,
    about = "Explains why a training job was OOM-killed: who grew memory before the kill, and why that victim"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run CMD as the invoking user, or attach to a running job, and record
    /// its memory and any OOM kill.
    Record(RecordArgs),
    /// Explain a recording: per kill, who grew memory before it and why that victim.
    Report(ReportArgs),
    /// Check this machine for what makes or hides OOM kills, and which eBPF
    /// features record can use (docs/doctor.md). Run as root for all checks.
    Doctor {
        /// Machine-readable output: {"checks": [{"id", "status", "finding", "why", "fix"}]}.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Record(args) => record_args::run(args),
        Command::Report(args) => report_args::run(args),
        // Doctor diagnoses: warnings and failures are findings, not errors.
        Command::Doctor { json } => {
            crate::util::write_stdout(&crate::doctor::run(json))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// What `--leak-span` makes of the leak rules, for the status line, the
/// end-of-run verdict and the report alike.
fn leak_options(span: std::time::Duration) -> trainbpf_report::model::LeakOptions {
    trainbpf_report::model::LeakOptions {
        min_span_ns: span.as_nanos().min(u64::MAX as u128) as u64,
        ..Default::default()
    }
}
