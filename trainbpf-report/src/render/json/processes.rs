//! The report's job and its processes (docs/report-json.md, "job",
//! "processes[]", "deaths[]", "top_memory[]"), with the role groups, the
//! shared-memory objects and what the USS/PSS sampling cost.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::{self, Report};
use crate::render::death_phrase;

use super::{Exit, Time, secs_since};

/// The recorded command, or what the recorder attached to.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Job {
    /// The command line; empty for `--cgroup` and `--all`.
    pub(crate) argv: Vec<String>,
    /// How the recorder attached to a job it did not start: "pid",
    /// "cgroup" or "all"; null when it ran the job.
    pub(crate) attached: Option<String>,
    /// The memory cgroup created for `--memory-limit`, as the kernel names
    /// it; null without one.
    pub(crate) cgroup: Option<String>,
    pub(crate) cwd: String,
    /// How the main process ended; null if the recording ended first.
    pub(crate) exit: Option<Exit>,
    /// The `--memory-limit`, bytes.
    pub(crate) memory_limit_bytes: Option<u64>,
    /// The job's main process; 0 for `--cgroup` and `--all`, which have
    /// none.
    pub(crate) pid: u32,
    /// What was recorded, as the text report's title names it: the
    /// command line, "all processes", "cgroup DIR" or "pid N (comm)".
    pub(crate) title: String,
    pub(crate) uid: u32,
}

impl Job {
    pub(crate) fn new(j: &model::Job, title: String) -> Job {
        Job {
            argv: j.argv.clone(),
            attached: j.attached.clone(),
            cgroup: j.cgroup.clone(),
            cwd: j.cwd.clone(),
            exit: j.exit.map(Exit::from),
            memory_limit_bytes: j.memory_limit_bytes,
            pid: j.pid,
            title,
            uid: j.uid,
        }
    }
}

/// A process of the job's tree that the recorder saw.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Process {
    /// Its birth, seconds since the recording start.
    pub(crate) born_s: Option<f64>,
    /// Latest command name.
    pub(crate) comm: String,
    /// Its container, from its cgroup paths; null outside one.
    pub(crate) container: Option<super::identity::Container>,
    /// Its exit, seconds since the recording start; null if still running
    /// at the end.
    pub(crate) died_s: Option<f64>,
    /// The last file it exec'd; ends in `…` when the path was cut.
    pub(crate) exec: Option<String>,
    /// How it ended, decoded from the wait status.
    pub(crate) exit: Option<Exit>,
    /// Memory it allocated minus freed in its own context, at its last
    /// record (kB); null without page-allocation probes.
    pub(crate) honest_kb: Option<i64>,
    /// The most `honest_kb` reached.
    pub(crate) honest_peak_kb: Option<i64>,
    /// The host it ran on: the recording header's hostname.
    pub(crate) host: String,
    /// `LOCAL_RANK` (or MPI's, Slurm's) read at its exec.
    pub(crate) local_rank: Option<u32>,
    /// The OOM killer chose it.
    pub(crate) oom_killed: bool,
    /// The last `oom_score_adj` written while recording; null if it never
    /// changed.
    #[schemars(range(min = -1000, max = 1000))]
    pub(crate) oom_score_adj: Option<i32>,
    /// Page cache it brought in minus what it removed, in its own context
    /// (kB); null without the page-cache probes.
    pub(crate) page_cache_kb: Option<i64>,
    /// Parent's pid; null for the job's main process.
    pub(crate) parent: Option<u32>,
    /// The largest resident memory seen (kB).
    pub(crate) peak_rss_kb: u64,
    pub(crate) pid: u32,
    /// Proportional set size from its last smaps_rollup sample (kB).
    pub(crate) pss_kb: Option<u64>,
    /// `RANK` (or MPI's, Slurm's `SLURM_PROCID`) read at its exec; a
    /// process forked from a rank carries its rank too.
    pub(crate) rank: Option<u32>,
    /// Its recording's index in `recordings` (0 for one recording).
    pub(crate) recording: usize,
    /// torchrun's `TORCHELASTIC_RUN_ID`.
    pub(crate) run_id: Option<String>,
    /// `SLURM_JOB_ID`, else the job in its Slurm cgroup path.
    pub(crate) slurm_job_id: Option<u64>,
    /// `SLURM_STEP_ID`, else the step in its Slurm cgroup path.
    pub(crate) slurm_step_id: Option<String>,
    /// Where its memory grew over the whole run (`record --stacks`),
    /// heaviest first; empty without.
    pub(crate) stacks: Vec<super::stacks::Stack>,
    /// Unique set size from its last smaps_rollup sample (kB).
    pub(crate) uss_kb: Option<u64>,
    /// `WORLD_SIZE` (or MPI's, Slurm's `SLURM_NTASKS`).
    pub(crate) world_size: Option<u32>,
}

impl Process {
    pub(crate) fn new(r: &Report, p: &model::Process) -> Process {
        let id = super::identity::Identity::of(r, p.pid, p.start_ns);
        Process {
            born_s: p.born_ns.map(|t| secs_since(r, t)),
            comm: p.comm.clone(),
            died_s: p.died_ns.map(|t| secs_since(r, t)),
            exec: p.exec.clone(),
            exit: p.exit.map(Exit::from),
            honest_kb: p.honest_kb,
            honest_peak_kb: p.honest_peak_kb,
            host: r.header.hostname.clone(),
            container: id.container,
            local_rank: id.local_rank,
            rank: id.rank,
            run_id: id.run_id,
            slurm_job_id: id.slurm_job_id,
            slurm_step_id: id.slurm_step_id,
            world_size: id.world_size,
            oom_killed: p.oom_killed,
            oom_score_adj: p.oom_score_adj,
            page_cache_kb: p.page_cache_kb,
            parent: p.parent.map(|k| k.tgid),
            peak_rss_kb: p.peak_rss_kb,
            pid: p.pid,
            pss_kb: p.pss_kb,
            recording: r.source.index,
            stacks: super::stacks::stacks(&r.process_stacks(p.pid, p.start_ns)),
            uss_kb: p.uss_kb,
        }
    }
}

/// A job process that ended while recording.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Death {
    /// The job's first OOM kill, when this death came after it and is its
    /// consequence, not a cause: the process lived at the kill and then
    /// was stopped by a signal, crashed or exited non-zero (torchrun's
    /// agent stopping the other ranks, a collective failing). Null
    /// otherwise.
    pub(crate) after_kill: Option<AfterKill>,
    pub(crate) cause: Cause,
    /// The exit code for `exit`; otherwise the signal's `si_code` when the
    /// signal was seen.
    pub(crate) code: Option<i32>,
    pub(crate) comm: String,
    /// The host it ran on: the recording header's hostname.
    pub(crate) host: String,
    /// For OOM kills: the memory cgroup.
    pub(crate) memcg: Option<String>,
    /// For OOM kills: the memory cgroup's limit (kB).
    pub(crate) memcg_limit_kb: Option<u64>,
    /// The cause in words, as the text report prints it.
    pub(crate) phrase: String,
    pub(crate) pid: u32,
    /// Its recording's index in `recordings` (0 for one recording).
    pub(crate) recording: usize,
    /// Who sent the fatal signal (for an OOM kill, the task whose
    /// allocation triggered it); null when no signal record matched.
    pub(crate) sender: Option<Sender>,
    /// The fatal signal; null for an exit.
    pub(crate) signal: Option<i32>,
    /// Its threads' stacks as they dequeued the fatal signal (`record
    /// --stacks`), its main thread's first, as `kills[].victim`'s; null
    /// without stacks, for an exit, or where none was recorded.
    pub(crate) stack_at_death: Option<super::stacks::StackAtDeath>,
    pub(crate) time: Option<Time>,
    /// Seconds since the recording start.
    pub(crate) time_s: f64,
}

/// The OOM kill a death followed.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AfterKill {
    /// The kill's index in `kills`, plus one (as the text report numbers
    /// them).
    pub(crate) kill: usize,
    pub(crate) victim_pid: u32,
    /// Its victim as the report names it: `rank 1 (pid 812)`.
    pub(crate) victim: String,
    /// From the kill to this death.
    pub(crate) seconds_after: f64,
}

impl Death {
    pub(crate) fn new(r: &Report, d: &model::Death) -> Death {
        Death {
            after_kill: d.after.as_ref().map(|a| AfterKill {
                kill: a.kill,
                victim_pid: a.victim_pid,
                victim: a.victim.clone(),
                seconds_after: a.after_ns as f64 / 1e9,
            }),
            cause: d.cause.into(),
            code: d.code,
            comm: d.comm.clone(),
            host: r.header.hostname.clone(),
            memcg: d.memcg.clone(),
            memcg_limit_kb: d.memcg_limit_kb,
            phrase: death_phrase(d),
            pid: d.pid,
            recording: r.source.index,
            sender: d.sender.as_ref().map(|s| Sender {
                comm: s.comm.clone(),
                exe: s.exe.clone(),
                forwarded_by: s.forwarded_by,
                pid: s.pid,
                terminal: s.terminal.as_ref().map(|t| Terminal {
                    foreground_group: t.foreground_pgrp,
                    session: t.session,
                    tty: t.tty.clone(),
                }),
                uid: s.uid,
            }),
            signal: d.signal,
            stack_at_death: r
                .process_stack_at_death(d.pid, d.start_ns)
                .as_ref()
                .map(super::stacks::at_death),
            time: Time::at(r, d.ts_ns),
            time_s: secs_since(r, d.ts_ns),
        }
    }
}

/// Why a process ended.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Cause {
    /// The kernel's OOM killer, machine out of memory.
    OomGlobal,
    /// The kernel's OOM killer, a memory cgroup at its limit.
    OomMemcg,
    /// A signal from a process: `kill`, systemd-oomd, earlyoom, kubelet,
    /// the job's launcher.
    Signal,
    /// SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, SIGTRAP, SIGSYS.
    Crash,
    Exit,
}

impl From<model::Cause> for Cause {
    fn from(c: model::Cause) -> Cause {
        match c {
            model::Cause::OomGlobal => Cause::OomGlobal,
            model::Cause::OomMemcg => Cause::OomMemcg,
            model::Cause::Signal => Cause::Signal,
            model::Cause::Crash => Cause::Crash,
            model::Cause::Exit => Cause::Exit,
        }
    }
}

/// Who sent a fatal signal.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Sender {
    /// Empty for a signal a terminal generated.
    pub(crate) comm: String,
    /// Null when the sender had exited before the recorder could read it.
    pub(crate) exe: Option<String>,
    /// The recorder's pid, when it passed on a signal someone sent it.
    pub(crate) forwarded_by: Option<u32>,
    /// 0 for a signal a terminal generated.
    pub(crate) pid: u32,
    /// The terminal that generated the signal (Ctrl-C, Ctrl-\, Ctrl-Z,
    /// hangup); else null.
    pub(crate) terminal: Option<Terminal>,
    pub(crate) uid: Option<u32>,
}

/// A terminal, when the key was typed.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Terminal {
    /// Its foreground process group.
    pub(crate) foreground_group: u32,
    /// Its session.
    pub session: u32,
    /// E.g. `/dev/pts/3`.
    pub tty: String,
}

/// The job's processes that play one role, over the whole run.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Group {
    pub(crate) count: usize,
    pub(crate) honest_kb: i64,
    pub(crate) peak_rss_kb: u64,
    pub(crate) pids: Vec<u32>,
    pub(crate) role: String,
}

impl Group {
    pub(crate) fn new(g: &model::Group) -> Group {
        Group {
            count: g.pids.len(),
            honest_kb: g.honest_kb,
            peak_rss_kb: g.grew_kb,
            pids: g.pids.clone(),
            role: g.role.clone(),
        }
    }
}

/// A shared-memory object.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SharedObject {
    /// A POSIX object's filesystem, `major:minor` (one of
    /// `shm_filesystems[].dev`); null for SysV and memfd.
    pub(crate) fs_dev: Option<String>,
    /// Inode (POSIX, memfd) or shmid (SysV): the object's identity.
    pub(crate) id: u64,
    #[schemars(extend("enum" = ["posix", "sysv", "memfd"]))]
    pub(crate) kind: String,
    /// The most job processes seen mapping or holding it at one look.
    pub(crate) mappers: u32,
    pub(crate) name: String,
    /// The creator (SysV cpid) or the first job process seen mapping or
    /// holding it.
    pub(crate) owner_pid: Option<u32>,
    /// Pages actually allocated (kB).
    pub(crate) resident_kb: u64,
    pub(crate) size_kb: u64,
}

impl SharedObject {
    pub(crate) fn all(r: &Report) -> Vec<SharedObject> {
        r.shared_memory
            .iter()
            .map(|o| SharedObject {
                fs_dev: (o.dev != 0).then(|| super::shm::dev_name(o.dev)),
                id: o.id,
                kind: serde_name(&o.kind),
                mappers: o.mappers,
                name: o.name.clone(),
                owner_pid: o.owner_tgid,
                resident_kb: o.resident_kb,
                size_kb: o.size_kb,
            })
            .collect()
    }
}

/// A unit enum's serde name: the kinds the sampler defines name
/// themselves, and the renderer need not import the sampler to say them.
fn serde_name<T: Serialize>(t: &T) -> String {
    match serde_json::to_value(t) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// One of the processes, any on the machine, with the largest peaks.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct TopMemory {
    pub(crate) comm: String,
    pub(crate) in_job: bool,
    pub(crate) peak_rss_kb: u64,
    pub(crate) pid: u32,
}

impl TopMemory {
    pub(crate) fn all(r: &Report) -> Vec<TopMemory> {
        r.top_memory
            .iter()
            .map(|u| TopMemory {
                comm: u.comm.clone(),
                in_job: u.in_job,
                peak_rss_kb: u.peak_rss_kb,
                pid: u.pid,
            })
            .collect()
    }
}

/// What the USS/PSS sampling cost the recorder.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SmapsCost {
    pub(crate) rounds: u64,
    /// Microseconds, in all.
    pub(crate) total_us: u64,
}
