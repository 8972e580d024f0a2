//! How the driver's calls are probed, as the kernel tells it: one
//! `uprobe_multi` link per program and library where the kernel has them
//! (6.6 and later, as here), and no perf-event uprobe, whose release at the
//! recorder's end waits out the tracing grace periods one link at a time
//! under the kernel's `event_mutex` (issue 28); and those uprobes, one per
//! call, where multi links are missing.

use std::{
    collections::HashSet,
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde_json::Value;

use super::ledger::{assert_ledger, build};
use crate::support::*;

/// `BPF_LINK_TYPE_PERF_EVENT`: a uprobe or kprobe through a perf event
/// (a classic tracepoint's is told apart as `Link::Tracepoint`).
const PERF_EVENT: u32 = 7;

/// The driver calls the stand-in exports (all but cuCtxCreate_v4), by
/// their programs: the `_ptsz` variants share their base call's.
const PROGRAMS: usize = 19;
const CALLS: u32 = 22;

/// Records the stand-in job (with `env` added) once the recorder holds
/// links that `linked` accepts, read from the kernel while the job waits
/// to start; returns the recorder's output, those links and the recording.
fn record_once_linked(
    name: &str,
    env: &[(&str, &str)],
    linked: impl Fn(&[Link]) -> bool,
) -> (Output, Vec<Link>, Value) {
    let dir = TempDir::new(name);
    let s = build(&dir);
    let go = dir.path("go");
    let libcuda = s.libcuda.to_str().unwrap();
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; exec '{}' '{libcuda}'",
        go.display(),
        s.job.display(),
    );
    let rec = dir.path("links.rec");
    let mut c = Command::new(bin());
    c.args(["record", "-v", "-o"])
        .arg(&rec)
        .args(["--", "/bin/sh", "-c", &script])
        .env_remove("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS")
        .env("TRAINBPF_LIBCUDA", libcuda)
        .env("LD_LIBRARY_PATH", &s.lib)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Made on every way out, a failed assertion's too: the job then runs
    // and the recorder ends with it.
    let go = Go(go);
    let r = c.spawn().expect("start the recorder");
    // The library is probed before the job starts: once its links are all
    // there, none is missing.
    let links = poll(Duration::from_secs(20), || {
        let l = bpf_links_of(r.id());
        linked(&l).then_some(l)
    })
    .unwrap_or_else(|| panic!("not linked after 20 s: {:?}", bpf_links_of(r.id())));
    eprintln!("the recorder's links: {links:?}");
    drop(go);
    let out = r.wait_with_output().expect("the recorder ends");
    print_output("trainbpf record", &out);
    assert_eq!(out.status.code(), Some(0), "the job checks every return");
    // Entries and returns pair up: the ledger is exact.
    let r = report_json(&rec);
    assert_ledger(&r);
    (out, links, r)
}

/// The `libcuda` source's detail in the report.
fn libcuda_source(r: &Value) -> &str {
    r["gpu"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "libcuda")
        .expect("the libcuda source")["detail"]
        .as_str()
        .unwrap()
}

fn count(links: &[Link], f: impl Fn(&Link) -> bool) -> usize {
    links.iter().filter(|l| f(l)).count()
}

#[test]
fn the_driver_calls_are_probed_by_one_multi_link_per_program() {
    require_root();
    let _g = serial();
    let multi = |l: &Link| matches!(l, Link::UprobeMulti { .. });
    let (out, links, r) = record_once_linked("gpu-multi", &[], |l| count(l, multi) >= 2 * PROGRAMS);

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
    assert_eq!(u(&r["gpu"]["attach"][0]["attached"]), u64::from(CALLS));
    let d = libcuda_source(&r);
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
    let perf = |l: &Link| *l == Link::Other(PERF_EVENT);
    let (_, links, r) = record_once_linked(
        "gpu-no-multi",
        &[("TRAINBPF_TEST_NO_UPROBE_MULTI", "1")],
        |l| count(l, perf) >= 2 * CALLS as usize,
    );
    assert_eq!(
        count(&links, |l| matches!(l, Link::UprobeMulti { .. })),
        0,
        "{links:?}"
    );
    assert_eq!(count(&links, perf), 2 * CALLS as usize, "{links:?}");
    let d = libcuda_source(&r);
    assert!(
        d.contains("one perf-event uprobe per call: turned off by TRAINBPF_TEST_NO_UPROBE_MULTI"),
        "{d}"
    );
}
