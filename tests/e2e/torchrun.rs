//! The verdict in torchrun's own "Root Cause": a real torchrun (PyPI's
//! torch, on the CPU, installed by `cargo xtask test` under target/), two
//! ranks over gloo, rank 1 leaking until the job's memory cgroup kills it.
//! The recorder writes rank 1's torchelastic error file before the agent
//! reads it, so that the agent's Root Cause block carries the kill's line
//! instead of "Signal 9", in every run; a file the worker wrote itself is
//! left alone. An agent that would read first (one that polls without
//! pause, the write held back) is held at its wait until the file is in.

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
        # The kernel may kill again while rank 1's memory is still being
        # freed, and takes the largest: rank 0, with this, not the agent,
        # which is otherwise within a page of rank 0's size. Without its
        # agent, rank 0 ends on its own.
        ballast = torch.ones(16 << 20)
        agent = os.getppid()
        while os.getppid() == agent:
            time.sleep(0.1)
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
    let mut kill = None;
    let mut written = None;
    let mut exited = None;
    let mut path = None;
    for v in events(rec) {
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

#[test]
fn torchruns_root_cause_names_the_oom_kill() {
    require_root();
    let _g = serial();
    let torchrun = torchrun();
    let dir = TempDir::new("torchrun");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(dir.path("train.py"), TRAIN).unwrap();
    let mut lags = Vec::new();
    let mut held = 0;
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
        held += usize::from(agent_held(&rec).is_some());
        let traceback = field(&block, "traceback");
        assert!(
            !traceback.starts_with("Signal 9 (SIGKILL) received by PID"),
            "run {i}: the agent read before the write: written {w_ms:.1} ms after the kill, \
             the victim's exit {x_ms:.1} ms after it\n{shown}"
        );
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
        "--- {RUNS} of {RUNS} Root Causes carried the verdict; after the kernel's kill record \
         the file was written in {:.1}–{:.1} ms (median {:.1}), the victim's exit record came in \
         {:.1}–{:.1} ms (median {:.1}); written first in {before_exit} of {RUNS}; the agent was \
         held at its wait in {held}; torchrun {}",
        w[0],
        w[RUNS - 1],
        w[RUNS / 2],
        x[0],
        x[RUNS - 1],
        x[RUNS / 2],
        torchrun.display()
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
    let k = kills(&r);
    let said = |k: &Value, who: &str| k["verdict"].as_str().is_some_and(|v| v.starts_with(who));
    assert!(
        said(&k[0], "rank 1 (pid "),
        "the leaking thread's process was killed first: {k:#?}"
    );
    // The kernel may kill rank 0 too, while rank 1's memory is still being
    // freed (as in the Root Cause test); no one else.
    assert!(k[1..].iter().all(|k| said(k, "rank 0 (pid ")), "{k:#?}");
    let file = field(&block, "error_file");
    let own: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    assert!(
        own["message"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bad batch 7")),
        "{own}"
    );
    let left = format!("torchelastic's error file {file} was there already: left alone");
    assert!(
        notes(&rec).iter().any(|n| n.contains(&left)),
        "the recorder said it left the file alone"
    );
}

/// The recording's records, one JSON value each (`report --format
/// events`).
fn events(rec: &Path) -> Vec<Value> {
    let out = Command::new(bin())
        .args(["report", "--format", "events"])
        .arg(rec)
        .output()
        .expect("report --format events");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The recording's notes, one per line.
fn notes(rec: &Path) -> Vec<String> {
    events(rec)
        .iter()
        .filter_map(|v| v["event"]["note"].as_str().map(str::to_string))
        .collect()
}

/// The note of an agent's hold at its wait, if it was held.
fn agent_held(rec: &Path) -> Option<String> {
    notes(rec)
        .into_iter()
        .find(|n| n.contains(": held at its wait "))
}

/// An agent of its own: it starts one worker with an error file to fill,
/// as torchelastic does, and polls it (`Popen.poll`, a `waitpid` with
/// `WNOHANG`) without pause; the moment the poll reports the worker's
/// death it looks for the file, as torchelastic's `ProcessFailure` does.
/// The worker leaks once the recorder has made its file ready (the hidden
/// file beside it): a real worker spends seconds importing torch first,
/// and the recorder knows it, from its exec's environment, within tens of
/// milliseconds; a worker OOM-killed before that is not waited for.
const AGENT: &str = r#"import json, os, subprocess, sys
path = sys.argv[1]
env = dict(os.environ, TORCHELASTIC_ERROR_FILE=path)
work = """import os, sys, time
d = os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])
until = time.monotonic() + 30
while not any(n.startswith(".trainbpf-") for n in os.listdir(d)):
    if time.monotonic() > until:
        sys.exit("no file made ready in 30 s")
    time.sleep(0.001)
b = []
while True:
    b.append(b"x" * (8 << 20))
"""
w = subprocess.Popen([sys.executable, "-c", work], env=env)
polls = 0
while w.poll() is None:
    polls += 1
there = os.path.exists(path)
print(json.dumps({"rc": w.returncode, "there": there, "polls": polls,
                  "text": open(path).read() if there else None}))
"#;

/// With the write held back 300 ms (the test switch), an agent that polls
/// without pause would read long before the file is in; it is held at its
/// wait instead, and finds the file the moment it learns of the death.
#[test]
fn an_agent_that_would_read_first_is_held_until_the_file_is_in() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("agent-held");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(dir.path("agent.py"), AGENT).unwrap();
    // The job's user's own directory, as torchrun makes one per attempt.
    let errs = |i: usize| {
        let d = dir.path(&format!("errs{i}"));
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        d
    };
    for i in 0..3 {
        let rec = dir.path(&format!("a{i}.rec"));
        let file = errs(i).join("error.json");
        let out = Command::new(bin())
            .args(["record", "--memory-limit", "256M", "-o"])
            .arg(&rec)
            .args(["--", "/usr/bin/python3"])
            .arg(dir.path("agent.py"))
            .arg(&file)
            .env("TRAINBPF_TEST_ERROR_FILE_DELAY_MS", "300")
            .env("SUDO_UID", "65534")
            .env("SUDO_GID", "65534")
            .stdin(Stdio::null())
            .output()
            .expect("running trainbpf record");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run {i}: the agent ends well: {err}");
        let seen: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("run {i}: the agent's line ({e}): {err}"));
        assert_eq!(seen["rc"], -9, "run {i}: {seen}");
        assert_eq!(
            seen["there"], true,
            "run {i}: the file at the agent's read: {seen}"
        );
        let r = report_json(&rec);
        let verdict = kills(&r)[0]["verdict"].as_str().unwrap().to_string();
        let own: Value = serde_json::from_str(seen["text"].as_str().unwrap()).unwrap();
        assert_eq!(own["message"]["message"], verdict.as_str(), "run {i}");
        // Held for the write's delay, and continued by the recorder.
        let note =
            agent_held(&rec).unwrap_or_else(|| panic!("run {i}: no hold: {:#?}", notes(&rec)));
        let ms: f64 = note
            .split(": held at its wait ")
            .nth(1)
            .and_then(|r| r.split(" ms").next())
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("{note}"));
        assert!((250.0..3000.0).contains(&ms), "run {i}: {note}");
        assert!(note.ends_with("; continued"), "run {i}: {note}");
        // Attached when the worker came, as a BTF tracepoint on this kernel.
        assert!(
            notes(&rec).iter().any(|n| n.starts_with(
                "tp_btf:sched_process_wait: torchelastic's agent, waiting on a worker"
            )),
            "run {i}: {:#?}",
            notes(&rec)
        );
        eprintln!("--- run {i}: {} polls; {note}", seen["polls"]);
    }
    // The job's root carries the variable itself: its parent is the
    // recorder, outside the job, which is never held.
    let rec = dir.path("root.rec");
    let file = errs(3).join("root.json");
    let out = Command::new(bin())
        .args(["record", "--memory-limit", "256M", "-o"])
        .arg(&rec)
        .args(["--", "/usr/bin/python3", "-c"])
        .arg("b = []\nwhile True:\n    b.append(b'x' * (8 << 20))\n")
        .env("TORCHELASTIC_ERROR_FILE", &file)
        .env("TRAINBPF_TEST_ERROR_FILE_DELAY_MS", "300")
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .stdin(Stdio::null())
        .output()
        .expect("running trainbpf record");
    assert!(!out.status.success());
    assert!(file.is_file(), "the root's own file is written");
    assert_eq!(agent_held(&rec), None, "the recorder is not held");
    // No process of the job waits on one with a file: every wait on the
    // machine is left as it was.
    assert!(
        !notes(&rec).iter().any(|n| n.contains("sched_process_wait")),
        "{:#?}",
        notes(&rec)
    );
}
