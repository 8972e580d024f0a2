//! One value over the run on the shared grid: per bucket the min, max and
//! last sample, and how charts read it back as columns.

use crate::model::grid::{Buckets, Grid};

/// Min, max and last value seen in one bucket (kB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) min_kb: u64,
    pub(crate) max_kb: u64,
    pub(crate) last_kb: u64,
}

impl Bucket {
    pub(super) fn of(kb: u64) -> Bucket {
        Bucket {
            min_kb: kb,
            max_kb: kb,
            last_kb: kb,
        }
    }

    /// `later` follows `self` in time.
    pub(super) fn merge(&mut self, later: Bucket) {
        self.min_kb = self.min_kb.min(later.min_kb);
        self.max_kb = self.max_kb.max(later.max_kb);
        self.last_kb = later.last_kb;
    }

    /// Which of the three a chart wants.
    pub(crate) fn pick(&self, p: Pick) -> u64 {
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
pub(crate) enum Pick {
    Min,
    Max,
    Last,
}

/// One value over time, on the grid; only buckets with a sample are stored,
/// so a short-lived process costs a few buckets, not [`BUCKETS`](super::BUCKETS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Line {
    pub(super) buckets: Buckets<Bucket>,
}

impl Line {
    pub(super) fn push(&mut self, grid: &Grid, ts: u64, kb: u64) {
        self.rescale(grid.width_ns);
        self.add(grid.index(ts), Bucket::of(kb));
    }

    fn add(&mut self, idx: u32, b: Bucket) {
        let buckets = &mut self.buckets.items;
        match buckets.last_mut() {
            Some((i, last)) if *i == idx => last.merge(b),
            Some((i, _)) if *i > idx => {
                // Per-CPU ring buffers deliver slightly out of order.
                match buckets.binary_search_by_key(&idx, |(i, _)| *i) {
                    Ok(p) => {
                        let cur = &mut buckets[p].1;
                        cur.min_kb = cur.min_kb.min(b.min_kb);
                        cur.max_kb = cur.max_kb.max(b.max_kb);
                    }
                    Err(p) => buckets.insert(p, (idx, b)),
                }
            }
            _ => buckets.push((idx, b)),
        }
    }

    /// Merges buckets to the grid's (larger, power-of-two multiple) width.
    pub(super) fn rescale(&mut self, width_ns: u64) {
        self.buckets.rescale(width_ns, Bucket::merge);
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.buckets.items.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.items.len()
    }

    /// (bucket start, bucket), in time order.
    pub(crate) fn points<'a>(&'a self, grid: &'a Grid) -> impl Iterator<Item = (u64, Bucket)> + 'a {
        self.buckets.items.iter().map(|&(i, b)| (grid.time(i), b))
    }

    /// Largest max over the whole line.
    pub(crate) fn max_kb(&self) -> u64 {
        self.buckets
            .items
            .iter()
            .map(|(_, b)| b.max_kb)
            .max()
            .unwrap_or(0)
    }

    /// The line resampled to `n` columns over `[from, to)`: per column the
    /// `pick` of its buckets; a column without a sample carries the last
    /// value before it (memory holds between samples). `None` before the
    /// first sample and from `until` on (the process had ended).
    pub(crate) fn columns(
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
        let buckets = &self.buckets.items;
        let mut j = 0;
        let mut carry: Option<u64> = None;
        for c in 0..n {
            let c0 = from + (span as u128 * c as u128 / n as u128) as u64;
            let c1 = from + (span as u128 * (c + 1) as u128 / n as u128) as u64;
            let mut v: Option<u64> = None;
            // Buckets that start before the column ends and end after it
            // starts overlap it; a bucket wider than a column feeds several.
            while j < buckets.len() && grid.time(buckets[j].0) + grid.width_ns <= c0 {
                carry = Some(buckets[j].1.last_kb);
                j += 1;
            }
            let mut k = j;
            while k < buckets.len() && grid.time(buckets[k].0) < c1.max(c0 + 1) {
                let b = buckets[k].1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescaling_keeps_min_max_last() {
        let mut l = Line::default();
        let mut g = Grid {
            origin_ns: 0,
            width_ns: 10,
        };
        l.buckets = Buckets::new(10);
        for (t, v) in [(0, 5), (5, 9), (10, 1), (15, 3)] {
            l.push(&g, t, v);
        }
        g.width_ns = 20;
        l.rescale(g.width_ns);
        assert_eq!(
            l.buckets.items,
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
    fn columns_carry_between_samples_and_stop_at_death() {
        let mut l = Line::default();
        let g = Grid {
            origin_ns: 0,
            width_ns: 10,
        };
        l.buckets = Buckets::new(10);
        l.push(&g, 0, 4);
        l.push(&g, 30, 8);
        let c = l.columns(&g, 0, 60, 6, Pick::Max, Some(50));
        assert_eq!(c, vec![Some(4), Some(4), Some(4), Some(8), Some(8), None]);
    }
}
