//! What a local user allowed `sudo trainbpf` alone (sudoers) could reach
//! through it: each test pins one hole and failed on the recorder before
//! the fix.
//!
//! The tests run as root and play the sudo user with SUDO_UID/SUDO_GID
//! naming nobody (65534), as sudo would set them. They kill only the pids
//! they started.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    process::{Child, Command, Output},
    time::Duration,
};

use crate::support::*;

const NOBODY: &str = "65534";

/// Prints what a command did, for the failure message and the log.
fn show(what: &str, out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "--- {what}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// Any user could run `echo g | sudo trainbpf
/// __exec 0 0 0 0 -- /bin/sh` and get a root shell where sudoers allows
/// only trainbpf: the trampoline took the uid to run as from its own
/// arguments, saw 0 and dropped nothing, and set whatever oom_score_adj it
/// was told, -1000 too. It now runs only as the child of a trainbpf
/// recorder, takes the user from SUDO_UID/SUDO_GID as the recorder does,
/// and never lowers its oom_score_adj. Tried with the argument layout the
/// recorder used (FD UID GID ADJ) and the one it uses now (FD ADJ), at the
/// test's own oom_score_adj (which any kernel accepts) and at -1000.
#[test]
fn exec_trampoline_through_sudo_runs_nothing() {
    require_root();
    let _g = serial();
    let own_adj = fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    let own_adj = own_adj.trim();
    for args in [
        vec!["0", "0", "0", own_adj],
        vec!["0", "0", "0", "-1000"],
        vec!["0", own_adj],
    ] {
        let mut cmd = Command::new("/bin/sh");
        cmd.args([
            "-c",
            r#"echo g | "$0" __exec "$@" -- /bin/sh -c 'echo "uid=$(/usr/bin/id -u) adj=$(cat /proc/self/oom_score_adj)"'"#,
        ])
        .arg(bin())
        .args(&args)
        .env("SUDO_UID", NOBODY)
        .env("SUDO_GID", NOBODY);
        let out = output_within(&mut cmd, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("__exec {args:?} hung (killed after 30 s)"));
        let (stdout, stderr) = show(&format!("sudo trainbpf __exec {args:?}"), &out);
        assert!(
            stdout.trim().is_empty(),
            "__exec {args:?} ran the command: {}",
            stdout.trim()
        );
        assert!(!out.status.success(), "{}", out.status);
        assert!(stderr.contains("internal to trainbpf record"), "{stderr}");
    }
}

/// `record --cgroup DIR` took any directory
/// with a `cgroup.procs` in it, and root read that file at start and every
/// second, following links: one that is a FIFO hung the recorder for good
/// (a link to a device would have had the device's side effects, and a
/// fake list made root trace whatever pids it named). A directory that is
/// not on a cgroup file system is now refused at once, and `cgroup.procs`
/// is read without following links or blocking.
#[test]
fn cgroup_dir_that_is_not_a_cgroup_is_refused_at_once() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("fake-cgroup");
    let fake = dir.path("fake");
    fs::create_dir(&fake).unwrap();
    let fifo = fake.join("cgroup.procs");
    let st = Command::new("/usr/bin/mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success(), "mkfifo {}", fifo.display());
    let rec = dir.path("fake.rec");
    let mut cmd = Command::new(bin());
    cmd.args(["record", "-q", "-o"])
        .arg(&rec)
        .arg("--cgroup")
        .arg(&fake);
    let out = output_within(&mut cmd, Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "record --cgroup {} hung on the FIFO {} (killed after 30 s)",
            fake.display(),
            fifo.display()
        )
    });
    let (_, stderr) = show("record --cgroup FAKE", &out);
    assert!(!out.status.success(), "{}", out.status);
    assert!(
        stderr.contains("not on a cgroup file system"),
        "no clear error: {stderr}"
    );
    assert!(!rec.exists(), "a recording was started");
}

/// Kills the test's own child when the test ends, however it ends.
struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Through sudo, `--pid`, `--cgroup` and
/// `--all` gave any user root's view of other users' processes (command
/// lines, maps, open files, smaps) in a recording that user owns. A sudo
/// user may now attach only to their own processes, and `--all` needs root
/// itself; nothing is recorded when refused. Tried on a `sleep` the test
/// started as root, with the output directory writable by nobody so that
/// only the refusal can stop the recording.
#[test]
fn sudo_user_cannot_attach_to_other_users_processes() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("attach-other");
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o1777)).unwrap();
    let sleeper = Sleeper(Command::new("/bin/sleep").arg("120").spawn().unwrap());
    let pid = sleeper.0.id().to_string();
    let rec = dir.path("other.rec");
    for (extra, refusal) in [
        (vec!["--pid", pid.as_str()], "is not yours"),
        (vec!["--all"], "--all needs root itself"),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args(["record", "-q", "-o"])
            .arg(&rec)
            .args(&extra)
            .env("SUDO_UID", NOBODY)
            .env("SUDO_GID", NOBODY);
        let out = output_within(&mut cmd, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!(
                "record {extra:?} as uid {NOBODY} through sudo attached and was still recording root's processes after 20 s (killed); {} exists: {}",
                rec.display(),
                rec.exists()
            )
        });
        let (_, stderr) = show(&format!("record {extra:?} as nobody"), &out);
        assert!(!out.status.success(), "{}", out.status);
        assert!(stderr.contains(refusal), "no clear refusal: {stderr}");
        assert!(
            !rec.exists(),
            "a recording of root's processes was left for uid {NOBODY}"
        );
    }
    drop(sleeper);
}
