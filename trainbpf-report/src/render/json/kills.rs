//! The report's `kills[]` (docs/report-json.md, "kills[]"): each OOM kill
//! with its victim, what grew before it, the OOM killer's ranking
//! reconstructed, and the memory pressure in the run-up.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::{self, OomRecordKind, Report};

use super::{Time, secs, secs_since};

/// One OOM kill.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Kill {
    /// The OOM killer's ranking at the kill, highest badness first, always
    /// including the victim. A reconstruction from the tracked memory, as
    /// the kernel's `oom_badness()` computes it.
    #[schemars(length(max = 10))]
    pub(crate) candidates: Vec<Candidate>,
    /// What ran out: a memory cgroup at its limit (`memcg`), the whole
    /// machine (`none`: a global OOM), a cpuset or a memory policy.
    pub(crate) constraint: Constraint,
    /// The job's processes that play one role, together; groups of one are
    /// left out.
    pub(crate) groups: Vec<KillGroup>,
    /// Processes whose memory grew in the window before the kill, most
    /// growth first.
    pub(crate) growers: Vec<Grower>,
    /// The host the victim ran on: the recording header's hostname.
    pub(crate) host: String,
    /// The kernel log lines read as part of this kill.
    pub(crate) kernel_log: Vec<String>,
    /// `oc->chosen_points`, the victim's badness in the kernel's units;
    /// null without an `oom_kill_process` probe.
    pub(crate) kernel_points: Option<i64>,
    /// For a memcg OOM, the cgroup whose limit was hit; otherwise the
    /// victim's cgroup.
    pub(crate) memcg: Option<String>,
    /// The memcg's limit (kB); null for no limit.
    pub(crate) memcg_limit_kb: Option<u64>,
    /// The memcg's usage when it ran out (kB), from the kernel log.
    pub(crate) memcg_usage_kb: Option<u64>,
    /// The run-up to the kill, from the recorder's once-a-second samples.
    pub(crate) pressure: Option<Pressure>,
    /// How the reconstructed ranking was made; null without one.
    pub(crate) ranking: Option<Ranking>,
    /// Its recording's index in `recordings` (0 for one recording).
    pub(crate) recording: usize,
    /// Which probes reported the kill, joined with `+`,
    /// `oom_kill_process`'s first: e.g. `"fentry+tp_btf"`.
    #[schemars(pattern(
        r"^(fentry|kprobe|tp_btf|tracepoint|unknown)(\+(fentry|kprobe|tp_btf|tracepoint|unknown))*$"
    ))]
    pub(crate) source: String,
    /// The kernel records the kill was read from.
    #[schemars(length(min = 1))]
    pub(crate) sources: Vec<KillSource>,
    /// The job's honest growth over the window against its memory cgroup's
    /// usage change.
    pub(crate) sum_check: Option<SumCheck>,
    /// The victim's own memory cgroup.
    pub(crate) task_memcg: Option<String>,
    /// When the kernel killed; null without a clock pair.
    pub(crate) time: Option<Time>,
    /// The same, seconds since the recording start.
    pub(crate) time_s: f64,
    /// `oc->totalpages`: the pages the badness is measured against.
    pub(crate) totalpages: Option<u64>,
    /// The process whose allocation failed and set off the kill.
    pub(crate) trigger: Trigger,
    /// The kill in one line of at most 200 characters that stands alone:
    /// the victim, what killed it and the limit, the top grower with what
    /// it added and where (`rank 1 (pid 812) was OOM-killed: its memory
    /// cgroup reached its 2 GiB limit; it added 1.27 GiB in 40.0 s, in
    /// load_batch (train.py:42)`).
    #[schemars(length(max = 200))]
    pub(crate) verdict: String,
    /// The process killed.
    pub(crate) victim: Victim,
    /// The look-back window for `growers`, seconds.
    pub(crate) window_s: f64,
}

impl Kill {
    pub(crate) fn new(r: &Report, k: &model::Kill) -> Kill {
        Kill {
            candidates: k.ranking.as_ref().map_or(Vec::new(), |rk| {
                rk.candidates.iter().map(Candidate::new).collect()
            }),
            constraint: k.constraint.into(),
            groups: k.groups.iter().map(KillGroup::new).collect(),
            growers: k.growers.iter().map(|g| Grower::new(r, k, g)).collect(),
            host: r.header.hostname.clone(),
            kernel_log: k.kernel_log.clone(),
            kernel_points: k.kernel_points,
            memcg: k.memcg.clone(),
            memcg_limit_kb: k.memcg_limit_kb,
            memcg_usage_kb: k.memcg_usage_kb,
            pressure: k.pressure.as_ref().map(Pressure::new),
            ranking: k.ranking.as_ref().map(Ranking::new),
            recording: r.source.index,
            source: k
                .sources
                .iter()
                .map(|s| s.probe.as_str())
                .collect::<Vec<_>>()
                .join("+"),
            sources: k
                .sources
                .iter()
                .map(|s| KillSource {
                    probe: s.probe.clone(),
                    record: s.record.into(),
                })
                .collect(),
            sum_check: k.sum_check.as_ref().map(SumCheck::new),
            task_memcg: k.task_memcg.clone(),
            time: k.realtime_ns.map(Time::real),
            time_s: secs_since(r, k.ts_ns),
            totalpages: k.totalpages,
            // A process id like every other `pid` here; the thread is `tid`.
            trigger: Trigger {
                comm: k.trigger.comm.clone(),
                pid: k.trigger.tgid,
                tid: k.trigger.pid,
            },
            verdict: k.verdict.clone(),
            victim: Victim::new(
                &k.victim,
                r.victim_stack_at_death(k),
                super::identity::Identity::of(r, k.victim.pid, k.victim.start_ns),
            ),
            window_s: secs(k.window_ns),
        }
    }
}

/// What ran out (the kernel's `enum oom_constraint`).
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Constraint {
    /// The whole machine: a global OOM.
    None,
    Cpuset,
    MemoryPolicy,
    /// A memory cgroup hit its limit.
    Memcg,
    Unknown,
}

impl From<model::Constraint> for Constraint {
    fn from(c: model::Constraint) -> Constraint {
        match c {
            model::Constraint::None => Constraint::None,
            model::Constraint::Cpuset => Constraint::Cpuset,
            model::Constraint::MemoryPolicy => Constraint::MemoryPolicy,
            model::Constraint::Memcg => Constraint::Memcg,
            model::Constraint::Unknown => Constraint::Unknown,
        }
    }
}

/// The process killed.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Victim {
    /// Anonymous resident memory when killed (kB).
    pub(crate) anon_rss_kb: u64,
    /// Its command name (`task->comm`, at most 15 bytes).
    pub(crate) comm: String,
    /// Its container, from its cgroup paths; null outside one.
    pub(crate) container: Option<super::identity::Container>,
    /// File-backed resident memory when killed (kB).
    pub(crate) file_rss_kb: u64,
    /// Whether it belongs to the recorded job's process tree.
    pub(crate) in_job: bool,
    /// `LOCAL_RANK` (or MPI's, Slurm's) read at its exec.
    pub(crate) local_rank: Option<u32>,
    /// 1000 makes it the first choice, -1000 exempts it.
    #[schemars(range(min = -1000, max = 1000))]
    pub(crate) oom_score_adj: i32,
    /// Page-table memory (kB).
    pub(crate) pgtables_kb: u64,
    /// Process id (tgid).
    pub(crate) pid: u32,
    /// `RANK` (or MPI's, Slurm's `SLURM_PROCID`) read at its exec; a
    /// process forked from a rank carries its rank too.
    pub(crate) rank: Option<u32>,
    /// torchrun's `TORCHELASTIC_RUN_ID`.
    pub(crate) run_id: Option<String>,
    /// Shared-memory resident memory when killed (kB).
    pub(crate) shmem_rss_kb: u64,
    /// `SLURM_JOB_ID`, else the job in its Slurm cgroup path.
    pub(crate) slurm_job_id: Option<u64>,
    /// `SLURM_STEP_ID`, else the step in its Slurm cgroup path.
    pub(crate) slurm_step_id: Option<String>,
    /// Its stacks as its threads dequeued the fatal signal (`record
    /// --stacks`): the thread that was allocating, or else the one the
    /// kernel named, with the others in `threads`. Null without stacks,
    /// or with `stack_error` saying why.
    pub(crate) stack_at_death: Option<super::stacks::StackAtDeath>,
    /// Why `stack_at_death` is null while stacks were recorded (null
    /// otherwise).
    pub(crate) stack_error: Option<String>,
    /// Swapped-out memory (kB).
    pub(crate) swap_kb: u64,
    /// Virtual size (kB).
    pub(crate) total_vm_kb: u64,
    /// Its ancestry in the job, from the job's main process down to the
    /// victim itself; empty if not in the job.
    pub(crate) tree: Vec<Task>,
    /// Its user id.
    pub(crate) uid: u32,
    /// `WORLD_SIZE` (or MPI's, Slurm's `SLURM_NTASKS`).
    pub(crate) world_size: Option<u32>,
}

impl Victim {
    fn new(
        v: &model::Victim,
        death: Result<Option<model::death_stacks::StackAtDeath>, String>,
        id: super::identity::Identity,
    ) -> Victim {
        let (stack_at_death, stack_error) = match death {
            Ok(s) => (s.as_ref().map(super::stacks::at_death), None),
            Err(e) => (None, Some(e)),
        };
        Victim {
            stack_at_death,
            stack_error,
            anon_rss_kb: v.rss.anon_kb,
            comm: v.comm.clone(),
            file_rss_kb: v.rss.file_kb,
            container: id.container,
            local_rank: id.local_rank,
            rank: id.rank,
            run_id: id.run_id,
            slurm_job_id: id.slurm_job_id,
            slurm_step_id: id.slurm_step_id,
            world_size: id.world_size,
            in_job: v.in_job,
            oom_score_adj: v.oom_score_adj,
            pgtables_kb: v.pgtables_kb,
            pid: v.pid,
            shmem_rss_kb: v.rss.shmem_kb,
            swap_kb: v.rss.swap_kb,
            total_vm_kb: v.total_vm_kb,
            tree: v
                .tree
                .iter()
                .map(|n| Task {
                    comm: n.comm.clone(),
                    pid: n.pid,
                })
                .collect(),
            uid: v.uid,
        }
    }
}

/// A process.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Task {
    pub comm: String,
    pub pid: u32,
}

/// The task whose allocation set off the kill (`current`).
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Trigger {
    /// The allocating thread's name.
    pub(crate) comm: String,
    /// Its process id (tgid).
    pub(crate) pid: u32,
    /// The allocating thread's id.
    pub(crate) tid: u32,
}

/// A kernel record the kill was read from.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct KillSource {
    /// The probe that read it: `fentry`, `kprobe`, `tp_btf`, `tracepoint`.
    pub(crate) probe: String,
    pub(crate) record: KillRecord,
}

/// The kernel function a kill record comes from.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KillRecord {
    /// The kill's context (`oom_control`).
    OomKillProcess,
    /// One per killed process.
    MarkVictim,
}

impl From<OomRecordKind> for KillRecord {
    fn from(k: OomRecordKind) -> KillRecord {
        match k {
            OomRecordKind::Kill => KillRecord::OomKillProcess,
            OomRecordKind::Victim => KillRecord::MarkVictim,
        }
    }
}

/// A candidate in the reconstructed ranking.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Candidate {
    pub(crate) comm: String,
    pub(crate) in_job: bool,
    pub(crate) is_victim: bool,
    #[schemars(range(min = -1000, max = 1000))]
    pub(crate) oom_score_adj: i32,
    pub(crate) pgtables_kb: u64,
    pub(crate) pid: u32,
    /// `(rss + swap + pgtables) in pages + oom_score_adj × (totalpages /
    /// 1000)`.
    pub(crate) points: i64,
    pub(crate) rss_kb: u64,
    pub(crate) swap_kb: u64,
}

impl Candidate {
    fn new(c: &model::RankedCandidate) -> Candidate {
        Candidate {
            comm: c.comm.clone(),
            in_job: c.in_job,
            is_victim: c.is_victim,
            oom_score_adj: c.oom_score_adj,
            pgtables_kb: c.pgtables_kb,
            pid: c.pid,
            points: c.points,
            rss_kb: c.rss_kb,
            swap_kb: c.swap_kb,
        }
    }
}

/// How the ranking was reconstructed.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Ranking {
    /// Whether the victim's reconstructed points agree with
    /// `kernel_points` (within 1% or 256 pages); null when the kernel's
    /// points are unknown.
    pub(crate) agrees_with_kernel: Option<bool>,
    /// Always true: the ranking is a reconstruction.
    #[schemars(extend("const" = true))]
    pub(crate) reconstructed: bool,
    /// The totalpages the reconstruction used.
    pub(crate) totalpages: u64,
    pub(crate) totalpages_source: TotalpagesSource,
    /// The victim's reconstructed points.
    pub(crate) victim_points: Option<i64>,
}

impl Ranking {
    fn new(rk: &model::Ranking) -> Ranking {
        Ranking {
            agrees_with_kernel: rk.agrees_with_kernel,
            reconstructed: true,
            totalpages: rk.totalpages,
            totalpages_source: rk.totalpages_source.into(),
            victim_points: rk.victim_points,
        }
    }
}

/// Where the reconstruction's totalpages came from.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TotalpagesSource {
    /// `oc->totalpages`.
    Kernel,
    MemcgLimit,
    MemTotalPlusSwap,
    Unknown,
}

impl From<model::TotalSource> for TotalpagesSource {
    fn from(s: model::TotalSource) -> TotalpagesSource {
        match s {
            model::TotalSource::Kernel => TotalpagesSource::Kernel,
            model::TotalSource::MemcgLimit => TotalpagesSource::MemcgLimit,
            model::TotalSource::Machine => TotalpagesSource::MemTotalPlusSwap,
            model::TotalSource::Unknown => TotalpagesSource::Unknown,
        }
    }
}

/// The run-up to a kill (kB unless named otherwise).
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Pressure {
    /// v2 `memory.events` max, v1 `memory.failcnt`, in the window.
    pub(crate) cgroup_limit_hits: Option<u64>,
    pub(crate) cgroup_limit_kb: Option<u64>,
    pub(crate) cgroup_usage_kb: Option<u64>,
    pub commit_limit_kb: u64,
    pub committed_as_kb: u64,
    pub(crate) mem_available_at_kill_kb: u64,
    pub(crate) mem_available_min_kb: u64,
    pub(crate) mem_available_start_kb: u64,
    pub mem_total_kb: u64,
    /// `vm.overcommit_memory`.
    #[schemars(range(max = 2))]
    pub overcommit_memory: Option<u32>,
    /// Null where PSI is off.
    pub(crate) psi_full_avg10: Option<f64>,
    /// Null where PSI is off.
    pub(crate) psi_some_avg10: Option<f64>,
    /// Null where PSI is off.
    pub(crate) psi_some_stall_ms: Option<u64>,
    /// What the job's own threads freed inside reclaim or compaction in the
    /// window.
    pub reclaim_freed_kb: u64,
    pub shmem_kb: u64,
    /// Seconds the samples span.
    pub(crate) span_s: f64,
    /// Time in allocation stalls in the window, all tasks (ms).
    pub(crate) stall_ms: Stalls,
    /// Allocation stalls in the window, all tasks.
    pub(crate) stalls: Stalls,
    pub swap_total_kb: u64,
    pub(crate) swap_used_kb: u64,
}

impl Pressure {
    fn new(p: &model::PressureBefore) -> Pressure {
        Pressure {
            cgroup_limit_hits: p.cgroup_max_events,
            cgroup_limit_kb: p.cgroup_limit_kb,
            cgroup_usage_kb: p.cgroup_usage_kb,
            commit_limit_kb: p.commit_limit_kb,
            committed_as_kb: p.committed_as_kb,
            mem_available_at_kill_kb: p.available_at_kill_kb,
            mem_available_min_kb: p.available_min_kb,
            mem_available_start_kb: p.available_start_kb,
            mem_total_kb: p.mem_total_kb,
            overcommit_memory: p.overcommit_memory,
            psi_full_avg10: p.psi_full_avg10,
            psi_some_avg10: p.psi_some_avg10,
            psi_some_stall_ms: p.psi_some_stall_ms,
            reclaim_freed_kb: p.reclaim_freed_kb,
            shmem_kb: p.shmem_kb,
            span_s: secs(p.span_ns),
            stall_ms: Stalls::new(p.stall_ms),
            stalls: Stalls::new(p.stalls),
            swap_total_kb: p.swap_total_kb,
            swap_used_kb: p.swap_used_kb,
        }
    }
}

/// Allocation stalls by kind.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Stalls {
    pub(crate) compaction: u64,
    pub(crate) direct_reclaim: u64,
    pub(crate) memcg_reclaim: u64,
}

impl Stalls {
    fn new([direct_reclaim, memcg_reclaim, compaction]: [u64; 3]) -> Stalls {
        Stalls {
            compaction,
            direct_reclaim,
            memcg_reclaim,
        }
    }
}

/// Job processes that play one role, over a kill's window.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct KillGroup {
    /// How many processes.
    pub(crate) count: usize,
    /// Their RSS growth (kB).
    pub(crate) grew_kb: u64,
    /// Their honest growth (kB).
    pub(crate) honest_kb: i64,
    pub(crate) pids: Vec<u32>,
    /// `"DataLoader workers"`, `"torchrun ranks"`, or a shared command
    /// line.
    pub(crate) role: String,
    pub(crate) window_s: f64,
}

impl KillGroup {
    fn new(g: &model::Group) -> KillGroup {
        KillGroup {
            count: g.pids.len(),
            grew_kb: g.grew_kb,
            honest_kb: g.honest_kb,
            pids: g.pids.clone(),
            role: g.role.clone(),
            window_s: secs(g.window_ns),
        }
    }
}

/// A process whose resident memory grew before the kill.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Grower {
    /// It was born inside the window, so grew from 0.
    pub(crate) born_in_window: bool,
    /// Its latest command name.
    pub(crate) comm: String,
    /// Its container, from its cgroup paths; null outside one.
    pub(crate) container: Option<super::identity::Container>,
    /// RSS growth (kB).
    pub(crate) grew_kb: u64,
    /// Memory it allocated minus what it freed, in its own context, over
    /// the same span (kB); null without page-allocation probes.
    pub(crate) honest_kb: Option<i64>,
    pub(crate) in_job: bool,
    /// `LOCAL_RANK` (or MPI's, Slurm's) read at its exec.
    pub(crate) local_rank: Option<u32>,
    pub(crate) pid: u32,
    /// `RANK` (or MPI's, Slurm's `SLURM_PROCID`) read at its exec; a
    /// process forked from a rank carries its rank too.
    pub(crate) rank: Option<u32>,
    /// `grew_kb / window_s`; null when `window_s` is under a second.
    pub(crate) rate_kb_per_s: Option<f64>,
    /// Resident memory at the kill (kB).
    pub(crate) rss_kb: u64,
    /// torchrun's `TORCHELASTIC_RUN_ID`.
    pub(crate) run_id: Option<String>,
    /// `SLURM_JOB_ID`, else the job in its Slurm cgroup path.
    pub(crate) slurm_job_id: Option<u64>,
    /// `SLURM_STEP_ID`, else the step in its Slurm cgroup path.
    pub(crate) slurm_step_id: Option<String>,
    /// Where its memory grew (`record --stacks`): its growth stacks
    /// recorded up to the kill, heaviest first; empty without.
    pub(crate) stacks: Vec<super::stacks::Stack>,
    /// It is the process that was killed.
    pub(crate) victim: bool,
    /// Seconds from the baseline to the last sample.
    pub(crate) window_s: f64,
    /// `WORLD_SIZE` (or MPI's, Slurm's `SLURM_NTASKS`).
    pub(crate) world_size: Option<u32>,
}

impl Grower {
    fn new(r: &Report, k: &model::Kill, g: &model::Grower) -> Grower {
        let id = super::identity::Identity::of(r, g.pid, g.start_ns);
        Grower {
            born_in_window: g.born_in_window,
            comm: g.comm.clone(),
            grew_kb: g.grew_kb,
            honest_kb: g.honest_kb,
            container: id.container,
            local_rank: id.local_rank,
            rank: id.rank,
            run_id: id.run_id,
            slurm_job_id: id.slurm_job_id,
            slurm_step_id: id.slurm_step_id,
            world_size: id.world_size,
            in_job: g.in_job,
            pid: g.pid,
            rate_kb_per_s: g.rate_kb_per_s.map(super::tenths),
            rss_kb: g.rss_kb,
            stacks: super::stacks::stacks(&r.grower_stacks(k, g)),
            victim: g.is_victim,
            window_s: secs(g.window_ns),
        }
    }
}

/// The job processes' honest growth against their cgroup's usage change.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SumCheck {
    pub(crate) attributed_kb: i64,
    pub(crate) cgroup_delta_kb: i64,
    /// The cgroup's page cache, set apart (extra): null where its
    /// statistics were not read.
    pub(crate) page_cache: Option<PageCache>,
    /// `attributed_kb / cgroup_delta_kb`, to 3 places; null when the
    /// cgroup did not change. Page cache counts against the job here:
    /// `without_page_cache.ratio` does not.
    pub(crate) ratio: Option<f64>,
    pub(crate) unattributed: Unattributed,
    pub(crate) unattributed_kb: i64,
    /// The same check with the page cache set apart (extra): null where
    /// the cgroup's statistics were not read.
    pub(crate) without_page_cache: Option<WithoutPageCache>,
}

impl SumCheck {
    pub(crate) fn new(s: &model::SumCheck) -> SumCheck {
        SumCheck {
            attributed_kb: s.attributed_kb,
            cgroup_delta_kb: s.cgroup_delta_kb,
            page_cache: s.page_cache.map(|c| PageCache {
                at_start_kb: c.at_start_kb,
                delta_kb: c.delta_kb,
                job_kb: c.job_kb,
                other_kb: c.other_kb(),
            }),
            ratio: s.ratio().map(thousandths),
            unattributed: Unattributed {
                kernel_delta_kb: s.kernel_delta_kb,
                page_cache_delta_kb: s.file_delta_kb,
            },
            unattributed_kb: s.unattributed_kb,
            without_page_cache: s.without_cache_kb().map(|w| WithoutPageCache {
                cgroup_delta_kb: w,
                ratio: s.ratio_without_cache().map(thousandths),
                unattributed_kb: w - s.attributed_kb,
            }),
        }
    }
}

fn thousandths(r: f64) -> f64 {
    (r * 1000.0).round() / 1000.0
}

/// The job cgroup's page cache (its file pages, shmem left out), which is
/// no process's growth.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct PageCache {
    /// When the span began: read before the job, or left by others.
    pub(crate) at_start_kb: i64,
    /// Its change over the span: `job_kb + other_kb`.
    pub(crate) delta_kb: i64,
    /// Brought in, less removed, by the job's processes in their own
    /// context (their `page_cache_kb`).
    pub(crate) job_kb: i64,
    /// The rest: brought in by other processes and charged to the cgroup,
    /// less what reclaim took back.
    pub(crate) other_kb: i64,
}

/// The sum check with the page cache set apart.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WithoutPageCache {
    /// The cgroup's usage change less its page cache's:
    /// `cgroup_delta_kb - page_cache.delta_kb`.
    pub(crate) cgroup_delta_kb: i64,
    /// `attributed_kb` / this `cgroup_delta_kb`, to 3 places; null when it
    /// is 0.
    pub(crate) ratio: Option<f64>,
    /// This `cgroup_delta_kb - attributed_kb`: kernel memory, shmem made by
    /// no live job process, growth of processes that exited.
    pub(crate) unattributed_kb: i64,
}

/// What the unattributed part is made of, where known.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Unattributed {
    pub(crate) kernel_delta_kb: Option<i64>,
    pub(crate) page_cache_delta_kb: Option<i64>,
}
