//! Leak detection: a robust trend of each job process's honest memory, and
//! of each role group's, over the whole run, and when it will hit the limit.
//!
//! A leak is a slow climb that outlasts everything else a training job does:
//! the warm-up that fills the allocator's pools, a cache that fills and stays
//! full, the per-epoch sawtooth of DataLoader workers respawned with empty
//! heaps. So the trend is fitted over the run, and the fit is robust:
//!
//! - The value is honest memory (allocated minus freed in the process's own
//!   context, see `attribution`), RSS where the recording has no page
//!   allocation probes: a fork's inherited pages are no climb.
//! - Each process keeps one bounded series on a grid like `series.rs`'s: at
//!   most `BUCKETS` buckets, the width doubling as the run grows. A value
//!   holds until the next record, and a bucket keeps the time-weighted mean
//!   of what was held in it, so the fit weighs time, not records: a warm-up
//!   that sent a record per 4 MiB weighs no more than the quiet hour after.
//! - A role group (DataLoader workers, torchrun ranks, siblings with one
//!   command line) sums the members alive in each bucket, each for the share
//!   of the bucket it lived: a worker folds its series into its group's when
//!   it exits, so that generations of respawned workers form one continuous
//!   series, and a worker and its successor never double a bucket.
//! - The slope is Siegel's repeated median (for each point the median of its
//!   slopes to all others, then the median of those): up to half the points
//!   can be outliers, a sawtooth's teeth included, without moving it. The
//!   fit is the share of variance the line explains, with medians for
//!   means: a spike neither makes nor breaks it.
//!
//! "Leak suspected" needs a sustained climb: the longest stretch running to
//! the end of the series, at least [`LeakOptions::min_span_ns`] long, whose
//! slope is positive, whose fit is at least [`LeakOptions::min_fit`], whose
//! first half, last half and last quarter each climb too (a warm-up plateau,
//! or a cache that filled and stayed flat, fails there), whose growth is
//! beyond noise (more than [`LeakOptions::min_growth_kb`] and
//! [`LeakOptions::min_growth_frac`] of the process's size), and which ends
//! that much above anything the series held before it (the next tooth of a
//! sawtooth, a cache filling again, is no new high). The climb begins at its
//! first point on the fitted line. A process that climbed until it exited,
//! not killed, in a role group gave it all back: its group's series says
//! whether the generations add up to a leak.
//!
//! The projection adds the slopes of the leaks still alive at the end and
//! divides the headroom by it: the job cgroup's limit (or, without one,
//! MemTotal plus swap) less the usage now, taken as the highest of the
//! recent samples each carried forward to the end at that rate. A
//! sawtooth's teeth, which the kill will meet first, count, and so does the
//! growth since a stale or coarse sample.
//!
//! Bounds: one series per live job process (at most `MAX_LIVE`), one per
//! role group, and the trends of ended processes that matter
//! (`MAX_DONE`); a fit is O(n²) over at most `FIT_POINTS` points, tried
//! from at most `STARTS` places per series.

use std::collections::{HashMap, VecDeque};

use crate::decode::{Event, ProcKey, Timed};

use super::attribution::{self, Attribution};
use super::series::KeyHasher;

/// Buckets per series at most.
pub const BUCKETS: u32 = 256;
/// Width of a bucket until the run outgrows the grid.
const FIRST_WIDTH_NS: u64 = 50_000_000;
/// Points a fit uses at most; more are averaged down to these.
const FIT_POINTS: usize = 64;
/// Points a fit needs at least.
const MIN_POINTS: usize = 8;
/// Start points tried for the sustained stretch, evenly over the series.
const STARTS: usize = 32;
/// Job processes alive at once that get a series; more are counted.
const MAX_LIVE: usize = 1024;
/// Ended processes whose trend is kept: the leaks first, then the steepest.
const MAX_DONE: usize = 32;
/// Trends the report lists besides the leaks.
const MAX_TRENDS: usize = 12;
/// Pressure samples kept for the projection: the recent span's, within a
/// bound that timestamps running backwards cannot lift.
const MAX_USAGE: usize = 4096;
/// The halves and the last quarter of a sustained climb must each climb at
/// this share of its slope at least.
const PART_SLOPE: f64 = 0.3;
const SEC: f64 = 1e9;

type KeyMap<V> = HashMap<ProcKey, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// What makes a climb a suspected leak.
#[derive(Clone, Debug, PartialEq)]
pub struct LeakOptions {
    /// The climb must have lasted at least this long, up to the end of the
    /// recording (or of the process).
    pub min_span_ns: u64,
    /// Share of the variance the trend must explain, 0..1.
    pub min_fit: f64,
    /// The climb must add at least this much…
    pub min_growth_kb: u64,
    /// …and this share of the process's (or group's) size.
    pub min_growth_frac: f64,
}

// The model's options compare whole; thresholds are never NaN.
impl Eq for LeakOptions {}

impl Default for LeakOptions {
    fn default() -> Self {
        LeakOptions {
            min_span_ns: 300 * SEC as u64,
            min_fit: 0.8,
            min_growth_kb: 16 << 10,
            min_growth_frac: 0.05,
        }
    }
}

/// Why a trend is, or is not, a suspected leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Leak,
    /// Seen, or climbing, for less than the span a leak needs.
    TooShort,
    /// Flat or shrinking.
    NotClimbing,
    /// Grew less than the noise thresholds.
    Small,
    /// Climbed, then levelled off: a warm-up, a cache that filled.
    Levelled,
    /// No steady trend: the line explains too little.
    Irregular,
    /// Climbed back to a level it had held before: the next tooth of a
    /// sawtooth, a cache filling again.
    Refilled,
    /// Climbed until it exited, not killed, in a role group: a worker
    /// respawned with an empty heap, judged with its group.
    Respawned,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Leak => "leak",
            Verdict::TooShort => "too_short",
            Verdict::NotClimbing => "not_climbing",
            Verdict::Small => "small",
            Verdict::Levelled => "levelled",
            Verdict::Irregular => "irregular",
            Verdict::Refilled => "refilled",
            Verdict::Respawned => "respawned",
        }
    }
}

/// The trend of one process, or of one role group (`pid` `None`).
#[derive(Clone, Debug, PartialEq)]
pub struct Trend {
    pub pid: Option<u32>,
    pub start_ns: u64,
    /// The process's latest name; for a group, its latest member's.
    pub comm: String,
    /// The role group it belongs to (groups of one are none), or the
    /// group's own role.
    pub group: Option<String>,
    /// Processes in the group; 1 for a process.
    pub members: usize,
    /// Alive when the recording ended (for a group: any member).
    pub alive: bool,
    /// Honest memory (RSS without page-allocation probes), kB per second:
    /// of the sustained climb for a leak, else of the whole series.
    pub slope_kb_per_s: f64,
    /// Share of the variance the line explains, 0..1.
    pub fit: f64,
    /// Start of the span fitted: for a leak, when the sustained climb began.
    pub since_ns: u64,
    /// End of the series: the process's end or the recording's.
    pub until_ns: u64,
    /// Slope × span, kB.
    pub growth_kb: i64,
    /// The largest the process (or group) was, kB: RSS or honest memory.
    pub size_kb: u64,
    pub verdict: Verdict,
}

impl Trend {
    pub fn is_leak(&self) -> bool {
        self.verdict == Verdict::Leak
    }
}

/// Which limit the projection runs into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// The job's memory cgroup's limit.
    Cgroup,
    /// MemTotal plus SwapTotal.
    Machine,
}

impl Domain {
    pub fn as_str(self) -> &'static str {
        match self {
            Domain::Cgroup => "cgroup",
            Domain::Machine => "machine",
        }
    }
}

/// When the leaks still alive at the end reach the limit, at their rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    pub domain: Domain,
    pub limit_kb: u64,
    /// Usage now: the highest recent sample carried forward at the leaks'
    /// rate (see the module docs).
    pub usage_kb: u64,
    /// Sum of the live leaks' slopes, each process counted once.
    pub slope_kb_per_s: f64,
    /// Seconds from the end of the recording; `None` when nothing alive is
    /// leaking.
    pub seconds: Option<f64>,
}

/// What the model found, for the renderers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeakReport {
    /// Suspected leaks first (steepest first), then the steepest other
    /// trends, at most `MAX_TRENDS` of those.
    pub trends: Vec<Trend>,
    /// `None` when no limit is known (no pressure samples).
    pub projection: Option<Projection>,
    /// The options the trends were judged by.
    pub min_span_ns: u64,
    /// Job processes left without a series: more alive at once than kept.
    pub untracked: u64,
}

impl LeakReport {
    pub fn leaks(&self) -> impl Iterator<Item = &Trend> {
        self.trends.iter().filter(|t| t.is_leak())
    }

    pub fn suspected(&self) -> bool {
        self.trends.iter().any(Trend::is_leak)
    }
}

// ---------------------------------------------------------------------------
// Series.

/// The run's grid; see `series::Grid`.
#[derive(Clone, Copy, Debug)]
struct Grid {
    origin_ns: u64,
    width_ns: u64,
}

impl Grid {
    fn index(&self, ts: u64) -> u32 {
        (ts.saturating_sub(self.origin_ns) / self.width_ns).min(u32::MAX as u64) as u32
    }

    /// Middle of bucket `i`, seconds since the origin.
    fn mid_s(&self, i: u32) -> f64 {
        (i as f64 + 0.5) * self.width_ns as f64 / SEC
    }

    fn start_ns(&self, i: u32) -> u64 {
        self.origin_ns
            .saturating_add((i as u64).saturating_mul(self.width_ns))
    }

    fn end_ns(&self, i: u32) -> u64 {
        self.origin_ns
            .saturating_add((i as u64 + 1).saturating_mul(self.width_ns))
    }
}

/// One bucket of a process's series: the value held, integrated over the
/// time the bucket saw, and the last value.
#[derive(Clone, Copy, Debug)]
struct Acc {
    /// kB × ns.
    integral: f64,
    covered_ns: u64,
    last: f64,
}

impl Acc {
    /// The time-weighted mean; the last value for a bucket no time has
    /// passed in yet.
    fn mean(&self) -> f64 {
        if self.covered_ns == 0 {
            self.last
        } else {
            self.integral / self.covered_ns as f64
        }
    }
}

/// One process's honest memory on the grid. Each value holds until the
/// next, so a bucket's value is the time-weighted mean of what was held in
/// it: a burst of records weighs no more than a quiet stretch.
#[derive(Clone, Debug)]
struct Line {
    width_ns: u64,
    /// Ascending, contiguous bucket indexes.
    buckets: Vec<(u32, Acc)>,
    /// The latest value and since when it holds.
    held: Option<(u64, f64)>,
}

impl Line {
    fn new(width_ns: u64) -> Line {
        Line {
            width_ns,
            buckets: Vec::new(),
            held: None,
        }
    }

    fn push(&mut self, grid: &Grid, ts: u64, v: f64) {
        // Per-CPU ring buffers deliver slightly out of order: a late record
        // counts from the latest time seen.
        let ts = self.held.map_or(ts, |(t, _)| ts.max(t));
        self.hold_until(grid, ts);
        self.held = Some((ts, v));
        self.bucket(grid.index(ts), v).last = v;
    }

    /// Spreads the value held over the buckets up to `end`.
    fn hold_until(&mut self, grid: &Grid, end: u64) {
        self.rescale(grid.width_ns);
        let Some((mut t, v)) = self.held else { return };
        while t < end {
            let idx = grid.index(t);
            // Past the grid's reach (a corrupt timestamp) the rest is one
            // step.
            let to = match grid.end_ns(idx).min(end) {
                to if to > t => to,
                _ => end,
            };
            let a = self.bucket(idx, v);
            a.integral += v * (to - t) as f64;
            a.covered_ns += to - t;
            t = to;
        }
        self.held = Some((t.max(end), v));
    }

    fn bucket(&mut self, idx: u32, carry: f64) -> &mut Acc {
        if self.buckets.last().is_none_or(|(i, _)| *i < idx) {
            self.buckets.push((
                idx,
                Acc {
                    integral: 0.0,
                    covered_ns: 0,
                    last: carry,
                },
            ));
        }
        let last = self.buckets.len() - 1;
        &mut self.buckets[last].1
    }

    fn rescale(&mut self, width_ns: u64) {
        if self.width_ns >= width_ns {
            return;
        }
        let shift = (width_ns / self.width_ns).trailing_zeros();
        self.width_ns = width_ns;
        let mut out: Vec<(u32, Acc)> = Vec::with_capacity(self.buckets.len() / 2 + 1);
        for &(i, a) in &self.buckets {
            let j = i.checked_shr(shift).unwrap_or(0);
            match out.last_mut() {
                Some((k, b)) if *k == j => {
                    b.integral += a.integral;
                    b.covered_ns += a.covered_ns;
                    b.last = a.last;
                }
                _ => out.push((j, a)),
            }
        }
        self.buckets = out;
    }

    /// (bucket, time-weighted mean), every bucket from the first on.
    fn means(&self) -> Vec<(u32, f64)> {
        self.buckets.iter().map(|&(i, a)| (i, a.mean())).collect()
    }

    /// (bucket, kB × ns held in it), every bucket from the first on.
    fn integrals(&self) -> Vec<(u32, f64)> {
        self.buckets.iter().map(|&(i, a)| (i, a.integral)).collect()
    }
}

/// A role group's members summed, bucket by bucket: kB × ns, so that a
/// member counts for the share of a bucket it lived, and a worker and the
/// one respawned after it share a bucket without doubling it.
#[derive(Clone, Debug)]
struct SumLine {
    width_ns: u64,
    buckets: Vec<(u32, f64)>,
}

impl SumLine {
    fn rescale(&mut self, width_ns: u64) {
        if self.width_ns >= width_ns {
            return;
        }
        let shift = (width_ns / self.width_ns).trailing_zeros();
        self.width_ns = width_ns;
        let mut out: Vec<(u32, f64)> = Vec::with_capacity(self.buckets.len() / 2 + 1);
        for &(i, v) in &self.buckets {
            let j = i.checked_shr(shift).unwrap_or(0);
            match out.last_mut() {
                Some((k, s)) if *k == j => *s += v,
                _ => out.push((j, v)),
            }
        }
        self.buckets = out;
    }

    fn add(&mut self, member: &[(u32, f64)]) {
        let mut out = Vec::with_capacity(self.buckets.len() + member.len());
        let (a, b) = (&self.buckets, member);
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            if j >= b.len() || (i < a.len() && a[i].0 < b[j].0) {
                out.push(a[i]);
                i += 1;
            } else if i >= a.len() || b[j].0 < a[i].0 {
                out.push(b[j]);
                j += 1;
            } else {
                out.push((a[i].0, a[i].1 + b[j].1));
                i += 1;
                j += 1;
            }
        }
        self.buckets = out;
    }

    /// The sum alive, every bucket from the first through the one holding
    /// `end_ns` (which counts only the time up to it); a bucket no member
    /// lived in holds nothing.
    fn values(&self, grid: &Grid, end_ns: u64) -> Vec<(u32, f64)> {
        let Some(&(first, _)) = self.buckets.first() else {
            return Vec::new();
        };
        let last = grid.index(end_ns).max(first);
        let mut it = self.buckets.iter().peekable();
        (first..=last)
            .map(|i| {
                let span = if i == last {
                    end_ns
                        .saturating_sub(grid.start_ns(i))
                        .clamp(1, grid.width_ns)
                } else {
                    grid.width_ns
                };
                match it.peek() {
                    Some(&&(j, v)) if j == i => {
                        it.next();
                        (i, v / span as f64)
                    }
                    _ => (i, 0.0),
                }
            })
            .collect()
    }
}

#[derive(Debug)]
struct Proc {
    comm: String,
    /// The OOM killer chose it.
    killed: bool,
    line: Line,
    size_kb: u64,
}

#[derive(Debug)]
struct GroupSeries {
    line: SumLine,
    members: usize,
    /// Latest member's name.
    comm: String,
    /// When its last member ended (the recording's end while one lives).
    last_ns: u64,
    alive: bool,
}

/// Recent usage against the limits, for the projection.
#[derive(Clone, Copy, Debug)]
struct Usage {
    ts: u64,
    cgroup: Option<(u64, Option<u64>)>,
    machine_used_kb: u64,
    machine_kb: u64,
}

// ---------------------------------------------------------------------------
// Streaming side.

#[derive(Debug, Default)]
pub(super) struct Builder {
    opts: LeakOptions,
    honest: bool,
    grid: Option<Grid>,
    now: u64,
    live: KeyMap<Proc>,
    groups: HashMap<String, GroupSeries>,
    done: Vec<Trend>,
    untracked: u64,
    usage: VecDeque<Usage>,
    job_limit_kb: Option<u64>,
}

impl Builder {
    pub(super) fn new(opts: LeakOptions, honest: bool) -> Builder {
        Builder {
            opts,
            honest,
            ..Builder::default()
        }
    }

    fn advance(&mut self, ts: u64) -> Grid {
        let g = self.grid.get_or_insert(Grid {
            origin_ns: ts,
            width_ns: FIRST_WIDTH_NS,
        });
        self.now = self.now.max(ts);
        // Bounded: a corrupt timestamp must not overflow the width.
        while self.now.saturating_sub(g.origin_ns) >= BUCKETS as u64 * g.width_ns
            && g.width_ns < u64::MAX / (4 * BUCKETS as u64)
        {
            g.width_ns *= 2;
        }
        *g
    }

    /// How far back the projection looks for the highest usage.
    fn recent_ns(&self) -> u64 {
        (self.opts.min_span_ns / 2).clamp(5 * SEC as u64, 600 * SEC as u64)
    }

    pub(super) fn observe(&mut self, t: &Timed, attr: &Attribution) {
        let grid = self.advance(t.ts_ns);
        let ts = t.ts_ns;
        match &t.event {
            // A child has allocated nothing in its own context yet.
            Event::Fork { child, comm, .. } if self.honest => {
                if let Some(p) = self.proc(*child, comm, grid.width_ns) {
                    p.line.push(&grid, ts, 0.0);
                }
            }
            Event::Mem {
                proc,
                in_job,
                comm,
                rss,
                alloc_kb,
                freed_kb,
                ..
            } if *in_job || self.live.contains_key(proc) => {
                let honest = self.honest;
                if let Some(p) = self.proc(*proc, comm, grid.width_ns) {
                    let net = *alloc_kb as f64 - *freed_kb as f64;
                    let rss_kb = rss.resident_kb();
                    p.line
                        .push(&grid, ts, if honest { net } else { rss_kb as f64 });
                    p.size_kb = p.size_kb.max(rss_kb).max(net.max(0.0) as u64);
                    if p.comm != *comm {
                        p.comm.clone_from(comm);
                    }
                }
            }
            Event::Exit { proc, comm, .. } => {
                if let Some(mut p) = self.live.remove(proc) {
                    p.comm.clone_from(comm);
                    self.retire(*proc, p, ts, false, attr);
                }
            }
            Event::Oom(rec) => {
                // The classic tracepoint gives a pid alone.
                let key = if rec.victim.start_ns == 0 {
                    self.live
                        .keys()
                        .find(|k| k.tgid == rec.victim.tgid)
                        .copied()
                } else {
                    Some(rec.victim)
                };
                if let Some(p) = key.and_then(|k| self.live.get_mut(&k)) {
                    p.killed = true;
                }
            }
            Event::JobStart(j) => {
                self.job_limit_kb = j.memory_limit_bytes.map(|b| b / 1024);
            }
            Event::Pressure(p) => {
                self.usage.push_back(Usage {
                    ts,
                    cgroup: p.cgroup.as_ref().map(|c| (c.usage_kb, c.limit_kb)),
                    machine_used_kb: p
                        .mem_total_kb
                        .saturating_sub(p.mem_available_kb)
                        .saturating_add(p.swap_total_kb.saturating_sub(p.swap_free_kb)),
                    machine_kb: p.mem_total_kb.saturating_add(p.swap_total_kb),
                });
                let keep_from = ts.saturating_sub(self.recent_ns());
                while self.usage.len() >= 2
                    && (self.usage[0].ts < keep_from || self.usage.len() > MAX_USAGE)
                {
                    self.usage.pop_front();
                }
            }
            _ => {}
        }
    }

    /// The series of a job process, made on first sight; `None` past the
    /// bound.
    fn proc(&mut self, key: ProcKey, comm: &str, width_ns: u64) -> Option<&mut Proc> {
        if !self.live.contains_key(&key) {
            if self.live.len() >= MAX_LIVE {
                self.untracked += 1;
                return None;
            }
            self.live.insert(
                key,
                Proc {
                    comm: comm.to_string(),
                    line: Line::new(width_ns),
                    size_kb: 0,
                    killed: false,
                },
            );
        }
        self.live.get_mut(&key)
    }

    /// A process ended (or the recording did): its trend, and its series
    /// folded into its group's.
    fn retire(&mut self, key: ProcKey, mut p: Proc, end_ns: u64, alive: bool, attr: &Attribution) {
        let Some(grid) = self.grid else { return };
        p.line.hold_until(&grid, end_ns);
        let points = p.line.means();
        if points.is_empty() {
            return;
        }
        let role = role(key.tgid, &p.comm, attr);
        let mut trend = judge(&grid, &points, p.size_kb, &self.opts);
        trend.pid = Some(key.tgid);
        trend.start_ns = key.start_ns;
        trend.comm.clone_from(&p.comm);
        trend.group.clone_from(&role);
        trend.alive = alive;
        trend.until_ns = end_ns.max(trend.since_ns);
        // A worker that climbed its whole life and exited gave it all back;
        // whether its generations add up to a leak is its group's to say.
        if trend.is_leak() && !alive && !p.killed && trend.group.is_some() {
            trend.verdict = Verdict::Respawned;
        }
        if let Some(role) = role {
            let g = self.groups.entry(role).or_insert_with(|| GroupSeries {
                line: SumLine {
                    width_ns: grid.width_ns,
                    buckets: Vec::new(),
                },
                members: 0,
                comm: String::new(),
                last_ns: 0,
                alive: false,
            });
            g.line.rescale(grid.width_ns);
            g.line.add(&p.line.integrals());
            g.members += 1;
            g.comm.clone_from(&p.comm);
            g.last_ns = g.last_ns.max(end_ns);
            g.alive |= alive;
        }
        self.done.push(trend);
        if self.done.len() > 2 * MAX_DONE {
            rank(&mut self.done);
            self.done.truncate(MAX_DONE);
        }
    }

    pub(super) fn finish(mut self, last_ns: u64, attr: &Attribution) -> LeakReport {
        let Some(grid) = self.grid else {
            return LeakReport {
                min_span_ns: self.opts.min_span_ns,
                ..LeakReport::default()
            };
        };
        self.now = self.now.max(last_ns);
        let end = self.now;
        let mut live: Vec<(ProcKey, Proc)> = std::mem::take(&mut self.live).into_iter().collect();
        live.sort_by_key(|(k, _)| *k);
        for (key, p) in live {
            self.retire(key, p, end, true, attr);
        }
        let mut trends = std::mem::take(&mut self.done);
        let mut groups: Vec<(String, GroupSeries)> = std::mem::take(&mut self.groups)
            .into_iter()
            .filter(|(_, g)| g.members >= 2)
            .collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        for t in &mut trends {
            if t.group
                .as_ref()
                .is_some_and(|r| !groups.iter().any(|(g, _)| g == r))
            {
                t.group = None;
                // A group of one: the process is judged alone after all.
                if t.verdict == Verdict::Respawned {
                    t.verdict = Verdict::Leak;
                }
            }
        }
        for (role, g) in groups {
            let points = g.line.values(&grid, g.last_ns);
            if points.is_empty() {
                continue;
            }
            let size = points.iter().map(|p| p.1).fold(0.0, f64::max) as u64;
            let mut trend = judge(&grid, &points, size, &self.opts);
            trend.comm = g.comm;
            trend.group = Some(role);
            trend.members = g.members;
            trend.alive = g.alive;
            trend.until_ns = g.last_ns;
            trends.push(trend);
        }
        let projection = self.project(&trends);
        rank(&mut trends);
        let mut others = 0;
        trends.retain(|t| {
            others += usize::from(!t.is_leak());
            t.is_leak() || others <= MAX_TRENDS
        });
        LeakReport {
            trends,
            projection,
            min_span_ns: self.opts.min_span_ns,
            untracked: self.untracked,
        }
    }

    /// The `top` live processes that climb most, judged as of now, and the
    /// projection from them; nothing is consumed.
    fn snapshot(&self, top: usize) -> (Vec<Trend>, Option<Projection>) {
        let Some(grid) = self.grid else {
            return (Vec::new(), None);
        };
        // A cheap first cut: how far each climbed over its series.
        let mut cands: Vec<(ProcKey, &Proc, f64)> = self
            .live
            .iter()
            .filter_map(|(k, p)| {
                let first = p.line.buckets.first()?.1.mean();
                let last = p.line.held?.1;
                Some((*k, p, last - first))
            })
            .collect();
        cands.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
        let mut trends: Vec<Trend> = cands
            .into_iter()
            .take(2 * top)
            .filter_map(|(key, p, _)| {
                let mut line = p.line.clone();
                line.hold_until(&grid, self.now);
                let points = line.means();
                if points.is_empty() {
                    return None;
                }
                let mut t = judge(&grid, &points, p.size_kb, &self.opts);
                t.pid = Some(key.tgid);
                t.start_ns = key.start_ns;
                t.comm.clone_from(&p.comm);
                t.alive = true;
                t.until_ns = self.now;
                Some(t)
            })
            .collect();
        rank(&mut trends);
        trends.truncate(top);
        let projection = self.project(&trends);
        (trends, projection)
    }

    /// Headroom over the live leaks' summed slope; see the module docs.
    fn project(&self, trends: &[Trend]) -> Option<Projection> {
        let latest = self.usage.back()?;
        let slope = live_slope(trends);
        let end = self.now;
        // Each recent sample carried forward to the end at the leaks' rate;
        // the highest is where usage stands: a sawtooth's teeth count, and
        // so does growth since a stale or coarse sample (cgroup v1 reports
        // usage in lagging steps).
        let max_of = |f: &dyn Fn(&Usage) -> Option<u64>| {
            self.usage
                .iter()
                .filter_map(|u| {
                    let ahead = slope.max(0.0) * end.saturating_sub(u.ts) as f64 / SEC;
                    f(u).map(|kb| (kb as f64 + ahead) as u64)
                })
                .max()
        };
        let cgroup_limit = latest.cgroup.and_then(|c| c.1).or(self.job_limit_kb);
        let cgroup = latest
            .cgroup
            .is_some()
            .then_some(())
            .and(cgroup_limit)
            .map(|limit| {
                let used = max_of(&|u| u.cgroup.map(|c| c.0)).unwrap_or(0);
                (Domain::Cgroup, limit, used)
            });
        let machine = (latest.machine_kb > 0).then(|| {
            let used = max_of(&|u| Some(u.machine_used_kb)).unwrap_or(0);
            (Domain::Machine, latest.machine_kb, used)
        });
        // Whichever runs out first: a cgroup limit above the machine's
        // memory is never reached.
        let (domain, limit_kb, usage_kb) = [cgroup, machine]
            .into_iter()
            .flatten()
            .min_by_key(|(_, l, u)| l.saturating_sub(*u))?;
        let seconds = (slope > 0.0).then(|| limit_kb.saturating_sub(usage_kb) as f64 / slope);
        Some(Projection {
            domain,
            limit_kb,
            usage_kb,
            slope_kb_per_s: slope,
            seconds,
        })
    }
}

/// The leak model fed while recording, for `record`'s status line: the same
/// series and tests as the report's, for the processes alive now.
#[derive(Default)]
pub struct Live {
    b: Builder,
    attr: Attribution,
}

impl Live {
    /// `honest`: the records carry pages allocated and freed.
    pub fn new(opts: LeakOptions, honest: bool) -> Live {
        Live {
            b: Builder::new(opts, honest),
            attr: Attribution::default(),
        }
    }

    pub fn observe(&mut self, t: &Timed) {
        self.b.observe(t, &self.attr);
        if let Event::ProcInfo(i) = &t.event {
            self.attr.on_proc_info(i.clone());
        }
    }

    /// The `top` live processes that climb most (suspected leaks first),
    /// and when the leaks among them reach the limit.
    pub fn snapshot(&self, top: usize) -> (Vec<Trend>, Option<Projection>) {
        self.b.snapshot(top)
    }
}

/// The live leaks' slopes, each process once: a group counts for what its
/// leaking members do not already explain.
fn live_slope(trends: &[Trend]) -> f64 {
    let live = |t: &&Trend| t.is_leak() && t.alive;
    let procs: f64 = trends
        .iter()
        .filter(live)
        .filter(|t| t.pid.is_some())
        .map(|t| t.slope_kb_per_s)
        .sum();
    let groups: f64 = trends
        .iter()
        .filter(live)
        .filter(|t| t.pid.is_none())
        .map(|g| {
            let members: f64 = trends
                .iter()
                .filter(live)
                .filter(|t| t.pid.is_some() && t.group == g.group)
                .map(|t| t.slope_kb_per_s)
                .sum();
            (g.slope_kb_per_s - members).max(0.0)
        })
        .sum();
    // An empty float sum is -0.0; none leaking reads 0.
    0.0 + procs + groups
}

/// Leaks first, then groups, then processes seen long enough to judge,
/// alive ones first (a run's hundreds of short-lived workers would crowd
/// out the rest); steepest first within each.
fn rank(v: &mut [Trend]) {
    v.sort_by(|a, b| {
        b.is_leak()
            .cmp(&a.is_leak())
            .then(a.pid.is_some().cmp(&b.pid.is_some()))
            .then((a.verdict == Verdict::TooShort).cmp(&(b.verdict == Verdict::TooShort)))
            .then(b.alive.cmp(&a.alive))
            .then(b.slope_kb_per_s.total_cmp(&a.slope_kb_per_s))
            .then(a.pid.cmp(&b.pid))
    });
}

/// A process's role, as `Builder::role_of` in the model gives it.
fn role(pid: u32, comm: &str, attr: &Attribution) -> Option<String> {
    let info = attr.info_of(pid);
    attribution::role(comm, info).or_else(|| {
        let cmd = info?.cmdline.join(" ");
        (!cmd.is_empty()).then(|| format!("`{}`", super::truncate_chars(&cmd, 60)))
    })
}

// ---------------------------------------------------------------------------
// The fit.

/// A line through points, and how well it fits them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Fit {
    /// Per second.
    pub slope: f64,
    pub intercept: f64,
    /// Share of the variance explained, 0..1 (0 for a flat series), with
    /// medians of squares for means.
    pub r2: f64,
}

/// The median of `v` (reordered); NaN for none.
fn median(v: &mut [f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    let k = n / 2;
    let (lo, mid, _) = v.select_nth_unstable_by(k, f64::total_cmp);
    let mid = *mid;
    if n % 2 == 1 {
        mid
    } else {
        let below = lo.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (below + mid) / 2.0
    }
}

/// Siegel's repeated median line through `(x, y)` points.
pub(crate) fn fit(p: &[(f64, f64)]) -> Fit {
    let n = p.len();
    if n < 2 {
        return Fit {
            slope: 0.0,
            intercept: p.first().map_or(0.0, |q| q.1),
            r2: 0.0,
        };
    }
    let mut row = Vec::with_capacity(n);
    let mut meds = Vec::with_capacity(n);
    for (i, a) in p.iter().enumerate() {
        row.clear();
        row.extend(
            p.iter()
                .enumerate()
                .filter(|&(j, b)| j != i && b.0 != a.0)
                .map(|(_, b)| (b.1 - a.1) / (b.0 - a.0)),
        );
        if !row.is_empty() {
            meds.push(median(&mut row));
        }
    }
    let slope = if meds.is_empty() {
        0.0
    } else {
        median(&mut meds)
    };
    let mut res: Vec<f64> = p.iter().map(|q| q.1 - slope * q.0).collect();
    let intercept = median(&mut res);
    // R² with medians for means, robust like the slope: a spike (a
    // transient buffer, two workers overlapping for a moment) neither makes
    // nor breaks the fit.
    let mut ys: Vec<f64> = p.iter().map(|q| q.1).collect();
    let mid = median(&mut ys);
    let mut tot: Vec<f64> = p.iter().map(|q| (q.1 - mid).powi(2)).collect();
    let mut res: Vec<f64> = p
        .iter()
        .map(|q| (q.1 - (intercept + slope * q.0)).powi(2))
        .collect();
    let (tot, res) = (median(&mut tot), median(&mut res));
    let r2 = if tot > 0.0 {
        (1.0 - res / tot).clamp(0.0, 1.0)
    } else {
        0.0
    };
    Fit {
        slope,
        intercept,
        r2,
    }
}

/// How one stretch of a series fares against the leak tests.
struct Stretch {
    fit: Fit,
    growth_kb: f64,
    verdict: Verdict,
}

/// At most [`FIT_POINTS`] points: runs of neighbours averaged. A fit is
/// O(n²) and a series is judged from up to [`STARTS`] places.
fn thin(p: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let per = p.len().div_ceil(FIT_POINTS).max(1);
    p.chunks(per)
        .map(|c| {
            let n = c.len() as f64;
            let (x, y) = c.iter().fold((0.0, 0.0), |(x, y), q| (x + q.0, y + q.1));
            (x / n, y / n)
        })
        .collect()
}

/// `before`: the highest the series was before the stretch.
fn stretch(
    p: &[(f64, f64)],
    before: Option<f64>,
    width_s: f64,
    size_kb: u64,
    o: &LeakOptions,
) -> Stretch {
    let n = p.len();
    let span_s = n as f64 * width_s;
    let thin = thin(p);
    let p = &thin[..];
    let f = fit(p);
    let growth_kb = f.slope * span_s;
    let threshold = (o.min_growth_kb as f64).max(o.min_growth_frac * size_kb as f64);
    let part_climbs =
        |q: &[(f64, f64)]| q.len() < MIN_POINTS || fit(q).slope >= PART_SLOPE * f.slope;
    let half = p.len() / 2;
    let verdict = if n < MIN_POINTS || span_s * SEC < o.min_span_ns as f64 {
        Verdict::TooShort
    } else if f.slope <= 0.0 {
        Verdict::NotClimbing
    } else if growth_kb < threshold {
        Verdict::Small
    } else if before.is_some_and(|b| f.intercept + f.slope * p[p.len() - 1].0 - b < threshold) {
        // Back up to where it had been: the next tooth of a sawtooth, a
        // cache filling again.
        Verdict::Refilled
    } else if !part_climbs(&p[half..]) || !part_climbs(&p[p.len() - p.len() / 4..]) {
        Verdict::Levelled
    } else if f.r2 < o.min_fit {
        Verdict::Irregular
    } else if !part_climbs(&p[..half]) {
        // Flat, then climbing: the climb itself is what must last.
        Verdict::TooShort
    } else {
        Verdict::Leak
    };
    Stretch {
        fit: f,
        growth_kb,
        verdict,
    }
}

/// The trend of one filled series: the earliest start from which the rest
/// is a sustained climb, else the whole series and why it is none.
fn judge(grid: &Grid, series: &[(u32, f64)], size_kb: u64, o: &LeakOptions) -> Trend {
    let width_s = grid.width_ns as f64 / SEC;
    let pts: Vec<(f64, f64)> = series.iter().map(|&(i, v)| (grid.mid_s(i), v)).collect();
    let whole = stretch(&pts, None, width_s, size_kb, o);
    let mut best = (0, whole);
    // Only a series that climbed enough overall can hold a leak; the search
    // costs O(n³ / STARTS).
    let (lo, hi) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), q| {
            (lo.min(q.1), hi.max(q.1))
        });
    let searchable = best.1.verdict != Verdict::Leak
        && hi - lo >= o.min_growth_kb as f64
        && pts.len() >= MIN_POINTS
        && pts.len() as f64 * width_s * SEC >= o.min_span_ns as f64;
    if searchable {
        let step = (pts.len() / STARTS).max(1);
        for s in (step..pts.len()).step_by(step) {
            let rest = &pts[s..];
            if rest.len() < MIN_POINTS || (rest.len() as f64 * width_s * SEC) < o.min_span_ns as f64
            {
                break;
            }
            let before = pts[..s]
                .iter()
                .map(|q| q.1)
                .fold(f64::NEG_INFINITY, f64::max);
            let st = stretch(rest, Some(before), width_s, size_kb, o);
            if st.verdict == Verdict::Leak {
                best = (s, st);
                break;
            }
        }
    }
    let (mut s, st) = best;
    let mut growth_kb = st.growth_kb;
    if st.verdict == Verdict::Leak {
        // The stretch can open with points off its line, which the robust
        // fit ignored (a warm-up below it): the climb begins at the first
        // point on the line.
        let f = st.fit;
        let off = |q: &(f64, f64)| (q.1 - f.intercept - f.slope * q.0).abs();
        let mut abs: Vec<f64> = pts[s..].iter().map(off).collect();
        let tol = (3.0 * 1.4826 * median(&mut abs))
            .max(0.02 * growth_kb)
            .max(1024.0);
        s += pts[s..].iter().position(|q| off(q) <= tol).unwrap_or(0);
        growth_kb = f.slope * (pts.len() - s) as f64 * width_s;
    }
    Trend {
        pid: None,
        start_ns: 0,
        comm: String::new(),
        group: None,
        members: 1,
        alive: false,
        slope_kb_per_s: st.fit.slope,
        fit: st.fit.r2,
        since_ns: grid.start_ns(series[s].0),
        until_ns: 0,
        growth_kb: growth_kb.round() as i64,
        size_kb,
        verdict: st.verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Rss;
    use crate::decode::{CgroupPressure, Pressure, ProcInfo};
    use crate::model::{ModelOptions, Report, build};
    use crate::recording::RecordingHeader;

    const MIB: f64 = 1024.0;

    fn s(secs: f64) -> u64 {
        (secs * SEC) as u64
    }

    fn key(tgid: u32, start: f64) -> ProcKey {
        ProcKey {
            tgid,
            start_ns: s(start) + 1,
        }
    }

    fn at(secs: f64, event: Event) -> Timed {
        Timed {
            ts_ns: s(secs),
            event,
        }
    }

    /// A memory record: honest `net_kb`, RSS a little above it.
    fn mem(secs: f64, k: ProcKey, comm: &str, net_kb: f64) -> Timed {
        let net = net_kb.max(0.0) as u64;
        at(
            secs,
            Event::Mem {
                proc: k,
                in_job: true,
                comm: comm.into(),
                rss: Rss {
                    anon_kb: net + 20 * 1024,
                    file_kb: 0,
                    shmem_kb: 0,
                    swap_kb: 0,
                },
                faults: 0,
                reason: 1,
                oom_score_adj: 0,
                pgtables_kb: 0,
                memcg_id: 0,
                stall_ns: 0,
                alloc_kb: net,
                freed_kb: 0,
                cache_kb: 0,
            },
        )
    }

    fn fork(secs: f64, child: ProcKey, comm: &str) -> Timed {
        at(
            secs,
            Event::Fork {
                child,
                parent: key(700, 0.0),
                comm: comm.into(),
            },
        )
    }

    fn exit(secs: f64, k: ProcKey, comm: &str) -> Timed {
        at(
            secs,
            Event::Exit {
                proc: k,
                comm: comm.into(),
                exit_code: 0,
                group_exit_code: 0,
            },
        )
    }

    fn pressure(secs: f64, usage_kb: u64, limit_kb: Option<u64>) -> Timed {
        at(
            secs,
            Event::Pressure(Box::new(Pressure {
                mem_total_kb: 64 << 20,
                mem_available_kb: 60 << 20,
                cgroup: Some(CgroupPressure {
                    usage_kb,
                    limit_kb,
                    ..Default::default()
                }),
                ..Default::default()
            })),
        )
    }

    /// Records as the collector sends them: when the value moved 4 MiB,
    /// or on a 5 s heartbeat, from `from` to `to` seconds.
    fn sampled(
        k: ProcKey,
        comm: &str,
        from: f64,
        to: f64,
        v: impl Fn(f64) -> f64,
        out: &mut Vec<Timed>,
    ) {
        let mut last: Option<(f64, f64)> = None;
        let mut t = from;
        while t <= to {
            let x = v(t);
            let due = match last {
                None => true,
                Some((lt, lv)) => (x - lv).abs() >= 4.0 * MIB || t - lt >= 5.0,
            };
            if due {
                out.push(mem(t, k, comm, x));
                last = Some((t, x));
            }
            t += 0.25;
        }
    }

    /// A small deterministic wobble, ±`amp`.
    fn wobble(t: f64, amp: f64) -> f64 {
        amp * ((t * 1.7).sin() * 0.6 + (t * 0.31).cos() * 0.4)
    }

    fn honest_header() -> RecordingHeader {
        let mut h = RecordingHeader::default();
        h.attach.pages = Some("tp_btf:mm_page_alloc".into());
        h
    }

    fn report(mut evs: Vec<Timed>, span_s: f64) -> Report {
        evs.sort_by_key(|t| t.ts_ns);
        let opts = ModelOptions {
            leaks: LeakOptions {
                min_span_ns: s(span_s),
                ..Default::default()
            },
            ..Default::default()
        };
        build(&honest_header(), evs.into_iter(), &opts)
    }

    const RUN: f64 = 1200.0;

    /// The main process warms up to 500 MiB in 20 s, then holds it; a
    /// DataLoader worker is respawned every 30 s and grows to 200 MiB in
    /// its 25 s; the cgroup's usage follows. `leak` KiB/s are added to the
    /// main process from 60 s on.
    fn training(leak: f64) -> Vec<Timed> {
        let main = key(700, 0.0);
        let mut evs = vec![at(
            0.0,
            Event::Cgroup(crate::decode::CgroupName {
                id: 1,
                path: "/trainbpf-1".into(),
            }),
        )];
        let main_v = move |t: f64| {
            let base = if t < 20.0 {
                500.0 * MIB * t / 20.0
            } else {
                500.0 * MIB
            };
            base + wobble(t, 3.0 * MIB) + leak * (t - 60.0).max(0.0)
        };
        sampled(main, "python3", 0.0, RUN, main_v, &mut evs);
        let mut generation = 0;
        let mut t0 = 30.0;
        while t0 + 25.0 < RUN {
            let w = key(1000 + generation, t0);
            evs.push(fork(t0, w, "python3"));
            sampled(
                w,
                "pt_data_worker",
                t0 + 0.5,
                t0 + 25.0,
                move |t| 200.0 * MIB * (t - t0) / 25.0,
                &mut evs,
            );
            evs.push(exit(t0 + 25.2, w, "pt_data_worker"));
            generation += 1;
            t0 += 30.0;
        }
        let mut t = 0.0;
        while t <= RUN {
            let workers = if (t % 30.0) < 25.0 && t >= 30.0 {
                200.0 * MIB * (t % 30.0) / 25.0
            } else {
                0.0
            };
            let usage = main_v(t) + workers + 40.0 * MIB;
            evs.push(pressure(t, usage as u64, Some(4 << 20)));
            t += 1.0;
        }
        evs
    }

    #[test]
    fn repeated_median_ignores_outliers() {
        let mut p: Vec<(f64, f64)> = (0..50).map(|i| (i as f64, 3.0 * i as f64 + 7.0)).collect();
        let exact = fit(&p);
        assert!((exact.slope - 3.0).abs() < 1e-9, "{exact:?}");
        assert!((exact.intercept - 7.0).abs() < 1e-9);
        assert!((exact.r2 - 1.0).abs() < 1e-9);
        // A fifth of the points wildly off: the slope does not move much.
        for q in p.iter_mut().step_by(5) {
            q.1 += 10_000.0;
        }
        let f = fit(&p);
        assert!((f.slope - 3.0).abs() < 0.3, "{f:?}");
        assert!(f.r2 > 0.9, "nor the fit, which uses medians too: {f:?}");
        assert_eq!(fit(&[(0.0, 5.0); 10]).r2, 0.0, "flat: nothing explained");
    }

    #[test]
    fn sawtooth_of_respawned_workers_and_a_plateau_are_no_leak() {
        let r = report(training(0.0), 300.0);
        let l = &r.leaks;
        assert!(!l.suspected(), "{:#?}", l.trends);
        let workers = l
            .trends
            .iter()
            .find(|t| t.pid.is_none())
            .unwrap_or_else(|| panic!("the workers form a group: {:#?}", l.trends));
        assert_eq!(workers.group.as_deref(), Some("DataLoader workers"));
        assert_eq!(workers.members, 39);
        assert!(
            workers.slope_kb_per_s.abs() < 0.02 * 200.0 * MIB / 25.0,
            "the sawtooth's teeth do not make a slope: {workers:#?}"
        );
        let main = l.trends.iter().find(|t| t.pid == Some(700)).unwrap();
        assert_ne!(main.verdict, Verdict::Leak);
        let p = l
            .projection
            .as_ref()
            .expect("a projection against the limit");
        assert_eq!(p.domain, Domain::Cgroup);
        assert_eq!(p.limit_kb, 4 << 20);
        assert_eq!(p.seconds, None, "nothing leaks: {p:?}");
    }

    #[test]
    fn slow_leak_in_the_main_process_is_flagged_with_its_slope() {
        let leak = 100.0; // KiB/s: 112 MiB over the 19 minutes it runs
        let r = report(training(leak), 300.0);
        let l = &r.leaks;
        let leaks: Vec<_> = l.leaks().collect();
        assert_eq!(leaks.len(), 1, "{leaks:#?}");
        let t = leaks[0];
        assert_eq!(t.pid, Some(700));
        assert_eq!(t.comm, "python3");
        assert!(
            (t.slope_kb_per_s - leak).abs() < 0.05 * leak,
            "slope {} for {leak}",
            t.slope_kb_per_s
        );
        assert!(t.fit > 0.8, "{t:#?}");
        assert!(t.alive);
        // The climb began at 60 s, but in the flat 40 s before it, it was
        // within the noise; the warm-up is not part of it.
        let since = r.since_start_s(t.since_ns);
        assert!((18.0..=120.0).contains(&since), "since {since}: {t:#?}");
        // The projection: the highest usage in the last 150 s (carried to
        // the end at the leak's rate) against 4 GiB.
        let p = l.projection.as_ref().unwrap();
        let usage = 500.0 * MIB + 40.0 * MIB + 200.0 * MIB + leak * (RUN - 60.0);
        assert!((p.usage_kb as f64 - usage).abs() < 8.0 * MIB, "{p:?}");
        let expect = ((4 << 20) as f64 - p.usage_kb as f64) / t.slope_kb_per_s;
        let secs = p.seconds.unwrap();
        assert!((secs - expect).abs() < 1e-6 * expect, "{secs} vs {expect}");
    }

    #[test]
    fn epoch_long_workers_that_climb_until_respawned_are_no_leak() {
        // Four workers per 10-minute epoch, each climbing its whole life:
        // longer than the span, but each gives it all back at its exit.
        let mut evs = vec![pressure(0.0, 100 << 10, Some(8 << 20))];
        for epoch in 0..4u32 {
            let t0 = epoch as f64 * 600.0;
            for i in 0..4 {
                let w = key(3000 + 10 * epoch + i, t0);
                evs.push(fork(t0, w, "python3"));
                sampled(
                    w,
                    "pt_data_worker",
                    t0 + 0.5,
                    t0 + 599.0,
                    move |t| 400.0 * (t - t0),
                    &mut evs,
                );
                evs.push(exit(t0 + 599.5, w, "pt_data_worker"));
            }
        }
        let r = report(evs.clone(), 300.0);
        assert!(!r.leaks.suspected(), "{:#?}", r.leaks.trends);
        let workers: Vec<_> = r.leaks.trends.iter().filter(|t| t.pid.is_some()).collect();
        assert!(!workers.is_empty());
        assert!(
            workers.iter().all(|t| t.verdict == Verdict::Respawned),
            "{workers:#?}"
        );
        // One killed by the OOM killer mid-climb ran into the limit: that
        // climb is a leak.
        let victim = key(3031, 1800.0);
        evs.retain(|t| t.ts_ns < s(2100.0) || !matches!(&t.event, Event::Mem { proc, .. } | Event::Exit { proc, .. } if *proc == victim));
        // The classic tracepoint's record: a pid, no start time.
        let kill = crate::decode::OomRecord {
            kind: crate::decode::OomRecordKind::Victim,
            source: "tracepoint".into(),
            victim: ProcKey {
                tgid: victim.tgid,
                start_ns: 0,
            },
            victim_pid: victim.tgid,
            comm: String::new(),
            in_job: true,
            uid: 0,
            oom_score_adj: 0,
            rss: Rss::default(),
            total_vm_kb: 0,
            pgtables_kb: 0,
            memcg_id: 0,
            oc: None,
            trigger: crate::decode::Task {
                pid: victim.tgid,
                tgid: victim.tgid,
                comm: String::new(),
            },
        };
        evs.push(at(2100.0, Event::Oom(Box::new(kill))));
        evs.push(exit(2100.1, victim, "pt_data_worker"));
        let r = report(evs, 300.0);
        let leaks: Vec<_> = r.leaks.leaks().collect();
        assert_eq!(leaks.len(), 1, "{:#?}", r.leaks.trends);
        assert_eq!(leaks[0].pid, Some(3031));
    }

    #[test]
    fn warm_up_then_plateau_is_no_leak() {
        let p = key(700, 0.0);
        let mut evs = Vec::new();
        // Fast growth for 10 minutes, then flat for 10.
        sampled(
            p,
            "python3",
            0.0,
            RUN,
            |t| 2000.0 * MIB * (1.0 - (-t / 200.0).exp()) + wobble(t, 2.0 * MIB),
            &mut evs,
        );
        let r = report(evs, 300.0);
        let t = &r.leaks.trends[0];
        assert!(!r.leaks.suspected(), "{t:#?}");
        assert_eq!(t.verdict, Verdict::Levelled, "{t:#?}");
    }

    #[test]
    fn cache_that_fills_then_stays_flat_is_no_leak() {
        let p = key(700, 0.0);
        let mut evs = Vec::new();
        // A cache filling at a steady rate for 12 minutes of 20, then full.
        sampled(
            p,
            "python3",
            0.0,
            RUN,
            |t| 100.0 * MIB + 1024.0 * MIB * (t / 720.0).min(1.0),
            &mut evs,
        );
        let r = report(evs, 300.0);
        assert!(!r.leaks.suspected(), "{:#?}", r.leaks.trends);
        // The same cache still filling at the end is a climb.
        let mut evs = Vec::new();
        sampled(
            p,
            "python3",
            0.0,
            600.0,
            |t| 100.0 * MIB + 1024.0 * MIB * (t / 720.0).min(1.0),
            &mut evs,
        );
        let r = report(evs, 300.0);
        assert!(r.leaks.suspected(), "{:#?}", r.leaks.trends);
    }

    #[test]
    fn a_climb_shorter_than_the_span_is_not_yet_a_leak() {
        let p = key(700, 0.0);
        let mut evs = Vec::new();
        sampled(p, "python3", 0.0, 200.0, |t| 50.0 * MIB * t, &mut evs);
        let r = report(evs.clone(), 300.0);
        assert_eq!(r.leaks.trends[0].verdict, Verdict::TooShort);
        let r = report(evs, 100.0);
        assert!(r.leaks.suspected());
    }

    #[test]
    fn respawned_workers_growing_generation_by_generation_leak_as_a_group() {
        // Each worker holds its memory flat for its 60 s life, but each
        // generation holds 20 MiB more than the last: no worker climbs, the
        // group does.
        let mut evs = vec![pressure(0.0, 100 << 10, Some(8 << 20))];
        for g in 0..20u32 {
            let t0 = g as f64 * 60.0;
            let w = key(2000 + g, t0);
            let held = (200.0 + 20.0 * g as f64) * MIB;
            evs.push(fork(t0, w, "python3"));
            sampled(
                w,
                "pt_data_worker",
                t0 + 0.2,
                t0 + 59.5,
                move |_| held,
                &mut evs,
            );
            evs.push(exit(t0 + 59.8, w, "pt_data_worker"));
        }
        evs.push(pressure(RUN - 30.0, 700 << 10, Some(8 << 20)));
        let r = report(evs, 300.0);
        let leaks: Vec<_> = r.leaks.leaks().collect();
        assert_eq!(leaks.len(), 1, "{:#?}", r.leaks.trends);
        let g = leaks[0];
        assert_eq!(g.pid, None);
        assert_eq!(g.group.as_deref(), Some("DataLoader workers"));
        assert_eq!(g.members, 20);
        let per_s = 20.0 * MIB / 60.0;
        assert!((g.slope_kb_per_s - per_s).abs() < 0.1 * per_s, "{g:#?}");
        // No worker was alive at the end to keep it going.
        assert!(!g.alive);
        assert_eq!(r.leaks.projection.as_ref().unwrap().seconds, None);
    }

    #[test]
    fn projection_sums_live_leaks_once_each() {
        let t = |pid: Option<u32>, group: Option<&str>, slope: f64, alive: bool| Trend {
            pid,
            start_ns: 0,
            comm: "x".into(),
            group: group.map(Into::into),
            members: 1,
            alive,
            slope_kb_per_s: slope,
            fit: 0.9,
            since_ns: 0,
            until_ns: 0,
            growth_kb: 0,
            size_kb: 0,
            verdict: Verdict::Leak,
        };
        let trends = vec![
            t(Some(1), Some("ranks"), 10.0, true),
            t(Some(2), Some("ranks"), 12.0, true),
            // The group explains 3 kB/s more than its leaking members.
            t(None, Some("ranks"), 25.0, true),
            t(Some(3), None, 5.0, true),
            // Dead: adds nothing any more.
            t(Some(4), None, 100.0, false),
        ];
        assert!((live_slope(&trends) - 30.0).abs() < 1e-9);

        // The headroom: the highest recent usage, carried forward to the
        // end (2 s) at 30 kB/s, against the limit.
        let mut b = Builder::new(LeakOptions::default(), true);
        let attr = Attribution::default();
        for (i, u) in [900_000u64, 950_000, 920_000].iter().enumerate() {
            b.observe(&pressure(i as f64, *u, Some(1_000_000)), &attr);
        }
        let p = b.project(&trends).unwrap();
        assert_eq!(
            (p.domain, p.limit_kb, p.usage_kb),
            (Domain::Cgroup, 1_000_000, 950_030)
        );
        assert!((p.seconds.unwrap() - 49_970.0 / 30.0).abs() < 1e-9);

        // Without a cgroup limit: MemTotal plus swap, less what is in use.
        let mut b = Builder::new(LeakOptions::default(), true);
        b.observe(
            &at(
                0.0,
                Event::Pressure(Box::new(Pressure {
                    mem_total_kb: 1_000_000,
                    mem_available_kb: 300_000,
                    swap_total_kb: 500_000,
                    swap_free_kb: 400_000,
                    ..Default::default()
                })),
            ),
            &attr,
        );
        let p = b.project(&trends).unwrap();
        assert_eq!(
            (p.domain, p.limit_kb, p.usage_kb),
            (Domain::Machine, 1_500_000, 800_000)
        );
        assert!((p.seconds.unwrap() - 700_000.0 / 30.0).abs() < 1e-9);
    }

    #[test]
    fn torchrun_ranks_and_command_lines_group_like_the_rest_of_the_model() {
        let mut attr = Attribution::default();
        attr.on_proc_info(ProcInfo {
            tgid: 5,
            cmdline: vec!["python3".into(), "train.py".into()],
            rank: Some(1),
            local_rank: Some(1),
            ppid: None,
        });
        attr.on_proc_info(ProcInfo {
            tgid: 6,
            cmdline: vec!["python3".into(), "eval.py".into()],
            rank: None,
            local_rank: None,
            ppid: None,
        });
        assert_eq!(role(5, "python3", &attr).as_deref(), Some("torchrun ranks"));
        assert_eq!(
            role(6, "python3", &attr).as_deref(),
            Some("`python3 eval.py`")
        );
        assert_eq!(
            role(7, "pt_data_worker", &attr).as_deref(),
            Some("DataLoader workers")
        );
        assert_eq!(role(8, "python3", &attr), None);
    }

    #[test]
    fn series_stay_bounded_over_a_long_run() {
        let p = key(700, 0.0);
        let mut b = Builder::new(LeakOptions::default(), true);
        let attr = Attribution::default();
        for i in 0..200_000u64 {
            b.observe(&mem(i as f64, p, "python3", i as f64), &attr);
        }
        let line = &b.live[&p].line;
        assert!(
            line.buckets.len() <= BUCKETS as usize,
            "{}",
            line.buckets.len()
        );
        let r = b.finish(s(200_000.0), &attr);
        assert!(r.suspected(), "a day-long steady climb: {:#?}", r.trends);
        let t = &r.trends[0];
        assert!((t.slope_kb_per_s - 1.0).abs() < 0.01, "{t:#?}");
    }

    #[test]
    fn damaged_records_never_panic() {
        // Timestamps anywhere (backwards, 0, u64::MAX) and absurd sizes, as
        // a damaged recording can hold.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let attr = Attribution::default();
        for honest in [true, false] {
            let mut b = Builder::new(LeakOptions::default(), honest);
            for i in 0..3000u64 {
                let r = next();
                let ts = match r % 7 {
                    0 => 0,
                    1 => u64::MAX - (r >> 40),
                    2 => r,
                    _ => i * 1_000_000_000 + (r >> 44),
                };
                let k = key((r >> 20) as u32 % 8, 0.0);
                let big = next();
                let ev = match (r >> 8) % 5 {
                    0 => Event::Fork {
                        child: k,
                        parent: k,
                        comm: "w".into(),
                    },
                    1 => Event::Exit {
                        proc: k,
                        comm: "pt_data_worker".into(),
                        exit_code: 0,
                        group_exit_code: 0,
                    },
                    2 => Event::Pressure(Box::new(Pressure {
                        mem_total_kb: big,
                        mem_available_kb: next(),
                        swap_total_kb: u64::MAX,
                        swap_free_kb: next(),
                        cgroup: Some(CgroupPressure {
                            usage_kb: next(),
                            limit_kb: Some(next()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })),
                    _ => {
                        let Event::Mem {
                            proc,
                            in_job,
                            comm,
                            faults,
                            reason,
                            oom_score_adj,
                            pgtables_kb,
                            memcg_id,
                            stall_ns,
                            ..
                        } = mem(0.0, k, "p", 0.0).event
                        else {
                            unreachable!()
                        };
                        Event::Mem {
                            proc,
                            in_job,
                            comm,
                            rss: Rss {
                                anon_kb: big >> 3,
                                file_kb: big >> 3,
                                shmem_kb: 0,
                                swap_kb: 0,
                            },
                            faults,
                            reason,
                            oom_score_adj,
                            pgtables_kb,
                            memcg_id,
                            stall_ns,
                            alloc_kb: next(),
                            freed_kb: next(),
                            cache_kb: 0,
                        }
                    }
                };
                b.observe(
                    &Timed {
                        ts_ns: ts,
                        event: ev,
                    },
                    &attr,
                );
                if i % 1000 == 0 {
                    let _ = b.snapshot(3);
                }
            }
            let r = b.finish(u64::MAX, &attr);
            assert!(r.trends.len() <= MAX_TRENDS + MAX_DONE + 16);
        }
    }
}
