//! Views over the ledger's change points: the short text timeline and the
//! GPU memory around each host OOM kill.

use std::collections::HashMap;

use crate::decode::ProcKey;

use super::state::ProcState;
use super::{AtKill, CudaOom, GpuAtKill, Held, MAX_TIMELINE, SEC, TimelineRow};

/// Rows per process and second, plus contexts, OOMs and exits holding
/// memory; the largest steps when there are too many.
pub(super) fn timeline(
    procs: &[&ProcState],
    ooms: &[CudaOom],
    rss: &HashMap<ProcKey, Vec<(u64, u64)>>,
) -> (Vec<TimelineRow>, usize) {
    let rss_at = |key: ProcKey, ts: u64| -> Option<u64> {
        let v = rss.get(&key)?;
        let i = v.partition_point(|(t, _)| *t <= ts);
        (i > 0).then(|| v[i - 1].1)
    };
    let mut rows = Vec::new();
    for s in procs {
        let key = ProcKey {
            tgid: s.p.pid,
            start_ns: s.p.start_ns,
        };
        let comm = &s.p.comm;
        // A step row never spans a context or an OOM of the process, so the
        // rows read in order.
        let mut marks: Vec<u64> = s.p.contexts.iter().map(|c| c.ts_ns).collect();
        marks.extend(ooms.iter().filter(|o| o.pid == s.p.pid).map(|o| o.ts_ns));
        // The exit has a row of its own.
        marks.extend(s.p.exited_ns);
        let mut prev = Held::default();
        let mut i = 0;
        let h = &s.history;
        while i < h.len() {
            // One row for the changes within a second of the first.
            let from = h[i].0;
            let mut peak = h[i].1;
            let mut j = i;
            while j + 1 < h.len()
                && h[j + 1].0 < from + SEC
                && !marks.iter().any(|&m| m > h[j].0 && m <= h[j + 1].0)
            {
                j += 1;
                peak = max_held(peak, h[j].1);
            }
            let (ts, after) = h[j];
            let delta = [
                after.device as i64 - prev.device as i64,
                after.pinned as i64 - prev.pinned as i64,
                after.managed as i64 - prev.managed as i64,
            ];
            let exit = s.p.exited_ns == Some(ts) && prev != Held::default();
            if delta != [0; 3] {
                rows.push(TimelineRow {
                    ts_ns: from,
                    pid: s.p.pid,
                    comm: comm.clone(),
                    what: if exit && s.p.oom_killed {
                        "OOM-killed holding memory: freed with it".into()
                    } else if exit {
                        "exited holding memory: freed with it".into()
                    } else if j > i {
                        format!(
                            "{} changes in {} ms",
                            j - i + 1,
                            ts.saturating_sub(from).div_ceil(1_000_000)
                        )
                    } else {
                        "1 change".into()
                    },
                    delta,
                    held: after,
                    peak,
                    requested_bytes: None,
                    host_rss_kb: rss_at(key, ts),
                    notable: exit,
                });
            }
            prev = after;
            i = j + 1;
        }
        for c in &s.p.contexts {
            let mut what = format!("{} created a context", c.op.name());
            if let Some(d) = c.device {
                what.push_str(&format!(" on GPU {d}"));
            }
            rows.push(TimelineRow {
                ts_ns: c.ts_ns,
                pid: s.p.pid,
                comm: comm.clone(),
                what,
                delta: [0; 3],
                held: s.held_at(c.ts_ns),
                peak: s.held_at(c.ts_ns),
                requested_bytes: None,
                host_rss_kb: rss_at(key, c.ts_ns),
                notable: true,
            });
        }
    }
    for o in ooms {
        rows.push(TimelineRow {
            ts_ns: o.ts_ns,
            pid: o.pid,
            comm: o.comm.clone(),
            what: format!("{} failed: CUDA out of memory", o.op.name()),
            delta: [0; 3],
            held: o.held,
            peak: o.held,
            requested_bytes: Some(o.requested_bytes),
            host_rss_kb: rss_at(
                ProcKey {
                    tgid: o.pid,
                    start_ns: o.start_ns,
                },
                o.ts_ns,
            ),
            notable: true,
        });
    }
    let dropped = keep_largest(&mut rows);
    rows.sort_by_key(|r| (r.ts_ns, r.pid, r.notable));
    (rows, dropped)
}

/// Past [`MAX_TIMELINE`] rows, the largest steps stay (contexts, OOMs and
/// exits always do); returns how many steps were dropped.
fn keep_largest(rows: &mut Vec<TimelineRow>) -> usize {
    let mut dropped = 0;
    let steps = rows.iter().filter(|r| !r.notable).count();
    let notable = rows.len() - steps;
    if rows.len() > MAX_TIMELINE {
        let room = MAX_TIMELINE.saturating_sub(notable);
        let mut sizes: Vec<u64> = rows
            .iter()
            .filter(|r| !r.notable)
            .map(|r| r.delta.iter().map(|d| d.unsigned_abs()).sum())
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let cut = sizes
            .get(room.saturating_sub(1))
            .copied()
            .unwrap_or(u64::MAX);
        let mut kept = 0;
        rows.retain(|r| {
            if r.notable {
                return true;
            }
            let size: u64 = r.delta.iter().map(|d| d.unsigned_abs()).sum();
            let keep = room > 0 && size >= cut && kept < room;
            kept += usize::from(keep);
            dropped += usize::from(!keep);
            keep
        });
    }
    dropped
}

fn max_held(a: Held, b: Held) -> Held {
    Held {
        device: a.device.max(b.device),
        pinned: a.pinned.max(b.pinned),
        managed: a.managed.max(b.managed),
    }
}

/// GPU memory at a host OOM kill at `kill`, and how it moved over the
/// `window` before it.
pub(super) fn at_kill(procs: &[&ProcState], kill: u64, window: u64) -> GpuAtKill {
    let start = kill.saturating_sub(window);
    let mut processes: Vec<AtKill> = procs
        .iter()
        .filter_map(|s| {
            let at = s.held_at(kill);
            let before = s.held_at(start);
            let grew = [
                at.device as i64 - before.device as i64,
                at.pinned as i64 - before.pinned as i64,
                at.managed as i64 - before.managed as i64,
            ];
            (at != Held::default() || grew != [0; 3]).then(|| AtKill {
                pid: s.p.pid,
                comm: s.p.comm.clone(),
                held: at,
                grew,
            })
        })
        .collect();
    processes.sort_by(|a, b| {
        (b.held.pinned + b.held.device)
            .cmp(&(a.held.pinned + a.held.device))
            .then(a.pid.cmp(&b.pid))
    });
    let contexts = procs
        .iter()
        .flat_map(|s| {
            s.p.contexts
                .iter()
                .filter(|c| c.ts_ns >= start && c.ts_ns <= kill)
                .map(|c| (s.p.pid, s.p.comm.clone(), c.clone()))
        })
        .collect();
    GpuAtKill {
        kill_ts_ns: kill,
        window_ns: window,
        processes,
        contexts,
    }
}
