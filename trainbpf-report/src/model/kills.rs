//! The kills: an OOM kill's records merged into one, read together with
//! the kernel log lines about it, and closed once they have all arrived
//! (see the module docs of `model` for why a kill stays open).

use std::collections::HashSet;

use crate::decode::{OomRecord, OomRecordKind, ProcKey, Rss};

use super::kernel_log::KernelLine;
use super::{
    Builder, Group, Grower, Job, PRINTK_NS, PressureBefore, Ranking, SEC, SumCheck, attribution,
    growers::keep_top,
};

/// The two records of one kill are microseconds apart; a second leaves room
/// for a slow probe, and the same process cannot be chosen twice that fast
/// (the kernel skips tasks already marked as victims).
pub(super) const MERGE_NS: u64 = SEC;

/// Kernel log lines kept per kill for the report.
pub(super) const MAX_KILL_LOG: usize = 16;

/// What limited the allocation that failed (`enum oom_constraint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Constraint {
    /// The whole machine ran out (CONSTRAINT_NONE).
    None,
    Cpuset,
    MemoryPolicy,
    Memcg,
    #[default]
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
    pub fn from_kernel(v: u32) -> Constraint {
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
    pub(super) fn from_printk(s: &str) -> Option<Constraint> {
        Some(match s {
            "CONSTRAINT_NONE" => Constraint::None,
            "CONSTRAINT_CPUSET" => Constraint::Cpuset,
            "CONSTRAINT_MEMORY_POLICY" => Constraint::MemoryPolicy,
            "CONSTRAINT_MEMCG" => Constraint::Memcg,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Kill {
    pub(crate) ts_ns: u64,
    pub(crate) realtime_ns: Option<u64>,
    pub(crate) victim: Victim,
    pub(crate) constraint: Constraint,
    /// The memory cgroup that ran out (for a memcg OOM), else the victim's.
    pub(crate) memcg: Option<String>,
    /// The victim's own memory cgroup.
    pub(crate) task_memcg: Option<String>,
    /// From the kernel's `memory: usage …` line.
    pub(crate) memcg_usage_kb: Option<u64>,
    /// From the same line, or the job's `--memory-limit` when the memcg is
    /// the job's cgroup.
    pub(crate) memcg_limit_kb: Option<u64>,
    pub(crate) memcg_failcnt: Option<u64>,
    pub(crate) trigger: Trigger,
    /// The records that reported the kill, `oom_kill_process` first.
    pub(crate) sources: Vec<KillSource>,
    /// `oc->chosen_points` and `oc->totalpages`, when the kernel allowed a
    /// probe on `oom_kill_process`.
    pub(crate) kernel_points: Option<i64>,
    pub(crate) totalpages: Option<u64>,
    /// kernfs ids as recorded (0: unknown).
    pub(crate) oom_memcg_id: u64,
    pub(crate) victim_memcg_id: u64,
    /// Processes whose resident memory grew in the window before the kill,
    /// most first, at most ten.
    pub(crate) growers: Vec<Grower>,
    /// The OOM killer's ranking at the kill, reconstructed from tracked
    /// memory (see `badness`).
    pub(crate) ranking: Option<Ranking>,
    /// The job's processes grouped by role, with their growth.
    pub(crate) groups: Vec<Group>,
    /// The job's honest growth in the window against the cgroup's.
    pub(crate) sum_check: Option<SumCheck>,
    /// The machine and cgroup on the way to the kill.
    pub(crate) pressure: Option<PressureBefore>,
    pub(crate) window_ns: u64,
    /// The kernel log lines read as part of this kill.
    pub(crate) kernel_log: Vec<String>,
    /// The kill in one line ([`super::verdict::line`]).
    pub(crate) verdict: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Victim {
    /// Process id (tgid).
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    /// The thread the kernel named.
    pub(crate) thread_pid: u32,
    pub(crate) comm: String,
    pub(crate) rss: Rss,
    pub(crate) oom_score_adj: i32,
    pub(crate) uid: u32,
    pub(crate) in_job: bool,
    pub(crate) total_vm_kb: u64,
    pub(crate) pgtables_kb: u64,
    /// From the job's root down to the victim; empty outside the job.
    pub(crate) tree: Vec<TreeNode>,
}

impl Victim {
    pub(crate) fn key(&self) -> ProcKey {
        ProcKey {
            tgid: self.pid,
            start_ns: self.start_ns,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeNode {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
}

/// The task whose allocation failed and set off the kill.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Trigger {
    pub(crate) pid: u32,
    pub(crate) tgid: u32,
    /// Its process's start (the newest with that tgid at the kill).
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillSource {
    pub(crate) record: OomRecordKind,
    /// "fentry", "kprobe", "tp_btf", "tracepoint".
    pub(crate) probe: String,
}

/// What the kernel log told about a kill, before the cgroup names are known.
#[derive(Debug, Default)]
pub(super) struct Hints {
    pub(super) oc_constraint: Option<Constraint>,
    pub(super) printk_constraint: Option<Constraint>,
    pub(super) prefix_constraint: Option<Constraint>,
    pub(super) oom_memcg: Option<String>,
    pub(super) task_memcg: Option<String>,
}

#[derive(Debug)]
pub(super) struct OpenKill {
    pub(super) kill: Kill,
    pub(super) hints: Hints,
}

impl Builder {
    pub(super) fn on_oom(&mut self, ts: u64, mut rec: OomRecord) {
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
                    start_ns: self.current.get(&rec.trigger.tgid).copied().unwrap_or(0),
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
                verdict: String::new(),
            },
            hints: Hints {
                oc_constraint: oc.map(|o| Constraint::from_kernel(o.constraint)),
                ..Hints::default()
            },
        });
    }

    pub(super) fn close(&self, open: &mut OpenKill) {
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

    /// The victim's ancestry, job root first, through recorded forks.
    pub(super) fn tree(&self, v: &Victim) -> Vec<TreeNode> {
        let key = v.key();
        if !v.in_job && !self.job_procs.contains_key(&key) {
            return Vec::new();
        }
        let root = self.job.as_ref().map(Job::key);
        let mut chain = vec![TreeNode {
            pid: v.pid,
            start_ns: v.start_ns,
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
                start_ns: parent.start_ns,
                comm: self.comm_of(parent),
            });
            cur = parent;
        }
        chain.reverse();
        chain
    }

    /// Names the memcgs once every cgroup record has been read: the
    /// collector names a cgroup when it first meets its id, which can be
    /// after the kill.
    /// The victim's memory cgroup and the one that ran out, by what the
    /// records tell.
    pub(super) fn memcgs(&self, k: &Kill, h: &Hints) -> (Option<String>, Option<String>) {
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

    pub(super) fn resolve_memcg(&self, k: &mut Kill, h: Hints) {
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

/// A memory cgroup's kill that is none of the job's business: another
/// user's job beside it on the machine ran into its own limit. The cgroup
/// that ran out is neither the job's nor one of its parents, and neither
/// the victim nor any grower is the job's. Without the job's cgroup (an
/// attached recording) every kill is kept.
pub(crate) fn elsewhere(job_cgroup: Option<&str>, k: &Kill) -> bool {
    let (Some(job), Some(oom)) = (job_cgroup, k.memcg.as_deref()) else {
        return false;
    };
    let under = job == oom || job.starts_with(&format!("{}/", oom.trim_end_matches('/')));
    k.constraint == Constraint::Memcg
        && !under
        && !k.victim.in_job
        && k.growers.iter().all(|g| !g.in_job)
}

/// Whether an OOM record carries the victim's figures: the classic
/// `oom:mark_victim` before Linux 6.8 has a pid and nothing else.
pub(super) fn has_figures(rec: &OomRecord) -> bool {
    !rec.comm.is_empty()
}

pub(super) fn fill_victim(v: &mut Victim, rec: &OomRecord) {
    v.thread_pid = rec.victim_pid;
    v.comm.clone_from(&rec.comm);
    v.rss = rec.rss;
    v.oom_score_adj = rec.oom_score_adj;
    v.uid = rec.uid;
    v.in_job |= rec.in_job;
    v.total_vm_kb = rec.total_vm_kb;
    v.pgtables_kb = rec.pgtables_kb;
}

#[cfg(test)]
mod elsewhere_tests {
    use super::*;
    use crate::model::diagnosis::fixture::{grower, kill};

    /// Two users' jobs side by side, each in its own cgroup under one
    /// parent: the other's kill is elsewhere; a kill of the job's cgroup,
    /// of a parent of it, of the machine, or of a process of the job is
    /// not; without the job's cgroup nothing is.
    #[test]
    fn another_jobs_own_limit_is_elsewhere() {
        let mine = Some("/users/trainbpf-1");
        let other = |memcg: &str| {
            let mut k = kill(900, "python3", 200);
            k.constraint = Constraint::Memcg;
            k.victim.in_job = false;
            k.memcg = Some(memcg.into());
            let mut g = grower(900, 200, 200);
            g.in_job = false;
            k.growers = vec![g];
            k
        };
        assert!(elsewhere(mine, &other("/users/trainbpf-2")));
        assert!(elsewhere(mine, &other("/users/trainbpf-10")));
        assert!(!elsewhere(mine, &other("/users/trainbpf-1")));
        assert!(!elsewhere(mine, &other("/users")));
        assert!(!elsewhere(mine, &other("/")));
        assert!(!elsewhere(None, &other("/users/trainbpf-2")));
        let mut global = other("/users/trainbpf-2");
        global.constraint = Constraint::None;
        assert!(!elsewhere(mine, &global));
        let mut victim_mine = other("/users/trainbpf-2");
        victim_mine.victim.in_job = true;
        assert!(!elsewhere(mine, &victim_mine));
        let mut grower_mine = other("/users/trainbpf-2");
        grower_mine.growers[0].in_job = true;
        assert!(!elsewhere(mine, &grower_mine));
    }
}
