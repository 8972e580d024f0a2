//! Leak detection on real jobs in a memory cgroup: a training loop's
//! sawtooth of respawned workers and a flat plateau are no leak; the same
//! job with a slow leak in its main process is one, and the time to the
//! kill projected well before it comes within 20% of the real one.

use std::process::Command;

use crate::support::*;
use serde_json::Value;

/// A training loop in miniature. The main process holds a 100 MiB plateau
/// and starts a DataLoader-like worker every 2 s (exec'd, renamed
/// `pt_data_worker`), which grows to 16 MiB over 1.6 s and exits: a
/// sawtooth. `argv[1]` MiB/s are leaked by the main process on top;
/// `argv[2]` seconds is how long it runs (0: until killed).
const JOB: &str = r#"
import subprocess, sys, time
WORKER = '''
import ctypes, time
ctypes.CDLL(None).prctl(15, b"pt_data_worker", 0, 0, 0)
buf = []
for _ in range(8):
    buf.append(bytearray(b"w") * (2 << 20))
    time.sleep(0.2)
'''
leak_mib_s = float(sys.argv[1])
duration = float(sys.argv[2])
plateau = bytearray(b"p") * (100 << 20)
held = []
start = time.time()
next_worker = start + 1.0
workers = []
while duration <= 0 or time.time() - start < duration:
    if time.time() >= next_worker:
        workers.append(subprocess.Popen([sys.executable, "-c", WORKER]))
        next_worker += 2.0
    workers = [w for w in workers if w.poll() is None]
    if leak_mib_s > 0:
        held.append(bytearray(b"l") * int(leak_mib_s * 0.25 * (1 << 20)))
    time.sleep(0.25)
for w in workers:
    w.wait()
"#;

/// Long enough to span several teeth of the sawtooth, short enough for a
/// test.
const SPAN: &str = "8s";
const LIMIT: &str = "400M";
const LEAK_MIB_S: f64 = 8.0;

fn report_text(rec: &std::path::Path, extra: &[&str]) -> String {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .arg("--no-color")
        .args(extra)
        .output()
        .expect("running trainbpf report");
    assert!(
        out.status.success(),
        "report failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn leaks(r: &Value) -> &Vec<Value> {
    r["leaks"].as_array().expect("leaks array")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn sawtooth_of_respawned_workers_and_a_plateau_are_no_leak() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("leaks-flat");
    let rec = dir.path("flat.rec");
    let out = record(
        &rec,
        &["--memory-limit", LIMIT],
        &[python(), "-c", JOB, "0", "24"],
    );
    assert_eq!(out.status.code(), Some(0), "the job runs to its end");

    let r = report_json_args(&rec, &["--leak-span", SPAN]);
    assert_eq!(leaks(&r).len(), 0, "no leak: {:#}", r["leaks"]);
    let p = &r["leak_projection"];
    assert_eq!(p["domain"], "cgroup", "{p}");
    assert_eq!(u(&p["limit_kb"]), 400 * 1024);
    assert!(p["seconds"].is_null(), "nothing to project: {p}");

    // The workers were seen, and judged as one series.
    let t = report_text(&rec, &["--only=leaks", "--leak-span", SPAN]);
    eprintln!("{t}");
    assert!(t.contains("No leak suspected"), "{t}");
    let workers = t
        .lines()
        .find(|l| l.contains("DataLoader workers ×"))
        .unwrap_or_else(|| panic!("the workers form a group: {t}"));
    assert!(!workers.contains("leak suspected"), "{workers}");
    assert!(
        !report_text(&rec, &["--leak-span", SPAN]).contains("Leak suspected"),
        "the full report says nothing of leaks"
    );
}

#[test]
fn slow_leak_in_the_main_process_is_flagged_and_its_kill_projected() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("leaks-slow");
    let rec = dir.path("leak.rec");
    let out = record(
        &rec,
        &["--memory-limit", LIMIT],
        &[python(), "-c", JOB, &LEAK_MIB_S.to_string(), "0"],
    );
    assert_eq!(
        out.status.code(),
        Some(137),
        "the leak runs into the limit and the kernel kills the job"
    );

    let r = report_json_args(&rec, &["--leak-span", SPAN]);
    let root = u(&r["job"]["pid"]);
    // Other tests' kills on the machine are listed too: the job's own.
    let kill = kills(&r)
        .iter()
        .find(|k| k["victim"]["in_job"] == true)
        .unwrap_or_else(|| panic!("the job's kill: {:#}", r["kills"]));
    let kill_s = f(&kill["time_s"]);
    let l = leaks(&r);
    let main = l
        .iter()
        .find(|x| x["pid"].as_u64() == Some(root))
        .unwrap_or_else(|| panic!("the main process leaks: {l:#?}"));
    let slope = f(&main["slope_kb_per_s"]);
    let leak_kb_s = LEAK_MIB_S * 1024.0;
    assert!(
        (slope - leak_kb_s).abs() < 0.15 * leak_kb_s,
        "slope {slope} kB/s for a {leak_kb_s} kB/s leak"
    );
    assert!(f(&main["fit"]) >= 0.8, "{main}");
    assert!(f(&main["since"]) < 5.0, "it leaks from the start: {main}");
    assert!(
        l.iter().all(|x| x["group"] != "DataLoader workers"),
        "the workers' sawtooth is no leak: {l:#?}"
    );
    // It was killed: nothing is leaking at the end any more.
    assert!(main["projected_oom_s"].is_null(), "{main}");

    // The report as it would have read 60% of the way to the kill.
    let until = 0.6 * kill_s;
    let early = report_json_args(
        &rec,
        &["--leak-span", SPAN, "--until", &format!("{until:.3}s")],
    );
    assert!(kills(&early).iter().all(|k| k["victim"]["in_job"] != true));
    let seen_s = f(&early["recording"]["duration_s"]);
    let l = leaks(&early);
    let main = l
        .iter()
        .find(|x| x["pid"].as_u64() == Some(root))
        .unwrap_or_else(|| panic!("the leak is seen {until:.1} s in: {l:#?}"));
    assert_eq!(main["alive"], true);
    assert_eq!(u(&main["limit_kb"]), 400 * 1024);
    let projected = f(&main["projected_oom_s"]);
    let real = kill_s - seen_s;
    eprintln!(
        "at {seen_s:.1} s: kill projected in {projected:.1} s, came in {real:.1} s ({:+.0}%)",
        100.0 * (projected - real) / real
    );
    assert!(
        (projected - real).abs() <= 0.2 * real,
        "projected {projected:.1} s, the kill came {real:.1} s after {seen_s:.1} s: {:#}",
        early["leak_projection"]
    );

    let t = report_text(
        &rec,
        &["--leak-span", SPAN, "--until", &format!("{until:.3}s")],
    );
    assert!(t.contains("Leak suspected"), "{t}");
    assert!(
        t.contains(&format!("python3 (pid {root}): honest memory +")),
        "{t}"
    );
    assert!(t.contains("reach the job cgroup's limit (400 MiB"), "{t}");
}
