//! The time grid that the whole-run views share: the charts' memory lines
//! (`series`) and the leak model's trends (`leaks`).
//!
//! A 24-hour recording holds millions of samples, and a view of the whole
//! run must not keep memory in proportion to them. So a line lives on a grid
//! of at most a fixed number of buckets that starts at the run's first event:
//! when the run outgrows it, the bucket width doubles ([`Grid::cover`]) and
//! each line merges its buckets pairwise ([`Buckets::rescale`]), lazily, the
//! next time it is touched. What a bucket keeps, and how two of them merge,
//! is each view's own: a chart keeps min, max and last, a trend the value
//! integrated over time.
//!
//! Per-process lines are looked up per event, hence [`KeyMap`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::decode::ProcKey;

/// Width of a bucket until the run outgrows the grid: fine enough that a
/// 20-second test run still has 400 buckets.
pub(crate) const FIRST_WIDTH_NS: u64 = 50_000_000;

/// The run's time grid: bucket `i` covers `[origin + i·width, origin + (i+1)·width)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    pub(crate) origin_ns: u64,
    pub(crate) width_ns: u64,
}

impl Default for Grid {
    fn default() -> Self {
        Grid::starting_at(0)
    }
}

impl Grid {
    /// A grid whose first bucket opens at `origin_ns`, at the first width.
    pub(crate) fn starting_at(origin_ns: u64) -> Grid {
        Grid {
            origin_ns,
            width_ns: FIRST_WIDTH_NS,
        }
    }

    /// Doubles the width until `now` falls within `buckets` buckets of the
    /// origin.
    pub(super) fn cover(&mut self, now: u64, buckets: u32) {
        // Bounded: a corrupt timestamp must not overflow the width.
        while now.saturating_sub(self.origin_ns) >= buckets as u64 * self.width_ns
            && self.width_ns < u64::MAX / (4 * buckets as u64)
        {
            self.width_ns *= 2;
        }
    }

    pub(super) fn index(&self, ts: u64) -> u32 {
        // Records a little out of order before the first event land in the
        // first bucket.
        (ts.saturating_sub(self.origin_ns) / self.width_ns).min(u32::MAX as u64) as u32
    }

    /// Start of bucket `i`.
    pub(crate) fn time(&self, i: u32) -> u64 {
        self.origin_ns
            .saturating_add((i as u64).saturating_mul(self.width_ns))
    }

    /// End of bucket `i` (the start of the next).
    pub(super) fn end(&self, i: u32) -> u64 {
        self.origin_ns
            .saturating_add((i as u64 + 1).saturating_mul(self.width_ns))
    }

    /// Middle of bucket `i`, seconds since the origin.
    pub(super) fn mid_s(&self, i: u32) -> f64 {
        (i as f64 + 0.5) * self.width_ns as f64 / 1e9
    }
}

/// One line's buckets, ascending by index, at the width they were last
/// merged to; it trails the grid's until [`Buckets::rescale`] catches up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Buckets<T> {
    width_ns: u64,
    pub(super) items: Vec<(u32, T)>,
}

impl<T> Default for Buckets<T> {
    fn default() -> Self {
        Buckets::new(FIRST_WIDTH_NS)
    }
}

impl<T> Buckets<T> {
    pub(super) fn new(width_ns: u64) -> Buckets<T> {
        Buckets {
            width_ns,
            items: Vec::new(),
        }
    }
}

impl<T: Copy> Buckets<T> {
    /// Merges buckets to the grid's (larger, power-of-two multiple) width;
    /// `merge(earlier, later)` folds two neighbours into one.
    pub(super) fn rescale(&mut self, width_ns: u64, merge: impl Fn(&mut T, T)) {
        if self.width_ns >= width_ns {
            return;
        }
        let shift = (width_ns / self.width_ns).trailing_zeros();
        self.width_ns = width_ns;
        let mut out: Vec<(u32, T)> = Vec::with_capacity(self.items.len() / 2 + 1);
        for &(i, b) in &self.items {
            let j = i.checked_shr(shift).unwrap_or(0);
            match out.last_mut() {
                Some((k, last)) if *k == j => merge(last, b),
                _ => out.push((j, b)),
            }
        }
        self.items = out;
    }
}

/// Two bucket lists merged by index: a bucket in one only is kept, one in
/// both becomes `both(a, b)`.
pub(super) fn merge_by_index<T: Copy>(
    a: &[(u32, T)],
    b: &[(u32, T)],
    both: impl Fn(T, T) -> T,
) -> Vec<(u32, T)> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if j >= b.len() || (i < a.len() && a[i].0 < b[j].0) {
            out.push(a[i]);
            i += 1;
        } else if i >= a.len() || b[j].0 < a[i].0 {
            out.push(b[j]);
            j += 1;
        } else {
            out.push((a[i].0, both(a[i].1, b[j].1)));
            i += 1;
            j += 1;
        }
    }
    out
}

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

/// Per-process lines, by [`ProcKey`].
pub(super) type KeyMap<V> = HashMap<ProcKey, V, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn the_grid_starts_at_the_first_event_and_doubles_to_cover_the_run() {
        let mut g = Grid::starting_at(10 * SEC);
        g.cover(10 * SEC, 4);
        assert_eq!(g.width_ns, FIRST_WIDTH_NS);
        // Just inside four buckets: no change; at their end: one doubling.
        g.cover(10 * SEC + 4 * FIRST_WIDTH_NS - 1, 4);
        assert_eq!(g.width_ns, FIRST_WIDTH_NS);
        g.cover(10 * SEC + 4 * FIRST_WIDTH_NS, 4);
        assert_eq!(g.width_ns, 2 * FIRST_WIDTH_NS);
        // An hour later: as many doublings as it takes, and no more.
        g.cover(3600 * SEC, 4);
        assert!(4 * g.width_ns > 3590 * SEC && 2 * g.width_ns <= 3590 * SEC);
        assert_eq!(g.index(10 * SEC + g.width_ns), 1);
        assert_eq!(g.index(0), 0, "before the origin: the first bucket");
        assert_eq!(g.time(1), g.end(0));
        assert_eq!(g.mid_s(0), g.width_ns as f64 / 2e9);
    }

    #[test]
    fn a_corrupt_timestamp_neither_overflows_the_width_nor_the_times() {
        let mut g = Grid::starting_at(0);
        g.cover(u64::MAX, 512);
        assert!(g.width_ns < u64::MAX / 1024);
        assert_eq!(g.time(u32::MAX), u64::MAX);
        let fine = Grid {
            origin_ns: 0,
            width_ns: 1,
        };
        assert_eq!(fine.index(u64::MAX), u32::MAX);
    }

    #[test]
    fn rescaling_merges_neighbours_in_time_order() {
        let mut b: Buckets<(u32, u32)> = Buckets::new(10);
        b.items = vec![(0, (1, 1)), (1, (2, 2)), (3, (3, 3)), (4, (4, 4))];
        // (first, last) of each merged pair.
        let merge = |a: &mut (u32, u32), later: (u32, u32)| a.1 = later.1;
        b.rescale(20, merge);
        assert_eq!(b.items, vec![(0, (1, 2)), (1, (3, 3)), (2, (4, 4))]);
        b.rescale(80, merge);
        assert_eq!(b.items, vec![(0, (1, 4))]);
        // Never narrower.
        b.rescale(40, merge);
        assert_eq!(b.items, vec![(0, (1, 4))]);
    }

    #[test]
    fn merging_by_index_keeps_both_sides_and_combines_the_shared() {
        let a = [(0, 1), (2, 10), (5, 100)];
        let b = [(1, 2), (2, 20), (6, 200)];
        assert_eq!(
            merge_by_index(&a, &b, |x, y| x + y),
            vec![(0, 1), (1, 2), (2, 30), (5, 100), (6, 200)]
        );
        assert_eq!(merge_by_index(&a, &[], |x, y| x + y), a.to_vec());
        assert_eq!(merge_by_index(&[], &b, |x, y| x + y), b.to_vec());
    }
}
