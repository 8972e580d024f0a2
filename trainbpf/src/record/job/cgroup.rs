//! The job's memory cgroup for `--memory-limit`.
//!
//! Root makes it, so it must never become a way around a limit or a way to
//! reach someone else's processes:
//! - It goes below the recorder's own memory cgroup, so that whatever
//!   limits the recorder (a container, a Slurm job, a systemd slice) also
//!   limits the job.
//! - It is always made new, with a random part in its name: a cgroup that
//!   someone planted under a name we would pick is never reused.
//! - At the end only processes of the job's tree are killed in it.
//! - On cgroup v2, a parent's `cgroup.subtree_control` that had to be given
//!   the memory controller is given back as it was.

use std::{
    fs, io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use super::{JobError, io_err};

/// Every cgroup this module makes is `trainbpf-<recorder pid>-<16 hex>`.
const PREFIX: &str = "trainbpf-";

/// A memory cgroup made for `--memory-limit`, removed on drop.
pub struct MemCgroup {
    pub dir: PathBuf,
    /// Path below the hierarchy's mount, as the kill records name memory
    /// cgroups (`/user.slice/trainbpf-77-…`).
    pub rel: String,
    pub v2: bool,
    /// Path as /proc/PID/cgroup shows it, which differs from `rel` in a
    /// container that sees only its own part of the hierarchy.
    proc_rel: String,
    /// cgroup v2: the parent's `cgroup.subtree_control` when memory had to
    /// be enabled there; it is disabled again on removal.
    enabled_in: Mutex<Option<PathBuf>>,
}

/// The recorder's own memory cgroup.
struct Own {
    dir: PathBuf,
    rel: String,
    proc_rel: String,
    v2: bool,
}

impl MemCgroup {
    /// Makes a new cgroup below the recorder's own memory cgroup (v1 or
    /// v2, whichever holds the memory controller) and sets its limit.
    pub fn create(limit_bytes: u64) -> Result<MemCgroup, JobError> {
        let own = own_memcg()?;
        if !own.v2 {
            let file = own.dir.join("memory.use_hierarchy");
            if !charges_parent(fs::read_to_string(&file).ok().as_deref()) {
                return Err(JobError::NoHierarchy {
                    file: file.display().to_string(),
                });
            }
        }
        remove_stale(&own.dir);
        let enabled_in = if own.v2 {
            delegate_memory(&own.dir)?
        } else {
            None
        };
        let made = make_dir(&own.dir);
        let (dir, name) = match made {
            Ok(v) => v,
            Err(e) => {
                if let Some(ctl) = enabled_in {
                    let _ = restore_subtree_control(&ctl);
                }
                return Err(e);
            }
        };
        let below = |p: &str| format!("{}/{name}", p.trim_end_matches('/'));
        let cg = MemCgroup {
            dir,
            rel: below(&own.rel),
            proc_rel: below(&own.proc_rel),
            v2: own.v2,
            enabled_in: Mutex::new(enabled_in),
        };
        let file = if own.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        let path = cg.dir.join(file);
        // On failure `cg` is dropped: the new directory goes, and the
        // parent's subtree_control is given back.
        fs::write(&path, limit_bytes.to_string())
            .map_err(io_err(format!("writing {}", path.display())))?;
        Ok(cg)
    }

    pub fn add(&self, pid: u32) -> Result<(), JobError> {
        let path = self.dir.join("cgroup.procs");
        fs::write(&path, pid.to_string()).map_err(io_err(format!("writing {}", path.display())))
    }

    pub fn procs(&self) -> Vec<u32> {
        procs_of(&self.dir)
    }

    /// Inode number of the directory: the kernel's `kernfs_node::id`, which
    /// the OOM probes report.
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).map(|m| m.ino()).unwrap_or(0)
    }

    /// Like a container's end: processes the job left behind are killed so
    /// that the cgroup can go. Only the job's: a process that is in the
    /// cgroup but does not descend from the recorder (someone else moved it
    /// there) is left alone, and so is the cgroup then.
    pub fn remove(&self) -> Result<(), JobError> {
        let removed = self.remove_dir();
        let restored = match self.take_enabled() {
            Some(ctl) => restore_subtree_control(&ctl),
            None => Ok(()),
        };
        removed.and(restored)
    }

    fn take_enabled(&self) -> Option<PathBuf> {
        self.enabled_in
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn remove_dir(&self) -> Result<(), JobError> {
        let me = std::process::id();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut foreign = Vec::new();
            for pid in self.procs() {
                if !self.kill_if_job(pid, me) {
                    foreign.push(pid);
                }
            }
            match fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(_) if !foreign.is_empty() => {
                    return Err(JobError::Foreign {
                        dir: self.dir.display().to_string(),
                        pids: foreign,
                    });
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(io_err(format!("removing {}", self.dir.display()))(e));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// SIGKILLs `pid` when it is of the job's tree: in this cgroup and a
    /// descendant of the recorder (the job, or one of its processes that
    /// was orphaned and re-parented to the recorder, its subreaper).
    /// Returns false for a process that is not the job's.
    fn kill_if_job(&self, pid: u32, me: u32) -> bool {
        let is_job = || descends_from(pid, me) && self.holds(pid);
        // A pidfd pins the process, so a pid reused between the check and
        // the signal is never hit: the signal then fails with ESRCH.
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            let gone = io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                return true;
            }
            // Kernels before 5.3 have no pidfd: check, then kill.
            if !is_job() {
                return false;
            }
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return true;
        }
        // SAFETY: the fd was just returned by pidfd_open and is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if !is_job() {
            return !crate::record::samplers::procfs::alive(pid);
        }
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        true
    }

    /// Whether `pid` is in this cgroup, from its own /proc/PID/cgroup.
    fn holds(&self, pid: u32) -> bool {
        fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|t| memcg_line(&t, self.v2).map(|p| p == self.proc_rel))
            .unwrap_or(false)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// cgroup v1: whether a child's memory is charged to its parent too, from
/// the parent's `memory.use_hierarchy`. Kernels since 5.x fix it at 1 (no
/// file at all in some); older ones allow 0, which would leave the job
/// outside every limit above its own.
fn charges_parent(use_hierarchy: Option<&str>) -> bool {
    use_hierarchy.is_none_or(|t| t.trim() == "1")
}

fn procs_of(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The memory cgroup path in a /proc/PID/cgroup text: the v2 line
/// (`0::/path`) or the v1 line whose controllers include memory.
pub(super) fn memcg_line(text: &str, v2: bool) -> Option<String> {
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        let ours = if v2 {
            ctl.is_empty()
        } else {
            ctl.split(',').any(|c| c == "memory")
        };
        ours.then(|| path.to_string())
    })
}

fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    // Bounded: a parent chain is never longer than the pid space allows,
    // but /proc can change under us.
    for _ in 0..4096 {
        if p == ancestor {
            return true;
        }
        if p <= 1 {
            return false;
        }
        match crate::record::samplers::procfs::ppid(p) {
            Some(pp) => p = pp,
            None => return false,
        }
    }
    false
}

/// Finds the recorder's own memory cgroup through /proc/self/cgroup and
/// the mount of its hierarchy (whose root is the container's own cgroup in
/// a container without a cgroup namespace).
fn own_memcg() -> Result<Own, JobError> {
    let read = |p: &str| fs::read_to_string(p).map_err(io_err(format!("reading {p}")));
    let cgroup = read("/proc/self/cgroup")?;
    let mounts = crate::util::mounts::parse_mountinfo(&read("/proc/self/mountinfo")?);
    let (version, proc_rel, dir, top) = crate::util::mounts::memory_cgroup_dir(&cgroup, &mounts)
        .ok_or(JobError::NoMemoryController)?;
    let v2 = version == 2;
    let marker = if v2 {
        "cgroup.controllers"
    } else {
        "memory.limit_in_bytes"
    };
    if !dir.join(marker).exists() {
        return Err(JobError::OwnCgroup {
            rel: proc_rel,
            dir: dir.display().to_string(),
        });
    }
    let rel = format!(
        "/{}",
        dir.strip_prefix(&top).unwrap_or(Path::new("")).display()
    );
    Ok(Own {
        dir,
        rel,
        proc_rel,
        v2,
    })
}

/// cgroup v2 gives a child the memory controller only when its parent lists
/// memory in `cgroup.subtree_control`. Enables it when the parent has it
/// and may (only a cgroup without processes of its own may, or the root),
/// and returns the file to restore; refuses otherwise.
fn delegate_memory(parent: &Path) -> Result<Option<PathBuf>, JobError> {
    let lists_memory = |p: &Path| {
        fs::read_to_string(p)
            .map(|s| s.split_whitespace().any(|c| c == "memory"))
            .unwrap_or(false)
    };
    let ctl = parent.join("cgroup.subtree_control");
    if lists_memory(&ctl) {
        return Ok(None);
    }
    let parent_name = parent.display().to_string();
    if !lists_memory(&parent.join("cgroup.controllers")) {
        return Err(JobError::NotDelegated {
            parent: parent_name,
        });
    }
    match fs::write(&ctl, "+memory") {
        Ok(()) => Ok(Some(ctl)),
        Err(source) => Err(JobError::Delegate {
            parent: parent_name,
            source,
        }),
    }
}

/// Disables memory in a parent's `subtree_control` again, unless another
/// trainbpf cgroup there may rely on it now (a recorder started meanwhile,
/// or ours if it could not be removed).
fn restore_subtree_control(ctl: &Path) -> Result<(), JobError> {
    let parent = ctl.parent().unwrap_or(Path::new("/"));
    let in_use = fs::read_dir(parent)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        })
        .unwrap_or(false);
    if in_use {
        return Err(JobError::Io {
            what: format!(
                "leaving memory enabled in {}: another trainbpf cgroup is there",
                ctl.display()
            ),
            source: io::Error::from(io::ErrorKind::ResourceBusy),
        });
    }
    fs::write(ctl, "-memory").map_err(io_err(format!(
        "restoring {} (disabling memory)",
        ctl.display()
    )))
}

/// A new directory `trainbpf-<pid>-<random>` in `parent`: mkdir fails
/// on an existing name, and such a name is never taken over.
fn make_dir(parent: &Path) -> Result<(PathBuf, String), JobError> {
    for _ in 0..8 {
        let name = format!("{PREFIX}{}-{:016x}", std::process::id(), random_u64()?);
        let dir = parent.join(&name);
        match fs::create_dir(&dir) {
            Ok(()) => return Ok((dir, name)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
        }
    }
    Err(
        io_err(format!("creating a cgroup in {}", parent.display()))(io::Error::from(
            io::ErrorKind::AlreadyExists,
        )),
    )
}

fn random_u64() -> Result<u64, JobError> {
    let mut b = [0u8; 8];
    // SAFETY: the buffer is 8 writable bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(io_err("getrandom")(io::Error::last_os_error()));
    }
    Ok(u64::from_ne_bytes(b))
}

/// The recorder pid in a name this module makes (`trainbpf-PID-RANDOM`),
/// or in the older `trainbpf-PID`.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let pid = match rest.split_once('-') {
        Some((pid, r)) if r.len() == 16 && r.bytes().all(|c| c.is_ascii_hexdigit()) => pid,
        Some(_) => return None,
        None => rest,
    };
    pid.parse().ok()
}

/// Cleans up after recorders that died (SIGKILL, a crash) before removing
/// their cgroup: one whose recorder is gone and that is empty (no process,
/// no child cgroup) is removed. One that holds anything is never touched,
/// and one whose recorder pid is alive is kept (it may be in use, or the
/// pid reused: kept either way).
fn remove_stale(parent: &Path) {
    let Ok(rd) = fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let Some(pid) = owner_pid(&e.file_name().to_string_lossy()) else {
            continue;
        };
        if !e.file_type().map(|t| t.is_dir()).unwrap_or(false)
            || Path::new(&format!("/proc/{pid}")).exists()
        {
            continue;
        }
        let dir = e.path();
        let has_child = fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .any(|c| c.file_type().is_ok_and(|t| t.is_dir()))
            })
            .unwrap_or(true);
        if procs_of(&dir).is_empty() && !has_child {
            // The kernel refuses if a process joined since.
            let _ = fs::remove_dir(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_reads_both_name_forms_and_nothing_else() {
        assert_eq!(owner_pid("trainbpf-77-0123456789abcdef"), Some(77));
        assert_eq!(owner_pid("trainbpf-77"), Some(77));
        assert_eq!(owner_pid("trainbpf-77-x"), None);
        assert_eq!(owner_pid("trainbpf-rec"), None);
        assert_eq!(owner_pid("other-77"), None);
    }

    #[test]
    fn memcg_line_picks_the_hierarchy() {
        let t = "12:pids:/\n4:cpu,memory:/slurm/job1\n0::/user.slice\n";
        assert_eq!(memcg_line(t, false).as_deref(), Some("/slurm/job1"));
        assert_eq!(memcg_line(t, true).as_deref(), Some("/user.slice"));
    }

    #[test]
    fn v1_nests_only_with_use_hierarchy() {
        assert!(charges_parent(Some("1\n")));
        assert!(charges_parent(None));
        assert!(!charges_parent(Some("0\n")));
        assert!(!charges_parent(Some("")));
    }

    #[test]
    fn random_names_differ() {
        assert_ne!(random_u64().unwrap(), random_u64().unwrap());
    }
}
