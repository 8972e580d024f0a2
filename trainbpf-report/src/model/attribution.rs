//! Honest attribution: who really added the memory.
//!
//! RSS counts a forked worker's inherited pages as its own, and counts
//! shared memory once per process that maps it. The kernel programs count
//! instead the pages each process allocates and frees in its own context,
//! so a fork adds nothing to the child, a copy-on-write break counts for
//! the process that breaks it, and shared memory counts once, for whoever
//! first touched it. Here those figures are grouped by role (DataLoader
//! workers, torchrun ranks, siblings with one command line), summed against
//! the job cgroup's usage, and set beside USS/PSS and the shared-memory
//! objects the recorder listed.

use std::{borrow::Cow, collections::HashMap};

use crate::decode::{
    CgroupPressure, Pressure, ProcInfo, ProcKey, ShmKind, ShmLook, ShmObject, Smaps, SmapsSample,
};

use super::{Grower, Track, timeline::Sample};

/// Processes playing one role, shown together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    /// "DataLoader workers", "torchrun ranks", or the shared command line.
    pub(crate) role: String,
    pub(crate) pids: Vec<u32>,
    pub(crate) honest_kb: i64,
    pub(crate) grew_kb: u64,
    /// The longest member span.
    pub(crate) window_ns: u64,
}

/// Per-process honest growth summed against the cgroup's own count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SumCheck {
    pub(crate) ts_ns: u64,
    /// The job cgroup's usage change over the span, kB.
    pub(crate) cgroup_delta_kb: i64,
    /// Sum of the job's processes' honest growth over the same span.
    pub(crate) attributed_kb: i64,
    /// `cgroup_delta_kb - attributed_kb`: page cache, kernel memory, growth
    /// of processes that exited.
    pub(crate) unattributed_kb: i64,
    /// Of which, from the cgroup's own statistics: page cache (shmem
    /// included) and kernel memory changes over the span.
    pub(crate) file_delta_kb: Option<i64>,
    pub(crate) kernel_delta_kb: Option<i64>,
    /// The cgroup's page cache, set apart; None where the cgroup's
    /// statistics were not read.
    pub(crate) page_cache: Option<CacheApart>,
}

/// The page cache in a job's cgroup, which is no process's growth: what
/// was there when the span began (a dataset read before the job, a previous
/// run's files), and how it moved, by the job's processes and otherwise
/// (read by processes outside the job but charged here, or reclaimed).
/// The honest growth is set against the cgroup's usage without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheApart {
    /// The cgroup's page cache (its file pages, shmem left out) at the
    /// span's start, kB.
    pub(crate) at_start_kb: i64,
    /// Its change over the span.
    pub(crate) delta_kb: i64,
    /// What the job's processes brought in, less what they removed, in
    /// their own context over the span (their `page_cache_kb`).
    pub(crate) job_kb: i64,
}

impl CacheApart {
    /// The rest of the change: page cache other processes brought in and
    /// the cgroup was charged for, less what reclaim took back.
    pub(crate) fn other_kb(&self) -> i64 {
        self.delta_kb - self.job_kb
    }
}

impl SumCheck {
    /// attributed / cgroup delta, 1.0 when they agree.
    pub(crate) fn ratio(&self) -> Option<f64> {
        ratio(self.attributed_kb, self.cgroup_delta_kb)
    }

    /// The cgroup's usage change without its page cache's: what the job's
    /// honest growth adds up to when nothing is missed.
    pub(crate) fn without_cache_kb(&self) -> Option<i64> {
        self.page_cache.map(|c| self.cgroup_delta_kb - c.delta_kb)
    }

    /// attributed / the change without page cache, 1.0 when they agree.
    pub(crate) fn ratio_without_cache(&self) -> Option<f64> {
        ratio(self.attributed_kb, self.without_cache_kb()?)
    }

    /// What no process accounts for, page cache apart: kernel memory,
    /// shmem no process of the job made, growth of processes that exited.
    pub(crate) fn unattributed_without_cache_kb(&self) -> Option<i64> {
        Some(self.without_cache_kb()? - self.attributed_kb)
    }
}

fn ratio(part: i64, whole: i64) -> Option<f64> {
    (whole != 0).then(|| part as f64 / whole as f64)
}

/// Role of a process, from what the recorder saw of it.
pub(super) fn role(comm: &str, info: Option<&ProcInfo>) -> Option<String> {
    if comm == "pt_data_worker" {
        return Some("DataLoader workers".into());
    }
    if info.is_some_and(|i| i.rank.is_some() || i.local_rank.is_some()) {
        return Some("torchrun ranks".into());
    }
    None
}

#[derive(Default)]
pub(super) struct Attribution {
    info: HashMap<u32, ProcInfo>,
    /// A forked process's parent, until it execs: the recorder reads no
    /// command line at a fork (a fork runs its parent's program, and a node
    /// forking a thousand times a second must not cost a /proc read each),
    /// so the child's is its parent's.
    forked: HashMap<u32, u32>,
    smaps: HashMap<u32, Smaps>,
    pub(crate) smaps_rounds: u64,
    pub(crate) smaps_cost_us: u64,
    /// Shared-memory objects by (kind, filesystem, id), as last seen,
    /// with their peak resident size and most mappers.
    shm: HashMap<(ShmKind, u64, u64), ShmObject>,
    /// /dev/shm filesystems over the run, and what looking cost.
    shm_fs: super::shm::ShmBuilder,
    /// The job cgroup's first sample and the sum check at its peak usage.
    first: Option<(u64, Pressure)>,
    pub(crate) peak: Option<SumCheck>,
    peak_usage_kb: u64,
}

/// Job processes kept in full detail; beyond this, only growth sums.
const MAX_INFO: usize = 4096;
/// Shared-memory objects followed; the report lists the biggest 50.
const MAX_SHM: usize = 16384;
/// Forks followed back to a parent's command line (8 bytes each).
const MAX_FORKED: usize = 1 << 16;
/// Forks of forks followed up to this many generations.
const MAX_FORK_DEPTH: usize = 16;

impl Attribution {
    pub(super) fn on_proc_info(&mut self, i: ProcInfo) {
        if self.info.len() < MAX_INFO || self.info.contains_key(&i.tgid) {
            self.info.insert(i.tgid, i);
        }
    }

    /// A fork: `child` runs its parent's program until it execs. What was
    /// read of an earlier process under its pid is not this one's.
    pub(super) fn on_fork(&mut self, child: u32, parent: u32) {
        self.info.remove(&child);
        if self.forked.len() < MAX_FORKED || self.forked.contains_key(&child) {
            self.forked.insert(child, parent);
        }
    }

    /// An exec: its own command line is read there.
    pub(super) fn on_exec(&mut self, pid: u32) {
        self.forked.remove(&pid);
    }

    pub(super) fn on_smaps(&mut self, s: SmapsSample) {
        self.smaps_rounds += 1;
        self.smaps_cost_us += s.cost_us;
        for p in s.procs {
            if self.smaps.len() < MAX_INFO || self.smaps.contains_key(&p.tgid) {
                self.smaps.insert(p.tgid, p);
            }
        }
    }

    pub(super) fn on_shm(&mut self, ts: u64, look: ShmLook) {
        self.shm_fs.observe(ts, &look);
        for o in look.objects {
            let key = (o.kind, o.dev, o.id);
            if !self.shm.contains_key(&key) && self.shm.len() >= MAX_SHM {
                continue;
            }
            let e = self.shm.entry(key).or_insert_with(|| o.clone());
            let peak = e.resident_kb.max(o.resident_kb);
            let owner = e.owner_tgid.or(o.owner_tgid);
            // After its processes exit an object is mapped by none: the
            // most seen at once says who shared it.
            let mappers = e.mappers.max(o.mappers);
            *e = o;
            e.resident_kb = peak;
            e.owner_tgid = owner;
            e.mappers = mappers;
        }
    }

    pub(super) fn shm_report(&self) -> super::shm::ShmReport {
        self.shm_fs.finish()
    }

    pub(super) fn smaps_of(&self, tgid: u32) -> Option<&Smaps> {
        self.smaps.get(&tgid)
    }

    /// Its command line and rank as read, or, for a fork that did not
    /// exec, its parent's command line (no rank: the rank is the
    /// parent's own, and its forked helpers are not ranks).
    pub(super) fn info_of(&self, tgid: u32) -> Option<Cow<'_, ProcInfo>> {
        if let Some(i) = self.info.get(&tgid) {
            return Some(Cow::Borrowed(i));
        }
        let mut pid = tgid;
        for _ in 0..MAX_FORK_DEPTH {
            pid = *self.forked.get(&pid)?;
            if let Some(i) = self.info.get(&pid) {
                return Some(Cow::Owned(ProcInfo {
                    tgid,
                    cmdline: i.cmdline.clone(),
                    rank: None,
                    local_rank: None,
                    ppid: None,
                }));
            }
        }
        None
    }

    /// Shared-memory objects seen, biggest first, each once.
    pub(super) fn shm_objects(&self) -> Vec<ShmObject> {
        let mut v: Vec<ShmObject> = self.shm.values().cloned().collect();
        v.sort_by(|a, b| b.resident_kb.cmp(&a.resident_kb).then(a.id.cmp(&b.id)));
        v.truncate(50);
        v
    }

    /// At each new peak of the job cgroup's usage, sums the job processes'
    /// honest growth since the first sample against it.
    pub(super) fn on_pressure(&mut self, ts: u64, p: &Pressure, tracks: &HashMap<ProcKey, Track>) {
        let Some(cg) = &p.cgroup else { return };
        if self.first.is_none() {
            self.first = Some((ts, p.clone()));
        }
        if cg.usage_kb <= self.peak_usage_kb {
            return;
        }
        self.peak_usage_kb = cg.usage_kb;
        let Some((t0, first)) = &self.first else {
            return;
        };
        let growth = |t: &Track, f: fn(&Sample) -> i64| {
            let end = t.at_or_before(ts)?;
            let base = t.at_or_before(*t0).map_or(0, |b| f(&b));
            Some(f(&end) - base)
        };
        let attributed = tracks
            .values()
            .filter(|t| t.in_job && t.died_ns.is_none())
            .filter_map(|t| growth(t, |s| s.net_kb))
            .sum();
        // Page cache outlives the process that read it in: the dead's
        // count too (as long as their tracks are kept).
        let cache = tracks
            .values()
            .filter(|t| t.in_job)
            .filter_map(|t| growth(t, |s| s.cache_kb))
            .sum();
        self.peak = Some(sum_check(ts, first, p, attributed, cache));
    }
}

/// Compares `attributed` with the cgroup's change from `from` to `to`,
/// and sets the page cache apart, `job_cache` of it the job processes'.
pub(super) fn sum_check(
    ts: u64,
    from: &Pressure,
    to: &Pressure,
    attributed: i64,
    job_cache: i64,
) -> SumCheck {
    let (a, b) = (from.cgroup.as_ref(), to.cgroup.as_ref());
    let delta = |f: fn(&CgroupPressure) -> u64| Some(f(b?) as i64 - f(a?) as i64);
    let cgroup_delta_kb = delta(|c| c.usage_kb).unwrap_or(0);
    let page_cache = a.zip(b).map(|(a, b)| CacheApart {
        at_start_kb: a.page_cache_kb() as i64,
        delta_kb: b.page_cache_kb() as i64 - a.page_cache_kb() as i64,
        job_kb: job_cache,
    });
    SumCheck {
        ts_ns: ts,
        cgroup_delta_kb,
        attributed_kb: attributed,
        unattributed_kb: cgroup_delta_kb - attributed,
        file_delta_kb: delta(|c| c.file_kb),
        kernel_delta_kb: delta(|c| c.kernel_kb),
        page_cache,
    }
}

/// Groups the job's growers by role; groups of one are left out.
pub(super) fn groups(growers: &[Grower], roles: impl Fn(&Grower) -> Option<String>) -> Vec<Group> {
    let mut by: HashMap<String, Group> = HashMap::new();
    for g in growers.iter().filter(|g| g.in_job) {
        let Some(role) = roles(g) else { continue };
        let e = by.entry(role.clone()).or_insert_with(|| Group {
            role,
            pids: Vec::new(),
            honest_kb: 0,
            grew_kb: 0,
            window_ns: 0,
        });
        e.pids.push(g.pid);
        e.honest_kb += g.honest_kb.unwrap_or(0);
        e.grew_kb += g.grew_kb;
        e.window_ns = e.window_ns.max(g.window_ns);
    }
    let mut v: Vec<Group> = by.into_values().filter(|g| g.pids.len() >= 2).collect();
    for g in &mut v {
        g.pids.sort_unstable();
    }
    // The role last: groups come out of a hash map, and equal figures
    // must not be ordered by its seed (the report is the recording's).
    v.sort_by(|a, b| {
        b.honest_kb
            .cmp(&a.honest_kb)
            .then(b.grew_kb.cmp(&a.grew_kb))
            .then_with(|| a.role.cmp(&b.role))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grower(pid: u32, comm: &str, honest: i64, rss: u64) -> Grower {
        Grower {
            pid,
            start_ns: 1,
            comm: comm.into(),
            grew_kb: rss,
            honest_kb: Some(honest),
            window_ns: 40_000_000_000,
            rate_kb_per_s: None,
            rss_kb: rss,
            in_job: true,
            born_in_window: false,
            is_victim: false,
        }
    }

    #[test]
    fn dataloader_workers_form_one_group() {
        let g = vec![
            grower(10, "pt_data_worker", 600 << 10, 2 << 20),
            grower(11, "pt_data_worker", 600 << 10, 2 << 20),
            grower(12, "pt_data_worker", 500 << 10, 2 << 20),
            grower(13, "pt_data_worker", 600 << 10, 2 << 20),
            grower(1, "python3", 100, 100),
        ];
        let groups = groups(&g, |g| role(&g.comm, None));
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].role, "DataLoader workers");
        assert_eq!(groups[0].pids, vec![10, 11, 12, 13]);
        assert_eq!(groups[0].honest_kb, 2300 << 10);
    }

    // Groups of equal figures came out in the hash map's order, which
    // changes from one run of `report` to the next.
    #[test]
    fn groups_of_equal_growth_come_out_in_one_order() {
        let g: Vec<Grower> = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .enumerate()
            .flat_map(|(i, comm)| {
                let pid = 10 * (i as u32 + 1);
                [grower(pid, comm, 0, 0), grower(pid + 1, comm, 0, 0)]
            })
            .collect();
        // Each map gets its own seed: many tries see many orders.
        for _ in 0..50 {
            let roles: Vec<String> = groups(&g, |g| Some(g.comm.clone()))
                .into_iter()
                .map(|g| g.role)
                .collect();
            assert_eq!(roles, ["a", "b", "c", "d", "e", "f"]);
        }
    }

    #[test]
    fn sum_check_against_the_cgroup() {
        let cg = |usage_kb, file_kb| Pressure {
            cgroup: Some(CgroupPressure {
                usage_kb,
                file_kb,
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = sum_check(5, &cg(1000, 100), &cg(101_000, 3100), 95_000, 0);
        assert_eq!(s.cgroup_delta_kb, 100_000);
        assert_eq!(s.unattributed_kb, 5000);
        assert_eq!(s.file_delta_kb, Some(3000));
        assert!((s.ratio().unwrap() - 0.95).abs() < 1e-9);
        assert_eq!(s.without_cache_kb(), Some(97_000));
    }

    /// Four writers copy 1 GiB each in a cgroup that
    /// held 3 GiB of page cache (read in by the job's `cat`) at its limit:
    /// most of that cache is reclaimed while they write. The cache is set
    /// apart, and the writers' growth adds up to the rest.
    #[test]
    fn page_cache_is_set_apart_from_the_sum_check() {
        const GIB: u64 = 1 << 20;
        let cg = |usage_kb, file_kb, shmem_kb| Pressure {
            cgroup: Some(CgroupPressure {
                usage_kb,
                file_kb,
                shmem_kb,
                ..Default::default()
            }),
            ..Default::default()
        };
        // At the start: an empty cgroup but for 64 MiB of shmem and 100 MiB
        // of cache another run left. At the peak: 5 GiB of anonymous
        // memory, the shmem, and 700 MiB left of the cat's 3 GiB.
        let from = cg(164 << 10, 164 << 10, 64 << 10);
        let to = cg(5 * GIB + (764 << 10), 764 << 10, 64 << 10);
        let s = sum_check(5, &from, &to, 5 * GIB as i64, 3 * GIB as i64);
        let c = s.page_cache.unwrap();
        assert_eq!(c.at_start_kb, 100 << 10);
        assert_eq!(c.delta_kb, 600 << 10);
        assert_eq!(c.job_kb, 3 * GIB as i64);
        assert_eq!(c.other_kb(), (600 << 10) - 3 * GIB as i64, "reclaimed");
        // Counted against the job, the cache read 0.89; set apart, 1.0.
        assert!((s.ratio().unwrap() - 0.895).abs() < 0.001);
        assert_eq!(s.ratio_without_cache(), Some(1.0));
        assert_eq!(s.unattributed_without_cache_kb(), Some(0));
        // Without the cgroup's statistics, nothing to set apart.
        let none = sum_check(5, &Pressure::default(), &to, 1, 1);
        assert_eq!((none.page_cache, none.ratio_without_cache()), (None, None));
    }
}
