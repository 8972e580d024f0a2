//! Who gets a line: one process's memory over the run, the ended job
//! processes folded into one, and the job's short-lived processes counted
//! by name.

use std::collections::HashMap;

use crate::decode::ProcKey;

use super::line::{Bucket, Line, Pick};
use crate::model::Process;
use crate::model::grid::{Grid, merge_by_index};

/// One process's memory (resident: anon + file + shmem) over the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProcLine {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    /// What the chart calls it (`Report::name`): its comm, or its rank.
    pub(crate) name: String,
    pub(crate) in_job: bool,
    pub(crate) parent: Option<ProcKey>,
    /// Its fork, when recorded.
    pub(crate) born_ns: Option<u64>,
    /// Its exit, when recorded (job processes only).
    pub(crate) died_ns: Option<u64>,
    pub(crate) peak_kb: u64,
    pub(crate) peak_ns: u64,
    pub(crate) oom_killed: bool,
    pub(crate) rss: Line,
    /// A kill's victim or top grower: never folded into "others".
    pub(crate) pinned: bool,
    /// Its last exec: the line and its peak start there (a fork holds its
    /// parent's pages until it execs).
    pub(crate) exec_ns: Option<u64>,
}

impl ProcLine {
    pub(super) fn new(key: ProcKey, comm: String, in_job: bool) -> ProcLine {
        ProcLine {
            pid: key.tgid,
            start_ns: key.start_ns,
            name: comm.clone(),
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
            exec_ns: None,
        }
    }

    pub(crate) fn key(&self) -> ProcKey {
        ProcKey {
            tgid: self.pid,
            start_ns: self.start_ns,
        }
    }

    pub(super) fn push(&mut self, grid: &Grid, ts: u64, kb: u64) {
        if ts < self.exec_ns.unwrap_or(0) {
            return;
        }
        self.rss.push(grid, ts, kb);
        if kb > self.peak_kb {
            self.peak_kb = kb;
            self.peak_ns = ts;
        }
    }

    /// What it held before an exec was its parent's: start over.
    pub(super) fn on_exec(&mut self, ts: u64) {
        self.exec_ns = Some(ts);
        // As a line that has seen nothing yet.
        self.rss = Line::default();
        self.peak_kb = 0;
        self.peak_ns = 0;
    }

    /// Columns of its memory, `None` outside its life.
    pub(crate) fn columns(&self, grid: &Grid, from: u64, to: u64, n: usize) -> Vec<Option<u64>> {
        self.rss.columns(grid, from, to, n, Pick::Max, self.died_ns)
    }
}

/// Job processes folded into one line: per bucket, the largest of them.
///
/// Not their sum: on a long run a bucket spans several generations of
/// workers that never lived at the same time, and summing their maxima would
/// invent memory no one held. The cgroup's usage line gives the total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Folded {
    pub(crate) count: u64,
    /// Per bucket, the largest folded process (min, max and last each the
    /// largest of theirs).
    pub(crate) rss: Line,
    /// The largest single peak among them.
    pub(crate) peak_kb: u64,
}

impl Folded {
    pub(super) fn fold(&mut self, grid: &Grid, p: ProcLine) {
        self.count += 1;
        self.peak_kb = self.peak_kb.max(p.peak_kb);
        self.rss.rescale(grid.width_ns);
        let mut rss = p.rss;
        rss.rescale(grid.width_ns);
        // A process holds its memory between samples: fill the gaps so that
        // the line does not dip where one of them happened not to report.
        let mut prev: Option<(u32, u64)> = None;
        let mut add = Vec::new();
        for &(i, b) in &rss.buckets.items {
            if let Some((pi, last)) = prev {
                for gap in pi + 1..i {
                    add.push((gap, Bucket::of(last)));
                }
            }
            add.push((i, b));
            prev = Some((i, b.last_kb));
        }
        let merged = merge_by_index(&self.rss.buckets.items, &add, envelope);
        self.rss.buckets.items = merged;
    }
}

/// Per bucket, the larger of each value.
fn envelope(x: Bucket, y: Bucket) -> Bucket {
    Bucket {
        min_kb: x.min_kb.max(y.min_kb),
        max_kb: x.max_kb.max(y.max_kb),
        last_kb: x.last_kb.max(y.last_kb),
    }
}

/// Job processes of one name that were born and ended during the run
/// (e.g. `pt_data_worker ×96`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Churn {
    pub(crate) comm: String,
    pub(crate) count: u64,
    pub(crate) shortest_ns: u64,
    pub(crate) longest_ns: u64,
    /// The largest peak among them.
    pub(crate) peak_kb: u64,
}

/// Job processes born and ended while recording, grouped by name.
pub(super) fn came_and_went<'a>(processes: impl Iterator<Item = &'a Process>) -> Vec<Churn> {
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
