//! The maps scan: what finds a driver library that a job's process mapped
//! before the recorder attached, whose pages it already touched, so that
//! no fault the late probe sees will come. Where the late probe is on the
//! file faults, the scan reads only the processes from before the probes,
//! once each (issue 28: `record --all` read 512 processes' maps a second).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use crate::support::*;

/// The stand-in job, started with its four calls made (the library mapped
/// and its code touched); it calls once more when `go` exists.
struct Started {
    job: std::process::Child,
    go: std::path::PathBuf,
}

fn start_job(dir: &TempDir) -> Started {
    let (libs, job) = late_standins(dir, 1);
    let nvctl = dir.path("nvidiactl");
    std::fs::write(&nvctl, b"").unwrap();
    let go = dir.path("go");
    let mut j = Command::new(&job)
        .arg(&libs[0])
        .arg("until")
        .arg(&go)
        .env("STANDIN_NVIDIACTL", &nvctl)
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the job");
    let mut out = BufReader::new(j.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("first call returned") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the job ended early");
    }
    Started { job: j, go }
}

/// The job was found through its maps, and its call after the recorder
/// started is in its GPU ledger.
fn assert_found_and_probed(rec: &std::path::Path, pid: u32) {
    let rep = report_json(rec);
    let g = &rep["gpu"];
    let found = g["attach"]
        .as_array()
        .expect("gpu.attach")
        .iter()
        .find(|a| a["found_by"] == "maps")
        .unwrap_or_else(|| panic!("not found through the maps: {:#}", g["attach"]));
    assert_eq!(u(&found["pid"]), pid as u64, "{found}");
    let p = g["processes"]
        .as_array()
        .expect("gpu.processes")
        .iter()
        .find(|p| u(&p["pid"]) == pid as u64)
        .unwrap_or_else(|| panic!("no GPU ledger for the job: {g:#}"));
    assert_eq!(u(&p["calls"]), 1, "{p:#}");
}

/// A process that mapped and called the stand-in libcuda before `record
/// --pid` attached is found by the scan, and its call after that is
/// probed.
#[test]
fn a_library_mapped_before_an_attach_is_found_by_the_scan() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-scan-attach");
    let Started { job: mut j, go } = start_job(&dir);
    let rec = dir.path("scan.rec");
    let pid = j.id().to_string();
    // Said when the scan probes the file it found in the job's maps.
    let mut r = spawn_until(
        &[
            "record".as_ref(),
            "-v".as_ref(),
            "-o".as_ref(),
            rec.as_os_str(),
            "--pid".as_ref(),
            pid.as_ref(),
        ],
        &format!("(pid {pid} maps it)"),
    );
    std::fs::write(&go, b"").unwrap();
    assert!(j.wait().unwrap().success(), "the job ran to its end");
    assert!(r.wait().unwrap().success(), "the recorder ended with it");
    assert_found_and_probed(&rec, j.id());
}

/// `record --all` started on a node where a trainer already runs (a
/// DaemonSet's recorder restarted): the trainer mapped and touched the
/// driver before, so only the scan of the node's processes can find it.
#[test]
fn record_all_finds_a_driver_mapped_before_it_started() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-scan-all");
    let Started { job: mut j, go } = start_job(&dir);
    let rec = dir.path("all.rec");
    let pid = j.id();
    let mut r = spawn_until(
        &[
            "record".as_ref(),
            "--all".as_ref(),
            "-v".as_ref(),
            "-o".as_ref(),
            rec.as_os_str(),
        ],
        &format!("(pid {pid} maps it)"),
    );
    std::fs::write(&go, b"").unwrap();
    assert!(j.wait().unwrap().success(), "the job ran to its end");
    // SAFETY: kill(2) on our own child. The job's last call is in the
    // rings before the recorder is stopped:
    // a drain comes each 50 ms, and the stop drains the rest.
    assert_eq!(unsafe { libc::kill(r.id() as i32, libc::SIGINT) }, 0);
    assert!(r.wait().unwrap().success(), "the recorder ended when asked");
    assert_found_and_probed(&rec, pid);
}
