//! `trainbpf record`'s flags, in groups: what to record, where its output
//! goes, the recorder's knobs (`loader::Tunables`) and how long a history
//! it keeps. [`RecordArgs::options`] is the one place they become the
//! recorder's options.

use std::{ffi::OsString, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Result, bail};
use clap::Args;
use trainbpf_report::pipeline;

use crate::{
    loader::Tunables,
    record::{self, RecordOptions, Target, compact::FlightOptions},
    report,
    util::{
        placeholders::{self, Output},
        values::{parse_duration, parse_hostname, parse_max_size, parse_size},
    },
};

#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub job: Job,
    #[command(flatten, next_help_heading = "Output")]
    pub outputs: Outputs,
    #[command(flatten, next_help_heading = "Recorder")]
    pub tunables: Tunables,
    #[command(flatten, next_help_heading = "History")]
    pub history: History,
}

/// What the recorder writes and shows.
#[derive(Args, Debug)]
pub struct Outputs {
    /// Where to write the recording. `{host}`, `{rank}` (RANK or
    /// SLURM_PROCID), `{run_id}` (TORCHELASTIC_RUN_ID or SLURM_JOB_ID),
    /// `{pid}` (the recorder's) and `{time}` (UTC) are replaced, e.g.
    /// `-o /shared/run/{host}.rec` under srun: one file per node.
    #[arg(short, long, value_name = "PATH", default_value = "trainbpf.rec")]
    pub output: PathBuf,
    /// No status line (elapsed time, top growers, projected time to OOM)
    /// on the terminal while the job runs.
    #[arg(long, short)]
    pub quiet: bool,
    /// Say at start which probe each thing is seen through, what fell
    /// back and why, and what the GPU probes found. Without it the start
    /// is one line, and a warning only where the recording will miss
    /// something; the recording keeps all of it (`report`, `doctor`).
    #[arg(long, short)]
    pub verbose: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while recording
    /// (e.g. 127.0.0.1:9464; :9464 listens on every interface): kills,
    /// deaths, the job's memory, lost events (docs/metrics.md).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Append each OOM kill and death as one JSON line to PATH, for a
    /// log shipper (docs/metrics.md). Takes -o's placeholders, e.g.
    /// /shared/run/{host}.jsonl.
    #[arg(long, value_name = "PATH")]
    pub events_jsonl: Option<PathBuf>,
    /// Name this machine NAME in the recording, `{host}` and the event
    /// lines, rather than its own host name (uname -n): a Kubernetes
    /// pod's host name is the pod's, so the DaemonSet passes its node's
    /// (docs/cluster.md).
    #[arg(long, value_name = "NAME", value_parser = parse_hostname)]
    pub hostname: Option<String>,
}

/// How much history the recording keeps, and what it calls a leak.
#[derive(Args, Debug)]
pub struct History {
    /// Suspect a leak (status line, verdict) only in a climb that lasted
    /// at least this long.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub leak_span: Duration,
    /// Keep the recording under this size (e.g. 500M, 2G; 0 or none: no bound)
    /// for runs of days: when it nears the bound, samples older than
    /// --full-span are folded to a minute's resolution, then coarser;
    /// kills, deaths, process lifecycle, OOM and GPU events are kept.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_max_size)]
    pub max_size: u64,
    /// How much recent history stays at full resolution when the
    /// recording is compacted.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub full_span: Duration,
}

/// What is recorded: a command the recorder starts, or a running job.
#[derive(Args, Debug)]
pub struct Job {
    /// Run the job in a fresh memory cgroup with this limit (e.g. 300M,
    /// 4G), like a container's memory limit.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory_limit: Option<u64>,
    /// Attach to this running process and its descendants, including
    /// those born later; Ctrl-C detaches and leaves it running.
    #[arg(long, value_name = "PID", conflicts_with_all = ["cgroup", "all", "memory_limit"],
          value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Option<u32>,
    /// Attach to everything in this cgroup directory (a container, a
    /// Slurm or systemd job), e.g. /sys/fs/cgroup/system.slice/x.service.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["all", "memory_limit"])]
    pub cgroup: Option<PathBuf>,
    /// Attach to the whole machine: every process is the job's.
    #[arg(long, conflicts_with = "memory_limit")]
    pub all: bool,
    /// The job's command line (not with --pid, --cgroup or --all).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present_any = ["pid", "cgroup", "all"],
        conflicts_with_all = ["pid", "cgroup", "all"]
    )]
    pub cmd: Vec<OsString>,
}

impl RecordArgs {
    /// The recorder's options: the target told apart, the output paths'
    /// placeholders expanded (both from one set of values: one `{time}`
    /// and `{pid}`), the knobs that follow from the target set.
    pub fn options(self) -> Result<RecordOptions> {
        let RecordArgs {
            outputs,
            mut tunables,
            history,
            job,
        } = self;
        let target = match (job.pid, job.cgroup, job.all) {
            (Some(p), _, _) => {
                if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                    bail!("--pid {p}: no such process");
                }
                Target::Pid(p)
            }
            // Checked in record: a real cgroup, and the invoker's own
            // processes in it (record/target.rs).
            (_, Some(dir), _) => Target::Cgroup(dir),
            (_, _, true) => Target::All,
            _ => Target::Run(job.cmd),
        };
        tunables.all_processes = matches!(target, Target::All);
        tunables.hold_late_cuda =
            matches!(target, Target::Run(_)) && record::gpu::late_window_forced().is_none();
        let mut values = placeholders::Values::detect();
        if let Some(h) = &outputs.hostname {
            values.host = Ok(h.clone());
        }
        let output = placeholders::expand(Output::Recording, outputs.output.as_os_str(), &values)?;
        let events_jsonl = outputs
            .events_jsonl
            .map(|p| placeholders::expand(Output::EventsJsonl, p.as_os_str(), &values))
            .transpose()?;
        Ok(RecordOptions {
            output,
            memory_limit: job.memory_limit,
            tunables,
            target,
            quiet: outputs.quiet,
            verbose: outputs.verbose,
            leaks: super::leak_options(history.leak_span),
            flight: (history.max_size != 0).then(|| FlightOptions {
                max_size: history.max_size,
                full_span_ns: history.full_span.as_nanos().min(u64::MAX as u128) as u64,
            }),
            metrics: outputs.metrics,
            events_jsonl,
            hostname: outputs.hostname,
        })
    }
}

pub(super) fn run(args: RecordArgs) -> Result<ExitCode> {
    let opts = args.options()?;
    let scope = pipeline::Scope {
        leaks: opts.leaks.clone(),
        ..Default::default()
    };
    let outcome = record::run(opts)?;
    // The verdict comes from the recording itself, through the same reader
    // and model as `report`.
    match report::verdict_with(&outcome.recording, &scope) {
        Ok(v) => eprintln!("{v}"),
        Err(e) => eprintln!("trainbpf: could not read back the recording: {e:#}"),
    }
    Ok(ExitCode::from(outcome.exit_code().clamp(0, 255) as u8))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};

    fn stacks(args: &[&str]) -> Result<Option<u64>, clap::Error> {
        let argv = ["trainbpf", "record"]
            .iter()
            .chain(args)
            .chain(&["--", "true"]);
        let Command::Record(r) = Cli::try_parse_from(argv)?.command else {
            panic!("not the record command");
        };
        Ok(r.tunables.stack_every_bytes())
    }

    /// Stacks are on unless `--no-stacks`; the old `--stacks` still runs.
    #[test]
    fn stacks_are_on_by_default() {
        assert_eq!(stacks(&[]).unwrap(), Some(512 << 10));
        assert_eq!(stacks(&["--stacks"]).unwrap(), Some(512 << 10));
        assert_eq!(stacks(&["--stack-every", "4M"]).unwrap(), Some(4 << 20));
        assert_eq!(stacks(&["--no-stacks"]).unwrap(), None);
        assert!(stacks(&["--no-stacks", "--stacks"]).is_err());
        assert!(stacks(&["--no-stacks", "--stack-every", "4M"]).is_err());
    }
}
