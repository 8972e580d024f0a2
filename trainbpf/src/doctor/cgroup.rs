//! The `cgroup_limit` check: the memory cgroup this process is in and the
//! limits above it, found through /proc/self/mountinfo and
//! /proc/self/cgroup (the job's cgroup code finds its cgroup the same way).

use std::{
    fs,
    path::{Path, PathBuf},
};

use super::{Check, Status, check, fmt_bytes, pct, read};

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

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The mounted directory's path inside its filesystem.
    pub root: String,
    pub mount_point: String,
    pub fstype: String,
    pub super_opts: String,
}

/// Parses /proc/self/mountinfo: `id parent maj:min root mountpoint opts
/// [optional...] - fstype source superopts`.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        out.push(Mount {
            root: unescape(l[3]),
            mount_point: unescape(l[4]),
            fstype: r[0].to_string(),
            super_opts: r[2].to_string(),
        });
    }
    out
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4);
        if b[i] == b'\\'
            && let Some(o) = oct
            && o.iter().all(|c| (b'0'..=b'7').contains(c))
            && let Ok(v) = u8::try_from(o.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where this process's memory cgroup lives: `(version, cgroup path,
/// directory, hierarchy's mount point)`. A v1 memory hierarchy wins when
/// present: the controller is then not available to cgroup2.
pub fn memory_cgroup_dir(
    proc_cgroup: &str,
    mounts: &[Mount],
) -> Option<(u8, String, PathBuf, PathBuf)> {
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if ctrls.is_empty() {
            v2_path = Some(path);
        } else if ctrls.split(',').any(|c| c == "memory")
            && let Some(m) = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory"))
        {
            return Some((
                1,
                path.to_string(),
                join_cgroup(m, path),
                PathBuf::from(&m.mount_point),
            ));
        }
    }
    let path = v2_path?;
    let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    Some((
        2,
        path.to_string(),
        join_cgroup(m, path),
        PathBuf::from(&m.mount_point),
    ))
}

/// The directory of cgroup `path` under mount `m`, whose root may itself be
/// a cgroup (a container sees its own cgroup as `/`).
fn join_cgroup(m: &Mount, path: &str) -> PathBuf {
    let rel = path
        .strip_prefix(m.root.trim_end_matches('/'))
        .unwrap_or(path)
        .trim_start_matches('/');
    Path::new(&m.mount_point).join(rel)
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
    use crate::doctor::testdata::*;

    #[test]
    fn mountinfo_and_cgroup_paths() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 5);
        assert_eq!(m[4].mount_point, "/mnt/with space");
        assert_eq!(m[1].super_opts, "rw,memory");
        // v1 memory hierarchy wins over the cgroup2 line.
        let (v, path, dir, top) = memory_cgroup_dir(PROC_CGROUP_V1, &m).unwrap();
        assert_eq!((v, path.as_str()), (1, "/process_api/ee59"));
        assert_eq!(dir, Path::new("/sys/fs/cgroup/memory/process_api/ee59"));
        assert_eq!(top, Path::new("/sys/fs/cgroup/memory"));
        // Pure cgroup2, and a container whose mount root is its own cgroup.
        let v2 =
            parse_mountinfo("30 1 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        let (v, _, dir, _) = memory_cgroup_dir("0::/kubepods/pod1/c1\n", &v2).unwrap();
        assert_eq!((v, dir), (2, PathBuf::from("/sys/fs/cgroup/c1")));
        assert!(memory_cgroup_dir("0::/\n", &[]).is_none());
    }

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

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("a\\040b\\011c"), "a b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("\\999"), "\\999");
    }
}
