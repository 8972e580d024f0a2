//! What `trainbpf report` does with a recording's bytes: reader → model →
//! renderer. The files (which are opened and written as the invoking user)
//! are the CLI's; here the input is any reader and the outputs are strings,
//! so the fuzz target and the fixture tests run the very same steps.

use std::{io::Read, time::Duration};

use crate::{
    model::{self, Merged, ModelOptions, Report},
    recording::{Reader, RecordingError},
    render::{self, text::TextOptions},
};

/// Why a recording could not be read through to a report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not a recording this build reads (magic, version or
    /// header), or reading it failed.
    #[error(transparent)]
    Recording(#[from] RecordingError),
    /// An event or report would not serialize as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// How far before each kill `report` looks for growth unless told
/// (`--window`), and the end-of-run verdict always.
pub const WINDOW: Duration = Duration::from_secs(60);

/// How much of the recording `report` reads, and how it judges leaks. The
/// default is `report`'s without flags.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Only the events up to this long after the first: the report as it
    /// would have read then (e.g. a leak's projection before the kill).
    pub until: Option<Duration>,
    pub leaks: model::LeakOptions,
}

/// Records arrive up to this late (per-CPU ring buffers, collector records
/// written as made): reading stops this far past `until`.
const UNTIL_SLACK_NS: u64 = 5_000_000_000;

/// The whole recording through the model; memory stays bounded by the
/// model's window, not the input's length.
pub fn build(input: impl Read, window: Duration) -> Result<Report, Error> {
    build_scoped(input, window, &Scope::default())
}

/// [`build`], cut at `scope.until`, with its leak options.
pub fn build_scoped(input: impl Read, window: Duration, scope: &Scope) -> Result<Report, Error> {
    let mut r = Reader::new(input)?;
    let header = r.header().clone();
    let opts = ModelOptions {
        window_ns: window.as_nanos().min(u64::MAX as u128) as u64,
        leaks: scope.leaks.clone(),
    };
    let cut = scope
        .until
        .map(|d| d.as_nanos().min(u64::MAX as u128) as u64);
    let mut first = None;
    let events = r.by_ref().map_while(|t| {
        let Some(cut) = cut else { return Some(Some(t)) };
        let end = first.get_or_insert(t.ts_ns).saturating_add(cut);
        if t.ts_ns > end.saturating_add(UNTIL_SLACK_NS) {
            None
        } else {
            Some((t.ts_ns <= end).then_some(t))
        }
    });
    let mut report = model::build(&header, events.flatten(), &opts);
    report.undecodable = r.undecodable;
    report.stopped_early = r.stop().cloned();
    report.skipped = r.skipped().clone();
    Ok(report)
}

/// Every decoded event as one JSON object per line, then the stretches
/// skipped and where reading stopped: for debugging probes and for tools
/// that want the raw timeline.
pub fn events(input: impl Read) -> Result<String, Error> {
    let mut r = Reader::new(input)?;
    let mut out = String::new();
    for t in r.by_ref() {
        out.push_str(&serde_json::to_string(&t)?);
        out.push('\n');
    }
    for skip in &r.skipped().ranges {
        out.push_str(&serde_json::to_string(
            &serde_json::json!({"skipped": skip}),
        )?);
        out.push('\n');
    }
    if let Some(stop) = r.stop() {
        out.push_str(&serde_json::to_string(
            &serde_json::json!({"stopped_early": stop}),
        )?);
        out.push('\n');
    }
    Ok(out)
}

/// Which part of the text report to print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Part {
    #[default]
    All,
    /// The leaks section alone, every trend in it (`--leaks`).
    Leaks,
    /// Every process's growth stacks (`--stacks`).
    Stacks,
    /// Every diagnosis with its evidence and fixes (`--explain`).
    Explain,
}

/// `report --json` of one recording: the JSON view, pretty, one newline.
pub fn json(report: &Report) -> Result<String, Error> {
    let mut s = serde_json::to_string_pretty(&render::json::render(report))?;
    s.push('\n');
    Ok(s)
}

/// `report --json` of merged recordings.
pub fn merged_json(m: &Merged) -> Result<String, Error> {
    let mut s = serde_json::to_string_pretty(&render::json::render_merged(m))?;
    s.push('\n');
    Ok(s)
}

/// The text report of one recording, or the part of it asked for.
pub fn text(report: &Report, part: Part, o: &TextOptions) -> String {
    match part {
        Part::All => render::text::render(report, o),
        Part::Leaks => render::text::leaks_report(report, o),
        Part::Stacks => render::text::stacks_report(report, o),
        Part::Explain => render::text::explain(report, o),
    }
}

/// The text report of merged recordings: the job as a whole, or the part
/// asked for of each recording in turn.
pub fn merged_text(m: &Merged, part: Part, o: &TextOptions) -> String {
    match part {
        Part::All => render::text::merged(m, o),
        Part::Leaks => render::text::each(m, o, render::text::leaks_report),
        Part::Stacks => render::text::each(m, o, render::text::stacks_report),
        Part::Explain => render::text::each(m, o, render::text::explain),
    }
}
