//! A CUDA driver library loaded late: a job `dlopen`s the stand-in
//! `libcuda.so.1` (tests/gpu/standin_cuda.c) from a path the recorder
//! cannot know at start (no `TRAINBPF_LIBCUDA`, not in the linker's cache),
//! and allocates at once (tests/gpu/late_job.c). The kernel holds the
//! mapping process until its probes are on, so the ledger is exact; where
//! the hold is turned off (the test switch), the window is reported with its
//! calls counted.

use std::{
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::support::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn gpu_proc(r: &Value, pid: u64) -> &Value {
    r["gpu"]["processes"]
        .as_array()
        .expect("gpu.processes")
        .iter()
        .find(|p| u(&p["pid"]) == pid)
        .unwrap_or_else(|| panic!("no GPU ledger for pid {pid}: {:#}", r["gpu"]))
}

/// Pids and first-call delays (µs) the jobs printed.
fn printed(out: &Output) -> Vec<(u64, u64)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("late_job: pid ")?;
            let (pid, rest) = rest.split_once(": first call returned ")?;
            let us = rest.strip_suffix(" us after dlopen")?;
            Some((pid.parse().ok()?, us.parse().ok()?))
        })
        .collect()
}

/// The four calls of late_job.c, exactly: device 16 MiB (cuMemAlloc_v2) and
/// 32 MiB (cuMemCreate on the device), pinned 1 MiB (cuMemHostAlloc),
/// managed 4 MiB; nothing freed.
fn assert_four_calls(p: &Value) {
    let k = |kind: &str, f: &str| u(&p[kind][f]) / MIB;
    assert_eq!(u(&p["calls"]), 4, "{p:#}");
    assert_eq!(u(&p["failed_calls"]), 0, "{p:#}");
    assert_eq!(
        (k("device", "allocated_bytes"), u(&p["device"]["allocs"])),
        (48, 2),
        "{p:#}"
    );
    assert_eq!(u(&p["device_bytes_peak"]) / MIB, 48, "{p:#}");
    assert_eq!(k("pinned", "allocated_bytes"), 1, "{p:#}");
    assert_eq!(u(&p["pinned_bytes_peak"]) / MIB, 1, "{p:#}");
    assert_eq!(k("managed", "allocated_bytes"), 4, "{p:#}");
    assert_eq!(u(&p["managed_bytes_peak"]) / MIB, 4, "{p:#}");
}

/// Every late mapping was held, probed, and cost nothing lost.
fn assert_all_held(r: &Value, n: usize) {
    let g = &r["gpu"];
    let late = g["late"].as_array().expect("gpu.late");
    assert_eq!(late.len(), n, "{late:#?}");
    for l in late {
        assert_eq!(l["held"], true, "{l}");
        assert_eq!(l["probed"], true, "{l}");
        assert_eq!(u(&l["calls"]), 0, "{l}");
        assert!(l["note"].is_null(), "{l}");
    }
    assert_eq!(u(&g["lost"]["held"]), n as u64, "{:#}", g["lost"]);
    assert_eq!(u(&g["lost"]["windows"]), 0);
    assert_eq!(u(&g["lost"]["window_calls"]), 0);
    assert_eq!(u(&g["lost"]["attach_failed"]), 0);
    assert_eq!(u(&g["lost_events"]), 0);
    let holds: Vec<f64> = late.iter().map(|l| l["ms"].as_f64().unwrap()).collect();
    eprintln!("hold times, ms: {holds:?}");
}

/// Sixteen jobs (the most libraries one recording probes), each loading
/// its own copy of the driver from an uncached path and allocating at once
/// after `dlopen` returns: every call of each is in the ledger, and
/// nothing is lost.
#[test]
fn calls_right_after_a_late_dlopen_are_all_recorded_sixteen_times() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late");
    let (libs, job) = late_standins(&dir, 16);
    let script: String = libs
        .iter()
        .map(|l| format!("{} {} || exit 9\n", job.display(), l.display()))
        .collect();
    let rec = dir.path("late.rec");
    let out = gpu_record(&rec, &[], &["/bin/sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "every job checks every return");
    let jobs = printed(&out);
    assert_eq!(jobs.len(), 16, "{jobs:?}");
    let r = report_json(&rec);
    // The job calls at once after `dlopen` (late_job.c); how soon is the
    // scheduler's (60 to 140 µs here, 1.5 ms once in CI with the recorder
    // naming stacks on the other CPU), so it is shown, not judged. The
    // hold is what makes the ledger exact, whatever the delay.
    for &(pid, us) in &jobs {
        eprintln!("pid {pid}: first call {us} µs after dlopen");
        assert_four_calls(gpu_proc(&r, pid));
    }
    assert_eq!(r["gpu"]["processes"].as_array().unwrap().len(), 16);
    assert_all_held(&r, 16);
    // Each copy was found at its mapping, by the process that mapped it.
    let attach = r["gpu"]["attach"].as_array().unwrap();
    assert_eq!(attach.len(), 16, "{attach:#?}");
    for (a, lib) in attach.iter().zip(&libs) {
        assert_eq!(a["found_by"], "mmap", "{a}");
        assert_eq!(a["path"], lib.to_str().unwrap(), "{a}");
        assert_eq!(u(&a["attached"]), 22, "{a}");
    }
    let t = report_text_wide(&rec);
    assert!(
        t.contains("16 process(es) held until probed, no call missed"),
        "{t}"
    );
    assert!(!t.contains("Uncovered"), "{t}");
}

/// An ordinary recording sees a late `dlopen` with no system call
/// tracepoint on the machine: the kernel's own list of the recorder's
/// links has the file fault tracepoints and no `sys_enter_*`, and the
/// mapping process is still held until its probes are on.
#[test]
fn a_late_dlopen_is_held_with_no_system_call_tracepoint_attached() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-nosys");
    let (libs, job) = late_standins(&dir, 1);
    let go = dir.path("go");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; exec '{}' '{}'",
        go.display(),
        job.display(),
        libs[0].display()
    );
    let rec = dir.path("nosys.rec");
    // Made on every way out, a failed assertion's too: the job then runs
    // and the recorder ends with it.
    let go = Go(go);
    let r = gpu_record_command(&rec, &[], &["/bin/sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the recorder");
    // The job waits while the recorder's links are read: once the late
    // probe is on, everything is (it goes on after the other probes).
    let t0 = Instant::now();
    let links = loop {
        let l = bpf_links_of(r.id());
        if l.contains(&Link::Raw("mm_filemap_map_pages".into())) {
            break l;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no late probe after 20 s: {l:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("the recorder's links: {links:?}");
    drop(go);
    let out = r.wait_with_output().expect("the recorder ends");
    print_output("trainbpf record", &out);
    assert_eq!(out.status.code(), Some(0));
    assert!(links.contains(&Link::Raw("mm_filemap_fault".into())));
    let syscalls: Vec<&Link> = links
        .iter()
        .filter(|l| matches!(l, Link::Tracepoint(n) | Link::Raw(n) if n.starts_with("sys_")))
        .collect();
    assert!(syscalls.is_empty(), "system call tracepoints: {syscalls:?}");
    // The perf-event links are read too: the console's classic tracepoint
    // (the kernel's OOM report lines) is one.
    assert!(
        links.contains(&Link::Tracepoint("console".into())),
        "{links:?}"
    );
    let jobs = printed(&out);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let r = report_json(&rec);
    assert_four_calls(gpu_proc(&r, jobs[0].0));
    assert_all_held(&r, 1);
    let src = r["gpu"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "late-mmap")
        .expect("the late probe's source");
    let d = src["detail"].as_str().unwrap();
    assert!(
        d.starts_with("tp_btf:mm_filemap_fault,mm_filemap_map_pages"),
        "{d}"
    );
    assert!(!d.contains("syscalls:"), "{d}");
}

/// A worker forked before the library is loaded maps it on its own: held
/// and covered the same way; its parent never touches the driver.
#[test]
fn a_worker_that_maps_the_library_after_the_fork_is_covered() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-fork");
    let (libs, job) = late_standins(&dir, 1);
    let rec = dir.path("fork.rec");
    let out = gpu_record(
        &rec,
        &[],
        &[job.to_str().unwrap(), libs[0].to_str().unwrap(), "fork"],
    );
    assert_eq!(out.status.code(), Some(0));
    let jobs = printed(&out);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let (worker, us) = jobs[0];
    eprintln!("first call {us} µs after dlopen (the scheduler's, not judged)");
    let r = report_json(&rec);
    let root = u(&r["job"]["pid"]);
    assert_ne!(worker, root, "the calls come from the forked worker");
    let p = gpu_proc(&r, worker);
    assert_four_calls(p);
    assert_eq!(u(&p["parent"]), root);
    assert_eq!(r["gpu"]["processes"].as_array().unwrap().len(), 1);
    assert_all_held(&r, 1);
    assert_eq!(u(&r["gpu"]["late"][0]["pid"]), worker);
}

/// With the hold turned off by the test switch, the probes go on 300 ms
/// after the mapping: the four calls made at once are not in the ledger,
/// and the window says so, with the four driver calls the stand-in made
/// (one ioctl on its `nvidiactl` each) counted as lost. The call made
/// after the window is recorded.
#[test]
fn a_forced_window_is_reported_with_its_calls_counted() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-window");
    let (libs, job) = late_standins(&dir, 1);
    // A plain file named like the driver's device node.
    let nvctl = dir.path("nvidiactl");
    std::fs::write(&nvctl, b"").unwrap();
    let rec = dir.path("window.rec");
    let out = gpu_record(
        &rec,
        &[
            ("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS", "300"),
            ("STANDIN_NVIDIACTL", nvctl.to_str().unwrap()),
        ],
        &[
            job.to_str().unwrap(),
            libs[0].to_str().unwrap(),
            "window",
            "1200",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let r = report_json(&rec);
    let g = &r["gpu"];
    let root = u(&r["job"]["pid"]);
    // Only the call after the window: 2 MiB.
    let p = gpu_proc(&r, root);
    assert_eq!(u(&p["calls"]), 1, "{p:#}");
    assert_eq!(u(&p["device"]["allocated_bytes"]) / MIB, 2, "{p:#}");
    let late = g["late"].as_array().expect("gpu.late");
    assert_eq!(late.len(), 1, "{late:#?}");
    let w = &late[0];
    eprintln!("{w:#}");
    assert_eq!(w["held"], false);
    assert_eq!(w["probed"], true);
    assert_eq!(u(&w["pid"]), root);
    assert_eq!(u(&w["calls"]), 4, "{w}");
    let ms = w["ms"].as_f64().unwrap();
    assert!((300.0..1200.0).contains(&ms), "window {ms} ms");
    assert!(
        w["note"]
            .as_str()
            .is_some_and(|n| n.contains("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS")),
        "{w}"
    );
    assert_eq!(u(&g["lost"]["windows"]), 1, "{:#}", g["lost"]);
    assert_eq!(u(&g["lost"]["window_calls"]), 4);
    assert_eq!(u(&g["lost"]["held"]), 0);
    assert_eq!(u(&g["lost_events"]), 4);
    assert!(u(&r["lost_events"]) >= 4, "{}", r["lost_events"]);
    assert_eq!(u(&r["lost"]["gpu_window_calls"]), 4);
    let t = report_text_wide(&rec);
    eprintln!("{t}");
    // Wrapped to the terminal: read as one line.
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        t.contains(&format!("Uncovered: pid {root} mapped")),
        "the text says so: {t}"
    );
    assert!(
        t.contains("4 call(s) into the NVIDIA driver in that window went unrecorded"),
        "{t}"
    );
}

/// Only what the hold stopped is continued: a job process stopped by its
/// own job while held (its parent sends SIGSTOP once it sees it stopped;
/// the test switch keeps the hold on for 500 ms so that it can) stays
/// stopped when the probes are on, until the job continues it itself.
#[test]
fn a_process_the_job_stopped_while_held_is_left_stopped() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-stop");
    let (libs, job) = late_standins(&dir, 1);
    let rec = dir.path("stop.rec");
    let out = gpu_record(
        &rec,
        &[("TRAINBPF_TEST_GPU_HOLD_MS", "500")],
        &[job.to_str().unwrap(), libs[0].to_str().unwrap(), "stop"],
    );
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("late_job: child stayed stopped after the hold"),
        "{stdout}"
    );
    let r = report_json(&rec);
    let late = r["gpu"]["late"].as_array().expect("gpu.late");
    assert_eq!(late.len(), 1, "{late:#?}");
    let l = &late[0];
    assert_eq!(l["held"], true, "{l}");
    assert_eq!(
        l["note"], "another stop signal reached it while held: left stopped",
        "{l}"
    );
    assert!(l["ms"].as_f64().unwrap() >= 500.0, "{l}");
    // Held, so nothing missed: the child's four calls.
    assert_four_calls(gpu_proc(&r, u(&l["pid"])));
    assert_eq!(u(&r["gpu"]["lost_events"]), 0);
}

/// An attached recorder (`--pid`) only watches: a process of the tree it
/// attached to that maps the driver late is never stopped, and the calls
/// it made before the probes went on are counted as a window.
#[test]
fn an_attached_recorder_never_holds_and_counts_the_window() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-attach");
    let (libs, job) = late_standins(&dir, 1);
    let nvctl = dir.path("nvidiactl");
    std::fs::write(&nvctl, b"").unwrap();
    let go = dir.path("go");
    // Waits for the recorder to be attached, then becomes the job: the
    // test's own process, so the recorder may attach to it.
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; exec '{}' '{}' window 1200",
        go.display(),
        job.display(),
        libs[0].display()
    );
    let mut j = Command::new("/bin/sh")
        .args(["-c", &script])
        .env("STANDIN_NVIDIACTL", &nvctl)
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .spawn()
        .expect("start the job");
    let rec = dir.path("attach.rec");
    let pid = j.id().to_string();
    let mut r = spawn_until(
        &[
            "record".as_ref(),
            "-o".as_ref(),
            rec.as_os_str(),
            "--pid".as_ref(),
            pid.as_ref(),
        ],
        // Said once the tree is in the kernel's job map: a mapping before
        // it would be the maps scan's to find.
        "trainbpf: attached;",
    );
    std::fs::write(&go, b"").unwrap();
    assert!(j.wait().unwrap().success(), "the job ran to its end");
    assert!(r.wait().unwrap().success(), "the recorder ended with it");
    let rep = report_json(&rec);
    let g = &rep["gpu"];
    let late = g["late"].as_array().expect("gpu.late");
    assert_eq!(late.len(), 1, "{late:#?}");
    let w = &late[0];
    eprintln!("{w:#}");
    assert_eq!(w["held"], false, "never stopped: {w}");
    assert_eq!(u(&w["pid"]), j.id() as u64);
    assert_eq!(u(&w["calls"]), 4, "the four calls before the attach: {w}");
    assert!(
        w["note"]
            .as_str()
            .is_some_and(|n| n.contains("only watches")),
        "{w}"
    );
    assert_eq!(u(&g["lost"]["held"]), 0);
    // The call after the window is the probes'.
    let p = gpu_proc(&rep, j.id() as u64);
    assert_eq!(u(&p["calls"]), 1, "{p:#}");
}

/// How long the kernel's hold may last before the hold's watchdog ends it
/// (trainbpf/src/record/gpu/watchdog.rs, `HOLD_LIMIT`).
const HOLD_LIMIT: Duration = Duration::from_secs(3);

/// The first process below `root` named `comm` that is stopped.
fn stopped(root: u32, comm: &str) -> Option<Started> {
    descendants(root)
        .into_iter()
        .find(|p| state_of(p.pid).is_some_and(|(st, c)| st == 'T' && c == comm))
}

// A recorder that died while holding left the job
// stopped for good.
/// The recorder is SIGKILLed while a job process is held (the test switch
/// keeps the hold on for a minute): the hold's watchdog sees the recorder
/// gone and continues the process at once, well within the hold's limit,
/// and the job runs to its end.
#[test]
fn a_held_process_runs_on_when_the_recorder_is_killed() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-killed");
    let (libs, job) = late_standins(&dir, 1);
    let said = dir.path("job.out");
    let script = format!(
        "exec '{}' '{}' > '{}'",
        job.display(),
        libs[0].display(),
        said.display()
    );
    let rec = dir.path("killed.rec");
    let mut recorder = gpu_record_command(
        &rec,
        &[("TRAINBPF_TEST_GPU_HOLD_MS", "60000")],
        &["/bin/sh", "-c", &script],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("starting trainbpf record");
    let rpid = recorder.id();
    let held = poll(Duration::from_secs(60), || stopped(rpid, "late_job"));
    let tree = descendants(rpid);
    let Some(held) = held else {
        let _ = recorder.kill();
        kill_started(&tree);
        panic!("the job was never seen held");
    };
    std::thread::sleep(Duration::from_millis(300));
    let still = state_of(held.pid).map(|s| s.0);
    recorder.kill().expect("SIGKILL to the recorder");
    let killed = Instant::now();
    let _ = recorder.wait();
    let resumed = poll(Duration::from_secs(10), || {
        state_of(held.pid)
            .is_none_or(|(st, _)| st != 'T')
            .then(|| killed.elapsed())
    });
    let ended = poll(Duration::from_secs(10), || {
        state_of(held.pid)
            .is_none_or(|(st, _)| st == 'Z')
            .then_some(())
    });
    kill_started(&tree);
    assert_eq!(still, Some('T'), "held until the recorder died");
    let resumed = resumed.unwrap_or_else(|| {
        panic!(
            "pid {} is still stopped 10 s after the recorder was killed",
            held.pid
        )
    });
    eprintln!(
        "pid {} running again {} ms after the recorder's death",
        held.pid,
        resumed.as_millis()
    );
    assert!(
        resumed < HOLD_LIMIT / 2,
        "continued only {} ms after the recorder died",
        resumed.as_millis()
    );
    assert!(ended.is_some(), "the job ran to its end");
    let out = std::fs::read_to_string(&said).unwrap_or_default();
    assert!(out.contains("first call returned"), "{out}");
}

// Nothing bounded a hold in time.
/// A recorder stuck for 10 s on a held process (the test switch): the
/// hold's watchdog continues the process once the hold's limit has
/// passed, and the recording counts the hold that timed out and the
/// window it left. A recording that holds attaches no system call
/// tracepoint, so the window's driver calls are not counted, and it says
/// so.
#[test]
fn a_hold_past_its_limit_is_ended_and_its_window_counted() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-limit");
    let (libs, job) = late_standins(&dir, 1);
    let nvctl = dir.path("nvidiactl");
    std::fs::write(&nvctl, b"").unwrap();
    let rec = dir.path("limit.rec");
    let out = gpu_record(
        &rec,
        &[
            ("TRAINBPF_TEST_GPU_HOLD_MS", "10000"),
            ("STANDIN_NVIDIACTL", nvctl.to_str().unwrap()),
        ],
        &[job.to_str().unwrap(), libs[0].to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let took_us: u64 = stdout
        .lines()
        .find_map(|l| {
            l.split_once(": dlopen took ")?
                .1
                .strip_suffix(" us")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no dlopen time: {stdout}"));
    let took = Duration::from_micros(took_us);
    eprintln!("dlopen (and the hold in it) took {} ms", took.as_millis());
    assert!(
        took >= HOLD_LIMIT - Duration::from_millis(100) && took < HOLD_LIMIT * 2,
        "held {} ms; the limit is {} ms",
        took.as_millis(),
        HOLD_LIMIT.as_millis()
    );
    let r = report_json(&rec);
    let g = &r["gpu"];
    eprintln!("late: {:#}\nlost: {:#}", g["late"], g["lost"]);
    assert_eq!(u(&g["lost"]["hold_timeouts"]), 1);
    assert_eq!(u(&g["lost"]["held"]), 0, "not held until probed");
    let late = g["late"].as_array().unwrap();
    assert_eq!(late.len(), 1, "{late:#?}");
    let w = &late[0];
    assert_eq!(w["held"], false, "{w}");
    assert_eq!(u(&w["calls"]), 0, "its calls after the limit: {w}");
    assert!(
        w["note"]
            .as_str()
            .is_some_and(|n| n.contains("limit") && n.contains("were not counted")),
        "{w}"
    );
    assert_eq!(u(&g["lost"]["window_calls"]), 0);
}

// A held process killed before its release left its
// hold behind, and the recorder continued whatever process had its pid
// next.
/// A held worker is killed and reaped; a process of the test's own, not
/// the job's, takes its pid (ns_last_pid) and waits for a SIGCONT. When
/// the recorder's hold delay ends it must send none: the hold ended with
/// the worker.
#[test]
fn a_held_process_killed_before_its_release_leaves_no_hold_behind() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-late-reuse");
    let (libs, job) = late_standins(&dir, 1);
    let script = format!("'{}' '{}' fork; sleep 5", job.display(), libs[0].display());
    let rec = dir.path("reuse.rec");
    let mut recorder = gpu_record_command(
        &rec,
        &[("TRAINBPF_TEST_GPU_HOLD_MS", "2000")],
        &["/bin/sh", "-c", &script],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("starting trainbpf record");
    let rpid = recorder.id();
    let held = poll(Duration::from_secs(60), || stopped(rpid, "late_job"));
    let seen = Instant::now();
    let Some(held) = held else {
        let _ = recorder.kill();
        panic!("the worker was never seen held");
    };
    kill_started(&[held]);
    // Reaped by its parent: the pid is free.
    let freed = poll(Duration::from_secs(5), || {
        state_of(held.pid).is_none().then_some(())
    });
    assert!(freed.is_some(), "pid {} never freed", held.pid);
    // Blocks SIGCONT, says it is ready, and writes who sent one, if any.
    let wait_cont = "import signal, sys\n\
                     signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})\n\
                     open(sys.argv[1], 'w').close()\n\
                     i = signal.sigtimedwait({signal.SIGCONT}, 10)\n\
                     open(sys.argv[2], 'w').write(str(i.si_pid))\n";
    let (ready, got) = (dir.path("ready"), dir.path("sigcont-from"));
    let mut other = None;
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (held.pid - 1).to_string())
            .expect("writing ns_last_pid");
        let mut c = Command::new(python())
            .args(["-I", "-c", wait_cont])
            .args([&ready, &got])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        if c.id() == held.pid {
            other = Some(c);
            break;
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    let Some(mut other) = other else {
        let _ = recorder.kill();
        panic!("pid {} could not be taken again", held.pid);
    };
    let waiting = poll(Duration::from_secs(10), || ready.exists().then_some(()));
    // Past the recorder's release (2 s after the mapping), with margin.
    std::thread::sleep(Duration::from_millis(3500).saturating_sub(seen.elapsed()));
    let sender = std::fs::read_to_string(&got).ok();
    let _ = other.kill();
    let _ = other.wait();
    let status = recorder.wait().unwrap();
    assert!(waiting.is_some(), "the other process got ready");
    eprintln!(
        "pid {} now names a process outside the job; SIGCONT from: {sender:?} (the recorder is {rpid})",
        held.pid
    );
    assert!(
        sender.is_none(),
        "pid {} sent SIGCONT to pid {}, a process outside the job that took the held worker's pid",
        sender.as_deref().unwrap_or("?"),
        held.pid
    );
    assert!(status.success(), "{status}");
    let r = report_json(&rec);
    let late = r["gpu"]["late"].as_array().unwrap();
    eprintln!("{late:#?}");
    assert_eq!(late.len(), 1, "{late:#?}");
    assert!(
        late[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("exited while held")),
        "{late:#?}"
    );
}
