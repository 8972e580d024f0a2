//! Where the kernel's filesystems are mounted, from /proc/self/mountinfo:
//! the memory cgroup hierarchy this process is in (the job's cgroup code and
//! `doctor` find it the same way, never at a fixed path), tracefs,
//! securityfs.

use std::path::{Path, PathBuf};

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

/// Each mounted filesystem's device (`makedev` of mountinfo's decimal
/// `maj:min`) and type, from a mountinfo text.
pub fn fs_types_by_dev(text: &str) -> Vec<(u64, String)> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let (major, minor) = left.split(' ').nth(2)?.split_once(':')?;
            let dev = libc::makedev(major.parse().ok()?, minor.parse().ok()?);
            Some((dev, right.split(' ').next()?.to_string()))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testdata::{MOUNTINFO, PROC_CGROUP_V1};

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
    fn mountinfo_escapes() {
        assert_eq!(unescape("a\\040b\\011c"), "a b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("\\999"), "\\999");
    }
}
