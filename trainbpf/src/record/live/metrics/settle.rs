//! Kills and deaths told apart while the job runs, from the same records
//! the recording gets, by the model's own rules: a kill's constraint from
//! `oom_kill_process` or the kernel's log lines
//! ([`trainbpf_report::model::kill_constraint`]), a death's cause as
//! `model::deaths` gives it. The report reads the whole recording; this
//! decides within a couple of seconds of a kill, so that a scrape sees it
//! while the job still runs.
//!
//! Everything here is bounded: the kills waiting for their log lines, the
//! recent log, the per-process figures, the ranks and cgroup names.

use std::collections::{HashMap, VecDeque};

use trainbpf_report::{
    decode::{
        self, Event, ExitStatus, MemSample, ProcKey, UserBody,
        samples::{CgroupPressure, ProcInfo},
    },
    model::{Cause, Constraint, cgroup_path, consequence, gpu::Ledger},
};

/// How long a kill waits for the kernel's log line that names its
/// constraint (the model's `PRINTK_NS`).
const SETTLE_NS: u64 = 2_000_000_000;
/// Records of one kill (`oom_kill_process`, then `mark_victim`) are this
/// close (the model's `MERGE_NS`).
const MERGE_NS: u64 = 1_000_000_000;
const MAX_PENDING: usize = 64;
const MAX_LOG: usize = 64;
const MAX_DONE: usize = 64;
const MAX_PROCS: usize = 65_536;
const MAX_CGROUPS: usize = 256;
/// Signals that end a process by its own fault (`model::deaths`).
const CRASH_SIGNALS: [i32; 7] = [4, 5, 6, 7, 8, 11, 31];

/// An OOM kill of a job process, settled.
#[derive(Clone, Debug, PartialEq)]
pub struct KillEvent {
    /// CLOCK_MONOTONIC ns of its first record.
    pub ts_ns: u64,
    pub pid: u32,
    pub comm: String,
    pub constraint: Constraint,
    pub rank: Option<u32>,
    /// The container's short id, from the victim's cgroup path.
    pub container: Option<String>,
    /// The victim's memory cgroup.
    pub memcg: Option<String>,
    pub rss_bytes: u64,
    pub oom_score_adj: i32,
    pub uid: u32,
    /// The task whose allocation set the kill off.
    pub trigger_pid: u32,
    pub trigger_comm: String,
    /// The kill's line, as the recorder told it (`live::kill_line`).
    pub verdict: Option<String>,
}

/// A job process's death.
#[derive(Clone, Debug, PartialEq)]
pub struct DeathEvent {
    pub ts_ns: u64,
    pub pid: u32,
    pub comm: String,
    pub cause: Cause,
    pub signal: Option<i32>,
    pub code: Option<i32>,
    pub rank: Option<u32>,
    /// Who sent the fatal signal, as the kernel's record of it said; for
    /// an OOM kill, the task that set it off.
    pub sender_pid: Option<u32>,
    pub sender_comm: Option<String>,
    /// The job's first OOM kill's victim (pid, rank), when this death
    /// followed it as its consequence ([`consequence`]): a rank the agent
    /// stopped, a failed collective, the agent's own failed exit.
    pub after_kill: Option<(u32, Option<u32>)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Finished {
    Kill(KillEvent),
    Death(DeathEvent),
}

#[derive(Debug)]
struct Pending {
    kill: KillEvent,
    memcg_id: u64,
    constraint: Option<Constraint>,
}

/// The job's memory now, summed over its live processes, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobMemory {
    pub added: i64,
    pub resident: i64,
    pub page_cache: i64,
}

/// See the module docs.
pub struct Live {
    pending: Vec<Pending>,
    /// Deaths waiting for their kill to settle.
    waiting: Vec<DeathEvent>,
    /// Kills settled lately: (pid, ts, constraint, trigger).
    done: VecDeque<(u32, u64, Constraint, u32, String)>,
    /// The kernel's recent log lines that named a kill: (ts, pid, constraint).
    log: VecDeque<(u64, u32, Constraint)>,
    ranks: HashMap<u32, u32>,
    /// Each process's container (short id, or its pod's uid), from its
    /// identity record.
    containers: HashMap<u32, String>,
    cgroups: HashMap<u64, String>,
    /// The last signal to each job process: (sig, sender pid, sender comm).
    signals: HashMap<u32, (u32, u32, String)>,
    /// Per process: (added, resident, page cache) bytes, and their sums.
    procs: HashMap<ProcKey, [i64; 3]>,
    sums: [i64; 3],
    cgroup: Option<CgroupPressure>,
    lost: u64,
    /// The GPU ledger, fed the CUDA calls and exits only.
    gpu: Option<Ledger>,
    /// The job's first OOM kill: (ts, victim pid, its rank).
    first_kill: Option<(u64, u32, Option<u32>)>,
    /// The kills' lines as told, not yet settled: (victim pid, line).
    told: VecDeque<(u32, String)>,
    out: Vec<Finished>,
}

impl Live {
    #[allow(
        clippy::new_without_default,
        reason = "a Live is made once, by Outputs::start"
    )]
    pub fn new() -> Live {
        Live {
            pending: Vec::new(),
            waiting: Vec::new(),
            done: VecDeque::new(),
            log: VecDeque::new(),
            ranks: HashMap::new(),
            containers: HashMap::new(),
            cgroups: HashMap::new(),
            signals: HashMap::new(),
            procs: HashMap::new(),
            sums: [0; 3],
            cgroup: None,
            lost: 0,
            gpu: None,
            first_kill: None,
            told: VecDeque::new(),
            out: Vec::new(),
        }
    }

    /// A kernel record, decoded: kills, log lines, exits, memory,
    /// signals and CUDA calls settle kills and deaths and move the gauges.
    pub fn observe(&mut self, t: &decode::Timed) {
        let ts = t.ts_ns;
        match &t.event {
            Event::Oom(r) if r.in_job => self.on_oom(ts, r),
            Event::Printk { msg, .. } => {
                if let Some((Some(pid), c)) = trainbpf_report::model::kill_constraint(msg) {
                    if self.log.len() == MAX_LOG {
                        self.log.pop_front();
                    }
                    self.log.push_back((ts, pid, c));
                    for p in &mut self.pending {
                        if p.kill.pid == pid && p.constraint.is_none() {
                            p.constraint = Some(c);
                        }
                    }
                }
            }
            Event::Mem(MemSample {
                proc,
                in_job: true,
                rss,
                alloc_kb,
                freed_kb,
                cache_kb,
                ..
            }) => {
                let now = [
                    (*alloc_kb as i64 - *freed_kb as i64) * 1024,
                    rss.resident_kb() as i64 * 1024,
                    *cache_kb * 1024,
                ];
                if self.procs.len() < MAX_PROCS || self.procs.contains_key(proc) {
                    let was = self.procs.insert(*proc, now).unwrap_or_default();
                    for i in 0..3 {
                        self.sums[i] += now[i] - was[i];
                    }
                }
            }
            Event::Signal(s)
                if self.signals.len() < MAX_PROCS || self.signals.contains_key(&s.target.tgid) =>
            {
                self.signals
                    .insert(s.target.tgid, (s.sig, s.sender.tgid, s.sender.comm.clone()));
            }
            Event::Exit {
                proc,
                comm,
                exit_code,
                kthread: false,
                ..
            } => {
                // The driver frees what a process held when it ends.
                if let Some(g) = &mut self.gpu {
                    g.observe(t);
                }
                self.on_exit(ts, *proc, comm, *exit_code);
            }
            Event::Gpu(_) => {
                self.gpu.get_or_insert_with(Ledger::default).observe(t);
            }
            _ => {}
        }
    }

    /// A record the collector wrote: names, ranks, pressure, losses.
    pub fn on_user(&mut self, body: &UserBody) {
        match body {
            // The identity read at each exec (kind 131) names the rank
            // the way the report does; `ProcInfo`'s torchrun rank stays the
            // fallback for recordings' collectors that send no identity.
            UserBody::Identity(rec) if self.ranks.len() < MAX_PROCS => {
                let id = trainbpf_report::model::identity::Identity::from_record(rec);
                if let Some(r) = id.rank {
                    self.ranks.insert(rec.tgid, r);
                }
                let short = id.container.as_ref().and_then(|c| {
                    c.id.as_deref()
                        .map(|i| cgroup_path::short_id(i).to_string())
                        .or_else(|| c.pod_uid.clone())
                });
                if let Some(c) = short {
                    self.containers.insert(rec.tgid, c);
                }
            }
            UserBody::ProcInfo(ProcInfo {
                tgid,
                rank: Some(r),
                ..
            }) if self.ranks.len() < MAX_PROCS => {
                self.ranks.insert(*tgid, *r);
            }
            UserBody::Cgroup(c) if self.cgroups.len() < MAX_CGROUPS => {
                self.cgroups.insert(c.id, c.path.clone());
            }
            UserBody::Pressure(p) => self.cgroup.clone_from(&p.cgroup),
            UserBody::Lost(l) => self.lost = l.total(),
            UserBody::Verdict(v) => {
                if self.told.len() == MAX_PENDING {
                    self.told.pop_front();
                }
                self.told.push_back((v.proc.tgid, v.line.clone()));
            }
            _ => {}
        }
    }

    fn on_oom(&mut self, ts: u64, r: &decode::OomRecord) {
        let pid = r.victim.tgid;
        if self
            .done
            .iter()
            .any(|d| d.0 == pid && d.1.abs_diff(ts) <= MERGE_NS)
        {
            return;
        }
        let oc = r.oc.map(|o| Constraint::from_kernel(o.constraint));
        if let Some(p) = self
            .pending
            .iter_mut()
            .find(|p| p.kill.pid == pid && p.kill.ts_ns.abs_diff(ts) <= MERGE_NS)
        {
            // mark_victim's figures are the closest to what it held.
            if !r.comm.is_empty() {
                p.kill.comm.clone_from(&r.comm);
                p.kill.rss_bytes = r.rss.resident_kb() * 1024;
                p.kill.oom_score_adj = r.oom_score_adj;
            }
            p.constraint = oc.or(p.constraint);
            if p.memcg_id == 0 {
                p.memcg_id = r.memcg_id;
            }
            return;
        }
        let rank = self.ranks.get(&pid).copied();
        self.first_kill.get_or_insert((ts, pid, rank));
        if self.pending.len() == MAX_PENDING {
            return;
        }
        // The `oom-kill:` line comes before mark_victim.
        let logged = self
            .log
            .iter()
            .rev()
            .find(|l| l.1 == pid && l.0.abs_diff(ts) <= SETTLE_NS)
            .map(|l| l.2);
        self.pending.push(Pending {
            kill: KillEvent {
                ts_ns: ts,
                pid,
                comm: r.comm.clone(),
                constraint: Constraint::Unknown,
                rank: self.ranks.get(&pid).copied(),
                container: None,
                memcg: None,
                rss_bytes: r.rss.resident_kb() * 1024,
                oom_score_adj: r.oom_score_adj,
                uid: r.uid,
                trigger_pid: r.trigger.tgid,
                trigger_comm: r.trigger.comm.clone(),
                verdict: None,
            },
            memcg_id: r.memcg_id,
            constraint: oc.or(logged),
        });
    }

    fn on_exit(&mut self, ts: u64, proc: ProcKey, comm: &str, exit_code: u32) {
        let pid = proc.tgid;
        if let Some(was) = self.procs.remove(&proc) {
            for (sum, w) in self.sums.iter_mut().zip(was) {
                *sum -= w;
            }
        }
        let rank = self.ranks.remove(&pid);
        self.containers.remove(&pid);
        let sent = self.signals.remove(&pid);
        let mut d = DeathEvent {
            ts_ns: ts,
            pid,
            comm: comm.to_string(),
            cause: Cause::Exit,
            signal: None,
            code: None,
            rank,
            sender_pid: None,
            sender_comm: None,
            after_kill: None,
        };
        match trainbpf_report::model::wait_status(exit_code) {
            ExitStatus::Code(c) => d.code = Some(c),
            ExitStatus::Signal(s) => {
                d.signal = Some(s);
                d.cause = if CRASH_SIGNALS.contains(&s) {
                    Cause::Crash
                } else {
                    Cause::Signal
                };
                if let Some((sig, spid, scomm)) = sent.filter(|x| x.0 as i32 == s) {
                    let _ = sig;
                    d.sender_pid = Some(spid);
                    d.sender_comm = Some(scomm);
                }
                if s == 9 && self.pending.iter().any(|p| p.kill.pid == pid) {
                    self.waiting.push(d);
                    return;
                }
                if s == 9 {
                    self.oom_death(&mut d);
                }
            }
        }
        // The report's rule (`model::deaths`), with the process's start as
        // its birth; an OOM victim waiting above is a kill of its own.
        if let Some((at, victim, rank)) = self.first_kill
            && consequence(d.cause, d.code, Some(proc.start_ns), ts, at)
        {
            d.after_kill = Some((victim, rank));
        }
        self.out.push(Finished::Death(d));
    }

    /// A SIGKILL death: an OOM kill's when a settled kill named the pid.
    fn oom_death(&self, d: &mut DeathEvent) {
        if let Some((_, _, c, tpid, tcomm)) = self.done.iter().rev().find(|k| k.0 == d.pid) {
            d.cause = if *c == Constraint::Memcg {
                Cause::OomMemcg
            } else {
                Cause::OomGlobal
            };
            d.sender_pid = Some(*tpid);
            d.sender_comm = Some(tcomm.clone());
        }
    }

    /// The kills whose constraint is known or whose wait is over, then the
    /// deaths that waited for them, in that order.
    pub fn settle(&mut self, now: u64) -> Vec<Finished> {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            if p.constraint.is_none() && now < p.kill.ts_ns.saturating_add(SETTLE_NS) {
                i += 1;
                continue;
            }
            let mut p = self.pending.swap_remove(i);
            p.kill.constraint = p.constraint.unwrap_or(Constraint::Unknown);
            p.kill.memcg = self.cgroups.get(&p.memcg_id).cloned();
            p.kill.container = self
                .containers
                .get(&p.kill.pid)
                .cloned()
                .or_else(|| p.kill.memcg.as_deref().and_then(container_of));
            if p.kill.rank.is_none() {
                p.kill.rank = self.ranks.get(&p.kill.pid).copied();
            }
            // Told at the kill's first record, before it settles.
            if let Some(i) = self.told.iter().rposition(|t| t.0 == p.kill.pid) {
                p.kill.verdict = self.told.remove(i).map(|t| t.1);
            }
            if self.done.len() == MAX_DONE {
                self.done.pop_front();
            }
            self.done.push_back((
                p.kill.pid,
                p.kill.ts_ns,
                p.kill.constraint,
                p.kill.trigger_pid,
                p.kill.trigger_comm.clone(),
            ));
            self.out.push(Finished::Kill(p.kill));
        }
        let waiting = std::mem::take(&mut self.waiting);
        for mut d in waiting {
            if self.pending.iter().any(|p| p.kill.pid == d.pid) {
                self.waiting.push(d);
            } else {
                self.oom_death(&mut d);
                self.out.push(Finished::Death(d));
            }
        }
        if let Some(g) = &mut self.gpu {
            g.forget_exited();
        }
        std::mem::take(&mut self.out)
    }

    pub fn job_memory(&self) -> JobMemory {
        JobMemory {
            added: self.sums[0],
            resident: self.sums[1],
            page_cache: self.sums[2],
        }
    }

    pub fn cgroup(&self) -> Option<&CgroupPressure> {
        self.cgroup.as_ref()
    }

    pub fn lost_total(&self) -> u64 {
        self.lost
    }

    /// (device, pinned) bytes the job's processes hold through CUDA.
    pub fn gpu_held(&self) -> (u64, u64) {
        self.gpu.as_ref().map_or((0, 0), |g| {
            let h = g.held_now();
            (h.device, h.pinned)
        })
    }
}

/// A container's short id from a cgroup path: Docker's, Podman's, or a
/// Kubernetes pod's container.
// The victim's own identity record names its container first (it
// resolves v1 and v2 and every process's paths); this reads the kill's
// memory cgroup path, for a victim the recorder read no identity of.
fn container_of(path: &str) -> Option<String> {
    match cgroup_path::parse(path) {
        cgroup_path::Origin::Docker { container_id, .. }
        | cgroup_path::Origin::Kubernetes {
            container_id: Some(container_id),
            ..
        } => Some(cgroup_path::short_id(&container_id).to_string()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "settle_tests.rs"]
mod tests;
