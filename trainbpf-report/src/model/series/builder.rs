//! The streaming side of the whole-run series: fed every event by the
//! model, it keeps the lines bounded as the module docs describe.

use crate::decode::MemSample;
use std::collections::{HashMap, VecDeque};

use crate::decode::{Event, ProcKey, Timed};
use crate::model::grid::{Grid, KeyMap};
use crate::model::{Kill, Process, SETTLE_NS, Track};

use super::line::Line;
use super::procs::{Folded, ProcLine, came_and_went};
use super::window::{self, KillWindow, Recent};
use super::{BUCKETS, MAX_DONE, MAX_LIVE_JOB, MAX_OUTSIDE, MAX_WINDOWS, Series};

/// The streaming side: fed every event by the model, bounded as described
/// in the module docs.
#[derive(Debug, Default)]
pub(in crate::model) struct Builder {
    window_ns: u64,
    grid: Grid,
    started: bool,
    now: u64,
    live_job: KeyMap<ProcLine>,
    done: Vec<ProcLine>,
    outside: KeyMap<ProcLine>,
    folded: Folded,
    uncharted_job: u64,
    uncharted_outside: u64,
    /// Victims named by OOM records, pinned as soon as they are known.
    victims: Vec<ProcKey>,
    mem_available: Line,
    mem_total_kb: Option<u64>,
    cgroup_usage: Line,
    cgroup_limit: Line,
    recent: VecDeque<Recent>,
    windows: Vec<KillWindow>,
    windows_dropped: u64,
}

impl Builder {
    pub(in crate::model) fn new(window_ns: u64) -> Builder {
        Builder {
            window_ns,
            ..Builder::default()
        }
    }

    /// Widens the grid until `ts` fits.
    fn advance(&mut self, ts: u64) {
        if !self.started {
            self.started = true;
            self.grid.origin_ns = ts;
        }
        self.now = self.now.max(ts);
        self.grid.cover(self.now, BUCKETS);
    }

    pub(in crate::model) fn observe(&mut self, t: &Timed) {
        self.advance(t.ts_ns);
        let ts = t.ts_ns;
        match &t.event {
            Event::Fork {
                child,
                parent,
                comm,
                ..
            } => {
                if let Some(p) = self.job_line(*child, comm) {
                    p.parent = Some(*parent);
                    p.born_ns = Some(ts);
                }
            }
            Event::Exec { proc, comm, .. } => {
                if let Some(p) = self.job_line(*proc, comm) {
                    p.comm.clone_from(comm);
                    p.on_exec(ts);
                }
            }
            Event::Exit { proc, comm, .. } => {
                if let Some(mut p) = self.live_job.remove(proc) {
                    p.died_ns = Some(ts);
                    // The newest name: a worker renames itself after fork.
                    p.comm.clone_from(comm);
                    self.retire(p);
                }
            }
            Event::Mem(MemSample {
                proc,
                in_job,
                rss,
                comm,
                ..
            }) => {
                let kb = rss.resident_kb();
                if *in_job || self.live_job.contains_key(proc) {
                    let grid = self.grid;
                    if let Some(p) = self.job_line(*proc, comm) {
                        if p.comm != *comm {
                            p.comm.clone_from(comm);
                        }
                        p.push(&grid, ts, kb);
                    }
                } else {
                    self.outside_sample(*proc, comm, ts, kb);
                }
            }
            Event::Oom(rec) => {
                let mut key = rec.victim;
                if key.start_ns == 0 {
                    // The classic tracepoint has no start time: the live
                    // job process with that pid.
                    if let Some(k) = self.live_job.keys().find(|k| k.tgid == key.tgid) {
                        key = *k;
                    }
                }
                if !self.victims.contains(&key) && self.victims.len() < 4 * MAX_WINDOWS {
                    self.victims.push(key);
                }
                // The kill record's figures are the victim's last and
                // often its largest: the memory probe's last sample can be
                // a threshold behind.
                let kb = rec.rss.resident_kb();
                let grid = self.grid;
                for p in self
                    .live_job
                    .get_mut(&key)
                    .into_iter()
                    .chain(self.outside.get_mut(&key))
                    .chain(self.done.iter_mut().filter(|p| p.key() == key))
                {
                    p.oom_killed = true;
                    p.pinned = true;
                    if kb > 0 {
                        p.push(&grid, ts, kb);
                    }
                }
            }
            Event::Pressure(p) => {
                let grid = self.grid;
                self.mem_available.push(&grid, ts, p.mem_available_kb);
                if p.mem_total_kb > 0 {
                    self.mem_total_kb = Some(p.mem_total_kb);
                }
                let usage = p.cgroup.as_ref().map(|c| c.usage_kb);
                if let Some(c) = &p.cgroup {
                    self.cgroup_usage.push(&grid, ts, c.usage_kb);
                    if let Some(l) = c.limit_kb {
                        self.cgroup_limit.push(&grid, ts, l);
                    }
                }
                self.recent.push_back(Recent {
                    ts,
                    available_kb: p.mem_available_kb,
                    usage_kb: usage,
                });
                // A kill closes SETTLE_NS after it; keep its window and one
                // sample before it, with room for records out of order.
                let keep_from = ts.saturating_sub(self.window_ns + 4 * SETTLE_NS);
                while self.recent.len() >= 2 && self.recent[1].ts <= keep_from {
                    self.recent.pop_front();
                }
            }
            _ => {}
        }
    }

    /// The line of a job process, made on first sight; `None` past the
    /// bound on live job lines.
    fn job_line(&mut self, key: ProcKey, comm: &str) -> Option<&mut ProcLine> {
        if !self.live_job.contains_key(&key) {
            if self.live_job.len() >= MAX_LIVE_JOB {
                self.uncharted_job += 1;
                return None;
            }
            // A recycled pid: the older process is gone even if its exit
            // went unrecorded.
            if key.start_ns != 0 {
                let stale: Vec<ProcKey> = self
                    .live_job
                    .keys()
                    .filter(|k| k.tgid == key.tgid && k.start_ns != 0 && k.start_ns < key.start_ns)
                    .copied()
                    .collect();
                for k in stale {
                    if let Some(mut p) = self.live_job.remove(&k) {
                        p.died_ns.get_or_insert(key.start_ns);
                        self.retire(p);
                    }
                }
            }
            // The job's root can report before the kernel marks it as the
            // job's: its line so far is kept, now as a job process.
            let mut p = match self.outside.remove(&key) {
                Some(mut p) => {
                    p.in_job = true;
                    p
                }
                None => ProcLine::new(key, comm.to_string(), true),
            };
            p.pinned |= self.victims.contains(&key);
            self.live_job.insert(key, p);
        }
        self.live_job.get_mut(&key)
    }

    /// A process outside the job: charted only while among the largest.
    fn outside_sample(&mut self, key: ProcKey, comm: &str, ts: u64, kb: u64) {
        let grid = self.grid;
        if let Some(p) = self.outside.get_mut(&key) {
            p.push(&grid, ts, kb);
            if p.comm != comm {
                p.comm = comm.to_string();
            }
            return;
        }
        if self.outside.len() >= MAX_OUTSIDE {
            let smallest = self
                .outside
                .iter()
                .filter(|(_, p)| !p.pinned)
                .min_by_key(|(k, p)| (p.peak_kb, **k))
                .map(|(k, p)| (*k, p.peak_kb));
            match smallest {
                Some((k, peak)) if kb > peak => {
                    self.outside.remove(&k);
                    self.uncharted_outside += 1;
                }
                _ => {
                    // Never charted at all; it is counted once, when it is
                    // first seen, as close as streaming allows.
                    return;
                }
            }
        }
        let mut p = ProcLine::new(key, comm.to_string(), false);
        p.pinned = self.victims.contains(&key);
        p.push(&grid, ts, kb);
        self.outside.insert(key, p);
    }

    /// An ended job process: kept if among the largest, else folded.
    fn retire(&mut self, p: ProcLine) {
        self.done.push(p);
        let unpinned = self.done.iter().filter(|p| !p.pinned).count();
        if unpinned > MAX_DONE {
            let (i, _) = self
                .done
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.pinned)
                .min_by_key(|(_, p)| (p.peak_kb, p.pid))
                .expect("more than MAX_DONE unpinned");
            let small = self.done.swap_remove(i);
            self.folded.fold(&self.grid, small);
        }
    }

    /// A kill has closed (its growers known): pin its victim and top grower,
    /// and keep the window before it from the model's tracks.
    pub(in crate::model) fn on_kill(&mut self, k: &Kill, tracks: &HashMap<ProcKey, Track>) {
        let victim = k.victim.key();
        let top = k.growers.first().map(|g| ProcKey {
            tgid: g.pid,
            start_ns: g.start_ns,
        });
        for key in [Some(victim), top].into_iter().flatten() {
            for p in self
                .live_job
                .get_mut(&key)
                .into_iter()
                .chain(self.outside.get_mut(&key))
            {
                p.pinned = true;
            }
            for p in self.done.iter_mut().filter(|p| p.key() == key) {
                p.pinned = true;
            }
        }
        if self.windows.len() >= MAX_WINDOWS {
            self.windows_dropped += 1;
            return;
        }
        let w = window::window(
            k,
            self.grid.origin_ns,
            tracks,
            &self.recent,
            self.mem_total_kb,
        );
        self.windows.push(w);
    }

    pub(in crate::model) fn finish(
        mut self,
        processes: &[Process],
        short: &crate::model::ShortLived,
    ) -> Series {
        let grid = self.grid;
        let mut procs: Vec<ProcLine> = self
            .live_job
            .into_values()
            .chain(self.done)
            .chain(self.outside.into_values())
            .collect();
        // A job process's latest name and parentage are the model's.
        let by_key: HashMap<ProcKey, &Process> = processes
            .iter()
            .map(|p| {
                (
                    ProcKey {
                        tgid: p.pid,
                        start_ns: p.start_ns,
                    },
                    p,
                )
            })
            .collect();
        for p in &mut procs {
            p.rss.rescale(grid.width_ns);
            if let Some(m) = by_key.get(&p.key()) {
                if !m.comm.is_empty() {
                    p.comm.clone_from(&m.comm);
                }
                p.parent = p.parent.or(m.parent);
                p.born_ns = p.born_ns.or(m.born_ns);
                p.died_ns = p.died_ns.or(m.died_ns);
                p.oom_killed |= m.oom_killed;
            }
        }
        procs.sort_by(|a, b| b.peak_kb.cmp(&a.peak_kb).then(a.pid.cmp(&b.pid)));
        self.folded.rss.rescale(grid.width_ns);
        for l in [
            &mut self.mem_available,
            &mut self.cgroup_usage,
            &mut self.cgroup_limit,
        ] {
            l.rescale(grid.width_ns);
        }
        self.windows.sort_by_key(|w| w.kill_ns);
        Series {
            grid,
            procs,
            folded: self.folded,
            uncharted_job: self.uncharted_job,
            uncharted_outside: self.uncharted_outside,
            mem_available: self.mem_available,
            mem_total_kb: self.mem_total_kb,
            cgroup_usage: self.cgroup_usage,
            cgroup_limit: self.cgroup_limit,
            windows: self.windows,
            windows_dropped: self.windows_dropped,
            came_and_went: came_and_went(processes.iter()),
            came_and_went_long: came_and_went(
                processes
                    .iter()
                    .filter(|p| !short.contains(p.pid, p.start_ns)),
            ),
        }
    }
}
