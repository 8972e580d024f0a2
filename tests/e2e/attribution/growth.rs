//! Honest attribution with real processes: forked workers, copy-on-write
//! (with and without reclaim in the writers' own context), threads started
//! on a dead process's kernel stack, and shared memory, checked against the
//! memory cgroup's own count.

use std::path::Path;

use crate::support::*;
use serde_json::Value;

const MIB_KB: i64 = 1024;
const GIB_KB: i64 = 1 << 20;

/// A parent touches 1 GiB, then forks four children that either read or
/// write every page, and waits for them.
const COW: &str = r#"
import mmap, os, sys, time
N = 1 << 30
buf = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, N, 4096):
    buf[i] = 1
kids = []
for k in range(4):
    pid = os.fork()
    if pid == 0:
        s = 0
        for i in range(0, N, 4096):
            if sys.argv[1] == "write":
                buf[i] = 2
            else:
                s += buf[i]
        time.sleep(7)
        os._exit(0)
    kids.append(pid)
for p in kids:
    os.waitpid(p, 0)
"#;

fn children(r: &Value) -> Vec<&Value> {
    children_of(r, u(&r["job"]["pid"]))
}

#[test]
fn children_that_only_read_are_attributed_nothing() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("cowread");
    let rec = dir.path("r.rec");
    let out = record(
        &rec,
        &["--memory-limit", "3G"],
        &[python(), "-c", COW, "read"],
    );
    assert!(out.status.success());
    let r = report_json(&rec);
    let kids = children(&r);
    assert_eq!(kids.len(), 4, "{:#}", r["processes"]);
    for k in kids {
        // Their RSS is the parent's gigabyte; what they added is nothing.
        assert!(
            honest(k) < 16 * 1024,
            "a reader added {} kB: {k}",
            honest(k)
        );
        assert!(
            u(&k["peak_rss_kb"]) > 900 * 1024,
            "RSS still shows the inherited pages: {k}"
        );
    }
}

#[test]
fn children_that_write_each_add_their_copy_and_the_cgroup_agrees() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("cowwrite");
    let rec = dir.path("w.rec");
    let out = record(
        &rec,
        &["--memory-limit", "8G"],
        &[python(), "-c", COW, "write"],
    );
    assert!(out.status.success());
    let r = report_json(&rec);
    assert_eq!(u(&r["lost_events"]), 0, "nothing lost: {:#}", r["lost"]);
    let kids = children(&r);
    assert_eq!(kids.len(), 4);
    for k in &kids {
        eprintln!("FIGURES writer: {}", line(k));
    }
    for k in &kids {
        let h = honest(k);
        assert!(
            (h - GIB_KB).abs() < GIB_KB / 10,
            "a writer added {h} kB, not about 1 GiB: {k}"
        );
    }
    // The sum check: at the cgroup's peak (5 GiB: the parent's and four
    // copies), the processes' honest growth adds up to its usage.
    let s = &r["attribution_at_peak"];
    eprintln!("FIGURES sum check: {s}");
    let ratio = s["ratio"]
        .as_f64()
        .unwrap_or_else(|| panic!("no sum check: {r:#}"));
    assert!(
        (0.9..=1.1).contains(&ratio),
        "attributed {} of {} kB: {s:#}",
        s["attributed_kb"],
        s["cgroup_delta_kb"]
    );
    assert!(s["cgroup_delta_kb"].as_i64().unwrap() > 4 * GIB_KB, "{s:#}");
    assert_sum_check_without_page_cache(s, 4 * GIB_KB);
}

/// The sum check with the page cache set apart: the job's honest growth is
/// within 10% of what the cgroup's usage grew besides page cache (at least
/// `min_kb` of it), and the cache's parts add up.
fn assert_sum_check_without_page_cache(s: &Value, min_kb: i64) {
    let w = &s["without_page_cache"];
    let c = &s["page_cache"];
    let kb = |v: &Value| v.as_i64().unwrap_or_else(|| panic!("not a number: {s:#}"));
    assert_eq!(
        kb(&w["cgroup_delta_kb"]),
        kb(&s["cgroup_delta_kb"]) - kb(&c["delta_kb"]),
        "{s:#}"
    );
    assert_eq!(
        kb(&c["delta_kb"]),
        kb(&c["job_kb"]) + kb(&c["other_kb"]),
        "{s:#}"
    );
    assert!(kb(&w["cgroup_delta_kb"]) > min_kb, "{s:#}");
    let ratio = w["ratio"].as_f64().unwrap_or_else(|| panic!("{s:#}"));
    assert!(
        (0.9..=1.1).contains(&ratio),
        "attributed {} of the {} kB the cgroup grew besides page cache: {s:#}",
        s["attributed_kb"],
        w["cgroup_delta_kb"]
    );
}

/// One 512 MiB /dev/shm object, created by one process and mapped by four.
const SHM: &str = r#"
import mmap, os, time
N = 512 << 20
path = "/dev/shm/trainbpf-test-%d" % os.getpid()
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, N)
m = mmap.mmap(fd, N)
for i in range(0, N, 4096):
    m[i] = 1
kids = []
for k in range(3):
    pid = os.fork()
    if pid == 0:
        s = 0
        for i in range(0, N, 4096):
            s += m[i]
        time.sleep(7)
        os._exit(0)
    kids.append(pid)
time.sleep(7)
for p in kids:
    os.waitpid(p, 0)
os.unlink(path)
"#;

#[test]
fn shared_memory_is_counted_once() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("shm");
    let rec = dir.path("s.rec");
    let out = record(&rec, &["--memory-limit", "2G"], &[python(), "-c", SHM]);
    assert!(out.status.success());
    let r = report_json(&rec);
    let root = u(&r["job"]["pid"]);
    let objs = r["shared_memory"].as_array().expect("shared_memory");
    let ours: Vec<_> = objs
        .iter()
        .filter(|o| o["name"].as_str().unwrap().contains("trainbpf-test-"))
        .collect();
    assert_eq!(ours.len(), 1, "one object, listed once: {objs:#?}");
    let o = ours[0];
    assert_eq!(o["kind"], "posix");
    assert!(u(&o["resident_kb"]) >= 500 * 1024, "{o}");
    assert_eq!(u(&o["mappers"]), 4, "{o}");
    assert_eq!(u(&o["owner_pid"]), root, "{o}");
    // Its pages were allocated once, by the creator; the readers added
    // nothing, however much shmem their RSS shows. (The creator's figure at
    // its exit is not its peak: its interpreter unmapped the object on the
    // way out, and what it added is capped at what it maps.)
    let procs = r["processes"].as_array().unwrap();
    let creator = procs.iter().find(|p| u(&p["pid"]) == root).unwrap();
    assert!(honest_peak(creator) > 500 * 1024, "{creator}");
    let added_by_readers: i64 = procs
        .iter()
        .filter(|p| u(&p["pid"]) != root)
        .map(honest)
        .sum();
    assert!(
        added_by_readers < 32 * 1024,
        "readers added {added_by_readers} kB"
    );
}

/// The main process is OOM-killed; its workers, orphaned, stay the job's
/// until they exit, and their exits are recorded.
const ORPHANS: &str = r#"
import os, time
for k in range(2):
    if os.fork() == 0:
        time.sleep(4)
        os._exit(0)
h = []
while True:
    h.append(bytearray(b"x") * (8 << 20))
"#;

#[test]
fn orphaned_workers_stay_in_the_job_until_they_exit() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("orphans");
    let rec = dir.path("o.rec");
    let out = record(
        &rec,
        &["--memory-limit", "200M"],
        &[python(), "-c", ORPHANS],
    );
    assert_eq!(
        out.status.code(),
        Some(137),
        "the main process's own status"
    );
    let r = report_json(&rec);
    let root = u(&r["job"]["pid"]);
    assert_eq!(u(&kills(&r)[0]["victim"]["pid"]), root);
    let kids = children(&r);
    assert_eq!(kids.len(), 2, "{:#}", r["processes"]);
    let root_died = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| u(&p["pid"]) == root)
        .unwrap()["died_s"]
        .as_f64()
        .unwrap();
    for k in kids {
        assert_eq!(
            k["exit"]["code"], 0,
            "the orphan's own exit was recorded: {k}"
        );
        assert!(
            k["died_s"].as_f64().unwrap() > root_died,
            "it outlived the main process: {k}"
        );
    }
}

/// The copy-on-write writers above, sized for reclaim: the
/// parent touches N bytes, then forks four children that each write every
/// page and hold their copy until all four hold theirs. The parent reads its
/// memory cgroup's own counters (argv[1]) before it touches, once it has
/// touched, and while the four copies are held, into argv[3] as JSON.
const COW_UNDER_RECLAIM: &str = r#"
import json, mmap, os, sys
cg, N, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def stat():
    d = {k: int(v) for k, v in (l.split() for l in open(cg + "/memory.stat"))}
    d["failcnt"] = int(open(cg + "/memory.failcnt").read())
    d["usage"] = int(open(cg + "/memory.usage_in_bytes").read())
    return d
before = stat()
buf = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, N, 4096):
    buf[i] = 1
touched = stat()
done_r, done_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for k in range(4):
    pid = os.fork()
    if pid == 0:
        os.close(done_r)
        os.close(go_w)
        for i in range(0, N, 4096):
            buf[i] = 2
        os.write(done_w, b"x")
        os.read(go_r, 1)
        os._exit(0)
    kids.append(pid)
os.close(done_w)
os.close(go_r)
n = 0
while n < 4:
    n += len(os.read(done_r, 4 - n))
held = stat()
with open(out, "w") as f:
    json.dump({"before": before, "touched": touched, "held": held}, f)
os.close(go_w)
for p in kids:
    os.waitpid(p, 0)
"#;

/// The job's shell: page cache first (`cat` of a file nobody has cached, so
/// that its pages are charged to the job's new cgroup), then the writers.
const COW_JOB: &str = r#"
cg=/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
cat "$1" > /dev/null || exit 3
exec "$2" -c "$3" "$cg" "$4" "$5"
"#;

/// Mapping per writer, the file read first, and the job's limit: the
/// parent's N fits beside the file's cache (1.4 GiB of 1.6 GB), the four
/// copies (5 N of anonymous memory in all) do not, so the kernel reclaims
/// about 850 MiB of the cgroup's page cache in the writers' own context;
/// the cache is clean and there is no swap, so reclaim always frees enough
/// and nothing is OOM-killed (about 250 MiB is left for the cache at the
/// peak).
const COW_N: usize = 256 << 20;
const COW_FILE: usize = 1152 << 20;
const COW_LIMIT: &str = "1600M";
const COW_RUNS: usize = 10;

/// One run of the writers under reclaim, N bytes each, after `data` was
/// read into the job's new cgroup: its report, the hits of the cgroup's
/// limit while the children wrote, and what its cache lost meanwhile, kB.
/// Checks that the job was not OOM-killed and that the cache was charged
/// to it.
fn reclaim_run(dir: &TempDir, data: &Path, n: usize, limit: &str, run: usize) -> (Value, u64, i64) {
    // Each run's cgroup is new: the file must be read in again, by it.
    evict(data);
    let rec = dir.path(&format!("c{run}.rec"));
    let stats = dir.path(&format!("c{run}.json"));
    let out = record(
        &rec,
        &["-q", "--memory-limit", limit],
        &[
            "/bin/sh",
            "-c",
            COW_JOB,
            "sh",
            data.to_str().unwrap(),
            python(),
            COW_UNDER_RECLAIM,
            &n.to_string(),
            stats.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "run {run}: the job failed");
    let s: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let r = report_json(&rec);
    let _ = std::fs::remove_file(&rec);
    let (before, touched, held) = (&s["before"], &s["touched"], &s["held"]);
    let failcnt = u(&held["failcnt"]) - u(&touched["failcnt"]);
    let reclaimed_kb = cache_kb(touched) - cache_kb(held);
    eprintln!(
        "FIGURES reclaim run {run}: cgroup cache {} kB before, {} after the parent touched, {} with the copies held; failcnt +{failcnt} while the children wrote; lost_events {}; attribution_at_peak {}",
        cache_kb(before),
        cache_kb(touched),
        cache_kb(held),
        r["lost_events"],
        r["attribution_at_peak"]
    );
    eprintln!("FIGURES reclaim run {run} parent: {}", line(root_proc(&r)));
    for w in writers(&r) {
        eprintln!("FIGURES reclaim run {run} writer: {}", line(w));
    }
    // Kills elsewhere on the machine are recorded too: only the job's
    // own count.
    let own_kills = kills(&r)
        .iter()
        .filter(|k| k["victim"]["in_job"] == true)
        .count();
    assert_eq!(own_kills, 0, "run {run}: an OOM kill: {:#}", r["kills"]);
    // The cgroup's own counters: the job held the file's cache.
    let file_kb = std::fs::metadata(data).unwrap().len() as i64 / 1024;
    assert!(
        cache_kb(before) > file_kb / 2,
        "run {run}: the file's cache was not charged to the job: {before}"
    );
    assert_eq!(writers(&r).len(), 4, "run {run}: {:#}", r["processes"]);
    (r, failcnt, reclaimed_kb)
}

fn cache_kb(stat: &Value) -> i64 {
    u(&stat["cache"]) as i64 / 1024
}

/// The root's children that are the writers (not the shell's `cat`).
fn writers(r: &Value) -> Vec<&Value> {
    children(r)
        .into_iter()
        .filter(|p| p["comm"] == "python3")
        .collect()
}

/// Frees made by reclaim in a copy-on-write writer's context are
/// not its own; each writer is still attributed its copy, run after run.
#[test]
fn cow_writers_keep_their_figure_while_reclaim_runs_in_their_context() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("truthreclaim");
    let data = uncached_file(&dir, "data", COW_FILE);
    let n_kb = (COW_N / 1024) as i64;
    let ok = |kb: i64| (kb - n_kb).abs() < n_kb / 10;
    let mut bad = Vec::new();
    for run in 0..COW_RUNS {
        let (r, failcnt, reclaimed_kb) = reclaim_run(&dir, &data, COW_N, COW_LIMIT, run);
        // The children's charges hit the limit (v1 reclaims in the
        // charging task, the writer) and the cache shrank while they
        // wrote. (Global reclaim on a busy machine may take some of it
        // first.)
        assert!(
            failcnt > 0 && reclaimed_kb > 128 * MIB_KB,
            "run {run}: no direct reclaim while the children wrote (failcnt +{failcnt}, cache -{reclaimed_kb} kB)"
        );
        // The parent held its N all along (it frees it at exit, so its
        // last figure is not checked).
        let root = root_proc(&r);
        if !ok(honest_peak(root)) {
            bad.push(format!("run {run} parent: {}", line(root)));
        }
        for w in writers(&r) {
            if !ok(honest(w)) || !ok(honest_peak(w)) {
                bad.push(format!("run {run}: {}", line(w)));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "not attributed their {n_kb} kB ±10%:\n{}",
        bad.join("\n")
    );
}

/// The writers of 1 GiB each under reclaim, in a
/// 5.8 GB cgroup that holds 3 GiB of page cache before they write (the
/// job's `cat`): the parent's GiB fits beside the cache, the four copies
/// take about 2.4 GiB of it back. Each writer is credited its GiB, and the
/// sum check, page cache set apart, adds up (counted against the job, the
/// cache made it read 0.61 to 0.88).
#[test]
fn gib_writers_under_reclaim_keep_their_figure_and_the_cgroup_agrees() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("cowgibreclaim");
    let data = uncached_file(&dir, "data", 3 << 30);
    let (r, _, reclaimed_kb) = reclaim_run(&dir, &data, 1 << 30, "5800M", 0);
    // Reclaimed by the cgroup's limit in the writers' context, or on a
    // machine short of memory by the kernel's own reclaim first.
    assert!(
        reclaimed_kb > GIB_KB,
        "the cache was not reclaimed while the children wrote: -{reclaimed_kb} kB"
    );
    assert_eq!(u(&r["lost_events"]), 0, "nothing lost: {:#}", r["lost"]);
    for w in writers(&r) {
        for kb in [honest(w), honest_peak(w)] {
            assert!(
                (kb - GIB_KB).abs() < GIB_KB / 10,
                "a writer added {kb} kB, not about 1 GiB: {}",
                line(w)
            );
        }
    }
    // At the cgroup's peak the writers are partway: the parent's GiB and
    // theirs so far are at least the 2.8 GB the limit leaves beside the
    // cache; the cache, read in by the job's `cat` and then reclaimed,
    // stays out of it.
    assert_sum_check_without_page_cache(&r["attribution_at_peak"], 2 * GIB_KB);
}

/// Rounds of: a child runs on one CPU, moves to a second, touches memory
/// there and exits; its parent, on the second CPU, then starts a thread
/// that touches N and keeps it. The child's last pages (its exit's) are
/// the second CPU's last, and a CPU it left idle keeps its address space
/// a while, so the parent takes no page of its own before the thread
/// starts; the thread gets the child's kernel stack, the kernel's cache of
/// freed stacks being per CPU.
const THREAD_AFTER_EXIT: &str = r#"
import mmap, os, sys, threading, time
N, ROUNDS = 32 << 20, 12
cpus = sorted(os.sched_getaffinity(0))
if len(cpus) < 2:
    sys.exit("needs two CPUs")
here, there = cpus[1], cpus[0]
os.sched_setaffinity(0, {here})
held = []
def touch():
    m = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(0, N, 4096):
        m[i] = 1
    held.append(m)
# The C library keeps a finished thread's stack for the next: warmed, a
# new thread costs its parent no page.
for _ in range(2):
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
for r in range(ROUNDS):
    d = os.fork()
    if d == 0:
        os.sched_setaffinity(0, {there})
        m = mmap.mmap(-1, 4 << 20)
        for i in range(0, 4 << 20, 4096):
            m[i] = 1
        time.sleep(0.05)
        os.sched_setaffinity(0, {here})
        for i in range(0, 4 << 20, 4096):
            m[i] = 2
        os._exit(0)
    os.waitpid(d, 0)
    t = threading.Thread(target=touch)
    t.start()
    t.join()
    time.sleep(0.3)
"#;

// A new task on the kernel stack of a process that had
// just exited found the per-CPU page slot that process left, and its pages
// went uncounted.
#[test]
fn threads_started_as_a_child_exits_are_credited_their_pages() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("threadexit");
    let rec = dir.path("t.rec");
    let out = record(&rec, &["-q"], &[python(), "-c", THREAD_AFTER_EXIT]);
    assert!(out.status.success(), "the job failed");
    let r = report_json(&rec);
    assert_eq!(u(&r["lost_events"]), 0, "nothing lost: {:#}", r["lost"]);
    let root = root_proc(&r);
    eprintln!(
        "FIGURES threads after exits (12 x 32 MiB held): {}",
        line(root)
    );
    // 384 MiB held at the end, and the interpreter's few MiB; the last
    // record may lag the peak by a threshold (6 MiB here).
    let peak = honest_peak(root);
    assert!(
        (384 * MIB_KB - 16 * MIB_KB..384 * MIB_KB + 32 * MIB_KB).contains(&peak),
        "the threads' 384 MiB are not credited: {}",
        line(root)
    );
}
