//! "Ranks and identity": every job process carries its rank,
//! world size and run where its environment gives them, and its pod and
//! container where its cgroups do; the text names a rank's process by its
//! rank. torchrun itself is not installed here: a Python launcher stands in
//! for it, starting its workers the way torchrun's agent does (a fork and
//! an exec each, with `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and
//! `TORCHELASTIC_RUN_ID` in their environment).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;
use serde_json::Value;

/// torchrun's stand-in: rank 0 first (it says when it is up), then rank 1;
/// when rank 1 fails, rank 0 is stopped, as torchrun's agent does, and the
/// launcher fails.
const LAUNCHER: &str = r#"
import os, subprocess, sys
run_id, worker = sys.argv[1], sys.argv[2]
procs = []
for rank in (0, 1):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
               TORCHELASTIC_RUN_ID=run_id)
    p = subprocess.Popen([sys.executable, "-c", worker, str(rank)], env=env,
                         stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"up\n"
    procs.append(p)
rc = procs[1].wait()
procs[0].terminate()
procs[0].wait()
sys.exit(1 if rc else 0)
"#;

/// Rank 0 idles, with a thread named as gloo's (which is the name the
/// kernel reports for it); rank 1 leaks until the cgroup's limit kills it.
const WORKER: &str = r#"
import ctypes, sys, threading, time
rank = int(sys.argv[1])
if rank == 0:
    def runloop():
        # Spelt in two: the report shows the job's command line.
        ctypes.CDLL(None).prctl(15, b"pt_gloo_" + b"runloop", 0, 0, 0)
        keep = bytearray(b"x") * (4 << 20)
        while True:
            time.sleep(1)
    threading.Thread(target=runloop, daemon=True).start()
    # A helper that inherits its RANK: of rank 0, not a rank of its own.
    import subprocess
    subprocess.Popen(["sleep", "3"])
print("up", flush=True)
if rank == 0:
    while True:
        time.sleep(1)
hold = []
while True:
    hold.append(bytearray(b"x") * (8 << 20))
    time.sleep(0.02)
"#;

#[test]
fn a_two_rank_job_names_the_rank_that_was_killed() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("identity-ranks");
    let rec = dir.path("ranks.rec");
    let run_id = format!("identity-test-{}", std::process::id());
    let out = record(
        &rec,
        &["--memory-limit", "160M"],
        &[python(), "-c", LAUNCHER, &run_id, WORKER],
    );
    assert_eq!(out.status.code(), Some(1), "the launcher fails with rank 1");

    let r = report_json(&rec);
    let k = job_kill(&r);
    let v = &k["victim"];
    let victim = u(&v["pid"]);
    eprintln!("victim: {v}");
    assert_eq!(v["rank"], 1, "the victim is rank 1: {v}");
    assert_eq!(v["local_rank"], 1);
    assert_eq!(v["world_size"], 2);
    assert_eq!(v["run_id"], run_id.as_str());
    assert!(v["container"].is_null(), "no container here: {v}");

    // Each rank's process, and the launcher, which has none.
    // Rank 0's helper is of rank 0 (its RANK is inherited); the rest are
    // the ranks' own processes.
    let helper = procs(&r)
        .iter()
        .find(|p| p["comm"] == "sleep")
        .unwrap_or_else(|| panic!("rank 0's helper: {}", r["processes"]));
    assert_eq!(helper["rank"], 0, "{helper}");
    let ranked: Vec<&Value> = procs(&r)
        .iter()
        .filter(|p| !p["rank"].is_null() && p["comm"] != "sleep")
        .collect();
    for p in &ranked {
        eprintln!(
            "process {} {}: rank {} local_rank {} world_size {} run_id {}",
            p["pid"], p["comm"], p["rank"], p["local_rank"], p["world_size"], p["run_id"]
        );
    }
    let of_rank = |n: u64| {
        ranked
            .iter()
            .find(|p| p["rank"] == n)
            .unwrap_or_else(|| panic!("no process of rank {n}: {}", r["processes"]))
    };
    let (rank0, rank1) = (of_rank(0), of_rank(1));
    assert_eq!(u(&rank1["pid"]), victim);
    assert_eq!(rank1["oom_killed"], true);
    for p in [rank0, rank1] {
        assert_eq!(p["world_size"], 2, "{p}");
        assert_eq!(p["run_id"], run_id.as_str(), "{p}");
        assert_eq!(p["local_rank"], p["rank"], "{p}");
    }
    assert_eq!(ranked.len(), 2, "only the two workers have a rank");
    let launcher = root_proc(&r);
    assert!(
        launcher["rank"].is_null() && launcher["run_id"].is_null(),
        "the launcher has no rank: {launcher}"
    );

    // The growers carry theirs: rank 1 grew, and is the victim.
    let growers = k["growers"].as_array().expect("growers");
    let top = growers
        .iter()
        .find(|g| g["victim"] == true)
        .unwrap_or_else(|| panic!("the victim is not among the growers: {growers:#?}"));
    assert_eq!(
        (top["rank"].as_u64(), top["run_id"].as_str()),
        (Some(1), Some(run_id.as_str()))
    );
    for g in growers.iter().filter(|g| g["in_job"] == true) {
        let want = ranked
            .iter()
            .find(|p| p["pid"] == g["pid"])
            .map(|p| &p["rank"]);
        assert_eq!(Some(&g["rank"]), want.or(Some(&Value::Null)), "grower {g}");
    }

    // The text names it by its rank, in the kill's story and its deaths.
    let text = report_text(&rec);
    let name = format!("rank 1 (pid {victim})");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&name)).collect();
    for l in &lines {
        eprintln!("text: {}", l.trim());
    }
    // The story is wrapped: read it as one line.
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&format!("then killed {name}, anon-rss")),
        "the story names the victim by its rank: {text}"
    );
    assert!(
        flat.contains(&format!("{victim} rank 1 ")),
        "the growers' table names it rank 1: {text}"
    );
    assert!(
        lines.iter().any(|l| l.trim_start().starts_with("victim"))
            && lines
                .iter()
                .any(|l| l.contains(&format!("{name}: killed by the kernel's OOM killer"))),
        "the victim field and the deaths name it too: {text}"
    );
    // Everywhere a process is named, a rank is its rank: the job tree,
    // the ranking table, the charts, the stacks. Never the name of one of
    // its threads: rank 0's gloo thread outlives its main thread by a
    // moment when the launcher stops it.
    assert!(
        lines
            .iter()
            .any(|l| l.trim_start().starts_with("job tree") && l.ends_with(&format!("→ {name}"))),
        "the job tree ends at rank 1: {text}"
    );
    let rank0 = u(&rank0["pid"]);
    for pid in [victim, rank0] {
        let rank = if pid == victim { 1 } else { 0 };
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.split_whitespace().take(2).collect::<Vec<_>>() == [&pid.to_string(), "rank"]
            })
            .collect();
        assert!(
            !rows.is_empty()
                && rows
                    .iter()
                    .all(|l| l.contains(&format!("{pid}  rank {rank} "))),
            "tables name pid {pid} rank {rank}: {text}"
        );
        let charted = text.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 3 && w[..3] == ["rank", &rank.to_string(), &pid.to_string()]
        });
        assert!(charted, "a chart line is labelled rank {rank}: {text}");
    }
    assert!(!text.contains("pt_gloo_runloop"), "a thread's name: {text}");
    // The helper rank 0 started carries RANK=0, and is no rank.
    let groups = r["groups"].as_array().expect("the run's groups");
    let ranks = groups.iter().find(|g| g["role"] == "torchrun ranks");
    assert_eq!(
        ranks.map(|g| u(&g["count"])),
        Some(2),
        "two ranks in the run: {groups:#?}"
    );
    // Rank 0, stopped by the launcher after rank 1's kill, and the
    // launcher's own failed exit are that kill's consequences.
    for pid in [rank0, u(&launcher["pid"])] {
        let d = death_of(&r, pid);
        assert_eq!(
            d["after_kill"]["victim_pid"].as_u64(),
            Some(victim),
            "pid {pid} died after the kill: {d}"
        );
        assert_eq!(d["after_kill"]["victim"], name.as_str(), "{d}");
    }
    assert!(
        flat.contains(&format!(
            "after OOM kill 1 of {name}: its consequence, not a cause"
        )),
        "the deaths say so: {text}"
    );
    let html = dir.path("ranks.html");
    let trace = dir.path("ranks.json");
    let out = std::process::Command::new(bin())
        .arg("report")
        .arg(&rec)
        .arg("--html")
        .arg(&html)
        .arg("--perfetto")
        .arg(&trace)
        .output()
        .expect("trainbpf report --html --perfetto");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(
        html.contains(&format!("<b class=\"victim\">{name}</b>")),
        "the page names the victim by its rank"
    );
    assert!(
        !html.contains("pt_gloo_runloop"),
        "a thread's name in the page"
    );
    let trace: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let names: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    for (rank, pid) in [(0, rank0), (1, victim)] {
        assert!(
            names
                .iter()
                .any(|n| n.starts_with(&format!("rank {rank} (pid {pid})"))),
            "the trace's process for rank {rank}: {names:?}"
        );
    }
}

/// A memory cgroup laid out as a kubelet's (cgroupfs driver, cgroup v1):
/// `kubepods/burstable/pod<uid>/<container id>`, made and removed by the
/// test.
struct PodCgroup(Vec<std::path::PathBuf>);

impl PodCgroup {
    fn new(uid: &str, id: &str) -> PodCgroup {
        let base = std::path::Path::new("/sys/fs/cgroup/memory");
        let kubepods = base.join("kubepods");
        let burstable = kubepods.join("burstable");
        let pod = burstable.join(format!("pod{uid}"));
        let ctr = pod.join(id);
        // Another test may remove an empty `kubepods` between two
        // mkdirs: try again.
        for _ in 0..20 {
            if std::fs::create_dir_all(&ctr).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(ctr.is_dir(), "cannot make {}", ctr.display());
        PodCgroup(vec![ctr, pod, burstable, kubepods])
    }

    fn procs(&self) -> std::path::PathBuf {
        self.0[0].join("cgroup.procs")
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        // Innermost first; the shared parents only when empty (another
        // test's pods may still be there).
        for d in &self.0 {
            for _ in 0..20 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The test's own child; killed and reaped however the test ends.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until its line, then grows by 32 MiB, says so, and waits.
const POD_PROC: &str = r#"
import sys
print("ready", flush=True)
sys.stdin.readline()
hold = bytearray(b"x") * (32 << 20)
print("grown", flush=True)
sys.stdin.readline()
"#;

#[test]
fn record_all_names_a_pods_container() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("identity-pod");
    let rec = dir.path("all.rec");
    let me = std::process::id();
    let uid = format!("8d3c2b1a-0f9e-4d8c-b7a6-{me:012x}");
    let id = format!("{me:016x}").repeat(4);
    let cg = PodCgroup::new(&uid, &id);

    // Moved into the pod's container cgroup before it execs Python, as a
    // container's processes start there; running before the recorder.
    let script = format!(
        "echo $$ > {} && exec {} -c '{}'",
        cg.procs().display(),
        python(),
        POD_PROC
    );
    let mut kid = Kid(Command::new("/bin/sh")
        .args(["-c", &script])
        .env("HOSTNAME", "trainer-0")
        .env("POD_NAMESPACE", "ml")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the pod's process"));
    let pid = u64::from(kid.0.id());
    let mut said = BufReader::new(kid.0.stdout.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    eprintln!("pid {pid} /proc/PID/cgroup:\n{cgroup}");
    assert!(cgroup.contains(&format!("pod{uid}/{id}")), "{cgroup}");

    let mut recorder = spawn_until(
        &[
            "record".as_ref(),
            "-q".as_ref(),
            "-o".as_ref(),
            rec.as_os_str(),
            "--all".as_ref(),
        ],
        "attached;",
    );
    let mut stdin = kid.0.stdin.take().unwrap();
    stdin.write_all(b"grow\n").unwrap();
    line.clear();
    said.read_line(&mut line).unwrap();
    assert_eq!(line, "grown\n");
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) }, 0);
    assert!(recorder.wait().unwrap().success(), "detaching is success");
    drop(stdin);
    drop(kid);
    drop(cg);

    let r = report_json(&rec);
    let p = procs(&r)
        .iter()
        .find(|p| u(&p["pid"]) == pid)
        .unwrap_or_else(|| panic!("pid {pid} is not among the processes"));
    eprintln!("pid {pid}: container {}", p["container"]);
    let c = &p["container"];
    assert_eq!(c["pod_uid"], uid.as_str(), "{p}");
    assert_eq!(c["id"], id.as_str(), "{p}");
    assert_eq!(c["runtime"], "kubernetes", "{p}");
    assert_eq!(c["pod_name"], "trainer-0", "{p}");
    assert_eq!(c["namespace"], "ml", "{p}");
    assert!(p["rank"].is_null(), "{p}");
}

/// A job process that wedges its own memory map: a thread reads a page of
/// a file whose filesystem never answers (the FUSE server is the test's),
/// through /proc/self/mem, which holds the map's lock for reading while it
/// waits; a second thread then asks for the lock for writing, and from
/// then on every reader of the lock waits behind it. A vfork'd child
/// shares the map (a vfork takes no lock), and reading the child's
/// command line or environment, as the recorder does at its fork, waits
/// as long as the server does. Nothing of it can end before the server
/// does: the first read is in the server's hands, past a kill.
const WEDGE_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static void *page;

static void *reader(void *arg) {
    (void)arg;
    int fd = open("/proc/self/mem", O_RDONLY);
    char c;
    if (pread(fd, &c, 1, (off_t)(unsigned long)page) < 0)
        return NULL;
    return NULL;
}

static void *writer(void *arg) {
    (void)arg;
    usleep(300000);
    mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return NULL;
}

static void say(const char *s, size_t n) {
    if (write(1, s, n) < 0)
        _exit(1);
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    page = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
    if (page == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    /* Both threads exist before the lock is held: a thread's stack is
       mapped, which would wait too. Nothing below allocates. */
    pthread_t a, b;
    pthread_create(&b, NULL, writer, NULL);
    pthread_create(&a, NULL, reader, NULL);
    usleep(800000);
    say("wedged\n", 7);
    /* The child waits as it is: until it execs or exits it holds this
       process in vfork (a killable wait), and its exit would wait for
       the lock too. */
    if (vfork() == 0)
        for (;;)
            pause();
    for (;;)
        pause();
}
"#;

/// The job: starts the wedge, then, while the wedge holds, forks a few
/// short-lived processes and a grower that the memory limit kills; says
/// so in a file, and once the test says go (the filesystem gone, so the
/// wedge can die) kills the wedge and its child, and ends.
const WEDGE_JOB: &str = r#"
import os, signal, subprocess, sys, time
wedge, stalled, done, go = sys.argv[1:5]
c = subprocess.Popen([wedge, stalled], stdout=subprocess.PIPE)
assert c.stdout.readline() == b"wedged\n"
time.sleep(1)
with open(f"/proc/{c.pid}/task/{c.pid}/children") as f:
    kids = [int(p) for p in f.read().split()]
assert len(kids) == 1, kids
for _ in range(5):
    subprocess.run(["/bin/sleep", "0.05"], check=True)
g = subprocess.run([sys.executable, "-c",
                    "hold = []\nwhile True: hold.append(bytearray(b'x') * (8 << 20))"])
with open(done, "w") as f:
    f.write(str(g.returncode))
while not os.path.exists(go):
    time.sleep(0.1)
os.kill(kids[0], signal.SIGKILL)
c.kill()
c.wait()
"#;

// A job that wedged its own memory map stopped the
// recording: the command line of its processes was read on the thread
// that drains the rings, and that read waited as long as the job wished.
// No command line is read at a fork any more; the reads of the wedged
// process that remain (its USS and PSS, every few seconds) wait on the
// lock, and must be abandoned and counted, the sampling going on.
#[test]
fn a_job_that_wedges_its_memory_map_does_not_stop_the_recording() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("identity-wedge");
    let wedge = dir.path("wedge");
    let src = dir.path("wedge.c");
    std::fs::write(&src, WEDGE_C).unwrap();
    cc(&[
        "-pthread",
        "-o",
        wedge.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let fs = StallFs::mount(&dir.path("stall"));
    let (rec, done, go) = (dir.path("wedge.rec"), dir.path("done"), dir.path("go"));
    // Killed however the test ends (the wedge dies once the filesystem,
    // dropped after this, is gone).
    let mut recorder = Recorder(
        Command::new(bin())
            .arg("record")
            .arg("-o")
            .arg(&rec)
            .args(["--memory-limit", "200M", "--", python(), "-c", WEDGE_JOB])
            .arg(&wedge)
            .arg(fs.file())
            .arg(&done)
            .arg(&go)
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .stdin(Stdio::null())
            .spawn()
            .expect("starting trainbpf record"),
    );
    let started = std::time::Instant::now();
    while !done.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the job did not get past its wedge"
        );
        assert!(
            recorder.0.try_wait().unwrap().is_none(),
            "the recorder ended early"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "the job's grower ended with {:?}; the filesystem got {} reads, none answered",
        std::fs::read_to_string(&done).unwrap(),
        fs.reads()
    );
    assert!(fs.reads() > 0, "the wedge never read its page");
    // The recorder writes what it drained at least once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let mid = report_json(&rec);
    let sleeps = procs(&mid).iter().filter(|p| p["comm"] == "sleep").count();
    let killed = kills(&mid).iter().any(|k| k["victim"]["in_job"] == true);
    eprintln!(
        "while the wedge holds, {:.1} s in: the recording has {sleeps} of the 5 sleeps, and {} the kill",
        started.elapsed().as_secs_f64(),
        if killed { "has" } else { "lacks" }
    );
    assert!(
        killed && sleeps == 5,
        "the recording stopped at the wedge: {sleeps} of 5 later processes, the kill {}",
        if killed { "recorded" } else { "missing" }
    );

    // The next USS/PSS round reads the wedged process: abandoned past its
    // deadline, and counted, while the recording goes on.
    let waited = std::time::Instant::now();
    loop {
        let r = report_json(&rec);
        if u(&r["job_reads"]["stalled"]) >= 1 {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "no read of the wedged process was abandoned and counted: {}",
            r["job_reads"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // The wedge can end once the filesystem is gone; the job then ends,
    // and the recorder with it.
    drop(fs);
    std::fs::write(&go, b"").unwrap();
    let ending = std::time::Instant::now();
    let status = loop {
        if let Some(s) = recorder.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            ending.elapsed() < Duration::from_secs(30),
            "the recorder did not end with the job"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "the recorder ended {:.1} s after the job was told to: {status}",
        ending.elapsed().as_secs_f64()
    );
    let r = report_json(&rec);
    let reads = &r["job_reads"];
    eprintln!("job_reads: {reads}");
    assert!(
        u(&reads["stalled"]) >= 1,
        "the read that waited is counted: {reads}"
    );
    let text = report_text(&rec);
    let said = text
        .lines()
        .find(|l| l.starts_with("reads of the job's memory and files:"))
        .unwrap_or_else(|| panic!("the text says nothing of the reads: {text}"));
    eprintln!("text: {said}");
    let stalled = u(&reads["stalled"]);
    assert!(said.contains(&format!("{stalled} stalled")), "{said}");
}
