//! The job's memory cgroup, the ids the job runs as,
//! and the recorder's OOM protection. Each test pins one finding and
//! failed on the recorder before the fix.
//!
//! The cgroup tests use the cgroup v1 memory hierarchy this project's
//! machines have (docs: ../shared/PLATFORM.md); they kill only the pids
//! they started and remove only the cgroups they made.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use crate::support::*;

const V1: &str = "/sys/fs/cgroup/memory";

/// This test process's memory cgroup: its path as /proc/self/cgroup names
/// it, and its directory. The recorders the tests start inherit it.
fn own_memcg() -> (String, PathBuf) {
    assert!(
        Path::new(V1).join("memory.limit_in_bytes").exists(),
        "these tests need the cgroup v1 memory hierarchy at {V1}"
    );
    let rel = memcg_of(&fs::read_to_string("/proc/self/cgroup").unwrap())
        .expect("a memory line in /proc/self/cgroup");
    let dir = Path::new(V1).join(rel.trim_start_matches('/'));
    (rel, dir)
}

/// The v1 memory cgroup path in a /proc/PID/cgroup text.
fn memcg_of(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        ctl.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })
}

/// A cgroup the test made; its processes are the test's own children.
struct Planted {
    dir: PathBuf,
    sleeper: Option<Child>,
}

impl Planted {
    /// mkdir `dir`, set `limit`, and, when `with_sleeper`, start a `sleep`
    /// in it.
    fn new(dir: PathBuf, limit: Option<&str>, with_sleeper: bool) -> Planted {
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        if let Some(l) = limit {
            fs::write(dir.join("memory.limit_in_bytes"), l).unwrap();
        }
        let sleeper = with_sleeper.then(|| {
            let c = Command::new("/bin/sleep").arg("600").spawn().unwrap();
            fs::write(dir.join("cgroup.procs"), c.id().to_string()).unwrap();
            c
        });
        Planted { dir, sleeper }
    }

    fn sleeper_alive(&mut self) -> bool {
        matches!(self.sleeper.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    fn limit(&self) -> String {
        fs::read_to_string(self.dir.join("memory.limit_in_bytes"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        if let Some(c) = &mut self.sleeper {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// A pid that just ended (reaped): a recorder with it is gone.
fn dead_pid() -> u32 {
    let mut c = Command::new("/bin/true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// `--memory-limit` reused an existing
/// `trainbpf-<recorder pid>` cgroup, rewrote its limit and SIGKILLed every
/// process in it at exit. Cgroups are planted under that predictable name
/// (at the hierarchy's root, where the old recorder made it, and in the
/// recorder's own cgroup), each holding a process of the test's: the
/// recorder makes a new cgroup with an unpredictable name instead, and the
/// planted ones keep their limit and their process. An empty leftover of a
/// dead recorder is cleaned up; a non-empty one is left alone.
#[test]
fn memory_limit_never_reuses_or_signals_a_planted_cgroup() {
    require_root();
    let _g = serial();
    let (own_rel, own_dir) = own_memcg();
    let dir = TempDir::new("cg-planted");
    let rec = dir.path("planted.rec");

    // The shell becomes the recorder by exec, so its pid is the recorder's;
    // it waits for a line so that the cgroups are planted first.
    let mut sh = Command::new("/bin/sh")
        .args(["-c", r#"read _ && exec "$0" "$@""#])
        .arg(bin())
        .args(["record", "-o"])
        .arg(&rec)
        .args([
            "--memory-limit",
            "100M",
            "--",
            "/bin/cat",
            "/proc/self/cgroup",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = sh.id();
    let predictable = format!("trainbpf-{pid}");
    let mut planted = vec![Planted::new(
        Path::new(V1).join(&predictable),
        Some("500M"),
        true,
    )];
    if own_dir != Path::new(V1) {
        planted.push(Planted::new(own_dir.join(&predictable), Some("500M"), true));
    }
    let gone = dead_pid();
    // Leftovers of a recorder that died: one empty, one still holding a
    // process.
    let empty_stale = own_dir.join(format!("trainbpf-{gone}-0123456789abcdef"));
    let _stale = Planted::new(empty_stale.clone(), None, false);
    let mut busy_stale = Planted::new(own_dir.join(format!("trainbpf-{gone}")), None, true);

    sh.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = sh.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- recorder {pid}: {}\n--- stdout:\n{stdout}--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    for p in &mut planted {
        assert!(
            p.sleeper_alive(),
            "the process in the planted {} was killed",
            p.dir.display()
        );
        assert_eq!(
            p.limit(),
            (500u64 << 20).to_string(),
            "the planted {}'s limit was rewritten",
            p.dir.display()
        );
    }
    assert!(out.status.success(), "{}", out.status);
    let job_cg = memcg_of(&stdout).expect("the job printed its cgroups");
    let parent = own_rel.trim_end_matches('/');
    let name = job_cg
        .strip_prefix(&format!("{parent}/"))
        .unwrap_or_else(|| panic!("job cgroup {job_cg} is not directly below {own_rel}"));
    assert_ne!(name, predictable, "the predictable name was used");
    let random = name
        .strip_prefix(&format!("trainbpf-{pid}-"))
        .unwrap_or_else(|| panic!("job cgroup name {name}"));
    assert!(
        random.len() == 16 && random.bytes().all(|c| c.is_ascii_hexdigit()),
        "job cgroup name {name} has no random part"
    );
    assert!(
        !own_dir.join(name).exists(),
        "the job's cgroup {name} was not removed"
    );
    assert!(
        !empty_stale.exists(),
        "the empty leftover {} was not cleaned up",
        empty_stale.display()
    );
    assert!(
        busy_stale.dir.exists() && busy_stale.sleeper_alive(),
        "a leftover that holds a process was touched"
    );
}

/// The job's cgroup was made at the top of the
/// hierarchy, so a job escaped the limit of the cgroup the recorder ran in
/// (a container, a Slurm job). The recorder runs here in a test-made cgroup
/// limited to 256M; the job, with a `--memory-limit` of 2G, grows to 600M:
/// its cgroup must be below the recorder's, and the 256M must kill it.
#[test]
fn job_cgroup_is_below_the_recorders_and_keeps_its_limit() {
    require_root();
    let _g = serial();
    let (own_rel, own_dir) = own_memcg();
    let dir = TempDir::new("cg-nested");
    let rec = dir.path("nested.rec");
    let parent_name = format!("trainbpf-test-parent-{}", std::process::id());
    let parent = Planted::new(own_dir.join(&parent_name), Some("256M"), false);
    let parent_rel = format!("{}/{parent_name}", own_rel.trim_end_matches('/'));

    let grow = r#"
import sys
hold = []
for _ in range(75):
    hold.append(bytearray(b"x") * (8 << 20))
print("grew to 600M", flush=True)
"#;
    let job = format!(
        "cat /proc/self/cgroup; exec {} -c '{}'",
        python(),
        grow.replace('\'', "\"")
    );
    let out = Command::new("/bin/sh")
        .args([
            "-c",
            r#"echo $$ > "$1/cgroup.procs" && shift && exec "$@""#,
            "sh",
        ])
        .arg(&parent.dir)
        .arg(bin())
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--memory-limit", "2G", "--", "/bin/sh", "-c", &job])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- recorder: {}\n--- stdout:\n{stdout}--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let job_cg = memcg_of(&stdout).expect("the job printed its cgroups");
    assert!(
        !stdout.contains("grew to 600M"),
        "the job outgrew the recorder's 256M limit, in cgroup {job_cg}"
    );
    assert!(
        job_cg.starts_with(&format!("{parent_rel}/trainbpf-")),
        "the job's cgroup {job_cg} is not below the recorder's {parent_rel}"
    );
    assert_eq!(
        out.status.code(),
        Some(137),
        "the job was OOM-killed (SIGKILL) at the recorder's limit"
    );
    let r = report_json(&rec);
    let k = kills(&r);
    assert_eq!(k.len(), 1, "{k:#?}");
    assert_eq!(k[0]["constraint"], "memcg");
    drop(parent);
}

/// Does uid `uid` have a passwd entry?
fn has_passwd_entry(uid: u32) -> bool {
    // SAFETY: getpwuid returns a pointer into static storage or null; only
    // its nullness is read, on this thread, before any other call.
    !unsafe { libc::getpwuid(uid) }.is_null()
}

/// `SUDO_UID` without `SUDO_GID` silently ran the
/// job as root, and a uid without a passwd entry kept root's HOME. Now the
/// first is refused before the job runs; the second gets HOME=/.
#[test]
fn sudo_uid_without_gid_is_refused_and_a_uid_without_passwd_gets_no_root_home() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("sudo-ids");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o777)).unwrap();

    let mark = dir.path("ran-as");
    let out = Command::new(bin())
        .args(["record", "-o"])
        .arg(dir.path("half.rec"))
        .args(["--", "/bin/sh", "-c", r#"id -u > "$0""#])
        .arg(&mark)
        .env("SUDO_UID", "65534")
        .env_remove("SUDO_GID")
        .env("HOME", "/root")
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- SUDO_UID alone: {}\n{stderr}", out.status);
    assert!(
        !mark.exists(),
        "the job ran, as uid {}",
        fs::read_to_string(&mark).unwrap_or_default().trim()
    );
    assert!(!out.status.success(), "{}", out.status);
    assert!(
        stderr.contains("SUDO_UID is set without SUDO_GID"),
        "the error says why: {stderr}"
    );

    let nobody = 54321;
    assert!(
        !has_passwd_entry(nobody),
        "uid {nobody} must have no passwd entry"
    );
    let out = Command::new(bin())
        .args(["record", "-o"])
        .arg(dir.path("nopasswd.rec"))
        .args(["--", "/bin/sh", "-c", "id -u; echo \"$HOME\""])
        .env("SUDO_UID", nobody.to_string())
        .env("SUDO_GID", nobody.to_string())
        .env("HOME", "/root")
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- uid {nobody}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"54321"), "{stdout}");
    assert_ne!(lines.get(1), Some(&"/root"), "the job kept root's HOME");
    assert_eq!(
        lines.get(1),
        Some(&"/"),
        "HOME is / for a uid without a home"
    );
}

const CAP_SYS_RESOURCE: u32 = 24;

/// The capabilities of root without CAP_SYS_RESOURCE, for `cmd`.
fn without_sys_resource() -> Command {
    let mut c = Command::new("/usr/bin/setpriv");
    c.args([
        "--inh-caps",
        "-sys_resource",
        "--bounding-set",
        "-sys_resource",
        "--",
    ]);
    c
}

fn doctor_check(out: &std::process::Output, id: &str) -> serde_json::Value {
    assert!(out.status.success(), "doctor: {}", out.status);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("doctor has no {id} check: {v:#}"))
        .clone()
}

/// `doctor` said all was well while the recorder could
/// not protect itself from the OOM killer (oom_score_adj -1000 needs
/// CAP_SYS_RESOURCE), and a failure to give the job back its own
/// oom_score_adj was ignored, so the job could run at -1000. Without
/// CAP_SYS_RESOURCE, doctor now says so and how to fix it, and record warns
/// and notes it in the recording. The job's side is tested through the
/// trampoline (`trainbpf __exec`, which the recorder runs) started at
/// -1000 (or 500 where the test's root cannot lower it) with a value to
/// restore that the kernel refuses: the job must not start.
#[test]
fn without_cap_sys_resource_doctor_and_record_say_the_recorder_is_unprotected() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("oom-protect");

    // This test's own root may lack CAP_SYS_RESOURCE already (some
    // sandboxes drop it): doctor must then say so too.
    let have = fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0);
    let full = Command::new(bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let c = doctor_check(&full, "oom_protect");
    let want = if have { "able" } else { "unable" };
    assert_eq!(c["state"], want, "as this test's root: {c:#}");

    let out = without_sys_resource()
        .arg(bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let c = doctor_check(&out, "oom_protect");
    eprintln!("--- doctor without CAP_SYS_RESOURCE: {c:#}");
    assert_eq!(c["state"], "unable", "{c:#}");
    assert_eq!(c["status"], "warn", "{c:#}");
    for key in ["finding", "fix"] {
        let s = c[key].as_str().unwrap();
        assert!(s.contains("CAP_SYS_RESOURCE"), "{key}: {s}");
    }

    let rec = dir.path("unprotected.rec");
    let out = without_sys_resource()
        .arg(bin())
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--", "/bin/cat", "/proc/self/oom_score_adj"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "--- record without CAP_SYS_RESOURCE: {}\n{stderr}",
        out.status
    );
    assert!(out.status.success(), "{}", out.status);
    assert!(
        stderr.contains("could not set the recorder's oom_score_adj to -1000")
            && stderr.contains("CAP_SYS_RESOURCE"),
        "{stderr}"
    );
    let own_adj = fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        own_adj.trim(),
        "the job has the adj it would have without trainbpf"
    );
    let r = report_json(&rec);
    let noted = r["recording"]["fallbacks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| {
            f["probe"].as_str().unwrap_or("").contains("oom_score_adj")
                && f["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("CAP_SYS_RESOURCE")
        });
    assert!(noted, "the recording does not say: {:#}", r["recording"]);

    // The trampoline, at the recorder's -1000 (500 where this root can't
    // lower it), told to restore a value the kernel refuses. It runs only
    // as a recorder's child (security/sudo.rs): the job of a
    // recorder becomes it, reading its go byte from a file.
    let mark = dir.path("job-adj");
    let go = dir.path("go");
    fs::write(&go, "g").unwrap();
    let out = Command::new(bin())
        .args(["record", "-q", "-o"])
        .arg(dir.path("trampoline.rec"))
        .args([
            "--",
            "/bin/sh",
            "-c",
            r#"{ echo -1000 > /proc/self/oom_score_adj; } 2>/dev/null || echo 500 > /proc/self/oom_score_adj && exec "$0" __exec 0 5000 -- /bin/sh -c 'cat /proc/self/oom_score_adj > "$0"' "$1" < "$2""#,
        ])
        .arg(bin())
        .arg(&mark)
        .arg(&go)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- trampoline: {}\n{stderr}", out.status);
    assert!(
        !mark.exists(),
        "the job started at oom_score_adj {}",
        fs::read_to_string(&mark).unwrap_or_default().trim()
    );
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot give the job its oom_score_adj 5000 back"),
        "{stderr}"
    );
}
