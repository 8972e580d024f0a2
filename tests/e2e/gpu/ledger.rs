//! GPU memory without a GPU: a stand-in `libcuda.so.1` and a stand-in
//! `libnvidia-ml.so.1`, both built here from tests/gpu/*.c, drive the real
//! uprobes, the collector and the ledger; synthetic Xid lines go through the
//! real kernel log.
//!
//! The job (tests/gpu/cuda_job.c) loads the stand-in with dlopen and calls it
//! through dlsym pointers from four threads, fails on purpose, forks a worker
//! that makes its own context, and exits holding memory. Every figure below
//! follows from that program; the comments say how.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use crate::support::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The stand-in libraries (in `lib/`, under their real sonames) and the job.
pub(super) struct Standins {
    pub(super) lib: PathBuf,
    pub(super) libcuda: PathBuf,
    pub(super) job: PathBuf,
    gpu_dir: PathBuf,
}

pub(super) fn build(dir: &TempDir) -> Standins {
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
        &s(&gpu_src("standin_cuda.c")),
        "-lpthread",
    ]);
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        &s(&lib.join("libnvidia-ml.so.1")),
        &s(&gpu_src("standin_nvml.c")),
    ]);
    let job = dir.path("cuda_job");
    cc(&[
        "-o",
        &s(&job),
        &s(&gpu_src("cuda_job.c")),
        "-ldl",
        "-lpthread",
    ]);
    Standins {
        lib,
        libcuda,
        job,
        gpu_dir,
    }
}

/// `trainbpf record` with extra environment (which the job inherits).
fn record_env(rec: &Path, env: &[(&str, &str)], cmd: &[&str]) -> Output {
    let mut c = Command::new(bin());
    // -v: what the GPU probes found is said at start.
    c.arg("record")
        .arg("-v")
        .arg("-o")
        .arg(rec)
        .arg("--")
        .args(cmd);
    // The machine's own settings must not leak into what is asserted.
    c.env_remove("TRAINBPF_LIBCUDA")
        .env_remove("TRAINBPF_LIBNVML")
        .env_remove("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS")
        .env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(Stdio::null());
    let out = c.output().expect("running trainbpf record");
    eprintln!(
        "--- trainbpf record {env:?} -- {cmd:?}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn report_text(rec: &Path) -> String {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .arg("--no-color")
        .env("COLUMNS", "120")
        .output()
        .expect("running trainbpf report");
    assert!(out.status.success(), "report failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn gpu_proc(r: &Value, pid: u64) -> &Value {
    r["gpu"]["processes"]
        .as_array()
        .expect("gpu.processes")
        .iter()
        .find(|p| u(&p["pid"]) == pid)
        .unwrap_or_else(|| panic!("no GPU ledger for pid {pid}: {:#}", r["gpu"]))
}

/// Device, pinned or managed figures of one process, in MiB:
/// (allocated, freed, peak, end, freed at exit).
fn kind(p: &Value, k: &str) -> (u64, u64, u64, u64, u64) {
    let s = &p[k];
    let m = |f: &str| u(&s[f]) / MIB;
    (
        m("allocated_bytes"),
        m("freed_bytes"),
        m("peak_bytes"),
        m("end_bytes"),
        m("freed_at_exit_bytes"),
    )
}

/// The ledger of the stand-in job, exact. Shared by the tests that find the
/// library different ways.
pub(super) fn assert_ledger(r: &Value) {
    let root = u(&r["job"]["pid"]);
    let main = gpu_proc(r, root);
    assert_eq!(main["is_root"], true);
    // Device: 4 threads × ((i+1)·16 + 8 + 4 + 2) MiB = 160 + 56 = 216 MiB,
    // all in before any free (a barrier); then 8 + 4 + 2 MiB freed per
    // thread; then cuMemCreate 64 MiB on the device, mapped, released while
    // mapped and freed at the unmap. Allocated 280, freed 120, peak
    // 160 + 64 = 224, and 160 held at exit.
    assert_eq!(kind(main, "device"), (280, 120, 224, 160, 160), "{main:#}");
    assert_eq!(u(&main["device"]["allocs"]), 17);
    assert_eq!(u(&main["device"]["frees"]), 13);
    // The 1 TiB cuMemAlloc.
    assert_eq!(u(&main["device"]["failed"]), 1);
    // Pinned: cuMemAllocHost 32, cuMemHostAlloc 16, cuMemHostRegister 8
    // (peak 56); the 16 freed and the 8 unregistered; then cuMemCreate of 4
    // MiB on a host location, kept: 36 at exit.
    assert_eq!(kind(main, "pinned"), (60, 24, 56, 36, 36), "{main:#}");
    assert_eq!(u(&main["registered_bytes_peak"]) / MIB, 8);
    // Managed: 1 MiB per thread, never freed.
    assert_eq!(kind(main, "managed"), (4, 0, 4, 4, 4));
    assert_eq!(u(&main["device_bytes_peak"]) / MIB, 224);
    assert_eq!(u(&main["device_bytes_end"]) / MIB, 160);
    assert_eq!(u(&main["pinned_bytes_peak"]) / MIB, 56);
    assert_eq!(u(&main["managed_bytes_peak"]) / MIB, 4);
    // The primary context, retained twice: one context.
    assert_eq!(u(&main["contexts"]), 1);
    assert_eq!(main["context_list"][0]["call"], "cuDevicePrimaryCtxRetain");
    assert_eq!(main["worker_init"], false);
    // The 1 TiB OOM and the free of a pointer never allocated (an error
    // return, so not a free the ledger applies).
    assert_eq!(u(&main["failed_calls"]), 2);
    assert_eq!(u(&main["unknown_frees"]), 0);
    // 3 context calls + 4×8 thread calls + 2 failing + 5 pinned + 5 VMM.
    assert_eq!(u(&main["calls"]), 47);

    // The forked worker: its own context, 32 MiB device and 8 MiB pinned,
    // a 2 TiB OOM, and an exit holding both.
    let worker = r["gpu"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| u(&p["pid"]) != root)
        .expect("the worker's ledger");
    assert_eq!(u(&worker["parent"]), root);
    assert_eq!(worker["worker_init"], true, "a worker initialised CUDA");
    assert_eq!(worker["parent_had_context"], true);
    assert_eq!(u(&worker["contexts"]), 1);
    assert_eq!(worker["context_list"][0]["call"], "cuCtxCreate");
    assert_eq!(kind(worker, "device"), (32, 0, 32, 32, 32));
    assert_eq!(kind(worker, "pinned"), (8, 0, 8, 8, 8));
    // Each context costs host memory: the stand-in touches 16 MiB in cuInit
    // and 64 MiB per context; measured from the memory records, which move
    // in steps of the RSS threshold (4 MiB).
    for p in [main, worker] {
        let host = u(&p["context_list"][0]["host_kb"]) / 1024;
        assert!((72..=88).contains(&host), "context host memory {host} MiB");
    }

    let ooms = r["gpu"]["cuda_ooms"].as_array().expect("cuda_ooms");
    assert_eq!(ooms.len(), 2, "{ooms:#?}");
    assert_eq!(u(&ooms[0]["pid"]), root);
    assert_eq!(ooms[0]["call"], "cuMemAlloc");
    assert_eq!(u(&ooms[0]["requested_bytes"]), 1 << 40);
    assert_eq!(u(&ooms[0]["error"]), 2);
    assert!(ooms[0]["time"].is_string() && ooms[0]["time_s"].is_number());
    // After the threads: 160 MiB of device memory and 4 managed.
    assert_eq!(u(&ooms[0]["held"]["device_bytes"]) / MIB, 160);
    assert_eq!(u(&ooms[0]["held"]["managed_bytes"]) / MIB, 4);
    assert_eq!(u(&ooms[1]["pid"]), u(&worker["pid"]));
    assert_eq!(ooms[1]["call"], "cuMemAllocAsync");
    assert_eq!(u(&ooms[1]["requested_bytes"]), 2 << 40);
    assert_eq!(u(&ooms[1]["held"]["device_bytes"]) / MIB, 32);
    // Who held device memory when the worker ran out: the root, then it.
    let holders: Vec<(u64, u64)> = ooms[1]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (u(&h["pid"]), u(&h["device_bytes"]) / MIB))
        .collect();
    assert_eq!(holders, vec![(root, 160), (u(&worker["pid"]), 32)]);

    assert_eq!(u(&r["gpu"]["lost_events"]), 0);
    assert_eq!(u(&r["gpu"]["lost"]["read_failed"]), 0);
}

#[test]
fn stand_in_cuda_ledger_is_exact_and_nvml_sees_the_contexts() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-ledger");
    let s = build(&dir);
    let rec = dir.path("gpu.rec");
    let libcuda = s.libcuda.to_str().unwrap();
    let out = record_env(
        &rec,
        &[
            ("TRAINBPF_LIBCUDA", libcuda),
            // NVML by its soname, as on a real machine.
            ("LD_LIBRARY_PATH", s.lib.to_str().unwrap()),
            ("STANDIN_GPU_DIR", s.gpu_dir.to_str().unwrap()),
        ],
        &[s.job.to_str().unwrap(), libcuda],
    );
    assert_eq!(out.status.code(), Some(0), "the job checks every return");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("GPU: 1 libcuda file(s) probed, NVML sampled"),
        "{stderr}"
    );
    assert!(
        stderr.contains("CUDA OOM: pid"),
        "the verdict names CUDA OOMs: {stderr}"
    );

    let r = report_json(&rec);
    assert_ledger(&r);
    let g = &r["gpu"];
    let attach = &g["attach"][0];
    assert_eq!(attach["found_by"], "env");
    // 22 of the 23 symbols: the stand-in, like drivers before CUDA 12.5,
    // has no cuCtxCreate_v4, which is skipped and said.
    assert_eq!(u(&attach["attached"]), 22);
    assert_eq!(attach["missing"], serde_json::json!(["cuCtxCreate_v4"]));

    // NVML's figure is the device memory plus 300 MiB per context (what the
    // stand-in reports, as a real GPU shows a context's overhead): the
    // comparison shows exactly that difference.
    let root = u(&r["job"]["pid"]);
    let main = gpu_proc(&r, root);
    let nvml = &main["nvml"];
    assert!(u(&nvml["samples"]) >= 1, "{main:#}");
    assert_eq!(u(&nvml["ledger_bytes"]) / MIB, 160);
    assert_eq!(u(&nvml["last_bytes"]) / MIB, 460);
    assert_eq!(nvml["difference_bytes"].as_i64().unwrap(), 300 << 20);
    assert_eq!(u(&g["nvml"]["devices"][0]["total_bytes"]), 80 << 30);
    let nvml_src = g["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "nvml")
        .unwrap();
    assert_eq!(nvml_src["used"], true, "{nvml_src}");
    // Kernel kprobes are absent here: said, and the programs still loaded.
    for s in g["sources"].as_array().unwrap() {
        if s["source"].as_str().unwrap().starts_with("kprobe:") {
            eprintln!("{s}");
            assert!(
                s["used"] == true || s["detail"].as_str().unwrap().contains("verifier"),
                "{s}"
            );
        }
    }

    // The text report puts it on one timeline with the host RSS.
    let t = report_text(&rec);
    eprintln!("{t}");
    assert!(t.contains("GPU and pinned host memory"), "{t}");
    assert!(
        t.contains("worker process(es), not the job's root, initialised CUDA"),
        "{t}"
    );
    assert!(
        t.contains("asked cuMemAlloc for 1 TiB and got CUDA_ERROR_OUT_OF_MEMORY (2)"),
        "{t}"
    );
    assert!(t.contains("exited holding memory: freed with it"), "{t}");
    assert!(t.contains("+300 MiB"), "NVML minus the probes: {t}");
}

#[test]
fn a_library_loaded_later_is_found_in_the_job_maps() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-maps");
    let s = build(&dir);
    let rec = dir.path("maps.rec");
    let libcuda = s.libcuda.to_str().unwrap();
    // No TRAINBPF_LIBCUDA: the recorder only learns of the library when the
    // job maps it. The hold at the mapping is turned off and the attach put
    // off past the scan (every second), which the job waits for before its
    // first call: the scan, the safety net for a mapping whose record was
    // lost, finds it (gpu/late.rs has the hold).
    let out = record_env(
        &rec,
        &[
            ("CUDA_JOB_WAIT_MS", "2500"),
            ("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS", "5000"),
            ("STANDIN_GPU_DIR", s.gpu_dir.to_str().unwrap()),
        ],
        &[s.job.to_str().unwrap(), libcuda],
    );
    assert_eq!(out.status.code(), Some(0));
    let r = report_json(&rec);
    let attach = r["gpu"]["attach"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["found_by"] == "maps")
        .unwrap_or_else(|| panic!("not found through the maps: {:#}", r["gpu"]["attach"]));
    assert_eq!(u(&attach["pid"]), u(&r["job"]["pid"]));
    assert!(
        attach["path"]
            .as_str()
            .unwrap()
            .ends_with("/lib/libcuda.so.1"),
        "{attach}"
    );
    assert_ledger(&r);
    // The window, closed by the scan, with no call in it.
    let late = r["gpu"]["late"].as_array().unwrap();
    assert_eq!(late.len(), 1, "{late:#?}");
    assert_eq!(late[0]["held"], false);
    assert_eq!(u(&late[0]["calls"]), 0);
    assert!(
        late[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("maps scan")),
        "{late:#?}"
    );
}

#[test]
fn nvml_missing_is_said_and_xid_lines_are_recorded() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-xid");
    let rec = dir.path("xid.rec");
    let line =
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
    let script = format!("echo '{line}' > /dev/kmsg; sleep 0.3");
    let out = record_env(
        &rec,
        &[("TRAINBPF_LIBNVML", "/nonexistent/libnvidia-ml.so.1")],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NVML unavailable"), "{stderr}");
    assert!(stderr.contains("NVIDIA Xid error(s): 79"), "{stderr}");

    let r = report_json(&rec);
    let g = &r["gpu"];
    let nvml = g["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "nvml")
        .expect("the NVML source is reported");
    assert_eq!(nvml["used"], false);
    assert!(
        nvml["detail"]
            .as_str()
            .unwrap()
            .contains("could not be loaded"),
        "{nvml}"
    );
    assert_eq!(u(&g["nvml"]["samples"]), 0);
    let xid = g["xid"].as_array().expect("xid");
    assert_eq!(xid.len(), 1, "{xid:#?}");
    let x = &xid[0];
    assert_eq!(u(&x["code"]), 79);
    assert_eq!(x["pci"], "0000:3b:00");
    assert_eq!(u(&x["pid"]), 1234);
    assert_eq!(x["name"], "python3");
    assert_eq!(x["msg"], "GPU has fallen off the bus.");
    assert_eq!(x["source"], "printk");
    assert!(x["time"].is_string());
    let t = report_text(&rec);
    assert!(
        t.contains("Xid 79 on 0000:3b:00, pid 1234 (python3): GPU has fallen off the bus."),
        "{t}"
    );
}

/// The line of `marker`'s comment in tests/gpu/cuda_stacks.c.
fn stacks_line(marker: &str) -> u64 {
    let text = std::fs::read_to_string(gpu_src("cuda_stacks.c")).unwrap();
    text.lines()
        .position(|l| l.contains(&format!("/* {marker} */")))
        .unwrap() as u64
        + 1
}

/// Whether a GPU stack names `function` at tests/gpu/cuda_stacks.c:`line`.
fn names(stack: &Value, function: &str, line: u64) -> bool {
    stack["frames"].as_array().unwrap().iter().any(|f| {
        f["function"] == function
            && f["file"]
                .as_str()
                .is_some_and(|s| s.ends_with("cuda_stacks.c"))
            && f["line"].as_u64() == Some(line)
    })
}

/// `record --stacks`: each CUDA allocation's stack is taken as the driver
/// call returns to its caller, and its bytes added under it. The stand-in
/// is built without frame pointers, as a driver may be: its entry points
/// do not begin `push %rbp`, where a stack taken at the entry would miss
/// the immediate caller (`alloc_here`).
#[test]
fn gpu_allocation_stacks_name_the_allocating_line() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-stacks");
    let lib = dir.path("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let libcuda = lib.join("libcuda.so.1");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    cc(&[
        "-shared",
        "-fPIC",
        "-fomit-frame-pointer",
        "-o",
        &s(&libcuda),
        &s(&gpu_src("standin_cuda.c")),
        "-lpthread",
    ]);
    let job = dir.path("cuda_stacks");
    cc(&[
        "-O0",
        "-g",
        "-fno-omit-frame-pointer",
        "-o",
        &s(&job),
        &s(&gpu_src("cuda_stacks.c")),
        &s(&libcuda),
        &format!("-Wl,-rpath,{}", s(&lib)),
    ]);
    let rec = dir.path("gpu.rec");
    let out = Command::new(bin())
        .args(["record", "-q", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(&job)
        .env("TRAINBPF_LIBCUDA", &libcuda)
        .env_remove("TRAINBPF_LIBNVML")
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .output()
        .expect("running trainbpf record");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "the job checks every return");

    let r = report_json(&rec);
    let p = gpu_proc(&r, u(&r["job"]["pid"]));
    let stacks = p["stacks"].as_array().expect("gpu.processes[].stacks");
    eprintln!("{:#}", p["stacks"]);
    // Heaviest first: alloc_here's three 8 MiB calls, then pin_here's one.
    let top = &stacks[0];
    assert_eq!(u(&top["bytes"]), 24 * MIB, "{top:#}");
    assert_eq!(u(&top["count"]), 3, "{top:#}");
    assert_eq!(u(&top["kb"]), 24 * 1024);
    assert!(names(top, "alloc_here", stacks_line("ALLOC")), "{top:#}");
    assert!(!names(top, "pin_here", stacks_line("PIN")), "{top:#}");
    let pin = stacks
        .iter()
        .find(|s| names(s, "pin_here", stacks_line("PIN")))
        .unwrap_or_else(|| panic!("no stack names pin_here: {stacks:#?}"));
    assert_eq!((u(&pin["bytes"]), u(&pin["count"])), (4 * MIB, 1));
    // Only allocations: the context calls take no stack.
    let total: u64 = stacks.iter().map(|s| u(&s["bytes"])).sum();
    assert_eq!(total, 28 * MIB, "{stacks:#?}");

    // The text report shows them under the GPU section.
    let t = report_text(&rec);
    eprintln!("{t}");
    assert!(
        t.contains("Where the CUDA allocations were asked for"),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "cuda_stacks.c:{} in alloc_here",
            stacks_line("ALLOC")
        )),
        "{t}"
    );
}

/// A Python job that calls the driver through ctypes from `alloc_here()`.
const CUDA_PY: &str = r#"import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
# Time for the recorder to locate this interpreter (at its first stacks).
time.sleep(1.5)
ctx = ctypes.c_void_p()
assert lib.cuInit(0) == 0
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0

def alloc_here(n):
    p = ctypes.c_ulonglong()
    assert lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0  # @alloc
    return p.value

for _ in range(2):
    alloc_here(16 << 20)
time.sleep(2.5)
"#;

/// `record --stacks` on a Python job: the GPU allocation's stack names the
/// Python function and line that asked, read from the interpreter.
#[test]
fn gpu_allocation_stacks_name_the_python_line() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-stacks-py");
    let s = build(&dir);
    let script = dir.path("cuda_job.py");
    std::fs::write(&script, CUDA_PY).unwrap();
    let line = CUDA_PY
        .lines()
        .position(|l| l.contains("# @alloc"))
        .unwrap() as u64
        + 1;
    let rec = dir.path("gpu.rec");
    let libcuda = s.libcuda.to_str().unwrap();
    let out = Command::new(bin())
        .args(["record", "-q", "-o"])
        .arg(&rec)
        .arg("--")
        .args([python(), script.to_str().unwrap(), libcuda])
        .env("TRAINBPF_LIBCUDA", libcuda)
        .env_remove("TRAINBPF_LIBNVML")
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .output()
        .expect("running trainbpf record");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    let r = report_json(&rec);
    let p = gpu_proc(&r, u(&r["job"]["pid"]));
    let top = &p["stacks"][0];
    eprintln!("{top:#}");
    assert_eq!(
        (u(&top["bytes"]), u(&top["count"])),
        (32 * MIB, 2),
        "{top:#}"
    );
    let py = top["frames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "python")
        .unwrap_or_else(|| panic!("no Python frame: {top:#}"));
    assert_eq!(py["function"], "alloc_here", "{top:#}");
    assert!(
        py["file"].as_str().unwrap().ends_with("cuda_job.py"),
        "{py}"
    );
    assert_eq!(u(&py["line"]), line, "{py}");
}
