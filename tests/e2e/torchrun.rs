//! The verdict in torchrun's own "Root Cause": a real torchrun (PyPI's
//! torch, on the CPU, installed by `cargo xtask test` under target/), two
//! ranks over gloo, rank 1 leaking until the job's memory cgroup kills it.
//! The recorder writes rank 1's torchelastic error file before the agent
//! reads it, so that the agent's Root Cause block carries the kill's line
//! instead of "Signal 9", in every run; a file the worker wrote itself is
//! left alone.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::support::*;

/// Runs of the kill: the agent polls its workers every 0.1 s, and the
/// file must be there at its poll every time.
const RUNS: usize = 20;

/// The job: both ranks join the group over gloo and reduce once; then
/// rank 1 leaks 16 MiB at a time in `load_batch` (line 12), while rank 0
/// works on (sleeps) until the agent stops it. With `RECORD=1`, rank 1's
/// main is under torchelastic's `@record` and fails with an exception of
/// its own (its handler writes the error file), while a thread it started
/// leaks on.
///
/// Rank 0 neither waits in a collective nor runs under `@record`: a rank
/// that fails on its own when rank 1 dies (a collective's "Connection
/// closed by peer") would race rank 1 for torchelastic's Root Cause,
/// whose timestamps are whole seconds, and `@record`'s handler writes its
/// file in place, so the agent's SIGTERM can leave it empty and the agent
/// fails to parse it. Both are torchelastic's, with or without trainbpf.
const TRAIN: &str = r#"import os, sys, threading, time
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(1))
hold = []

def load_batch():
    hold.append(torch.ones(4 << 20))

def leak():
    while True:
        load_batch()
        time.sleep(0.01)

def main():
    if rank == 0:
        while True:
            time.sleep(1)
    else:
        leak()

@record
def main_recorded():
    threading.Thread(target=leak).start()
    raise RuntimeError("bad batch 7")

if rank == 1 and os.environ.get("RECORD") == "1":
    main_recorded()
else:
    main()
"#;

fn torchrun() -> PathBuf {
    let p = std::env::var_os("TRAINBPF_TORCHRUN")
        .map(PathBuf::from)
        .expect(
            "TRAINBPF_TORCHRUN is not set: run the suite with `cargo xtask test`, which \
             installs torch under target/. This test does not skip.",
        );
    assert!(p.is_file(), "TRAINBPF_TORCHRUN: no file at {}", p.display());
    p
}

/// One recorded torchrun, run as `uid` 65534 (the job's user: its error
/// files are written as that user). Returns the combined output (the
/// agent's block and the recorder's lines, both on stderr) and the
/// recording's path.
fn run(dir: &TempDir, tag: &str, env: &[(&str, &str)]) -> (String, PathBuf) {
    let rec = dir.path(&format!("{tag}.rec"));
    let out = Command::new(bin())
        .args(["record", "--memory-limit", "2G", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(torchrun())
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(dir.path("train.py"))
        .envs(env.iter().copied())
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .output()
        .expect("running trainbpf record -- torchrun");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "torchrun fails: {text}");
    (text, rec)
}

/// The agent's "Root Cause" block: its lines up to the closing rule.
fn root_cause(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("Root Cause (first observed failure)"))
        .unwrap_or_else(|| {
            // The workers' own output ([rank0]: …) is long: the agent's part.
            let agent: Vec<&str> = lines
                .iter()
                .filter(|l| !l.starts_with("[rank"))
                .copied()
                .collect();
            let tail = agent[agent.len().saturating_sub(80)..].join("\n");
            panic!("no Root Cause block; the output's end:\n{tail}")
        });
    lines[at..]
        .iter()
        .take_while(|l| !l.starts_with("====="))
        .copied()
        .collect()
}

fn field<'a>(block: &[&'a str], name: &str) -> &'a str {
    let key = format!("  {name}");
    block
        .iter()
        .find_map(|l| {
            l.strip_prefix(&key)
                .and_then(|r| r.trim_start().strip_prefix(": "))
        })
        .unwrap_or_else(|| panic!("no {name} in {block:#?}"))
}

/// When the kill's file was written, and when the victim's exit record
/// came, after the kill, from the recording: the note's time, and the
/// exit's, against the kill's, ms. The agent reaps the victim after its
/// exit, at its next poll.
fn written_after_kill_ms(rec: &Path, victim: u64) -> (f64, f64, PathBuf) {
    let out = Command::new(bin())
        .args(["report", "--format", "events"])
        .arg(rec)
        .output()
        .expect("report --format events");
    let mut kill = None;
    let mut written = None;
    let mut exited = None;
    let mut path = None;
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let ts = v["ts_ns"].as_u64().unwrap();
        let e = &v["event"];
        if e["oom"]["victim"]["tgid"].as_u64() == Some(victim) {
            kill.get_or_insert(ts);
        }
        if e["exit"]["proc"]["tgid"].as_u64() == Some(victim) {
            exited = Some(ts);
        }
        if let Some(p) = e["note"].as_str().and_then(|n| {
            n.strip_prefix(&format!("pid {victim}: wrote torchelastic's error file "))
        }) {
            written = Some(ts);
            path = Some(PathBuf::from(p));
        }
    }
    let (k, w) = (kill.expect("the kill's record"), written.expect("the note"));
    let x = exited.expect("the victim's exit");
    (
        (w as f64 - k as f64) / 1e6,
        (x as f64 - k as f64) / 1e6,
        path.expect("the file's path"),
    )
}

/// Runs whose agent may read before the write lands. The file is written
/// about as soon as the victim's own exit (a median 0.6 ms after the
/// kill against 3.1 ms for the exit, on this project's two-CPU machine),
/// but nothing yet holds the agent until it is: a run whose agent reaps
/// the victim in that gap shows "Signal 9". It is counted and its timing
/// printed; more than this many fail the test. Holding the agent at the
/// kill would make it none (docs/usage.md).
const LATE_AT_MOST: usize = 1;

#[test]
fn torchruns_root_cause_names_the_oom_kill() {
    require_root();
    let _g = serial();
    let torchrun = torchrun();
    let dir = TempDir::new("torchrun");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(dir.path("train.py"), TRAIN).unwrap();
    let mut lags = Vec::new();
    let mut late = 0;
    for i in 0..RUNS {
        let (text, rec) = run(&dir, &format!("kill{i}"), &[]);
        let block = root_cause(&text);
        let shown = block.join("\n");
        let r = report_json(&rec);
        let k = kills(&r);
        // Rank 1's kill first; the kernel may kill rank 0 too, while rank
        // 1's memory is still being freed.
        let first = k[0]["verdict"].as_str().unwrap();
        let rank1 = u(&k[0]["victim"]["pid"]);
        assert!(
            first.starts_with(&format!(
                "rank 1 (pid {rank1}) was OOM-killed: its memory cgroup reached its 2 GiB limit; it added "
            )) && first.ends_with(", in load_batch (train.py:12)"),
            "run {i}: {first}"
        );
        // The file: written, whole, as the job's user, with rank 1's line,
        // whenever the agent read it.
        let (w_ms, x_ms, file) = written_after_kill_ms(&rec, rank1);
        let m = std::fs::metadata(&file).expect("the error file");
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(m.uid(), 65534, "{}", file.display());
        let own: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(own["message"]["message"], first, "run {i}: {own}");
        lags.push((w_ms, x_ms));
        let traceback = field(&block, "traceback");
        if traceback.starts_with("Signal 9 (SIGKILL) received by PID") {
            late += 1;
            eprintln!(
                "--- run {i}: the agent read before the write: written {w_ms:.1} ms after the \
                 kill, the victim's exit {x_ms:.1} ms after it\n{shown}"
            );
            continue;
        }
        // The Root Cause is a killed rank, and carries its kill's line,
        // which names rank 1 and the limit, instead of "Signal 9 (SIGKILL)
        // received". Two kills in one second tie in torchelastic's
        // timestamps: then the agent may take rank 0's, whose line names
        // rank 1's kill before it.
        let pid: u64 = field(&block, "exitcode")
            .strip_prefix("-9 (pid: ")
            .and_then(|r| r.split(')').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("run {i}: the Root Cause died of SIGKILL: {shown}"));
        let killed = k
            .iter()
            .find(|k| u(&k["victim"]["pid"]) == pid)
            .unwrap_or_else(|| panic!("run {i}: the Root Cause was OOM-killed: {shown}"));
        let verdict = killed["verdict"].as_str().unwrap();
        assert_eq!(
            traceback, verdict,
            "run {i}: the Root Cause carries the report's verdict\n{shown}"
        );
        assert!(
            verdict.contains(&format!("rank 1 (pid {rank1})"))
                && verdict.contains("its memory cgroup reached its 2 GiB limit"),
            "run {i}: {verdict}"
        );
        if k.len() > 1 {
            eprintln!("--- run {i}: {} kills; Root Cause: {verdict}", k.len());
        }
        // The same line on the recorder's stderr, at the kill.
        assert!(
            text.lines().any(|l| l == format!("trainbpf: {verdict}")),
            "run {i}: the recorder's stderr: {text}"
        );
        assert!(
            shown.contains(&format!(
                "(trainbpf) the full report: trainbpf report {}",
                rec.display()
            )),
            "{shown}"
        );
    }
    let before_exit = lags.iter().filter(|(w, x)| w <= x).count();
    let mut w: Vec<f64> = lags.iter().map(|l| l.0).collect();
    let mut x: Vec<f64> = lags.iter().map(|l| l.1).collect();
    w.sort_by(f64::total_cmp);
    x.sort_by(f64::total_cmp);
    eprintln!(
        "--- {} of {RUNS} Root Causes carried the verdict; after the kernel's kill record the \
         file was written in {:.1}–{:.1} ms (median {:.1}), the victim's exit record came in \
         {:.1}–{:.1} ms (median {:.1}); written first in {before_exit} of {RUNS}; torchrun {}",
        RUNS - late,
        w[0],
        w[RUNS - 1],
        w[RUNS / 2],
        x[0],
        x[RUNS - 1],
        x[RUNS / 2],
        torchrun.display()
    );
    assert!(
        late <= LATE_AT_MOST,
        "{late} of {RUNS} agents read before the write (at most {LATE_AT_MOST})"
    );
}

#[test]
fn a_workers_own_error_file_is_left_alone() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("torchrun-own");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(dir.path("train.py"), TRAIN).unwrap();
    let (text, rec) = run(&dir, "own", &[("RECORD", "1")]);
    let block = root_cause(&text);
    let shown = block.join("\n");
    assert_eq!(field(&block, "rank"), "1 (local_rank: 1)", "{shown}");
    // The worker's exception, from the file its handler wrote; its thread
    // leaked on until the kill, which found the file there.
    assert!(
        shown.contains("RuntimeError: bad batch 7")
            && !shown.contains("(trainbpf)")
            && !shown.contains("OOM-killed"),
        "the job's own message: {shown}"
    );
    let r = report_json(&rec);
    assert_eq!(
        kills(&r).len(),
        1,
        "the leaking thread's process was killed"
    );
    let file = field(&block, "error_file");
    let own: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    assert!(
        own["message"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bad batch 7")),
        "{own}"
    );
    let notes = Command::new(bin())
        .args(["report", "--format", "events"])
        .arg(&rec)
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&notes.stdout);
    assert!(
        events.contains(&format!(
            "torchelastic's error file {file} was there already: left alone"
        )),
        "the recorder said it left the file alone"
    );
}
