//! Leak detection: a robust trend of each job process's honest memory, and
//! of each role group's, over the whole run, and when it will hit the limit.
//!
//! A leak is a slow climb that outlasts everything else a training job does:
//! the warm-up that fills the allocator's pools, a cache that fills and stays
//! full, the per-epoch sawtooth of DataLoader workers respawned with empty
//! heaps. So the trend is fitted over the run, and the fit is robust:
//!
//! - The value is honest memory (allocated minus freed in the process's own
//!   context, see `attribution`), RSS where the recording has no page
//!   allocation probes: a fork's inherited pages are no climb.
//! - Each process keeps one bounded series on the grid that `series.rs`
//!   uses too (`grid.rs`): at most `BUCKETS` buckets, the width doubling as
//!   the run grows. A value holds until the next record, and a bucket keeps the time-weighted mean
//!   of what was held in it, so the fit weighs time, not records: a warm-up
//!   that sent a record per 4 MiB weighs no more than the quiet hour after.
//! - A role group (DataLoader workers, torchrun ranks, siblings with one
//!   command line) sums the members alive in each bucket, each for the share
//!   of the bucket it lived: a worker folds its series into its group's when
//!   it exits, so that generations of respawned workers form one continuous
//!   series, and a worker and its successor never double a bucket.
//! - The slope is Siegel's repeated median (for each point the median of its
//!   slopes to all others, then the median of those): up to half the points
//!   can be outliers, a sawtooth's teeth included, without moving it. The
//!   fit is the share of variance the line explains, with medians for
//!   means: a spike neither makes nor breaks it.
//!
//! "Leak suspected" needs a sustained climb: the longest stretch running to
//! the end of the series, at least [`LeakOptions::min_span_ns`] long, whose
//! slope is positive, whose fit is at least [`LeakOptions::min_fit`], whose
//! first half, last half and last quarter each climb too (a warm-up plateau,
//! or a cache that filled and stayed flat, fails there), whose growth is
//! beyond noise (more than [`LeakOptions::min_growth_kb`] and
//! [`LeakOptions::min_growth_frac`] of the process's size), and which ends
//! that much above anything the series held before it (the next tooth of a
//! sawtooth, a cache filling again, is no new high). The climb begins at its
//! first point on the fitted line. A process that climbed until it exited,
//! not killed, in a role group gave it all back: its group's series says
//! whether the generations add up to a leak.
//!
//! The projection adds the slopes of the leaks still alive at the end and
//! divides the headroom by it: the job cgroup's limit (or, without one,
//! MemTotal plus swap) less the usage now, taken as the highest of the
//! recent samples each carried forward to the end at that rate. A
//! sawtooth's teeth, which the kill will meet first, count, and so does the
//! growth since a stale or coarse sample.
//!
//! Bounds: one series per live job process (at most `MAX_LIVE`), one per
//! role group, and the trends of ended processes that matter
//! (`MAX_DONE`); a fit is O(n²) over at most `FIT_POINTS` points, tried
//! from at most `STARTS` places per series.
//!
//! `line` holds the series, `fit` the repeated median and the leak tests,
//! `project` the projection, and `builder` the streaming side that feeds
//! and bounds them.

mod builder;
mod fit;
mod line;
mod project;

use crate::decode::{Event, Timed};

use super::attribution::Attribution;
pub(super) use builder::Builder;

/// Buckets per series at most.
pub(crate) const BUCKETS: u32 = 256;
/// Points a fit uses at most; more are averaged down to these.
const FIT_POINTS: usize = 64;
/// Points a fit needs at least.
const MIN_POINTS: usize = 8;
/// Start points tried for the sustained stretch, evenly over the series.
const STARTS: usize = 32;
/// Job processes alive at once that get a series; more are counted.
const MAX_LIVE: usize = 1024;
/// Ended processes whose trend is kept: the leaks first, then the steepest.
const MAX_DONE: usize = 32;
/// Trends the report lists besides the leaks.
const MAX_TRENDS: usize = 12;
/// Pressure samples kept for the projection: the recent span's, within a
/// bound that timestamps running backwards cannot lift.
const MAX_USAGE: usize = 4096;
/// The span a killed process's climb, shorter than `--leak-span`, needs
/// to be called [`Verdict::Steady`] (the kill ended the climb, so it
/// cannot have lasted longer): the span within which `fast_growth` reads a
/// rise as one step's allocation, so that the two meet. A job that keeps
/// 4 MiB a step, tens of steps a second, fills a small limit in a few
/// seconds; had a longer span been asked, a steady climb of 5 to 10 s,
/// too slow to fill half the limit in 5 s, was neither rule's, and the
/// kill's only diagnosis was its limit.
pub(crate) const STEADY_SPAN_NS: u64 = 5_000_000_000;
/// The same for a live process, for the warning that memory will run
/// out: longer, so that a warm-up still in progress is seldom taken for
/// one.
pub(crate) const WARN_SPAN_NS: u64 = 20_000_000_000;
/// The halves and the last quarter of a sustained climb must each climb at
/// this share of its slope at least.
const PART_SLOPE: f64 = 0.3;
const SEC: f64 = 1e9;

/// What makes a climb a suspected leak.
#[derive(Clone, Debug, PartialEq)]
pub struct LeakOptions {
    /// The climb must have lasted at least this long, up to the end of the
    /// recording (or of the process).
    pub min_span_ns: u64,
    /// Share of the variance the trend must explain, 0..1.
    pub min_fit: f64,
    /// The climb must add at least this much…
    pub min_growth_kb: u64,
    /// …and this share of the process's (or group's) size.
    pub min_growth_frac: f64,
}

// The model's options compare whole; thresholds are never NaN.
impl Eq for LeakOptions {}

impl Default for LeakOptions {
    fn default() -> Self {
        LeakOptions {
            min_span_ns: 300 * SEC as u64,
            min_fit: 0.8,
            min_growth_kb: 16 << 10,
            min_growth_frac: 0.05,
        }
    }
}

/// Why a trend is, or is not, a suspected leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Leak,
    /// Seen, or climbing, for less than the span a leak needs.
    TooShort,
    /// Flat or shrinking.
    NotClimbing,
    /// Grew less than the noise thresholds.
    Small,
    /// Climbed, then levelled off: a warm-up, a cache that filled.
    Levelled,
    /// No steady trend: the line explains too little.
    Irregular,
    /// Climbed back to a level it had held before: the next tooth of a
    /// sawtooth, a cache filling again.
    Refilled,
    /// Climbed until it exited, not killed, in a role group: a worker
    /// respawned with an empty heap, judged with its group.
    Respawned,
    /// Passes every test of a leak but the span: a steady climb shorter
    /// than `--leak-span`, at least [`STEADY_SPAN_NS`]. Judged so only for
    /// a process the OOM killer chose (what the diagnosis of its kill
    /// reads) and, over [`WARN_SPAN_NS`], for live processes while
    /// recording (the warning that memory will run out).
    Steady,
}

/// The trend of one process, or of one role group (`pid` `None`).
#[derive(Clone, Debug, PartialEq)]
pub struct Trend {
    pub pid: Option<u32>,
    pub start_ns: u64,
    /// The process's latest name; for a group, its latest member's.
    pub comm: String,
    /// The role group it belongs to (groups of one are none), or the
    /// group's own role.
    pub group: Option<String>,
    /// Processes in the group; 1 for a process.
    pub members: usize,
    /// Alive when the recording ended (for a group: any member).
    pub alive: bool,
    /// Honest memory (RSS without page-allocation probes), kB per second:
    /// of the sustained climb for a leak, else of the whole series.
    pub slope_kb_per_s: f64,
    /// Share of the variance the line explains, 0..1.
    pub fit: f64,
    /// Start of the span fitted: for a leak, when the sustained climb began.
    pub since_ns: u64,
    /// End of the series: the process's end or the recording's.
    pub until_ns: u64,
    /// Slope × span, kB.
    pub growth_kb: i64,
    /// The largest the process (or group) was, kB: RSS or honest memory.
    pub size_kb: u64,
    pub verdict: Verdict,
}

impl Trend {
    pub fn is_leak(&self) -> bool {
        self.verdict == Verdict::Leak
    }

    /// A leak, or a climb as steady as one but shorter than the span.
    pub fn is_climbing(&self) -> bool {
        matches!(self.verdict, Verdict::Leak | Verdict::Steady)
    }
}

/// Which limit the projection runs into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// The job's memory cgroup's limit.
    Cgroup,
    /// MemTotal plus SwapTotal.
    Machine,
}

/// When the leaks still alive at the end reach the limit, at their rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    pub domain: Domain,
    pub limit_kb: u64,
    /// Usage now: the highest recent sample carried forward at the leaks'
    /// rate (see the module docs).
    pub usage_kb: u64,
    /// Sum of the live leaks' slopes, each process counted once.
    pub slope_kb_per_s: f64,
    /// Seconds from the end of the recording; `None` when nothing alive is
    /// leaking.
    pub seconds: Option<f64>,
}

/// What the model found, for the renderers.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LeakReport {
    /// Suspected leaks first (steepest first), then the steepest other
    /// trends, at most `MAX_TRENDS` of those.
    pub(crate) trends: Vec<Trend>,
    /// `None` when no limit is known (no pressure samples).
    pub(crate) projection: Option<Projection>,
    /// The options the trends were judged by.
    pub(crate) min_span_ns: u64,
    /// Job processes left without a series: more alive at once than kept.
    pub(crate) untracked: u64,
}

impl LeakReport {
    pub(crate) fn leaks(&self) -> impl Iterator<Item = &Trend> {
        self.trends.iter().filter(|t| t.is_leak())
    }

    pub(crate) fn suspected(&self) -> bool {
        self.trends.iter().any(Trend::is_leak)
    }
}

/// The leak model fed while recording, for `record`'s status line: the same
/// series and tests as the report's, for the processes alive now.
#[derive(Default)]
pub struct Live {
    b: Builder,
    attr: Attribution,
}

impl Live {
    /// `honest`: the records carry pages allocated and freed.
    pub fn new(opts: LeakOptions, honest: bool) -> Live {
        Live {
            b: Builder::new(opts, honest),
            attr: Attribution::default(),
        }
    }

    pub fn observe(&mut self, t: &Timed) {
        self.b.observe(t, &self.attr);
        if let Event::ProcInfo(i) = &t.event {
            self.attr.on_proc_info(i.clone());
        }
    }

    /// The `top` live processes that climb most (suspected leaks first),
    /// and when the leaks among them reach the limit.
    pub fn snapshot(&self, top: usize) -> (Vec<Trend>, Option<Projection>) {
        self.b.snapshot(top)
    }

    /// When the limit is reached at the summed rate of every steady climb
    /// among `trends` (a snapshot's), leaks or not: what the warning that
    /// memory will run out projects.
    pub fn running_out(&self, trends: &[Trend]) -> Option<Projection> {
        self.b.project_by(trends, Trend::is_climbing)
    }
}

#[cfg(test)]
mod tests;
