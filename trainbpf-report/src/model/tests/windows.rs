//! The windows before kills, as charted.

use super::*;

/// A job that filled its cgroup between two pressure samples: the window's
/// cgroup line ends at the kernel's own usage for the job's cgroup, not at
/// the last sample's 0 KiB; another cgroup's OOM leaves it alone.
#[test]
fn the_cgroup_line_ends_at_the_kernels_usage_at_the_kill() {
    use crate::model::diagnosis::fixture::{job, kill};
    let mut r = job(700, 300);
    let mut k = kill(700, "python3", 300);
    k.constraint = Constraint::Memcg;
    k.memcg = Some("/trainbpf/job".into());
    r.kills = vec![k.clone()];
    let window = |k: &Kill| KillWindow {
        kill_ns: k.ts_ns,
        start_ns: k.ts_ns - 1_000,
        step_ns: 10,
        victim_pid: k.victim.pid,
        lines: vec![],
        mem_available: vec![],
        mem_total_kb: None,
        cgroup_usage: vec![Some(0), None, None],
        cgroup_limit_kb: None,
    };
    r.series.windows = vec![window(&k)];
    assert_eq!(
        r.job.as_ref().unwrap().cgroup,
        k.memcg,
        "the fixture's OOM is the job's cgroup"
    );
    r.cgroup_at_kills();
    let w = &r.series.windows[0];
    assert_eq!(w.cgroup_usage, vec![Some(0), None, k.memcg_usage_kb]);
    assert_eq!(w.cgroup_limit_kb, k.memcg_limit_kb);
    r.series.windows = vec![window(&k)];
    r.kills[0].memcg = Some("/elsewhere".into());
    r.cgroup_at_kills();
    assert_eq!(r.series.windows[0].cgroup_usage, vec![Some(0), None, None]);
}
