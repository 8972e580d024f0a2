//! Shared memory seen when it matters: a short-lived /dev/shm
//! object is listed, and a job whose /dev/shm fills up (a small tmpfs in a
//! private mount namespace) is diagnosed `shm_full`, with the
//! filesystem's size in the evidence.

use crate::support::*;
use serde_json::Value;

const MIB_KB: u64 = 1024;

/// One 256 MiB /dev/shm object, written by the main process and mapped by
/// three workers for about 3 s; then unlinked. The workers are forked
/// before it exists and open it by name, as DataLoader workers open a
/// batch's segment.
const SHM_3S: &str = r#"
import mmap, os, sys, time
N = 256 << 20
path = "/dev/shm/trainbpf-shm3s-%d" % os.getpid()
r, w = os.pipe()
kids = []
for k in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        fd = os.open(path, os.O_RDWR)
        m = mmap.mmap(fd, N)
        s = 0
        for i in range(0, N, 4096):
            s += m[i]
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, N)
m = mmap.mmap(fd, N)
for i in range(0, N, 4096):
    m[i] = 1
os.write(w, b"xxx")
for p in kids:
    os.waitpid(p, 0)
os.unlink(path)
print("kids", *kids, flush=True)
"#;

fn objects(r: &Value) -> &Vec<Value> {
    r["shared_memory"].as_array().expect("shared_memory")
}

#[test]
fn a_shm_object_mapped_for_3_s_is_listed_and_counted_once() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("shm3s");
    let rec = dir.path("s.rec");
    let out = record(&rec, &["--memory-limit", "320M"], &[python(), "-c", SHM_3S]);
    assert!(out.status.success());
    let r = report_json(&rec);
    let root = u(&r["job"]["pid"]);
    let name = format!("/dev/shm/trainbpf-shm3s-{root}");
    let ours: Vec<_> = objects(&r).iter().filter(|o| o["name"] == name).collect();
    assert_eq!(
        ours.len(),
        1,
        "{name} listed once: {:#}",
        r["shared_memory"]
    );
    let o = ours[0];
    assert_eq!(o["kind"], "posix", "{o}");
    assert_eq!(u(&o["size_kb"]), 256 * MIB_KB, "{o}");
    assert!(u(&o["resident_kb"]) >= 250 * MIB_KB, "{o}");
    assert_eq!(u(&o["owner_pid"]), root, "the writer made it: {o}");
    assert_eq!(u(&o["mappers"]), 4, "the writer and three workers: {o}");
    assert!(o["fs_dev"].is_string(), "{o}");
    // The pages are the writer's, once: the workers that only map them
    // added nothing, however much shmem their RSS shows.
    let creator = root_proc(&r);
    eprintln!("object: {o}\ncreator: {}", line(creator));
    assert!(
        honest_peak(creator) >= 250 * MIB_KB as i64,
        "{}",
        line(creator)
    );
    let kids = children_of(&r, root);
    assert_eq!(kids.len(), 3, "{:#}", r["processes"]);
    for k in kids {
        eprintln!("worker: {}", line(k));
        assert!(honest_peak(k) < 32 * MIB_KB as i64, "{}", line(k));
        assert!(
            u(&k["peak_rss_kb"]) >= 200 * MIB_KB,
            "mapped it: {}",
            line(k)
        );
    }
    // The look is cheap, and the interval kept to 100 times its cost.
    let s = &r["shm_sampling"];
    assert!(u(&s["looks"]) >= 2, "{s}");
    assert!(
        u(&s["interval_ms"]) >= 100 * u(&s["max_cost_us"]) / 1000,
        "{s}"
    );
    eprintln!("shm_sampling: {s}");
}

/// A training job's main process and one DataLoader-like worker that puts
/// a 96 MiB batch in /dev/shm: it maps a POSIX shm object and writes every
/// page. The main process loads its "dataset" for 1.5 s first, so the
/// recorder has looked at the job's /dev/shm before, as it would at a
/// container's. It ends as soon as the worker does, as PyTorch's main
/// process raises at once when a worker dies.
const FILL: &str = r#"
import mmap, os, sys, time
time.sleep(1.5)
pid = os.fork()
if pid == 0:
    N = 96 << 20
    fd = os.open("/dev/shm/torch_%d_batch" % os.getpid(), os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, N)
    m = mmap.mmap(fd, N)
    for i in range(0, N, 4096):
        m[i] = 1
    os._exit(0)
_, st = os.waitpid(pid, 0)
if os.WIFSIGNALED(st):
    print("DataLoader worker (pid %d) is killed by signal: %d" % (pid, os.WTERMSIG(st)), flush=True)
    sys.exit(1)
print("worker", pid, "done", flush=True)
"#;

/// Runs FILL in a private mount namespace with a tmpfs of `size` over
/// its /dev/shm (never the host's: `unshare -m` with private propagation).
fn fill_job(tag: &str, size: &str) -> (Value, String) {
    let dir = TempDir::new(tag);
    let rec = dir.path("f.rec");
    let script = format!(
        "/usr/bin/mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {} -c \"$0\"",
        python()
    );
    let out = record(
        &rec,
        &["--memory-limit", "256M"],
        &[
            "/usr/bin/unshare",
            "-m",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            &script,
            FILL,
        ],
    );
    eprintln!("--- job stdout:\n{}", String::from_utf8_lossy(&out.stdout));
    (report_json(&rec), report_text(&rec))
}

fn shm_full(r: &Value) -> Option<&Value> {
    r["diagnoses"]
        .as_array()
        .expect("diagnoses")
        .iter()
        .find(|d| d["id"] == "shm_full")
}

/// The job's own /dev/shm, not the host's.
fn job_fs(r: &Value) -> &Value {
    r["shm_filesystems"]
        .as_array()
        .expect("shm_filesystems")
        .iter()
        .find(|f| f["job"] == true && u(&f["size_kb"]) < 1024 * MIB_KB)
        .unwrap_or_else(|| panic!("no small job /dev/shm: {:#}", r["shm_filesystems"]))
}

#[test]
fn a_worker_that_fills_a_64_mib_dev_shm_dies_of_sigbus_and_shm_full_says_so() {
    require_root();
    let _g = serial();
    let (r, text) = fill_job("shmfull", "64m");
    // The worker died of a bus error.
    let root = u(&r["job"]["pid"]);
    let bus: Vec<&Value> = deaths(&r)
        .iter()
        .filter(|d| d["signal"] == 7 && u(&d["pid"]) != root)
        .collect();
    assert_eq!(bus.len(), 1, "one SIGBUS death: {:#}", r["deaths"]);
    let worker = u(&bus[0]["pid"]);
    // The job's 64 MiB /dev/shm, full, as the recorder saw it.
    let fs = job_fs(&r);
    assert_eq!(u(&fs["size_kb"]), 64 * MIB_KB, "{fs}");
    assert!(u(&fs["peak_used_kb"]) >= 60 * MIB_KB, "{fs}");
    // The batch that filled it, and who made it.
    let batch = objects(&r)
        .iter()
        .find(|o| o["fs_dev"] == fs["dev"])
        .unwrap_or_else(|| panic!("no object in the job's /dev/shm: {:#}", r["shared_memory"]));
    // The worker died before a look could see it mapping the batch (it
    // dies within the fault): the owner is known only if one did.
    assert!(
        batch["owner_pid"].is_null() || u(&batch["owner_pid"]) == worker,
        "{batch}"
    );
    assert_eq!(u(&batch["size_kb"]), 96 * MIB_KB, "{batch}");
    let d = shm_full(&r).unwrap_or_else(|| panic!("no shm_full: {:#}", r["diagnoses"]));
    eprintln!("shm_full title: {}", d["title"]);
    eprintln!("shm_full: {d:#}");
    assert_eq!(d["confidence"], "high", "{d}");
    assert!(
        d["pids"].as_array().unwrap().contains(&worker.into()),
        "{d}"
    );
    let ev: Vec<&str> = d["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let ev = ev.join("\n");
    assert!(ev.contains("of 64 MiB"), "the fs size: {ev}");
    assert!(ev.contains(&format!("made by pid {worker}")), "{ev}");
    assert!(ev.contains("SIGBUS"), "{ev}");
    let fix = d["fix"].to_string();
    assert!(
        fix.contains("--shm-size=") && fix.contains("medium: Memory"),
        "{fix}"
    );
    // The text report shows the job's /dev/shm beside its objects.
    assert!(
        text.contains("the job's /dev/shm: 64 MiB used of 64 MiB"),
        "{text}"
    );
    // The look the bus error asked for.
    assert!(
        u(&r["shm_sampling"]["triggered"]) >= 1,
        "{}",
        r["shm_sampling"]
    );
}

/// The same batch in a /dev/shm with room for it: no bus error, and no
/// shm_full.
#[test]
fn a_batch_that_fits_in_dev_shm_is_no_shm_full() {
    require_root();
    let _g = serial();
    let (r, _) = fill_job("shmfits", "160m");
    assert!(
        deaths(&r).iter().all(|d| d["signal"] != 7),
        "{:#}",
        r["deaths"]
    );
    let fs = job_fs(&r);
    assert_eq!(u(&fs["size_kb"]), 160 * MIB_KB, "{fs}");
    assert!(u(&fs["peak_used_kb"]) >= 90 * MIB_KB, "{fs}");
    assert!(shm_full(&r).is_none(), "{:#}", r["diagnoses"]);
}

/// A job that plants a link to outside its root where its /dev/shm
/// would be: it chroots into a directory whose `dev/shm` is a link to
/// `/etc`, and stays there until the test has seen a look made inside
/// that root (the test then creates `/go` in it).
const PLANT: &str = r#"
import os, sys, time
os.chroot(sys.argv[1])
os.chdir("/")
print("chrooted", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists("/go") and time.monotonic() < deadline:
    time.sleep(0.05)
"#;

/// The `/dev/shm` objects of the looks in a recording, live or finished.
fn looked_names(rec: &std::path::Path) -> Vec<String> {
    let Ok(out) = std::process::Command::new(bin())
        .arg("report")
        .arg(rec)
        .arg("--format=json")
        .output()
    else {
        return Vec::new();
    };
    let Ok(r) = serde_json::from_slice::<Value>(&out.stdout) else {
        return Vec::new();
    };
    r["shared_memory"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["name"].as_str().map(str::to_owned))
        .collect()
}

/// The job's /dev/shm is resolved inside the job's root: the planted link
/// leads to the job's own `/etc`, never to the recorder's.
///
/// The job stays in its root until the recording (flushed each second)
/// shows a look there. A fixed stay raced the looks' timer, which is
/// stretched to 400 times a look's cost: on a loaded machine the look
/// after the chroot came after the job had left.
#[test]
fn a_link_the_job_planted_at_its_dev_shm_stays_inside_its_root() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("shmlink");
    let root = dir.path("root");
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("dev/shm")).unwrap();
    std::fs::write(root.join("etc/inside"), vec![1u8; 4096]).unwrap();
    assert!(std::path::Path::new("/etc/passwd").exists());
    let rec = dir.path("l.rec");
    let mut job = std::process::Command::new(bin())
        .arg("record")
        .arg("-o")
        .arg(&rec)
        .args(["--memory-limit", "128M", "--", python(), "-c", PLANT])
        .arg(&root)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("starting trainbpf record");
    let seen = poll(std::time::Duration::from_secs(60), || {
        let names = looked_names(&rec);
        names
            .iter()
            .any(|n| n == "/dev/shm/inside")
            .then_some(names)
    });
    std::fs::write(root.join("go"), b"").unwrap();
    let status = job.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        seen.is_some(),
        "no look inside the job's root while it ran: {:?}",
        looked_names(&rec)
    );
    let r = report_json(&rec);
    let names: Vec<&str> = objects(&r)
        .iter()
        .filter_map(|o| o["name"].as_str())
        .collect();
    assert!(
        names.contains(&"/dev/shm/inside"),
        "the job's own /dev/shm (its /etc) was looked at: {names:?}"
    );
    assert!(
        !names.contains(&"/dev/shm/passwd"),
        "the recorder's /etc was listed: {names:?}"
    );
}
