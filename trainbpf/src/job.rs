//! Running the job: as the invoking user, registered in the kernel's job map
//! before it runs a single instruction of its own, optionally inside a fresh
//! memory cgroup.
//!
//! The job starts as a copy of trainbpf (`trainbpf __exec`, a "trampoline")
//! that waits on a pipe. The recorder adds its pid to the job map and its
//! cgroup, then releases it; only then does it drop privileges and exec the
//! command. So even a child that forks and exits at once is seen, and the
//! command's own exec is the first thing recorded.

use std::{
    ffi::{OsStr, OsString},
    fs,
    io::{self, Read},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::process::CommandExt,
    },
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use nix::unistd::{Gid, Uid, User};

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
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> JobError {
    let what = what.into();
    move |source| JobError::Io { what, source }
}

/// Who the job runs as: the user who ran `sudo`, or whoever we are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invoker {
    pub uid: u32,
    pub gid: u32,
}

impl Invoker {
    /// `SUDO_UID`/`SUDO_GID` when set by sudo, else our own real ids.
    pub fn detect() -> Invoker {
        let env_id = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        match (env_id("SUDO_UID"), env_id("SUDO_GID")) {
            (Some(uid), Some(gid)) => Invoker { uid, gid },
            _ => Invoker {
                uid: Uid::current().as_raw(),
                gid: Gid::current().as_raw(),
            },
        }
    }
}

/// A memory cgroup made for `--memory-limit`, removed on drop.
pub struct MemCgroup {
    pub dir: PathBuf,
    /// Path as the kernel prints it (`oom_memcg=/trainbpf-77`).
    pub rel: String,
    pub v2: bool,
}

impl MemCgroup {
    /// Creates `trainbpf-<pid>` under the root of the memory hierarchy:
    /// cgroup v2 where it has the memory controller, v1 otherwise.
    pub fn create(limit_bytes: u64) -> Result<MemCgroup, JobError> {
        let name = format!("trainbpf-{}", std::process::id());
        let (root, v2) = memory_hierarchy().ok_or(JobError::NoMemoryController)?;
        if v2 {
            // Children get the controller only if the parent delegates it.
            let ctl = root.join("cgroup.subtree_control");
            if !fs::read_to_string(&ctl)
                .unwrap_or_default()
                .contains("memory")
            {
                fs::write(&ctl, "+memory")
                    .map_err(io_err(format!("enabling memory in {}", ctl.display())))?;
            }
        }
        let dir = root.join(&name);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
        }
        let cg = MemCgroup {
            dir,
            rel: format!("/{name}"),
            v2,
        };
        let (file, value) = if v2 {
            ("memory.max", limit_bytes.to_string())
        } else {
            ("memory.limit_in_bytes", limit_bytes.to_string())
        };
        let path = cg.dir.join(file);
        fs::write(&path, value).map_err(io_err(format!("writing {}", path.display())))?;
        Ok(cg)
    }

    pub fn add(&self, pid: u32) -> Result<(), JobError> {
        let path = self.dir.join("cgroup.procs");
        fs::write(&path, pid.to_string()).map_err(io_err(format!("writing {}", path.display())))
    }

    pub fn procs(&self) -> Vec<u32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Inode number of the directory: the kernel's `kernfs_node::id`, which
    /// the OOM probes report.
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).map(|m| m.ino()).unwrap_or(0)
    }

    /// Like a container's end: processes the job left behind are killed so
    /// that the cgroup can go.
    pub fn remove(&self) -> Result<(), JobError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let procs = self.procs();
            for pid in &procs {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            match fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(io_err(format!("removing {}", self.dir.display()))(e));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// Root of the hierarchy that has the memory controller.
pub fn memory_hierarchy() -> Option<(PathBuf, bool)> {
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let ctl = Path::new(root).join("cgroup.controllers");
        if fs::read_to_string(&ctl)
            .map(|s| s.split_whitespace().any(|c| c == "memory"))
            .unwrap_or(false)
        {
            return Some((PathBuf::from(root), true));
        }
    }
    let v1 = Path::new("/sys/fs/cgroup/memory");
    v1.join("memory.limit_in_bytes")
        .exists()
        .then(|| (v1.to_path_buf(), false))
}

/// The memory cgroup a running process is charged to: its directory, the
/// path as the kernel prints it, and whether it is v2. `None` at the
/// hierarchy's root (no limit of its own) or without a memory controller.
pub fn memcg_of_pid(pid: u32) -> Option<(PathBuf, String, bool)> {
    let (root, v2) = memory_hierarchy()?;
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        let ours = if v2 {
            ctl.is_empty()
        } else {
            ctl.split(',').any(|c| c == "memory")
        };
        ours.then(|| path.to_string())
    })?;
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

/// Starts the trampoline for `argv` as a child of the recorder.
pub fn spawn(
    argv: &[OsString],
    invoker: &Invoker,
    oom_score_adj: i32,
) -> Result<Pending, JobError> {
    let (rd, wr) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
    // The read end must survive exec into the trampoline.
    nix::fcntl::fcntl(
        &rd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|e| io_err("fcntl")(e.into()))?;
    let exe = std::env::current_exe().map_err(io_err("locating trainbpf's own executable"))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("__exec")
        .arg(rd.as_raw_fd().to_string())
        .arg(invoker.uid.to_string())
        .arg(invoker.gid.to_string())
        .arg(oom_score_adj.to_string())
        .arg("--")
        .args(argv);
    // The recorder blocks SIGINT/SIGTERM to read them from a signalfd; the
    // job must start with the default mask.
    // SAFETY: only async-signal-safe calls (sigprocmask) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let set = nix::sys::signal::SigSet::all();
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_UNBLOCK,
                Some(&set),
                None,
            )
            .map_err(io::Error::from)
        });
    }
    let child = cmd.spawn().map_err(io_err("starting the job"))?;
    drop(rd);
    let pid = child
        .id()
        .ok_or_else(|| io_err("job pid")(io::Error::other("exited early")))?;
    Ok(Pending { child, pid, go: wr })
}

/// The trampoline's side, run as `trainbpf __exec FD UID GID ADJ -- CMD…`.
/// Returns only on failure, with the exit code to use (127: not found,
/// 126: not executable, 1: anything else), after printing why.
pub fn exec_trampoline(args: &[OsString]) -> i32 {
    let fail = |msg: String, code: i32| {
        eprintln!("trainbpf: {msg}");
        code
    };
    if args.len() < 6 || args[4] != "--" {
        return fail("__exec is internal to trainbpf record".into(), 2);
    }
    let num = |s: &OsStr| s.to_str().and_then(|s| s.parse::<i64>().ok());
    let (Some(fd), Some(uid), Some(gid), Some(adj)) =
        (num(&args[0]), num(&args[1]), num(&args[2]), num(&args[3]))
    else {
        return fail("__exec: bad arguments".into(), 2);
    };
    // SAFETY: the recorder passed this fd number, open across exec for us.
    let mut go = unsafe { fs::File::from_raw_fd(fd as i32) };
    let mut b = [0u8; 1];
    if !matches!(go.read(&mut b), Ok(1)) {
        return fail(
            "the recorder went away before the job could start".into(),
            1,
        );
    }
    drop(go);
    // Undo the recorder's own OOM protection: the job must be killable as
    // it would be without trainbpf.
    let _ = fs::write("/proc/self/oom_score_adj", adj.to_string());
    let (uid, gid) = (uid as u32, gid as u32);
    let cmd_argv = &args[5..];
    let mut cmd = Command::new(&cmd_argv[0]);
    cmd.args(&cmd_argv[1..]);
    if Uid::effective().as_raw() != uid
        && let Err(e) = drop_privileges(uid, gid, &mut cmd)
    {
        return fail(format!("cannot run the job as uid {uid}: {e}"), 1);
    }
    let err = cmd.exec();
    let name = crate::term::escape(&cmd_argv[0].to_string_lossy()).into_owned();
    match err.kind() {
        io::ErrorKind::NotFound => fail(format!("{name}: command not found"), 127),
        io::ErrorKind::PermissionDenied => fail(format!("{name}: permission denied"), 126),
        _ => fail(format!("{name}: {err}"), 126),
    }
}

/// setgroups/setgid/setuid to the invoking user, with their HOME, USER and
/// LOGNAME, the way `sudo -u` would; the rest of the environment stays.
fn drop_privileges(uid: u32, gid: u32, cmd: &mut Command) -> Result<(), String> {
    let user = User::from_uid(Uid::from_raw(uid)).map_err(|e| e.to_string())?;
    let groups = match &user {
        Some(u) => {
            let name = std::ffi::CString::new(u.name.clone()).map_err(|e| e.to_string())?;
            nix::unistd::getgrouplist(&name, Gid::from_raw(gid)).map_err(|e| e.to_string())?
        }
        None => vec![Gid::from_raw(gid)],
    };
    nix::unistd::setgroups(&groups).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setgid(Gid::from_raw(gid)).map_err(|e| format!("setgid: {e}"))?;
    nix::unistd::setuid(Uid::from_raw(uid)).map_err(|e| format!("setuid: {e}"))?;
    if let Some(u) = user {
        cmd.env("HOME", &u.dir)
            .env("USER", &u.name)
            .env("LOGNAME", &u.name);
    }
    Ok(())
}

/// Parses sizes like `300M`, `1.5G`, `512MiB`, `1048576` (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => {
            return Err(format!(
                "invalid size unit {u:?} in {s:?} (use K, M, G or T)"
            ));
        }
    };
    let v = n * mult as f64;
    if v.is_nan() || v < 1.0 {
        return Err(format!("size {s:?} must be positive"));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("300M"), Ok(300 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
    }
}
