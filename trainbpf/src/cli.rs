//! Command-line surface: parse, then hand each subcommand to its module.

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use trainbpf_report::pipeline;

use crate::{
    loader::{DEFAULT_PROC_MAP_ENTRIES, OomProbe, Tunables},
    record, report,
};

/// Output paths' `{host}`, `{rank}`, `{run_id}`, `{pid}`, `{time}`.
pub mod placeholders;
use placeholders::Output;
mod values;
pub use values::parse_duration;
use values::{
    MAX_HEARTBEAT_MS, MAX_RELATIVE_SHIFT, parse_hostname, parse_max_size, parse_ring_size,
    parse_size,
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
    /// Run CMD as the invoking user, or attach to a running job, and record
    /// its memory and any OOM kill.
    Record {
        /// Where to write the recording. `{host}`, `{rank}` (RANK or
        /// SLURM_PROCID), `{run_id}` (TORCHELASTIC_RUN_ID or SLURM_JOB_ID),
        /// `{pid}` (the recorder's) and `{time}` (UTC) are replaced, e.g.
        /// `-o /shared/run/{host}.rec` under srun: one file per node.
        #[arg(short, long, default_value = "trainbpf.rec")]
        output: PathBuf,
        /// Run the job in a fresh memory cgroup with this limit (e.g. 300M,
        /// 4G), like a container's memory limit.
        #[arg(long, value_parser = parse_size)]
        memory_limit: Option<u64>,
        /// Report a process when its memory moved by at least this much.
        #[arg(long, default_value = "4M", value_parser = parse_size)]
        rss_threshold: u64,
        /// ...or by 1/2^N of its size, whichever is larger (0: off; at most 62).
        #[arg(long, default_value_t = 6,
              value_parser = clap::value_parser!(u32).range(0..=MAX_RELATIVE_SHIFT))]
        rss_relative_shift: u32,
        /// Report a smaller change once this many milliseconds have passed
        /// (at most a day).
        #[arg(long, default_value_t = 5000,
              value_parser = clap::value_parser!(u64).range(0..=MAX_HEARTBEAT_MS))]
        heartbeat_ms: u64,
        /// Probe on oom_kill_process: auto (fentry, then kprobe), fentry,
        /// kprobe, or none (the victim tracepoint alone).
        #[arg(long, value_enum, default_value_t = OomProbe::Auto)]
        oom_probe: OomProbe,
        /// Ring buffer size (a power of two, at least one page).
        #[arg(long, default_value = "4M", value_parser = parse_ring_size)]
        ring_size: u64,
        /// Entries of the kernel's per-process memory map, a quarter of them
        /// held for the job (tests set it small to fill it).
        #[arg(long, default_value_t = DEFAULT_PROC_MAP_ENTRIES, hide = true,
              value_parser = clap::value_parser!(u32).range(16..=1 << 22))]
        proc_map_entries: u32,
        /// Have the kernel programs log what only they can see (a map that
        /// filled, a ring that refused a record, a kernel read at BTF's
        /// offset that failed), each message with the program that logged
        /// it: into the recording, and to stderr. Off, the log calls are
        /// dead code the verifier drops.
        #[arg(long)]
        ebpf_log: bool,
        /// No status line (elapsed time, top growers, projected time to OOM)
        /// on the terminal while the job runs.
        #[arg(long, short)]
        quiet: bool,
        /// Suspect a leak (status line, verdict) only in a climb that lasted
        /// at least this long.
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        leak_span: std::time::Duration,
        /// Keep the recording under this size (e.g. 500M, 2G; 0 or none: no bound)
        /// for runs of days: when it nears the bound, samples older than
        /// --full-span are folded to a minute's resolution, then coarser;
        /// kills, deaths, process lifecycle, OOM and GPU events are kept.
        #[arg(long, default_value = "1G", value_parser = parse_max_size)]
        max_size: u64,
        /// How much recent history stays at full resolution when the
        /// recording is compacted.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        full_span: std::time::Duration,
        /// Attach to this running process and its descendants, including
        /// those born later; Ctrl-C detaches and leaves it running.
        #[arg(long, conflicts_with_all = ["cgroup", "all", "memory_limit"],
              value_parser = clap::value_parser!(u32).range(1..))]
        pid: Option<u32>,
        /// Attach to everything in this cgroup directory (a container, a
        /// Slurm or systemd job), e.g. /sys/fs/cgroup/system.slice/x.service.
        #[arg(long, conflicts_with_all = ["all", "memory_limit"])]
        cgroup: Option<PathBuf>,
        /// Attach to the whole machine: every process is the job's.
        #[arg(long, conflicts_with = "memory_limit")]
        all: bool,
        /// Growth stacks: take a job process's user stack (frame pointers)
        /// each time its added memory climbs --stack-every above its last
        /// high, and resolve it while the process lives; `report` shows
        /// where each process's memory came from.
        #[arg(long)]
        stacks: bool,
        /// With --stacks: new high between two stacks of a process (e.g.
        /// 512K, 4M).
        #[arg(long, default_value = "512K", value_parser = parse_size, requires = "stacks")]
        stack_every: u64,
        /// Serve Prometheus metrics at http://ADDR/metrics while recording
        /// (e.g. 127.0.0.1:9464; :9464 listens on every interface): kills,
        /// deaths, the job's memory, lost events (docs/metrics.md).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Append each OOM kill and death as one JSON line to PATH, for a
        /// log shipper (docs/metrics.md). Takes -o's placeholders, e.g.
        /// /shared/run/{host}.jsonl.
        #[arg(long, value_name = "PATH")]
        events_jsonl: Option<PathBuf>,
        /// Name this machine NAME in the recording, `{host}` and the event
        /// lines, rather than its own host name (uname -n): a Kubernetes
        /// pod's host name is the pod's, so the DaemonSet passes its node's
        /// (docs/cluster.md).
        #[arg(long, value_name = "NAME", value_parser = parse_hostname)]
        hostname: Option<String>,
        /// The job's command line (not with --pid, --cgroup or --all).
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            required_unless_present_any = ["pid", "cgroup", "all"],
            conflicts_with_all = ["pid", "cgroup", "all"]
        )]
        cmd: Vec<OsString>,
    },
    /// Explain a recording: per kill, who grew memory before it and why that victim.
    Report {
        /// The recording to read; several (or a directory: every *.rec in
        /// it) are the recordings of one job, one per node, merged on one
        /// timeline.
        #[arg(default_value = "trainbpf.rec", num_args = 1..)]
        paths: Vec<PathBuf>,
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
        /// (works offline: no script, nothing fetched). In this and the
        /// other output paths, `{host}` and `{time}` are the recording's
        /// host and start, e.g. `--html {host}.html`.
        #[arg(long, value_name = "PATH", conflicts_with = "events")]
        html: Option<PathBuf>,
        /// Also write a Chrome trace-event JSON of memory over the run, for
        /// ui.perfetto.dev or chrome://tracing.
        #[arg(long, value_name = "PATH", conflicts_with = "events")]
        perfetto: Option<PathBuf>,
        /// Also write the growth stacks (`record --stacks`) as a gzipped
        /// pprof profile, for `go tool pprof`, Pyroscope or Parca.
        #[arg(long, value_name = "PATH", conflicts_with = "events")]
        pprof: Option<PathBuf>,
        /// Print the leaks section alone: the trend of each process's and
        /// role group's honest memory, suspected leaks, time to the limit.
        #[arg(long, conflicts_with = "events")]
        leaks: bool,
        /// Print every process's growth stacks (recorded with `record
        /// --stacks`): where its new highs of memory were taken.
        #[arg(long, conflicts_with_all = ["events", "leaks"])]
        stacks: bool,
        /// Print every diagnosis (what most likely happened, per kill and
        /// for the run) with its confidence, all of its evidence from this
        /// recording and every fix.
        #[arg(long, conflicts_with_all = ["events", "json", "leaks", "stacks"])]
        explain: bool,
        /// Suspect a leak only in a climb that lasted at least this long,
        /// up to the end of the recording or of the process.
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        leak_span: std::time::Duration,
        /// Read only the first DURATION of the recording: the report as it
        /// would have read then.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        until: Option<std::time::Duration>,
    },
    /// Check this machine for what makes or hides OOM kills, and which eBPF
    /// features record can use (docs/doctor.md). Run as root for all checks.
    Doctor {
        /// Machine-readable output: {"checks": [{"id", "status", "finding", "why", "fix"}]}.
        #[arg(long)]
        json: bool,
    },
}

fn leak_options(span: std::time::Duration) -> trainbpf_report::model::LeakOptions {
    trainbpf_report::model::LeakOptions {
        min_span_ns: span.as_nanos().min(u64::MAX as u128) as u64,
        ..Default::default()
    }
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
            proc_map_entries,
            ebpf_log,
            quiet,
            leak_span,
            max_size,
            full_span,
            pid,
            cgroup,
            all,
            stacks,
            stack_every,
            metrics,
            events_jsonl,
            hostname,
            cmd,
        } => {
            let target = match (pid, cgroup, all) {
                (Some(p), _, _) => {
                    if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                        bail!("--pid {p}: no such process");
                    }
                    record::Target::Pid(p)
                }
                // Checked in record: a real cgroup, and the invoker's own
                // processes in it (src/attach.rs).
                (_, Some(dir), _) => record::Target::Cgroup(dir),
                (_, _, true) => record::Target::All,
                _ => record::Target::Run(cmd),
            };
            // Both paths from one set of values: one {time} and {pid}.
            let mut values = placeholders::Values::detect();
            if let Some(h) = &hostname {
                values.host = Ok(h.clone());
            }
            let output = placeholders::expand(Output::Recording, output.as_os_str(), &values)?;
            let events_jsonl = events_jsonl
                .map(|p| placeholders::expand(Output::EventsJsonl, p.as_os_str(), &values))
                .transpose()?;
            let outcome = record::run(record::RecordOptions {
                output,
                memory_limit,
                tunables: Tunables {
                    rss_threshold_bytes: rss_threshold,
                    rss_relative_shift,
                    heartbeat_ms,
                    ring_bytes: ring_size as u32,
                    proc_map_entries,
                    oom_probe,
                    all_processes: matches!(target, record::Target::All),
                    hold_late_cuda: matches!(target, record::Target::Run(_)),
                    stack_every_bytes: stacks.then_some(stack_every.max(1)),
                    ebpf_log,
                },
                target,
                quiet,
                leaks: leak_options(leak_span),
                flight: (max_size != 0).then(|| crate::compact::FlightOptions {
                    max_size,
                    full_span_ns: full_span.as_nanos().min(u64::MAX as u128) as u64,
                }),
                metrics,
                events_jsonl,
                hostname,
            })?;
            // The verdict comes from the recording itself, through the same
            // reader and model as `report`.
            let scope = pipeline::Scope {
                leaks: leak_options(leak_span),
                ..Default::default()
            };
            match report::verdict_with(&outcome.recording, &scope) {
                Ok(v) => eprintln!("{v}"),
                Err(e) => eprintln!("trainbpf: could not read back the recording: {e:#}"),
            }
            Ok(ExitCode::from(outcome.exit_code().clamp(0, 255) as u8))
        }
        Command::Report {
            paths,
            json,
            window,
            no_color,
            events,
            html,
            perfetto,
            pprof,
            leaks,
            stacks,
            explain,
            leak_span,
            until,
        } => {
            // Before any recording is read: a placeholder report cannot
            // expand is an error at once.
            for (o, p) in [
                (Output::Html, &html),
                (Output::Perfetto, &perfetto),
                (Output::Pprof, &pprof),
            ] {
                if let Some(p) = p {
                    placeholders::check(o, p.as_os_str())?;
                }
            }
            let paths = report::inputs(&paths)?;
            let shown = paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            let out = if events {
                match paths.as_slice() {
                    [one] => report::events(one),
                    _ => bail!("--events reads one recording at a time"),
                }
            } else {
                let files = report::Files {
                    html: html.as_deref(),
                    perfetto: perfetto.as_deref(),
                    pprof: pprof.as_deref(),
                };
                let scope = pipeline::Scope {
                    until,
                    leaks: leak_options(leak_span),
                };
                let part = if leaks {
                    pipeline::Part::Leaks
                } else if stacks {
                    pipeline::Part::Stacks
                } else if explain {
                    pipeline::Part::Explain
                } else {
                    pipeline::Part::All
                };
                match paths.as_slice() {
                    [one] => report::run(one, json, window, no_color, &files, &scope, part),
                    many => report::run_merged(many, json, window, no_color, &files, &scope, part),
                }
            }
            .with_context(|| format!("reading {shown}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The report crate's fixture test runs its pipeline with its own
    /// defaults, standing for `report` without flags: they must be the
    /// flags' defaults.
    #[test]
    fn report_without_flags_is_the_pipelines_default() {
        let cli = Cli::try_parse_from(["trainbpf", "report", "x.rec"]).unwrap();
        let Command::Report {
            window,
            leak_span,
            until,
            ..
        } = cli.command
        else {
            panic!("not the report command");
        };
        assert_eq!(window, pipeline::WINDOW);
        let default = pipeline::Scope::default();
        assert_eq!(until, default.until);
        assert_eq!(leak_options(leak_span), default.leaks);
    }
}
