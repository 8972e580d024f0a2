//! `trainbpf report` and the end-of-run verdict: the recordings opened and
//! the output files written as the invoking user, and what is between them
//! (reader → model → renderer) left to `trainbpf_report::pipeline`.
use std::{
    fs::File,
    io::{BufReader, IsTerminal as _},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Result, bail};
use trainbpf_report::{
    model::{self, Report},
    pipeline::{self, Part, Scope},
    render,
};

use crate::util::{placeholders, safe_file};

/// The recording, opened as the user who ran `sudo`:
/// root's rights must not read another user's 0600 recording.
fn open_input(path: &Path) -> Result<File> {
    let owner = safe_file::Owner::from(&crate::util::invoker::Invoker::detect()?);
    Ok(safe_file::open_input(path, owner)?)
}

/// Every decoded event as one JSON object per line: for debugging probes
/// and for tools that want the raw timeline.
fn events(path: &Path) -> Result<String> {
    let f = open_input(path)?;
    Ok(pipeline::events(BufReader::with_capacity(1 << 16, f))?)
}

/// Files `report` writes besides what it prints.
#[derive(Clone, Debug, Default)]
pub struct Files {
    pub html: Option<PathBuf>,
    pub perfetto: Option<PathBuf>,
    pub pprof: Option<PathBuf>,
}

impl Files {
    pub fn any(&self) -> bool {
        self.html.is_some() || self.perfetto.is_some() || self.pprof.is_some()
    }
}

/// What `report` prints: the report as text or JSON, or the decoded
/// events (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Events,
}

/// What `report` prints and writes (`cli::ReportArgs::options`).
#[derive(Clone, Debug)]
pub struct ReportOptions {
    pub format: Format,
    /// With text: the part printed.
    pub part: Part,
    /// How far before each kill to look for growth.
    pub window: Duration,
    pub no_color: bool,
    pub files: Files,
    pub scope: Scope,
}

/// The report of `paths`: one recording, or several merged on one
/// timeline; or, for one, its decoded events.
pub fn run(paths: &[PathBuf], opts: &ReportOptions) -> Result<String> {
    match (paths, opts.format) {
        ([one], Format::Events) => events(one),
        (_, Format::Events) => bail!("--format events reads one recording at a time"),
        ([one], _) => run_one(one, opts),
        (many, _) => run_merged(many, opts),
    }
}

fn run_one(path: &Path, opts: &ReportOptions) -> Result<String> {
    let f = open_input(path)?;
    let mut report = pipeline::build_scoped(
        BufReader::with_capacity(1 << 16, f),
        opts.window,
        &opts.scope,
    )?;
    report.source.path = path.display().to_string();
    write_files(&report, &opts.files)?;
    if opts.format == Format::Json {
        return Ok(pipeline::json(&report)?);
    }
    Ok(pipeline::text(
        &report,
        opts.part,
        &text_options(opts.no_color),
    ))
}

fn text_options(no_color: bool) -> render::text::TextOptions {
    let stdout = std::io::stdout();
    let color = !no_color && std::env::var_os("NO_COLOR").is_none() && stdout.is_terminal();
    render::text::TextOptions {
        color,
        width: terminal_width(),
    }
}

/// One output file, as the invoking user, and the line that says so.
pub(crate) fn write_output(path: &Path, bytes: &[u8], owner: safe_file::Owner) -> Result<()> {
    safe_file::write_output(path, bytes, owner)?;
    eprintln!("trainbpf: wrote {}", path.display());
    Ok(())
}

/// What `report`'s output paths expand `{host}` and `{time}` to: the
/// recordings' host, when they share one, and the earliest start.
pub(crate) fn output_values(recordings: &[model::merge::Recording]) -> placeholders::Values {
    let mut hosts: Vec<&str> = recordings.iter().map(|r| r.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let host = match hosts.as_slice() {
        [one] => Ok((*one).to_string()),
        many => Err(format!(
            "is not one host: the recordings are of {} hosts ({})",
            many.len(),
            many.join(", ")
        )),
    };
    let started = recordings.iter().filter_map(|r| r.started_ns).min();
    placeholders::Values::of_recording(host, started)
}

/// `path` with its placeholders expanded for `output`.
pub(crate) fn output_path(
    output: placeholders::Output,
    path: &Path,
    values: &placeholders::Values,
) -> Result<PathBuf> {
    Ok(placeholders::expand(output, path.as_os_str(), values)?)
}

/// Writes the HTML page, the Perfetto trace and the pprof profile as the
/// invoking user, each whole or not at all: a new file renamed over the
/// target, or written through to a device or FIFO (util/safe_file.rs).
/// Each path's placeholders name this recording's host and start.
fn write_files(report: &Report, files: &Files) -> Result<()> {
    use placeholders::Output;
    let owner = safe_file::Owner::from(&crate::util::invoker::Invoker::detect()?);
    let values = output_values(&[model::merge::Recording::of(report, None)]);
    // Every path expanded before any is written: one that cannot be
    // leaves none behind.
    let [html, perfetto, pprof] = [
        (Output::Html, &files.html),
        (Output::Perfetto, &files.perfetto),
        (Output::Pprof, &files.pprof),
    ]
    .map(|(o, p)| p.as_deref().map(|p| output_path(o, p, &values)).transpose());
    let (html, perfetto, pprof) = (html?, perfetto?, pprof?);
    if let Some(p) = html {
        write_output(&p, render::html::render(report).as_bytes(), owner)?;
    }
    if let Some(p) = perfetto {
        let trace = serde_json::to_vec(&render::perfetto::render(report))?;
        write_output(&p, &trace, owner)?;
    }
    if let Some(p) = pprof {
        if report.stacks.is_empty() {
            eprintln!(
                "trainbpf: no growth stacks in this recording ({NO_STACKS}): {} is an \
                 empty profile",
                p.display(),
                NO_STACKS = trainbpf_report::render::NO_STACKS
            );
        }
        write_output(&p, &render::pprof::render(report), owner)?;
    }
    Ok(())
}

pub use merged::inputs;
use merged::run_merged;
/// `report A.rec B.rec ...` and `report DIR`: one job's recordings merged.
mod merged;

/// The end-of-run verdict, judging leaks by `scope`, from the recorder's
/// own descriptor: never by reopening the path, which the job may have
/// made a link or a FIFO meanwhile.
pub fn verdict_with(recording: &File, scope: &Scope) -> Result<String> {
    let r = pipeline::build_scoped(
        BufReader::with_capacity(1 << 16, safe_file::ReadAt::new(recording, 0)),
        pipeline::WINDOW,
        scope,
    )?;
    Ok(render::text::verdict(&r))
}

/// Columns of the terminal on stdout; `COLUMNS`, else 100 when piped.
fn terminal_width() -> usize {
    let mut ws = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills a winsize; a non-terminal fd just fails.
    let ok = unsafe { nix::libc::ioctl(1, nix::libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col >= 40 {
        return ws.ws_col as usize;
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|&c| c >= 40)
        .unwrap_or(100)
}
