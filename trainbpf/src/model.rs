//! Timeline model (pure): decoded events in, a [`Report`] out.
//!
//! The model streams. A recording of a long job holds millions of memory
//! samples for every process on the machine, and `report` must not need
//! memory in proportion to that. Per process it keeps only what a kill's
//! look-back window can still ask for: the samples newer than
//! `now − window` and one baseline sample before them. A process's samples
//! are dropped once it has been dead for longer than the window. What grows
//! with the recording is only what the report prints: the job's processes,
//! the kills, the cgroup names.
//!
//! An OOM kill is not one event. The kernel's `oom_kill_process` (when a
//! probe could attach to it) and `mark_victim` arrive as two records
//! microseconds apart, and the kernel log lines that name the constraint and
//! the memcg's usage come before and after them. A kill therefore stays open
//! for [`SETTLE_NS`] of event time so that its partner record and its log
//! lines can join it; only then are its growers computed.
//!
//! Times are CLOCK_MONOTONIC ns, as recorded; [`Report::realtime_ns`] turns
//! them into wall-clock time with the recording header's clock pair.

mod attribution;
mod badness;
/// The GPU ledger: CUDA calls, NVML, Xid.
pub mod gpu;
pub use attribution::{Group, SumCheck};
mod before;
pub use before::PressureBefore;
mod deaths;
/// Robust trends of honest memory, suspected leaks, time to the limit.
pub mod leaks;
pub use badness::{Candidate as RankedCandidate, Ranking, TotalSource};
pub use deaths::{Cause, Death, Sender};
pub use leaks::{LeakOptions, LeakReport, Projection, Trend};
pub(crate) mod series;
pub use series::{
    Bucket, Churn, Folded, Grid, KillWindow, Line, Pick, ProcLine, Series, WindowLine,
};

use std::collections::{HashMap, HashSet, VecDeque};

use crate::decode::{
    CgroupName, Event, ExitStatus, JobExit, JobStart, Lost, OomRecord, OomRecordKind, ProcKey, Rss,
    Timed,
};
use crate::recording::{RecordingHeader, Skipped, Stop};

const SEC: u64 = 1_000_000_000;
/// The two records of one kill are microseconds apart; a second leaves room
/// for a slow probe, and the same process cannot be chosen twice that fast
/// (the kernel skips tasks already marked as victims).
const MERGE_NS: u64 = SEC;
/// Kernel log lines this close to a kill are read as describing it.
const PRINTK_NS: u64 = 2 * SEC;
/// How long (event time) a kill stays open for its partner record and its
/// log lines, which can come after it.
const SETTLE_NS: u64 = PRINTK_NS;
/// Event time between sweeps for dead processes.
const SWEEP_NS: u64 = 10 * SEC;
const TOP_GROWERS: usize = 10;
/// Job processes always listed among a kill's growers, however busy the
/// rest of the machine was.
const TOP_JOB_GROWERS: usize = 10;
const TOP_MEMORY: usize = 10;
/// The printk probe forwards OOM lines only, but an OOM storm prints many;
/// the buffer must stay bounded even then.
const MAX_PRINTK_LINES: usize = 4096;
/// Kernel log lines kept per kill for the report.
const MAX_KILL_LOG: usize = 16;
/// cgroup v2 prints `PAGE_COUNTER_MAX` pages as the limit of a memcg without
/// one; anything this large (1 EiB) means "no limit".
const NO_LIMIT_KB: u64 = 1 << 50;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelOptions {
    /// How far before each kill to look for growth.
    pub window_ns: u64,
    /// What makes a climb a suspected leak.
    pub leaks: LeakOptions,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            window_ns: 60 * SEC,
            leaks: LeakOptions::default(),
        }
    }
}

/// Everything the renderers need; they never see the recording itself.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub header: RecordingHeader,
    pub window_ns: u64,
    /// Time of the earliest and latest event; `None` for an empty recording.
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    pub events: u64,
    /// `None` when the recording has no job-start record (cut short early).
    pub job: Option<Job>,
    /// In time order.
    pub kills: Vec<Kill>,
    /// The job's processes, by birth.
    pub processes: Vec<Process>,
    /// Every job process that ended, with the cause, by time.
    pub deaths: Vec<Death>,
    /// The job's processes grouped by role over the whole run: the most each
    /// member added, summed (`grew_kb` holds the summed peak RSS here).
    pub groups: Vec<Group>,
    /// Shared-memory objects, each counted once, biggest first.
    pub shared_memory: Vec<crate::decode::ShmObject>,
    /// The job's honest growth against its cgroup at the cgroup's peak.
    pub attribution_at_peak: Option<SumCheck>,
    /// What USS/PSS sampling cost: rounds and total µs.
    pub smaps_rounds: u64,
    pub smaps_cost_us: u64,
    /// Largest peak resident memory seen, any process on the machine.
    pub top_memory: Vec<MemoryUser>,
    /// The collector's last (cumulative) lost-event counts.
    pub lost: Lost,
    /// Memory over the whole run, bounded, for charts.
    pub series: Series,
    /// Records in the file that did not decode: set by the caller from
    /// `recording::Reader::undecodable` once the events are consumed.
    pub undecodable: u64,
    /// Set by the caller from `recording::Reader::stop`.
    pub stopped_early: Option<Stop>,
    /// Damaged stretches in the middle that the reader skipped: set by the
    /// caller from `recording::Reader::skipped`.
    pub skipped: Skipped,
    /// GPU and pinned host memory per process, CUDA OOMs, Xid errors.
    pub gpu: gpu::GpuReport,
    /// Trends of honest memory, suspected leaks, and time to the limit.
    pub leaks: LeakReport,
    /// Set when `record --max-size` downsampled older history.
    pub compaction: Option<crate::decode::Compaction>,
    /// Leaks `record` warned of while the job ran, with when (ns).
    pub leak_warnings: Vec<(u64, crate::decode::LeakWarning)>,
}

impl Report {
    /// Wall-clock ns since the epoch for a monotonic timestamp; `None` when
    /// the header has no clock pair.
    pub fn realtime_ns(&self, mono_ns: u64) -> Option<u64> {
        (self.header.clock.realtime_ns != 0).then(|| self.header.clock.to_realtime_ns(mono_ns))
    }

    /// Seconds from the first event to `mono_ns`.
    pub fn since_start_s(&self, mono_ns: u64) -> f64 {
        ns_to_s(mono_ns.saturating_sub(self.first_ns.unwrap_or(mono_ns)))
    }

    pub fn duration_ns(&self) -> u64 {
        match (self.first_ns, self.last_ns) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => 0,
        }
    }

    /// Ring-buffer records lost plus records that did not decode, on either
    /// side of the file.
    pub fn lost_events(&self) -> u64 {
        self.lost.total().saturating_add(self.undecodable)
    }
}

pub fn ns_to_s(ns: u64) -> f64 {
    ns as f64 / SEC as f64
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub pid: u32,
    pub start_ns: u64,
    /// When the collector started it (event time).
    pub started_ns: u64,
    pub argv: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub cgroup: Option<String>,
    pub memory_limit_bytes: Option<u64>,
    /// As `wait(2)` reported it; `None` when the recording ends first.
    pub exit: Option<ExitStatus>,
    pub exited_ns: Option<u64>,
}

impl Job {
    pub fn key(&self) -> ProcKey {
        ProcKey {
            tgid: self.pid,
            start_ns: self.start_ns,
        }
    }
}

/// What limited the allocation that failed (`enum oom_constraint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Constraint {
    /// The whole machine ran out (CONSTRAINT_NONE).
    None,
    Cpuset,
    MemoryPolicy,
    Memcg,
    Unknown,
}

impl Constraint {
    pub fn as_str(self) -> &'static str {
        match self {
            Constraint::None => "none",
            Constraint::Cpuset => "cpuset",
            Constraint::MemoryPolicy => "memory_policy",
            Constraint::Memcg => "memcg",
            Constraint::Unknown => "unknown",
        }
    }

    /// The kernel's enum value (include/linux/oom.h).
    fn from_kernel(v: u32) -> Constraint {
        match v {
            0 => Constraint::None,
            1 => Constraint::Cpuset,
            2 => Constraint::MemoryPolicy,
            3 => Constraint::Memcg,
            _ => Constraint::Unknown,
        }
    }

    /// `CONSTRAINT_*` as `dump_oom_summary` prints it (mm/oom_kill.c
    /// `oom_constraint_text`).
    fn from_printk(s: &str) -> Option<Constraint> {
        Some(match s {
            "CONSTRAINT_NONE" => Constraint::None,
            "CONSTRAINT_CPUSET" => Constraint::Cpuset,
            "CONSTRAINT_MEMORY_POLICY" => Constraint::MemoryPolicy,
            "CONSTRAINT_MEMCG" => Constraint::Memcg,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Kill {
    pub ts_ns: u64,
    pub realtime_ns: Option<u64>,
    pub victim: Victim,
    pub constraint: Constraint,
    /// The memory cgroup that ran out (for a memcg OOM), else the victim's.
    pub memcg: Option<String>,
    /// The victim's own memory cgroup.
    pub task_memcg: Option<String>,
    /// From the kernel's `memory: usage …` line.
    pub memcg_usage_kb: Option<u64>,
    /// From the same line, or the job's `--memory-limit` when the memcg is
    /// the job's cgroup.
    pub memcg_limit_kb: Option<u64>,
    pub memcg_failcnt: Option<u64>,
    pub trigger: Trigger,
    /// The records that reported the kill, `oom_kill_process` first.
    pub sources: Vec<KillSource>,
    /// `oc->chosen_points` and `oc->totalpages`, when the kernel allowed a
    /// probe on `oom_kill_process`.
    pub kernel_points: Option<i64>,
    pub totalpages: Option<u64>,
    /// kernfs ids as recorded (0: unknown).
    pub oom_memcg_id: u64,
    pub victim_memcg_id: u64,
    /// Processes whose resident memory grew in the window before the kill,
    /// most first, at most ten.
    pub growers: Vec<Grower>,
    /// The OOM killer's ranking at the kill, reconstructed from tracked
    /// memory (see `badness`).
    pub ranking: Option<Ranking>,
    /// The job's processes grouped by role, with their growth.
    pub groups: Vec<Group>,
    /// The job's honest growth in the window against the cgroup's.
    pub sum_check: Option<SumCheck>,
    /// The machine and cgroup on the way to the kill.
    pub pressure: Option<PressureBefore>,
    pub window_ns: u64,
    /// The kernel log lines read as part of this kill.
    pub kernel_log: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    /// Process id (tgid).
    pub pid: u32,
    pub start_ns: u64,
    /// The thread the kernel named.
    pub thread_pid: u32,
    pub comm: String,
    pub rss: Rss,
    pub oom_score_adj: i32,
    pub uid: u32,
    pub in_job: bool,
    pub total_vm_kb: u64,
    pub pgtables_kb: u64,
    /// From the job's root down to the victim; empty outside the job.
    pub tree: Vec<TreeNode>,
}

impl Victim {
    pub fn key(&self) -> ProcKey {
        ProcKey {
            tgid: self.pid,
            start_ns: self.start_ns,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeNode {
    pub pid: u32,
    pub comm: String,
}

/// The task whose allocation failed and set off the kill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillSource {
    pub record: OomRecordKind,
    /// "fentry", "kprobe", "tp_btf", "tracepoint".
    pub probe: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Grower {
    pub pid: u32,
    pub start_ns: u64,
    pub comm: String,
    /// Growth of resident memory (RSS), as the kernel counts it.
    pub grew_kb: u64,
    /// Memory allocated minus freed in the process's own context over the
    /// same span: what it really added. None when the recording has no page
    /// allocation probes.
    pub honest_kb: Option<i64>,
    /// From the baseline (or birth) to the last sample before the kill.
    pub window_ns: u64,
    /// `None` when the growth spans under a second: a jump, not a rate.
    pub rate_kb_per_s: Option<f64>,
    /// Resident memory at the kill.
    pub rss_kb: u64,
    pub in_job: bool,
    /// Born inside the window: its growth counts from zero.
    pub born_in_window: bool,
    pub is_victim: bool,
}

/// One process of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub start_ns: u64,
    pub comm: String,
    pub parent: Option<ProcKey>,
    /// Last exec'd filename; ends in "…" when the recorder had to cut it.
    pub exec: Option<String>,
    pub born_ns: Option<u64>,
    pub died_ns: Option<u64>,
    pub exit: Option<ExitStatus>,
    pub peak_rss_kb: u64,
    pub oom_killed: bool,
    /// Last `oom_score_adj` written while recording, if any.
    pub oom_score_adj: Option<i32>,
    /// Memory it allocated minus what it freed, in its own context, at its
    /// last record: what it really added.
    pub honest_kb: Option<i64>,
    /// The most it had added at any record: a process that frees its heap
    /// before exiting still shows what it held.
    pub honest_peak_kb: Option<i64>,
    /// Page cache it brought in minus what it removed, in its own context,
    /// at its last record: left out of `honest_kb` (the kernel gives it back
    /// without a kill). None in recordings without the page-cache probes,
    /// where it is part of `honest_kb`.
    pub page_cache_kb: Option<i64>,
    /// Unique and proportional memory from its last smaps_rollup sample.
    pub uss_kb: Option<u64>,
    pub pss_kb: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryUser {
    pub pid: u32,
    pub start_ns: u64,
    pub comm: String,
    pub peak_rss_kb: u64,
    pub in_job: bool,
}

/// Decodes a wait(2) status: low 7 bits a signal, else the exit code in
/// bits 8–15.
pub fn wait_status(status: u32) -> ExitStatus {
    let sig = status & 0x7f;
    if sig != 0 {
        ExitStatus::Signal(sig as i32)
    } else {
        ExitStatus::Code(((status >> 8) & 0xff) as i32)
    }
}

/// Builds the report from a stream of events; see the module docs for what
/// is kept while streaming.
pub fn build(
    header: &RecordingHeader,
    events: impl Iterator<Item = Timed>,
    opts: &ModelOptions,
) -> Report {
    let mut b = Builder::new(opts, header);
    for t in events {
        b.observe(t);
    }
    b.finish(header)
}

// ---------------------------------------------------------------------------
// Streaming state.

#[derive(Clone, Copy, Debug)]
struct Sample {
    ts: u64,
    kb: u64,
    /// The OOM killer's other inputs, as of this sample.
    swap_kb: u64,
    pgtables_kb: u64,
    adj: i32,
    memcg_id: u64,
    /// Allocated minus freed in the process's own context, kB: the honest
    /// measure, which a fork does not move and a copy-on-write break does.
    net_kb: i64,
    /// Page cache added minus removed in its context, kB: not growth.
    cache_kb: i64,
}

impl Sample {
    fn at(ts: u64, kb: u64) -> Sample {
        Sample {
            ts,
            kb,
            swap_kb: 0,
            pgtables_kb: 0,
            adj: 0,
            memcg_id: 0,
            net_kb: 0,
            cache_kb: 0,
        }
    }
}

/// One process's memory over time: only the window's worth.
#[derive(Debug, Default)]
struct Track {
    comm: String,
    in_job: bool,
    samples: VecDeque<Sample>,
    died_ns: Option<u64>,
    peak_kb: u64,
}

impl Track {
    /// Inserts in time order (the ring buffer is per-CPU, so records can
    /// arrive slightly out of order), then drops samples older than the
    /// last one at or before `horizon`: that one stays as the baseline.
    fn push(&mut self, s: Sample, horizon: u64) {
        let pos = self
            .samples
            .iter()
            .rposition(|o| o.ts <= s.ts)
            .map_or(0, |i| i + 1);
        self.samples.insert(pos, s);
        while self.samples.len() >= 2 && self.samples[1].ts <= horizon {
            self.samples.pop_front();
        }
        self.peak_kb = self.peak_kb.max(s.kb);
    }

    fn at_or_before(&self, t: u64) -> Option<Sample> {
        self.samples.iter().rev().find(|s| s.ts <= t).copied()
    }

    fn first_after(&self, t: u64) -> Option<Sample> {
        self.samples.iter().find(|s| s.ts > t).copied()
    }
}

/// A process considered for a kill's growers, with its memory at the kill.
struct Candidate<'a> {
    key: ProcKey,
    track: Option<&'a Track>,
    end: Sample,
    comm: &'a str,
    in_job: bool,
    is_victim: bool,
}

/// A job process's life; kept for the whole recording (it is the output).
#[derive(Debug, Default)]
struct JobProc {
    comm: String,
    parent: Option<ProcKey>,
    exec: Option<String>,
    fork_ns: Option<u64>,
    died_ns: Option<u64>,
    exit: Option<ExitStatus>,
    peak_kb: u64,
    oom_killed: bool,
    /// Allocated minus freed in its own context, at its last record, and
    /// the most it reached.
    net_kb: Option<i64>,
    peak_net_kb: Option<i64>,
    /// Page cache added minus removed in its context, at its last record.
    cache_kb: Option<i64>,
}

/// What the kernel log said, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum KernelLine {
    /// `oom-kill:constraint=…,oom_memcg=…,task_memcg=…,task=…,pid=…,uid=…`
    OomKill {
        constraint: Option<Constraint>,
        oom_memcg: Option<String>,
        task_memcg: Option<String>,
        pid: Option<u32>,
    },
    /// `<why>: Killed process PID (COMM) total-vm:…kB, …`
    Killed {
        constraint: Constraint,
        pid: u32,
        total_vm_kb: Option<u64>,
        pgtables_kb: Option<u64>,
    },
    /// `memory: usage NkB, limit NkB, failcnt N`
    Usage {
        usage_kb: u64,
        limit_kb: Option<u64>,
        failcnt: Option<u64>,
    },
    Other,
}

#[derive(Debug)]
struct LogLine {
    ts: u64,
    msg: String,
    parsed: KernelLine,
}

/// What the kernel log told about a kill, before the cgroup names are known.
#[derive(Debug, Default)]
struct Hints {
    oc_constraint: Option<Constraint>,
    printk_constraint: Option<Constraint>,
    prefix_constraint: Option<Constraint>,
    oom_memcg: Option<String>,
    task_memcg: Option<String>,
}

#[derive(Debug)]
struct OpenKill {
    kill: Kill,
    hints: Hints,
}

struct Builder {
    window: u64,
    now: u64,
    first: Option<u64>,
    last: Option<u64>,
    events: u64,
    next_sweep: u64,
    tracks: HashMap<ProcKey, Track>,
    /// tgid → start_ns of the newest process seen with it: a new start_ns
    /// means the old process is gone (its pid was recycled).
    current: HashMap<u32, u64>,
    job_procs: HashMap<ProcKey, JobProc>,
    /// Peak memory of processes whose tracks were dropped, best few only.
    retired: Vec<MemoryUser>,
    cgroups: HashMap<u64, String>,
    log: VecDeque<LogLine>,
    open: Vec<OpenKill>,
    done: Vec<OpenKill>,
    job: Option<Job>,
    lost: Lost,
    compaction: Option<crate::decode::Compaction>,
    leak_warnings: Vec<(u64, crate::decode::LeakWarning)>,
    signals: deaths::Signals,
    page_kb: u64,
    pressure: before::History,
    series: series::Builder,
    attribution: attribution::Attribution,
    /// The recording has page allocation probes: rank by honest growth.
    honest: bool,
    /// ...and page-cache probes: page cache is kept apart from it.
    page_cache: bool,
    /// MemTotal + SwapTotal when recording started: a global OOM's domain.
    machine_kb: u64,
    /// Latest `oom_score_adj` per process, for the report's processes.
    adj: HashMap<ProcKey, i32>,
    gpu: gpu::Ledger,
    leaks: leaks::Builder,
}

impl Builder {
    fn new(opts: &ModelOptions, header: &RecordingHeader) -> Self {
        Builder {
            window: opts.window_ns,
            now: 0,
            first: None,
            last: None,
            events: 0,
            next_sweep: 0,
            tracks: HashMap::new(),
            current: HashMap::new(),
            job_procs: HashMap::new(),
            retired: Vec::new(),
            cgroups: HashMap::new(),
            log: VecDeque::new(),
            open: Vec::new(),
            done: Vec::new(),
            job: None,
            lost: Lost::default(),
            compaction: None,
            leak_warnings: Vec::new(),
            signals: deaths::Signals::default(),
            page_kb: (header.page_size / 1024).max(1),
            pressure: before::History::default(),
            series: series::Builder::new(opts.window_ns),
            attribution: attribution::Attribution::default(),
            honest: header.attach.pages.is_some(),
            page_cache: header.attach.page_cache.is_some(),
            machine_kb: header.mem_total_kb + header.swap_total_kb,
            adj: HashMap::new(),
            gpu: gpu::Ledger::default(),
            leaks: leaks::Builder::new(opts.leaks.clone(), header.attach.pages.is_some()),
        }
    }

    /// The time before which nothing can be asked any more, except each
    /// process's baseline: the window before the earliest kill that is
    /// still open or may yet arrive.
    fn anchor(&self) -> u64 {
        let settled = self.now.saturating_sub(SETTLE_NS);
        self.open
            .iter()
            .map(|k| k.kill.ts_ns)
            .fold(settled, u64::min)
    }

    fn horizon(&self) -> u64 {
        self.anchor().saturating_sub(self.window)
    }

    fn observe(&mut self, t: Timed) {
        let ts = t.ts_ns;
        self.events += 1;
        self.now = self.now.max(ts);
        self.first = Some(self.first.map_or(ts, |f| f.min(ts)));
        self.last = Some(self.last.map_or(ts, |l| l.max(ts)));
        self.series.observe(&t);
        self.gpu.observe(&t);
        self.leaks.observe(&t, &self.attribution);
        match &t.event {
            Event::Fork { child, parent, .. } => {
                self.adopt_root(*parent);
                self.adopt_root(*child);
            }
            Event::Exec { proc, .. } | Event::Exit { proc, .. } => self.adopt_root(*proc),
            Event::Mem {
                proc, in_job: true, ..
            } => self.adopt_root(*proc),
            Event::Oom(r) if r.in_job => self.adopt_root(r.victim),
            _ => {}
        }
        match t.event {
            Event::Fork {
                child,
                parent,
                comm,
            } => {
                self.note_pid(child, ts);
                let p = self.job_procs.entry(child).or_default();
                p.parent = Some(parent);
                p.fork_ns = Some(ts);
                if p.comm.is_empty() {
                    p.comm = comm;
                }
            }
            Event::Exec {
                proc,
                comm,
                filename,
                truncated,
            } => {
                self.note_pid(proc, ts);
                let p = self.job_procs.entry(proc).or_default();
                p.comm = comm;
                p.exec = Some(if truncated {
                    format!("{filename}…")
                } else {
                    filename
                });
            }
            Event::Exit {
                proc,
                comm,
                exit_code,
                ..
            } => {
                // The name at exit is the newest: a worker renamed after
                // fork (`pt_data_worker`) may send no memory record since.
                if let Some(tr) = self.tracks.get_mut(&proc) {
                    tr.died_ns = Some(ts);
                    tr.comm.clone_from(&comm);
                }
                let p = self.job_procs.entry(proc).or_default();
                p.comm = comm;
                p.died_ns = Some(ts);
                p.exit = Some(wait_status(exit_code));
            }
            Event::Mem {
                proc,
                in_job,
                comm,
                rss,
                oom_score_adj,
                pgtables_kb,
                memcg_id,
                alloc_kb,
                freed_kb,
                cache_kb,
                ..
            } => {
                let mut net_kb = alloc_kb as i64 - freed_kb as i64;
                if self.page_cache {
                    // Added is anonymous, shmem and copy-on-write memory,
                    // all of which the process maps: never more than that.
                    // A parent that writes while a short-lived child still
                    // shares its pages copies them, and the child frees the
                    // originals at its exec or exit: the parent's count
                    // climbs with every fork while its memory does not.
                    net_kb = net_kb.min(
                        rss.anon_kb
                            .saturating_add(rss.shmem_kb)
                            .saturating_add(rss.swap_kb) as i64,
                    );
                }
                let more = Sample {
                    adj: oom_score_adj,
                    pgtables_kb,
                    memcg_id,
                    net_kb,
                    cache_kb,
                    ..Sample::at(ts, 0)
                };
                self.on_mem(ts, proc, in_job, comm, rss, more)
            }
            Event::Oom(rec) => self.on_oom(ts, *rec),
            Event::Signal(rec) => self.signals.observe(ts, *rec),
            Event::Exe(x) => self.signals.observe_exe(x),
            Event::SignalReceived(x) => self.signals.observe_received(ts, x),
            Event::OomAdj {
                proc,
                in_job,
                oom_score_adj,
                ..
            } => {
                // Only the job's are reported; a bound on what is kept.
                if in_job || self.job_procs.contains_key(&proc) {
                    self.adj.insert(proc, oom_score_adj);
                }
            }
            Event::Printk { msg, .. } => {
                let parsed = parse_kernel_line(&msg);
                if parsed != KernelLine::Other || self.log.len() < MAX_PRINTK_LINES / 2 {
                    self.log.push_back(LogLine { ts, msg, parsed });
                }
            }
            Event::JobStart(j) => self.on_job_start(ts, j),
            Event::JobExit(JobExit { status, .. }) => {
                if let Some(job) = &mut self.job {
                    job.exit = Some(status);
                    job.exited_ns = Some(ts);
                }
            }
            Event::Lost(l) => self.lost = l,
            Event::Compacted(c) => self.compaction = Some(c),
            Event::LeakWarning(w) => self.leak_warnings.push((ts, w)),
            Event::Cgroup(CgroupName { id, path }) => {
                self.cgroups.insert(id, path);
            }
            Event::Note(_) => {}
            Event::Pressure(p) => {
                let horizon = self.horizon();
                self.attribution.on_pressure(ts, &p, &self.tracks);
                self.pressure.push(ts, *p, horizon);
            }
            Event::Smaps(s) => self.attribution.on_smaps(s),
            // The GPU ledger is kept elsewhere (model/gpu.rs, in progress).
            Event::Gpu(_) => {}
            Event::ProcInfo(i) => {
                // A process found running at an attach: its parent from
                // /proc, since no fork of it was recorded.
                if let (Some(pp), Some(&start)) = (i.ppid, self.current.get(&i.tgid)) {
                    let key = ProcKey {
                        tgid: i.tgid,
                        start_ns: start,
                    };
                    let parent = self.current.get(&pp).map(|&s| ProcKey {
                        tgid: pp,
                        start_ns: s,
                    });
                    let parent = parent.filter(|k| self.job_procs.contains_key(k));
                    if let (Some(p), Some(parent)) = (self.job_procs.get_mut(&key), parent)
                        && p.parent.is_none()
                    {
                        p.parent = Some(parent);
                    }
                }
                self.attribution.on_proc_info(i)
            }
            Event::Shm(o) => self.attribution.on_shm(o),
        }
        self.settle(false);
        if self.now >= self.next_sweep {
            self.sweep();
            self.next_sweep = self.now + SWEEP_NS;
        }
    }

    /// A new start time under a known tgid: the old process has exited even
    /// if its exit went unrecorded (only job processes report exits).
    fn note_pid(&mut self, key: ProcKey, ts: u64) {
        if key.start_ns == 0 {
            return;
        }
        let prev = self.current.insert(key.tgid, key.start_ns);
        if let Some(old) = prev.filter(|&s| s != 0 && s < key.start_ns) {
            let old = ProcKey {
                tgid: key.tgid,
                start_ns: old,
            };
            if let Some(tr) = self.tracks.get_mut(&old) {
                tr.died_ns.get_or_insert(ts.min(key.start_ns.max(1)));
            }
        } else if let Some(old) = prev.filter(|&s| s > key.start_ns) {
            // A late record of the older process: keep the newer as current.
            self.current.insert(key.tgid, old);
        }
    }

    fn on_mem(
        &mut self,
        ts: u64,
        proc: ProcKey,
        in_job: bool,
        comm: String,
        rss: Rss,
        more: Sample,
    ) {
        self.note_pid(proc, ts);
        let horizon = self.horizon();
        let kb = rss.resident_kb();
        if in_job || self.job_procs.contains_key(&proc) {
            let p = self.job_procs.entry(proc).or_default();
            p.peak_kb = p.peak_kb.max(kb);
            p.comm.clone_from(&comm);
            if self.honest {
                p.net_kb = Some(more.net_kb);
                p.peak_net_kb = Some(p.peak_net_kb.map_or(more.net_kb, |n| n.max(more.net_kb)));
                if self.page_cache {
                    p.cache_kb = Some(more.cache_kb);
                }
            }
        }
        let tr = self.tracks.entry(proc).or_default();
        tr.comm = comm;
        tr.in_job |= in_job;
        tr.push(
            Sample {
                ts,
                kb,
                swap_kb: rss.swap_kb,
                ..more
            },
            horizon,
        );
    }

    fn on_job_start(&mut self, ts: u64, j: JobStart) {
        let key = ProcKey {
            tgid: j.pid,
            start_ns: j.start_ns,
        };
        self.note_pid(key, ts);
        let p = self.job_procs.entry(key).or_default();
        if p.comm.is_empty() {
            // Until the first exec or memory record names it.
            let arg0 = j.argv.first().map(String::as_str).unwrap_or("");
            p.comm = arg0.rsplit('/').next().unwrap_or(arg0).to_string();
        }
        if p.fork_ns.is_none() && j.start_ns == 0 {
            p.fork_ns = Some(ts);
        }
        self.job = Some(Job {
            pid: j.pid,
            start_ns: j.start_ns,
            started_ns: ts,
            argv: j.argv,
            cwd: j.cwd,
            uid: j.uid,
            cgroup: j.cgroup,
            memory_limit_bytes: j.memory_limit_bytes,
            exit: None,
            exited_ns: None,
        });
        // Kernel records of the root can precede this one in the file: the
        // collector writes its own records as it makes them, the kernel's
        // as it drains the ring buffer.
        let earlier = self
            .job_procs
            .keys()
            .filter(|k| k.tgid == j.pid && k.start_ns != 0)
            .max_by_key(|k| k.start_ns)
            .copied();
        if let Some(k) = earlier {
            self.adopt_root(k);
        }
    }

    /// The collector can't see the kernel's start time of the job's root
    /// and records 0; the first job record under the root's pid names it.
    /// From then on the root is that process, whatever later reuses its pid.
    fn adopt_root(&mut self, key: ProcKey) {
        let Some(job) = &mut self.job else {
            return;
        };
        if job.start_ns != 0 || key.tgid != job.pid || key.start_ns == 0 {
            return;
        }
        job.start_ns = key.start_ns;
        let placeholder = ProcKey {
            tgid: key.tgid,
            start_ns: 0,
        };
        if let Some(p) = self.job_procs.remove(&placeholder) {
            let real = self.job_procs.entry(key).or_default();
            if real.comm.is_empty() {
                real.comm = p.comm;
            }
            real.peak_kb = real.peak_kb.max(p.peak_kb);
        }
    }

    fn on_oom(&mut self, ts: u64, mut rec: OomRecord) {
        // The classic tracepoint knows no start time: the victim is the
        // live process with that pid.
        if rec.victim.start_ns == 0
            && let Some(&start_ns) = self.current.get(&rec.victim.tgid)
        {
            rec.victim.start_ns = start_ns;
        }
        let key = rec.victim;
        if rec.in_job || self.job_procs.contains_key(&key) {
            let p = self.job_procs.entry(key).or_default();
            p.oom_killed = true;
            p.peak_kb = p.peak_kb.max(rec.rss.resident_kb());
            if p.comm.is_empty() {
                p.comm.clone_from(&rec.comm);
            }
        }
        if let Some(tr) = self.tracks.get_mut(&key) {
            tr.peak_kb = tr.peak_kb.max(rec.rss.resident_kb());
        }
        let source = KillSource {
            record: rec.kind,
            probe: rec.source.clone(),
        };
        let partner = self
            .open
            .iter_mut()
            .find(|k| k.kill.victim.pid == key.tgid && k.kill.ts_ns.abs_diff(ts) <= MERGE_NS);
        if let Some(open) = partner {
            let k = &mut open.kill;
            k.ts_ns = k.ts_ns.min(ts);
            if !k.sources.contains(&source) {
                k.sources.push(source);
                // oom_kill_process runs before mark_victim: list it first.
                k.sources.sort_by_key(|s| s.record != OomRecordKind::Kill);
            }
            // mark_victim reads the counters as the process is marked, the
            // closest to what it held when killed; prefer its figures, unless
            // it is the classic tracepoint before 6.8, which has only a pid.
            if rec.kind == OomRecordKind::Victim && has_figures(&rec) {
                fill_victim(&mut k.victim, &rec);
            }
            if k.victim.start_ns == 0 {
                k.victim.start_ns = key.start_ns;
            }
            if k.victim_memcg_id == 0 {
                k.victim_memcg_id = rec.memcg_id;
            }
            if let Some(oc) = rec.oc {
                open.hints.oc_constraint = Some(Constraint::from_kernel(oc.constraint));
                k.kernel_points = Some(oc.chosen_points);
                k.totalpages = Some(oc.totalpages);
                k.oom_memcg_id = oc.memcg_id;
            }
            return;
        }
        let mut victim = Victim {
            pid: key.tgid,
            start_ns: key.start_ns,
            thread_pid: 0,
            comm: String::new(),
            rss: Rss::default(),
            oom_score_adj: 0,
            uid: 0,
            in_job: false,
            total_vm_kb: 0,
            pgtables_kb: 0,
            tree: Vec::new(),
        };
        fill_victim(&mut victim, &rec);
        let oc = rec.oc;
        self.open.push(OpenKill {
            kill: Kill {
                ts_ns: ts,
                realtime_ns: None,
                victim,
                constraint: Constraint::Unknown,
                memcg: None,
                task_memcg: None,
                memcg_usage_kb: None,
                memcg_limit_kb: None,
                memcg_failcnt: None,
                trigger: Trigger {
                    pid: rec.trigger.pid,
                    tgid: rec.trigger.tgid,
                    comm: rec.trigger.comm,
                },
                sources: vec![source],
                kernel_points: oc.map(|o| o.chosen_points),
                totalpages: oc.map(|o| o.totalpages),
                oom_memcg_id: oc.map_or(0, |o| o.memcg_id),
                victim_memcg_id: rec.memcg_id,
                growers: Vec::new(),
                ranking: None,
                groups: Vec::new(),
                sum_check: None,
                pressure: None,
                window_ns: self.window,
                kernel_log: Vec::new(),
            },
            hints: Hints {
                oc_constraint: oc.map(|o| Constraint::from_kernel(o.constraint)),
                ..Hints::default()
            },
        });
    }

    /// Closes the kills that have waited long enough (all of them at the
    /// end), then forgets the log lines no open kill can use.
    fn settle(&mut self, all: bool) {
        let now = self.now;
        let mut i = 0;
        while i < self.open.len() {
            if all || self.open[i].kill.ts_ns + SETTLE_NS < now {
                let mut k = self.open.swap_remove(i);
                self.close(&mut k);
                self.series.on_kill(&k.kill, &self.tracks);
                self.done.push(k);
            } else {
                i += 1;
            }
        }
        let keep_from = self.anchor().saturating_sub(PRINTK_NS);
        while self
            .log
            .front()
            .is_some_and(|l| l.ts < keep_from || self.log.len() > MAX_PRINTK_LINES)
        {
            self.log.pop_front();
        }
    }

    fn close(&self, open: &mut OpenKill) {
        let k = &mut open.kill;
        let pids = [k.victim.pid, k.victim.thread_pid];
        let mut usage_dt = u64::MAX;
        let mut oomkill_dt = u64::MAX;
        for line in self
            .log
            .iter()
            .filter(|l| l.ts.abs_diff(k.ts_ns) <= PRINTK_NS)
        {
            let dt = line.ts.abs_diff(k.ts_ns);
            let used = match &line.parsed {
                KernelLine::OomKill {
                    constraint,
                    oom_memcg,
                    task_memcg,
                    pid,
                } if pid.is_some_and(|p| pids.contains(&p)) && dt < oomkill_dt => {
                    oomkill_dt = dt;
                    open.hints.printk_constraint = *constraint;
                    open.hints.oom_memcg.clone_from(oom_memcg);
                    open.hints.task_memcg.clone_from(task_memcg);
                    true
                }
                KernelLine::Killed {
                    constraint,
                    pid,
                    total_vm_kb,
                    pgtables_kb,
                } if pids.contains(pid) => {
                    open.hints.prefix_constraint = Some(*constraint);
                    if k.victim.total_vm_kb == 0 {
                        k.victim.total_vm_kb = total_vm_kb.unwrap_or(0);
                    }
                    if k.victim.pgtables_kb == 0 {
                        k.victim.pgtables_kb = pgtables_kb.unwrap_or(0);
                    }
                    true
                }
                // The usage line names no process: the kill nearest in time
                // is the one it was printed for.
                KernelLine::Usage {
                    usage_kb,
                    limit_kb,
                    failcnt,
                } if dt < usage_dt => {
                    usage_dt = dt;
                    k.memcg_usage_kb = Some(*usage_kb);
                    k.memcg_limit_kb = *limit_kb;
                    k.memcg_failcnt = *failcnt;
                    true
                }
                _ => false,
            };
            if used && k.kernel_log.len() < MAX_KILL_LOG {
                k.kernel_log.push(line.msg.clone());
            }
        }
        let h = &open.hints;
        k.constraint = h
            .oc_constraint
            .or(h.printk_constraint)
            .or(h.prefix_constraint)
            .unwrap_or(Constraint::Unknown);
        k.victim.tree = self.tree(&k.victim);
        let oom_memcg = (k.constraint == Constraint::Memcg)
            .then(|| self.memcgs(k, h).1)
            .flatten();
        let all = self.growers(k, oom_memcg.as_deref());
        k.groups = attribution::groups(&all, |g| self.role_of(g));
        k.sum_check = self.kill_sum_check(k);
        k.growers = keep_top(all);
        k.ranking = Some(self.rank(k));
        k.pressure = self
            .pressure
            .before(k.ts_ns.saturating_sub(self.window), k.ts_ns);
    }

    /// When the process was born, if known: its fork, else its start time.
    fn born_ns(&self, key: ProcKey) -> Option<u64> {
        self.job_procs
            .get(&key)
            .and_then(|p| p.fork_ns)
            .or((key.start_ns != 0).then_some(key.start_ns))
    }

    /// The candidates the OOM killer weighed: the kill's domain (the memcg
    /// for a memcg OOM, the machine otherwise), alive at the kill, with
    /// their last sample before it.
    fn rank(&self, k: &Kill) -> Ranking {
        let kill = k.ts_ns;
        let memcg = k.constraint == Constraint::Memcg;
        let domain = if k.oom_memcg_id != 0 {
            k.oom_memcg_id
        } else {
            k.victim_memcg_id
        };
        let job_cgroup = self.job.as_ref().and_then(|j| j.cgroup.as_ref()).is_some();
        let victim = k.victim.key();
        let mut others = Vec::new();
        for (&key, tr) in &self.tracks {
            if key == victim || tr.died_ns.is_some_and(|d| d <= kill) {
                continue;
            }
            let Some(s) = tr.at_or_before(kill) else {
                continue;
            };
            if memcg {
                let inside = match (s.memcg_id, domain) {
                    (0, _) | (_, 0) => tr.in_job && job_cgroup,
                    (m, d) => m == d,
                };
                if !inside {
                    continue;
                }
            }
            others.push(badness::Inputs {
                pid: key.tgid,
                start_ns: key.start_ns,
                comm: tr.comm.clone(),
                in_job: tr.in_job,
                rss_kb: s.kb,
                swap_kb: s.swap_kb,
                pgtables_kb: s.pgtables_kb,
                oom_score_adj: s.adj,
            });
        }
        let v = &k.victim;
        let vin = badness::Inputs {
            pid: v.pid,
            start_ns: v.start_ns,
            comm: v.comm.clone(),
            in_job: v.in_job,
            rss_kb: v.rss.resident_kb(),
            swap_kb: v.rss.swap_kb,
            pgtables_kb: v.pgtables_kb,
            oom_score_adj: v.oom_score_adj,
        };
        let page_kb = self.page_kb.max(1);
        let job_limit_kb = self
            .job
            .as_ref()
            .filter(|_| v.in_job)
            .and_then(|j| j.memory_limit_bytes)
            .map(|b| b / 1024);
        let (total, source) = match (k.totalpages.filter(|&t| t > 0), memcg) {
            (Some(t), _) => (t, TotalSource::Kernel),
            (None, true) => match k.memcg_limit_kb.or(job_limit_kb) {
                Some(l) => (l / page_kb, TotalSource::MemcgLimit),
                None => (0, TotalSource::Unknown),
            },
            (None, false) if self.machine_kb > 0 => {
                (self.machine_kb / page_kb, TotalSource::Machine)
            }
            (None, false) => (0, TotalSource::Unknown),
        };
        badness::rank(&vin, others, page_kb, total, source, k.kernel_points)
    }

    /// A memcg OOM is about what is charged to that cgroup (or below it):
    /// a process known to be elsewhere (another container, a compiler on
    /// the host) did not bring it on, however much it grew.
    fn outside_oom_memcg(&self, oom_memcg: Option<&str>, memcg_id: u64) -> bool {
        if memcg_id == 0 {
            return false;
        }
        let (Some(oom), Some(path)) = (oom_memcg, self.cgroups.get(&memcg_id)) else {
            return false;
        };
        let oom = oom.trim_end_matches('/');
        !(oom.is_empty() || path == oom || path.starts_with(&format!("{oom}/")))
    }

    fn growers(&self, k: &Kill, oom_memcg: Option<&str>) -> Vec<Grower> {
        let kill = k.ts_ns;
        let start = kill.saturating_sub(self.window);
        let victim = k.victim.key();
        let mut out = Vec::new();
        let mut victim_seen = false;
        for (&key, tr) in &self.tracks {
            let is_victim = key == victim;
            victim_seen |= is_victim;
            // The dead hold no memory at the kill; earlier victims included.
            if !is_victim && tr.died_ns.is_some_and(|d| d <= kill) {
                continue;
            }
            let end = if is_victim {
                Sample {
                    net_kb: tr.at_or_before(kill).map_or(0, |s| s.net_kb),
                    ..Sample::at(kill, k.victim.rss.resident_kb())
                }
            } else {
                match tr.at_or_before(kill) {
                    Some(s) => s,
                    None => continue,
                }
            };
            if !is_victim && self.outside_oom_memcg(oom_memcg, end.memcg_id) {
                continue;
            }
            let c = Candidate {
                key,
                track: Some(tr),
                end,
                comm: &tr.comm,
                in_job: tr.in_job || (is_victim && k.victim.in_job),
                is_victim,
            };
            out.extend(self.growth(c, start));
        }
        if !victim_seen {
            // A victim the memory probe never reported: only its birth in
            // the window gives a baseline.
            let c = Candidate {
                key: victim,
                track: None,
                end: Sample::at(kill, k.victim.rss.resident_kb()),
                comm: &k.victim.comm,
                in_job: k.victim.in_job,
                is_victim: true,
            };
            out.extend(self.growth(c, start));
        }
        // Honest growth ranks where the recording has it: RSS blames a
        // forked worker for its parent's pages.
        if self.honest {
            out.sort_by(|a, b| {
                b.honest_kb
                    .cmp(&a.honest_kb)
                    .then(b.grew_kb.cmp(&a.grew_kb))
                    .then(a.pid.cmp(&b.pid))
            });
        } else {
            out.sort_by(|a, b| b.grew_kb.cmp(&a.grew_kb).then(a.pid.cmp(&b.pid)));
        }
        out
    }

    /// Role groups over the whole run, from each process's last record.
    fn run_groups(&self, processes: &[Process]) -> Vec<Group> {
        let as_growers: Vec<Grower> = processes
            .iter()
            .map(|p| Grower {
                pid: p.pid,
                start_ns: p.start_ns,
                comm: p.comm.clone(),
                grew_kb: p.peak_rss_kb,
                honest_kb: p.honest_peak_kb,
                window_ns: p
                    .died_ns
                    .or(self.last)
                    .unwrap_or(0)
                    .saturating_sub(p.born_ns.unwrap_or(0)),
                rate_kb_per_s: None,
                rss_kb: p.peak_rss_kb,
                in_job: true,
                born_in_window: false,
                is_victim: false,
            })
            .collect();
        attribution::groups(&as_growers, |g| self.role_of(g))
    }

    /// A grower's role: DataLoader worker, torchrun rank, or its command
    /// line when it has siblings (groups of one are dropped later).
    fn role_of(&self, g: &Grower) -> Option<String> {
        let info = self.attribution.info_of(g.pid);
        attribution::role(&g.comm, info).or_else(|| {
            let cmd = info?.cmdline.join(" ");
            (!cmd.is_empty()).then(|| format!("`{}`", truncate_chars(&cmd, 60)))
        })
    }

    /// The job's honest growth over the kill's window against the job
    /// cgroup's usage change: the kernel's own usage at the kill where its
    /// log gave it, else the last sample.
    fn kill_sum_check(&self, k: &Kill) -> Option<SumCheck> {
        let start = k.ts_ns.saturating_sub(self.window);
        let from = self.pressure.around(start)?;
        let mut to = self.pressure.around(k.ts_ns)?.clone();
        if let (Some(u), Some(cg)) = (k.memcg_usage_kb, to.cgroup.as_mut())
            && k.constraint == Constraint::Memcg
        {
            cg.usage_kb = u;
        }
        from.cgroup.as_ref()?;
        let attributed = self
            .tracks
            .iter()
            .filter(|(key, t)| {
                (t.in_job || **key == k.victim.key()) && t.died_ns.is_none_or(|d| d > k.ts_ns)
            })
            .filter_map(|(key, t)| {
                let end = t.at_or_before(k.ts_ns)?;
                let base = match t.at_or_before(start) {
                    Some(b) => b.net_kb,
                    None if self.born_ns(*key).is_some_and(|b| b >= start) => 0,
                    None => t.first_after(start)?.net_kb,
                };
                Some(end.net_kb - base)
            })
            .sum();
        Some(attribution::sum_check(k.ts_ns, from, &to, attributed))
    }

    /// Growth of one process from the window's start to `end`.
    ///
    /// The baseline is the last sample at or before the window's start. A
    /// process born inside the window grew from nothing. A process that was
    /// alive before the window but first reported inside it (the recorder
    /// started late, or it sat below the threshold) counts from its first
    /// sample: the memory it already had is not growth we saw.
    fn growth(&self, c: Candidate<'_>, start: u64) -> Option<Grower> {
        let Candidate {
            key,
            track: tr,
            end,
            comm,
            in_job,
            is_victim,
        } = c;
        let born = self.born_ns(key);
        let base = tr.and_then(|t| t.at_or_before(start));
        let (from, born_in_window) = match base {
            Some(b) => (b, false),
            None => match born.filter(|&b| b >= start && b <= end.ts) {
                // Rate over its life, not over the whole window: a process
                // born a second before the kill grew fast.
                Some(b) => (Sample::at(b, 0), true),
                None => (tr?.first_after(start).filter(|s| s.ts <= end.ts)?, false),
            },
        };
        let grew_kb = end.kb.saturating_sub(from.kb);
        let honest_kb = self.honest.then(|| end.net_kb - from.net_kb);
        if grew_kb == 0 && honest_kb.unwrap_or(0) <= 0 {
            return None;
        }
        let window_ns = end.ts.saturating_sub(from.ts);
        Some(Grower {
            pid: key.tgid,
            start_ns: key.start_ns,
            comm: comm.to_string(),
            grew_kb,
            honest_kb,
            window_ns,
            // Over less than a second the samples measure a jump (a fork's
            // inherited pages, one big allocation), not a rate.
            rate_kb_per_s: (window_ns >= SEC).then(|| grew_kb as f64 / ns_to_s(window_ns)),
            rss_kb: end.kb,
            in_job,
            born_in_window,
            is_victim,
        })
    }

    /// The victim's ancestry, job root first, through recorded forks.
    fn tree(&self, v: &Victim) -> Vec<TreeNode> {
        let key = v.key();
        if !v.in_job && !self.job_procs.contains_key(&key) {
            return Vec::new();
        }
        let root = self.job.as_ref().map(Job::key);
        let mut chain = vec![TreeNode {
            pid: v.pid,
            comm: v.comm.clone(),
        }];
        let mut seen = HashSet::from([key]);
        let mut cur = key;
        while Some(cur) != root {
            let Some(parent) = self.job_procs.get(&cur).and_then(|p| p.parent) else {
                break;
            };
            // The root's parent is the recorder; anything else outside the
            // job map, or a loop, means a fork record went missing.
            if !self.job_procs.contains_key(&parent) || !seen.insert(parent) {
                break;
            }
            chain.push(TreeNode {
                pid: parent.tgid,
                comm: self.comm_of(parent),
            });
            cur = parent;
        }
        chain.reverse();
        chain
    }

    fn comm_of(&self, key: ProcKey) -> String {
        self.job_procs
            .get(&key)
            .map(|p| p.comm.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| self.tracks.get(&key).map(|t| t.comm.clone()))
            .unwrap_or_else(|| "?".into())
    }

    /// Drops the tracks of processes dead for longer than the window.
    fn sweep(&mut self) {
        let horizon = self.horizon();
        let dead: Vec<ProcKey> = self
            .tracks
            .iter()
            .filter(|(_, t)| t.died_ns.is_some_and(|d| d < horizon))
            .map(|(&k, _)| k)
            .collect();
        for key in dead {
            let Some(t) = self.tracks.remove(&key) else {
                continue;
            };
            if self.current.get(&key.tgid) == Some(&key.start_ns) {
                self.current.remove(&key.tgid);
            }
            self.retired.push(MemoryUser {
                pid: key.tgid,
                start_ns: key.start_ns,
                comm: t.comm,
                peak_rss_kb: t.peak_kb,
                in_job: t.in_job,
            });
        }
        if self.retired.len() > 4 * TOP_MEMORY {
            top_memory(&mut self.retired);
        }
    }

    fn finish(mut self, header: &RecordingHeader) -> Report {
        self.settle(true);
        let mut kills = Vec::with_capacity(self.done.len());
        for OpenKill { mut kill, hints } in std::mem::take(&mut self.done) {
            self.resolve_memcg(&mut kill, hints);
            kills.push(kill);
        }
        kills.sort_by_key(|k| k.ts_ns);

        let mut processes: Vec<Process> = self
            .job_procs
            .iter()
            .map(|(key, p)| Process {
                pid: key.tgid,
                start_ns: key.start_ns,
                comm: p.comm.clone(),
                parent: p.parent,
                exec: p.exec.clone(),
                born_ns: self.born_ns(*key),
                died_ns: p.died_ns,
                exit: p.exit,
                peak_rss_kb: p.peak_kb,
                oom_killed: p.oom_killed,
                oom_score_adj: self.adj.get(key).copied(),
                honest_kb: p.net_kb,
                honest_peak_kb: p.peak_net_kb,
                page_cache_kb: p.cache_kb,
                uss_kb: self.attribution.smaps_of(key.tgid).map(|s| s.uss_kb),
                pss_kb: self.attribution.smaps_of(key.tgid).map(|s| s.pss_kb),
            })
            .collect();
        processes.sort_by_key(|p| (p.born_ns.unwrap_or(0), p.pid, p.start_ns));
        let mut deaths: Vec<Death> = processes
            .iter()
            .filter_map(|p| deaths::classify(p, &kills, &self.signals))
            .collect();
        deaths.sort_by_key(|d| (d.ts_ns, d.pid));
        let groups = self.run_groups(&processes);

        let mut top = std::mem::take(&mut self.retired);
        top.extend(self.tracks.iter().map(|(key, t)| MemoryUser {
            pid: key.tgid,
            start_ns: key.start_ns,
            comm: t.comm.clone(),
            peak_rss_kb: t.peak_kb,
            in_job: t.in_job,
        }));
        top_memory(&mut top);

        let series = std::mem::take(&mut self.series).finish(&processes);
        let leaks =
            std::mem::take(&mut self.leaks).finish(self.last.unwrap_or(0), &self.attribution);
        let mut report = Report {
            header: header.clone(),
            window_ns: self.window,
            first_ns: self.first,
            last_ns: self.last,
            events: self.events,
            job: self.job,
            kills,
            processes,
            deaths,
            groups,
            shared_memory: self.attribution.shm_objects(),
            attribution_at_peak: self.attribution.peak.clone(),
            smaps_rounds: self.attribution.smaps_rounds,
            smaps_cost_us: self.attribution.smaps_cost_us,
            top_memory: top,
            lost: self.lost,
            series,
            undecodable: 0,
            stopped_early: None,
            skipped: Skipped::default(),
            gpu: gpu::GpuReport::default(),
            leaks,
            compaction: self.compaction,
            leak_warnings: self.leak_warnings,
        };
        let kill_windows: Vec<(u64, u64)> = report
            .kills
            .iter()
            .map(|k| (k.ts_ns, k.window_ns))
            .collect();
        report.gpu = std::mem::take(&mut self.gpu).finish(&kill_windows);
        for i in 0..report.kills.len() {
            report.kills[i].realtime_ns = report.realtime_ns(report.kills[i].ts_ns);
        }
        report
    }

    /// Names the memcgs once every cgroup record has been read: the
    /// collector names a cgroup when it first meets its id, which can be
    /// after the kill.
    /// The victim's memory cgroup and the one that ran out, by what the
    /// records tell.
    fn memcgs(&self, k: &Kill, h: &Hints) -> (Option<String>, Option<String>) {
        let name = |id: u64| (id != 0).then(|| self.cgroups.get(&id).cloned()).flatten();
        let job_cgroup = self
            .job
            .as_ref()
            .and_then(|j| j.cgroup.clone())
            .filter(|_| k.victim.in_job);
        let task = name(k.victim_memcg_id)
            .or(h.task_memcg.clone())
            .or(job_cgroup.clone());
        let oom = name(k.oom_memcg_id)
            .or(h.oom_memcg.clone())
            .or_else(|| task.clone())
            .or(job_cgroup);
        (task, oom)
    }

    fn resolve_memcg(&self, k: &mut Kill, h: Hints) {
        (k.task_memcg, k.memcg) = self.memcgs(k, &h);
        if k.memcg_limit_kb.is_none()
            && let Some(job) = &self.job
            && job.cgroup.is_some()
            && job.cgroup == k.memcg
        {
            k.memcg_limit_kb = job.memory_limit_bytes.map(|b| b / 1024);
        }
    }
}

/// Whether an OOM record carries the victim's figures: the classic
/// `oom:mark_victim` before Linux 6.8 has a pid and nothing else.
fn has_figures(rec: &OomRecord) -> bool {
    !rec.comm.is_empty()
}

fn fill_victim(v: &mut Victim, rec: &OomRecord) {
    v.thread_pid = rec.victim_pid;
    v.comm.clone_from(&rec.comm);
    v.rss = rec.rss;
    v.oom_score_adj = rec.oom_score_adj;
    v.uid = rec.uid;
    v.in_job |= rec.in_job;
    v.total_vm_kb = rec.total_vm_kb;
    v.pgtables_kb = rec.pgtables_kb;
}

/// The machine's top growers, plus the job's own top ten and the victim
/// even when a busy machine (a compiler, another job) outgrew them: those
/// are the lines the user came for.
fn keep_top(mut out: Vec<Grower>) -> Vec<Grower> {
    let mut kept = 0;
    let mut job_kept = 0;
    out.retain(|g| {
        let keep = kept < TOP_GROWERS || (g.in_job && job_kept < TOP_JOB_GROWERS) || g.is_victim;
        if keep {
            kept += 1;
            job_kept += usize::from(g.in_job);
        }
        keep
    });
    out
}

fn truncate_chars(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Keeps the largest few, one entry per process.
fn top_memory(v: &mut Vec<MemoryUser>) {
    v.sort_by(|a, b| {
        b.peak_rss_kb
            .cmp(&a.peak_rss_kb)
            .then(a.pid.cmp(&b.pid))
            .then(a.start_ns.cmp(&b.start_ns))
    });
    let mut seen = HashSet::new();
    v.retain(|u| u.peak_rss_kb > 0 && seen.insert((u.pid, u.start_ns)));
    v.truncate(TOP_MEMORY);
}

// ---------------------------------------------------------------------------
// Kernel log lines (mm/oom_kill.c, mm/memcontrol.c). The probe may hand over
// the line with or without the console's "[  12.345678] " prefix, so each
// form is found by its marker, not at the start.

fn parse_kernel_line(msg: &str) -> KernelLine {
    if let Some(i) = msg.find("oom-kill:") {
        let mut constraint = None;
        let mut oom_memcg = None;
        let mut task_memcg = None;
        let mut pid = None;
        for (k, v) in key_values(&msg[i + "oom-kill:".len()..]) {
            match k {
                "constraint" => constraint = Constraint::from_printk(&v),
                "oom_memcg" => oom_memcg = Some(v),
                "task_memcg" => task_memcg = Some(v),
                "pid" => pid = v.parse().ok(),
                _ => {}
            }
        }
        return KernelLine::OomKill {
            constraint,
            oom_memcg,
            task_memcg,
            pid,
        };
    }
    if let Some(i) = msg.find("Killed process ") {
        let why = &msg[..i];
        let constraint = if why.contains("Memory cgroup out of memory") {
            Constraint::Memcg
        } else if why.contains("Out of memory") {
            Constraint::None
        } else {
            Constraint::Unknown
        };
        let rest = &msg[i + "Killed process ".len()..];
        let Some(pid) = leading_number(rest) else {
            return KernelLine::Other;
        };
        return KernelLine::Killed {
            constraint,
            pid: pid as u32,
            total_vm_kb: field_number(rest, "total-vm:"),
            pgtables_kb: field_number(rest, "pgtables:"),
        };
    }
    if let Some(i) = msg.find("memory: usage ") {
        let rest = &msg[i + "memory: usage ".len()..];
        let Some(usage_kb) = leading_number(rest) else {
            return KernelLine::Other;
        };
        return KernelLine::Usage {
            usage_kb,
            limit_kb: field_number(rest, "limit ").filter(|&l| l < NO_LIMIT_KB),
            failcnt: field_number(rest, "failcnt "),
        };
    }
    KernelLine::Other
}

/// `a=1,b=/x,y,c=2` → (a,1) (b,/x,y) (c,2): a piece without `=` belongs to
/// the value before it, since cgroup paths may hold commas.
fn key_values(s: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for piece in s.trim().split(',') {
        match piece.split_once('=') {
            Some((k, v)) if !k.contains('/') => out.push((k.trim(), v.to_string())),
            _ => {
                if let Some((_, v)) = out.last_mut() {
                    v.push(',');
                    v.push_str(piece);
                }
            }
        }
    }
    out
}

fn leading_number(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

fn field_number(s: &str, name: &str) -> Option<u64> {
    leading_number(&s[s.find(name)? + name.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{JobExit, OomControl, Task};

    const MIB: u64 = 1024;

    fn key(tgid: u32, start_ns: u64) -> ProcKey {
        ProcKey { tgid, start_ns }
    }

    fn s(secs: f64) -> u64 {
        (secs * SEC as f64) as u64
    }

    fn at(secs: f64, event: Event) -> Timed {
        Timed {
            ts_ns: s(secs),
            event,
        }
    }

    fn mem(secs: f64, k: ProcKey, comm: &str, anon_kb: u64, in_job: bool) -> Timed {
        at(
            secs,
            Event::Mem {
                proc: k,
                in_job,
                comm: comm.into(),
                rss: Rss {
                    anon_kb,
                    file_kb: 0,
                    shmem_kb: 0,
                    swap_kb: 0,
                },
                faults: 0,
                reason: 1,
                oom_score_adj: 0,
                pgtables_kb: 0,
                memcg_id: 0,
                stall_ns: 0,
                alloc_kb: 0,
                freed_kb: 0,
                cache_kb: 0,
            },
        )
    }

    fn fork(secs: f64, child: ProcKey, parent: ProcKey, comm: &str) -> Timed {
        at(
            secs,
            Event::Fork {
                child,
                parent,
                comm: comm.into(),
            },
        )
    }

    fn exec(secs: f64, k: ProcKey, comm: &str) -> Timed {
        at(
            secs,
            Event::Exec {
                proc: k,
                comm: comm.into(),
                filename: format!("/usr/bin/{comm}"),
                truncated: false,
            },
        )
    }

    fn job_start(secs: f64, root: ProcKey) -> Timed {
        at(
            secs,
            Event::JobStart(JobStart {
                pid: root.tgid,
                start_ns: root.start_ns,
                argv: vec!["python3".into(), "train.py".into()],
                cwd: "/".into(),
                uid: 0,
                gid: 0,
                cgroup: Some("/trainbpf-77".into()),
                memory_limit_bytes: Some(300 << 20),
                attached: None,
            }),
        )
    }

    fn oom(
        secs: f64,
        kind: OomRecordKind,
        victim: ProcKey,
        comm: &str,
        anon_kb: u64,
        oc: Option<OomControl>,
    ) -> Timed {
        at(
            secs,
            Event::Oom(Box::new(OomRecord {
                kind,
                source: match kind {
                    OomRecordKind::Kill => "fentry".into(),
                    OomRecordKind::Victim => "tp_btf".into(),
                },
                victim,
                victim_pid: victim.tgid,
                comm: comm.into(),
                in_job: true,
                uid: 0,
                oom_score_adj: 0,
                rss: Rss {
                    anon_kb,
                    file_kb: 0,
                    shmem_kb: 0,
                    swap_kb: 0,
                },
                total_vm_kb: 0,
                pgtables_kb: 0,
                memcg_id: 0,
                oc,
                trigger: Task {
                    pid: victim.tgid,
                    tgid: victim.tgid,
                    comm: comm.into(),
                },
            })),
        )
    }

    fn printk(secs: f64, msg: &str) -> Timed {
        at(
            secs,
            Event::Printk {
                tgid: 0,
                msg: msg.into(),
            },
        )
    }

    fn run(events: Vec<Timed>) -> Report {
        build(
            &RecordingHeader::default(),
            events.into_iter(),
            &ModelOptions::default(),
        )
    }

    fn grower(k: &Kill, pid: u32) -> Option<&Grower> {
        k.growers.iter().find(|g| g.pid == pid)
    }

    const ROOT: ProcKey = ProcKey {
        tgid: 700,
        start_ns: 1_000,
    };

    /// The demo's shape: python3(700) forks a worker that leaks until the
    /// memcg kills it.
    fn leak_run() -> Vec<Timed> {
        let w = key(812, s(5.0));
        vec![
            job_start(0.0, ROOT),
            exec(0.1, ROOT, "python3"),
            mem(0.2, ROOT, "python3", 40 * MIB, true),
            fork(5.0, w, ROOT, "python3"),
            mem(5.1, w, "pt_data_worker", 10 * MIB, true),
            mem(10.0, w, "pt_data_worker", 100 * MIB, true),
            mem(17.0, w, "pt_data_worker", 250 * MIB, true),
            printk(17.05, "memory: usage 307200kB, limit 307200kB, failcnt 12"),
            oom(
                17.1,
                OomRecordKind::Kill,
                w,
                "pt_data_worker",
                255 * MIB,
                Some(OomControl {
                    constraint: 3,
                    chosen_points: 65000,
                    totalpages: 76800,
                    memcg_id: 55,
                }),
            ),
            oom(
                17.1005,
                OomRecordKind::Victim,
                w,
                "pt_data_worker",
                257 * MIB,
                None,
            ),
            printk(
                17.101,
                "Memory cgroup out of memory: Killed process 812 (pt_data_worker) total-vm:900000kB, anon-rss:263168kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:700kB oom_score_adj:0",
            ),
            at(
                17.2,
                Event::Cgroup(CgroupName {
                    id: 55,
                    path: "/trainbpf-77".into(),
                }),
            ),
            at(
                18.0,
                Event::Exit {
                    proc: w,
                    comm: "pt_data_worker".into(),
                    exit_code: 9,
                    group_exit_code: 9,
                },
            ),
            at(
                19.0,
                Event::JobExit(JobExit {
                    pid: 700,
                    status: ExitStatus::Code(1),
                }),
            ),
        ]
    }

    fn mem_in(secs: f64, k: ProcKey, comm: &str, anon_kb: u64, memcg_id: u64) -> Timed {
        let mut t = mem(secs, k, comm, anon_kb, false);
        if let Event::Mem { memcg_id: m, .. } = &mut t.event {
            *m = memcg_id;
        }
        t
    }

    #[test]
    fn a_memcg_oom_lists_no_grower_from_another_cgroup() {
        let mut evs = leak_run();
        let name = |secs, id, path: &str| {
            at(
                secs,
                Event::Cgroup(CgroupName {
                    id,
                    path: path.into(),
                }),
            )
        };
        evs.insert(1, name(0.5, 99, "/other"));
        evs.insert(1, name(0.5, 56, "/trainbpf-77/sub"));
        evs.insert(1, name(0.5, 1, "/"));
        // Each outgrows the worker; only the ones inside the cgroup that
        // ran out (or whose cgroup is unknown) count.
        for (pid, memcg) in [(901, 99), (902, 1), (903, 56), (904, 0)] {
            let k = key(pid, s(1.0));
            evs.push(mem_in(6.0, k, "other", MIB, memcg));
            evs.push(mem_in(16.0, k, "other", 900 * MIB, memcg));
        }
        evs.sort_by_key(|t| t.ts_ns);
        let r = run(evs);
        let k = &r.kills[0];
        assert_eq!(k.memcg.as_deref(), Some("/trainbpf-77"));
        let pids: Vec<u32> = k.growers.iter().map(|g| g.pid).collect();
        assert!(pids.contains(&903), "a child cgroup's process: {pids:?}");
        assert!(
            pids.contains(&904),
            "an unknown cgroup is not ruled out: {pids:?}"
        );
        assert!(!pids.contains(&901) && !pids.contains(&902), "{pids:?}");
        assert!(pids.contains(&812), "the victim: {pids:?}");
    }

    #[test]
    fn victim_and_kill_records_merge_into_one_kill() {
        let r = run(leak_run());
        assert_eq!(r.kills.len(), 1, "{:#?}", r.kills);
        let k = &r.kills[0];
        assert_eq!(k.ts_ns, s(17.1));
        assert_eq!(k.constraint, Constraint::Memcg);
        assert_eq!(k.kernel_points, Some(65000));
        assert_eq!(k.totalpages, Some(76800));
        // mark_victim's counters win over oom_kill_process's.
        assert_eq!(k.victim.rss.anon_kb, 257 * MIB);
        assert_eq!(
            k.sources,
            vec![
                KillSource {
                    record: OomRecordKind::Kill,
                    probe: "fentry".into()
                },
                KillSource {
                    record: OomRecordKind::Victim,
                    probe: "tp_btf".into()
                },
            ]
        );
        // Resolved from the cgroup record that came after the kill.
        assert_eq!(k.memcg.as_deref(), Some("/trainbpf-77"));
        assert_eq!(k.memcg_usage_kb, Some(307200));
        assert_eq!(k.memcg_limit_kb, Some(307200));
        assert_eq!(k.victim.total_vm_kb, 900000);
        assert_eq!(k.victim.pgtables_kb, 700);
        assert_eq!(k.kernel_log.len(), 2);
        assert_eq!(r.job.as_ref().unwrap().exit, Some(ExitStatus::Code(1)));
    }

    #[test]
    fn same_pid_killed_twice_far_apart_is_two_kills() {
        let w = key(812, s(1.0));
        let w2 = key(812, s(30.0));
        let r = run(vec![
            oom(10.0, OomRecordKind::Victim, w, "a", MIB, None),
            oom(40.0, OomRecordKind::Victim, w2, "a", MIB, None),
        ]);
        assert_eq!(r.kills.len(), 2);
    }

    #[test]
    fn grower_born_in_window_grows_from_zero() {
        let r = run(leak_run());
        let g = grower(&r.kills[0], 812).expect("the worker grew");
        assert!(g.born_in_window);
        assert!(g.is_victim);
        // From nothing at its fork (t=5 s) to mark_victim's 257 MiB at 17.1 s.
        assert_eq!(g.grew_kb, 257 * MIB);
        assert_eq!(g.rss_kb, 257 * MIB);
        assert_eq!(g.window_ns, s(17.1) - s(5.0));
        let rate = g.rate_kb_per_s.unwrap();
        assert!((rate - 257.0 * 1024.0 / 12.1).abs() < 1.0, "{rate}");
        assert_eq!(g.comm, "pt_data_worker");
    }

    #[test]
    fn already_big_process_first_seen_in_window_is_not_growth() {
        // Regression: a 2 GiB process the recorder first saw 10 s before the
        // kill was reported as having grown 2 GiB.
        let big = key(900, 1_000);
        let w = key(901, 1_000);
        let r = run(vec![
            mem(100.0, big, "postgres", 2048 * MIB, false),
            mem(105.0, big, "postgres", 2058 * MIB, false),
            mem(50.0, w, "worker", MIB, true),
            mem(109.0, w, "worker", 101 * MIB, true),
            oom(110.0, OomRecordKind::Victim, w, "worker", 101 * MIB, None),
        ]);
        let k = &r.kills[0];
        let g = grower(k, 900).expect("postgres grew 10 MiB");
        assert_eq!(g.grew_kb, 10 * MIB);
        assert_eq!(g.window_ns, s(5.0));
        assert!(!g.born_in_window);
        assert!(!g.in_job);
        // The worker's baseline is its sample before the window (t=50 s).
        let top = &k.growers[0];
        assert_eq!((top.pid, top.grew_kb), (901, 100 * MIB));
        assert_eq!(top.window_ns, s(60.0));
    }

    #[test]
    fn baseline_is_last_sample_before_window_not_first_ever() {
        let p = key(10, 1);
        let r = run(vec![
            mem(1.0, p, "p", 1000, true),
            mem(20.0, p, "p", 50 * MIB, true),
            mem(80.0, p, "p", 60 * MIB, true),
            mem(95.0, p, "p", 90 * MIB, true),
            oom(100.0, OomRecordKind::Victim, key(11, 1), "q", MIB, None),
        ]);
        let g = grower(&r.kills[0], 10).unwrap();
        // Window [40, 100]: baseline is the 20 s sample, end the 95 s one.
        assert_eq!(g.grew_kb, 40 * MIB);
        assert_eq!(g.window_ns, s(75.0));
        assert_eq!(g.rss_kb, 90 * MIB);
    }

    #[test]
    fn grower_outranks_victim_that_did_not_grow() {
        // The sibling with oom_score_adj 1000 is killed; the process that
        // grew is someone else, and must top the list.
        let a = key(801, s(1.0));
        let b = key(802, s(1.0));
        let mut evs = vec![
            job_start(0.0, ROOT),
            fork(1.0, a, ROOT, "python3"),
            fork(1.0, b, ROOT, "python3"),
            mem(2.0, a, "leaker", 10 * MIB, true),
            mem(2.0, b, "sacrifice", 50 * MIB, true),
            mem(70.0, a, "leaker", 100 * MIB, true),
            mem(75.0, a, "leaker", 240 * MIB, true),
        ];
        let mut kill = oom(76.0, OomRecordKind::Victim, b, "sacrifice", 50 * MIB, None);
        if let Event::Oom(r) = &mut kill.event {
            r.oom_score_adj = 1000;
        }
        evs.push(kill);
        let r = run(evs);
        let k = &r.kills[0];
        assert_eq!(k.victim.pid, 802);
        assert_eq!(k.victim.oom_score_adj, 1000);
        assert_eq!(k.growers.len(), 1, "{:#?}", k.growers);
        assert_eq!(k.growers[0].pid, 801);
        assert_eq!(k.growers[0].grew_kb, 230 * MIB);
        assert!(!k.growers[0].is_victim);
    }

    #[test]
    fn job_growers_stay_listed_on_a_busy_machine() {
        let w = key(801, s(1.0));
        let v = key(802, s(1.0));
        let mut evs = vec![
            job_start(0.0, ROOT),
            fork(1.0, w, ROOT, "python3"),
            fork(1.0, v, ROOT, "python3"),
            mem(2.0, w, "worker", 5 * MIB, true),
        ];
        // Twelve compilers outside the job, each outgrowing the worker.
        for i in 0..12 {
            evs.push(mem(3.0, key(900 + i, s(2.5)), "rustc", 500 * MIB, false));
        }
        evs.push(oom(5.0, OomRecordKind::Victim, v, "victim", MIB, None));
        let r = run(evs);
        let g = &r.kills[0].growers;
        assert!(
            g.iter().any(|g| g.pid == 801),
            "the job's grower is listed: {g:#?}"
        );
        assert!(g.iter().any(|g| g.is_victim), "the victim is listed");
        assert_eq!(
            g.iter().filter(|g| !g.in_job).count(),
            10,
            "and the machine's top ten"
        );
    }

    /// Regression (seen on Linux 5.10): the classic mark_victim record has
    /// only a pid and no start time; it must neither blank the victim that
    /// the fentry record described nor make a second process of it.
    #[test]
    fn pid_only_tracepoint_record_keeps_the_probe_figures() {
        let g = key(801, s(1.0));
        let mut kill = oom(5.0, OomRecordKind::Kill, g, "grow", 64 * MIB, None);
        if let Event::Oom(r) = &mut kill.event {
            r.oc = Some(crate::decode::OomControl {
                constraint: 3,
                chosen_points: 16_484,
                totalpages: 16_384,
                memcg_id: 7,
            });
        }
        let mut victim = oom(5.001, OomRecordKind::Victim, key(801, 0), "", 0, None);
        if let Event::Oom(r) = &mut victim.event {
            r.source = "tracepoint".into();
        }
        let r = run(vec![
            job_start(0.0, ROOT),
            fork(1.0, g, ROOT, "grow"),
            mem(2.0, g, "grow", 10 * MIB, true),
            kill,
            victim,
        ]);
        assert_eq!(r.kills.len(), 1);
        let v = &r.kills[0].victim;
        assert_eq!(v.comm, "grow");
        assert_eq!(v.rss.anon_kb, 64 * MIB);
        assert_eq!(r.processes.iter().filter(|p| p.pid == 801).count(), 1);
    }

    /// Regression: a worker renamed after fork (`pt_data_worker`) sent no
    /// memory record since, and was listed under its parent's name.
    #[test]
    fn grower_takes_the_name_it_had_at_exit() {
        let w = key(801, s(1.0));
        let v = key(802, s(1.0));
        let r = run(vec![
            job_start(0.0, ROOT),
            fork(1.0, w, ROOT, "pt_main_thread"),
            fork(1.0, v, ROOT, "pt_main_thread"),
            mem(1.5, w, "pt_main_thread", 60 * MIB, true),
            oom(5.0, OomRecordKind::Victim, v, "pt_data_worker", MIB, None),
            at(
                5.2,
                Event::Exit {
                    proc: w,
                    comm: "pt_data_worker".into(),
                    exit_code: 15,
                    group_exit_code: 15,
                },
            ),
        ]);
        let g = r.kills[0]
            .growers
            .iter()
            .find(|g| g.pid == 801)
            .expect("worker grew");
        assert_eq!(g.comm, "pt_data_worker");
    }

    #[test]
    fn grandchild_tree_path() {
        let mid = key(710, s(1.0));
        let leaf = key(720, s(2.0));
        let r = run(vec![
            job_start(0.0, ROOT),
            exec(0.1, ROOT, "python3"),
            fork(1.0, mid, ROOT, "python3"),
            exec(1.1, mid, "torchrun"),
            fork(2.0, leaf, mid, "torchrun"),
            exec(2.1, leaf, "pt_data_worker"),
            oom(
                3.0,
                OomRecordKind::Victim,
                leaf,
                "pt_data_worker",
                MIB,
                None,
            ),
        ]);
        let tree: Vec<_> = r.kills[0]
            .victim
            .tree
            .iter()
            .map(|n| (n.pid, n.comm.as_str()))
            .collect();
        assert_eq!(
            tree,
            vec![(700, "python3"), (710, "torchrun"), (720, "pt_data_worker")]
        );
        // A victim outside the job has no place in its tree.
        let mut out = oom(
            4.0,
            OomRecordKind::Victim,
            key(5000, 1),
            "chrome",
            MIB,
            None,
        );
        if let Event::Oom(r) = &mut out.event {
            r.in_job = false;
        }
        let r = run(vec![job_start(0.0, ROOT), out]);
        assert!(r.kills[0].victim.tree.is_empty());
    }

    #[test]
    fn several_kills_get_their_own_windows() {
        let a = key(801, 1);
        let b = key(802, 1);
        let r = run(vec![
            mem(101.0, a, "a", MIB, true),
            mem(101.0, b, "b", MIB, true),
            mem(150.0, a, "a", 200 * MIB, true),
            oom(155.0, OomRecordKind::Victim, a, "a", 200 * MIB, None),
            at(
                156.0,
                Event::Exit {
                    proc: a,
                    comm: "a".into(),
                    exit_code: 9,
                    group_exit_code: 9,
                },
            ),
            // b only starts growing after the first kill.
            mem(170.0, b, "b", 20 * MIB, true),
            mem(199.0, b, "b", 300 * MIB, true),
            oom(200.0, OomRecordKind::Victim, b, "b", 300 * MIB, None),
        ]);
        assert_eq!(r.kills.len(), 2);
        let (k1, k2) = (&r.kills[0], &r.kills[1]);
        assert_eq!(k1.growers.len(), 1, "{:#?}", k1.growers);
        assert_eq!((k1.growers[0].pid, k1.growers[0].grew_kb), (801, 199 * MIB));
        // a grew inside the second window too, but died at the first kill:
        // the dead hold nothing when the second one comes.
        assert_eq!(k2.growers.len(), 1, "{:#?}", k2.growers);
        // b's baseline for the second window [140, 200] is its 101 s sample.
        assert_eq!((k2.growers[0].pid, k2.growers[0].grew_kb), (802, 299 * MIB));
        assert_eq!(k2.growers[0].window_ns, s(99.0));
    }

    #[test]
    fn recycled_pid_is_a_different_process() {
        let old = key(900, s(1.0));
        let new = key(900, s(80.0));
        let r = run(vec![
            mem(1.0, old, "old", 500 * MIB, false),
            // The old process is gone; a new one gets its pid, small.
            mem(80.0, new, "new", 5 * MIB, false),
            mem(90.0, new, "new", 25 * MIB, false),
            oom(100.0, OomRecordKind::Victim, key(1, 1), "x", MIB, None),
        ]);
        let k = &r.kills[0];
        let g = grower(k, 900).unwrap();
        // Born in the window: from zero, not from the old process's 500 MiB
        // (which would make it "shrink"), and not counted as the old one.
        assert_eq!(g.start_ns, s(80.0));
        assert_eq!(g.grew_kb, 25 * MIB);
        assert!(g.born_in_window);
        assert_eq!(k.growers.iter().filter(|g| g.pid == 900).count(), 1);
    }

    #[test]
    fn memory_stays_bounded_over_a_long_recording() {
        let p = key(10, 1);
        let mut b = Builder::new(&ModelOptions::default(), &RecordingHeader::default());
        for i in 0..100_000u64 {
            b.observe(mem(i as f64, p, "p", i, true));
            // Short-lived job processes come and go.
            let q = key(20_000 + (i % 1000) as u32, s(i as f64) + 1);
            b.observe(mem(i as f64, q, "q", 1, true));
            b.observe(at(
                i as f64 + 0.5,
                Event::Exit {
                    proc: q,
                    comm: "q".into(),
                    exit_code: 0,
                    group_exit_code: 0,
                },
            ));
        }
        let samples = b.tracks[&p].samples.len();
        assert!(samples <= 64, "{samples} samples kept for a 60 s window");
        assert!(b.tracks.len() < 200, "{} tracks kept", b.tracks.len());
    }

    #[test]
    fn printk_constraint_parsing() {
        let line = "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/trainbpf-77,task_memcg=/trainbpf-77/a,b,task=python3,pid=1234,uid=0";
        assert_eq!(
            parse_kernel_line(line),
            KernelLine::OomKill {
                constraint: Some(Constraint::Memcg),
                oom_memcg: Some("/trainbpf-77".into()),
                task_memcg: Some("/trainbpf-77/a,b".into()),
                pid: Some(1234),
            }
        );
        assert_eq!(
            parse_kernel_line(
                "[  12.5] Out of memory: Killed process 99 (java) total-vm:10kB, anon-rss:5kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:4kB oom_score_adj:0"
            ),
            KernelLine::Killed {
                constraint: Constraint::None,
                pid: 99,
                total_vm_kb: Some(10),
                pgtables_kb: Some(4),
            }
        );
        assert_eq!(
            parse_kernel_line("memory: usage 307200kB, limit 9007199254740988kB, failcnt 0"),
            KernelLine::Usage {
                usage_kb: 307200,
                limit_kb: None,
                failcnt: Some(0),
            }
        );
        assert_eq!(
            parse_kernel_line("memory+swap: usage 1kB, limit 2kB, failcnt 0"),
            KernelLine::Other
        );
    }

    #[test]
    fn constraint_falls_back_to_printk_then_prefix() {
        let v = key(1234, 1);
        // No oom_kill_process record: the constraint comes from the log.
        let r = run(vec![
            printk(
                9.9,
                "oom-kill:constraint=CONSTRAINT_CPUSET,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=python3,pid=1234,uid=0",
            ),
            oom(10.0, OomRecordKind::Victim, v, "python3", MIB, None),
        ]);
        assert_eq!(r.kills[0].constraint, Constraint::Cpuset);
        assert_eq!(r.kills[0].task_memcg.as_deref(), Some("/user.slice"));

        let r = run(vec![
            oom(10.0, OomRecordKind::Victim, v, "python3", MIB, None),
            printk(
                10.01,
                "Out of memory: Killed process 1234 (python3) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
            ),
            // Another process's line must not decide this kill.
            printk(
                10.02,
                "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/x,task_memcg=/x,task=y,pid=4321,uid=0",
            ),
        ]);
        assert_eq!(r.kills[0].constraint, Constraint::None);
        assert_eq!(r.kills[0].memcg, None);

        let r = run(vec![oom(10.0, OomRecordKind::Victim, v, "p", MIB, None)]);
        assert_eq!(r.kills[0].constraint, Constraint::Unknown);
    }

    #[test]
    fn root_recorded_without_start_time_is_matched_by_pid() {
        // The collector writes the job's start with start_ns 0; the root's
        // kernel records carry the real one, sometimes before the job-start
        // record in the file.
        let real = key(700, s(0.5));
        let child = key(710, s(2.0));
        let placeholder = key(700, 0);
        let r = run(vec![
            mem(0.6, real, "python3", 30 * MIB, true),
            job_start(0.4, placeholder),
            exec(0.7, real, "python3"),
            mem(1.0, real, "python3", 80 * MIB, true),
            fork(2.0, child, real, "python3"),
            oom(3.0, OomRecordKind::Victim, child, "worker", MIB, None),
        ]);
        assert_eq!(r.job.as_ref().unwrap().start_ns, s(0.5));
        let roots: Vec<_> = r.processes.iter().filter(|p| p.pid == 700).collect();
        assert_eq!(roots.len(), 1, "{roots:#?}");
        assert_eq!(roots[0].peak_rss_kb, 80 * MIB);
        assert_eq!(roots[0].comm, "python3");
        let tree: Vec<_> = r.kills[0].victim.tree.iter().map(|n| n.pid).collect();
        assert_eq!(tree, vec![700, 710]);

        // Root records only after the job start: the same outcome.
        let r = run(vec![
            job_start(0.4, placeholder),
            exec(0.7, real, "python3"),
            mem(1.0, real, "python3", 80 * MIB, true),
        ]);
        assert_eq!(r.processes.len(), 1, "{:#?}", r.processes);
        assert_eq!(r.processes[0].start_ns, s(0.5));
        assert_eq!(r.processes[0].peak_rss_kb, 80 * MIB);
    }

    #[test]
    fn processes_summary_and_wait_status() {
        assert_eq!(wait_status(9), ExitStatus::Signal(9));
        assert_eq!(wait_status(1 << 8), ExitStatus::Code(1));
        assert_eq!(wait_status(0), ExitStatus::Code(0));
        let r = run(leak_run());
        let w = r.processes.iter().find(|p| p.pid == 812).unwrap();
        assert_eq!(w.parent, Some(ROOT));
        assert_eq!(w.exit, Some(ExitStatus::Signal(9)));
        assert_eq!(w.born_ns, Some(s(5.0)));
        assert_eq!(w.died_ns, Some(s(18.0)));
        assert_eq!(w.peak_rss_kb, 257 * MIB);
        assert!(w.oom_killed);
        let root = r.processes.iter().find(|p| p.pid == 700).unwrap();
        assert_eq!(root.exec.as_deref(), Some("/usr/bin/python3"));
        assert!(!root.oom_killed);
        assert_eq!(r.processes[0].pid, 700, "sorted by birth");
        assert_eq!(r.duration_ns(), s(19.0));
    }

    #[test]
    fn added_is_capped_at_what_the_process_maps_and_page_cache_is_apart() {
        let mut header = RecordingHeader::default();
        header.attach.pages = Some("tp_btf:mm_page_alloc,mm_page_free".into());
        header.attach.page_cache = Some("tp_btf:mm_filemap_add_to_page_cache".into());
        let k = key(700, s(0.5));
        let sample = |secs, anon_kb, alloc_kb, cache_kb| {
            let mut t = mem(secs, k, "sh", anon_kb, true);
            if let Event::Mem {
                alloc_kb: a,
                cache_kb: c,
                ..
            } = &mut t.event
            {
                *a = alloc_kb;
                *c = cache_kb;
            }
            t
        };
        // A shell that forked thousands of commands: its copies of pages it
        // wrote while a child still shared them, freed by the children.
        let evs = vec![
            sample(1.0, 3 * MIB, 40 * MIB, 0),
            sample(2.0, 3 * MIB, 60 * MIB, 1024 * MIB as i64),
        ];
        let r = build(&header, evs.into_iter(), &ModelOptions::default());
        let p = r.processes.iter().find(|p| p.pid == 700).unwrap();
        assert_eq!(p.honest_kb, Some(3 * MIB as i64));
        assert_eq!(p.honest_peak_kb, Some(3 * MIB as i64));
        assert_eq!(p.page_cache_kb, Some(1024 * MIB as i64));
        // Without the page-cache probes (an older recording): as it was.
        header.attach.page_cache = None;
        let evs = vec![sample(1.0, 3 * MIB, 40 * MIB, 0)];
        let r = build(&header, evs.into_iter(), &ModelOptions::default());
        let p = r.processes.iter().find(|p| p.pid == 700).unwrap();
        assert_eq!(p.honest_kb, Some(40 * MIB as i64));
        assert_eq!(p.page_cache_kb, None);
    }
}
