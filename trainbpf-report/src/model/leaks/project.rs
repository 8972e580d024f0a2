//! The projection: when the leaks still alive at the end reach the limit,
//! at their summed rate (see the module docs).

use std::collections::VecDeque;

use super::{Domain, Projection, SEC, Trend};

/// Recent usage against the limits, for the projection.
#[derive(Clone, Copy, Debug)]
pub(super) struct Usage {
    pub(super) ts: u64,
    pub(super) cgroup: Option<(u64, Option<u64>)>,
    pub(super) machine_used_kb: u64,
    pub(super) machine_kb: u64,
}

/// Headroom over the live leaks' summed slope, from the `usage` samples
/// kept, as of `end`; `job_limit_kb`: the job's limit as the recording's
/// start gave it, for a cgroup that reports none.
pub(super) fn project(
    usage: &VecDeque<Usage>,
    job_limit_kb: Option<u64>,
    end: u64,
    trends: &[Trend],
    counts: fn(&Trend) -> bool,
) -> Option<Projection> {
    let latest = usage.back()?;
    let slope = live_slope(trends, counts);
    // Each recent sample carried forward to the end at the leaks' rate;
    // the highest is where usage stands: a sawtooth's teeth count, and
    // so does growth since a stale or coarse sample (cgroup v1 reports
    // usage in lagging steps).
    let max_of = |f: &dyn Fn(&Usage) -> Option<u64>| {
        usage
            .iter()
            .filter_map(|u| {
                let ahead = slope.max(0.0) * end.saturating_sub(u.ts) as f64 / SEC;
                f(u).map(|kb| (kb as f64 + ahead) as u64)
            })
            .max()
    };
    let cgroup_limit = latest.cgroup.and_then(|c| c.1).or(job_limit_kb);
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

/// The live leaks' slopes (the trends `counts` takes), each process once:
/// a group counts for what its leaking members do not already explain.
pub(super) fn live_slope(trends: &[Trend], counts: fn(&Trend) -> bool) -> f64 {
    let live = |t: &&Trend| counts(t) && t.alive;
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
