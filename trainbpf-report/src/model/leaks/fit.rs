//! The fit: Siegel's repeated median line through a series, and the tests
//! that make a climb a suspected leak (see the module docs).

use crate::model::grid::Grid;

use super::{FIT_POINTS, LeakOptions, MIN_POINTS, PART_SLOPE, SEC, STARTS, Trend, Verdict};

/// A line through points, and how well it fits them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Fit {
    /// Per second.
    pub(crate) slope: f64,
    pub(crate) intercept: f64,
    /// Share of the variance explained, 0..1 (0 for a flat series), with
    /// medians of squares for means.
    pub(crate) r2: f64,
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
pub(super) fn fit(p: &[(f64, f64)]) -> Fit {
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
pub(super) fn judge(grid: &Grid, series: &[(u32, f64)], size_kb: u64, o: &LeakOptions) -> Trend {
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
        since_ns: grid.time(series[s].0),
        until_ns: 0,
        growth_kb: growth_kb.round() as i64,
        size_kb,
        verdict: st.verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
