//! The `cgroup_limit` check: the memory cgroup this process is in and the
//! limits above it, found through /proc/self/mountinfo and
//! /proc/self/cgroup (`crate::util::mounts`, as the job's cgroup code finds it).

use std::fs;

use super::{Check, Status, check, fmt_bytes, pct, read};
use crate::util::mounts::{Mount, memory_cgroup_dir};

/// The memory cgroup this process is in, and its ancestors up to the
/// hierarchy's root: a parent's limit binds the children too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupFacts {
    /// 1 or 2.
    pub version: u8,
    /// Own cgroup first.
    pub levels: Vec<CgroupLevel>,
    /// OOM kills so far in the own cgroup (`oom_kill` of memory.events in v2,
    /// of memory.oom_control in v1 since 4.13).
    pub oom_kills: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLevel {
    /// Cgroup path as /proc/self/cgroup spells it, e.g. `/kubepods/pod1`.
    pub path: String,
    /// `None`: no limit (`max`, or v1's huge sentinel).
    pub limit: Option<u64>,
    pub usage: Option<u64>,
}

/// A limit file: `max` (v2) or a number; v1 writes "unlimited" as
/// PAGE_COUNTER_MAX pages in bytes (9223372036854771712 with 4 KiB pages).
pub fn parse_limit(text: &str) -> Option<Option<u64>> {
    let t = text.trim();
    if t == "max" {
        return Some(None);
    }
    let v: u64 = t.parse().ok()?;
    Some(if v >= 1 << 60 { None } else { Some(v) })
}

/// The value of `key` in a `key value` per line file (memory.events,
/// memory.oom_control).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

pub fn check_cgroup(cg: Option<&CgroupFacts>, mem_total: Option<u64>) -> Check {
    let id = "cgroup_limit";
    let Some(cg) = cg else {
        return check(
            id,
            Status::Info,
            "unknown",
            "no memory cgroup found for this process (/proc/self/cgroup, /proc/self/mountinfo)",
            "a container's memory limit makes the kernel kill inside the container (a memcg OOM) long before the machine runs out",
            "",
        );
    };
    let own = cg.levels.first();
    let own_path = own.map_or("/", |l| l.path.as_str());
    // The tightest limit on the way up is the one that binds.
    let binding = cg
        .levels
        .iter()
        .filter_map(|l| Some((l, l.limit?)))
        .min_by_key(|(_, lim)| *lim);
    let usage = own.and_then(|l| l.usage);
    let kills = match cg.oom_kills {
        Some(n) if n > 0 => format!("; {n} OOM kill(s) in this cgroup so far"),
        _ => String::new(),
    };
    let why = "a memory cgroup limit (a container's --memory, a pod's limits.memory, systemd's MemoryMax) makes the kernel kill inside the cgroup (a memcg OOM) while the machine still has free memory";
    let usage_s = usage
        .map(|u| format!(", usage {}", fmt_bytes(u)))
        .unwrap_or_default();
    match binding {
        None => check(
            id,
            if kills.is_empty() {
                Status::Ok
            } else {
                Status::Warn
            },
            "unlimited",
            format!(
                "cgroup v{} {own_path}: no memory limit{usage_s}{kills}; an OOM kill here is a global one",
                cg.version
            ),
            why,
            "",
        ),
        Some((lvl, lim)) if mem_total.is_some_and(|t| lim >= t) => check(
            id,
            if kills.is_empty() {
                Status::Ok
            } else {
                Status::Warn
            },
            "unlimited",
            format!(
                "cgroup v{} {own_path}: limit {} at {} is not below RAM ({}){usage_s}{kills}",
                cg.version,
                fmt_bytes(lim),
                lvl.path,
                fmt_bytes(mem_total.unwrap_or(0))
            ),
            why,
            "",
        ),
        Some((lvl, lim)) => {
            let near = usage.is_some_and(|u| u * 10 >= lim * 9);
            let at = if lvl.path == own_path {
                String::new()
            } else {
                format!(" set at ancestor {}", lvl.path)
            };
            check(
                id,
                if near || !kills.is_empty() {
                    Status::Warn
                } else {
                    Status::Info
                },
                "limited",
                format!(
                    "cgroup v{} {own_path}: limit {}{at}{}{kills}",
                    cg.version,
                    fmt_bytes(lim),
                    usage
                        .map(|u| format!(", usage {} ({}%)", fmt_bytes(u), pct(u, lim)))
                        .unwrap_or_default()
                ),
                why,
                "size the job below the limit, including page cache and /dev/shm, which count against it; or raise the limit; `trainbpf record --memory-limit` reproduces one",
            )
        }
    }
}

pub(super) fn gather_cgroup(mounts: &[Mount]) -> Option<CgroupFacts> {
    let (version, path, mut dir, top) = memory_cgroup_dir(&read("/proc/self/cgroup")?, mounts)?;
    let (limit_file, usage_file) = if version == 1 {
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    } else {
        ("memory.max", "memory.current")
    };
    let oom_kills = if version == 1 {
        fs::read_to_string(dir.join("memory.oom_control"))
            .ok()
            .and_then(|t| keyed(&t, "oom_kill"))
    } else {
        fs::read_to_string(dir.join("memory.events"))
            .ok()
            .and_then(|t| keyed(&t, "oom_kill"))
    };
    let mut levels = Vec::new();
    let mut cg_path = path;
    loop {
        let read_in = |f: &str| fs::read_to_string(dir.join(f)).ok();
        // The v2 root has no memory.max: it is never limited.
        let limit = read_in(limit_file).and_then(|t| parse_limit(&t)).flatten();
        let usage = read_in(usage_file).and_then(|t| t.trim().parse().ok());
        levels.push(CgroupLevel {
            path: cg_path.clone(),
            limit,
            usage,
        });
        if dir == top || !dir.pop() || !dir.starts_with(&top) {
            break;
        }
        cg_path = match cg_path.rfind('/') {
            Some(0) | None => "/".to_string(),
            Some(i) => cg_path[..i].to_string(),
        };
    }
    Some(CgroupFacts {
        version,
        levels,
        oom_kills,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_max_and_the_v1_sentinel_mean_unlimited() {
        assert_eq!(parse_limit("max\n"), Some(None));
        assert_eq!(parse_limit("9223372036854771712\n"), Some(None));
        assert_eq!(parse_limit("314572800\n"), Some(Some(300 << 20)));
        assert_eq!(parse_limit("garbage"), None);
        assert_eq!(
            keyed("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n", "oom_kill"),
            Some(2)
        );
        assert_eq!(
            keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", "oom_kill"),
            Some(5)
        );
    }

    fn level(path: &str, limit: Option<u64>, usage: Option<u64>) -> CgroupLevel {
        CgroupLevel {
            path: path.into(),
            limit,
            usage,
        }
    }

    #[test]
    fn cgroup_limit_checks() {
        let ram = Some(24u64 << 30);
        let cg = |levels, kills| CgroupFacts {
            version: 2,
            levels,
            oom_kills: kills,
        };
        let c = check_cgroup(
            Some(&cg(
                vec![level("/a", None, Some(1 << 20)), level("/", None, None)],
                Some(0),
            )),
            ram,
        );
        assert_eq!((c.state.as_str(), c.status), ("unlimited", Status::Ok));
        // A parent's limit binds the child.
        let c = check_cgroup(
            Some(&cg(
                vec![
                    level("/pod/c", None, Some(100 << 20)),
                    level("/pod", Some(300 << 20), None),
                ],
                None,
            )),
            ram,
        );
        assert_eq!((c.state.as_str(), c.status), ("limited", Status::Info));
        assert!(
            c.finding
                .contains("limit 300 MiB set at ancestor /pod, usage 100 MiB (33%)"),
            "{}",
            c.finding
        );
        // Near the limit, or kills already: warn.
        let c = check_cgroup(
            Some(&cg(
                vec![level("/j", Some(300 << 20), Some(290 << 20))],
                None,
            )),
            ram,
        );
        assert_eq!(c.status, Status::Warn);
        assert_eq!(
            c.finding,
            "cgroup v2 /j: limit 300 MiB, usage 290 MiB (97%)"
        );
        let c = check_cgroup(Some(&cg(vec![level("/j", None, None)], Some(3))), ram);
        assert_eq!(c.status, Status::Warn);
        assert!(c.finding.contains("3 OOM kill(s)"));
        // A limit above RAM does not bind.
        let c = check_cgroup(
            Some(&cg(vec![level("/j", Some(64 << 30), None)], None)),
            ram,
        );
        assert_eq!(c.state, "unlimited");
        assert_eq!(check_cgroup(None, ram).state, "unknown");
    }
}
