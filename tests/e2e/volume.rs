//! The recording stays small: eight processes growing steadily until the
//! limit cost well under 1 MB of recording per minute, with nothing lost.

use std::time::Instant;

use crate::support::*;

/// Eight workers, each growing 10 MB/s (1 MB every 100 ms); when the kernel
/// kills one, the main process stops the rest, as a launcher would.
const EIGHT: &str = r#"
import os, signal, time
kids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        hold = []
        while True:
            hold.append(bytearray(b"x") * 1_000_000)
            time.sleep(0.1)
    kids.append(pid)
os.wait()
for k in kids:
    try:
        os.kill(k, signal.SIGTERM)
    except ProcessLookupError:
        pass
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"#;

#[test]
fn eight_growing_processes_cost_under_a_megabyte_a_minute() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("volume");
    let rec = dir.path("vol.rec");
    let start = Instant::now();
    let out = record(&rec, &["--memory-limit", "1200M"], &[python(), "-c", EIGHT]);
    let secs = start.elapsed().as_secs_f64();
    assert!(out.status.success(), "job ran to its end");
    let bytes = std::fs::metadata(&rec).unwrap().len();
    let per_min = bytes as f64 / secs * 60.0;
    eprintln!("recording: {bytes} bytes in {secs:.1} s = {per_min:.0} bytes/min");
    assert!(secs > 10.0, "the job grew for a while ({secs:.1} s)");
    assert!(per_min < 1_000_000.0, "{per_min:.0} bytes/min");
    let r = report_json(&rec);
    assert_eq!(u(&r["lost_events"]), 0, "no lost events");
    let k = &kills(&r)[0];
    let growers = k["growers"].as_array().unwrap();
    let in_job = growers.iter().filter(|g| g["in_job"] == true).count();
    assert!(in_job >= 8, "all eight workers grew: {growers:#?}");
}
