//! The frames' namer and its CPython reader: the children that parse the
//! job's files (unwind tables, symbols, line tables, the interpreter's
//! ELF) and its CPython structures run as the invoking user, or `nobody`
//! when root runs the recorder without sudo, with no capabilities, no new
//! privileges, the kernel's default OOM score and a seccomp filter; and
//! the recording's stacks are still named through them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The recorder's children running the namer, each with whether it is
/// the CPython reader.
fn namers(recorder: u32) -> Vec<(u32, bool)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            (ppid == Some(recorder) && args.get(1) == Some(&&b"__name-frames"[..]))
                .then(|| (pid, args.get(4) == Some(&&b"python"[..])))
        })
        .collect()
}

fn field<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or("")
        .trim()
}

/// Records the leaking job with `env`, and checks the namer's rights
/// while it runs: its ids are `uid`, and it has nothing more.
fn check(dir: &Path, name: &str, env: &[(&str, &str)], uid: u32) {
    let script = dir.join("leak.py");
    let out_dir = dir.join(name);
    std::fs::create_dir_all(&out_dir).unwrap();
    std::os::unix::fs::chown(&out_dir, Some(uid), Some(uid)).unwrap();
    let rec = out_dir.join("r.rec");
    let mut c = Command::new(bin());
    c.args(["record", "-q", "--memory-limit", "256M", "-o"])
        .arg(&rec)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(&script)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starting trainbpf record");
    let recorder = child.id();
    let recorder_status =
        std::fs::read_to_string(format!("/proc/{recorder}/status")).unwrap_or_default();
    let until = Instant::now() + Duration::from_secs(20);
    // Both children: the one that names native frames, and the CPython
    // reader, started at the job's first Python process.
    let mut seen: [Option<(u32, String, String)>; 2] = [None, None];
    let mut last = String::new();
    while Instant::now() < until && seen.iter().any(Option::is_none) {
        for (pid, python) in namers(recorder) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let adj =
                std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap_or_default();
            // Its privileges go first; its seccomp filter before its first
            // request.
            if !status.is_empty()
                && field(&status, "Uid:") != "0\t0\t0\t0"
                && field(&status, "Seccomp:") == "2"
            {
                seen[python as usize].get_or_insert((pid, status, adj));
            } else if !status.is_empty() {
                last = status;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {name}: {}\n{stderr}", out.status);
    // One filter more than the recorder has (a container may give it one).
    let inherited: u32 = field(&recorder_status, "Seccomp_filters:")
        .parse()
        .unwrap_or(0);
    for (i, which) in ["namer", "CPython reader"].iter().enumerate() {
        let (pid, status, adj) = seen[i]
            .take()
            .unwrap_or_else(|| panic!("{name}: no {which} under its filter seen; last:\n{last}"));
        eprintln!("{name}: {which} {pid}:\n{status}");
        let ids = format!("{uid}\t{uid}\t{uid}\t{uid}");
        assert_eq!(field(&status, "Uid:"), ids, "{name} {which}");
        assert_eq!(field(&status, "Gid:"), ids, "{name} {which}");
        assert_eq!(field(&status, "Groups:"), "", "{name} {which}");
        for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:", "CapBnd:"] {
            assert_eq!(
                u64::from_str_radix(field(&status, caps), 16),
                Ok(0),
                "{name} {which}: {caps}"
            );
        }
        assert_eq!(field(&status, "NoNewPrivs:"), "1", "{name} {which}");
        assert_eq!(
            field(&status, "Seccomp_filters:"),
            (inherited + 1).to_string(),
            "{name} {which}: its own filter"
        );
        assert_eq!(
            adj.trim(),
            "0",
            "{name} {which}: neither the recorder's protection nor the first victim"
        );
    }
    // The stacks were named through them: the Python line, and native
    // frames.
    assert!(stderr.contains("killed"), "{name}: no kill");
    let r = report_json(&rec);
    let heavy = &job_kill(&r)["growers"][0]["stacks"][0];
    assert!(heavy.to_string().contains("leak_step"), "{name}: {heavy}");
    let native = heavy["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "native" && f["function"].is_string())
        .count();
    assert!(native > 0, "{name}: no native frame named: {heavy}");
    assert_eq!(r["job_reads"]["namer_failed"], 0, "{name}");
}

#[test]
fn the_namer_runs_as_the_invoking_user_with_nothing_more() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("namer");
    std::fs::write(dir.path("leak.py"), super::leak_py("0.02")).unwrap();
    check(
        &dir.path(""),
        "sudo",
        &[("SUDO_UID", "4242"), ("SUDO_GID", "4242")],
        4242,
    );
    // Root without sudo: nobody.
    check(&dir.path(""), "root", &[], 65534);
}

/// Leaks in `leak_step` for its first 3 s, then in `leak_after`, whose
/// stacks are therefore named after the test has killed the children.
const TWO_PHASES: &str = r#"
import time
keep = []
def leak_step():
    keep.append(b"x" * (1 << 20))
def leak_after():
    keep.append(b"y" * (1 << 20))
t0 = time.time()
while time.time() - t0 < 3:
    leak_step()
    time.sleep(0.05)
while True:
    leak_after()
    time.sleep(0.01)
"#;

/// Both children killed while the job runs: the recording completes, the
/// failure is counted and said, and stacks taken after it are named by
/// children started again, the Python line among them (the CPython reader
/// rebuilds the interpreter from what each request carries).
#[test]
fn killed_namers_cost_no_recording_and_are_started_again() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("namer-killed");
    std::fs::write(dir.path("two.py"), TWO_PHASES).unwrap();
    let rec = dir.path("k.rec");
    let child = Command::new(bin())
        .args(["record", "-q", "--memory-limit", "256M", "-o"])
        .arg(&rec)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(dir.path("two.py"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting trainbpf record");
    let recorder = child.id();
    let until = Instant::now() + Duration::from_secs(20);
    let confined = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        field(&status, "Seccomp:") == "2"
    };
    let mut both = Vec::new();
    while Instant::now() < until && both.len() < 2 {
        both = namers(recorder)
            .into_iter()
            .filter(|&(pid, _)| confined(pid))
            .collect();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(both.len(), 2, "the namer and the CPython reader: {both:?}");
    // The first stacks are named by now; the second phase is 2 s away.
    std::thread::sleep(Duration::from_millis(500));
    for &(pid, _) in &both {
        // SAFETY: a signal to a child of the recorder this test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {}\n{stderr}", out.status);
    assert!(stderr.contains("killed"), "no kill: {stderr}");
    let r = report_json(&rec);
    let reads = &r["job_reads"];
    eprintln!("job_reads: {reads}");
    assert!(u(&reads["namer_failed"]) >= 1, "{reads}");
    for who in ["the frames' namer (pid", "the CPython reader (pid"] {
        assert!(
            reads["notes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n.as_str().is_some_and(|n| n.starts_with(who))),
            "{who}: {reads}"
        );
    }
    let stacks = job_kill(&r)["growers"][0]["stacks"].clone();
    let after = stacks
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["kind"] == "python" && f["function"] == "leak_after")
        })
        .unwrap_or_else(|| panic!("no stack names leak_after: {stacks}"));
    eprintln!("after the kill: {after}");
    assert!(
        after["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "native" && f["function"].is_string()),
        "native frames named after the kill: {after}"
    );
}
