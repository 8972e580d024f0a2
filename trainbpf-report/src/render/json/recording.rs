//! The report's `recording` object and the `lost` breakdown
//! (docs/report-json.md, "recording" and "lost"): what was recorded, how,
//! and what the recording could not see.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;

use super::{Time, secs};

/// What was recorded and how.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Recording {
    /// The attach point used per probe.
    pub(crate) attach: Attach,
    /// Set when `record --max-size` downsampled older history
    /// (recording-format.md, "Bounded flight recording"); else null.
    pub(crate) compaction: Option<Compaction>,
    /// Seconds from the first event to the last.
    pub(crate) duration_s: f64,
    /// Events read.
    pub(crate) events: u64,
    /// Probes tried and not used, and why.
    pub(crate) fallbacks: Vec<Fallback>,
    /// The recorded machine's host name.
    pub(crate) hostname: String,
    /// `uname -r` of the recorded machine.
    pub(crate) kernel: String,
    /// Damaged stretches in the middle of the file that the reader stepped
    /// over, reading on from the next good frame; empty for an intact file;
    /// the first 256.
    pub(crate) skipped: Vec<Skip>,
    /// Bytes in all the skipped stretches.
    pub(crate) skipped_bytes: u64,
    /// How many stretches were skipped, listed or not.
    pub(crate) skipped_ranges: u64,
    /// Wall-clock time of the first event; null without a clock pair or an
    /// event.
    pub(crate) start: Option<Time>,
    /// The reader stopped before the end of the file (a damaged or
    /// cut-short tail, with no good frame after it); the report covers
    /// everything before it. Null when it read to the end.
    pub(crate) stopped_early: Option<Stop>,
    /// Version of the recorder.
    pub(crate) trainbpf_version: String,
    /// The look-back window used for growers (`report --window`), seconds.
    #[schemars(range(min = 0))]
    pub(crate) window_s: f64,
}

impl Recording {
    pub(crate) fn new(r: &Report) -> Recording {
        let h = &r.header;
        Recording {
            attach: Attach::new(r),
            compaction: r.compaction.as_ref().map(|c| Compaction {
                bytes_after: c.bytes_after,
                bytes_before: c.bytes_before,
                count: c.count,
                full_from_s: r.since_start_s(c.full_from_ns),
                kill_window_bucket_s: c.kill_window_bucket_s,
                max_size_bytes: c.max_size,
                samples_folded: c.samples_folded,
                tiers: c
                    .tiers
                    .iter()
                    .map(|&[older_than_s, bucket_s]| Tier {
                        bucket_s,
                        older_than_s,
                    })
                    .collect(),
            }),
            duration_s: secs(r.duration_ns()),
            events: r.events,
            fallbacks: h
                .fallbacks
                .iter()
                .map(|f| Fallback {
                    probe: f.probe.clone(),
                    reason: f.reason.clone(),
                })
                .collect(),
            hostname: h.hostname.clone(),
            kernel: h.kernel.clone(),
            skipped: r
                .skipped
                .ranges
                .iter()
                .map(|s| Skip {
                    bytes: s.bytes,
                    offset: s.offset,
                    reason: s.reason.clone(),
                })
                .collect(),
            skipped_bytes: r.skipped.bytes,
            skipped_ranges: r.skipped.count,
            start: r.first_ns.and_then(|t| r.realtime_ns(t)).map(Time::real),
            stopped_early: r.stopped_early.as_ref().map(|s| Stop {
                offset: s.offset,
                reason: s.reason.clone(),
            }),
            trainbpf_version: h.trainbpf_version.clone(),
            window_s: secs(r.window_ns),
        }
    }
}

/// The attach point used per probe: a string such as
/// `"fentry:oom_kill_process"`, or null when that probe could not attach.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Attach {
    /// `record --ebpf-log`: the kernel programs' own log (`ebpf_log`).
    pub ebpf_log: Option<String>,
    /// Always null: user page faults are not counted.
    pub faults: Option<String>,
    /// Where forks are seen.
    pub forks: Option<String>,
    /// Process fork, exec and exit.
    pub lifecycle: Option<String>,
    /// Where RSS is read: the page probes, or `"tp_btf:rss_stat"` where
    /// those are missing.
    pub memory: Option<String>,
    /// `oom_kill_process`.
    pub oom_context: Option<String>,
    /// Writes to `oom_score_adj`.
    pub oom_score_adj: Option<String>,
    /// `mark_victim`.
    pub oom_victim: Option<String>,
    /// Page-cache additions and removals.
    pub page_cache: Option<String>,
    /// Page allocations and frees, per process.
    pub pages: Option<String>,
    /// The kernel log.
    pub printk: Option<String>,
    /// Signals delivered.
    pub signals: Option<String>,
    /// Allocation stalls (reclaim, compaction).
    pub stalls: Option<String>,
}

impl Attach {
    fn new(r: &Report) -> Attach {
        let a = &r.header.attach;
        Attach {
            ebpf_log: a.ebpf_log.clone(),
            faults: a.faults.clone(),
            forks: a.forks.clone(),
            lifecycle: a.lifecycle.clone(),
            memory: a.memory.clone(),
            oom_context: a.oom_context.clone(),
            oom_score_adj: a.oom_score_adj.clone(),
            oom_victim: a.oom_victim.clone(),
            page_cache: a.page_cache.clone(),
            pages: a.pages.clone(),
            printk: a.printk.clone(),
            signals: a.signals.clone(),
            stalls: a.stalls.clone(),
        }
    }
}

/// A probe tried and not used.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Fallback {
    pub probe: String,
    pub reason: String,
}

/// Where the reader stopped.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Stop {
    /// The byte offset of the first unreadable frame.
    pub(crate) offset: u64,
    /// Why, e.g. `"frame checksum mismatch"`.
    pub(crate) reason: String,
}

/// A damaged stretch the reader stepped over.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Skip {
    /// Bytes skipped.
    pub(crate) bytes: u64,
    /// Where the damage starts.
    pub(crate) offset: u64,
    /// Why its first frame was refused, e.g. `"bad frame magic"`.
    pub(crate) reason: String,
}

/// What `record --max-size` did to older history.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Compaction {
    /// The last compaction's output.
    pub bytes_after: u64,
    /// The last compaction's input.
    pub bytes_before: u64,
    /// Compactions so far.
    pub count: u64,
    /// Seconds from the start: samples from here on were kept whole at the
    /// last compaction.
    pub(crate) full_from_s: f64,
    /// The 5 minutes before each kill: 0 when kept whole, else folded to
    /// this resolution because the budget required it.
    pub kill_window_bucket_s: u64,
    /// The `--max-size`, bytes.
    pub(crate) max_size_bytes: u64,
    /// Samples folded, in all.
    pub samples_folded: u64,
    /// How older samples were folded at the last compaction.
    pub tiers: Vec<Tier>,
}

/// Samples older than `older_than_s` at the last compaction were folded to
/// one per process per `bucket_s`, with that bucket's peaks.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Tier {
    pub(crate) bucket_s: u64,
    pub(crate) older_than_s: u64,
}

/// The breakdown of `lost_events`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Lost {
    /// Ring-buffer records the kernel could not reserve, by record kind:
    /// `fork`, `exec`, `exit`, `mem`, `oom_victim`, `oom_kill`, `printk`,
    /// `signal`, `oom_adj`, `cuda`, `xid`, `nv_pages`, `cuda_map`,
    /// `stack_at_death`
    /// (`kind_N` for a kind this version doesn't name).
    pub by_kind: BTreeMap<String, u64>,
    /// The same losses by ring buffer.
    pub(crate) by_ring: ByRing,
    /// Memory, pressure and NVML samples the recorder dropped because the
    /// disk was full and the events it held in memory reached their bound.
    pub dropped_disk_full: u64,
    /// Calls into the NVIDIA driver in windows where a late driver
    /// library's process could not be held (`gpu.lost.window_calls`).
    /// Counted in `lost_events`.
    pub(crate) gpu_window_calls: u64,
    /// Times the job membership map was full. Counted in `lost_events`.
    pub job_map_full: u64,
    /// Times the per-process map had no room for a process outside the
    /// job. Not in `lost_events`.
    pub other_map_full: u64,
    /// Times the kernel's per-process map had no room for a job process:
    /// its memory went untracked. Counted in `lost_events`.
    pub proc_map_full: u64,
    /// New growth stacks whose copy of the user stack found its ring
    /// full: named by frame pointers only, so not in `lost_events`.
    pub stack_copies_lost: u64,
    /// Growth stacks the kernel could not read (`record --stacks`): shown
    /// as stacks with an `error`, so not in `lost_events`.
    pub stack_errors: u64,
    /// Growth stacks the kernel's maps had no room for (`record
    /// --stacks`). Counted in `lost_events`.
    pub stack_map_full: u64,
    /// Records that did not decode, in the collector and in the file.
    pub undecodable: u64,
}

impl Lost {
    pub(crate) fn new(r: &Report) -> Lost {
        let l = &r.lost;
        let (main, precious) = l.by_ring();
        Lost {
            by_kind: l
                .by_kind
                .iter()
                .enumerate()
                .map(|(i, &n)| (kind_name(i), n))
                .collect(),
            by_ring: ByRing { main, precious },
            dropped_disk_full: l.dropped_disk_full,
            gpu_window_calls: r.gpu.lost.window_calls,
            job_map_full: l.job_map_full,
            other_map_full: l.other_map_full,
            proc_map_full: l.proc_map_full,
            stack_copies_lost: l.stack_copies_lost,
            stack_errors: l.stack_errors,
            stack_map_full: l.stack_map_full,
            undecodable: l.undecodable.saturating_add(r.undecodable),
        }
    }
}

/// What reading the job's memory, `/proc` entries and mapped files cost
/// and skipped. The job can make such a read wait as long as it likes (a
/// FUSE file that is never answered, a memory map whose lock it wedged):
/// each is made off the thread that drains the rings, with a deadline.
/// All 0 and no notes: nothing stalled or was skipped.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct JobReads {
    /// Reads skipped because the memory or file lies on a FUSE
    /// filesystem, whose server (perhaps the job's) may never answer.
    pub fuse_skipped: u64,
    /// Requests the frames' namer (the unprivileged child that parses the
    /// job's files) failed: it crashed, hung or refused.
    pub namer_failed: u64,
    /// Executables and cgroups left unnamed: their cache was full.
    pub names_cut: u64,
    /// The first few reads that stalled or were skipped: the process,
    /// what, why.
    pub notes: Vec<String>,
    /// Processes whose budget of bytes read for CPython names and line
    /// tables ran out: their later Python frames are not named.
    pub py_budget_spent: u64,
    /// Times a process's cache of CPython code objects was cleared,
    /// full (`record --stacks`).
    pub py_cache_cleared: u64,
    /// Python frames left unnamed: a naming pass's bound was reached.
    pub py_frames_cut: u64,
    /// Processes whose identity and command line went unread: the queue
    /// of such reads was full.
    pub queue_full: u64,
    /// Reads not made because too many earlier ones were still blocked.
    pub refused: u64,
    /// Reads abandoned past their deadline: the process's identity,
    /// command line or stack frames went unread.
    pub stalled: u64,
    /// Reads still blocked when the recording ended.
    pub stuck: u64,
    /// Files whose unwind tables were not read (over their bound,
    /// outside the file, not ELF): their frames by frame pointers only.
    pub unwind_refused: u64,
}

impl JobReads {
    pub(crate) fn new(r: &Report) -> JobReads {
        let j = &r.job_reads;
        JobReads {
            fuse_skipped: j.fuse_skipped,
            namer_failed: j.namer_failed,
            names_cut: j.names_cut,
            notes: j.notes.clone(),
            py_budget_spent: j.py_budget_spent,
            py_cache_cleared: j.py_cache_cleared,
            py_frames_cut: j.py_frames_cut,
            queue_full: j.queue_full,
            refused: j.refused,
            stalled: j.stalled,
            stuck: j.stuck,
            unwind_refused: j.unwind_refused,
        }
    }
}

/// Ring-buffer losses by ring.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ByRing {
    /// Memory, fork, exec, `oom_score_adj`, GPU.
    pub(crate) main: u64,
    /// OOM kills, exits, signals, the kernel's OOM log lines: a ring of
    /// their own, so that a burst of memory records cannot crowd them out.
    pub(crate) precious: u64,
}

/// Names for the kernel record kinds that index `Lost::by_kind`.
fn kind_name(i: usize) -> String {
    use trainbpf_common as c;
    let name = match u16::try_from(i).unwrap_or(u16::MAX) {
        c::KIND_FORK => "fork",
        c::KIND_EXEC => "exec",
        c::KIND_EXIT => "exit",
        c::KIND_MEM => "mem",
        c::KIND_OOM_VICTIM => "oom_victim",
        c::KIND_OOM_KILL => "oom_kill",
        c::KIND_PRINTK => "printk",
        c::KIND_SIGNAL => "signal",
        c::KIND_OOM_ADJ => "oom_adj",
        c::KIND_CUDA => "cuda",
        c::KIND_XID => "xid",
        c::KIND_NV_PAGES => "nv_pages",
        c::KIND_CUDA_MAP => "cuda_map",
        c::KIND_DEATH_STACK => "stack_at_death",
        _ => return format!("kind_{i}"),
    };
    name.to_string()
}
