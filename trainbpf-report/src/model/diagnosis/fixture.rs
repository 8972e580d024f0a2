//! Reports built by hand for the rules' unit tests: a job, its processes
//! and one kill, with only the fields a rule reads set, so that each test
//! says which figures make its rule fire and which keep it quiet.

use crate::model::{Job, Kill, Process, Report};

/// A job of `pid` with a memory cgroup limit of `limit_mib`.
pub(crate) fn job(pid: u32, limit_mib: u64) -> Report {
    Report {
        job: Some(Job {
            pid,
            start_ns: 1,
            argv: vec!["python".into(), "train.py".into()],
            cgroup: Some("/trainbpf/job".into()),
            memory_limit_bytes: Some(limit_mib << 20),
            ..Job::default()
        }),
        first_ns: Some(0),
        last_ns: Some(100_000_000_000),
        ..Report::default()
    }
}

/// A process of the job, alive for the whole run.
pub(crate) fn process(pid: u32, parent: Option<u32>, comm: &str, peak_rss_mib: u64) -> Process {
    Process {
        pid,
        start_ns: pid as u64,
        comm: comm.into(),
        parent: parent.map(|p| crate::decode::ProcKey {
            tgid: p,
            start_ns: p as u64,
        }),
        born_ns: Some(0),
        peak_rss_kb: peak_rss_mib << 10,
        ..Process::default()
    }
}

/// A kill of `victim` at 50 s in a memcg limited to `limit_mib`.
pub(crate) fn kill(victim: u32, comm: &str, limit_mib: u64) -> Kill {
    let mut k = Kill {
        ts_ns: 50_000_000_000,
        memcg_limit_kb: Some(limit_mib << 10),
        memcg_usage_kb: Some(limit_mib << 10),
        window_ns: 60_000_000_000,
        ..Kill::default()
    };
    k.victim.pid = victim;
    k.victim.start_ns = victim as u64;
    k.victim.comm = comm.into();
    k.victim.in_job = true;
    k
}

/// A grower of a kill: `honest_mib` added and `rss_mib` resident at the
/// kill, born in its window.
pub(crate) fn grower(pid: u32, honest_mib: i64, rss_mib: u64) -> crate::model::Grower {
    crate::model::Grower {
        pid,
        start_ns: pid as u64,
        comm: "python3".into(),
        grew_kb: rss_mib << 10,
        honest_kb: Some(honest_mib << 10),
        window_ns: 10_000_000_000,
        rate_kb_per_s: None,
        rss_kb: rss_mib << 10,
        in_job: true,
        born_in_window: true,
        is_victim: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that grew to its limit and was killed is no diagnosis by
    /// itself until a rule finds its cause: the fixture alone must not
    /// make every rule fire.
    #[test]
    fn a_bare_kill_has_few_diagnoses() {
        let mut r = job(100, 512);
        r.processes = vec![process(100, None, "python", 500)];
        r.kills = vec![kill(100, "python", 512)];
        let d = crate::model::diagnosis::diagnose(&r);
        assert!(d.len() <= 2, "{d:#?}");
    }
}
