//! Python frames in growth stacks (`record --stacks`), end to end: a
//! script leaks a fresh 4 MiB bytearray per `leak_step()` into a global
//! list under a memory limit until the kernel kills it. The top grower's
//! heaviest stack names `leak_step`, its file and line (a Python frame,
//! walked in the kernel), then the loop's function, with the interpreter's
//! own C frames folded away. Run on every CPython here from 3.9; one the
//! recorder cannot read (3.8) says why on its stacks.

use std::{path::PathBuf, process::Command};

use crate::support::*;
use serde_json::Value;

const LEAK: &str = r#"import time

HELD = []


def leak_step():
    HELD.append(bytearray(4 << 20))  # @leak


def run():
    while True:  # @loop
        leak_step()  # @run
        time.sleep(0.01)  # @sleep


run()  # @main
"#;

fn line_of(tag: &str) -> u64 {
    let marker = format!("# @{tag}");
    LEAK.lines()
        .position(|l| l.ends_with(&marker))
        .map(|i| i as u64 + 1)
        .unwrap_or_else(|| panic!("no {marker}"))
}

/// The image's python3 (Debian's 3.11, the interpreter linked into the
/// executable) and pyenv's builds (a libpython3.x.so each), by minor.
fn pythons(minors: std::ops::RangeInclusive<u32>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if minors.contains(&11) {
        out.push(PathBuf::from("/usr/bin/python3"));
    }
    if let Ok(rd) = std::fs::read_dir("/root/.pyenv/versions") {
        let mut more: Vec<(u32, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().into_owned();
                let minor: u32 = v.strip_prefix("3.")?.split('.').next()?.parse().ok()?;
                let bin = e.path().join(format!("bin/python3.{minor}"));
                (minors.contains(&minor) && bin.exists()).then_some((minor, bin))
            })
            .collect();
        more.sort();
        out.extend(more.into_iter().map(|(_, b)| b));
    }
    out
}

fn frames_text(stack: &Value) -> String {
    stack["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            format!(
                "[{}] {}:{} in {}",
                f["kind"].as_str().unwrap_or("?"),
                f["file"],
                f["line"],
                f["function"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n    ")
}

/// Records the leak under `python`; returns the top grower's stacks, the
/// recording's text report (`report --stacks`) and the victim.
fn leak_under(dir: &TempDir, python: &str, tag: &str) -> (Value, String, Value) {
    let script = dir.path(&format!("leak_{tag}.py"));
    std::fs::write(&script, LEAK).unwrap();
    let rec = dir.path(&format!("{tag}.rec"));
    let out = record(
        &rec,
        &["--memory-limit", "200M", "-q"],
        &[python, script.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed"), "{python}: no kill: {stderr}");
    let r = report_json(&rec);
    let top = job_kill(&r)["growers"][0].clone();
    let victim = job_kill(&r)["victim"].clone();
    let text = Command::new(bin())
        .args(["report", "--only=stacks"])
        .arg(&rec)
        .output()
        .unwrap();
    (
        top,
        String::from_utf8_lossy(&text.stdout).into_owned(),
        victim,
    )
}

/// What is wrong with the victim's stack at death: the thread that was
/// allocating, killed (SIGKILL) inside `leak_step` called from `run`.
fn check_death(victim: &Value, text: &str) -> Result<(), String> {
    let d = &victim["stack_at_death"];
    if d.is_null() {
        return Err(format!("no stack at death: {}", victim["stack_error"]));
    }
    let shown = frames_text(d);
    eprintln!(
        "at death (tid {}, error {}):\n    {shown}",
        d["tid"], d["error"]
    );
    if d["signal"] != 9 || d["trigger"] != true {
        return Err(format!("not the allocating thread's SIGKILL: {d}"));
    }
    let py: Vec<&Value> = d["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "python")
        .collect();
    let names: Vec<&str> = py.iter().filter_map(|f| f["function"].as_str()).collect();
    let lines: Vec<Option<u64>> = py.iter().map(|f| f["line"].as_u64()).collect();
    let module = (names.last(), lines.last());
    if module != (Some(&"<module>"), Some(&Some(line_of("main")))) {
        return Err(format!(
            "the stack at death does not start at <module>:{}:\n    {shown}",
            line_of("main")
        ));
    }
    // Most of what the thread does is leak_step's memset, where the kill
    // mostly lands. Near the limit, though, reclaim also evicts the
    // interpreter's own code pages, and the fault that reads one back in
    // can be the one the kill answers: a thread killed between two
    // leak_step calls, in run's loop, has a true stack at death too, and
    // then no frame of the memset.
    let in_leak = names.first() == Some(&"leak_step")
        && lines.first() == Some(&Some(line_of("leak")))
        && names.get(1) == Some(&"run")
        && lines.get(1) == Some(&Some(line_of("run")));
    let in_loop = names.first() == Some(&"run")
        && names.len() == 2
        && lines
            .first()
            .copied()
            .flatten()
            .is_some_and(|l| (line_of("loop")..=line_of("sleep")).contains(&l))
        && !shown.contains("memset");
    if !in_leak && !in_loop {
        return Err(format!(
            "the stack at death is neither leak_step:{} <- run:{} nor run's loop:\n    {shown}",
            line_of("leak"),
            line_of("run")
        ));
    }
    if !text.contains("The victim's stack at death") {
        return Err(format!("the text report lacks the stack at death:\n{text}"));
    }
    Ok(())
}

/// What is wrong with the leak's heaviest stack under one interpreter.
fn check_leak(top: &Value, text: &str) -> Result<(), String> {
    if top["victim"] != true {
        return Err(format!("the top grower is not the victim: {top}"));
    }
    let stacks = top["stacks"].as_array().ok_or("no growers[].stacks")?;
    let heavy = stacks.first().ok_or("no stacks")?;
    let shown = frames_text(heavy);
    eprintln!("heaviest: {} kB\n    {shown}", heavy["kb"]);
    let frames = heavy["frames"].as_array().unwrap();
    let py: Vec<&Value> = frames.iter().filter(|f| f["kind"] == "python").collect();
    let first = py.first().ok_or(format!("no Python frame:\n    {shown}"))?;
    if first["function"] != "leak_step"
        || !first["file"].as_str().is_some_and(|f| f.ends_with(".py"))
        || first["line"].as_u64() != Some(line_of("leak"))
    {
        return Err(format!(
            "the innermost Python frame is not leak_step:{}:\n    {shown}",
            line_of("leak")
        ));
    }
    if py.get(1).map(|f| (&f["function"], f["line"].as_u64()))
        != Some((&"run".into(), Some(line_of("run"))))
    {
        return Err(format!(
            "leak_step's caller is not run:{}:\n    {shown}",
            line_of("run")
        ));
    }
    // The interpreter's own C frames are folded away: nothing of the
    // interpreter's file comes after the Python frames.
    let last_py = frames.iter().rposition(|f| f["kind"] == "python").unwrap();
    if last_py + 1 != frames.len() {
        return Err(format!("native frames after the Python ones:\n    {shown}"));
    }
    // The leak is most of what grew (200 MiB limit).
    let kb = u(&heavy["kb"]);
    if kb < 100 << 10 {
        return Err(format!("leak_step's stack holds only {kb} kB"));
    }
    let want = format!(":{} in leak_step", line_of("leak"));
    if !text.contains(&want) {
        return Err(format!("report --stacks lacks {want:?}:\n{text}"));
    }
    Ok(())
}

#[test]
fn the_python_leak_names_leak_step_on_every_cpython() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pygrowth");
    let mut results = Vec::new();
    for py in pythons(9..=13) {
        let tag = py.to_string_lossy().replace('/', "_");
        let (top, text, victim) = leak_under(&dir, py.to_str().unwrap(), &tag);
        let r = check_leak(&top, &text).and_then(|()| {
            let full = Command::new(bin())
                .arg("report")
                .arg(dir.path(&format!("{tag}.rec")))
                .output()
                .unwrap();
            check_death(&victim, &String::from_utf8_lossy(&full.stdout))
        });
        eprintln!(
            "{}: {}",
            py.display(),
            r.as_ref().map_or_else(|e| e.as_str(), |()| "pass")
        );
        results.push((py, r));
    }
    let failed: Vec<_> = results
        .iter()
        .filter_map(|(p, r)| r.as_ref().err().map(|e| format!("{}: {e}", p.display())))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    assert!(!results.is_empty());
}

/// An interpreter the recorder cannot read (3.8: no offsets for it) keeps
/// its native frames, and every stack says why it has no Python ones. On
/// a machine without a 3.8 this checks nothing.
#[test]
fn an_unreadable_interpreter_says_why() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pyunreadable");
    for py in pythons(8..=8) {
        let (top, _, _) = leak_under(&dir, py.to_str().unwrap(), "py38");
        // The job's first process is the recorder's own launcher until it
        // execs the interpreter: a stack its start-up took (under 1 MiB)
        // cannot be named after the exec, and says so instead. The
        // interpreter's own stacks are the ones this is about.
        let stacks: Vec<&Value> = top["stacks"]
            .as_array()
            .expect("growers[].stacks")
            .iter()
            .filter(|s| {
                !s["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("taken before an exec"))
            })
            .collect();
        assert!(!stacks.is_empty(), "{top}");
        for s in stacks {
            let e = s["error"].as_str().unwrap_or("");
            assert!(
                e.contains("Python frames not read") && e.contains("3.8"),
                "{}: {s}",
                py.display()
            );
            assert!(
                s["frames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|f| f["kind"] == "native")
            );
        }
    }
}

/// A process the recorder takes for a CPython (it has `_PyRuntime` and
/// `Py_Version` symbols) whose version word and runtime state lie on a
/// page the process mapped over from a file on a FUSE filesystem that
/// never answers: the recorder's first read of it, locating the
/// interpreter or walking its threads, would wait for good, past a kill. It then grows, so that its growth stacks are named
/// (and the interpreter looked for), and waits for the test's word.
const FUSE_PY_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The version and the runtime state on a page of their own, which
   nothing here reads: whether the recorder locates the interpreter
   before the page is mapped over (from the version it reads then) or
   after, its next read of that page is one of the file on FUSE. */
struct pypage {
    unsigned int version;
    char pad[60];
    char runtime[2048];
    char rest[4096 - 64 - 2048];
};
/* One whole page, laid out here rather than by the compiler, so that
   nothing of the program's own (its .bss, read at exit) shares it. */
__attribute__((used, aligned(4096), section(".pyversion")))
struct pypage pypage = {0x030b07f0, {0}, {0}, {1}};
__asm__(".globl Py_Version\n.type Py_Version, @object\n.size Py_Version, 4\n"
        ".set Py_Version, pypage\n"
        ".globl _PyRuntime\n.type _PyRuntime, @object\n.size _PyRuntime, 2048\n"
        ".set _PyRuntime, pypage + 64\n");

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    void *page = &pypage;
    if (mmap(page, 4096, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (int i = 0; i < 48; i++) {
        char *p = malloc(1 << 20);
        memset(p, i, 1 << 20);
        usleep(20000);
    }
    while (access(argv[2], F_OK) != 0)
        usleep(50000);
    return 0;
}
"#;

// A process's CPython state on a page of a FUSE file, read through
// /proc/PID/mem, waits for the filesystem's server for good: on the
// thread that drains the rings it stopped the recording (and the recorder
// could not be killed until the filesystem went).
#[test]
fn an_interpreter_on_fuse_is_not_read_and_the_recording_goes_on() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pyfuse");
    let src = dir.path("fakepy.c");
    std::fs::write(&src, FUSE_PY_C).unwrap();
    let exe = dir.path("fakepy");
    cc(&["-o", exe.to_str().unwrap(), src.to_str().unwrap()]);
    let (rec, go) = (dir.path("fuse.rec"), dir.path("go"));
    // The filesystem goes before the recorder is waited for, however the
    // test ends (dropped first: declared after it): a read stuck on it
    // ends only when it goes.
    let mut recorder;
    let fs = StallFs::mount(&dir.path("stall"));
    recorder = Recorder(
        std::process::Command::new(bin())
            .arg("record")
            .arg("-o")
            .arg(&rec)
            .args(["-q", "--"])
            .arg(&exe)
            .arg(fs.file())
            .arg(&go)
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("starting trainbpf record"),
    );
    // Loading the probes takes a few seconds, then the job grows for one.
    std::thread::sleep(std::time::Duration::from_secs(6));
    std::fs::write(&go, b"").unwrap();
    let ended = std::time::Instant::now();
    let status = loop {
        if let Some(s) = recorder.0.try_wait().unwrap() {
            break Some(s);
        }
        if ended.elapsed() > std::time::Duration::from_secs(30) {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let reads = fs.reads();
    eprintln!(
        "the filesystem got {reads} reads; the recorder {}",
        match status {
            Some(s) => format!(
                "ended {:.1} s after the job: {s}",
                ended.elapsed().as_secs_f64()
            ),
            None => "had not ended 30 s after the job".into(),
        }
    );
    if status.is_none() {
        // Its read ends only when the filesystem goes; then the job, which
        // waited behind it for its own memory map, can end too.
        drop(fs);
        drop(recorder);
        panic!(
            "the recorder did not end with the job: its read of the job's memory never came back"
        );
    }
    drop(fs);
    assert_eq!(reads, 0, "nothing read the page on FUSE");
    let r = report_json(&rec);
    let p = procs(&r)
        .iter()
        .find(|p| p["comm"] == "fakepy")
        .unwrap_or_else(|| panic!("no fakepy process: {}", r["processes"]));
    let errors: Vec<String> = p["stacks"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|s| s["error"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    eprintln!("its stacks say: {errors:#?}");
    let j = &r["job_reads"];
    eprintln!("job_reads: {j}");
    // The recorder may locate the interpreter in the moment between the
    // exec and the remap (from the version then on the job's own page):
    // the kernel's walk of its threads then faults on the page, which
    // nothing reads in, and the stacks say so. Otherwise the look-up
    // itself finds the page on FUSE, skips it, counts it and says why.
    let skipped = errors
        .iter()
        .any(|e| e.contains("lies on a fuse filesystem") && e.contains("not read"));
    let faulted = errors
        .iter()
        .any(|e| e.contains("thread states could not be read"));
    assert!(
        skipped || faulted,
        "a stack says its Python frames were not read, and why: {p}"
    );
    if skipped {
        assert!(
            u(&j["fuse_skipped"]) >= 1,
            "the skipped read is counted: {j}"
        );
    }
}
