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

/// A process that mapped and called the stand-in libcuda before `record
/// --pid` attached is found by the scan, and its call after that is
/// probed.
#[test]
fn a_library_mapped_before_an_attach_is_found_by_the_scan() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-scan-attach");
    let (libs, job) = late_standins(&dir, 1);
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
    // Its four calls are made: the library is mapped and its code touched.
    let mut out = BufReader::new(j.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("first call returned") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the job ended early");
    }
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
    let rep = report_json(&rec);
    let g = &rep["gpu"];
    let found = g["attach"]
        .as_array()
        .expect("gpu.attach")
        .iter()
        .find(|a| a["found_by"] == "maps")
        .unwrap_or_else(|| panic!("not found through the maps: {:#}", g["attach"]));
    assert_eq!(u(&found["pid"]), j.id() as u64, "{found}");
    // The call after the attach is the probes'.
    let p = g["processes"]
        .as_array()
        .expect("gpu.processes")
        .iter()
        .find(|p| u(&p["pid"]) == j.id() as u64)
        .unwrap_or_else(|| panic!("no GPU ledger for the job: {g:#}"));
    assert_eq!(u(&p["calls"]), 1, "{p:#}");
}
