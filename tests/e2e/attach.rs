//! Attaching to a job that is already running: `--pid` follows it and its
//! descendants born later, catches its kill, and ends when it is gone;
//! `--cgroup` follows a cgroup; Ctrl-C (SIGINT) detaches and leaves the job
//! running.

use std::{
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::support::*;

/// Starts `script` in the cgroup (it moves itself in first) and returns it.
fn start_in(cg: &Cg, script: &str) -> Child {
    let procs = cg.0.join("cgroup.procs");
    let prog = format!(
        "import os\nopen({:?}, 'w').write(str(os.getpid()))\n{script}",
        procs.display().to_string()
    );
    Command::new(python())
        .args(["-c", &prog])
        .stdin(Stdio::null())
        .spawn()
        .expect("start the job")
}

/// Grows 1 MiB every 100 ms (10 MiB/s), after forking a worker that does
/// the same, so that a process born after the attach is part of the job.
const LEAK: &str = r#"
import os, time
time.sleep(6)
if os.fork() == 0:
    h = []
    while True:
        h.append(bytearray(b"w") * (1 << 20))
        time.sleep(0.1)
h = []
while True:
    h.append(bytearray(b"m") * (1 << 20))
    time.sleep(0.1)
"#;

/// `trainbpf record --pid PID` until the job ends; its stderr, echoed.
fn record_pid(rec: &std::path::Path, extra: &[&str], pid: u32) -> (Output, String) {
    let out = Command::new(bin())
        .arg("record")
        .args(extra)
        .arg("-o")
        .arg(rec)
        .args(["--pid", &pid.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{stderr}");
    (out, stderr)
}

#[test]
fn attach_to_a_running_job_catches_its_kill() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("attach");
    let rec = dir.path("a.rec");
    let cg = Cg::new("attach", "120M");
    let mut job = start_in(&cg, LEAK);
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let (out, _) = record_pid(&rec, &[], job.id());
    let _ = job.wait();
    assert!(
        out.status.success(),
        "attach exits 0: the job's status is not its to pass on"
    );
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the recorder ended with the job"
    );
    let r = report_json(&rec);
    assert_eq!(u(&r["job"]["pid"]), job.id() as u64);
    let ks = kills(&r);
    assert!(!ks.is_empty(), "the kill was caught: {r:#}");
    let v = &ks[0]["victim"];
    assert_eq!(v["in_job"], true, "{v}");
    // The worker forked after the attach is the job's too.
    let procs = r["processes"].as_array().unwrap();
    assert!(
        procs
            .iter()
            .any(|p| p["parent"].as_u64() == Some(job.id() as u64)),
        "the worker born after the attach is in the job: {procs:#?}"
    );
}

/// Leaks 2 MiB/s, steadily, from its second second.
const SLOW_LEAK: &str = r#"
import time
time.sleep(1)
h = []
while True:
    h.append(b"l" * (1 << 20))
    time.sleep(0.5)
"#;

#[test]
fn attach_warns_of_a_leak_before_its_kill() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("attachleak");
    let rec = dir.path("l.rec");
    let cg = Cg::new("attachleak", "100M");
    let mut job = start_in(&cg, SLOW_LEAK);
    std::thread::sleep(Duration::from_millis(300));
    let pid = job.id() as u64;
    let (out, stderr) = record_pid(&rec, &["--leak-span", "10s"], pid as u32);
    let _ = job.wait();
    assert!(out.status.success());
    // Said on stderr while the job ran (no terminal here: no status line,
    // but the warning), before the kill's own lines.
    let warned = stderr
        .find(&format!(
            "trainbpf: warning: leak suspected: python3 (pid {pid}) has climbed +"
        ))
        .unwrap_or_else(|| panic!("no leak warning: {stderr}"));
    let killed = stderr.find("memcg OOM in").expect("the kill's verdict");
    assert!(warned < killed, "the warning came first");
    let r = report_json(&rec);
    let ks = kills(&r);
    assert_eq!(ks.len(), 1, "{ks:#?}");
    assert_eq!(u(&ks[0]["victim"]["pid"]), pid);
    let ws = r["leak_warnings"].as_array().unwrap();
    assert_eq!(ws.len(), 1, "warned once: {ws:#?}");
    let w = &ws[0];
    assert_eq!(u(&w["pid"]), pid);
    let warned_s = w["time_s"].as_f64().unwrap();
    let kill_s = ks[0]["time_s"].as_f64().unwrap();
    assert!(warned_s < kill_s, "{warned_s} before {kill_s}");
    // 2 MiB/s, and a projection to the 100 MiB limit that the kill bears
    // out roughly (the leak is steady; the cgroup also holds the page
    // cache and kernel memory of python's start-up).
    let slope = w["slope_kb_per_s"].as_f64().unwrap();
    assert!((1600.0..2500.0).contains(&slope), "{w}");
    assert_eq!(w["limit_of"], "cgroup");
    assert_eq!(u(&w["limit_kb"]), 100 << 10);
    let projected = w["projected_oom_s"].as_f64().unwrap();
    let actual = kill_s - warned_s;
    assert!(
        (projected - actual).abs() <= 0.35 * actual + 2.0,
        "projected {projected} s, came {actual} s later: {w}"
    );
}

#[test]
fn sigint_detaches_and_leaves_the_job_running() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("detach");
    let rec = dir.path("d.rec");
    let cg = Cg::new("detach", "1G");
    let mut job = start_in(&cg, "import time\ntime.sleep(30)\n");
    std::thread::sleep(Duration::from_millis(300));
    let mut rec_proc = Command::new(bin())
        .args(["record", "-o"])
        .arg(&rec)
        .arg("--cgroup")
        .arg(&cg.0)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it says it is attached.
    let mut err = std::io::BufReader::new(rec_proc.stderr.take().unwrap());
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0 {
        eprint!("{line}");
        if line.contains("attached;") {
            break;
        }
        line.clear();
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::stderr()));
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(rec_proc.id() as i32, libc::SIGINT) }, 0);
    let st = rec_proc.wait().unwrap();
    assert!(st.success(), "detaching is success: {st}");
    assert!(
        job.try_wait().unwrap().is_none(),
        "the job runs on untouched after the recorder detached"
    );
    let r = report_json(&rec);
    assert!(
        r["job"]["exit"].is_null(),
        "no exit recorded for a job that runs on"
    );
    job.kill().unwrap();
    let _ = job.wait();
}
