//! Disk full: a recording that outgrows its filesystem (a small tmpfs) does
//! not touch the job, which ends with its own status; the recorder warns,
//! holds the events in memory, writes them when there is room again, and
//! leaves a file that `report` reads without damage either way.

use std::{path::Path, process::Command};

use crate::support::*;

/// A tmpfs of `size`, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(st.success(), "mount -t tmpfs failed: {st}");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Forks children that each touch 6 MiB and exit (fork, memory, exit and
/// process-info records: about a kilobyte each), for `dur` seconds; removes
/// `filler` (if not "-") after `free_at` seconds; exits 7.
const JOB: &str = r#"
import os, sys, time
filler, free_at, dur = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
start = time.time()
while time.time() - start < dur:
    pid = os.fork()
    if pid == 0:
        b = b"x" * (6 << 20)
        os._exit(0)
    os.waitpid(pid, 0)
    if filler != "-" and time.time() - start >= free_at:
        os.remove(filler)
        print("job: freed the disk", flush=True)
        filler = "-"
sys.exit(7)
"#;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn check_readable(rec: &Path) -> serde_json::Value {
    let r = report_json(rec);
    assert!(
        r["recording"]["stopped_early"].is_null(),
        "no torn frame: {}",
        r["recording"]
    );
    assert_eq!(
        r["recording"]["skipped"],
        serde_json::json!([]),
        "no damage to skip"
    );
    assert!(r["job"].is_object(), "the job's start was written");
    r
}

#[test]
fn a_disk_that_stays_full_ends_the_recording_cleanly() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diskfull");
    let mnt = Tmpfs::mount(&dir.path("mnt"), "1M");
    // Leave the recording a quarter of a megabyte, for good.
    std::fs::write(mnt.0.join("filler"), vec![0u8; 768 << 10]).unwrap();
    let rec = mnt.0.join("full.rec");
    // Without stacks: a frame is sealed after the record that takes it
    // past 64 KiB, and a drain's stack record with its frames can make it
    // far larger, so "whole frames fill the disk to within 64 KiB" would
    // not hold.
    let out = record(
        &rec,
        &["--no-stacks"],
        &[python(), "-c", JOB, "-", "0", "6"],
    );
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(7), "the job's own status");
    assert!(
        err.contains("trainbpf: warning: writing the recording failed")
            && err.contains("disk full; holding"),
        "{err}"
    );
    assert_eq!(
        err.matches("disk full; holding").count(),
        1,
        "warned once: {err}"
    );
    assert!(err.contains("the disk is still full"), "{err}");
    // Frames are at most 64 KiB, so whole ones fill the disk to within that.
    let size = std::fs::metadata(&rec).unwrap().len();
    assert!(size <= 256 << 10, "{size}");
    assert!(
        size > 160 << 10,
        "it wrote whole frames until the disk was full: {size}"
    );
    let r = check_readable(&rec);
    // The events are there up to where the disk filled; the job's end is
    // not (it was held in memory and never written).
    assert!(u(&r["recording"]["events"]) > 100, "{}", r["recording"]);
}

#[test]
fn writing_resumes_when_the_disk_has_room_again() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diskfree");
    // Once freed, the disk must hold the whole 7 s job: that is about
    // 2.5 MiB on a fast machine, so 16 MiB leaves room for faster ones.
    let mnt = Tmpfs::mount(&dir.path("mnt"), "16M");
    // Leave the recording 192 KiB: full within the 4 s before the job
    // frees the disk even on a slow machine (about a kilobyte a fork).
    let filler = mnt.0.join("filler");
    std::fs::write(&filler, vec![0u8; (16 << 20) - (192 << 10)]).unwrap();
    let rec = mnt.0.join("resume.rec");
    let filler_s = filler.to_str().unwrap();
    let out = record(&rec, &[], &[python(), "-c", JOB, filler_s, "4", "7"]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(7), "the job's own status");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("job: freed the disk"),
        "the job freed the disk"
    );
    assert!(err.contains("disk full; holding"), "{err}");
    assert!(
        err.contains("the recording is being written again"),
        "{err}"
    );
    assert!(!err.contains("the disk is still full"), "{err}");
    let r = check_readable(&rec);
    // Everything made it, the end of the job included.
    assert_eq!(r["job"]["exit"], serde_json::json!({"code": 7}));
    let secs = r["recording"]["duration_s"].as_f64().unwrap();
    assert!(secs > 6.0, "events to the end of the 7 s job: {secs}");
    assert_eq!(u(&r["lost"]["dropped_disk_full"]), 0, "nothing dropped");
}
