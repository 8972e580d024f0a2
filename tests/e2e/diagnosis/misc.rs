//! The diagnoses of GPU memory and of kills from user space, on real jobs:
//! `pinned_memory`, `cuda_in_workers` and `gpu_oom` with the stand-in CUDA
//! driver (tests/gpu/standin_cuda.c) driving the real uprobes and a real
//! memory-cgroup OOM kill; `userspace_killer` with a real SIGKILL from a
//! process outside the job. Each reads `report --json`'s `diagnoses`.
//!
//! `no_swap_overcommit` needs a global OOM (the whole machine out of
//! memory), which is not safe to cause on a shared machine: its rule is
//! unit-tested on fixtures only.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use crate::support::*;
use serde_json::Value;

/// The stand-in libcuda and libnvidia-ml (in `lib/`, under their
/// sonames) and the job, built in `dir`.
struct Standins {
    lib: PathBuf,
    libcuda: PathBuf,
    job: PathBuf,
    gpu_dir: PathBuf,
}

fn build(dir: &TempDir) -> Standins {
    let src = |n: &str| gpu_src(n).to_str().unwrap().to_string();
    let lib = dir.path("lib");
    let gpu_dir = dir.path("gpu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(&gpu_dir).unwrap();
    let libcuda = lib.join("libcuda.so.1");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        &s(&libcuda),
        &src("standin_cuda.c"),
        "-lpthread",
    ]);
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        &s(&lib.join("libnvidia-ml.so.1")),
        &src("standin_nvml.c"),
    ]);
    let job = dir.path("diag_job");
    cc(&["-o", &s(&job), &src("diag_job.c"), "-ldl"]);
    Standins {
        lib,
        libcuda,
        job,
        gpu_dir,
    }
}

/// `trainbpf record -o REC [extra…] -- diag_job MODE LIBCUDA`, with the
/// stand-ins found as on a real machine (TRAINBPF_LIBCUDA, NVML by soname).
fn record_gpu(s: &Standins, rec: &Path, extra: &[&str], mode: &str) -> Output {
    let libcuda = s.libcuda.to_str().unwrap();
    let mut c = Command::new(bin());
    c.arg("record")
        .arg("-o")
        .arg(rec)
        .args(extra)
        .arg("--")
        .args([s.job.to_str().unwrap(), mode, libcuda])
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env("TRAINBPF_LIBCUDA", libcuda)
        .env("LD_LIBRARY_PATH", &s.lib)
        .env("STANDIN_GPU_DIR", &s.gpu_dir)
        .env_remove("TRAINBPF_LIBNVML")
        .stdin(Stdio::null());
    let out = c.output().expect("running trainbpf record");
    eprintln!(
        "--- trainbpf record {extra:?} -- diag_job {mode}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn diagnoses(r: &Value) -> &Vec<Value> {
    r["diagnoses"].as_array().expect("diagnoses array")
}

/// The diagnosis `id`, printed; panics with all of them when missing.
fn diagnosis<'a>(r: &'a Value, id: &str) -> &'a Value {
    let all = diagnoses(r);
    for d in all {
        eprintln!(
            "diagnosis {} ({}), kill {}: {}",
            d["id"], d["confidence"], d["kill"], d["title"]
        );
    }
    all.iter()
        .find(|d| d["id"] == id)
        .unwrap_or_else(|| panic!("no {id} diagnosis: {all:#?}"))
}

fn has(d: &Value, field: &str, needle: &str) -> bool {
    d[field]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e.as_str().unwrap().contains(needle))
}

/// The index in `kills` of the first kill of a job process.
fn job_kill_index(r: &Value) -> u64 {
    kills(r)
        .iter()
        .position(|k| k["victim"]["in_job"] == true)
        .unwrap_or_else(|| panic!("no kill of a job process: {:#}", r["kills"])) as u64
}

#[test]
fn pinned_host_memory_that_filled_the_limit_is_diagnosed() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-pinned");
    let s = build(&dir);
    let rec = dir.path("p.rec");
    let out = record_gpu(&s, &rec, &["--memory-limit", "256M"], "pinned");
    assert_eq!(out.status.code(), Some(137), "the job pins until killed");
    let r = report_json(&rec);
    let k = job_kill_index(&r);
    let d = diagnosis(&r, "pinned_memory");
    assert_eq!(u(&d["kill"]), k, "{d:#}");
    // 32 MiB registered, then 16 MiB steps up to about 200 MiB of the 256
    // MiB limit: well over half.
    assert_eq!(d["confidence"], "high", "{d:#}");
    let title = d["title"].as_str().unwrap();
    assert!(
        title.starts_with("Pinned host memory took a large share: ")
            && title.contains("% of the 256 MiB limit)"),
        "{title}"
    );
    let pct: u64 = title
        .rsplit('(')
        .next()
        .and_then(|t| t.split('%').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no share in {title}"));
    assert!((50..=100).contains(&pct), "{title}");
    assert!(has(d, "evidence", "of which 32 MiB registered"), "{d:#}");
    assert!(has(d, "fix", "prefetch_factor"), "{d:#}");
    assert_eq!(u(&d["pids"][0]), u(&r["job"]["pid"]));
    // A host kill, not the GPU's: no CUDA OOM to diagnose.
    assert!(!diagnoses(&r).iter().any(|d| d["id"] == "gpu_oom"));
}

#[test]
fn workers_that_made_their_own_cuda_contexts_are_diagnosed() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-ctx");
    let s = build(&dir);
    let rec = dir.path("w.rec");
    let out = record_gpu(&s, &rec, &["--memory-limit", "256M"], "workers");
    assert!(!out.status.success(), "the job ends in a kill");
    let r = report_json(&rec);
    let k = job_kill_index(&r);
    let d = diagnosis(&r, "cuda_in_workers");
    assert_eq!(u(&d["kill"]), k, "{d:#}");
    // Two workers × 80 MiB (16 MiB in cuInit, 64 per context, measured in
    // steps of the 4 MiB RSS threshold) of a 256 MiB limit: over half.
    assert_eq!(d["confidence"], "high", "{d:#}");
    let title = d["title"].as_str().unwrap();
    assert!(
        title.starts_with("Worker processes created their own CUDA contexts: 2 worker(s) paid "),
        "{title}"
    );
    let root = u(&r["job"]["pid"]);
    let pids: Vec<u64> = d["pids"].as_array().unwrap().iter().map(u).collect();
    assert_eq!(pids.len(), 2);
    assert!(!pids.contains(&root), "the root never touched CUDA");
    assert!(has(d, "evidence", "cuCtxCreate"), "{d:#}");
    assert!(
        has(d, "evidence", "The job's root made no CUDA context"),
        "{d:#}"
    );
    assert!(has(d, "fix", "'spawn'"), "{d:#}");
}

#[test]
fn a_cuda_oom_is_told_apart_from_a_host_kill() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-gpuoom");
    let s = build(&dir);
    let rec = dir.path("o.rec");
    let out = record_gpu(&s, &rec, &[], "oom");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the job exits 1 after its error"
    );
    let r = report_json(&rec);
    assert!(
        !kills(&r).iter().any(|k| k["victim"]["in_job"] == true),
        "no host kill of the job"
    );
    let d = diagnosis(&r, "gpu_oom");
    assert_eq!(d["kill"], Value::Null);
    assert_eq!(d["confidence"], "high", "{d:#}");
    let title = d["title"].as_str().unwrap();
    assert!(
        title.starts_with(
            "The job died of CUDA out-of-memory (GPU memory), not a host OOM kill: cuMemAlloc of 1 TiB failed with 192 MiB already held"
        ),
        "{title}"
    );
    assert!(has(d, "evidence", "device memory peak 192 MiB"), "{d:#}");
    assert!(has(d, "evidence", "exited with code 1"), "{d:#}");
    assert!(has(d, "fix", "expandable_segments:True"), "{d:#}");
    assert_eq!(u(&d["pids"][0]), u(&r["job"]["pid"]));
}

/// Records `sleep 30` as the job, and has `killer` (a path, run with
/// `-9 PID`) SIGKILL it from outside the job; returns the report and the
/// killer's pid.
fn killed_from_outside(dir: &TempDir, killer: &Path) -> (Value, u64, u64) {
    let rec = dir.path("k.rec");
    let pidfile = dir.path("pid");
    let mut rec_proc = Command::new(bin())
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--", "/bin/sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 30", pidfile.display()))
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut job_pid = 0u64;
    for _ in 0..200 {
        if let Ok(s) = std::fs::read_to_string(&pidfile)
            && let Ok(p) = s.trim().parse()
        {
            job_pid = p;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(job_pid > 0, "the job wrote its pid");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut k = Command::new(killer)
        .args(["-9", &job_pid.to_string()])
        .spawn()
        .unwrap();
    let killer_pid = k.id() as u64;
    assert!(k.wait().unwrap().success());
    assert_eq!(rec_proc.wait().unwrap().code(), Some(137));
    (report_json(&rec), job_pid, killer_pid)
}

#[test]
fn an_earlyoom_kill_names_earlyoom_not_the_kernel() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-earlyoom");
    // A process whose comm is "earlyoom", as the daemon's is: /bin/kill
    // run through a link of that name.
    let earlyoom = dir.path("earlyoom");
    std::os::unix::fs::symlink("/bin/kill", &earlyoom).unwrap();
    let (r, job, killer) = killed_from_outside(&dir, &earlyoom);
    assert!(
        !kills(&r).iter().any(|k| k["victim"]["in_job"] == true),
        "no kernel OOM kill of the job"
    );
    let d = diagnosis(&r, "userspace_killer");
    assert_eq!(d["confidence"], "high", "{d:#}");
    let title = d["title"].as_str().unwrap();
    assert!(
        title.starts_with(&format!(
            "earlyoom killed the job, not the kernel: SIGKILL from earlyoom (pid {killer}, uid 0"
        )),
        "{title}"
    );
    assert!(has(d, "evidence", "-m and -s, 10% by default"), "{d:#}");
    assert!(has(d, "fix", "--avoid"), "{d:#}");
    assert_eq!(d["pids"], serde_json::json!([job]));
}

#[test]
fn a_persons_kill_names_the_sender_and_its_uid() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-personkill");
    let (r, job, killer) = killed_from_outside(&dir, Path::new("/bin/kill"));
    let d = diagnosis(&r, "userspace_killer");
    assert_eq!(d["confidence"], "high", "{d:#}");
    assert_eq!(
        d["title"],
        format!(
            "A person's kill ended the job, not the kernel: SIGKILL from kill (pid {killer}, uid 0)"
        ),
        "{d:#}"
    );
    assert!(has(d, "fix", "uid 0"), "{d:#}");
    assert_eq!(d["pids"], serde_json::json!([job]));
}
