//! Who grew before a kill: each process's growth over the kill's window,
//! the OOM killer's ranking rebuilt from tracked memory, and the job's
//! honest growth summed against its cgroup's.

use super::timeline::{Sample, Track};
use super::{
    Builder, Constraint, Kill, Ranking, SEC, SumCheck, TotalSource, attribution, badness, ns_to_s,
};
use crate::decode::ProcKey;

pub(super) const TOP_GROWERS: usize = 10;

/// Job processes always listed among a kill's growers, however busy the
/// rest of the machine was.
pub(super) const TOP_JOB_GROWERS: usize = 10;

#[derive(Clone, Debug, PartialEq)]
pub struct Grower {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    /// Growth of resident memory (RSS), as the kernel counts it.
    pub(crate) grew_kb: u64,
    /// Memory allocated minus freed in the process's own context over the
    /// same span: what it really added. None when the recording has no page
    /// allocation probes.
    pub(crate) honest_kb: Option<i64>,
    /// From the baseline (or birth) to the last sample before the kill.
    pub(crate) window_ns: u64,
    /// `None` when the growth spans under a second: a jump, not a rate.
    pub(crate) rate_kb_per_s: Option<f64>,
    /// Resident memory at the kill.
    pub(crate) rss_kb: u64,
    pub(crate) in_job: bool,
    /// Born inside the window: its growth counts from zero.
    pub(crate) born_in_window: bool,
    pub(crate) is_victim: bool,
}

/// A process considered for a kill's growers, with its memory at the kill.
pub(super) struct Candidate<'a> {
    pub(super) key: ProcKey,
    pub(super) track: Option<&'a Track>,
    pub(super) end: Sample,
    pub(super) comm: &'a str,
    pub(super) in_job: bool,
    pub(super) is_victim: bool,
}

impl Builder {
    /// The candidates the OOM killer weighed: the kill's domain (the memcg
    /// for a memcg OOM, the machine otherwise), alive at the kill, with
    /// their last sample before it.
    pub(super) fn rank(&self, k: &Kill) -> Ranking {
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
    pub(super) fn outside_oom_memcg(&self, oom_memcg: Option<&str>, memcg_id: u64) -> bool {
        if memcg_id == 0 {
            return false;
        }
        let (Some(oom), Some(path)) = (oom_memcg, self.cgroups.get(&memcg_id)) else {
            return false;
        };
        let oom = oom.trim_end_matches('/');
        !(oom.is_empty() || path == oom || path.starts_with(&format!("{oom}/")))
    }

    pub(super) fn growers(&self, k: &Kill, oom_memcg: Option<&str>) -> Vec<Grower> {
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

    /// The job's honest growth over the kill's window against the job
    /// cgroup's usage change: the kernel's own usage at the kill where its
    /// log gave it, else the last sample.
    pub(super) fn kill_sum_check(&self, k: &Kill) -> Option<SumCheck> {
        let start = k.ts_ns.saturating_sub(self.window);
        let from = self.pressure.around(start)?;
        let mut to = self.pressure.around(k.ts_ns)?.clone();
        if let (Some(u), Some(cg)) = (k.memcg_usage_kb, to.cgroup.as_mut())
            && k.constraint == Constraint::Memcg
        {
            cg.usage_kb = u;
        }
        from.cgroup.as_ref()?;
        let growth = |key: &ProcKey, t: &Track, f: fn(&Sample) -> i64| {
            let end = t.at_or_before(k.ts_ns)?;
            let base = match t.at_or_before(start) {
                Some(b) => f(&b),
                None if self.born_ns(*key).is_some_and(|b| b >= start) => 0,
                None => f(&t.first_after(start)?),
            };
            Some(f(&end) - base)
        };
        let job = |key: &ProcKey, t: &Track| t.in_job || *key == k.victim.key();
        let attributed = self
            .tracks
            .iter()
            .filter(|(key, t)| job(key, t) && t.died_ns.is_none_or(|d| d > k.ts_ns))
            .filter_map(|(key, t)| growth(key, t, |s| s.net_kb))
            .sum();
        // The page cache of those that died in the window is still there.
        let cache = self
            .tracks
            .iter()
            .filter(|(key, t)| job(key, t))
            .filter_map(|(key, t)| growth(key, t, |s| s.cache_kb))
            .sum();
        Some(attribution::sum_check(
            k.ts_ns, from, &to, attributed, cache,
        ))
    }

    /// Growth of one process from the window's start to `end`.
    ///
    /// The baseline is the last sample at or before the window's start. A
    /// process born inside the window grew from nothing. A process that was
    /// alive before the window but first reported inside it (the recorder
    /// started late, or it sat below the threshold) counts from its first
    /// sample: the memory it already had is not growth we saw.
    pub(super) fn growth(&self, c: Candidate<'_>, start: u64) -> Option<Grower> {
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
}

/// The machine's top growers, plus the job's own top ten and the victim
/// even when a busy machine (a compiler, another job) outgrew them: those
/// are the lines the user came for.
pub(super) fn keep_top(mut out: Vec<Grower>) -> Vec<Grower> {
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
