//! The bounded flight recording (`record --max-size`): a busy job's
//! recording stays under its bound; older samples are folded while recent
//! history, kills, deaths and process lifecycle stay whole; and a recorder
//! killed at any moment, mid-compaction included, leaves a file `report`
//! reads.

use std::{
    os::unix::process::CommandExt as _,
    process::{Command, Stdio},
    time::Duration,
};

use crate::support::*;
use serde_json::Value;

/// Five processes that map, fill and unmap 8 MiB every 5 ms (about 160 KB
/// of memory records a second in all); from the 6th second a worker is
/// forked every second that lives half a second; at 12 s one worker grows
/// until the cgroup's limit kills it (unless argv[2] is "nohog"; it never
/// passes 600 MiB). Prints how many workers it forked.
const JOB: &str = r#"
import mmap, os, sys, time
dur = float(sys.argv[1])
want_hog = sys.argv[2] != "nohog"
start = time.time()
fill = b"x" * (8 << 20)
def churn(until):
    while time.time() - start < until:
        m = mmap.mmap(-1, 8 << 20)
        m[:] = fill
        m.close()
        time.sleep(0.005)
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        churn(dur)
        os._exit(0)
    kids.append(pid)
forked = 4
hog = None
while time.time() - start < dur:
    t = time.time() - start
    if t > 6 and forked < 4 + int(t - 5):
        pid = os.fork()
        if pid == 0:
            churn(t + 0.5)
            os._exit(0)
        forked += 1
        os.waitpid(pid, 0)
    if t > 12 and hog is None and want_hog:
        hog = os.fork()
        if hog == 0:
            h = []
            while True:
                if len(h) < 150:
                    h.append(b"h" * (4 << 20))
                time.sleep(0.01)
        forked += 1
    churn(min(time.time() - start + 0.2, dur))
if hog:
    os.waitpid(hog, 0)
for k in kids:
    os.waitpid(k, 0)
print("forked", forked, flush=True)
"#;

/// Every decoded event, as `report --events` prints them.
fn events(rec: &std::path::Path) -> Vec<Value> {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .arg("--format=events")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn is_mem_of(e: &Value, pid: u64) -> bool {
    e["event"]["mem"]["proc"]["tgid"].as_u64() == Some(pid)
}

#[test]
fn a_busy_recording_stays_under_its_bound_and_keeps_what_matters() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("flight");
    let rec = dir.path("f.rec");
    let out = record(
        &rec,
        &[
            "--quiet",
            "--max-size",
            "2M",
            "--full-span",
            "3s",
            "--memory-limit",
            "300M",
        ],
        &[python(), "-c", JOB, "40", "hog"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{err}");
    let forked: u64 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the job's count: {stdout}"));
    assert!(
        err.contains("trainbpf: recording compacted to stay under --max-size 2 MiB"),
        "{err}"
    );
    let size = std::fs::metadata(&rec).unwrap().len();
    assert!(size <= 2 << 20, "the file is within its bound: {size}");
    assert!(
        !err.contains("stay at full resolution, not the --full-span"),
        "the budget holds the full-resolution span: {err}"
    );
    assert!(
        std::fs::read_dir(dir.0.clone())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains("compacting")),
        "no compaction file left behind"
    );

    let r = report_json(&rec);
    let rc = &r["recording"];
    assert!(
        rc["stopped_early"].is_null() && rc["skipped_ranges"] == 0,
        "{rc}"
    );
    let c = &rc["compaction"];
    assert!(u(&c["count"]) >= 1 && u(&c["samples_folded"]) > 1000, "{c}");
    assert_eq!(u(&c["max_size_bytes"]), 2 << 20);
    // Every worker is there, born and dead: lifecycle is never folded.
    let job_pid = u(&r["job"]["pid"]);
    let procs = r["processes"].as_array().unwrap();
    assert_eq!(
        procs.len() as u64,
        forked + 1,
        "every process of the job: {procs:#?}"
    );
    let deaths = r["deaths"].as_array().unwrap();
    assert_eq!(deaths.len() as u64, forked + 1, "every death");
    // The kill at 12 s, long folded history by the end, is whole: the
    // victim is the hog and the growth before it is its own.
    let ks = kills(&r);
    assert_eq!(ks.len(), 1, "{ks:#?}");
    let hog = u(&ks[0]["victim"]["pid"]);
    assert_ne!(hog, job_pid);
    let top = &ks[0]["growers"][0];
    assert_eq!(u(&top["pid"]), hog, "{:#}", ks[0]["growers"]);
    assert!(u(&top["grew_kb"]) > 100 << 10, "{top}");

    // Recent history is at full resolution, older at a minute's: the main
    // process (churning throughout) has many samples in the last 3 s and
    // at most three per minute-bucket before where the last compaction
    // kept everything from, outside the kill's window. That point is read
    // from the recording, not guessed from the clock: when the file last
    // neared its bound depends on how fast this machine made records.
    let ev = events(&rec);
    let ts: Vec<u64> = ev
        .iter()
        .filter(|e| is_mem_of(e, job_pid))
        .map(|e| u(&e["ts_ns"]))
        .collect();
    let last = *ts.iter().max().unwrap();
    let kill_ts = ev
        .iter()
        .find(|e| e["event"]["oom"].is_object())
        .map(|e| u(&e["ts_ns"]))
        .expect("the kill's record");
    let full_from = ev
        .iter()
        .filter_map(|e| e["event"]["compacted"]["full_from_ns"].as_u64())
        .max()
        .expect("a compaction record");
    // The last compaction came well after the kill, so that folding
    // history newer than the kill's protected window is tested too.
    assert!(
        full_from > kill_ts + 3_000_000_000,
        "full resolution from {:.1} s after the kill",
        (full_from as f64 - kill_ts as f64) / 1e9
    );
    let recent = ts.iter().filter(|&&t| t + 3_000_000_000 > last).count();
    let protected = |t: u64| t <= kill_ts && kill_ts - t <= 300_000_000_000;
    let old = ts
        .iter()
        .filter(|&&t| t < full_from && !protected(t))
        .count();
    assert!(recent > 20, "full resolution at the end: {recent}");
    assert!(old <= 3 * 2, "folded before: {old} samples");
}

#[test]
fn a_recorder_killed_at_any_moment_leaves_a_readable_file() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("flightkill");
    let rec = dir.path("k.rec");
    let compacting = || {
        std::fs::read_dir(&dir.0)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("compacting"))
    };
    // When to kill: while a compaction writes its file (twice: at the first
    // one and a later one), just after one was swapped in, and at fixed
    // times (the file passes 0.9 MiB after about 6 s, and again every few).
    enum When {
        Compacting(u32),
        Swapped,
        At(u64),
    }
    let plan = [
        When::Compacting(1),
        When::Compacting(2),
        When::Swapped,
        When::At(9_000),
        When::At(11_700),
    ];
    let mut mid_compaction = 0;
    for (i, when) in plan.into_iter().enumerate() {
        let log = dir.path("k.log");
        let mut child = Command::new(bin())
            .args([
                "record",
                "--quiet",
                "--max-size",
                "1M",
                "--full-span",
                "2s",
                "-o",
            ])
            .arg(&rec)
            .args(["--", python(), "-c", JOB, "60", "nohog"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // To a file: the orphaned job would hold a pipe open.
            .stderr(std::fs::File::create(&log).unwrap())
            // Its own process group, which the job shares: the job is
            // ended with it below.
            .process_group(0)
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let mut seen = 0;
        let mut was_compacting = false;
        loop {
            assert!(
                t0.elapsed() < Duration::from_secs(50),
                "kill {i}: never came"
            );
            // From the start-up line on: the recorder has cleared what the
            // last kill left.
            let started = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("trainbpf: recording to");
            let now = started && compacting();
            let ready = match when {
                When::Compacting(n) => {
                    if now && !was_compacting {
                        seen += 1;
                    }
                    now && seen == n
                }
                When::Swapped => std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .contains("recording compacted"),
                When::At(ms) => t0.elapsed() >= Duration::from_millis(ms),
            };
            was_compacting = now;
            if ready {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: kill(2) on our own child, then on the process group we
        // made (the job, orphaned, would go on for a minute).
        unsafe {
            libc::kill(child.id() as i32, libc::SIGKILL);
            libc::kill(-(child.id() as i32), libc::SIGKILL);
        }
        child.wait().unwrap();
        let err = std::fs::read_to_string(&log).unwrap();
        let left = compacting();
        mid_compaction += left as u32;
        eprintln!(
            "--- kill {i} after {:?} (compaction file left: {left}):\n{err}",
            t0.elapsed()
        );
        let r = report_json(&rec);
        let rc = &r["recording"];
        assert!(
            rc["skipped_ranges"] == 0,
            "kill {i}: no damage in the middle: {rc}"
        );
        if let Some(stop) = rc["stopped_early"].as_object() {
            // A frame cut short by the kill, at the very end, is all that
            // may be missing.
            let len = std::fs::metadata(&rec).unwrap().len();
            assert!(
                len - stop["offset"].as_u64().unwrap() <= (64 << 10) + 12,
                "kill {i}: only the last frame: {rc}"
            );
        }
        assert!(r["job"].is_object(), "kill {i}: the job's start is there");
        assert!(u(&rc["events"]) > 100, "kill {i}: {rc}");
    }
    assert!(
        mid_compaction >= 1,
        "at least one kill came while a compaction was writing"
    );
    // The next recording to the same path clears what a killed compaction
    // left.
    let out = record(&rec, &["--quiet"], &["true"]);
    assert!(out.status.success());
    assert!(
        std::fs::read_dir(dir.0.clone())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains("compacting")),
        "stale compaction files removed"
    );
}
