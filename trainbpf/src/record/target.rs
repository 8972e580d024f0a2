//! What `record --pid`, `--cgroup` and `--all` may attach to.
//!
//! Attached, the recorder reads as root what /proc shows of each process
//! (command line, maps, open files, smaps) into a recording the invoker
//! owns. So a user who reached it through sudo attaches only to their own
//! processes, and `--all`, the whole machine, needs root itself. A
//! `--cgroup` directory must be a real cgroup: root reads its
//! `cgroup.procs` every second, so it is read only from a cgroup file
//! system, never through a link, never from a FIFO or a device.

use std::{
    fs, io,
    io::Read as _,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use nix::{
    dir::{Dir, Type},
    fcntl::{OFlag, open, openat},
    sys::{
        stat::Mode,
        statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, fstatfs},
    },
};

use crate::util::invoker::Invoker;

/// A bound on the cgroups walked below a `--cgroup` directory.
const MAX_CGROUPS: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(
        "--all needs root itself, not sudo from uid {uid}: it would record every user's processes into a file you own"
    )]
    AllNeedsRoot { uid: u32 },
    #[error("--pid {pid}: no such process")]
    NoProcess { pid: u32 },
    #[error(
        "{what}: process {pid} is not yours (it runs as uid {owner}; you are uid {uid}); only root itself, not sudo, may attach to another user's processes"
    )]
    NotYours {
        what: String,
        pid: u32,
        owner: String,
        uid: u32,
    },
    #[error("--cgroup {dir}: {why}")]
    NotCgroup { dir: String, why: String },
}

/// Whose processes the recorder may watch: everyone's for root itself,
/// else the invoker's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watcher {
    only_uid: Option<u32>,
}

impl Watcher {
    pub fn new(invoker: &Invoker) -> Watcher {
        Watcher {
            only_uid: (invoker.uid != 0).then_some(invoker.uid),
        }
    }

    pub fn all(&self) -> Result<(), AttachError> {
        match self.only_uid {
            Some(uid) => Err(AttachError::AllNeedsRoot { uid }),
            None => Ok(()),
        }
    }

    pub fn pid(&self, pid: u32) -> Result<(), AttachError> {
        let ids = uids(pid).ok_or(AttachError::NoProcess { pid })?;
        self.check(&format!("--pid {pid}"), pid, &ids)
    }

    /// Every process in the cgroup now; one that exits meanwhile is no
    /// reason to refuse.
    pub fn cgroup(&self, cg: &CgroupDir) -> Result<(), AttachError> {
        if self.only_uid.is_none() {
            return Ok(());
        }
        let what = format!("--cgroup {}", cg.path.display());
        for pid in cg.procs() {
            if let Some(ids) = uids(pid) {
                self.check(&what, pid, &ids)?;
            }
        }
        Ok(())
    }

    /// For processes that join later (moved into the cgroup, or found
    /// below the attached one): watched only when allowed, else skipped.
    pub fn may_watch(&self, pid: u32) -> bool {
        match self.only_uid {
            None => true,
            Some(uid) => uids(pid).is_some_and(|ids| owned_by(&ids, uid)),
        }
    }

    fn check(&self, what: &str, pid: u32, ids: &[u32]) -> Result<(), AttachError> {
        match self.only_uid {
            Some(uid) if !owned_by(ids, uid) => Err(AttachError::NotYours {
                what: what.to_string(),
                pid,
                owner: if ids.iter().all(|&i| i == ids[0]) {
                    ids[0].to_string()
                } else {
                    let ids: Vec<_> = ids.iter().map(u32::to_string).collect();
                    format!("{} (real/effective/saved/fs)", ids.join("/"))
                },
                uid,
            }),
            _ => Ok(()),
        }
    }
}

/// Real, effective, saved and file-system uid all the invoker's: a setuid
/// program the user started is not theirs to look into (as for ptrace).
fn owned_by(ids: &[u32], uid: u32) -> bool {
    !ids.is_empty() && ids.iter().all(|&i| i == uid)
}

/// The four uids of a process, from the `Uid:` line of /proc/PID/status.
fn uids(pid: u32) -> Option<Vec<u32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_uids(&status)
}

fn parse_uids(status: &str) -> Option<Vec<u32>> {
    let ids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .map(|s| s.parse().ok())
        .collect::<Option<_>>()?;
    (ids.len() == 4).then_some(ids)
}

/// A `--cgroup` directory, checked once and held open: what is read below
/// it is read through this descriptor, whatever the path names later.
pub struct CgroupDir {
    /// The canonical path, for messages and the recording.
    pub path: PathBuf,
    fd: OwnedFd,
}

impl CgroupDir {
    pub fn open(dir: &Path) -> Result<CgroupDir, AttachError> {
        let bad = |why: String| AttachError::NotCgroup {
            dir: dir.display().to_string(),
            why,
        };
        let path = fs::canonicalize(dir).map_err(|e| bad(e.to_string()))?;
        let fd = open(
            &path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| bad(format!("not a directory ({e})")))?;
        let fs_type = fstatfs(&fd)
            .map_err(|e| bad(format!("statfs: {e}")))?
            .filesystem_type();
        if fs_type != CGROUP_SUPER_MAGIC && fs_type != CGROUP2_SUPER_MAGIC {
            return Err(bad(format!(
                "not a cgroup directory: {} is not on a cgroup file system",
                path.display()
            )));
        }
        read_procs(&fd).map_err(|e| bad(format!("not a cgroup directory: cgroup.procs: {e}")))?;
        Ok(CgroupDir { path, fd })
    }

    /// Every process in the cgroup and the cgroups below it.
    pub fn procs(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let Ok(top) = openat(&self.fd, ".", dir_flags(), Mode::empty()) else {
            return out;
        };
        let mut stack = vec![top];
        let mut seen = 0;
        while let Some(fd) = stack.pop() {
            seen += 1;
            if seen > MAX_CGROUPS {
                break;
            }
            if let Ok(p) = read_procs(&fd) {
                out.extend(p);
            }
            let Ok(mut dir) = Dir::openat(&fd, ".", dir_flags(), Mode::empty()) else {
                continue;
            };
            let names: Vec<_> = dir
                .iter()
                .flatten()
                .filter(|e| e.file_type() == Some(Type::Directory))
                .map(|e| e.file_name().to_owned())
                .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
                .collect();
            stack.extend(
                names
                    .iter()
                    .filter_map(|n| openat(&fd, n.as_c_str(), dir_flags(), Mode::empty()).ok()),
            );
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// `cgroup.procs` in `dir`: not through a link, without blocking on a FIFO,
/// and only from a regular file.
fn read_procs(dir: &OwnedFd) -> io::Result<Vec<u32>> {
    let fd = openat(
        dir,
        "cgroup.procs",
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut f = fs::File::from(fd);
    if !f.metadata()?.file_type().is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_four_uids_must_be_the_invokers() {
        let s = |u: &str| format!("Name:\tx\nUid:\t{u}\nGid:\t0\t0\t0\t0\n");
        let ids = parse_uids(&s("1000\t1000\t1000\t1000")).unwrap();
        assert!(owned_by(&ids, 1000));
        assert!(!owned_by(&ids, 1001));
        // A setuid-root program the user started.
        let ids = parse_uids(&s("1000\t0\t0\t0")).unwrap();
        assert!(!owned_by(&ids, 1000));
        assert_eq!(parse_uids("Name:\tx\n"), None);
        assert!(!owned_by(&[], 1000));
    }

    #[test]
    fn root_may_watch_everything_a_sudo_user_not() {
        let root = Watcher::new(&Invoker { uid: 0, gid: 0 });
        assert!(root.all().is_ok());
        assert!(root.may_watch(1));
        let user = Watcher::new(&Invoker {
            uid: 65534,
            gid: 65534,
        });
        let e = user.all().unwrap_err().to_string();
        assert!(e.contains("--all needs root itself"), "{e}");
        // pid 1 is root's.
        assert!(!user.may_watch(1));
        assert!(user.pid(1).is_err());
    }

    #[test]
    fn a_plain_directory_is_not_a_cgroup() {
        let d = std::env::temp_dir().join(format!("trainbpf-attach-{}", std::process::id()));
        let _ = fs::create_dir(&d);
        fs::write(d.join("cgroup.procs"), "1\n").unwrap();
        let e = CgroupDir::open(&d).err().expect("refused").to_string();
        let _ = fs::remove_dir_all(&d);
        assert!(e.contains("not on a cgroup file system"), "{e}");
    }
}
