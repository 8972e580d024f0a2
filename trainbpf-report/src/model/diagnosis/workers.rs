//! A kill's worker processes, for the rules about workers
//! (`dataloader_cow`, `too_many_workers`): the job's children that were
//! forked and never exec'd, grouped under their parent, with what each
//! held and added at the kill.
//!
//! Figures are the kill's own: its growers (added and resident memory in
//! the window before it) and its ranking (everyone's resident memory at
//! it), so that a worker's growth after the kill is not blamed for it.

use crate::model::{Constraint, Kill, Process, Report};

/// One worker at the kill.
#[derive(Clone, Debug)]
pub(super) struct Worker<'a> {
    pub(super) proc: &'a Process,
    /// What it added in its own context in the kill's window (honest
    /// attribution), or, without the page probes, its resident memory
    /// beyond what it inherited.
    pub(super) added_kb: u64,
    /// Its resident memory at the kill, when known.
    pub(super) rss_kb: Option<u64>,
}

impl Worker<'_> {
    /// Of its added memory, how much is copies of pages it already
    /// mapped when it was forked: a copy-on-write break raises what a
    /// process added but not its resident memory, so added memory its
    /// resident memory did not grow by is copies. `None` when its
    /// resident memory at the kill or at its birth is unknown.
    pub(super) fn copied_kb(&self, inherited_kb: Option<u64>) -> Option<u64> {
        let inherited = inherited_kb?;
        let grew_beyond = self.rss_kb?.saturating_sub(inherited);
        Some(self.added_kb.saturating_sub(grew_beyond).min(inherited))
    }
}

/// A parent and its workers at one kill.
#[derive(Clone, Debug)]
pub(super) struct Workers<'a> {
    pub(super) kill: usize,
    pub(super) parent: &'a Process,
    /// The parent's resident memory at the kill (else its peak).
    pub(super) parent_kb: u64,
    /// Biggest added first.
    pub(super) workers: Vec<Worker<'a>>,
    /// The memory the kill's domain had: the memory cgroup's limit, or
    /// the machine's for a global OOM.
    pub(super) limit_kb: u64,
    /// Whether `limit_kb` is a cgroup's limit (else the machine's RAM).
    pub(super) cgroup_limit: bool,
    /// The recording counted each process's allocations (honest figures).
    pub(super) honest: bool,
}

impl Workers<'_> {
    pub(super) fn added_kb(&self) -> u64 {
        self.workers.iter().map(|w| w.added_kb).sum()
    }

    pub(super) fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.proc.pid).collect()
    }

    /// "limit" or "RAM", for titles.
    pub(super) fn limit_word(&self) -> &'static str {
        if self.cgroup_limit { "limit" } else { "RAM" }
    }

    /// The workers' parent runs Python, or its workers are PyTorch's.
    pub(super) fn is_python(&self) -> bool {
        let py = |s: &str| s.rsplit('/').next().unwrap_or(s).starts_with("python");
        self.workers.iter().any(|w| w.proc.comm == "pt_data_worker")
            || py(&self.parent.comm)
            || self.parent.exec.as_deref().is_some_and(py)
    }
}

/// The memory a kill's domain had, and whether it is a cgroup's limit.
pub(super) fn limit_of(report: &Report, kill: &Kill) -> Option<(u64, bool)> {
    if kill.constraint == Constraint::None {
        let m = report.header.mem_total_kb + report.header.swap_total_kb;
        return (m > 0).then_some((m, false));
    }
    let job_limit = report
        .job
        .as_ref()
        .filter(|j| j.cgroup.is_some() && j.cgroup == kill.memcg)
        .and_then(|j| j.memory_limit_bytes)
        .map(|b| b / 1024);
    kill.memcg_limit_kb
        .or(job_limit)
        .filter(|&l| l > 0)
        .map(|l| (l, true))
}

/// The workers of kill `idx`: the job's biggest family of at least two
/// children of one parent, under one name, that never exec'd and were
/// alive at the kill. A launcher's children that each play a part of
/// their own (named apart) are not workers. `None` for a kill outside
/// the job or without such a family.
pub(super) fn at_kill(report: &Report, idx: usize) -> Option<Workers<'_>> {
    let kill = report.kills.get(idx)?;
    if !kill.victim.in_job {
        return None;
    }
    let (limit_kb, cgroup_limit) = limit_of(report, kill)?;
    let alive = |p: &Process| {
        p.born_ns.is_some_and(|b| b <= kill.ts_ns) && p.died_ns.is_none_or(|d| d >= kill.ts_ns)
    };
    let find = |pid: u32, start_ns: u64| {
        report
            .processes
            .iter()
            .find(|p| p.pid == pid && p.start_ns == start_ns)
    };
    // Children by parent and name, among the living that never exec'd.
    let mut families: Vec<(&Process, Vec<&Process>)> = Vec::new();
    for p in report.processes.iter().filter(|p| p.exec.is_none()) {
        let Some(parent) = p.parent.and_then(|k| find(k.tgid, k.start_ns)) else {
            continue;
        };
        if !alive(p) {
            continue;
        }
        match families
            .iter_mut()
            .find(|(q, kids)| std::ptr::eq(*q, parent) && kids[0].comm == p.comm)
        {
            Some((_, kids)) => kids.push(p),
            None => families.push((parent, vec![p])),
        }
    }
    let (parent, kids) = families
        .into_iter()
        .filter(|(_, kids)| kids.len() >= 2)
        .max_by_key(|(_, kids)| kids.len())?;
    let ranked_rss = |pid: u32, start_ns: u64| {
        kill.ranking.as_ref().and_then(|r| {
            r.candidates
                .iter()
                .find(|c| c.pid == pid && c.start_ns == start_ns)
                .map(|c| c.rss_kb)
        })
    };
    let grower = |p: &Process| {
        kill.growers
            .iter()
            .find(|g| g.pid == p.pid && g.start_ns == p.start_ns)
    };
    let honest = report.header.attach.pages.is_some();
    let mut workers: Vec<Worker<'_>> = kids
        .into_iter()
        .map(|p| {
            let g = grower(p);
            let rss_kb = ranked_rss(p.pid, p.start_ns).or(g.map(|g| g.rss_kb));
            let added_kb = match g.and_then(|g| g.honest_kb) {
                Some(h) => h.max(0) as u64,
                None if honest => 0,
                None => rss_kb
                    .zip(p.parent_rss_at_fork_kb)
                    .map_or(0, |(r, i)| r.saturating_sub(i)),
            };
            Worker {
                proc: p,
                added_kb,
                rss_kb,
            }
        })
        .collect();
    workers.sort_by(|a, b| {
        b.added_kb
            .cmp(&a.added_kb)
            .then(a.proc.pid.cmp(&b.proc.pid))
    });
    let parent_kb = ranked_rss(parent.pid, parent.start_ns)
        .or(grower(parent).map(|g| g.rss_kb))
        .unwrap_or(parent.peak_rss_kb);
    Some(Workers {
        kill: idx,
        parent,
        parent_kb,
        workers,
        limit_kb,
        cgroup_limit,
        honest,
    })
}

/// `python3 (pid 700)`, `rank 0 (pid 700)` ([`Report::who`]).
pub(super) fn who(r: &Report, p: &Process) -> String {
    r.who(p.pid, p.start_ns, &p.comm)
}

/// `a, b, c` for up to `n` pids, then `and N more`.
pub(super) fn pid_list(pids: &[u32], n: usize) -> String {
    let mut s: Vec<String> = pids.iter().take(n).map(u32::to_string).collect();
    if pids.len() > n {
        s.push(format!("and {} more", pids.len() - n));
    }
    s.join(", ")
}

/// `part` as a whole percentage of `whole`.
pub(super) fn pct(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (part as u128 * 100 / whole as u128) as u64
}
