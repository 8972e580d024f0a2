//! The report's `run` object (docs/report-json.md, "run"): the whole run as
//! the charts see it, from the bounded series.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;

use super::{secs, secs_since};

/// The whole run: the charted processes' peaks and the job processes that
/// came and went. Only some processes have a series of their own, to keep
/// `report`'s memory bounded on a long recording.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Run {
    /// Job processes born and ended while recording, grouped by name, most
    /// numerous first (the job's root is not among them).
    pub(crate) came_and_went: Vec<CameAndWent>,
    /// Seconds from the first event to the last.
    pub(crate) duration_s: f64,
    /// Ended job processes folded into one series.
    pub(crate) folded: Folded,
    /// The processes with a series of their own, job processes first,
    /// largest peak first.
    pub(crate) peaks: Vec<Peak>,
    /// Processes left out of the charts.
    pub(crate) uncharted: Uncharted,
}

impl Run {
    pub(crate) fn new(r: &Report) -> Run {
        let s = &r.series;
        Run {
            came_and_went: s
                .came_and_went
                .iter()
                .map(|c| CameAndWent {
                    comm: c.comm.clone(),
                    count: c.count,
                    longest_s: secs(c.longest_ns),
                    peak_rss_kb: c.peak_kb,
                    shortest_s: secs(c.shortest_ns),
                })
                .collect(),
            duration_s: secs(r.duration_ns()),
            folded: Folded {
                count: s.folded.count,
                peak_rss_kb: s.folded.peak_kb,
            },
            peaks: s
                .job_first()
                .iter()
                .map(|p| Peak {
                    born_s: p.born_ns.map(|t| secs_since(r, t)),
                    comm: p.comm.clone(),
                    died_s: p.died_ns.map(|t| secs_since(r, t)),
                    in_job: p.in_job,
                    oom_killed: p.oom_killed,
                    peak_rss_kb: p.peak_kb,
                    peak_s: secs_since(r, p.peak_ns),
                    pid: p.pid,
                })
                .collect(),
            uncharted: Uncharted {
                job: s.uncharted_job,
                outside: s.uncharted_outside,
            },
        }
    }
}

/// A charted process's peak.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Peak {
    /// Null when its birth was not recorded.
    pub(crate) born_s: Option<f64>,
    pub(crate) comm: String,
    /// Null when its exit was not recorded.
    pub(crate) died_s: Option<f64>,
    pub(crate) in_job: bool,
    pub(crate) oom_killed: bool,
    pub(crate) peak_rss_kb: u64,
    /// When it peaked, seconds since the recording start.
    pub(crate) peak_s: f64,
    pub(crate) pid: u32,
}

/// Ended job processes folded into one series, the largest of them at
/// each time.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Folded {
    pub(crate) count: u64,
    /// The largest single peak among them.
    pub(crate) peak_rss_kb: u64,
}

/// Job processes of one name that were born and ended while recording.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CameAndWent {
    pub(crate) comm: String,
    pub(crate) count: u64,
    pub(crate) longest_s: f64,
    pub(crate) peak_rss_kb: u64,
    pub(crate) shortest_s: f64,
}

/// Processes left out of the charts.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Uncharted {
    /// Job processes left out because more were alive at once than the
    /// charts keep.
    pub(crate) job: u64,
    /// Processes outside the job pushed out by larger ones.
    pub(crate) outside: u64,
}
