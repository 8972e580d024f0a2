//! Memory over the whole run, for charts: per process, for the machine and
//! for the job's cgroup, plus a finer view of the window before each kill.
//!
//! The rest of the model keeps only a window's worth of samples; charts need
//! the whole run, and a 24-hour recording holds millions of samples. So every
//! line here lives on one shared time grid (`model/grid.rs`, which the leak
//! model uses too) of at most [`BUCKETS`] buckets: when the run outgrows it,
//! the bucket width doubles and each line merges its buckets pairwise
//! (lazily, the next time it is touched). A bucket keeps the min, max and
//! last value it saw, so a peak is never averaged away. Memory is therefore
//! bounded by the number of lines, and that is bounded too:
//!
//! - job processes alive now: each its own line, up to [`MAX_LIVE_JOB`];
//! - job processes that ended: the [`MAX_DONE`] with the largest peaks keep
//!   their lines; the rest (the DataLoader workers re-spawned every epoch)
//!   are folded into one line, the largest of them at each time, and
//!   counted;
//! - processes outside the job: the [`MAX_OUTSIDE`] largest peaks, counted
//!   when pushed out;
//! - kill victims and each kill's top grower are never folded away.
//!
//! The window before a kill is taken from the model's per-process tracks when
//! the kill closes, at [`WINDOW_POINTS`] columns, so its resolution does not
//! depend on the length of the run.
//!
//! `line` holds a line's buckets and reads them back as columns, `procs`
//! who gets a line, `window` the window before a kill, and `builder` the
//! streaming side that keeps it all bounded.

mod builder;
mod line;
mod procs;
mod window;

pub(super) use builder::Builder;
pub(crate) use line::{Line, Pick};
pub(crate) use procs::{Churn, Folded, ProcLine};
pub(crate) use window::{KillWindow, WindowLine};

/// The grid every line here lives on; see `model::grid`.
pub(crate) use super::grid::Grid;

use super::Kill;

/// Buckets per line at most; the width doubles to stay under it.
pub(crate) const BUCKETS: u32 = 512;
/// Columns of the window before each kill.
pub(crate) const WINDOW_POINTS: usize = 240;
/// Job processes alive at once that get their own line; more at once (a
/// fork bomb) are counted, not charted.
const MAX_LIVE_JOB: usize = 256;
/// Ended job processes that keep their own line, by peak.
const MAX_DONE: usize = 48;
/// Processes outside the job that keep a line, by peak.
const MAX_OUTSIDE: usize = 8;
/// Processes charted in a kill's window: its top growers, the victim, and
/// the OOM killer's other top candidates.
const WINDOW_LINES: usize = 6;
const WINDOW_GROWERS: usize = 3;
/// Kills whose window is kept; an OOM storm must not grow memory without
/// bound. The rest are counted.
const MAX_WINDOWS: usize = 64;

/// Memory over the whole run; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Series {
    pub(crate) grid: Grid,
    /// Processes with their own line, largest peak first.
    pub(crate) procs: Vec<ProcLine>,
    /// Ended job processes folded together.
    pub(crate) folded: Folded,
    /// Job processes never charted: more than [`MAX_LIVE_JOB`] alive at once.
    pub(crate) uncharted_job: u64,
    /// Processes outside the job pushed out of the chart by larger ones.
    pub(crate) uncharted_outside: u64,
    /// The machine's MemAvailable (kB).
    pub(crate) mem_available: Line,
    pub(crate) mem_total_kb: Option<u64>,
    /// The job cgroup's usage and limit (kB).
    pub(crate) cgroup_usage: Line,
    pub(crate) cgroup_limit: Line,
    /// One per kill, in time order; at most [`MAX_WINDOWS`].
    pub(crate) windows: Vec<KillWindow>,
    /// Kills past [`MAX_WINDOWS`], without a window.
    pub(crate) windows_dropped: u64,
    /// Job processes that were born and ended while recording, by name,
    /// most numerous first.
    pub(crate) came_and_went: Vec<Churn>,
    /// The same without the short-lived helpers, which the text and HTML
    /// show folded on a line of their own.
    pub(crate) came_and_went_long: Vec<Churn>,
}

impl Series {
    /// The window of the kill at `kill_ns`, if one was kept.
    pub(crate) fn window(&self, k: &Kill) -> Option<&KillWindow> {
        self.windows
            .iter()
            .find(|w| w.kill_ns == k.ts_ns && w.victim_pid == k.victim.pid)
    }

    /// The charted line of a process, if it has one.
    #[cfg(test)]
    pub(crate) fn proc(&self, pid: u32, start_ns: u64) -> Option<&ProcLine> {
        self.procs
            .iter()
            .find(|p| p.pid == pid && (p.start_ns == start_ns || start_ns == 0))
    }

    /// Processes with a line, job processes first, then by peak.
    pub(crate) fn job_first(&self) -> Vec<&ProcLine> {
        let mut v: Vec<&ProcLine> = self.procs.iter().collect();
        v.sort_by(|a, b| {
            b.in_job
                .cmp(&a.in_job)
                .then(b.peak_kb.cmp(&a.peak_kb))
                .then(a.pid.cmp(&b.pid))
        });
        v
    }
}

#[cfg(test)]
pub(crate) mod tests;
