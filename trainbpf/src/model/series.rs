//! Memory over the whole run, for charts: per process, for the machine and
//! for the job's cgroup, plus a finer view of the window before each kill.
//!
//! The rest of the model keeps only a window's worth of samples; charts need
//! the whole run, and a 24-hour recording holds millions of samples. So every
//! line here lives on one shared time grid of at most [`BUCKETS`] buckets:
//! when the run outgrows the grid, the bucket width doubles and each line
//! merges its buckets pairwise (lazily, the next time it is touched). A bucket
//! keeps the min, max and last value it saw, so a peak is never averaged
//! away. Memory is therefore bounded by the number of lines, and that is
//! bounded too:
//!
//! - job processes alive now: each its own line, up to [`MAX_LIVE_JOB`];
//! - job processes that ended: the [`MAX_DONE`] with the largest peaks keep
//!   their lines; the rest (the DataLoader workers re-spawned every epoch)
//!   are folded into one line, the largest of them at each time, and
//!   counted;
//! - processes outside the job: the [`MAX_OUTSIDE`] largest peaks, counted
//!   when pushed out;
//! - kill victims and each kill's top grower are never folded away.
//!
//! The window before a kill is taken from the model's per-process tracks when
//! the kill closes, at [`WINDOW_POINTS`] columns, so its resolution does not
//! depend on the length of the run.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::decode::{Event, ProcKey, Timed};

use super::{Kill, Process, SETTLE_NS, Track};

/// Buckets per line at most; the width doubles to stay under it.
pub const BUCKETS: u32 = 512;
/// Width of a bucket until the run outgrows the grid: fine enough that a
/// 20-second test run still has 400 buckets.
const FIRST_WIDTH_NS: u64 = 50_000_000;
/// Columns of the window before each kill.
pub const WINDOW_POINTS: usize = 240;
/// Job processes alive at once that get their own line; more at once (a
/// fork bomb) are counted, not charted.
const MAX_LIVE_JOB: usize = 256;
/// Ended job processes that keep their own line, by peak.
const MAX_DONE: usize = 48;
/// Processes outside the job that keep a line, by peak.
const MAX_OUTSIDE: usize = 8;
/// Processes charted in a kill's window: its top growers, the victim, and
/// the OOM killer's other top candidates.
const WINDOW_LINES: usize = 6;
const WINDOW_GROWERS: usize = 3;
/// Kills whose window is kept; an OOM storm must not grow memory without
/// bound. The rest are counted.
const MAX_WINDOWS: usize = 64;

/// A multiply-rotate hasher for the per-event lookups by [`ProcKey`]: keys
/// are pids and start times, not attacker-chosen strings, and SipHash showed
/// in profiles of a 24-hour report.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type KeyMap<V> = HashMap<ProcKey, V, BuildHasherDefault<KeyHasher>>;

/// Min, max and last value seen in one bucket (kB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub min_kb: u64,
    pub max_kb: u64,
    pub last_kb: u64,
}

impl Bucket {
    fn of(kb: u64) -> Bucket {
        Bucket {
            min_kb: kb,
            max_kb: kb,
            last_kb: kb,
        }
    }

    /// `later` follows `self` in time.
    fn merge(&mut self, later: Bucket) {
        self.min_kb = self.min_kb.min(later.min_kb);
        self.max_kb = self.max_kb.max(later.max_kb);
        self.last_kb = later.last_kb;
    }

    /// Which of the three a chart wants.
    pub fn pick(&self, p: Pick) -> u64 {
        match p {
            Pick::Min => self.min_kb,
            Pick::Max => self.max_kb,
            Pick::Last => self.last_kb,
        }
    }
}

/// Which value of a bucket to chart: a process's memory by its max (the
/// peak is what the OOM killer saw), available memory by its min.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    Min,
    Max,
    Last,
}

/// The run's time grid: bucket `i` covers `[origin + i·width, origin + (i+1)·width)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub origin_ns: u64,
    pub width_ns: u64,
}

impl Default for Grid {
    fn default() -> Self {
        Grid {
            origin_ns: 0,
            width_ns: FIRST_WIDTH_NS,
        }
    }
}

impl Grid {
    fn index(&self, ts: u64) -> u32 {
        // Records a little out of order before the first event land in the
        // first bucket.
        (ts.saturating_sub(self.origin_ns) / self.width_ns).min(u32::MAX as u64) as u32
    }

    /// Start of bucket `i`.
    pub fn time(&self, i: u32) -> u64 {
        self.origin_ns + i as u64 * self.width_ns
    }
}

/// One value over time, on the grid; only buckets with a sample are stored,
/// so a short-lived process costs a few buckets, not [`BUCKETS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    width_ns: u64,
    /// Ascending bucket index.
    buckets: Vec<(u32, Bucket)>,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            width_ns: FIRST_WIDTH_NS,
            buckets: Vec::new(),
        }
    }
}

impl Line {
    fn push(&mut self, grid: &Grid, ts: u64, kb: u64) {
        self.rescale(grid.width_ns);
        self.add(grid.index(ts), Bucket::of(kb));
    }

    fn add(&mut self, idx: u32, b: Bucket) {
        match self.buckets.last_mut() {
            Some((i, last)) if *i == idx => last.merge(b),
            Some((i, _)) if *i > idx => {
                // Per-CPU ring buffers deliver slightly out of order.
                match self.buckets.binary_search_by_key(&idx, |(i, _)| *i) {
                    Ok(p) => {
                        let cur = &mut self.buckets[p].1;
                        cur.min_kb = cur.min_kb.min(b.min_kb);
                        cur.max_kb = cur.max_kb.max(b.max_kb);
                    }
                    Err(p) => self.buckets.insert(p, (idx, b)),
                }
            }
            _ => self.buckets.push((idx, b)),
        }
    }

    /// Merges buckets to the grid's (larger, power-of-two multiple) width.
    fn rescale(&mut self, width_ns: u64) {
        if self.width_ns >= width_ns {
            return;
        }
        let shift = (width_ns / self.width_ns).trailing_zeros();
        self.width_ns = width_ns;
        let mut out: Vec<(u32, Bucket)> = Vec::with_capacity(self.buckets.len());
        for &(i, b) in &self.buckets {
            let j = i >> shift;
            match out.last_mut() {
                Some((k, last)) if *k == j => last.merge(b),
                _ => out.push((j, b)),
            }
        }
        self.buckets = out;
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// (bucket start, bucket), in time order.
    pub fn points<'a>(&'a self, grid: &'a Grid) -> impl Iterator<Item = (u64, Bucket)> + 'a {
        self.buckets.iter().map(|&(i, b)| (grid.time(i), b))
    }

    pub fn first_ns(&self, grid: &Grid) -> Option<u64> {
        self.buckets.first().map(|&(i, _)| grid.time(i))
    }

    /// Largest max over the whole line.
    pub fn max_kb(&self) -> u64 {
        self.buckets
            .iter()
            .map(|(_, b)| b.max_kb)
            .max()
            .unwrap_or(0)
    }

    /// The line resampled to `n` columns over `[from, to)`: per column the
    /// `pick` of its buckets; a column without a sample carries the last
    /// value before it (memory holds between samples). `None` before the
    /// first sample and from `until` on (the process had ended).
    pub fn columns(
        &self,
        grid: &Grid,
        from: u64,
        to: u64,
        n: usize,
        pick: Pick,
        until: Option<u64>,
    ) -> Vec<Option<u64>> {
        let mut out = Vec::with_capacity(n);
        if n == 0 || to <= from {
            return out;
        }
        let span = to - from;
        let mut j = 0;
        let mut carry: Option<u64> = None;
        for c in 0..n {
            let c0 = from + (span as u128 * c as u128 / n as u128) as u64;
            let c1 = from + (span as u128 * (c + 1) as u128 / n as u128) as u64;
            let mut v: Option<u64> = None;
            // Buckets that start before the column ends and end after it
            // starts overlap it; a bucket wider than a column feeds several.
            while j < self.buckets.len() && grid.time(self.buckets[j].0) + grid.width_ns <= c0 {
                carry = Some(self.buckets[j].1.last_kb);
                j += 1;
            }
            let mut k = j;
            while k < self.buckets.len() && grid.time(self.buckets[k].0) < c1.max(c0 + 1) {
                let b = self.buckets[k].1;
                let x = b.pick(pick);
                v = Some(match (v, pick) {
                    (None, _) => x,
                    (Some(a), Pick::Min) => a.min(x),
                    (Some(a), Pick::Max) => a.max(x),
                    (Some(_), Pick::Last) => x,
                });
                k += 1;
            }
            let ended = until.is_some_and(|u| c0 >= u);
            out.push(if ended { None } else { v.or(carry) });
        }
        out
    }
}

/// One process's memory (resident: anon + file + shmem) over the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcLine {
    pub pid: u32,
    pub start_ns: u64,
    pub comm: String,
    pub in_job: bool,
    pub parent: Option<ProcKey>,
    /// Its fork, when recorded.
    pub born_ns: Option<u64>,
    /// Its exit, when recorded (job processes only).
    pub died_ns: Option<u64>,
    pub peak_kb: u64,
    pub peak_ns: u64,
    pub oom_killed: bool,
    pub rss: Line,
    /// A kill's victim or top grower: never folded into "others".
    pub pinned: bool,
}

impl ProcLine {
    fn new(key: ProcKey, comm: String, in_job: bool) -> ProcLine {
        ProcLine {
            pid: key.tgid,
            start_ns: key.start_ns,
            comm,
            in_job,
            parent: None,
            born_ns: None,
            died_ns: None,
            peak_kb: 0,
            peak_ns: 0,
            oom_killed: false,
            rss: Line::default(),
            pinned: false,
        }
    }

    pub fn key(&self) -> ProcKey {
        ProcKey {
            tgid: self.pid,
            start_ns: self.start_ns,
        }
    }

    fn push(&mut self, grid: &Grid, ts: u64, kb: u64) {
        self.rss.push(grid, ts, kb);
        if kb > self.peak_kb {
            self.peak_kb = kb;
            self.peak_ns = ts;
        }
    }

    /// Columns of its memory, `None` outside its life.
    pub fn columns(&self, grid: &Grid, from: u64, to: u64, n: usize) -> Vec<Option<u64>> {
        self.rss.columns(grid, from, to, n, Pick::Max, self.died_ns)
    }
}

/// Job processes folded into one line: per bucket, the largest of them.
///
/// Not their sum: on a long run a bucket spans several generations of
/// workers that never lived at the same time, and summing their maxima would
/// invent memory no one held. The cgroup's usage line gives the total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    pub count: u64,
    /// Per bucket, the largest folded process (min, max and last each the
    /// largest of theirs).
    pub rss: Line,
    /// The largest single peak among them.
    pub peak_kb: u64,
}

impl Folded {
    fn fold(&mut self, grid: &Grid, p: ProcLine) {
        self.count += 1;
        self.peak_kb = self.peak_kb.max(p.peak_kb);
        self.rss.rescale(grid.width_ns);
        let mut rss = p.rss;
        rss.rescale(grid.width_ns);
        // A process holds its memory between samples: fill the gaps so that
        // the line does not dip where one of them happened not to report.
        let mut prev: Option<(u32, u64)> = None;
        let mut add = Vec::new();
        for &(i, b) in &rss.buckets {
            if let Some((pi, last)) = prev {
                for gap in pi + 1..i {
                    add.push((gap, Bucket::of(last)));
                }
            }
            add.push((i, b));
            prev = Some((i, b.last_kb));
        }
        let merged = envelope(&self.rss.buckets, &add);
        self.rss.buckets = merged;
    }
}

/// Two lines merged, bucket by bucket, into the larger of each value.
fn envelope(a: &[(u32, Bucket)], b: &[(u32, Bucket)]) -> Vec<(u32, Bucket)> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let take_a = j >= b.len() || (i < a.len() && a[i].0 < b[j].0);
        let take_b = i >= a.len() || (j < b.len() && b[j].0 < a[i].0);
        if take_a {
            out.push(a[i]);
            i += 1;
        } else if take_b {
            out.push(b[j]);
            j += 1;
        } else {
            let (x, y) = (a[i].1, b[j].1);
            out.push((
                a[i].0,
                Bucket {
                    min_kb: x.min_kb.max(y.min_kb),
                    max_kb: x.max_kb.max(y.max_kb),
                    last_kb: x.last_kb.max(y.last_kb),
                },
            ));
            i += 1;
            j += 1;
        }
    }
    out
}

/// The window before one kill, at [`WINDOW_POINTS`] columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillWindow {
    pub kill_ns: u64,
    pub start_ns: u64,
    /// Column `i` covers `[start + i·step, start + (i+1)·step)`.
    pub step_ns: u64,
    pub victim_pid: u32,
    /// The victim and the top growers, most growth first.
    pub lines: Vec<WindowLine>,
    /// MemAvailable, the lowest sample per column (kB).
    pub mem_available: Vec<Option<u64>>,
    pub mem_total_kb: Option<u64>,
    /// The job cgroup's usage, the highest sample per column (kB).
    pub cgroup_usage: Vec<Option<u64>>,
    pub cgroup_limit_kb: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowLine {
    pub pid: u32,
    pub start_ns: u64,
    pub comm: String,
    pub in_job: bool,
    pub is_victim: bool,
    /// First among the kill's growers.
    pub is_top_grower: bool,
    /// Resident memory per column (kB); `None` before it was seen.
    pub points: Vec<Option<u64>>,
}

/// Job processes of one name that were born and ended during the run
/// (e.g. `pt_data_worker ×96`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Churn {
    pub comm: String,
    pub count: u64,
    pub shortest_ns: u64,
    pub longest_ns: u64,
    /// The largest peak among them.
    pub peak_kb: u64,
}

/// Memory over the whole run; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    pub grid: Grid,
    /// Processes with their own line, largest peak first.
    pub procs: Vec<ProcLine>,
    /// Ended job processes folded together.
    pub folded: Folded,
    /// Job processes never charted: more than [`MAX_LIVE_JOB`] alive at once.
    pub uncharted_job: u64,
    /// Processes outside the job pushed out of the chart by larger ones.
    pub uncharted_outside: u64,
    /// The machine's MemAvailable (kB).
    pub mem_available: Line,
    pub mem_total_kb: Option<u64>,
    /// The job cgroup's usage and limit (kB).
    pub cgroup_usage: Line,
    pub cgroup_limit: Line,
    /// One per kill, in time order; at most [`MAX_WINDOWS`].
    pub windows: Vec<KillWindow>,
    /// Kills past [`MAX_WINDOWS`], without a window.
    pub windows_dropped: u64,
    /// Job processes that were born and ended while recording, by name,
    /// most numerous first.
    pub came_and_went: Vec<Churn>,
}

impl Series {
    /// The window of the kill at `kill_ns`, if one was kept.
    pub fn window(&self, k: &Kill) -> Option<&KillWindow> {
        self.windows
            .iter()
            .find(|w| w.kill_ns == k.ts_ns && w.victim_pid == k.victim.pid)
    }

    /// The charted line of a process, if it has one.
    pub fn proc(&self, pid: u32, start_ns: u64) -> Option<&ProcLine> {
        self.procs
            .iter()
            .find(|p| p.pid == pid && (p.start_ns == start_ns || start_ns == 0))
    }

    /// Processes with a line, job processes first, then by peak.
    pub fn job_first(&self) -> Vec<&ProcLine> {
        let mut v: Vec<&ProcLine> = self.procs.iter().collect();
        v.sort_by(|a, b| {
            b.in_job
                .cmp(&a.in_job)
                .then(b.peak_kb.cmp(&a.peak_kb))
                .then(a.pid.cmp(&b.pid))
        });
        v
    }
}

/// One pressure sample, kept for the windows before kills.
#[derive(Clone, Copy, Debug)]
struct Recent {
    ts: u64,
    available_kb: u64,
    usage_kb: Option<u64>,
}

/// The streaming side: fed every event by the model, bounded as described
/// in the module docs.
#[derive(Debug, Default)]
pub(super) struct Builder {
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
    pub(super) fn new(window_ns: u64) -> Builder {
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
        while self.now.saturating_sub(self.grid.origin_ns) >= BUCKETS as u64 * self.grid.width_ns {
            self.grid.width_ns *= 2;
        }
    }

    pub(super) fn observe(&mut self, t: &Timed) {
        self.advance(t.ts_ns);
        let ts = t.ts_ns;
        match &t.event {
            Event::Fork {
                child,
                parent,
                comm,
            } => {
                if let Some(p) = self.job_line(*child, comm) {
                    p.parent = Some(*parent);
                    p.born_ns = Some(ts);
                }
            }
            Event::Exec { proc, comm, .. } => {
                if let Some(p) = self.live_job.get_mut(proc) {
                    p.comm.clone_from(comm);
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
            Event::Mem {
                proc,
                in_job,
                rss,
                comm,
                ..
            } => {
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
    pub(super) fn on_kill(&mut self, k: &Kill, tracks: &HashMap<ProcKey, Track>) {
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
        let kill = k.ts_ns;
        // Nothing was recorded before the first event: a window reaching
        // back past it would chart blank columns.
        let start = kill
            .saturating_sub(k.window_ns)
            .max(self.grid.origin_ns)
            .min(kill.saturating_sub(1));
        let window = kill - start;
        let step = (window / WINDOW_POINTS as u64).max(1);
        let end = start + step * WINDOW_POINTS as u64;

        // Who grew, who was killed, and who else the OOM killer weighed:
        // the top growers, the victim, then the highest badness.
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
        add(victim, &k.victim.comm, k.victim.in_job, &mut chosen);
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
        let lines = chosen
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
                    in_job,
                    is_victim,
                    is_top_grower: Some(key) == top,
                    points: columns(&samples, start, step, WINDOW_POINTS, kill, Pick::Max),
                }
            })
            .collect();
        let avail: Vec<(u64, u64)> = self.recent.iter().map(|r| (r.ts, r.available_kb)).collect();
        let usage: Vec<(u64, u64)> = self
            .recent
            .iter()
            .filter_map(|r| Some((r.ts, r.usage_kb?)))
            .collect();
        let limit = k
            .pressure
            .as_ref()
            .and_then(|p| p.cgroup_limit_kb)
            .or(k.memcg_limit_kb)
            .filter(|_| !usage.is_empty());
        self.windows.push(KillWindow {
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
                .or(self.mem_total_kb),
            cgroup_usage: columns(&usage, start, step, WINDOW_POINTS, end, Pick::Max),
            cgroup_limit_kb: limit,
        });
    }

    pub(super) fn finish(mut self, processes: &[Process]) -> Series {
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
            came_and_went: came_and_went(processes),
        }
    }
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

/// Job processes born and ended while recording, grouped by name.
fn came_and_went(processes: &[Process]) -> Vec<Churn> {
    let mut by: HashMap<&str, Churn> = HashMap::new();
    for p in processes {
        // The job's root has no parent: its life is the run's, not churn.
        let (Some(born), Some(died), Some(_)) = (p.born_ns, p.died_ns, p.parent) else {
            continue;
        };
        let life = died.saturating_sub(born);
        let c = by.entry(p.comm.as_str()).or_insert_with(|| Churn {
            comm: p.comm.clone(),
            count: 0,
            shortest_ns: u64::MAX,
            longest_ns: 0,
            peak_kb: 0,
        });
        c.count += 1;
        c.shortest_ns = c.shortest_ns.min(life);
        c.longest_ns = c.longest_ns.max(life);
        c.peak_kb = c.peak_kb.max(p.peak_rss_kb);
    }
    let mut v: Vec<Churn> = by.into_values().collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then(a.comm.cmp(&b.comm)));
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decode::{Rss, Timed};

    const SEC: u64 = 1_000_000_000;

    fn mem(ts: u64, tgid: u32, start_ns: u64, kb: u64, in_job: bool) -> Timed {
        Timed {
            ts_ns: ts,
            event: Event::Mem {
                proc: ProcKey { tgid, start_ns },
                in_job,
                comm: format!("p{tgid}"),
                rss: Rss {
                    anon_kb: kb,
                    ..Rss::default()
                },
                faults: 0,
                reason: 0,
                oom_score_adj: 0,
                pgtables_kb: 0,
                memcg_id: 0,
                stall_ns: 0,
                alloc_kb: 0,
                freed_kb: 0,
                cache_kb: 0,
            },
        }
    }

    fn exit(ts: u64, tgid: u32, start_ns: u64) -> Timed {
        Timed {
            ts_ns: ts,
            event: Event::Exit {
                proc: ProcKey { tgid, start_ns },
                comm: "pt_data_worker".into(),
                exit_code: 0,
                group_exit_code: 0,
            },
        }
    }

    #[test]
    fn a_day_of_samples_stays_within_the_grid() {
        let mut b = Builder::new(60 * SEC);
        // One sample a second for a day, rising: the grid must widen and
        // the line keep at most BUCKETS buckets, with the peak intact.
        for s in 0..86_400u64 {
            b.observe(&mem(s * SEC, 1, 1, s, true));
        }
        let series = b.finish(&[]);
        let p = &series.procs[0];
        assert!(p.rss.len() <= BUCKETS as usize, "{}", p.rss.len());
        assert!(p.rss.len() > BUCKETS as usize / 4, "{}", p.rss.len());
        assert_eq!(p.rss.max_kb(), 86_399);
        assert_eq!(p.peak_kb, 86_399);
        assert!(series.grid.width_ns * BUCKETS as u64 > 86_399 * SEC);
    }

    #[test]
    fn rescaling_keeps_min_max_last() {
        let mut l = Line::default();
        let mut g = Grid {
            origin_ns: 0,
            width_ns: 10,
        };
        l.width_ns = 10;
        for (t, v) in [(0, 5), (5, 9), (10, 1), (15, 3)] {
            l.push(&g, t, v);
        }
        g.width_ns = 20;
        l.rescale(g.width_ns);
        assert_eq!(
            l.buckets,
            vec![(
                0,
                Bucket {
                    min_kb: 1,
                    max_kb: 9,
                    last_kb: 3
                }
            )]
        );
    }

    #[test]
    fn hundreds_of_workers_fold_into_one_line() {
        let mut b = Builder::new(60 * SEC);
        // 8 workers per "epoch" of 100 s for 100 epochs, each growing to a
        // different peak, on recycled pids.
        for epoch in 0..100u64 {
            for w in 0..8u64 {
                let pid = 1000 + w as u32;
                let start = epoch * 100 * SEC + w;
                for s in 0..90 {
                    let ts = start + s * SEC;
                    b.observe(&mem(ts, pid, start, 1000 * (w + 1) + epoch + s, true));
                }
                b.observe(&exit(start + 95 * SEC, pid, start));
            }
        }
        let series = b.finish(&[]);
        assert_eq!(series.procs.len(), MAX_DONE);
        assert_eq!(series.folded.count, 800 - MAX_DONE as u64);
        // The largest peaks kept their lines.
        let smallest_kept = series.procs.iter().map(|p| p.peak_kb).min().unwrap();
        assert!(smallest_kept >= 8000, "{smallest_kept}");
        assert!(!series.folded.rss.is_empty());
        assert!(series.folded.rss.len() <= BUCKETS as usize);
    }

    #[test]
    fn outside_processes_keep_only_the_largest() {
        let mut b = Builder::new(60 * SEC);
        for pid in 0..100u32 {
            b.observe(&mem(
                SEC + pid as u64,
                5000 + pid,
                1,
                pid as u64 * 10,
                false,
            ));
        }
        let s = b.finish(&[]);
        assert_eq!(s.procs.len(), MAX_OUTSIDE);
        assert_eq!(s.procs[0].pid, 5099);
        assert!(s.procs.iter().all(|p| p.pid >= 5092));
    }

    #[test]
    fn a_process_that_joins_the_job_keeps_one_line() {
        let mut b = Builder::new(60 * SEC);
        b.observe(&mem(SEC, 700, 5, 100, false));
        b.observe(&mem(2 * SEC, 700, 5, 300, true));
        let s = b.finish(&[]);
        assert_eq!(s.procs.len(), 1, "{:?}", s.procs);
        assert!(s.procs[0].in_job);
        assert_eq!(s.procs[0].rss.len(), 2);
    }

    #[test]
    fn recycled_pid_ends_the_older_process() {
        let mut b = Builder::new(60 * SEC);
        b.observe(&mem(SEC, 77, 100, 500, true));
        b.observe(&mem(2 * SEC, 77, 200, 800, true));
        let s = b.finish(&[]);
        assert_eq!(s.procs.len(), 2);
        let old = s.procs.iter().find(|p| p.start_ns == 100).unwrap();
        assert_eq!(old.died_ns, Some(200));
        let new = s.procs.iter().find(|p| p.start_ns == 200).unwrap();
        assert_eq!(new.died_ns, None);
        assert_eq!(new.peak_kb, 800);
    }

    /// Events of a job whose workers are re-spawned on recycled pids, two
    /// of which leak until the memcg kills them.
    pub(crate) fn two_kills() -> Vec<Timed> {
        use crate::decode::{JobStart, OomRecord, OomRecordKind, Task};
        let root = ProcKey {
            tgid: 700,
            start_ns: 1,
        };
        let mut ev = vec![Timed {
            ts_ns: 0,
            event: Event::JobStart(JobStart {
                pid: 700,
                start_ns: 1,
                argv: vec!["python3".into(), "train.py".into()],
                cwd: "/".into(),
                uid: 0,
                gid: 0,
                cgroup: Some("/trainbpf-1".into()),
                memory_limit_bytes: Some(1 << 30),
                attached: None,
            }),
        }];
        ev.push(mem(SEC / 10, 700, 1, 50_000, true));
        for (epoch, leak) in [(0u64, true), (1, false), (2, true)] {
            let start = (1 + epoch * 100) * SEC;
            // The same pid every epoch: the kernel recycled it.
            let w = ProcKey {
                tgid: 812,
                start_ns: start,
            };
            ev.push(Timed {
                ts_ns: start,
                event: Event::Fork {
                    child: w,
                    parent: root,
                    comm: "python3".into(),
                },
            });
            for s in 0..60 {
                let kb = if leak { 10_000 + s * 10_000 } else { 10_000 };
                ev.push(mem(start + s * SEC, 812, start, kb, true));
            }
            let end = start + 60 * SEC;
            if leak {
                ev.push(Timed {
                    ts_ns: end,
                    event: Event::Oom(Box::new(OomRecord {
                        kind: OomRecordKind::Victim,
                        source: "tp_btf".into(),
                        victim: w,
                        victim_pid: 812,
                        comm: "p812".into(),
                        in_job: true,
                        uid: 0,
                        oom_score_adj: 0,
                        rss: Rss {
                            anon_kb: 700_000,
                            ..Rss::default()
                        },
                        total_vm_kb: 0,
                        pgtables_kb: 0,
                        memcg_id: 0,
                        oc: None,
                        trigger: Task {
                            pid: 812,
                            tgid: 812,
                            comm: "p812".into(),
                        },
                    })),
                });
            }
            ev.push(exit(end + SEC / 100, 812, start));
        }
        ev.push(mem(400 * SEC, 700, 1, 50_000, true));
        ev
    }

    #[test]
    fn each_kill_gets_its_window_with_victim_and_top_grower() {
        let r = crate::model::build(
            &crate::recording::RecordingHeader::default(),
            two_kills().into_iter(),
            &crate::model::ModelOptions::default(),
        );
        assert_eq!(r.kills.len(), 2);
        for k in &r.kills {
            let w = r.series.window(k).expect("a window per kill");
            let v = w.lines.iter().find(|l| l.is_victim).expect("victim line");
            assert_eq!(
                v.start_ns, k.victim.start_ns,
                "the right process, not its pid"
            );
            // The kill record's figure ends the victim's line.
            assert_eq!(*v.points.last().unwrap(), Some(700_000));
            assert!(v.is_top_grower);
            assert_eq!(v.points.len(), WINDOW_POINTS);
        }
        // Three processes shared pid 812, each its own line; the killed
        // ones are marked.
        let lines: Vec<_> = r.series.procs.iter().filter(|p| p.pid == 812).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines.iter().filter(|p| p.oom_killed).count(), 2);
        assert_eq!(r.series.came_and_went.len(), 1);
        assert_eq!(r.series.came_and_went[0].count, 3);
    }

    #[test]
    fn columns_carry_between_samples_and_stop_at_death() {
        let mut l = Line::default();
        let g = Grid {
            origin_ns: 0,
            width_ns: 10,
        };
        l.width_ns = 10;
        l.push(&g, 0, 4);
        l.push(&g, 30, 8);
        let c = l.columns(&g, 0, 60, 6, Pick::Max, Some(50));
        assert_eq!(c, vec![Some(4), Some(4), Some(4), Some(8), Some(8), None]);
        let w = columns(&[(15, 3), (5, 1)], 10, 10, 3, 25, Pick::Max);
        assert_eq!(w, vec![Some(3), Some(3), None]);
    }
}
