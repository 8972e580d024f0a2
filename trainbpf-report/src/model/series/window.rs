//! The window before each kill: the processes that grew, the victim and the
//! OOM killer's other candidates, and the memory around them, taken from the
//! model's per-process tracks when the kill closes, at [`WINDOW_POINTS`]
//! columns, so its resolution does not depend on the length of the run.

use std::collections::{HashMap, VecDeque};

use crate::decode::ProcKey;
use crate::model::{Kill, Track};

use super::line::Pick;
use super::{WINDOW_GROWERS, WINDOW_LINES, WINDOW_POINTS};

/// The window before one kill, at [`WINDOW_POINTS`] columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KillWindow {
    pub(crate) kill_ns: u64,
    pub(crate) start_ns: u64,
    /// Column `i` covers `[start + i·step, start + (i+1)·step)`.
    pub(crate) step_ns: u64,
    pub(crate) victim_pid: u32,
    /// The victim and the top growers, most growth first.
    pub(crate) lines: Vec<WindowLine>,
    /// MemAvailable, the lowest sample per column (kB).
    pub(crate) mem_available: Vec<Option<u64>>,
    pub(crate) mem_total_kb: Option<u64>,
    /// The job cgroup's usage, the highest sample per column (kB).
    pub(crate) cgroup_usage: Vec<Option<u64>>,
    pub(crate) cgroup_limit_kb: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WindowLine {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    /// What the chart calls it (`Report::name`): its comm, or its rank.
    pub(crate) name: String,
    pub(crate) in_job: bool,
    pub(crate) is_victim: bool,
    /// First among the kill's growers.
    pub(crate) is_top_grower: bool,
    /// Resident memory per column (kB); `None` before it was seen.
    pub(crate) points: Vec<Option<u64>>,
}

/// One pressure sample, kept for the windows before kills.
#[derive(Clone, Copy, Debug)]
pub(super) struct Recent {
    pub(super) ts: u64,
    pub(super) available_kb: u64,
    pub(super) usage_kb: Option<u64>,
}

/// The window before kill `k`, from the model's `tracks` and the `recent`
/// pressure samples; nothing before `origin_ns` (the first event) was
/// recorded. `mem_total_kb`: the last MemTotal seen, for a kill without
/// its own pressure sample.
pub(super) fn window(
    k: &Kill,
    origin_ns: u64,
    tracks: &HashMap<ProcKey, Track>,
    recent: &VecDeque<Recent>,
    mem_total_kb: Option<u64>,
) -> KillWindow {
    let victim = k.victim.key();
    let top = k.growers.first().map(|g| ProcKey {
        tgid: g.pid,
        start_ns: g.start_ns,
    });
    let kill = k.ts_ns;
    // Nothing was recorded before the first event: a window reaching
    // back past it would chart blank columns.
    let start = kill
        .saturating_sub(k.window_ns)
        .max(origin_ns)
        .min(kill.saturating_sub(1));
    let window = kill - start;
    let step = (window / WINDOW_POINTS as u64).max(1);
    let end = start + step * WINDOW_POINTS as u64;

    let lines = charted(k)
        .into_iter()
        .map(|(key, comm, in_job)| {
            let mut samples: Vec<(u64, u64)> = tracks
                .get(&key)
                .map(|t| t.samples.iter().map(|s| (s.ts, s.kb)).collect())
                .unwrap_or_default();
            let is_victim = key == victim;
            if is_victim {
                // What the kill record reports is the figure at the kill.
                samples.push((kill, k.victim.rss.resident_kb()));
            }
            WindowLine {
                pid: key.tgid,
                start_ns: key.start_ns,
                comm: comm.to_string(),
                name: comm.to_string(),
                in_job,
                is_victim,
                is_top_grower: Some(key) == top,
                points: columns(&samples, start, step, WINDOW_POINTS, kill, Pick::Max),
            }
        })
        .collect();
    let avail: Vec<(u64, u64)> = recent.iter().map(|r| (r.ts, r.available_kb)).collect();
    let usage: Vec<(u64, u64)> = recent
        .iter()
        .filter_map(|r| Some((r.ts, r.usage_kb?)))
        .collect();
    let limit = k
        .pressure
        .as_ref()
        .and_then(|p| p.cgroup_limit_kb)
        .or(k.memcg_limit_kb)
        .filter(|_| !usage.is_empty());
    KillWindow {
        kill_ns: kill,
        start_ns: start,
        step_ns: step,
        victim_pid: k.victim.pid,
        lines,
        mem_available: columns(&avail, start, step, WINDOW_POINTS, end, Pick::Min),
        mem_total_kb: k
            .pressure
            .as_ref()
            .map(|p| p.mem_total_kb)
            .filter(|&t| t > 0)
            .or(mem_total_kb),
        cgroup_usage: columns(&usage, start, step, WINDOW_POINTS, end, Pick::Max),
        cgroup_limit_kb: limit,
    }
}

/// Who grew, who was killed, and who else the OOM killer weighed: the top
/// growers, the victim, then the highest badness, then the other growers;
/// at most [`WINDOW_LINES`], each once.
fn charted(k: &Kill) -> Vec<(ProcKey, &str, bool)> {
    fn add<'a>(
        key: ProcKey,
        comm: &'a str,
        in_job: bool,
        chosen: &mut Vec<(ProcKey, &'a str, bool)>,
    ) {
        if chosen.len() < WINDOW_LINES && !chosen.iter().any(|(k, ..)| *k == key) {
            chosen.push((key, comm, in_job));
        }
    }
    let mut chosen: Vec<(ProcKey, &str, bool)> = Vec::new();
    for g in k.growers.iter().take(WINDOW_GROWERS) {
        let key = ProcKey {
            tgid: g.pid,
            start_ns: g.start_ns,
        };
        add(key, &g.comm, g.in_job, &mut chosen);
    }
    add(k.victim.key(), &k.victim.comm, k.victim.in_job, &mut chosen);
    let candidates = k.ranking.iter().flat_map(|r| &r.candidates);
    for c in candidates {
        let key = ProcKey {
            tgid: c.pid,
            start_ns: c.start_ns,
        };
        add(key, &c.comm, c.in_job, &mut chosen);
    }
    for g in k.growers.iter().skip(WINDOW_GROWERS) {
        let key = ProcKey {
            tgid: g.pid,
            start_ns: g.start_ns,
        };
        add(key, &g.comm, g.in_job, &mut chosen);
    }
    chosen
}

/// Samples `(ts, kb)` (any order) resampled to `n` columns of `step` from
/// `start`: per column the `pick` of its samples, else the value carried
/// from the last sample before it; `None` before the first sample and after
/// `until`.
fn columns(
    samples: &[(u64, u64)],
    start: u64,
    step: u64,
    n: usize,
    until: u64,
    pick: Pick,
) -> Vec<Option<u64>> {
    let mut s = samples.to_vec();
    s.sort_by_key(|&(t, _)| t);
    let mut carry = None;
    let mut j = 0;
    while j < s.len() && s[j].0 < start {
        carry = Some(s[j].1);
        j += 1;
    }
    let mut out = Vec::with_capacity(n);
    for c in 0..n as u64 {
        let c0 = start + c * step;
        let c1 = c0 + step;
        let mut v: Option<u64> = None;
        // The last column takes the rest up to `until`: the kill's own
        // instant, which the integer step can leave just past `c1`.
        while j < s.len() && (s[j].0 < c1 || (c + 1 == n as u64 && s[j].0 <= c1.max(until))) {
            let x = s[j].1;
            v = Some(match (v, pick) {
                (None, _) => x,
                (Some(a), Pick::Min) => a.min(x),
                (Some(a), Pick::Max) => a.max(x),
                (Some(_), Pick::Last) => x,
            });
            carry = Some(x);
            j += 1;
        }
        out.push(if c0 > until { None } else { v.or(carry) });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_columns_carry_and_stop_after_the_kill() {
        let w = columns(&[(15, 3), (5, 1)], 10, 10, 3, 25, Pick::Max);
        assert_eq!(w, vec![Some(3), Some(3), None]);
    }
}
