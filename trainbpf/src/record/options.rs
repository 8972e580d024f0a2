//! What `record` is asked to do: the command line's options, turned into
//! these once (`cli::RecordArgs::options`).

use std::{ffi::OsString, path::PathBuf};

use crate::loader::Tunables;

/// Everything `record::run` takes.
pub struct RecordOptions {
    pub output: PathBuf,
    pub memory_limit: Option<u64>,
    pub tunables: Tunables,
    pub target: Target,
    /// No status line on the terminal.
    pub quiet: bool,
    /// The probes and fallbacks said at start (`-v`).
    pub verbose: bool,
    /// What the status line calls a leak.
    pub leaks: trainbpf_report::model::LeakOptions,
    /// Keep the recording under a size (`--max-size`); `None`: unbounded.
    pub flight: Option<crate::record::compact::FlightOptions>,
    /// `--metrics ADDR`: serve Prometheus metrics there (docs/metrics.md).
    pub metrics: Option<String>,
    /// `--events-jsonl PATH`: each kill and death as a JSON line.
    pub events_jsonl: Option<PathBuf>,
    /// `--hostname NAME`: the host the recording names, in place of
    /// uname's node name.
    pub hostname: Option<String>,
}

/// What to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Run this command as the job.
    Run(Vec<OsString>),
    /// Attach to a running process and its descendants, born later too.
    Pid(u32),
    /// Everything in a cgroup (a container, a Slurm or systemd job).
    Cgroup(PathBuf),
    /// The whole machine.
    All,
}
