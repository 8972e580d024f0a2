//! The streaming side of the leak model: a series per live job process and
//! per role group, bounded as the module docs describe, judged when each
//! process ends and at the end of the recording.

use crate::decode::MemSample;
use std::collections::{HashMap, VecDeque};

use crate::decode::{Event, ProcKey, Timed};
use crate::model::attribution::{self, Attribution};
use crate::model::grid::{Grid, KeyMap};

use super::fit::judge;
use super::line::{Line, SumLine};
use super::project::{Usage, project};
use super::{
    BUCKETS, LeakOptions, LeakReport, MAX_DONE, MAX_LIVE, MAX_TRENDS, MAX_USAGE, Projection, SEC,
    STEADY_SPAN_NS, Trend, Verdict, WARN_SPAN_NS,
};

#[derive(Debug)]
pub(super) struct Proc {
    comm: String,
    /// The OOM killer chose it.
    killed: bool,
    pub(super) line: Line,
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

#[derive(Debug, Default)]
pub(in crate::model) struct Builder {
    opts: LeakOptions,
    honest: bool,
    grid: Option<Grid>,
    now: u64,
    pub(super) live: KeyMap<Proc>,
    groups: HashMap<String, GroupSeries>,
    done: Vec<Trend>,
    untracked: u64,
    usage: VecDeque<Usage>,
    job_limit_kb: Option<u64>,
}

impl Builder {
    pub(in crate::model) fn new(opts: LeakOptions, honest: bool) -> Builder {
        Builder {
            opts,
            honest,
            ..Builder::default()
        }
    }

    fn advance(&mut self, ts: u64) -> Grid {
        let g = self.grid.get_or_insert(Grid::starting_at(ts));
        self.now = self.now.max(ts);
        g.cover(self.now, BUCKETS);
        *g
    }

    /// How far back the projection looks for the highest usage.
    fn recent_ns(&self) -> u64 {
        (self.opts.min_span_ns / 2).clamp(5 * SEC as u64, 600 * SEC as u64)
    }

    pub(in crate::model) fn observe(&mut self, t: &Timed, attr: &Attribution) {
        let grid = self.advance(t.ts_ns);
        let ts = t.ts_ns;
        match &t.event {
            // A child has allocated nothing in its own context yet.
            Event::Fork { child, comm, .. } if self.honest => {
                if let Some(p) = self.proc(*child, comm, grid.width_ns) {
                    p.line.push(&grid, ts, 0.0);
                }
            }
            Event::Mem(MemSample {
                proc,
                in_job,
                comm,
                rss,
                alloc_kb,
                freed_kb,
                ..
            }) if *in_job || self.live.contains_key(proc) => {
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
        // A kill's diagnosis asks whether its victim climbed steadily, even
        // for less than the span a leak needs.
        let mut trend = if p.killed {
            self.judge_steady(&grid, &points, p.size_kb, STEADY_SPAN_NS)
        } else {
            judge(&grid, &points, p.size_kb, &self.opts)
        };
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
                line: SumLine::new(grid.width_ns),
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

    pub(in crate::model) fn finish(mut self, last_ns: u64, attr: &Attribution) -> LeakReport {
        if self.grid.is_none() {
            return LeakReport {
                min_span_ns: self.opts.min_span_ns,
                ..LeakReport::default()
            };
        }
        // The recording's last time may lie past every event seen here (a
        // damaged timestamp in a record this model skips): the grid is
        // widened to cover it before the lines are held until it, or each
        // line would grow a bucket per width up to it.
        let grid = self.advance(last_ns);
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
    pub(super) fn snapshot(&self, top: usize) -> (Vec<Trend>, Option<Projection>) {
        let Some(grid) = self.grid else {
            return (Vec::new(), None);
        };
        // A cheap first cut: how far each climbed over its series.
        let mut cands: Vec<(ProcKey, &Proc, f64)> = self
            .live
            .iter()
            .filter_map(|(k, p)| {
                let first = p.line.buckets.items.first()?.1.mean();
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
                let mut t = self.judge_steady(&grid, &points, p.size_kb, WARN_SPAN_NS);
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
    pub(super) fn project(&self, trends: &[Trend]) -> Option<Projection> {
        self.project_by(trends, Trend::is_leak)
    }

    /// The same over the trends `counts` takes.
    pub(super) fn project_by(
        &self,
        trends: &[Trend],
        counts: fn(&Trend) -> bool,
    ) -> Option<Projection> {
        project(&self.usage, self.job_limit_kb, self.now, trends, counts)
    }

    /// [`judge`], and for a climb too short for a leak, whether it is one
    /// by every other test over `span_ns` ([`Verdict::Steady`]).
    fn judge_steady(
        &self,
        grid: &Grid,
        points: &[(u32, f64)],
        size_kb: u64,
        span_ns: u64,
    ) -> Trend {
        let t = judge(grid, points, size_kb, &self.opts);
        if t.verdict != Verdict::TooShort || self.opts.min_span_ns <= span_ns {
            return t;
        }
        let short = LeakOptions {
            min_span_ns: span_ns,
            ..self.opts.clone()
        };
        let s = judge(grid, points, size_kb, &short);
        if s.verdict == Verdict::Leak {
            Trend {
                verdict: Verdict::Steady,
                ..s
            }
        } else {
            t
        }
    }
}

/// Leaks first, then groups, then processes seen long enough to judge,
/// alive ones first (a run's hundreds of short-lived workers would crowd
/// out the rest); steepest first within each.
pub(super) fn rank(v: &mut [Trend]) {
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
pub(super) fn role(pid: u32, comm: &str, attr: &Attribution) -> Option<String> {
    let info = attr.info_of(pid);
    attribution::role(comm, info.as_deref()).or_else(|| {
        let cmd = info?.cmdline.join(" ");
        (!cmd.is_empty()).then(|| format!("`{}`", crate::model::truncate_chars(&cmd, 60)))
    })
}
