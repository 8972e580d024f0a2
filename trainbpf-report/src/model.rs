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
//!
//! This file is the driver: the options, the report, the streaming loop.
//! The builder's work lives with what it builds: `kills` (a kill's records
//! merged, closed once settled), `kernel_log` (the kernel's OOM lines
//! parsed), `growers` (who grew before a kill, and the OOM killer's
//! ranking, rebuilt in `badness`), `processes` (the job's processes and
//! the machine's biggest users), `timeline` (each process's memory over
//! the window), `attribution`, `before` (pressure before a kill),
//! `deaths`, `series` (charts), `leaks`, `gpu`. The model reads only the
//! decoded events (`crate::decode`) and the recording's header.

mod apart;
mod attribution;
mod badness;
/// The GPU ledger: CUDA calls, NVML, Xid.
pub mod gpu;
#[cfg(test)]
pub(crate) use attribution::CacheApart;
pub(crate) use attribution::{Group, SumCheck};
mod before;
pub use before::PressureBefore;
/// Who made a cgroup (Docker, Kubernetes, systemd, Slurm), from its path.
pub mod cgroup_path;
/// The victim's stack at death (`record --stacks`).
pub(crate) mod death_stacks;
mod deaths;
/// What most likely happened, its evidence and its fix, per kill.
pub(crate) mod diagnosis;
/// What the kernel programs logged (`record --ebpf-log`).
mod ebpf_log;
mod grid;
mod growers;
/// Ranks, runs, Slurm steps and containers per process.
pub mod identity;
mod kernel_log;
mod kills;
pub(crate) mod lead;
/// Several recordings of one job (one per node) on one timeline.
pub mod merge;
pub use merge::{Merged, Source};
/// Robust trends of honest memory, suspected leaks, time to the limit.
pub mod leaks;
mod processes;
/// The report: what the renderers read, and its lookups.
mod report;
pub(crate) use report::LeftOut;
pub use report::Report;
/// /dev/shm filesystems over the run.
pub(crate) mod shm;
/// Short-lived helpers folded into one line in the text and HTML.
pub(crate) mod short_lived;
pub(crate) use short_lived::ShortLived;
/// Growth stacks per process (`record --stacks`).
pub(crate) mod stacks;
mod timeline;
pub mod verdict;
pub(crate) use badness::{Candidate as RankedCandidate, Ranking, TotalSource};
pub use deaths::{Cause, consequence};
pub(crate) use deaths::{Death, Sender};
pub(crate) use ebpf_log::{EbpfLogReport, MAX_MESSAGES as EBPF_LOG_KEPT};
pub use leaks::LeakOptions;
pub(crate) use leaks::LeakReport;
pub(crate) mod series;
/// Decoded values the report carries as they are: part of the model's
/// vocabulary, so that the renderers read them from the model alone.
pub(crate) use crate::decode::{ExitStatus, LeakWarning, OomRecordKind};
pub use growers::Grower;
pub use kernel_log::{kill_constraint, memcg_limit};
pub use kills::{Constraint, Kill, KillSource, TreeNode, Trigger, Victim};
pub use processes::wait_status;
pub(crate) use processes::{Job, MemoryUser, Process};
pub(crate) use series::{Churn, KillWindow, Line, Pick, ProcLine, Series, WindowLine};
pub(crate) use stacks::{GrowthStack, Stacks};

use crate::decode::MemSample;
use std::collections::{HashMap, VecDeque};

use crate::decode::{CgroupName, Event, JobExit, Lost, ProcKey, Timed, stacks::StackSample};
use crate::recording::{RecordingHeader, Skipped};

use kernel_log::{KernelLine, LogLine, parse_kernel_line};
use kills::OpenKill;
use processes::{JobProc, truncate_chars};
use timeline::Track;

const SEC: u64 = 1_000_000_000;
/// Kernel log lines this close to a kill are read as describing it.
const PRINTK_NS: u64 = 2 * SEC;
/// How long (event time) a kill stays open for its partner record and its
/// log lines, which can come after it.
const SETTLE_NS: u64 = PRINTK_NS;
/// Event time between sweeps for dead processes.
const SWEEP_NS: u64 = 10 * SEC;
/// The printk probe forwards OOM lines only, but an OOM storm prints many;
/// the buffer must stay bounded even then.
const MAX_PRINTK_LINES: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModelOptions {
    /// How far before each kill to look for growth.
    pub(crate) window_ns: u64,
    /// What makes a climb a suspected leak.
    pub(crate) leaks: LeakOptions,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            window_ns: 60 * SEC,
            leaks: LeakOptions::default(),
        }
    }
}

pub(crate) fn ns_to_s(ns: u64) -> f64 {
    ns as f64 / SEC as f64
}

/// Builds the report from a stream of events; see the module docs for what
/// is kept while streaming.
pub(crate) fn build(
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
// Streaming state. The builder's methods live with what they build: kills in
// `kills`, processes in `processes`, growth in `growers`, memory over time in
// `timeline`.

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
    identities: identity::Identities,
    job_procs: HashMap<ProcKey, JobProc>,
    /// Peak memory of processes whose tracks were dropped, best few only.
    retired: Vec<MemoryUser>,
    cgroups: HashMap<u64, String>,
    log: VecDeque<LogLine>,
    open: Vec<OpenKill>,
    done: Vec<OpenKill>,
    job: Option<Job>,
    lost: Lost,
    job_reads: crate::decode::JobReads,
    compaction: Option<crate::decode::Compaction>,
    leak_warnings: Vec<(u64, crate::decode::LeakWarning)>,
    ebpf_log: EbpfLogReport,
    /// The kills' lines as the recorder told them (bounded).
    told: Vec<(u64, crate::decode::KillVerdict)>,
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
    /// Latest `oom_score_adj` per process, and who wrote it (tgid), for
    /// the report's processes.
    adj: HashMap<ProcKey, (i32, u32)>,
    gpu: gpu::Ledger,
    leaks: leaks::Builder,
    stacks: Stacks,
    /// CUDA allocation stacks: put on the GPU report's processes at the end.
    gpu_stacks: Stacks,
    death_stacks: death_stacks::Deaths,
    apart: apart::Apart,
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
            identities: identity::Identities::default(),
            job_procs: HashMap::new(),
            retired: Vec::new(),
            cgroups: HashMap::new(),
            log: VecDeque::new(),
            open: Vec::new(),
            done: Vec::new(),
            job: None,
            lost: Lost::default(),
            job_reads: Default::default(),
            compaction: None,
            leak_warnings: Vec::new(),
            told: Vec::new(),
            ebpf_log: EbpfLogReport {
                enabled: header.attach.ebpf_log.is_some(),
                ..Default::default()
            },
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
            stacks: Stacks::default(),
            gpu_stacks: Stacks::default(),
            death_stacks: death_stacks::Deaths::new(
                header
                    .attach
                    .stacks
                    .as_ref()
                    .map(|s| s.contains("signal_deliver")),
            ),
            apart: apart::Apart::new(header.recorder_pid),
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
        let Some(t) = self.apart.filter(t) else {
            return;
        };
        self.series.observe(&t);
        self.gpu.observe(&t);
        self.leaks.observe(&t, &self.attribution);
        self.adopt_from(&t.event);
        match t.event {
            Event::Fork {
                child,
                parent,
                comm,
                ..
            } => {
                self.identities.on_fork(ts, child, parent);
                self.attribution.on_fork(child.tgid, parent.tgid);
                self.on_fork(ts, child, parent, comm)
            }
            Event::Exec {
                proc,
                comm,
                filename,
                truncated,
                ..
            } => {
                self.attribution.on_exec(proc.tgid);
                self.on_exec(ts, proc, comm, filename, truncated)
            }
            Event::Exit {
                proc,
                comm,
                exit_code,
                ..
            } => self.on_exit(ts, proc, comm, exit_code),
            mem @ Event::Mem(MemSample { .. }) => self.on_mem_event(ts, mem),
            Event::Oom(rec) => self.on_oom(ts, *rec),
            Event::Signal(rec) => self.signals.observe(ts, *rec),
            Event::Exe(x) => self.signals.observe_exe(x),
            Event::SignalReceived(x) => self.signals.observe_received(ts, x),
            Event::OomAdj {
                proc,
                in_job,
                oom_score_adj,
                writer_tgid,
                ..
            } => {
                // Only the job's are reported; a bound on what is kept.
                if in_job || self.job_procs.contains_key(&proc) {
                    self.adj.insert(proc, (oom_score_adj, writer_tgid));
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
            Event::JobReads(r) => self.job_reads = r,
            Event::Verdict(v) if self.told.len() < verdict::MAX_TOLD => self.told.push((ts, v)),
            Event::Verdict(_) => {}
            Event::Compacted(c) => self.compaction = Some(c),
            Event::LeakWarning(w) => self.leak_warnings.push((ts, w)),
            Event::EbpfLog(m) => self.ebpf_log.push(ts, m),
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
            Event::ProcInfo(i) => self.on_proc_info(i),
            Event::Identity(rec) => self.on_identity(ts, rec),
            Event::Shm(look) => self.attribution.on_shm(ts, look),
            Event::Stacks(s) => {
                let (gpu, growth) = s.stacks.into_iter().partition(|d| d.gpu);
                self.stacks.observe(ts, StackSample { stacks: growth });
                self.gpu_stacks.observe(ts, StackSample { stacks: gpu });
            }
            Event::StackAtDeath(s) => self.death_stacks.observe(s),
        }
        self.settle(false);
        if self.now >= self.next_sweep {
            self.sweep();
            self.next_sweep = self.now + SWEEP_NS;
        }
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

    fn finish(mut self, header: &RecordingHeader) -> Report {
        self.settle(true);
        let mut kills = Vec::with_capacity(self.done.len());
        for OpenKill { mut kill, hints } in std::mem::take(&mut self.done) {
            self.resolve_memcg(&mut kill, hints);
            kills.push(kill);
        }
        kills.sort_by_key(|k| k.ts_ns);
        // Another job's own limit: counted, never shown as this job's.
        let job_cgroup = self.job.as_ref().and_then(|j| j.cgroup.clone());
        let before = kills.len();
        kills.retain(|k| !kills::elsewhere(job_cgroup.as_deref(), k));
        let kills_elsewhere = (before - kills.len()) as u32;

        let mut processes = self.processes();
        processes.sort_by_key(|p| (p.born_ns.unwrap_or(0), p.pid, p.start_ns));
        let mut deaths: Vec<Death> = processes
            .iter()
            .filter_map(|p| deaths::classify(p, &kills, &self.signals))
            .collect();
        deaths.sort_by_key(|d| (d.ts_ns, d.pid));
        self.identities.settle_inherited();
        let groups = self.run_groups(&processes);

        let top = self.top_memory_users();

        let short_lived = short_lived::fold(&processes, &kills);
        let series = std::mem::take(&mut self.series).finish(&processes, &short_lived);
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
            kills_elsewhere,
            processes,
            deaths,
            groups,
            shared_memory: self.attribution.shm_objects(),
            shm: self.attribution.shm_report(),
            attribution_at_peak: self.attribution.peak.clone(),
            smaps_rounds: self.attribution.smaps_rounds,
            smaps_cost_us: self.attribution.smaps_cost_us,
            top_memory: top,
            lost: self.lost,
            job_reads: self.job_reads,
            series,
            undecodable: 0,
            stopped_early: None,
            skipped: Skipped::default(),
            gpu: gpu::GpuReport::default(),
            leaks,
            compaction: self.compaction,
            leak_warnings: self.leak_warnings,
            stacks: std::mem::take(&mut self.stacks),
            death_stacks: std::mem::take(&mut self.death_stacks),
            ebpf_log: self.ebpf_log,
            diagnoses: Vec::new(),
            short_lived,
            left_out: LeftOut {
                recorder_pid: header.recorder_pid,
                recorder_helpers: self.apart.recorder_procs,
                kernel_threads: self.apart.kernel_threads,
            },
            source: Source {
                index: 0,
                of: 1,
                path: String::new(),
            },
            identities: std::mem::take(&mut self.identities).finish(),
        };
        let kill_windows: Vec<(u64, u64)> = report
            .kills
            .iter()
            .map(|k| (k.ts_ns, k.window_ns))
            .collect();
        report.gpu = std::mem::take(&mut self.gpu).finish(&kill_windows);
        for p in &mut report.gpu.processes {
            let key = crate::decode::ProcKey {
                tgid: p.pid,
                start_ns: p.start_ns,
            };
            p.stacks = self.gpu_stacks.of(key, None);
        }
        for i in 0..report.kills.len() {
            report.kills[i].realtime_ns = report.realtime_ns(report.kills[i].ts_ns);
        }
        report.name_lines();
        for i in 0..report.kills.len() {
            // The line the recorder told at the kill, where it did: the
            // same text in every place it landed.
            let k = &report.kills[i];
            let line = verdict::told(&self.told, k)
                .unwrap_or_else(|| verdict::line(&verdict::facts(&report, k)));
            report.kills[i].verdict = line;
        }
        report.cgroup_at_kills();
        report.mark_consequences();
        report.diagnoses = diagnosis::diagnose(&report);
        report
    }
}

#[cfg(test)]
mod tests;
