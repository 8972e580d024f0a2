//! The job's trampoline: `trainbpf __exec FD ADJ -- CMD…`, the copy of
//! trainbpf the recorder starts as the job (see job.rs).
//!
//! sudoers lets users run trainbpf as root, so anyone can type `sudo
//! trainbpf __exec …`. The trampoline therefore trusts nothing it was told
//! on its command line about who to be: it runs only as the child of a
//! trainbpf recorder running with its own effective uid, takes the user to
//! run as from the environment sudo sets (as the recorder does), and never
//! lowers its own oom_score_adj (it only gives back the higher value the
//! recorder had before protecting itself).

use std::{
    ffi::{OsStr, OsString},
    fs,
    io::{self, Read},
    os::{
        fd::FromRawFd,
        unix::{fs::MetadataExt, process::CommandExt},
    },
    process::Command,
};

use nix::unistd::{Gid, Uid, User};

use crate::util::invoker::Invoker;

/// Runs as `trainbpf __exec FD ADJ -- CMD…`. Returns only on failure, with
/// the exit code to use (127: not found, 126: not executable, 2: not
/// started by a recorder, 1: anything else), after printing why.
pub fn exec_trampoline(args: &[OsString]) -> i32 {
    let fail = |msg: String, code: i32| {
        eprintln!("trainbpf: {msg}");
        code
    };
    // First of all, before reading any argument: whoever runs us through
    // sudo gets nothing but this refusal.
    if let Err(why) = started_by_recorder() {
        return fail(
            format!("__exec is internal to trainbpf record and runs nothing otherwise: {why}"),
            2,
        );
    }
    if args.len() < 4 || args[2] != "--" {
        return fail("__exec is internal to trainbpf record".into(), 2);
    }
    let num = |s: &OsStr| s.to_str().and_then(|s| s.parse::<i64>().ok());
    let (Some(fd), Some(adj)) = (num(&args[0]), num(&args[1])) else {
        return fail("__exec: bad arguments".into(), 2);
    };
    let invoker = match Invoker::detect() {
        Ok(i) => i,
        Err(e) => return fail(format!("not starting the job: {e}"), 1),
    };
    let now = match own_oom_score_adj() {
        Ok(v) => v,
        Err(e) => return fail(format!("reading /proc/self/oom_score_adj: {e}"), 1),
    };
    if !may_set_adj(now, adj) {
        return fail(
            format!(
                "__exec: refusing to lower oom_score_adj from {now} to {adj}; not starting the job"
            ),
            1,
        );
    }
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
    // it would be without trainbpf, never left at the recorder's -1000.
    if let Err(e) = restore_oom_score_adj(adj) {
        return fail(
            format!("cannot give the job its oom_score_adj {adj} back ({e}); not starting it"),
            1,
        );
    }
    let (uid, gid) = (invoker.uid, invoker.gid);
    let cmd_argv = &args[3..];
    let mut cmd = Command::new(&cmd_argv[0]);
    cmd.args(&cmd_argv[1..]);
    if Uid::effective().as_raw() != uid
        && let Err(e) = drop_privileges(uid, gid, &mut cmd)
    {
        return fail(format!("cannot run the job as uid {uid}: {e}"), 1);
    }
    // The kernel may stop the job at this exec until the recorder has
    // looked for its interpreter (`Stacks::hold_root`): should the recorder
    // die meanwhile, its death continues the job. Set after the uid
    // change, which clears it; to a running job a SIGCONT is nothing.
    // SAFETY: plain prctl on this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGCONT as libc::c_ulong) };
    let err = cmd.exec();
    let name = trainbpf_report::term::escape(&cmd_argv[0].to_string_lossy()).into_owned();
    match err.kind() {
        io::ErrorKind::NotFound => fail(format!("{name}: command not found"), 127),
        io::ErrorKind::PermissionDenied => fail(format!("{name}: permission denied"), 126),
        _ => fail(format!("{name}: {err}"), 126),
    }
}

/// Whether our parent is a trainbpf recorder: the same executable file as
/// ours (device and inode) and the same effective uid. The recorder starts
/// the trampoline itself, so it is always its parent.
pub(crate) fn started_by_recorder() -> Result<(), String> {
    let ppid = nix::unistd::getppid().as_raw();
    let me = fs::metadata("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let exe = fs::metadata(format!("/proc/{ppid}/exe"))
        .map_err(|e| format!("its parent {ppid} has no readable executable ({e})"))?;
    let status = fs::read_to_string(format!("/proc/{ppid}/status"))
        .map_err(|e| format!("its parent {ppid}: {e}"))?;
    // A parent that died meanwhile may have its pid reused by another
    // process; we would have been re-parented then, so ask again.
    if nix::unistd::getppid().as_raw() != ppid {
        return Err("its parent went away".into());
    }
    if (me.dev(), me.ino()) != (exe.dev(), exe.ino()) {
        return Err(format!("its parent {ppid} is not trainbpf"));
    }
    let euid = effective_uid(&status).ok_or_else(|| format!("its parent {ppid}: no Uid line"))?;
    if euid != Uid::effective().as_raw() {
        return Err(format!(
            "its parent {ppid} runs as uid {euid}, not as this process does"
        ));
    }
    Ok(())
}

/// The effective uid in a /proc/PID/status text (`Uid: real eff saved fs`).
fn effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The recorder gives back the value it had before protecting itself at
/// -1000, so a real job's value is never below the one it inherits.
fn may_set_adj(now: i64, wanted: i64) -> bool {
    wanted >= now
}

fn own_oom_score_adj() -> io::Result<i64> {
    fs::read_to_string("/proc/self/oom_score_adj")?
        .trim()
        .parse()
        .map_err(io::Error::other)
}

/// Writes `adj` to our own oom_score_adj and reads it back.
fn restore_oom_score_adj(adj: i64) -> io::Result<()> {
    const PATH: &str = "/proc/self/oom_score_adj";
    fs::write(PATH, adj.to_string())?;
    let now = fs::read_to_string(PATH)?;
    if now.trim() != adj.to_string() {
        return Err(io::Error::other(format!(
            "it reads {} after writing",
            now.trim()
        )));
    }
    Ok(())
}

/// setgroups/setgid/setuid to the invoking user, with their HOME, USER and
/// LOGNAME, the way `sudo -u` would; the rest of the environment stays.
/// A uid without a passwd entry gets HOME=/ (as systemd gives such users),
/// never root's, and USER and LOGNAME set to the number.
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
    match user {
        Some(u) => cmd
            .env("HOME", &u.dir)
            .env("USER", &u.name)
            .env("LOGNAME", &u.name),
        None => cmd
            .env("HOME", "/")
            .env("USER", uid.to_string())
            .env("LOGNAME", uid.to_string()),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adj_only_goes_up() {
        assert!(may_set_adj(-1000, 0));
        assert!(may_set_adj(200, 200));
        assert!(!may_set_adj(0, -1000));
        assert!(!may_set_adj(-500, -1000));
    }

    #[test]
    fn effective_uid_is_the_second_field() {
        let s = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(effective_uid(s), Some(0));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn a_test_runner_is_not_a_recorder() {
        // Our parent is cargo or a shell, never this test binary.
        let e = started_by_recorder().unwrap_err();
        assert!(
            e.contains("not trainbpf") || e.contains("runs as uid"),
            "{e}"
        );
    }
}
