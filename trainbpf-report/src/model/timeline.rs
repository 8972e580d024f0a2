//! Each process's memory over time: only the samples a kill's window can
//! still ask for, and one baseline before them (see the module docs of
//! `model`).

use std::collections::{HashSet, VecDeque};

use crate::decode::ProcKey;

use super::{Builder, MemoryUser};

/// The largest memory users kept for the report.
const TOP_MEMORY: usize = 10;

#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    pub(super) ts: u64,
    pub(super) kb: u64,
    /// The OOM killer's other inputs, as of this sample.
    pub(super) swap_kb: u64,
    pub(super) pgtables_kb: u64,
    pub(super) adj: i32,
    pub(super) memcg_id: u64,
    /// Allocated minus freed in the process's own context, kB: the honest
    /// measure, which a fork does not move and a copy-on-write break does.
    pub(super) net_kb: i64,
    /// Page cache added minus removed in its context, kB: not growth.
    pub(super) cache_kb: i64,
}

impl Sample {
    pub(super) fn at(ts: u64, kb: u64) -> Sample {
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
pub(super) struct Track {
    pub(super) comm: String,
    pub(super) in_job: bool,
    pub(super) samples: VecDeque<Sample>,
    pub(super) died_ns: Option<u64>,
    pub(super) peak_kb: u64,
    /// Its last exec: a fork of a large parent holds the parent's pages
    /// until it execs, and that is not the new program's memory.
    pub(super) exec_ns: Option<u64>,
}

impl Track {
    /// Inserts in time order (the ring buffer is per-CPU, so records can
    /// arrive slightly out of order), then drops samples older than the
    /// last one at or before `horizon`: that one stays as the baseline.
    pub(super) fn push(&mut self, s: Sample, horizon: u64) {
        let pos = self
            .samples
            .iter()
            .rposition(|o| o.ts <= s.ts)
            .map_or(0, |i| i + 1);
        self.samples.insert(pos, s);
        while self.samples.len() >= 2 && self.samples[1].ts <= horizon {
            self.samples.pop_front();
        }
        if s.ts >= self.exec_ns.unwrap_or(0) {
            self.peak_kb = self.peak_kb.max(s.kb);
        }
    }

    /// The peak counts from the exec on; samples from after it that came
    /// in before it (per-CPU rings) still count.
    pub(super) fn on_exec(&mut self, ts: u64) {
        self.exec_ns = Some(ts);
        self.peak_kb = self
            .samples
            .iter()
            .filter(|s| s.ts >= ts)
            .map(|s| s.kb)
            .max()
            .unwrap_or(0);
    }

    pub(super) fn at_or_before(&self, t: u64) -> Option<Sample> {
        self.samples.iter().rev().find(|s| s.ts <= t).copied()
    }

    pub(super) fn first_after(&self, t: u64) -> Option<Sample> {
        self.samples.iter().find(|s| s.ts > t).copied()
    }
}

impl Builder {
    /// Drops the tracks of processes dead for longer than the window.
    pub(super) fn sweep(&mut self) {
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
}

impl Builder {
    /// The largest peak resident memory seen, any process, dead or alive.
    pub(super) fn top_memory_users(&mut self) -> Vec<MemoryUser> {
        let mut top = std::mem::take(&mut self.retired);
        top.extend(self.tracks.iter().map(|(key, t)| MemoryUser {
            pid: key.tgid,
            start_ns: key.start_ns,
            comm: t.comm.clone(),
            peak_rss_kb: t.peak_kb,
            in_job: t.in_job,
        }));
        top_memory(&mut top);
        top
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
