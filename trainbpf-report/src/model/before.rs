//! The pressure before a kill: how the machine and the job's cgroup got
//! there, from the recorder's once-a-second samples.

use std::collections::VecDeque;

use crate::decode::Pressure;

/// Samples kept: the window's worth plus one baseline before it.
#[derive(Default)]
pub(super) struct History {
    samples: VecDeque<(u64, Pressure)>,
}

impl History {
    pub(super) fn push(&mut self, ts: u64, p: Pressure, horizon: u64) {
        self.samples.push_back((ts, p));
        while self.samples.len() >= 2 && self.samples[1].0 <= horizon {
            self.samples.pop_front();
        }
    }

    /// The sample in force at `t`, else the first after it.
    pub(super) fn around(&self, t: u64) -> Option<&Pressure> {
        self.samples
            .iter()
            .rev()
            .find(|(s, _)| *s <= t)
            .or_else(|| self.samples.iter().find(|(s, _)| *s >= t))
            .map(|(_, p)| p)
    }

    /// Summarises `[start, kill]`.
    pub(super) fn before(&self, start: u64, kill: u64) -> Option<PressureBefore> {
        let at_kill = self.samples.iter().rev().find(|(t, _)| *t <= kill)?;
        let base = self
            .samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= start)
            .or_else(|| self.samples.iter().find(|(t, _)| *t >= start))?;
        let inside = self
            .samples
            .iter()
            .filter(|(t, _)| *t >= base.0 && *t <= kill);
        let (k, b) = (&at_kill.1, &base.1);
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Some(PressureBefore {
            span_ns: kill.saturating_sub(base.0),
            available_start_kb: b.mem_available_kb,
            available_at_kill_kb: k.mem_available_kb,
            available_min_kb: inside.map(|(_, p)| p.mem_available_kb).min().unwrap_or(0),
            mem_total_kb: k.mem_total_kb,
            swap_used_kb: d(k.swap_total_kb, k.swap_free_kb),
            swap_total_kb: k.swap_total_kb,
            shmem_kb: k.shmem_kb,
            committed_as_kb: k.committed_as_kb,
            commit_limit_kb: k.commit_limit_kb,
            overcommit_memory: k.overcommit_memory,
            cgroup_usage_kb: k.cgroup.as_ref().map(|c| c.usage_kb),
            cgroup_limit_kb: k.cgroup.as_ref().and_then(|c| c.limit_kb),
            cgroup_max_events: match (&k.cgroup, &b.cgroup) {
                (Some(k), Some(b)) => Some(d(k.max_events, b.max_events)),
                _ => None,
            },
            psi_some_avg10: k.psi.as_ref().map(|p| p.some_avg10),
            psi_full_avg10: k.psi.as_ref().map(|p| p.full_avg10),
            psi_some_stall_ms: match (&k.psi, &b.psi) {
                (Some(k), Some(b)) => Some(d(k.some_total_us, b.some_total_us) / 1000),
                _ => None,
            },
            stall_ms: [0, 1, 2].map(|i| d(k.stall_ns[i], b.stall_ns[i]) / 1_000_000),
            stalls: [0, 1, 2].map(|i| d(k.stall_count[i], b.stall_count[i])),
            reclaim_freed_kb: d(k.reclaim_freed_kb, b.reclaim_freed_kb),
        })
    }
}

/// What the samples say about the run-up to one kill.
#[derive(Clone, Debug, PartialEq)]
pub struct PressureBefore {
    /// From the baseline sample to the kill.
    pub(crate) span_ns: u64,
    pub(crate) available_start_kb: u64,
    pub(crate) available_at_kill_kb: u64,
    pub(crate) available_min_kb: u64,
    pub(crate) mem_total_kb: u64,
    pub(crate) swap_used_kb: u64,
    pub(crate) swap_total_kb: u64,
    pub(crate) shmem_kb: u64,
    pub(crate) committed_as_kb: u64,
    pub(crate) commit_limit_kb: u64,
    pub(crate) overcommit_memory: Option<u32>,
    pub(crate) cgroup_usage_kb: Option<u64>,
    pub(crate) cgroup_limit_kb: Option<u64>,
    /// Times the cgroup hit its limit in the window.
    pub(crate) cgroup_max_events: Option<u64>,
    pub(crate) psi_some_avg10: Option<f64>,
    pub(crate) psi_full_avg10: Option<f64>,
    /// PSI "some" stall time accumulated in the window.
    pub(crate) psi_some_stall_ms: Option<u64>,
    /// Stall time in the window, all tasks: direct reclaim, memcg reclaim,
    /// compaction.
    pub(crate) stall_ms: [u64; 3],
    pub(crate) stalls: [u64; 3],
    /// What the job's threads freed inside reclaim or compaction in the
    /// window (kB): other processes' memory and cache, not charged to them.
    pub(crate) reclaim_freed_kb: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(avail_mb: u64, stall_ms: u64) -> Pressure {
        Pressure {
            mem_total_kb: 16 << 20,
            mem_available_kb: avail_mb * 1024,
            stall_ns: [stall_ms * 1_000_000, 0, 0],
            stall_count: [stall_ms, 0, 0],
            ..Default::default()
        }
    }

    #[test]
    fn fall_of_available_memory_and_stalls_in_the_window() {
        let s = 1_000_000_000;
        let mut h = History::default();
        for (i, (avail, stall)) in [(9000, 0), (8000, 0), (4000, 100), (500, 3300), (100, 3400)]
            .into_iter()
            .enumerate()
        {
            h.push(i as u64 * 10 * s, p(avail, stall), 0);
        }
        let b = h.before(10 * s, 40 * s).unwrap();
        assert_eq!(b.available_start_kb, 8000 * 1024);
        assert_eq!(b.available_at_kill_kb, 100 * 1024);
        assert_eq!(b.available_min_kb, 100 * 1024);
        assert_eq!(b.span_ns, 30 * s);
        assert_eq!(b.stall_ms[0], 3400);
    }

    #[test]
    fn history_keeps_one_baseline_before_the_horizon() {
        let mut h = History::default();
        for t in 0..100u64 {
            h.push(t, p(1, 0), t.saturating_sub(10));
        }
        assert!(h.samples.len() <= 12, "{}", h.samples.len());
    }
}
