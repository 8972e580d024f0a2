//! Running the job: as the invoking user, registered in the kernel's job map
//! before it runs a single instruction of its own, optionally inside a fresh
//! memory cgroup.
//!
//! The job starts as a copy of trainbpf (`trainbpf __exec`, a "trampoline")
//! that waits on a pipe. The recorder adds its pid to the job map and its
//! cgroup, then releases it; only then does it drop privileges and exec the
//! command. So even a child that forks and exits at once is seen, and the
//! command's own exec is the first thing recorded.

mod cgroup;
mod trampoline;

use std::{
    ffi::OsString,
    fs, io,
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

pub use cgroup::MemCgroup;
pub use trampoline::exec_trampoline;
pub(crate) use trampoline::started_by_recorder;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// A system call failed while preparing the job.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// No memory controller is available in any cgroup hierarchy.
    #[error("no memory cgroup controller found (looked for cgroup v2 with memory, and v1 memory)")]
    NoMemoryController,
    /// The recorder's own memory cgroup is not where its hierarchy is
    /// mounted (a container that sees only part of the hierarchy).
    #[error(
        "the recorder's own memory cgroup {rel} is not visible at {dir}; --memory-limit makes the job's cgroup below it and nowhere else"
    )]
    OwnCgroup { rel: String, dir: String },
    /// cgroup v2: the recorder's cgroup has no memory controller to give.
    #[error(
        "cgroup v2: the memory controller is not delegated to {parent}, the recorder's own cgroup, so --memory-limit cannot make the job's cgroup below it (trainbpf never puts the job outside its own cgroup); leave out --memory-limit and limit the recorder's cgroup instead, e.g. `sudo systemd-run --scope -p MemoryMax=SIZE trainbpf record -- CMD`"
    )]
    NotDelegated { parent: String },
    /// cgroup v2: memory could not be enabled for the recorder's cgroup's
    /// children, typically because it holds processes.
    #[error(
        "cgroup v2: cannot enable the memory controller below {parent}, the recorder's own cgroup: cgroup v2 allows that only in a cgroup with no processes of its own, or the root. Leave out --memory-limit and limit the recorder's cgroup instead, e.g. `sudo systemd-run --scope -p MemoryMax=SIZE trainbpf record -- CMD`"
    )]
    Delegate {
        parent: String,
        #[source]
        source: io::Error,
    },
    /// Processes that are not the job's are in the job's cgroup (someone
    /// moved them there): they are not signalled, and the cgroup stays.
    #[error(
        "left {dir} in place: it holds processes that are not the job's ({pids:?}); they were not signalled"
    )]
    Foreign { dir: String, pids: Vec<u32> },
    /// cgroup v1: the recorder's cgroup does not charge its children's
    /// memory to itself, so a cgroup below it would escape its limits.
    #[error(
        "{file} is not 1: on cgroup v1 a cgroup below the recorder's would not be charged to it, so --memory-limit would take the job out of the limits around the recorder (a container, a Slurm job); leave out --memory-limit, or set memory.use_hierarchy to 1 there"
    )]
    NoHierarchy { file: String },
    /// `SUDO_UID`/`SUDO_GID` are not a pair of numbers.
    #[error(transparent)]
    Sudo(#[from] crate::util::invoker::SudoError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> JobError {
    let what = what.into();
    move |source| JobError::Io { what, source }
}

/// Root of the hierarchy that has the memory controller, found as `doctor`
/// and the job's own cgroup find it: from /proc/self/cgroup and the mount
/// table, not at a fixed path.
pub fn memory_hierarchy() -> Option<(PathBuf, bool)> {
    let mounts =
        crate::util::mounts::parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").ok()?);
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let (version, _, _, top) = crate::util::mounts::memory_cgroup_dir(&own, &mounts)?;
    Some((top, version == 2))
}

/// The memory cgroup a running process is charged to: its directory, the
/// path as the kernel prints it, and whether it is v2. `None` at the
/// hierarchy's root (no limit of its own) or without a memory controller.
pub fn memcg_of_pid(pid: u32) -> Option<(PathBuf, String, bool)> {
    let (root, v2) = memory_hierarchy()?;
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = cgroup::memcg_line(&text, v2)?;
    memcg_dir(&root, &rel, v2)
}

/// `dir` as a memory cgroup (`--cgroup DIR`), when it is one below the
/// root of the memory hierarchy.
pub fn memcg_of_dir(dir: &Path) -> Option<(PathBuf, String, bool)> {
    let (root, v2) = memory_hierarchy()?;
    let rel = dir.strip_prefix(&root).ok()?;
    memcg_dir(&root, &format!("/{}", rel.display()), v2)
}

fn memcg_dir(root: &Path, rel: &str, v2: bool) -> Option<(PathBuf, String, bool)> {
    let rel = rel.trim_end_matches('/');
    if rel.is_empty() {
        return None;
    }
    let dir = root.join(rel.trim_start_matches('/'));
    let limit = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    dir.join(limit).exists().then(|| (dir, rel.to_string(), v2))
}

/// Finds the memory cgroup directory whose inode is `id`, for naming a
/// victim's cgroup while it still exists.
pub fn cgroup_path_by_id(id: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let (root, _) = memory_hierarchy()?;
    let mut stack = vec![root.clone()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        seen += 1;
        if seen > 20_000 {
            return None; // a bound: never walk forever on a huge host
        }
        if fs::metadata(&dir).map(|m| m.ino()).ok() == Some(id) {
            let rel = dir.strip_prefix(&root).ok()?.to_string_lossy().into_owned();
            return Some(format!("/{rel}"));
        }
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(e.path());
                }
            }
        }
    }
    None
}

/// The job's trampoline, waiting for the go byte.
pub struct Pending {
    pub child: tokio::process::Child,
    pub pid: u32,
    go: OwnedFd,
}

impl Pending {
    /// Lets the trampoline continue to exec the command.
    pub fn release(self) -> Result<tokio::process::Child, JobError> {
        nix::unistd::write(&self.go, b"g").map_err(|e| io_err("releasing the job")(e.into()))?;
        Ok(self.child)
    }
}

/// The go pipe, both ends close-on-exec in the recorder.
fn go_pipe() -> Result<(OwnedFd, OwnedFd), JobError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io_err("pipe")(e.into()))
}

/// Starts the trampoline for `argv` as a child of the recorder; it runs
/// the command as the invoker, whom it finds as the recorder did
/// (`Invoker::detect`), from the environment it inherits.
pub fn spawn(argv: &[OsString], oom_score_adj: i32) -> Result<Pending, JobError> {
    let (rd, wr) = go_pipe()?;
    let go_fd = rd.as_raw_fd();
    // /proc/self/exe in the child is the recorder's own image, even if the
    // file at its path was replaced: the trampoline checks that it runs the
    // same file as its parent.
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg("__exec")
        .arg(go_fd.to_string())
        .arg(oom_score_adj.to_string())
        .arg("--")
        .args(argv);
    // The recorder blocks SIGINT/SIGTERM to read them from a signalfd; the
    // job must start with the default mask. The read end of the pipe loses
    // close-on-exec here, in the child only: in the recorder it stays
    // close-on-exec, so no helper another thread starts meanwhile gets it.
    // SAFETY: only async-signal-safe calls (sigprocmask, fcntl) between
    // fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let set = nix::sys::signal::SigSet::all();
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_UNBLOCK,
                Some(&set),
                None,
            )
            .map_err(io::Error::from)?;
            if libc::fcntl(go_fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(io_err("starting the job"))?;
    drop(rd);
    let pid = child
        .id()
        .ok_or_else(|| io_err("job pid")(io::Error::other("exited early")))?;
    Ok(Pending { child, pid, go: wr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_pipe_is_close_on_exec_in_the_recorder() {
        // Only the forked child clears it (spawn's pre_exec): a helper
        // another thread of the recorder starts never inherits either end.
        let (rd, wr) = go_pipe().unwrap();
        for fd in [&rd, &wr] {
            let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
            assert_ne!(flags & libc::FD_CLOEXEC, 0);
        }
    }
}
