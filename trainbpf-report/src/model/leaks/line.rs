//! A process's honest memory on the shared grid, as the time-weighted mean
//! of what it held in each bucket, and a role group's members summed.

use crate::model::grid::{Buckets, Grid, merge_by_index};

/// Buckets one hold may fill: a grid covers its run in far fewer
/// (`leaks::BUCKETS`).
const MAX_SPAN: u32 = 4096;

/// One bucket of a process's series: the value held, integrated over the
/// time the bucket saw, and the last value.
#[derive(Clone, Copy, Debug)]
pub(super) struct Acc {
    /// kB × ns.
    integral: f64,
    covered_ns: u64,
    last: f64,
}

impl Acc {
    /// The time-weighted mean; the last value for a bucket no time has
    /// passed in yet.
    pub(super) fn mean(&self) -> f64 {
        if self.covered_ns == 0 {
            self.last
        } else {
            self.integral / self.covered_ns as f64
        }
    }

    /// `later` follows `self` in time.
    fn merge(&mut self, later: Acc) {
        self.integral += later.integral;
        self.covered_ns += later.covered_ns;
        self.last = later.last;
    }
}

/// One process's honest memory on the grid. Each value holds until the
/// next, so a bucket's value is the time-weighted mean of what was held in
/// it: a burst of records weighs no more than a quiet stretch.
#[derive(Clone, Debug)]
pub(super) struct Line {
    /// Contiguous bucket indexes.
    pub(super) buckets: Buckets<Acc>,
    /// The latest value and since when it holds.
    pub(super) held: Option<(u64, f64)>,
}

impl Line {
    pub(super) fn new(width_ns: u64) -> Line {
        Line {
            buckets: Buckets::new(width_ns),
            held: None,
        }
    }

    pub(super) fn push(&mut self, grid: &Grid, ts: u64, v: f64) {
        // Per-CPU ring buffers deliver slightly out of order: a late record
        // counts from the latest time seen.
        let ts = self.held.map_or(ts, |(t, _)| ts.max(t));
        self.hold_until(grid, ts);
        self.held = Some((ts, v));
        self.bucket(grid.index(ts), v).last = v;
    }

    /// Spreads the value held over the buckets up to `end`, which the grid
    /// covers (`Grid::cover`); past `MAX_SPAN` buckets the rest is one
    /// step, so that a caller that did not cover it costs no more.
    pub(super) fn hold_until(&mut self, grid: &Grid, end: u64) {
        self.rescale(grid.width_ns);
        let Some((mut t, v)) = self.held else { return };
        let first = grid.index(t);
        while t < end {
            let idx = grid.index(t);
            // Past the grid's reach (a corrupt timestamp) the rest is one
            // step.
            let to = match grid.end(idx).min(end) {
                _ if idx.saturating_sub(first) >= MAX_SPAN => end,
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
        let buckets = &mut self.buckets.items;
        if buckets.last().is_none_or(|(i, _)| *i < idx) {
            buckets.push((
                idx,
                Acc {
                    integral: 0.0,
                    covered_ns: 0,
                    last: carry,
                },
            ));
        }
        let last = buckets.len() - 1;
        &mut buckets[last].1
    }

    fn rescale(&mut self, width_ns: u64) {
        self.buckets.rescale(width_ns, Acc::merge);
    }

    /// (bucket, time-weighted mean), every bucket from the first on.
    pub(super) fn means(&self) -> Vec<(u32, f64)> {
        self.buckets
            .items
            .iter()
            .map(|&(i, a)| (i, a.mean()))
            .collect()
    }

    /// (bucket, kB × ns held in it), every bucket from the first on.
    pub(super) fn integrals(&self) -> Vec<(u32, f64)> {
        self.buckets
            .items
            .iter()
            .map(|&(i, a)| (i, a.integral))
            .collect()
    }
}

/// A role group's members summed, bucket by bucket: kB × ns, so that a
/// member counts for the share of a bucket it lived, and a worker and the
/// one respawned after it share a bucket without doubling it.
#[derive(Clone, Debug)]
pub(super) struct SumLine {
    buckets: Buckets<f64>,
}

impl SumLine {
    pub(super) fn new(width_ns: u64) -> SumLine {
        SumLine {
            buckets: Buckets::new(width_ns),
        }
    }

    pub(super) fn rescale(&mut self, width_ns: u64) {
        self.buckets.rescale(width_ns, |s, v| *s += v);
    }

    pub(super) fn add(&mut self, member: &[(u32, f64)]) {
        self.buckets.items = merge_by_index(&self.buckets.items, member, |a, b| a + b);
    }

    /// The sum alive, every bucket from the first through the one holding
    /// `end_ns` (which counts only the time up to it); a bucket no member
    /// lived in holds nothing.
    pub(super) fn values(&self, grid: &Grid, end_ns: u64) -> Vec<(u32, f64)> {
        let Some(&(first, _)) = self.buckets.items.first() else {
            return Vec::new();
        };
        let last = grid.index(end_ns).max(first);
        let mut it = self.buckets.items.iter().peekable();
        (first..=last)
            .map(|i| {
                let span = if i == last {
                    end_ns.saturating_sub(grid.time(i)).clamp(1, grid.width_ns)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold to a time the grid does not cover (a damaged timestamp)
    /// fills a bounded number of buckets, not one per width up to it: a
    /// fuzzed recording made 2.8 million (64 MiB) before.
    #[test]
    fn a_hold_past_the_grid_stays_bounded() {
        let grid = Grid::starting_at(0);
        let mut line = Line::new(grid.width_ns);
        line.push(&grid, 0, 100.0);
        line.hold_until(&grid, 1 << 50);
        assert!(line.buckets.items.len() <= MAX_SPAN as usize + 1);
        let total: u64 = line.buckets.items.iter().map(|(_, a)| a.covered_ns).sum();
        assert_eq!(total, 1 << 50, "all the time is held");
    }
}
