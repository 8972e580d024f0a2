//! Command-line surface: parse, then hand each subcommand to its module.

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

use crate::{
    job,
    loader::{OomProbe, Tunables},
    record, report,
};

#[derive(Parser, Debug)]
#[command(
    name = "trainbpf",
    version,
    about = "Explains why a training job was OOM-killed: who grew memory before the kill, and why that victim"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run CMD as the invoking user and record its memory and any OOM kill.
    Record {
        /// Where to write the recording.
        #[arg(short, long, default_value = "trainbpf.rec")]
        output: PathBuf,
        /// Run the job in a fresh memory cgroup with this limit (e.g. 300M,
        /// 4G), like a container's memory limit.
        #[arg(long, value_parser = job::parse_size)]
        memory_limit: Option<u64>,
        /// Report a process when its memory moved by at least this much.
        #[arg(long, default_value = "4M", value_parser = job::parse_size)]
        rss_threshold: u64,
        /// ...or by 1/2^N of its size, whichever is larger (0: off).
        #[arg(long, default_value_t = 6)]
        rss_relative_shift: u32,
        /// Report a smaller change once this many milliseconds have passed.
        #[arg(long, default_value_t = 5000)]
        heartbeat_ms: u64,
        /// Probe on oom_kill_process: auto (fentry, then kprobe), fentry,
        /// kprobe, or none (the victim tracepoint alone).
        #[arg(long, value_enum, default_value_t = OomProbe::Auto)]
        oom_probe: OomProbe,
        /// Ring buffer size (a power of two, at least one page).
        #[arg(long, default_value = "4M", value_parser = job::parse_size)]
        ring_size: u64,
        /// The job's command line.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<OsString>,
    },
    /// Explain a recording: per kill, who grew memory before it and why that victim.
    Report {
        /// The recording to read.
        #[arg(default_value = "trainbpf.rec")]
        path: PathBuf,
        /// Machine-readable output (schema trainbpf.report/1, docs/report-json.md).
        #[arg(long)]
        json: bool,
        /// How far before each kill to look for growth, e.g. 60s, 2m, 500ms.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        window: std::time::Duration,
        /// Never colour the output.
        #[arg(long)]
        no_color: bool,
        /// Print every decoded event as a JSON line instead of a report.
        #[arg(long, conflicts_with = "json")]
        events: bool,
        /// Also write the report as one self-contained HTML page with charts
        /// (works offline: no script, nothing fetched).
        #[arg(long, value_name = "PATH", conflicts_with = "events")]
        html: Option<PathBuf>,
        /// Also write a Chrome trace-event JSON of memory over the run, for
        /// ui.perfetto.dev or chrome://tracing.
        #[arg(long, value_name = "PATH", conflicts_with = "events")]
        perfetto: Option<PathBuf>,
    },
    /// Check this machine for what makes or hides OOM kills, and which eBPF
    /// features record can use (docs/doctor.md). Run as root for all checks.
    Doctor {
        /// Machine-readable output: {"checks": [{"id", "status", "finding", "why", "fix"}]}.
        #[arg(long)]
        json: bool,
    },
}

/// `60s`, `2m`, `500ms`, `1h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        u => {
            return Err(format!(
                "invalid duration unit {u:?} in {s:?} (use ms, s, m or h)"
            ));
        }
    };
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Record {
            output,
            memory_limit,
            rss_threshold,
            rss_relative_shift,
            heartbeat_ms,
            oom_probe,
            ring_size,
            cmd,
        } => {
            if !ring_size.is_power_of_two() || ring_size < 4096 || ring_size > u32::MAX as u64 {
                bail!("--ring-size must be a power of two between 4K and 2G, got {ring_size}");
            }
            let outcome = record::run(record::RecordOptions {
                output,
                memory_limit,
                tunables: Tunables {
                    rss_threshold_bytes: rss_threshold,
                    rss_relative_shift,
                    heartbeat_ms,
                    ring_bytes: ring_size as u32,
                    oom_probe,
                },
                argv: cmd,
            })?;
            // The verdict comes from the recording itself, through the same
            // reader and model as `report`.
            match report::verdict(&outcome.output) {
                Ok(v) => eprintln!("{v}"),
                Err(e) => eprintln!("trainbpf: could not read back the recording: {e:#}"),
            }
            Ok(ExitCode::from(outcome.exit_code().clamp(0, 255) as u8))
        }
        Command::Report {
            path,
            json,
            window,
            no_color,
            events,
            html,
            perfetto,
        } => {
            let out = if events {
                report::events(&path)
            } else {
                let files = report::Files {
                    html: html.as_deref(),
                    perfetto: perfetto.as_deref(),
                };
                report::run(&path, json, window, no_color, &files)
            }
            .with_context(|| format!("reading {}", path.display()))?;
            crate::write_stdout(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        // Doctor diagnoses: warnings and failures are findings, not errors.
        Command::Doctor { json } => {
            crate::write_stdout(&crate::doctor::run(json))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
