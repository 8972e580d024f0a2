//! Running the job: exit status, missing commands, privileges, and a
//! recorder that dies mid-run.

use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    process::Command,
    time::{Duration, Instant},
};

use crate::support::*;

#[test]
fn normal_exit_status_passes_through() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("exit3");
    let rec = dir.path("exit.rec");
    let out = record(&rec, &[], &["/bin/sh", "-c", "echo hello; exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello\n",
        "the job keeps our stdout"
    );
    let r = report_json(&rec);
    assert_eq!(r["job"]["exit"]["code"], 3);
    assert!(kills(&r).is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("code 3"),
        "verdict names the exit code: {stderr}"
    );
}

#[test]
fn missing_command_exits_127_and_names_it() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("missing");
    let rec = dir.path("missing.rec");
    let out = record(&rec, &[], &["/no/such/trainbpf-cmd", "arg"]);
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/no/such/trainbpf-cmd: command not found"),
        "stderr: {stderr}"
    );
}

#[test]
fn job_runs_as_the_invoking_user_and_owns_the_recording() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("sudo");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let rec = dir.path("user.rec");
    let out = Command::new(bin())
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--", "/bin/sh", "-c", "id -u; id -g; echo $HOME"])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .current_dir(&dir.0)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<_> = stdout.lines().collect();
    assert_eq!(lines[..2], ["65534", "65534"], "stdout: {stdout}");
    let home = nix_home(65534);
    assert_eq!(lines[2], home, "HOME is the user's");
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&rec).unwrap();
    assert_eq!((m.uid(), m.gid()), (65534, 65534));
    assert_eq!(m.mode() & 0o777, 0o600);
}

fn nix_home(uid: u32) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 5 && f[2] == uid.to_string())
        .map(|f| f[5].to_string())
        .expect("uid in /etc/passwd")
}

#[test]
fn without_privileges_the_error_names_what_is_missing() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("noprivs");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    // A copy nobody can execute, wherever the checkout lives.
    let exe = dir.path("trainbpf");
    std::fs::copy(bin(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(&exe);
    cmd.args(["record", "-o"])
        .arg(dir.path("x.rec"))
        .args(["--", "/bin/true"])
        .current_dir(&dir.0)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID");
    // SAFETY: setgid/setuid are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(!out.status.success());
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("CAP_PERFMON"),
        "{stderr}"
    );
    assert!(stderr.contains("sudo"), "{stderr}");
    assert!(!dir.path("x.rec").exists(), "nothing is written on refusal");
}

/// The recorder is SIGKILLed while the job runs: everything it had flushed
/// (at most a second old) must still read.
#[test]
fn recorder_killed_mid_run_leaves_a_readable_recording() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("sigkill");
    let rec = dir.path("killed.rec");
    let grow = "import time\nh=[]\nfor i in range(60):\n    h.append(bytearray(b'x')*(8<<20))\n    time.sleep(0.1)\n";
    let os = |s: &str| std::ffi::OsString::from(s);
    let args = [
        os("record"),
        os("-o"),
        rec.clone().into_os_string(),
        os("--"),
        os(python()),
        os("-c"),
        os(grow),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let mut child = spawn_until(&args, "recording to");
    let start = Instant::now();
    // About 2.5 s of the job's growth, with its records flushed each second.
    std::thread::sleep(Duration::from_millis(2500));
    // The job outlives its recorder, orphaned: take its pid while it is
    // still below our child.
    let job = descendants(child.id());
    assert!(!job.is_empty(), "the job runs below the recorder");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The orphaned job runs on untouched; stop it ourselves.
    kill_started(&job);
    let r = report_json(&rec);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "sanity: the job was still running when the recorder died"
    );
    let job_pid = u(&r["job"]["pid"]);
    assert!(job_pid > 0, "the job's start was flushed: {r:#}");
    assert!(r["job"]["exit"].is_null(), "no exit was recorded: {r:#}");
    let procs = r["processes"].as_array().expect("processes");
    let me = procs
        .iter()
        .find(|p| u(&p["pid"]) == job_pid)
        .unwrap_or_else(|| panic!("job process in report: {procs:#?}"));
    // About 2 s of growth at 80 MiB/s reached the disk before the kill.
    let peak = u(&me["peak_rss_kb"]);
    assert!(
        peak > 64 * 1024,
        "peak {peak} kB: the last second's data is there"
    );
}

/// `kill -TERM <recorder>` (systemd stopping the unit, a scheduler
/// preempting) reaches the job, and the job's own status comes back.
#[test]
fn sigterm_to_the_recorder_is_forwarded_to_the_job() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("sigterm");
    let rec = dir.path("term.rec");
    let ready = dir.path("ready");
    let script = format!(
        "trap 'exit 42' TERM; touch {}; sleep 30 & wait",
        ready.display()
    );
    let args: Vec<std::ffi::OsString> = vec![
        "record".into(),
        "-o".into(),
        rec.clone().into_os_string(),
        "--".into(),
        "/bin/sh".into(),
        "-c".into(),
        script.into(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let mut child = spawn_until(&args, "recording to");
    // The trap must be set before the signal comes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The shell forks `sleep 30` after it touches the ready file, and the
    // sleep outlives it: wait for it below our child and take its pid.
    let job = loop {
        let job = descendants(child.id());
        let sleeping = job.iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{}/comm", p.pid)).is_ok_and(|c| c == "sleep\n")
        });
        if sleeping {
            break job;
        }
        assert!(Instant::now() < deadline, "the job's sleep never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let status = child.wait().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the job stopped promptly"
    );
    assert_eq!(
        status.code(),
        Some(42),
        "the job's trap ran and its status came back"
    );
    kill_started(&job);
}
