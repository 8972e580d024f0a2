//! `shm_filesystems[]` and `shm_sampling`: the /dev/shm filesystems the job
//! saw, with their size and use, and what looking at shared memory cost.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;
use crate::model::shm::ShmFsHistory;

/// `major:minor` of a device number, as `stat` and /proc/PID/maps write it.
pub(crate) fn dev_name(dev: u64) -> String {
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// One /dev/shm filesystem (a tmpfs), as the recorder's looks found it.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ShmFilesystem {
    /// Its device, `major:minor`: what `shared_memory[].fs_dev` names.
    pub(crate) dev: String,
    /// A job process saw it as its /dev/shm (false: only the recorder's
    /// own, in another mount namespace than the job's).
    pub(crate) job: bool,
    /// Used at the last look, kB.
    pub(crate) last_used_kb: u64,
    /// Seconds from the first event to the last look.
    pub(crate) last_s: f64,
    /// The most used at one look, kB.
    pub(crate) peak_used_kb: u64,
    /// Seconds from the first event to the look with the most used.
    pub(crate) peak_s: f64,
    /// Its size (statvfs) at the last look, kB.
    pub(crate) size_kb: u64,
}

impl ShmFilesystem {
    pub(crate) fn all(r: &Report) -> Vec<ShmFilesystem> {
        r.shm.filesystems.iter().map(|f| Self::new(r, f)).collect()
    }

    fn new(r: &Report, f: &ShmFsHistory) -> ShmFilesystem {
        ShmFilesystem {
            dev: dev_name(f.dev),
            job: f.job,
            last_used_kb: f.last.used_kb,
            last_s: super::secs_since(r, f.last.ts_ns),
            peak_used_kb: f.peak.used_kb,
            peak_s: super::secs_since(r, f.peak.ts_ns),
            size_kb: f.last.size_kb,
        }
    }
}

/// What looking at shared memory cost: the recorder looks on a timer whose
/// interval is at least 1 s and at least 400 times a look's cost, and
/// also when a kill or a fatal signal is seen.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ShmSampling {
    /// The timer's interval after the last look, ms.
    pub(crate) interval_ms: u64,
    /// Looks in the recording.
    pub(crate) looks: u64,
    /// The dearest look, µs.
    pub(crate) max_cost_us: u64,
    /// All looks, µs.
    pub(crate) total_cost_us: u64,
    /// Looks a kill or a fatal signal asked for.
    pub(crate) triggered: u64,
}

impl ShmSampling {
    pub(crate) fn new(r: &Report) -> ShmSampling {
        let s = &r.shm.sampling;
        ShmSampling {
            interval_ms: s.interval_ms,
            looks: s.looks,
            max_cost_us: s.max_cost_us,
            total_cost_us: s.total_cost_us,
            triggered: s.triggered,
        }
    }
}
