//! The kernel programs' own log (`record --ebpf-log`, aya-log).
//! A per-process map made too small for the job fills; the program that
//! found it full says so, and the message reaches stderr and the
//! recording (report text and JSON) with that program's name. Without the
//! flag the same condition logs nothing.

use std::process::Command;

use crate::support::*;

/// The record flag that sizes the kernel's per-process map (hidden: for
/// tests that fill it).
const PROC_MAP_FLAG: &str = "--proc-map-entries";

/// 48 children live at once, each touching 4 MiB and holding it until all
/// of them have: more job processes than a 16-entry map holds.
const MANY_AT_ONCE: &str = r#"
import mmap, os
N = 48
done_r, done_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for k in range(N):
    pid = os.fork()
    if pid == 0:
        os.close(done_r)
        os.close(go_w)
        m = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for i in range(0, 4 << 20, 4096):
            m[i] = 1
        os.write(done_w, b"x")
        os.read(go_r, 1)
        os._exit(0)
    kids.append(pid)
os.close(done_w)
os.close(go_r)
n = 0
while n < N:
    n += len(os.read(done_r, N - n))
os.close(go_w)
for p in kids:
    os.waitpid(p, 0)
"#;

/// The programs that can find `PROCS` full for a job process.
const PROGRAMS: &[&str] = &[
    "page_alloc",
    "page_free",
    "cache_add",
    "cache_del",
    "sched_fork",
    "rss_stat",
];

/// What the 16-entry map's message says (`procs.rs`, `count_full`).
const FULL: &str = "PROCS full (16 entries): job process ";

fn report_text(rec: &std::path::Path) -> String {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .arg("--no-color")
        .output()
        .expect("running trainbpf report");
    assert!(out.status.success(), "report failed: {}", out.status);
    String::from_utf8(out.stdout).unwrap()
}

/// The pid a "PROCS full" message names.
fn pid_named(message: &str) -> u64 {
    let rest = &message[message.find(FULL).expect(message) + FULL.len()..];
    rest.split(' ').next().unwrap().parse().expect(message)
}

#[test]
fn a_full_process_map_is_logged_with_its_program() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("ebpflog");
    let rec = dir.path("on.rec");
    let out = record(
        &rec,
        &["-q", "--ebpf-log", PROC_MAP_FLAG, "16"],
        &[python(), "-c", MANY_AT_ONCE],
    );
    assert!(out.status.success(), "record failed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r = report_json(&rec);
    let full_count = u(&r["lost"]["proc_map_full"]);
    assert!(full_count > 0, "48 live job processes fit a 16-entry map?");
    assert!(
        r["recording"]["attach"]["ebpf_log"].is_string(),
        "{:#}",
        r["recording"]["attach"]
    );

    // stderr: "trainbpf: kernel PROGRAM warn: PROCS full (16 entries): ..."
    let on_stderr: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("trainbpf: kernel ") && l.contains(FULL))
        .collect();
    eprintln!(
        "FIGURES {} PROCS-full messages on stderr for {full_count} counted; first: {:?}",
        on_stderr.len(),
        on_stderr.first()
    );
    assert!(!on_stderr.is_empty(), "no message on stderr");
    for l in &on_stderr {
        let prog = l["trainbpf: kernel ".len()..].split(' ').next().unwrap();
        assert!(PROGRAMS.contains(&prog), "{l}");
        assert!(l.contains(" warn: "), "{l}");
    }

    // The recording: the same messages, each with its program and site.
    let log = &r["ebpf_log"];
    assert_eq!(log["enabled"], true);
    let msgs: Vec<&serde_json::Value> = log["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["message"].as_str().unwrap().contains(FULL))
        .collect();
    assert_eq!(
        msgs.len(),
        on_stderr.len(),
        "stderr and the recording disagree"
    );
    // Each site logs its 1st, 2nd, 4th... time per CPU: never more than
    // the counter that counts every one.
    assert!(
        msgs.len() as u64 <= full_count,
        "{} > {full_count}",
        msgs.len()
    );
    let job_pids: Vec<u64> = deaths(&r).iter().map(|d| u(&d["pid"])).collect();
    for m in &msgs {
        let prog = m["program"].as_str().unwrap();
        assert!(PROGRAMS.contains(&prog), "{m}");
        assert_eq!(m["level"], "warn", "{m}");
        assert!(m["site"].as_str().unwrap().contains("procs.rs:"), "{m}");
        // The process it could not track is one of the job's.
        let pid = pid_named(m["message"].as_str().unwrap());
        assert!(job_pids.contains(&pid), "pid {pid} is not the job's: {m}");
    }

    let text = report_text(&rec);
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Kernel programs' log (--ebpf-log): "))
        .take_while(|l| !l.is_empty())
        .collect();
    eprintln!("FIGURES text: {section:?}");
    assert!(
        section
            .iter()
            .any(|l| l.contains(FULL) && PROGRAMS.iter().any(|p| l.contains(&format!(" {p}: ")))),
        "the text report does not show the log: {section:?}"
    );
}

#[test]
fn without_the_flag_nothing_is_logged() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("ebpflogoff");
    let rec = dir.path("off.rec");
    let out = record(
        &rec,
        &["-q", PROC_MAP_FLAG, "16"],
        &[python(), "-c", MANY_AT_ONCE],
    );
    assert!(out.status.success(), "record failed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r = report_json(&rec);
    // The same condition held...
    assert!(u(&r["lost"]["proc_map_full"]) > 0);
    // ...and nobody asked: nothing logged, nowhere.
    assert!(
        !stderr.lines().any(|l| l.starts_with("trainbpf: kernel ")),
        "{stderr}"
    );
    assert_eq!(r["ebpf_log"]["enabled"], false);
    assert_eq!(r["ebpf_log"]["messages"], serde_json::json!([]));
    assert!(r["recording"]["attach"]["ebpf_log"].is_null());
    assert!(!report_text(&rec).contains("Kernel programs' log"));
}
