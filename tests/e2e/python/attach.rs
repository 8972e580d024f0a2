//! A Python job attached with `--pid` that grows at once: its interpreter
//! is located before its processes are the job's in the kernel, so the
//! stacks of its first burst already carry the Python line.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::support::*;

/// Waits for `go` to exist, then grows 64 MiB in one quick burst in
/// `burst()`, and exits a second later.
const BURST: &str = r#"
import os, sys, time
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.01)
keep = []
def burst():
    for _ in range(64):
        keep.append(b"x" * (1 << 20))
burst()
time.sleep(1)
"#;

#[test]
fn an_attached_jobs_first_stacks_carry_its_python_line() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("attach-py");
    let rec = dir.path("p.rec");
    let go = dir.path("go");
    let mut job = Command::new(python())
        .args(["-c", BURST])
        .arg(&go)
        .stdin(Stdio::null())
        .spawn()
        .expect("start the job");
    // Its interpreter up and waiting.
    std::thread::sleep(Duration::from_millis(300));
    let pid = job.id().to_string();
    let args: Vec<&std::ffi::OsStr> = vec![
        "record".as_ref(),
        "-q".as_ref(),
        "-o".as_ref(),
        rec.as_os_str(),
        "--pid".as_ref(),
        pid.as_ref(),
    ];
    let mut recorder = spawn_until(&args, "attached");
    std::fs::write(&go, b"").unwrap();
    let started = Instant::now();
    let _ = job.wait();
    let status = recorder.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(started.elapsed() < Duration::from_secs(30));
    check(&rec, job.id());
}

fn check(rec: &Path, pid: u32) {
    let r = report_json(rec);
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| u(&p["pid"]) == pid as u64)
        .expect("the attached process in processes[]");
    let heavy = &p["stacks"][0];
    eprintln!("heaviest stack: {heavy}");
    assert!(u(&heavy["kb"]) >= 32 << 10, "the burst's stack: {heavy}");
    let frames = heavy["frames"].as_array().unwrap();
    assert!(
        frames
            .iter()
            .any(|f| f["kind"] == "python" && f["function"] == "burst"),
        "the heaviest stack has burst()'s line: {heavy}"
    );
    // None of the burst was taken before the interpreter was located.
    for s in p["stacks"].as_array().unwrap() {
        let e = s["error"].as_str().unwrap_or("");
        assert!(!e.contains("not located"), "{s}");
    }
}
