//! A report people can read: an exec starts a process's peak over, and
//! an attach's report names what it attached to and keeps the recorder
//! and kernel threads out of the job.

use super::*;

fn exit(secs: f64, k: ProcKey, comm: &str, kthread: bool) -> Timed {
    at(
        secs,
        Event::Exit {
            proc: k,
            comm: comm.into(),
            exit_code: 0,
            group_exit_code: 0,
            kthread,
        },
    )
}

#[test]
fn a_fork_that_execs_is_not_its_parents_size() {
    let child = key(701, s(1.0));
    let r = run(vec![
        job_start(0.0, ROOT),
        mem(0.5, ROOT, "python3", 450 * MIB, true),
        fork(1.0, child, ROOT, "python3"),
        // The fork holds its parent's pages until it execs...
        mem(1.001, child, "python3", 450 * MIB, true),
        exec(1.01, child, "ldconfig"),
        mem(1.02, child, "ldconfig", 2 * MIB, true),
        // ...and a record from before the exec can come in after it.
        mem(1.005, child, "python3", 450 * MIB, true),
        exit(1.05, child, "ldconfig", false),
        mem(2.0, ROOT, "python3", 450 * MIB, true),
    ]);
    let p = r.processes.iter().find(|p| p.pid == 701).unwrap();
    assert_eq!(p.peak_rss_kb, 2 * MIB);
    let line = r.series.proc(701, child.start_ns).unwrap();
    assert_eq!(line.peak_kb, 2 * MIB);
    assert!(
        r.top_memory
            .iter()
            .filter(|u| u.pid == 701)
            .all(|u| u.peak_rss_kb == 2 * MIB),
        "{:?}",
        r.top_memory
    );
    // A process that never execs keeps what it held.
    let root = r.processes.iter().find(|p| p.pid == ROOT.tgid).unwrap();
    assert_eq!(root.peak_rss_kb, 450 * MIB);
}

fn attach_start(secs: f64, attached: &str, target: Option<&str>) -> Timed {
    at(
        secs,
        Event::JobStart(JobStart {
            pid: 0,
            start_ns: 0,
            argv: vec![],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            cgroup: target.map(|_| "/x".into()),
            memory_limit_bytes: None,
            attached: Some(attached.into()),
            target: target.map(String::from),
        }),
    )
}

#[test]
fn an_attach_names_what_it_attached_to_and_keeps_the_recorder_apart() {
    let recorder = key(500, 10);
    let helper = key(501, s(0.2));
    let kworker = key(900, s(0.3));
    let user = key(600, s(0.4));
    let header = RecordingHeader {
        recorder_pid: Some(500),
        ..RecordingHeader::default()
    };
    let events = vec![
        attach_start(0.0, "all", None),
        mem(0.1, recorder, "trainbpf", 60 * MIB, true),
        fork(0.2, helper, recorder, "trainbpf"),
        exec(0.21, helper, "ldconfig"),
        exit(0.25, helper, "ldconfig", false),
        fork(0.3, kworker, key(2, 1), "kthreadd"),
        exit(0.35, key(77, 5), "kworker/0:1", true),
        fork(0.4, user, key(1, 1), "bash"),
        mem(0.5, user, "python3", 30 * MIB, true),
    ];
    let r = build(&header, events.into_iter(), &ModelOptions::default());
    assert_eq!(r.title(), "all processes");
    let pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
    assert_eq!(
        pids,
        vec![600],
        "no pid 0, recorder, helper or kernel thread"
    );
    assert!(r.deaths.is_empty(), "{:?}", r.deaths);
    assert!(r.series.procs.iter().all(|p| p.pid != 500 || !p.in_job));
    assert_eq!(r.left_out.recorder_pid, Some(500));
    assert_eq!(r.left_out.recorder_helpers, 1);
    assert_eq!(r.left_out.kernel_threads, 2);
    // Its memory is still seen, as outside the job.
    assert!(r.top_memory.iter().any(|u| u.pid == 500 && !u.in_job));
}

#[test]
fn titles_name_the_attachment() {
    let r = run(vec![attach_start(
        0.0,
        "cgroup",
        Some("/sys/fs/cgroup/memory/x"),
    )]);
    assert_eq!(r.title(), "cgroup /sys/fs/cgroup/memory/x");
    assert!(r.processes.is_empty());
    let mut j = r.job.clone().unwrap();
    j.attached = Some("pid".into());
    j.pid = 42;
    assert_eq!(j.title(Some("python3")), "pid 42 (python3)");
    j.attached = None;
    j.argv = vec!["python3".into(), "train.py".into()];
    assert_eq!(j.title(None), "python3 train.py");
}
