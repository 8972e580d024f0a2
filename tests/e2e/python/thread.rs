//! A leak in a background `threading.Thread`, recorded without flags:
//! the heaviest growth stack names the thread's own line, and the
//! victim's stack at death is the allocating thread's.

use crate::support::*;

const THREAD_LEAK: &str = r#"
import threading, time
keep = []
def leak_in_thread():
    while True:
        keep.append(b"t" * (1 << 20))
        time.sleep(0.002)
threading.Thread(target=leak_in_thread, daemon=True).start()
while True:
    time.sleep(1)
"#;

fn has(frames: &serde_json::Value, function: &str) -> bool {
    frames.as_array().is_some_and(|f| {
        f.iter()
            .any(|f| f["kind"] == "python" && f["function"] == function)
    })
}

#[test]
fn a_leak_in_a_thread_names_the_threads_line() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("py-thread");
    let rec = dir.path("t.rec");
    let out = record(
        &rec,
        &["-q", "--memory-limit", "128M"],
        &[python(), "-c", THREAD_LEAK],
    );
    assert_eq!(out.status.code(), Some(137), "the leak runs into the limit");
    let r = report_json(&rec);
    let k = job_kill(&r);
    let heavy = &k["growers"][0]["stacks"][0];
    eprintln!("heaviest stack: {heavy}");
    assert!(has(&heavy["frames"], "leak_in_thread"), "{heavy}");
    assert!(u(&heavy["kb"]) >= 64 << 10, "{heavy}");
    let d = &k["victim"]["stack_at_death"];
    eprintln!("at death: {d}");
    assert_eq!(d["trigger"], true, "the allocating thread is shown: {d}");
    assert!(has(&d["frames"], "leak_in_thread"), "{d}");
    assert_ne!(
        u(&d["tid"]),
        u(&k["victim"]["pid"]),
        "not the main thread: {d}"
    );
}
