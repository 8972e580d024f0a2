//! Python processes that grow at once after their exec: the job's own
//! interpreter (the kernel holds the job's first exec until the recorder
//! has located it) and interpreters it starts with `subprocess` (an exec
//! of a file the recorder located an interpreter in, described by the
//! kernel at the exec). No stack of theirs is taken "before the
//! interpreter was located", and each one's heaviest names its line.

use serde_json::Value;

use crate::support::*;

/// Grows 48 MiB in `first()` as soon as it runs, then starts three
/// children that each grow 48 MiB in `child_grows()` as soon as they run
/// and live a second more (a process gone before its stacks are named
/// has them named from what the recorder holds of it, not from its
/// memory).
const PARENT: &str = r#"
import subprocess, sys
CHILD = '''
import time
keep = []
def child_grows():
    for _ in range(48):
        keep.append(bytearray(1 << 20))
child_grows()
time.sleep(1)
'''
keep = []
def first():
    for _ in range(48):
        keep.append(bytearray(1 << 20))
first()
for _ in range(3):
    subprocess.run([sys.executable, "-c", CHILD], check=True)
"#;

/// Debian's python3, the interpreter in the executable: described at the
/// exec from the file.
#[test]
fn execd_pythons_have_their_frames_from_their_first_stack() {
    require_root();
    let _g = serial();
    check("exec-py", python());
}

/// pyenv's 3.11, a `libpython3.11.so`: found at the first walk after the
/// loader mapped it, through the loader's list (the job's root held once
/// more for its look-up there).
#[test]
fn execd_pythons_on_a_libpython_have_their_frames_from_their_first_stack() {
    require_root();
    let _g = serial();
    let py = "/root/.pyenv/versions/3.11.7/bin/python3.11";
    assert!(
        std::path::Path::new(py).exists(),
        "{py}: the test set-up installs it"
    );
    check("exec-libpy", py);
}

fn check(name: &str, py: &str) {
    let dir = TempDir::new(name);
    let rec = dir.path("e.rec");
    let out = record(&rec, &["-q"], &[py, "-c", PARENT]);
    assert!(out.status.success(), "{}", out.status);
    let r = report_json(&rec);
    let procs = r["processes"].as_array().expect("processes[]");
    let pythons: Vec<&Value> = procs
        .iter()
        .filter(|p| {
            p["stacks"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| u(&s["kb"]) >= 16 << 10))
        })
        .collect();
    assert_eq!(
        pythons.len(),
        4,
        "the job and its three children grew: {procs:?}"
    );
    // Each process's stacks, for a failure's diagnosis.
    for p in &pythons {
        for s in p["stacks"].as_array().unwrap().iter().take(6) {
            eprintln!("pid {}: {} kB, error {}", p["pid"], s["kb"], s["error"]);
        }
    }
    let mut children = 0;
    for p in pythons {
        let stacks = p["stacks"].as_array().unwrap();
        for s in stacks {
            let e = s["error"].as_str().unwrap_or("");
            assert!(
                !e.contains("not located"),
                "pid {}: a stack without its Python frames: {s}",
                p["pid"]
            );
        }
        let heavy = &stacks[0];
        let names = |f: &str| {
            heavy["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["kind"] == "python" && x["function"] == f)
        };
        if names("child_grows") {
            children += 1;
        } else {
            assert!(names("first"), "pid {}: heaviest stack {heavy}", p["pid"]);
        }
    }
    assert_eq!(children, 3);
}
