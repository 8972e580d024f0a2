//! Shared memory seen when it matters (issue 16): a short-lived /dev/shm
//! object is listed, and a job whose /dev/shm fills up (a small tmpfs in a
//! private mount namespace) is diagnosed `shm_full`, with the
//! filesystem's size in the evidence.

mod common;

use common::*;
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
    assert!(
        honest_peak(creator) >= 250 * MIB_KB as i64,
        "{}",
        line(creator)
    );
    let kids = children_of(&r, root);
    assert_eq!(kids.len(), 3, "{:#}", r["processes"]);
    for k in kids {
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
