//! A copy-on-write DataLoader-like job under `record --stacks`: a Python parent builds a large list of small objects, then forks
//! workers whose `read_batches()` only reads them. Reading a Python
//! object writes its reference count, so each worker copies the parent's
//! pages as it reads: that memory is the worker's, and its heaviest
//! growth stack must name the worker's reading function, not the parent's
//! building one (which the parent's own heaviest stack names).
//!
//! The workers' growth starts the moment they are forked, before the
//! collector has read the fork: their Python frames must be walked from
//! their first stack on.

use std::{collections::BTreeMap, path::Path};

use crate::support::*;
use serde_json::Value;

const WORKERS: usize = 3;
const ALL_ROWS: &str = "1000000";

const COW: &str = r#"import os, sys, time

ROWS = 1_000_000


def build_rows():
    return [[i, "row-%d" % i] for i in range(ROWS)]  # @build


DATA = build_rows()


def read_batches():
    total = 0
    for row in DATA[: int(sys.argv[3])]:  # @read
        total += row[0] + len(row[1])
    return total


def worker():
    read_batches()
    # A DataLoader's worker lives on after its batch; one that does not
    # is gone before its stacks are named.
    time.sleep(float(sys.argv[2]))
    os._exit(0)


pids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        worker()
    pids.append(pid)
print("parent", os.getpid(), "workers", *pids, flush=True)
for pid in pids:
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
# The trainer carries on.
time.sleep(1)
"#;

fn line_of(tag: &str) -> u64 {
    let marker = format!("# @{tag}");
    COW.lines()
        .position(|l| l.ends_with(&marker))
        .map(|i| i as u64 + 1)
        .unwrap_or_else(|| panic!("no {marker}"))
}

fn shown(stack: &Value) -> String {
    let frames = stack["frames"].as_array().unwrap();
    let f: Vec<String> = frames
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
        .collect();
    format!(
        "{} kB x{} error={}\n    {}",
        stack["kb"],
        stack["count"],
        stack["error"],
        f.join("\n    ")
    )
}

/// The innermost Python frame of a stack: (function, line).
fn innermost_py(stack: &Value) -> Option<(String, Option<u64>)> {
    let f = stack["frames"]
        .as_array()?
        .iter()
        .find(|f| f["kind"] == "python")?;
    Some((f["function"].as_str()?.to_string(), f["line"].as_u64()))
}

/// What is wrong with the job's stacks under one interpreter, its
/// workers reading `rows` rows and living `linger` seconds after.
fn check(python: &str, linger: &str, rows: &str, dir: &TempDir) -> Result<(), String> {
    let tag = format!("{}{linger}", python.replace('/', "_"));
    let script = dir.path(&format!("cow_{tag}.py"));
    std::fs::write(&script, COW).unwrap();
    let rec = dir.path(&format!("{tag}.rec"));
    let workers = WORKERS.to_string();
    let out = record(
        &rec,
        &["-q"],
        &[python, script.to_str().unwrap(), &workers, linger, rows],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("the job failed: {}\n{stdout}", out.status));
    }
    // "parent P workers A B C"
    let line = stdout
        .lines()
        .find(|l| l.starts_with("parent "))
        .ok_or(format!("the job printed no pids: {stdout}"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let parent: u64 = words[1].parse().unwrap();
    let pids: Vec<u64> = words[3..].iter().map(|w| w.parse().unwrap()).collect();
    if pids.len() != WORKERS {
        return Err(format!("{WORKERS} workers wanted: {line}"));
    }
    let r = report_json(&rec);
    let procs: BTreeMap<u64, &Value> = r["processes"]
        .as_array()
        .ok_or("no processes[]")?
        .iter()
        .map(|p| (p["pid"].as_u64().unwrap(), p))
        .collect();
    let heaviest = |pid: u64| -> Result<&Value, String> {
        let p = procs
            .get(&pid)
            .ok_or(format!("pid {pid} not in processes[]"))?;
        let s = p["stacks"]
            .as_array()
            .and_then(|s| s.first())
            .ok_or(format!("pid {pid} has no stacks"))?;
        eprintln!("{python}: pid {pid}'s heaviest stack: {}", shown(s));
        Ok(s)
    };
    let mut errors = Vec::new();
    let build = heaviest(parent)?;
    // 3.11 runs the comprehension as a function of its own
    // (`build_rows.<locals>.<listcomp>`), 3.12 inlines it.
    if !innermost_py(build)
        .is_some_and(|(f, l)| f.starts_with("build_rows") && l == Some(line_of("build")))
    {
        errors.push(format!(
            "the parent's heaviest stack is not build_rows:{}: {}",
            line_of("build"),
            shown(build)
        ));
    }
    for &pid in &pids {
        let s = heaviest(pid)?;
        if innermost_py(s) != Some(("read_batches".into(), Some(line_of("read")))) {
            errors.push(format!(
                "worker {pid}'s heaviest stack is not read_batches:{}: {}",
                line_of("read"),
                shown(s)
            ));
        }
        // Its native frames (the fault lies in the interpreter's own
        // code) are named: Debian's python3.11 is a non-PIE executable,
        // whose mappings' map_files names carry no padding.
        if let Some(e) = s["error"].as_str().filter(|e| e.contains("unsymbolized")) {
            errors.push(format!(
                "worker {pid}'s heaviest stack has no native names: {e}"
            ));
        }
        // Most of what the worker added is its copies of the parent's
        // objects, taken while it read them: in read_batches, whichever
        // of its lines and native frames (a slice's copy and the loop's
        // reads fault in different C functions, each a stack of its own).
        let stacks = procs[&pid]["stacks"].as_array().unwrap();
        let kb_of = |s: &Value| s["kb"].as_u64().unwrap_or(0);
        let total: u64 = stacks.iter().map(kb_of).sum();
        let kb: u64 = stacks
            .iter()
            .filter(|s| innermost_py(s).is_some_and(|(f, _)| f == "read_batches"))
            .map(kb_of)
            .sum();
        let least: u64 = if rows == ALL_ROWS { 30 << 10 } else { 8 << 10 };
        if kb < least || kb * 2 < total {
            errors.push(format!(
                "worker {pid}: read_batches' stacks hold {kb} kB of {total} kB"
            ));
        }
        // No stack of a worker lacks its Python frames, for want of a
        // located interpreter (the fork handed the parent's on) or of a
        // living process (named through the parent).
        for st in procs[&pid]["stacks"].as_array().unwrap() {
            let frames = st["frames"].as_array().unwrap();
            let py: Vec<&Value> = frames.iter().filter(|f| f["kind"] == "python").collect();
            if py.is_empty() || py.iter().any(|f| f["function"].is_null()) {
                errors.push(format!("worker {pid}: {}", shown(st)));
            }
            if st["error"]
                .as_str()
                .is_some_and(|e| e.contains("through the parent"))
            {
                eprintln!(
                    "{python}: worker {pid}, named through the parent: {}",
                    shown(st)
                );
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// The image's python3 (Debian's 3.11, the interpreter in the executable)
/// and a pyenv 3.12 (a `libpython3.12.so`, shim frames).
#[test]
fn cow_workers_heaviest_stack_names_their_reading_function() {
    on_each_python("1", ALL_ROWS);
}

/// Workers that read a short batch and exit at once, so that their last
/// stacks come after they are gone: those are named through the parent,
/// which still lives and maps the same code.
#[test]
fn cow_workers_gone_at_once_are_named_through_their_parent() {
    on_each_python("0", "150000");
}

fn on_each_python(linger: &str, rows: &str) {
    require_root();
    let _g = serial();
    let dir = TempDir::new(&format!("pycow{linger}"));
    let mut failed = Vec::new();
    let mut ran = 0;
    for py in [
        "/usr/bin/python3",
        "/root/.pyenv/versions/3.12.1/bin/python3",
    ] {
        if !Path::new(py).exists() {
            eprintln!("{py}: not on this machine");
            continue;
        }
        ran += 1;
        match check(py, linger, rows, &dir) {
            Ok(()) => eprintln!("{py}: pass"),
            Err(e) => failed.push(format!("{py}: {e}")),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    assert!(ran > 0, "no Python to run");
}
