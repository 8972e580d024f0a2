//! Diagnoses of real OOM kills in a memory cgroup: the rules
//! about workers, the victim and the limit, each read from `report
//! --json`'s `diagnoses[]` for the job's own kill.
//!
//! - `dataloader_cow`: a Python parent holds a list of 500,000 small
//!   objects and forks three workers that only read it; reading writes
//!   each object's reference count, so each worker copies the parent's
//!   pages until the cgroup's limit is reached. Under `--stacks`, the
//!   evidence names the function that read them.
//! - `too_many_workers`: a parent forks up to six workers, one at a time,
//!   each allocating 70 MiB of its own under a 256 MiB limit: three fit.
//! - `victim_not_grower`: a launcher gives an idle 40 MiB child
//!   `oom_score_adj` 1000, then starts a child that grows: the kernel
//!   kills the idle one.
//! - `container_limit`: every one of them, with the limit and the peak.

use crate::support::*;
use serde_json::Value;
use trainbpf_report::units::human_kb;

const LIMIT: &str = "256M";
const LIMIT_KB: u64 = 256 << 10;

/// The kill of the job's own process and its index in `kills[]` (kills
/// of other tests' cgroups may be in the recording too).
fn job_kill_index(r: &Value) -> (usize, &Value) {
    kills(r)
        .iter()
        .enumerate()
        .find(|(_, k)| k["victim"]["in_job"] == true)
        .unwrap_or_else(|| panic!("no kill of a job process: {}", r["kills"]))
}

/// The diagnoses of kill `idx`, in the report's order (most likely
/// first).
fn diagnoses_of(r: &Value, idx: usize) -> Vec<&Value> {
    r["diagnoses"]
        .as_array()
        .expect("diagnoses[]")
        .iter()
        .filter(|d| d["kill"].as_u64() == Some(idx as u64))
        .collect()
}

fn find<'a>(ds: &[&'a Value], id: &str) -> Option<&'a Value> {
    ds.iter().copied().find(|d| d["id"] == id)
}

fn show(ds: &[&Value]) -> String {
    serde_json::to_string_pretty(ds).unwrap()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// Runs `script` with `args` under the limit, and returns the report and
/// the job's stdout.
fn run(dir: &TempDir, name: &str, script: &str, extra: &[&str], args: &[&str]) -> (Value, String) {
    let path = dir.path(&format!("{name}.py"));
    std::fs::write(&path, script).unwrap();
    let rec = dir.path(&format!("{name}.rec"));
    let mut cmd = vec![python(), path.to_str().unwrap()];
    cmd.extend_from_slice(args);
    let mut opts = vec!["-q", "--memory-limit", LIMIT];
    opts.extend_from_slice(extra);
    let out = record(&rec, &opts, &cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("--- job stdout:\n{stdout}");
    (report_json(&rec), stdout)
}

/// `container_limit` on the job's kill: trainbpf's own cgroup, with the
/// limit and the kernel's usage at the kill in its evidence.
fn assert_container_limit(ds: &[&Value], kill: &Value) {
    let d =
        find(ds, "container_limit").unwrap_or_else(|| panic!("no container_limit: {}", show(ds)));
    eprintln!("container_limit title: {}", d["title"]);
    let title = d["title"].as_str().unwrap();
    assert!(
        title.starts_with("The job hit its memory cgroup's 256 MiB limit (set by trainbpf)"),
        "{title}"
    );
    let usage = kill["memcg_usage_kb"]
        .as_u64()
        .expect("the kernel's usage line");
    assert!(usage * 10 >= LIMIT_KB * 9, "usage {usage} kB at the kill");
    let ev = strings(&d["evidence"]);
    let want = format!("limit 256 MiB; peak usage {} at the kill", human_kb(usage));
    assert!(
        ev.iter().any(|e| e.starts_with(&want)),
        "no {want:?} in {ev:#?}"
    );
    assert!(
        ev.iter().any(|e| e.contains("trainbpf's own cgroup")),
        "{ev:#?}"
    );
    assert!(
        strings(&d["fix"])[0].contains("--memory-limit"),
        "{}",
        d["fix"]
    );
}

const COW: &str = r#"import os, sys, time

ROWS = int(sys.argv[1])
DATA = [[i, "row-%d" % i] for i in range(ROWS)]
# A trainer sets up before its DataLoader forks; the recorder locates the
# interpreter meanwhile, so that the workers' stacks have Python frames.
time.sleep(1)


def read_batches():
    total = 0
    for row in DATA:  # @read
        total += row[0] + len(row[1])
    return total


def worker():
    for _ in range(3):
        read_batches()
    time.sleep(1)
    os._exit(0)


pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        worker()
    pids.append(pid)
print("parent", os.getpid(), "workers", *pids, flush=True)
for pid in pids:
    os.waitpid(pid, 0)
"#;

fn cow_read_line() -> usize {
    COW.lines()
        .position(|l| l.ends_with("# @read"))
        .expect("a # @read line")
        + 1
}

#[test]
fn dataloader_workers_copying_a_python_list_are_diagnosed() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diagcow");
    let (r, stdout) = run(&dir, "cow", COW, &[], &["500000"]);
    let (idx, kill) = job_kill_index(&r);
    let ds = diagnoses_of(&r, idx);
    eprintln!("diagnoses: {}", show(&ds));
    let d =
        find(&ds, "dataloader_cow").unwrap_or_else(|| panic!("no dataloader_cow: {}", show(&ds)));
    eprintln!("dataloader_cow title: {}", d["title"]);
    assert_eq!(ds[0]["id"], "dataloader_cow", "not the most likely");
    assert_eq!(d["confidence"], "high");
    let title = d["title"].as_str().unwrap();
    assert!(
        title.starts_with("DataLoader workers copied the parent's dataset: 3 workers added "),
        "{title}"
    );
    // Stacks are on by default: the verdict ends with the line the
    // workers copied at.
    let at = format!("in read_batches (cow.py:{})", cow_read_line());
    assert!(
        title.ends_with(&format!("of the 256 MiB limit), {at}")),
        "{title}"
    );
    // The workers are the ones the job forked.
    let line = stdout
        .lines()
        .find(|l| l.starts_with("parent "))
        .expect("the job printed its pids");
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut want: Vec<u64> = words[3..].iter().map(|w| w.parse().unwrap()).collect();
    want.sort_unstable();
    let mut got: Vec<u64> = d["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(got, want);
    let ev = strings(&d["evidence"]);
    assert!(ev[0].contains(&format!("(pid {})", words[1])), "{ev:#?}");
    assert!(ev.iter().any(|e| e.contains("copy-on-write")), "{ev:#?}");
    // Where the workers copied: reading the rows.
    assert!(ev.iter().any(|e| e.contains(&at)), "no {at:?} in {ev:#?}");
    let fix = strings(&d["fix"]);
    assert!(fix[0].contains("numpy"), "{fix:#?}");
    assert!(
        fix.iter().any(|f| f.contains("persistent_workers")),
        "{fix:#?}"
    );
    assert_container_limit(&ds, kill);
}

const WORKERS: &str = r#"import os, sys, time

MIB = int(sys.argv[1])
parent = os.getpid()
pids = []
for i in range(int(sys.argv[2])):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        mine = b"\x01" * (MIB << 20)
        os.write(w, b"k")
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(0)
    os.close(w)
    pids.append(pid)
    ok = os.read(r, 1)
    os.close(r)
    print("worker", i, pid, "ready" if ok else "died", flush=True)
    # Stop at the first kill: the workers that fit are known by then.
    if not ok or os.waitpid(-1, os.WNOHANG)[0] != 0:
        break
print("parent", parent, "workers", *pids, flush=True)
"#;

#[test]
fn too_many_private_workers_are_diagnosed_with_the_count_that_fits() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diagworkers");
    let (r, _) = run(&dir, "workers", WORKERS, &[], &["70", "6"]);
    let (idx, kill) = job_kill_index(&r);
    let ds = diagnoses_of(&r, idx);
    eprintln!("diagnoses: {}", show(&ds));
    let d = find(&ds, "too_many_workers")
        .unwrap_or_else(|| panic!("no too_many_workers: {}", show(&ds)));
    eprintln!("too_many_workers title: {}", d["title"]);
    assert_eq!(d["confidence"], "high");
    assert_eq!(ds[0]["id"], "too_many_workers", "not the most likely");
    let title = d["title"].as_str().unwrap();
    // Three full workers and the fourth, still allocating, at the kill.
    let per: f64 = title
        .strip_prefix("Too many workers for the memory: 4 workers of about ")
        .and_then(|t| t.split(" MiB each").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{title}"));
    assert!((65.0..=75.0).contains(&per), "{title}");
    // 256 MiB less a ~10 MiB parent holds three of 70 MiB, not four.
    let fix = strings(&d["fix"]);
    assert!(
        fix[0].starts_with("Use 3 workers (num_workers=3)"),
        "{fix:#?}"
    );
    // Their memory is their own, not copies of the parent's.
    assert!(find(&ds, "dataloader_cow").is_none(), "{}", show(&ds));
    assert_container_limit(&ds, kill);
}

const LAUNCHER: &str = r#"import ctypes, os, signal, sys, time

libc = ctypes.CDLL(None)
parent = os.getpid()


def name(n):
    libc.prctl(15, n, 0, 0, 0)  # PR_SET_NAME


def wait_parent():
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(0)


r, w = os.pipe()
idle = os.fork()
if idle == 0:
    name(b"big_idle")
    held = b"\x01" * (40 << 20)
    os.write(w, b"k")
    wait_parent()
os.read(r, 1)
# The launcher marks the idle process as the one to lose.
with open("/proc/%d/oom_score_adj" % idle, "w") as f:
    f.write("1000")
grower = os.fork()
if grower == 0:
    name(b"grower")
    chunks = []
    for _ in range(55):
        chunks.append(b"\x02" * (4 << 20))
        time.sleep(0.01)
    wait_parent()
print("launcher", parent, "idle", idle, "grower", grower, flush=True)
_, status = os.waitpid(idle, 0)
print("idle ended", status, flush=True)
os.kill(grower, signal.SIGKILL)
os.waitpid(grower, 0)
"#;

#[test]
fn a_launchers_oom_score_adj_victim_is_not_the_grower() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diagvictim");
    let (r, stdout) = run(&dir, "launcher", LAUNCHER, &[], &[]);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("launcher "))
        .expect("the job printed its pids");
    let w: Vec<&str> = line.split_whitespace().collect();
    let (launcher, idle, grower) = (w[1], w[3], w[5]);
    let (idx, kill) = job_kill_index(&r);
    assert_eq!(
        kill["victim"]["pid"].to_string(),
        idle,
        "the kernel killed another"
    );
    let ds = diagnoses_of(&r, idx);
    eprintln!("diagnoses: {}", show(&ds));
    let d = find(&ds, "victim_not_grower")
        .unwrap_or_else(|| panic!("no victim_not_grower: {}", show(&ds)));
    eprintln!("victim_not_grower title: {}", d["title"]);
    let title = d["title"].as_str().unwrap();
    assert!(
        title.starts_with(&format!(
            "The kernel killed big_idle (pid {idle}), chosen for its oom_score_adj 1000, but grower (pid {grower}) grew"
        )),
        "{title}"
    );
    let ev = strings(&d["evidence"]);
    assert!(
        ev.contains(
            &format!("the victim's oom_score_adj 1000: set by python3 (pid {launcher})").as_str()
        ),
        "{ev:#?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.contains("pages from oom_score_adj 1000")),
        "{ev:#?}"
    );
    assert!(
        strings(&d["fix"])[1].contains(&format!(
            "on big_idle (pid {idle}) (set by python3 (pid {launcher}))"
        )),
        "{}",
        d["fix"]
    );
    assert_container_limit(&ds, kill);
}
