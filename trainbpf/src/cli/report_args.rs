//! `trainbpf report`'s flags: what is read, in which format it is shown,
//! which part of the text, and which files are written beside it.
//! [`ReportArgs::options`] is the one place they become the report's
//! options.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use trainbpf_report::pipeline::{Part, Scope};

use crate::{
    report::{self, Files, Format, ReportOptions},
    util::{
        placeholders::{self, Output},
        values::parse_duration,
    },
};

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The recording to read; several (or a directory: every *.rec in
    /// it) are the recordings of one job, one per node, merged on one
    /// timeline.
    #[arg(default_value = "trainbpf.rec", num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// What is printed: the report as text, the report as JSON (schema
    /// trainbpf.report/1, docs/report-json.md), or every decoded event as
    /// a JSON line.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Print one part of the text report alone: the leaks section (each
    /// process's and role group's trend, suspected leaks, time to the
    /// limit), every process's growth stacks (`record --stacks`), or every
    /// diagnosis with its confidence, all its evidence and every fix.
    #[arg(long, value_enum)]
    pub only: Option<Only>,
    /// How far before each kill to look for growth, e.g. 60s, 2m, 500ms.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub window: Duration,
    /// Never colour the output.
    #[arg(long)]
    pub no_color: bool,
    /// Also write the report as one self-contained HTML page with charts
    /// (works offline: no script, nothing fetched). In this and the
    /// other output paths, `{host}` and `{time}` are the recording's
    /// host and start, e.g. `--html {host}.html`.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
    /// Also write a Chrome trace-event JSON of memory over the run, for
    /// ui.perfetto.dev or chrome://tracing.
    #[arg(long, value_name = "PATH")]
    pub perfetto: Option<PathBuf>,
    /// Also write the growth stacks (`record --stacks`) as a gzipped
    /// pprof profile, for `go tool pprof`, Pyroscope or Parca.
    #[arg(long, value_name = "PATH")]
    pub pprof: Option<PathBuf>,
    /// Suspect a leak only in a climb that lasted at least this long,
    /// up to the end of the recording or of the process.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub leak_span: Duration,
    /// Read only the first DURATION of the recording: the report as it
    /// would have read then.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub until: Option<Duration>,
    #[command(flatten)]
    pub short: Shorthands,
}

/// `report --only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Only {
    Leaks,
    Stacks,
    Explain,
}

/// The flags `--format` and `--only` replaced, kept for scripts that
/// pass them: `--json` and `--events` are `--format json|events`,
/// `--leaks`, `--stacks` and `--explain` are `--only ...`.
#[derive(Args, Debug, Default)]
pub struct Shorthands {
    #[arg(long, hide = true)]
    pub json: bool,
    #[arg(long, hide = true)]
    pub events: bool,
    #[arg(long, hide = true)]
    pub leaks: bool,
    #[arg(long, hide = true)]
    pub stacks: bool,
    #[arg(long, hide = true)]
    pub explain: bool,
}

/// The one value among the flag and its shorthands; two different ones
/// are a usage error naming the flag.
fn one_of<T: Copy + PartialEq + ValueEnum>(
    flag: &str,
    given: Option<T>,
    shorthands: &[(bool, T)],
) -> Result<Option<T>> {
    let mut picked = given;
    for &(set, v) in shorthands {
        if !set {
            continue;
        }
        match picked {
            Some(p) if p != v => bail!(
                "--{flag} takes one value: {} and {} were both asked for",
                name(p),
                name(v)
            ),
            _ => picked = Some(v),
        }
    }
    Ok(picked)
}

fn name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

impl ReportArgs {
    /// The report's options, checked together: a part of the text only
    /// with text, output files only with a report.
    pub fn options(&self) -> Result<ReportOptions> {
        let s = &self.short;
        let format = one_of(
            "format",
            self.format,
            &[(s.json, Format::Json), (s.events, Format::Events)],
        )?
        .unwrap_or(Format::Text);
        let only = one_of(
            "only",
            self.only,
            &[
                (s.leaks, Only::Leaks),
                (s.stacks, Only::Stacks),
                (s.explain, Only::Explain),
            ],
        )?;
        if let (Some(o), false) = (only, format == Format::Text) {
            bail!(
                "--only {} is a part of the text report; --format {} shows everything",
                name(o),
                name(format)
            );
        }
        let files = Files {
            html: self.html.clone(),
            perfetto: self.perfetto.clone(),
            pprof: self.pprof.clone(),
        };
        if format == Format::Events && files.any() {
            bail!(
                "--format events prints the raw events: --html, --perfetto and --pprof need a report"
            );
        }
        // Before any recording is read: a placeholder report cannot
        // expand is an error at once.
        for (o, p) in [
            (Output::Html, &files.html),
            (Output::Perfetto, &files.perfetto),
            (Output::Pprof, &files.pprof),
        ] {
            if let Some(p) = p {
                placeholders::check(o, p.as_os_str())?;
            }
        }
        Ok(ReportOptions {
            format,
            part: match only {
                None => Part::All,
                Some(Only::Leaks) => Part::Leaks,
                Some(Only::Stacks) => Part::Stacks,
                Some(Only::Explain) => Part::Explain,
            },
            window: self.window,
            no_color: self.no_color,
            files,
            scope: Scope {
                until: self.until,
                leaks: super::leak_options(self.leak_span),
            },
        })
    }
}

pub(super) fn run(args: ReportArgs) -> Result<ExitCode> {
    let opts = args.options()?;
    let paths = report::inputs(&args.paths)?;
    let shown = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let out = report::run(&paths, &opts).with_context(|| format!("reading {shown}"))?;
    crate::util::write_stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use trainbpf_report::pipeline;

    use super::*;
    use crate::cli::{Cli, Command};

    fn options(args: &[&str]) -> Result<ReportOptions> {
        let argv = ["trainbpf", "report"].iter().chain(args);
        let Command::Report(r) = Cli::try_parse_from(argv)?.command else {
            panic!("not the report command");
        };
        r.options()
    }

    /// The report crate's fixture test runs its pipeline with its own
    /// defaults, standing for `report` without flags: they must be the
    /// flags' defaults.
    #[test]
    fn report_without_flags_is_the_pipelines_default() {
        let o = options(&["x.rec"]).unwrap();
        assert_eq!(o.window, pipeline::WINDOW);
        let default = Scope::default();
        assert_eq!(o.scope.until, default.until);
        assert_eq!(o.scope.leaks, default.leaks);
        assert_eq!(o.format, Format::Text);
        assert_eq!(o.part, Part::All);
    }

    #[test]
    fn a_shorthand_is_its_value() {
        assert_eq!(options(&["--json"]).unwrap().format, Format::Json);
        assert_eq!(
            options(&["--format=json", "--json"]).unwrap().format,
            Format::Json
        );
        assert_eq!(options(&["--events"]).unwrap().format, Format::Events);
        assert_eq!(options(&["--stacks"]).unwrap().part, Part::Stacks);
        assert_eq!(options(&["--only", "explain"]).unwrap().part, Part::Explain);
    }

    #[test]
    fn choices_that_exclude_each_other_are_refused() {
        for bad in [
            &["--json", "--events"][..],
            &["--format=text", "--json"],
            &["--leaks", "--stacks"],
            &["--only=leaks", "--explain"],
            &["--format=json", "--only=explain"],
            &["--events", "--leaks"],
            &["--format=events", "--html", "x.html"],
        ] {
            let e = options(bad).err().map(|e| e.to_string());
            assert!(e.is_some(), "{bad:?} was taken");
        }
    }
}
