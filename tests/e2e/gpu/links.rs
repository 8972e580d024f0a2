//! How the driver's calls are probed, as the kernel tells it: one
//! `uprobe_multi` link per program and library where the kernel has them
//! (6.6 and later, as here), and no perf-event uprobe, whose release at the
//! recorder's end waits out the tracing grace periods one link at a time
//! under the kernel's `event_mutex` (issue 28); and those uprobes, one per
//! call, where multi links are missing.

use std::{
    collections::HashSet,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::ledger::{assert_ledger, build};
use crate::support::*;

/// `BPF_LINK_TYPE_PERF_EVENT`: a uprobe or kprobe through a perf event
/// (a classic tracepoint's is told apart as `Link::Tracepoint`).
const PERF_EVENT: u32 = 7;

/// The driver calls the stand-in exports (all but cuCtxCreate_v4), by
/// their programs: the `_ptsz` variants share their base call's.
const PROGRAMS: usize = 19;
const CALLS: u32 = 22;

#[test]
fn the_driver_calls_are_probed_by_one_multi_link_per_program() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-multi");
    let s = build(&dir);
    let go = dir.path("go");
    let libcuda = s.libcuda.to_str().unwrap();
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; exec '{}' '{libcuda}'",
        go.display(),
        s.job.display(),
    );
    let rec = dir.path("multi.rec");
    let mut c = Command::new(bin());
    c.args(["record", "-v", "-o"])
        .arg(&rec)
        .args(["--", "/bin/sh", "-c", &script])
        .env_remove("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS")
        .env("TRAINBPF_LIBCUDA", libcuda)
        .env("LD_LIBRARY_PATH", &s.lib)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Made on every way out, a failed assertion's too: the job then runs
    // and the recorder ends with it.
    let go = Go(go);
    let r = c.spawn().expect("start the recorder");
    // The library is probed before the job starts: once its links are all
    // there, none is missing.
    let t0 = Instant::now();
    let links = loop {
        let l = bpf_links_of(r.id());
        let multi = l
            .iter()
            .filter(|l| matches!(l, Link::UprobeMulti { .. }))
            .count();
        if multi >= 2 * PROGRAMS {
            break l;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no multi links after 20 s: {l:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("the recorder's links: {links:?}");
    drop(go);
    let out = r.wait_with_output().expect("the recorder ends");
    print_output("trainbpf record", &out);
    assert_eq!(out.status.code(), Some(0), "the job checks every return");

    // Each program twice, its entries and its returns; every call the
    // library exports is in exactly one link of each.
    let (mut entries, mut returns) = (Vec::new(), Vec::new());
    for l in &links {
        if let Link::UprobeMulti { count, ret } = l {
            if *ret { &mut returns } else { &mut entries }.push(*count);
        }
    }
    assert_eq!(entries.len(), PROGRAMS, "{links:?}");
    assert_eq!(returns.len(), PROGRAMS, "{links:?}");
    assert_eq!(entries.iter().sum::<u32>(), CALLS, "{entries:?}");
    assert_eq!(returns.iter().sum::<u32>(), CALLS, "{returns:?}");
    let shared: HashSet<u32> = entries.iter().copied().filter(|&n| n > 1).collect();
    assert_eq!(shared, HashSet::from([2]), "{entries:?}");
    // No uprobe or kprobe through a perf event (there are no kprobes here).
    assert!(!links.contains(&Link::Other(PERF_EVENT)), "{links:?}");

    // Entries and returns pair up: the ledger is exact.
    let r = report_json(&rec);
    assert_ledger(&r);
    assert_eq!(u(&r["gpu"]["attach"][0]["attached"]), u64::from(CALLS));
    let src = r["gpu"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "libcuda")
        .expect("the libcuda source");
    let d = src["detail"].as_str().unwrap();
    assert!(
        d.contains("probed by one uprobe_multi link per program and file"),
        "{d}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("driver calls probed by one uprobe_multi link per program and file"),
        "{stderr}"
    );
}

/// Where the kernel has no multi links (before 6.6, or the test switch
/// here), each call is a perf-event uprobe of its own: two per call, and
/// the same exact ledger through them.
#[test]
fn perf_event_uprobes_stand_in_where_multi_links_are_missing() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-no-multi");
    let s = build(&dir);
    let go = dir.path("go");
    let libcuda = s.libcuda.to_str().unwrap();
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; exec '{}' '{libcuda}'",
        go.display(),
        s.job.display(),
    );
    let rec = dir.path("perf.rec");
    let mut c = Command::new(bin());
    c.args(["record", "-v", "-o"])
        .arg(&rec)
        .args(["--", "/bin/sh", "-c", &script])
        .env_remove("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS")
        .env("TRAINBPF_TEST_NO_UPROBE_MULTI", "1")
        .env("TRAINBPF_LIBCUDA", libcuda)
        .env("LD_LIBRARY_PATH", &s.lib)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let go = Go(go);
    let r = c.spawn().expect("start the recorder");
    let t0 = Instant::now();
    let links = loop {
        let l = bpf_links_of(r.id());
        let perf = l.iter().filter(|l| **l == Link::Other(PERF_EVENT)).count();
        if perf >= 2 * CALLS as usize {
            break l;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no perf-event uprobes after 20 s: {l:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(go);
    let out = r.wait_with_output().expect("the recorder ends");
    print_output("trainbpf record", &out);
    assert_eq!(out.status.code(), Some(0), "the job checks every return");
    assert!(
        !links.iter().any(|l| matches!(l, Link::UprobeMulti { .. })),
        "{links:?}"
    );
    assert_eq!(
        links
            .iter()
            .filter(|l| **l == Link::Other(PERF_EVENT))
            .count(),
        2 * CALLS as usize,
        "{links:?}"
    );
    let r = report_json(&rec);
    assert_ledger(&r);
    let src = r["gpu"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "libcuda")
        .expect("the libcuda source");
    let d = src["detail"].as_str().unwrap();
    assert!(
        d.contains("one perf-event uprobe per call: turned off by TRAINBPF_TEST_NO_UPROBE_MULTI"),
        "{d}"
    );
}

/// The file a waiting job starts at, made when dropped.
struct Go(std::path::PathBuf);

impl Drop for Go {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"");
    }
}
