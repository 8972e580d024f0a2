//! A report people can read, on real runs: a shim's short-lived helpers
//! fold into one line (the JSON keeps them all), a fork that execs is not
//! its parent's size, and an attach (`--cgroup`, `--all`) names what it
//! attached to and keeps the recorder, pid 0 and kernel threads out of the
//! job.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::support::*;
use serde_json::Value;

const MIB: u64 = 1024;

fn report_text(rec: &Path) -> String {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .output()
        .expect("running trainbpf report");
    assert!(out.status.success(), "report failed: {}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    eprintln!("--- report:\n{text}");
    text
}

fn processes(r: &Value) -> &Vec<Value> {
    r["processes"].as_array().expect("processes[]")
}

fn count_comm(r: &Value, comm: &str) -> usize {
    processes(r).iter().filter(|p| p["comm"] == comm).count()
}

/// (a) A job started through a shim-like wrapper: 20 `bash -c true` and
/// 20 `readlink`, then a process that holds memory for over a second.
#[test]
fn a_shims_helpers_fold_into_one_line() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("readable-shim");
    let rec = dir.path("shim.rec");
    let script = format!(
        "for i in $(seq 20); do bash -c true; readlink -f /proc/self/exe >/dev/null; done\n\
         {} -c 'import time; b = bytearray(40 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(1.5)'\n",
        python()
    );
    std::fs::write(dir.path("shim.sh"), script).unwrap();
    let wrapper = dir.path("shim.sh");
    let out = record(&rec, &[], &["/bin/bash", wrapper.to_str().unwrap()]);
    assert!(out.status.success(), "the job exits 0");

    let r = report_json(&rec);
    // The JSON keeps every one of them.
    assert!(count_comm(&r, "bash") >= 20, "{}", count_comm(&r, "bash"));
    assert_eq!(count_comm(&r, "readlink"), 20);

    let text = report_text(&rec);
    let folded: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("short-lived helper"))
        .collect();
    // The process table, the run summary and the deaths: once each, the
    // same line.
    assert_eq!(folded.len(), 3, "{folded:#?}");
    let table = folded[0];
    assert!(table.contains("readlink ×20"), "{table}");
    let bash: u64 = table
        .split("bash ×")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no bash count in {table}"));
    assert!(bash >= 20, "{table}");
    // No helper has a row or a death line of its own.
    assert!(
        !text
            .lines()
            .any(|l| l.contains("(readlink)") || l.contains(" readlink  ")),
        "a readlink listed on its own"
    );
    // The process that held memory is listed.
    let py = processes(&r)
        .iter()
        .find(|p| u(&p["peak_rss_kb"]) >= 40 * MIB)
        .expect("the memory-using process in the JSON");
    let pid = u(&py["pid"]);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with(&format!("{pid} "))),
        "pid {pid} has its row"
    );
}

/// (b) A 200 MiB parent forks a child that execs `sleep`: the child's
/// peak is sleep's, not the pages it shared with its parent until exec.
#[test]
fn a_fork_that_execs_is_not_its_parents_size() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("readable-exec");
    let rec = dir.path("exec.rec");
    let prog = "import os, time\n\
                b = bytearray(200 << 20)\n\
                b[::4096] = b'x' * len(b[::4096])\n\
                time.sleep(0.3)\n\
                pid = os.fork()\n\
                if pid == 0:\n    os.execv('/bin/sleep', ['sleep', '0.5'])\n\
                os.waitpid(pid, 0)\n";
    let out = record(&rec, &[], &[python(), "-c", prog]);
    assert!(out.status.success(), "the job exits 0");
    let r = report_json(&rec);
    let parent = processes(&r)
        .iter()
        .find(|p| p["parent"].is_null())
        .expect("the root");
    assert!(
        u(&parent["peak_rss_kb"]) >= 200 * MIB,
        "the parent holds 200 MiB: {parent}"
    );
    let child = processes(&r)
        .iter()
        .find(|p| p["comm"] == "sleep")
        .expect("the exec'd child");
    assert!(
        u(&child["peak_rss_kb"]) < 20 * MIB,
        "sleep's own memory, not its parent's: {child}"
    );
    // Nothing derived from it says otherwise: the top users and the chart.
    let cpid = u(&child["pid"]);
    for u_ in r["top_memory"].as_array().unwrap() {
        if u(&u_["pid"]) == cpid {
            assert!(u(&u_["peak_rss_kb"]) < 20 * MIB, "{u_}");
        }
    }
    let text = report_text(&rec);
    assert!(
        !text
            .lines()
            .any(|l| l.contains(" sleep ") && l.contains("MiB") && l.contains("peak 2")),
        "no 200 MiB sleep in the chart"
    );
}

/// `record ARGS` until it says it is attached; the caller detaches it.
fn attach(args: &[&std::ffi::OsStr]) -> Child {
    spawn_until(args, "attached;")
}

fn detach(mut rec: Child) {
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(rec.id() as i32, libc::SIGINT) }, 0);
    let st = rec.wait().unwrap();
    assert!(st.success(), "detaching is success: {st}");
}

/// What every attach's report must not say: a nameless pid 0, the
/// recorder or what it ran, as the job's.
fn assert_kept_apart(r: &Value, text: &str, recorder: u64) {
    for p in processes(r) {
        assert_ne!(u(&p["pid"]), 0, "a pid 0 row: {p}");
        assert_ne!(u(&p["pid"]), recorder, "the recorder as a job process");
        assert_ne!(
            p["parent"].as_u64(),
            Some(recorder),
            "the recorder's helper as a job process: {p}"
        );
    }
    assert!(!text.contains("(pid 0)"), "job: ? (pid 0)");
    assert!(!text.contains("job: ?"), "an unnamed job");
}

/// (c) `--cgroup` on a cgroup this test made, with a process it started.
#[test]
fn a_cgroup_attach_names_the_cgroup() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("readable-cgroup");
    let rec = dir.path("cg.rec");
    let cg = Cg::new("readable", "200M");
    let procs = cg.0.join("cgroup.procs");
    let prog = format!(
        "import os, time\nopen({:?}, 'w').write(str(os.getpid()))\n\
         held = []\nfor _ in range(300):\n    b = bytearray(1 << 20)\n    b[::4096] = b'x' * 256\n    held.append(b)\n    time.sleep(0.1)\n",
        procs.display()
    );
    let mut job = Command::new(python())
        .args(["-c", &prog])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // Until it has moved itself in.
    for _ in 0..100 {
        if std::fs::read_to_string(&procs).is_ok_and(|s| !s.trim().is_empty()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let recorder = attach(&[
        "record".as_ref(),
        "-q".as_ref(),
        "-o".as_ref(),
        rec.as_os_str(),
        "--cgroup".as_ref(),
        cg.0.as_os_str(),
    ]);
    let recorder_pid = u64::from(recorder.id());
    // It grows 10 MiB a second while recorded: memory records name it.
    detach(recorder);
    job.kill().unwrap();
    let _ = job.wait();

    let r = report_json(&rec);
    let text = report_text(&rec);
    let title = text.lines().next().unwrap();
    assert_eq!(
        title,
        format!("trainbpf report: cgroup {}", cg.0.display()),
        "the title names the cgroup"
    );
    assert_kept_apart(&r, &text, recorder_pid);
    assert!(
        processes(&r)
            .iter()
            .any(|p| u(&p["pid"]) == u64::from(job.id())),
        "the cgroup's process is the job's"
    );
}

/// Workqueue pools with a new nice value get new kernel workers: a sure
/// way to see kernel threads fork while recording. Restored after.
fn make_kernel_threads() {
    let nice = "/sys/devices/virtual/workqueue/writeback/nice";
    let old = std::fs::read_to_string(nice).expect("the writeback workqueue's nice");
    for v in ["-11", "-12"] {
        std::fs::write(nice, v).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(nice, old.trim()).unwrap();
}

/// (c) `--all`, briefly: the whole machine, the recorder and kernel
/// threads apart.
#[test]
fn an_all_attach_keeps_the_recorder_and_kernel_threads_apart() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("readable-all");
    let rec = dir.path("all.rec");
    let recorder = attach(&[
        "record".as_ref(),
        "-q".as_ref(),
        "-o".as_ref(),
        rec.as_os_str(),
        "--all".as_ref(),
    ]);
    let recorder_pid = u64::from(recorder.id());
    make_kernel_threads();
    let st = Command::new("/bin/sleep").arg("0.2").status().unwrap();
    assert!(st.success());
    detach(recorder);

    let r = report_json(&rec);
    let text = report_text(&rec);
    assert_eq!(
        text.lines().next().unwrap(),
        "trainbpf report: all processes"
    );
    assert_kept_apart(&r, &text, recorder_pid);
    for p in processes(&r) {
        let comm = p["comm"].as_str().unwrap_or("");
        assert!(
            !["kworker", "ksoftirqd", "kthreadd", "rcu_", "migration"]
                .iter()
                .any(|k| comm.starts_with(k)),
            "a kernel thread as a job process: {p}"
        );
        assert_ne!(p["parent"].as_u64(), Some(2), "kthreadd's child: {p}");
    }
    let left_out = text
        .lines()
        .find(|l| l.starts_with("left out of the job:"))
        .expect("a line says what was left out");
    assert!(
        left_out.contains(&format!("the recorder (pid {recorder_pid})")),
        "{left_out}"
    );
    assert!(left_out.contains("kernel thread"), "{left_out}");
    // The sleep this test ran is the machine's, so the job's.
    assert!(
        count_comm(&r, "sleep") >= 1,
        "the machine's processes are the job"
    );
}
