//! The victim's stack at death (`record --stacks`) of a process with two
//! threads: one grows through `grow_here()` until the OOM kill, one
//! waits in `wait_here()` called from `sleeper()`. Each thread's stack is
//! taken as it dequeues the SIGKILL, in its own context: the allocating
//! one is the one shown, named down to `grow_here`; the other is among
//! `threads`, in `sleeper`.

use std::process::Command;

use crate::support::*;
use serde_json::Value;

const THREADS_C: &str = r#"#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) void wait_here(void) { pause(); }

__attribute__((noinline)) void *sleeper(void *arg) {
    for (;;)
        wait_here();
    return arg;
}

__attribute__((noinline)) char *grow_here(size_t n) {
    char *p = malloc(n);
    for (size_t i = 0; i < n; i += 4096)
        p[i] = 1;
    return p;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    usleep(100000);
    for (;;) {
        grow_here(1 << 20);
        usleep(5000);
    }
}
"#;

/// Writes `src` as `NAME.c` in `dir` and builds it with debug info and
/// frame pointers (and threads), as each test's program is.
fn build(dir: &TempDir, name: &str, src: &str) -> std::path::PathBuf {
    let c = dir.path(&format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let exe = dir.path(name);
    let cc = Command::new("/usr/bin/cc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&exe)
        .arg(&c)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

fn names(frames: &Value) -> Vec<String> {
    frames
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[test]
fn each_thread_of_the_victim_is_taken_at_death() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("death");
    let exe = build(&dir, "threads", THREADS_C);
    let rec = dir.path("d.rec");
    let out = record(
        &rec,
        &["--memory-limit", "64M", "-q"],
        &[exe.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed"), "no kill: {stderr}");
    let r = report_json(&rec);
    let v = &job_kill(&r)["victim"];
    let d = &v["stack_at_death"];
    assert!(!d.is_null(), "no stack at death: {}", v["stack_error"]);
    eprintln!("at death: {d}");
    // The allocating thread (the main one) is shown.
    assert_eq!(d["trigger"], true, "{d}");
    assert_eq!(u(&d["tid"]), u(&v["pid"]), "{d}");
    let main = names(&d["frames"]);
    assert_eq!(
        main.first().map(String::as_str),
        Some("grow_here"),
        "{main:?}"
    );
    assert!(main.iter().any(|f| f == "main"), "{main:?}");
    // The other thread, in its own context.
    let threads = d["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{d}");
    assert_ne!(threads[0]["tid"], d["tid"]);
    let other = names(&threads[0]["frames"]);
    assert!(
        other.iter().any(|f| f == "sleeper" || f == "wait_here"),
        "the waiting thread's stack: {other:?} ({})",
        threads[0]["error"]
    );
    // The text report shows it under the kill.
    let text = Command::new(bin())
        .arg("report")
        .arg(&rec)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("The victim's stack at death") && text.contains("in grow_here"),
        "{text}"
    );
}

const CRASH_C: &str = r#"#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) void grow_here(size_t n) { memset(malloc(n), 1, n); }

__attribute__((noinline)) void crash_here(void) { *(volatile int *)0 = 1; }

int main(void) {
    grow_here(8 << 20);
    sleep(2);
    crash_here();
    return 0;
}
"#;

/// Any fatal signal, not only an OOM kill: a SIGSEGV's stack at death
/// names the faulting function, in `deaths[]`.
#[test]
fn a_crash_has_its_stack_at_death() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("crash");
    let exe = build(&dir, "crash", CRASH_C);
    let rec = dir.path("c.rec");
    record(&rec, &["-q"], &[exe.to_str().unwrap()]);
    let r = report_json(&rec);
    let d = r["deaths"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["signal"] == 11)
        .unwrap_or_else(|| panic!("no SIGSEGV death: {}", r["deaths"]));
    let s = &d["stack_at_death"];
    eprintln!("at death: {s}");
    assert_eq!(s["signal"], 11, "{d}");
    let main = names(&s["frames"]);
    assert_eq!(main.first().map(String::as_str), Some("crash_here"), "{s}");
    assert!(main.iter().any(|f| f == "main"), "{main:?}");
}

const MANY_C: &str = r#"#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *waiter(void *arg) {
    for (;;)
        pause();
    return arg;
}

int main(void) {
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 << 10);
    for (int i = 0; i < 2000; i++) {
        pthread_t t;
        pthread_create(&t, &a, waiter, NULL);
    }
    for (;;) {
        memset(malloc(1 << 20), 1, 1 << 20);
        usleep(2000);
    }
}
"#;

/// A process of 2,000 threads: their stacks at death (1.6 KiB each, 3.2
/// MiB in all) are more than the precious ring's half holds at once. How
/// many fit depends on how fast the collector drains (all of them, on a
/// quiet machine, about 330 under a full test run): either way the kill
/// and the exit are recorded, and every stack is kept or counted as lost.
#[test]
fn many_threads_never_push_out_the_kill() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("many");
    let exe = build(&dir, "many", MANY_C);
    let rec = dir.path("m.rec");
    let out = record(
        &rec,
        &["--memory-limit", "128M", "-q"],
        &[exe.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed"), "no kill: {stderr}");
    let r = report_json(&rec);
    let k = job_kill(&r);
    let d = &k["victim"]["stack_at_death"];
    assert!(!d.is_null(), "{}", k["victim"]["stack_error"]);
    let kept = d["threads"].as_array().unwrap().len() as u64 + 1 + u(&d["more_threads"]);
    // `by_kind` is empty when nothing at all was lost.
    let lost_of = |kind: &str| r["lost"]["by_kind"][kind].as_u64().unwrap_or(0);
    let lost = lost_of("stack_at_death");
    eprintln!("stacks at death kept {kept}, lost {lost}");
    assert_eq!(lost_of("exit"), 0, "{}", r["lost"]);
    assert!(kept + lost >= 2001, "kept {kept} + lost {lost}");
    assert!(
        r["deaths"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["pid"] == k["victim"]["pid"] && x["signal"] == 9),
        "{}",
        r["deaths"]
    );
}

const FORKS_C: &str = r#"#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) void wait_here(void) { pause(); }

__attribute__((noinline)) void child_loop(void) {
    for (;;)
        wait_here();
}

int main(void) {
    pid_t kids[4];
    for (int i = 0; i < 4; i++)
        if ((kids[i] = fork()) == 0)
            child_loop();
    usleep(300000);
    for (int i = 0; i < 4; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
        usleep(100000);
    }
    return 0;
}
"#;

/// Forked workers killed by their parent, none exec'd: each is gone by
/// the time its stack at death is named, and never had a stack of its own
/// named. Their code is their parent's, at the same addresses: each one's
/// frames are named, the first through the parent's files, the others
/// from what that named, with no read of their own.
#[test]
fn forked_workers_killed_are_named_through_their_parent() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("forks-death");
    let exe = build(&dir, "forks", FORKS_C);
    let rec = dir.path("f.rec");
    let out = record(&rec, &["-q"], &[exe.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let r = report_json(&rec);
    let killed: Vec<&Value> = r["deaths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["signal"] == 9)
        .collect();
    assert_eq!(killed.len(), 4, "{:#}", r["deaths"]);
    for d in killed {
        let s = &d["stack_at_death"];
        let f = names(&s["frames"]);
        assert!(
            f.iter().any(|f| f == "wait_here") && f.iter().any(|f| f == "child_loop"),
            "{f:?}: {s}"
        );
    }
}
