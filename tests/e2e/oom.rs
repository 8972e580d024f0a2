//! Real OOM kills inside a memory cgroup, checked against the kernel's own
//! log line for the same kill.

use crate::support::*;
use serde_json::Value;

/// The job's biggest grower. Other processes on the machine are listed too
/// (a compiler running beside the tests can outgrow the job), so tests about
/// the job look at the job's own.
fn top_job_grower(k: &Value) -> &Value {
    k["growers"]
        .as_array()
        .expect("growers")
        .iter()
        .find(|g| g["in_job"] == true)
        .unwrap_or_else(|| panic!("no job process among the growers: {k:#}"))
}

/// Grows by `step_mb` MiB every `sleep_s` seconds, touching every page.
const GROW: &str = r#"
import sys, time
step = int(sys.argv[1]) << 20
pause = float(sys.argv[2])
hold = []
while True:
    hold.append(bytearray(b"x") * step)
    time.sleep(pause)
"#;

#[test]
fn victim_fields_equal_the_kernels_own_report() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("victim");
    let rec = dir.path("oom.rec");
    let out = record(
        &rec,
        &["--memory-limit", "160M"],
        &[python(), "-c", GROW, "8", "0.02"],
    );
    // The job itself was the victim: SIGKILL, so 128+9.
    assert_eq!(
        out.status.code(),
        Some(137),
        "record exits with the job's status"
    );
    // A quiet start: where it records, and warnings only (this machine
    // has no oom_kill_process probe, which changes nothing the report
    // says); the probes chosen are the recording's, and -v's.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let start: Vec<&str> = stderr
        .lines()
        .take_while(|l| !l.contains("OOM-killed"))
        .filter(|l| !l.starts_with("trainbpf: warning:"))
        .collect();
    assert_eq!(
        start,
        [format!("trainbpf: recording to {}", rec.display())],
        "{stderr}"
    );
    let verbose = record(&dir.path("v.rec"), &["-v"], &["/bin/true"]);
    let said = String::from_utf8_lossy(&verbose.stderr);
    assert!(
        said.contains("; OOM kill via tp_btf:mark_victim") && said.contains("\n  fallback: "),
        "-v names the attach points and the fallbacks: {said}"
    );
    assert!(said.contains("trainbpf: GPU: "), "{said}");

    let r = report_json(&rec);
    assert_eq!(r["schema"], "trainbpf.report/1");
    let kills = kills(&r);
    assert_eq!(kills.len(), 1, "one kill: {kills:#?}");
    let k = &kills[0];
    let v = &k["victim"];
    let pid = u(&v["pid"]);
    let kernel = dmesg_kill(pid).unwrap_or_else(|| panic!("no kernel log line for pid {pid}"));
    eprintln!("kernel: {kernel:?}\nreport: {v}");
    assert!(kernel.memcg, "the kernel says memcg OOM");
    assert_eq!(v["comm"], kernel.comm.as_str());
    assert_eq!(u(&v["anon_rss_kb"]), kernel.anon_kb);
    assert_eq!(u(&v["file_rss_kb"]), kernel.file_kb);
    assert_eq!(u(&v["shmem_rss_kb"]), kernel.shmem_kb);
    assert_eq!(v["in_job"], true);
    assert_eq!(k["constraint"], "memcg");
    let memcg = k["memcg"].as_str().expect("memcg path");
    assert!(memcg.contains("/trainbpf-"), "memcg path {memcg}");
    assert_eq!(
        u(&k["trigger"]["pid"]),
        pid,
        "the grower's own allocation triggered it"
    );
    assert_eq!(r["job"]["exit"]["signal"], 9);
    assert_eq!(u(&r["lost_events"]), 0);
    // The kill in one line, the same on record's stderr.
    let verdict = k["verdict"].as_str().expect("a verdict");
    assert!(
        verdict.starts_with(&format!(
            "python3 (pid {pid}) was OOM-killed: its memory cgroup reached its 160 MiB limit; \
             it added "
        )) && verdict.chars().count() <= 200,
        "{verdict}"
    );
    assert!(
        stderr.contains(&format!("trainbpf: {verdict}\n")),
        "stderr has the same line: {stderr}"
    );
    // Why this victim: the reconstruction ranks it first, from the cgroup's
    // limit, and its points are the kernel's formula over its own figures.
    let cands = k["candidates"].as_array().expect("candidates");
    assert_eq!(cands[0]["is_victim"], true, "{cands:#?}");
    assert_eq!(u(&cands[0]["pid"]), pid);
    assert_eq!(k["ranking"]["totalpages_source"], "memcg_limit");
    assert_eq!(
        u(&k["ranking"]["totalpages"]),
        160 * 256,
        "160 MiB in 4 KiB pages"
    );
    let pages = (kernel.anon_kb + kernel.file_kb + kernel.shmem_kb + u(&v["pgtables_kb"])) / 4;
    assert_eq!(cands[0]["points"].as_i64().unwrap(), pages as i64);
    // The pressure before it: the cgroup's usage close to its limit.
    let pr = &k["pressure"];
    assert_eq!(u(&pr["cgroup_limit_kb"]), 160 * 1024);
    assert!(u(&pr["mem_total_kb"]) > 0);
    // The growth before the kill is attributed to the victim, who grew.
    let top = top_job_grower(k);
    assert_eq!(u(&top["pid"]), pid);
    assert!(u(&top["grew_kb"]) > 100 * 1024, "grew {top}");
}

/// A worker grows while the kernel kills a sibling whose oom_score_adj is
/// 1000: the report must not confuse the grower with the victim.
const SIBLING: &str = r#"
import os, sys, time
sib = os.fork()
if sib == 0:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    keep = bytearray(b"s") * (16 << 20)
    time.sleep(60)
    os._exit(0)
worker = os.fork()
if worker == 0:
    hold = []
    while True:
        try:
            os.kill(sib, 0)
            if open(f"/proc/{sib}/stat").read().split()[2] == "Z":
                break
        except ProcessLookupError:
            break
        hold.append(bytearray(b"w") * (4 << 20))
        time.sleep(0.01)
    os._exit(0)
os.waitpid(worker, 0)
os.waitpid(sib, 0)
"#;

#[test]
fn top_grower_is_the_worker_when_the_kernel_kills_a_sibling() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("sibling");
    let rec = dir.path("sib.rec");
    let out = record(
        &rec,
        &["--memory-limit", "200M"],
        &[python(), "-c", SIBLING],
    );
    assert_eq!(out.status.code(), Some(0), "the main process survives");
    let r = report_json(&rec);
    let kills = kills(&r);
    assert!(!kills.is_empty(), "a kill was recorded");
    let k = &kills[0];
    assert_eq!(u(&k["victim"]["oom_score_adj"]), 1000);
    let victim = u(&k["victim"]["pid"]);
    let kernel = dmesg_kill(victim).expect("kernel log line for the sibling");
    assert_eq!(u(&k["victim"]["anon_rss_kb"]), kernel.anon_kb);
    let top = top_job_grower(k);
    assert_ne!(
        u(&top["pid"]),
        victim,
        "the grower is not the victim: {k:#}"
    );
    assert_eq!(top["in_job"], true);
    assert!(
        u(&top["grew_kb"]) > 100 * 1024,
        "worker grew >100 MiB: {top}"
    );
    assert_eq!(
        u(&k["trigger"]["pid"]),
        u(&top["pid"]),
        "the worker's allocation triggered the kill"
    );
    // oom_score_adj 1000 puts the small sibling above the big worker.
    let cands = k["candidates"].as_array().expect("candidates");
    assert_eq!(u(&cands[0]["pid"]), victim, "{cands:#?}");
    assert_eq!(cands[0]["oom_score_adj"], 1000);
    assert_eq!(
        u(&cands[1]["pid"]),
        u(&top["pid"]),
        "the grower ranks second: {cands:#?}"
    );
}

/// The grower is a worker's worker: it still counts as the job.
#[test]
fn grandchild_counts_as_part_of_the_job() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("grandchild");
    let rec = dir.path("gc.rec");
    let script = format!(
        "import subprocess, sys\nsubprocess.run(['/bin/sh', '-c', '{} -c \"$0\" 8 0.02; echo done', {GROW:?}])\n",
        python()
    );
    let out = record(
        &rec,
        &["--memory-limit", "160M"],
        &[python(), "-c", &script],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the top process outlives its grandchild"
    );
    let r = report_json(&rec);
    let k = &kills(&r)[0];
    let v = &k["victim"];
    assert_eq!(v["in_job"], true);
    let tree = v["tree"].as_array().expect("tree");
    assert!(tree.len() >= 3, "root → sh → python: {tree:#?}");
    assert_eq!(
        u(&tree[0]["pid"]),
        u(&r["job"]["pid"]),
        "tree starts at the job's root"
    );
    assert_eq!(u(&tree[tree.len() - 1]["pid"]), u(&v["pid"]));
    assert_eq!(
        u(&top_job_grower(k)["pid"]),
        u(&v["pid"]),
        "the grandchild grew"
    );
}
