//! `container_limit`: a memory cgroup far smaller than the machine killed
//! the job.
//!
//! The machine may have had plenty free: the job ran out of what its
//! container, pod, unit, Slurm job or `--memory-limit` allowed. The fix
//! is set where that cgroup was made, which its path tells
//! ([`cgroup_path`](crate::model::cgroup_path)).

use super::workers::{limit_of, pct};
use super::{Confidence, Diagnosis};
use crate::model::cgroup_path::{self, Origin};
use crate::model::{Constraint, Kill, Report};
use crate::units::human_kb;

/// "Far below the machine": at most this share of its RAM.
const MAX_SHARE_PCT: u64 = 50;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    let machine_kb = report.header.mem_total_kb;
    if machine_kb == 0 {
        return;
    }
    for (idx, kill) in report.kills.iter().enumerate() {
        if !kill.victim.in_job || kill.constraint != Constraint::Memcg {
            continue;
        }
        let Some((limit_kb, true)) = limit_of(report, kill) else {
            continue;
        };
        if pct(limit_kb, machine_kb) > MAX_SHARE_PCT {
            continue;
        }
        out.push(diagnose(idx, kill, limit_kb, machine_kb));
    }
}

fn diagnose(idx: usize, kill: &Kill, limit_kb: u64, machine_kb: u64) -> Diagnosis {
    let path = kill.memcg.as_deref().unwrap_or("");
    let origin = cgroup_path::parse(path);
    let by = match origin.manager() {
        Some(m) => format!(" (set by {m})"),
        None => String::new(),
    };
    let limit = human_kb(limit_kb);
    let title = format!(
        "The job hit its memory cgroup's {limit} limit{by}, {}% of the machine's {}",
        pct(limit_kb, machine_kb).max(1),
        human_kb(machine_kb)
    );
    let mut evidence = vec![format!(
        "memory cgroup {}: {}",
        if path.is_empty() { "?" } else { path },
        origin.describe()
    )];
    let usage = kill
        .memcg_usage_kb
        .or(kill.pressure.as_ref().and_then(|p| p.cgroup_usage_kb))
        .filter(|&u| u > 0);
    evidence.push(match usage {
        Some(u) => format!(
            "limit {limit}; peak usage {} at the kill ({}% of the limit){}",
            human_kb(u),
            pct(u, limit_kb),
            kill.memcg_failcnt
                .filter(|&f| f > 0)
                .map_or(String::new(), |f| format!("; the limit was hit {f} times"))
        ),
        None => format!("limit {limit}; the cgroup's usage at the kill was not recorded"),
    });
    let victim_kb = kill.victim.rss.resident_kb();
    if victim_kb > 0 {
        evidence.push(format!(
            "the victim, {} (pid {}), held {} resident",
            kill.victim.comm,
            kill.victim.pid,
            human_kb(victim_kb)
        ));
    }
    let available = kill
        .pressure
        .as_ref()
        .map(|p| p.available_at_kill_kb)
        .filter(|&a| a > 0);
    evidence.push(match available {
        Some(a) => format!(
            "the machine has {} of RAM, {} of it available at the kill",
            human_kb(machine_kb),
            human_kb(a)
        ),
        None => format!("the machine has {} of RAM", human_kb(machine_kb)),
    });
    let fix = vec![
        raise(&origin, path),
        "Or lower the job's peak to fit: the other diagnoses of this kill say what grew".into(),
    ];
    Diagnosis {
        id: "container_limit",
        confidence: Confidence::Medium,
        title,
        evidence,
        fix,
        kill: Some(idx),
        pids: vec![kill.victim.pid],
    }
}

/// Where to raise the limit, for whoever set it.
fn raise(origin: &Origin, path: &str) -> String {
    match origin {
        Origin::Trainbpf { .. } => {
            "Raise `trainbpf record --memory-limit` (it stands in for the container's limit: set it to what the job will have)".into()
        }
        Origin::Docker { engine, container_id } => format!(
            "Raise the container's limit: `{} run --memory=SIZE` (or `{} update --memory=SIZE --memory-swap=SIZE {}`), or `mem_limit`/`deploy.resources.limits.memory` in Compose",
            engine.to_lowercase(),
            engine.to_lowercase(),
            cgroup_path::short_id(container_id)
        ),
        Origin::Kubernetes { qos, .. } => format!(
            "Raise the container's `resources.limits.memory` in the pod spec (the pod is {qos}; set requests.memory to match so the scheduler places it where that much is free)"
        ),
        Origin::Slurm { job, .. } => format!(
            "Ask Slurm for more: `--mem=SIZE` (or `--mem-per-cpu`/`--mem-per-gpu`) in the job script; `sacct -j {job} -o JobID,ReqMem,MaxRSS,State` shows what it had"
        ),
        Origin::SystemdUser {
            unit: Some(unit), ..
        }
        | Origin::Systemd { unit } => format!(
            "Raise the unit's MemoryMax=: `systemctl set-property {unit} MemoryMax=SIZE` (add --user for a user unit), or `systemd-run -p MemoryMax=SIZE` for a new one"
        ),
        Origin::SystemdUser { unit: None, .. } => {
            "Raise the user slice's MemoryMax= (`systemctl set-property user-UID.slice MemoryMax=SIZE`)".into()
        }
        Origin::Unknown => format!(
            "Raise the memory cgroup's limit where it is set (memory.max, or memory.limit_in_bytes on cgroup v1, of {})",
            if path.is_empty() { "the job's cgroup" } else { path }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::diagnosis::fixture::{job, kill, process};

    /// A memcg kill of the job under a `limit_mib` cgroup at `path` on a
    /// 24 GiB machine.
    fn killed(limit_mib: u64, path: &str) -> Report {
        let mut r = job(100, limit_mib);
        r.header.mem_total_kb = 24 << 20;
        r.processes = vec![process(100, None, "python3", limit_mib - 10)];
        let mut k = kill(100, "python3", limit_mib);
        k.constraint = Constraint::Memcg;
        k.memcg = Some(path.into());
        k.victim.rss.anon_kb = (limit_mib - 10) << 10;
        r.kills = vec![k];
        r
    }

    #[test]
    fn a_docker_limit_far_below_the_machine_fires() {
        let id = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";
        let r = killed(2048, &format!("/system.slice/docker-{id}.scope"));
        let mut out = Vec::new();
        check(&r, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let d = &out[0];
        assert_eq!(
            d.title,
            "The job hit its memory cgroup's 2 GiB limit (set by Docker), 8% of the machine's 24 GiB"
        );
        assert!(
            d.evidence[0].ends_with("Docker container 3f2a1b4c5d6e"),
            "{d:#?}"
        );
        assert!(
            d.evidence[1]
                .starts_with("limit 2 GiB; peak usage 2 GiB at the kill (100% of the limit)"),
            "{d:#?}"
        );
        assert!(d.fix[0].contains("docker run --memory=SIZE"), "{d:#?}");
        assert!(d.fix[0].contains("3f2a1b4c5d6e"), "{d:#?}");
    }

    #[test]
    fn the_fix_names_where_each_manager_sets_the_limit() {
        for (path, want) in [
            (
                "/kubepods/burstable/pod1234/abcd",
                "resources.limits.memory",
            ),
            ("/slurm/uid_1000/job_123/step_0", "--mem=SIZE"),
            (
                "/system.slice/train.service",
                "systemctl set-property train.service",
            ),
            ("/trainbpf-77-0123456789abcdef", "--memory-limit"),
            ("/somewhere/else", "memory.max"),
        ] {
            let mut out = Vec::new();
            check(&killed(1024, path), &mut out);
            assert_eq!(out.len(), 1, "{path}");
            assert!(out[0].fix[0].contains(want), "{path}: {:#?}", out[0]);
        }
    }

    #[test]
    fn a_limit_near_the_machines_size_or_a_global_oom_does_not() {
        let mut out = Vec::new();
        check(&killed(20 << 10, "/docker/x"), &mut out);
        assert!(out.is_empty(), "{out:#?}");
        let mut r = killed(1024, "/docker/x");
        r.kills[0].constraint = Constraint::None;
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
        // Another cgroup's kill, outside the job, is not the job's.
        let mut r = killed(1024, "/docker/x");
        r.kills[0].victim.in_job = false;
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }
}
