//! Every death in the job gets a cause: an OOM kill, a signal from another
//! process (with the sender), a crash, or an exit.

use std::process::{Command, Stdio};

use crate::support::*;

#[test]
fn kill_from_another_process_names_the_sender_not_oom() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("kill9");
    let rec = dir.path("k.rec");
    let pidfile = dir.path("pid");
    let mut rec_proc = Command::new(bin())
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--", "/bin/sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 30", pidfile.display()))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut job_pid = 0u64;
    for _ in 0..100 {
        if let Ok(s) = std::fs::read_to_string(&pidfile)
            && let Ok(p) = s.trim().parse()
        {
            job_pid = p;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(job_pid > 0, "job wrote its pid");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // A separate process sends the SIGKILL, as a person's `kill -9` would.
    let mut killer = Command::new("/bin/kill")
        .args(["-9", &job_pid.to_string()])
        .spawn()
        .unwrap();
    let killer_pid = killer.id() as u64;
    assert!(killer.wait().unwrap().success());
    let st = rec_proc.wait().unwrap();
    assert_eq!(st.code(), Some(137));
    let r = report_json(&rec);
    let d = death_of(&r, job_pid);
    assert_eq!(d["cause"], "signal", "{d:#}");
    assert_eq!(d["signal"], 9);
    assert_eq!(u(&d["sender"]["pid"]), killer_pid, "{d:#}");
    assert_eq!(d["sender"]["comm"], "kill");
    assert_eq!(d["sender"]["uid"], 0);
    assert!(kills(&r).is_empty(), "not an OOM kill");
}

#[test]
fn segfault_is_a_crash() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("segv");
    let rec = dir.path("s.rec");
    let out = record(
        &rec,
        &[],
        &[python(), "-c", "import ctypes; ctypes.string_at(0)"],
    );
    assert_eq!(out.status.code(), Some(128 + 11));
    let r = report_json(&rec);
    let d = death_of(&r, u(&r["job"]["pid"]));
    assert_eq!(d["cause"], "crash");
    assert_eq!(d["signal"], 11);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("crashed with SIGSEGV"),
        "verdict states the cause: {stderr}"
    );
}

#[test]
fn exit_code_is_an_exit() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("exit3d");
    let rec = dir.path("e.rec");
    let out = record(&rec, &[], &["/bin/sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let r = report_json(&rec);
    let d = death_of(&r, u(&r["job"]["pid"]));
    assert_eq!(d["cause"], "exit");
    assert_eq!(d["code"], 3);
    assert!(d["signal"].is_null());
}

#[test]
fn memcg_oom_death_names_the_cgroup() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("oomd");
    let rec = dir.path("o.rec");
    let grow = "h=[]\nwhile True: h.append(bytearray(b'x')*(8<<20))\n";
    let out = record(&rec, &["--memory-limit", "128M"], &[python(), "-c", grow]);
    assert_eq!(out.status.code(), Some(137));
    let r = report_json(&rec);
    let d = death_of(&r, u(&r["job"]["pid"]));
    assert_eq!(d["cause"], "oom_memcg", "{d:#}");
    assert!(d["memcg"].as_str().unwrap().contains("/trainbpf-"), "{d:#}");
    assert_eq!(u(&d["memcg_limit_kb"]), 128 * 1024);
}
