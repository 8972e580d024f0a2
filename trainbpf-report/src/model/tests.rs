//! The model end to end: events in, a report out.

use super::*;
use crate::decode::MemSample;
use crate::decode::{
    ExitStatus, JobExit, JobStart, OomControl, OomRecord, OomRecordKind, Rss, Task,
};

const MIB: u64 = 1024;

fn key(tgid: u32, start_ns: u64) -> ProcKey {
    ProcKey { tgid, start_ns }
}

fn s(secs: f64) -> u64 {
    (secs * SEC as f64) as u64
}

fn at(secs: f64, event: Event) -> Timed {
    Timed {
        ts_ns: s(secs),
        event,
    }
}

fn mem(secs: f64, k: ProcKey, comm: &str, anon_kb: u64, in_job: bool) -> Timed {
    at(
        secs,
        Event::Mem(MemSample {
            proc: k,
            in_job,
            comm: comm.into(),
            rss: Rss {
                anon_kb,
                file_kb: 0,
                shmem_kb: 0,
                swap_kb: 0,
            },
            faults: 0,
            reason: 1,
            oom_score_adj: 0,
            pgtables_kb: 0,
            memcg_id: 0,
            stall_ns: 0,
            alloc_kb: 0,
            freed_kb: 0,
            cache_kb: 0,
        }),
    )
}

fn fork(secs: f64, child: ProcKey, parent: ProcKey, comm: &str) -> Timed {
    at(
        secs,
        Event::Fork {
            child,
            parent,
            comm: comm.into(),
            kthread: false,
        },
    )
}

fn exec(secs: f64, k: ProcKey, comm: &str) -> Timed {
    at(
        secs,
        Event::Exec {
            proc: k,
            comm: comm.into(),
            filename: format!("/usr/bin/{comm}"),
            truncated: false,
            held: false,
        },
    )
}

fn job_start(secs: f64, root: ProcKey) -> Timed {
    at(
        secs,
        Event::JobStart(JobStart {
            pid: root.tgid,
            start_ns: root.start_ns,
            argv: vec!["python3".into(), "train.py".into()],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            cgroup: Some("/trainbpf-77".into()),
            memory_limit_bytes: Some(300 << 20),
            attached: None,
            target: None,
        }),
    )
}

fn oom(
    secs: f64,
    kind: OomRecordKind,
    victim: ProcKey,
    comm: &str,
    anon_kb: u64,
    oc: Option<OomControl>,
) -> Timed {
    at(
        secs,
        Event::Oom(Box::new(OomRecord {
            kind,
            source: match kind {
                OomRecordKind::Kill => "fentry".into(),
                OomRecordKind::Victim => "tp_btf".into(),
            },
            victim,
            victim_pid: victim.tgid,
            comm: comm.into(),
            in_job: true,
            uid: 0,
            oom_score_adj: 0,
            rss: Rss {
                anon_kb,
                file_kb: 0,
                shmem_kb: 0,
                swap_kb: 0,
            },
            total_vm_kb: 0,
            pgtables_kb: 0,
            memcg_id: 0,
            oc,
            trigger: Task {
                pid: victim.tgid,
                tgid: victim.tgid,
                comm: comm.into(),
            },
        })),
    )
}

fn printk(secs: f64, msg: &str) -> Timed {
    at(
        secs,
        Event::Printk {
            tgid: 0,
            msg: msg.into(),
        },
    )
}

fn run(events: Vec<Timed>) -> Report {
    build(
        &RecordingHeader::default(),
        events.into_iter(),
        &ModelOptions::default(),
    )
}

fn grower(k: &Kill, pid: u32) -> Option<&Grower> {
    k.growers.iter().find(|g| g.pid == pid)
}

const ROOT: ProcKey = ProcKey {
    tgid: 700,
    start_ns: 1_000,
};

/// The demo's shape: python3(700) forks a worker that leaks until the
/// memcg kills it.
fn leak_run() -> Vec<Timed> {
    let w = key(812, s(5.0));
    vec![
        job_start(0.0, ROOT),
        exec(0.1, ROOT, "python3"),
        mem(0.2, ROOT, "python3", 40 * MIB, true),
        fork(5.0, w, ROOT, "python3"),
        mem(5.1, w, "pt_data_worker", 10 * MIB, true),
        mem(10.0, w, "pt_data_worker", 100 * MIB, true),
        mem(17.0, w, "pt_data_worker", 250 * MIB, true),
        printk(17.05, "memory: usage 307200kB, limit 307200kB, failcnt 12"),
        oom(
            17.1,
            OomRecordKind::Kill,
            w,
            "pt_data_worker",
            255 * MIB,
            Some(OomControl {
                constraint: 3,
                chosen_points: 65000,
                totalpages: 76800,
                memcg_id: 55,
            }),
        ),
        oom(
            17.1005,
            OomRecordKind::Victim,
            w,
            "pt_data_worker",
            257 * MIB,
            None,
        ),
        printk(
            17.101,
            "Memory cgroup out of memory: Killed process 812 (pt_data_worker) total-vm:900000kB, anon-rss:263168kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:700kB oom_score_adj:0",
        ),
        at(
            17.2,
            Event::Cgroup(CgroupName {
                id: 55,
                path: "/trainbpf-77".into(),
            }),
        ),
        at(
            18.0,
            Event::Exit {
                proc: w,
                comm: "pt_data_worker".into(),
                exit_code: 9,
                group_exit_code: 9,
                kthread: false,
            },
        ),
        at(
            19.0,
            Event::JobExit(JobExit {
                pid: 700,
                status: ExitStatus::Code(1),
            }),
        ),
    ]
}

fn mem_in(secs: f64, k: ProcKey, comm: &str, anon_kb: u64, memcg_id: u64) -> Timed {
    let mut t = mem(secs, k, comm, anon_kb, false);
    if let Event::Mem(MemSample { memcg_id: m, .. }) = &mut t.event {
        *m = memcg_id;
    }
    t
}

#[test]
fn a_memcg_oom_lists_no_grower_from_another_cgroup() {
    let mut evs = leak_run();
    let name = |secs, id, path: &str| {
        at(
            secs,
            Event::Cgroup(CgroupName {
                id,
                path: path.into(),
            }),
        )
    };
    evs.insert(1, name(0.5, 99, "/other"));
    evs.insert(1, name(0.5, 56, "/trainbpf-77/sub"));
    evs.insert(1, name(0.5, 1, "/"));
    // Each outgrows the worker; only the ones inside the cgroup that
    // ran out (or whose cgroup is unknown) count.
    for (pid, memcg) in [(901, 99), (902, 1), (903, 56), (904, 0)] {
        let k = key(pid, s(1.0));
        evs.push(mem_in(6.0, k, "other", MIB, memcg));
        evs.push(mem_in(16.0, k, "other", 900 * MIB, memcg));
    }
    evs.sort_by_key(|t| t.ts_ns);
    let r = run(evs);
    let k = &r.kills[0];
    assert_eq!(k.memcg.as_deref(), Some("/trainbpf-77"));
    let pids: Vec<u32> = k.growers.iter().map(|g| g.pid).collect();
    assert!(pids.contains(&903), "a child cgroup's process: {pids:?}");
    assert!(
        pids.contains(&904),
        "an unknown cgroup is not ruled out: {pids:?}"
    );
    assert!(!pids.contains(&901) && !pids.contains(&902), "{pids:?}");
    assert!(pids.contains(&812), "the victim: {pids:?}");
}

#[test]
fn victim_and_kill_records_merge_into_one_kill() {
    let r = run(leak_run());
    assert_eq!(r.kills.len(), 1, "{:#?}", r.kills);
    let k = &r.kills[0];
    assert_eq!(k.ts_ns, s(17.1));
    assert_eq!(k.constraint, Constraint::Memcg);
    assert_eq!(k.kernel_points, Some(65000));
    assert_eq!(k.totalpages, Some(76800));
    // mark_victim's counters win over oom_kill_process's.
    assert_eq!(k.victim.rss.anon_kb, 257 * MIB);
    assert_eq!(
        k.sources,
        vec![
            KillSource {
                record: OomRecordKind::Kill,
                probe: "fentry".into()
            },
            KillSource {
                record: OomRecordKind::Victim,
                probe: "tp_btf".into()
            },
        ]
    );
    // Resolved from the cgroup record that came after the kill.
    assert_eq!(k.memcg.as_deref(), Some("/trainbpf-77"));
    assert_eq!(k.memcg_usage_kb, Some(307200));
    assert_eq!(k.memcg_limit_kb, Some(307200));
    assert_eq!(k.victim.total_vm_kb, 900000);
    assert_eq!(k.victim.pgtables_kb, 700);
    assert_eq!(k.kernel_log.len(), 2);
    assert_eq!(r.job.as_ref().unwrap().exit, Some(ExitStatus::Code(1)));
}

#[test]
fn same_pid_killed_twice_far_apart_is_two_kills() {
    let w = key(812, s(1.0));
    let w2 = key(812, s(30.0));
    let r = run(vec![
        oom(10.0, OomRecordKind::Victim, w, "a", MIB, None),
        oom(40.0, OomRecordKind::Victim, w2, "a", MIB, None),
    ]);
    assert_eq!(r.kills.len(), 2);
}

#[test]
fn grower_born_in_window_grows_from_zero() {
    let r = run(leak_run());
    let g = grower(&r.kills[0], 812).expect("the worker grew");
    assert!(g.born_in_window);
    assert!(g.is_victim);
    // From nothing at its fork (t=5 s) to mark_victim's 257 MiB at 17.1 s.
    assert_eq!(g.grew_kb, 257 * MIB);
    assert_eq!(g.rss_kb, 257 * MIB);
    assert_eq!(g.window_ns, s(17.1) - s(5.0));
    let rate = g.rate_kb_per_s.unwrap();
    assert!((rate - 257.0 * 1024.0 / 12.1).abs() < 1.0, "{rate}");
    assert_eq!(g.comm, "pt_data_worker");
}

#[test]
fn already_big_process_first_seen_in_window_is_not_growth() {
    // Regression: a 2 GiB process the recorder first saw 10 s before the
    // kill was reported as having grown 2 GiB.
    let big = key(900, 1_000);
    let w = key(901, 1_000);
    let r = run(vec![
        mem(100.0, big, "postgres", 2048 * MIB, false),
        mem(105.0, big, "postgres", 2058 * MIB, false),
        mem(50.0, w, "worker", MIB, true),
        mem(109.0, w, "worker", 101 * MIB, true),
        oom(110.0, OomRecordKind::Victim, w, "worker", 101 * MIB, None),
    ]);
    let k = &r.kills[0];
    let g = grower(k, 900).expect("postgres grew 10 MiB");
    assert_eq!(g.grew_kb, 10 * MIB);
    assert_eq!(g.window_ns, s(5.0));
    assert!(!g.born_in_window);
    assert!(!g.in_job);
    // The worker's baseline is its sample before the window (t=50 s).
    let top = &k.growers[0];
    assert_eq!((top.pid, top.grew_kb), (901, 100 * MIB));
    assert_eq!(top.window_ns, s(60.0));
}

#[test]
fn baseline_is_last_sample_before_window_not_first_ever() {
    let p = key(10, 1);
    let r = run(vec![
        mem(1.0, p, "p", 1000, true),
        mem(20.0, p, "p", 50 * MIB, true),
        mem(80.0, p, "p", 60 * MIB, true),
        mem(95.0, p, "p", 90 * MIB, true),
        oom(100.0, OomRecordKind::Victim, key(11, 1), "q", MIB, None),
    ]);
    let g = grower(&r.kills[0], 10).unwrap();
    // Window [40, 100]: baseline is the 20 s sample, end the 95 s one.
    assert_eq!(g.grew_kb, 40 * MIB);
    assert_eq!(g.window_ns, s(75.0));
    assert_eq!(g.rss_kb, 90 * MIB);
}

#[test]
fn grower_outranks_victim_that_did_not_grow() {
    // The sibling with oom_score_adj 1000 is killed; the process that
    // grew is someone else, and must top the list.
    let a = key(801, s(1.0));
    let b = key(802, s(1.0));
    let mut evs = vec![
        job_start(0.0, ROOT),
        fork(1.0, a, ROOT, "python3"),
        fork(1.0, b, ROOT, "python3"),
        mem(2.0, a, "leaker", 10 * MIB, true),
        mem(2.0, b, "sacrifice", 50 * MIB, true),
        mem(70.0, a, "leaker", 100 * MIB, true),
        mem(75.0, a, "leaker", 240 * MIB, true),
    ];
    let mut kill = oom(76.0, OomRecordKind::Victim, b, "sacrifice", 50 * MIB, None);
    if let Event::Oom(r) = &mut kill.event {
        r.oom_score_adj = 1000;
    }
    evs.push(kill);
    let r = run(evs);
    let k = &r.kills[0];
    assert_eq!(k.victim.pid, 802);
    assert_eq!(k.victim.oom_score_adj, 1000);
    assert_eq!(k.growers.len(), 1, "{:#?}", k.growers);
    assert_eq!(k.growers[0].pid, 801);
    assert_eq!(k.growers[0].grew_kb, 230 * MIB);
    assert!(!k.growers[0].is_victim);
}

#[test]
fn job_growers_stay_listed_on_a_busy_machine() {
    let w = key(801, s(1.0));
    let v = key(802, s(1.0));
    let mut evs = vec![
        job_start(0.0, ROOT),
        fork(1.0, w, ROOT, "python3"),
        fork(1.0, v, ROOT, "python3"),
        mem(2.0, w, "worker", 5 * MIB, true),
    ];
    // Twelve compilers outside the job, each outgrowing the worker.
    for i in 0..12 {
        evs.push(mem(3.0, key(900 + i, s(2.5)), "rustc", 500 * MIB, false));
    }
    evs.push(oom(5.0, OomRecordKind::Victim, v, "victim", MIB, None));
    let r = run(evs);
    let g = &r.kills[0].growers;
    assert!(
        g.iter().any(|g| g.pid == 801),
        "the job's grower is listed: {g:#?}"
    );
    assert!(g.iter().any(|g| g.is_victim), "the victim is listed");
    assert_eq!(
        g.iter().filter(|g| !g.in_job).count(),
        10,
        "and the machine's top ten"
    );
}

/// Regression (seen on Linux 5.10): the classic mark_victim record has
/// only a pid and no start time; it must neither blank the victim that
/// the fentry record described nor make a second process of it.
#[test]
fn pid_only_tracepoint_record_keeps_the_probe_figures() {
    let g = key(801, s(1.0));
    let mut kill = oom(5.0, OomRecordKind::Kill, g, "grow", 64 * MIB, None);
    if let Event::Oom(r) = &mut kill.event {
        r.oc = Some(crate::decode::OomControl {
            constraint: 3,
            chosen_points: 16_484,
            totalpages: 16_384,
            memcg_id: 7,
        });
    }
    let mut victim = oom(5.001, OomRecordKind::Victim, key(801, 0), "", 0, None);
    if let Event::Oom(r) = &mut victim.event {
        r.source = "tracepoint".into();
    }
    let r = run(vec![
        job_start(0.0, ROOT),
        fork(1.0, g, ROOT, "grow"),
        mem(2.0, g, "grow", 10 * MIB, true),
        kill,
        victim,
    ]);
    assert_eq!(r.kills.len(), 1);
    let v = &r.kills[0].victim;
    assert_eq!(v.comm, "grow");
    assert_eq!(v.rss.anon_kb, 64 * MIB);
    assert_eq!(r.processes.iter().filter(|p| p.pid == 801).count(), 1);
}

/// Regression: a worker renamed after fork (`pt_data_worker`) sent no
/// memory record since, and was listed under its parent's name.
#[test]
fn grower_takes_the_name_it_had_at_exit() {
    let w = key(801, s(1.0));
    let v = key(802, s(1.0));
    let r = run(vec![
        job_start(0.0, ROOT),
        fork(1.0, w, ROOT, "pt_main_thread"),
        fork(1.0, v, ROOT, "pt_main_thread"),
        mem(1.5, w, "pt_main_thread", 60 * MIB, true),
        oom(5.0, OomRecordKind::Victim, v, "pt_data_worker", MIB, None),
        at(
            5.2,
            Event::Exit {
                proc: w,
                comm: "pt_data_worker".into(),
                exit_code: 15,
                group_exit_code: 15,
                kthread: false,
            },
        ),
    ]);
    let g = r.kills[0]
        .growers
        .iter()
        .find(|g| g.pid == 801)
        .expect("worker grew");
    assert_eq!(g.comm, "pt_data_worker");
}

#[test]
fn grandchild_tree_path() {
    let mid = key(710, s(1.0));
    let leaf = key(720, s(2.0));
    let r = run(vec![
        job_start(0.0, ROOT),
        exec(0.1, ROOT, "python3"),
        fork(1.0, mid, ROOT, "python3"),
        exec(1.1, mid, "torchrun"),
        fork(2.0, leaf, mid, "torchrun"),
        exec(2.1, leaf, "pt_data_worker"),
        oom(
            3.0,
            OomRecordKind::Victim,
            leaf,
            "pt_data_worker",
            MIB,
            None,
        ),
    ]);
    let tree: Vec<_> = r.kills[0]
        .victim
        .tree
        .iter()
        .map(|n| (n.pid, n.comm.as_str()))
        .collect();
    assert_eq!(
        tree,
        vec![(700, "python3"), (710, "torchrun"), (720, "pt_data_worker")]
    );
    // A victim outside the job has no place in its tree.
    let mut out = oom(
        4.0,
        OomRecordKind::Victim,
        key(5000, 1),
        "chrome",
        MIB,
        None,
    );
    if let Event::Oom(r) = &mut out.event {
        r.in_job = false;
    }
    let r = run(vec![job_start(0.0, ROOT), out]);
    assert!(r.kills[0].victim.tree.is_empty());
}

#[test]
fn several_kills_get_their_own_windows() {
    let a = key(801, 1);
    let b = key(802, 1);
    let r = run(vec![
        mem(101.0, a, "a", MIB, true),
        mem(101.0, b, "b", MIB, true),
        mem(150.0, a, "a", 200 * MIB, true),
        oom(155.0, OomRecordKind::Victim, a, "a", 200 * MIB, None),
        at(
            156.0,
            Event::Exit {
                proc: a,
                comm: "a".into(),
                exit_code: 9,
                group_exit_code: 9,
                kthread: false,
            },
        ),
        // b only starts growing after the first kill.
        mem(170.0, b, "b", 20 * MIB, true),
        mem(199.0, b, "b", 300 * MIB, true),
        oom(200.0, OomRecordKind::Victim, b, "b", 300 * MIB, None),
    ]);
    assert_eq!(r.kills.len(), 2);
    let (k1, k2) = (&r.kills[0], &r.kills[1]);
    assert_eq!(k1.growers.len(), 1, "{:#?}", k1.growers);
    assert_eq!((k1.growers[0].pid, k1.growers[0].grew_kb), (801, 199 * MIB));
    // a grew inside the second window too, but died at the first kill:
    // the dead hold nothing when the second one comes.
    assert_eq!(k2.growers.len(), 1, "{:#?}", k2.growers);
    // b's baseline for the second window [140, 200] is its 101 s sample.
    assert_eq!((k2.growers[0].pid, k2.growers[0].grew_kb), (802, 299 * MIB));
    assert_eq!(k2.growers[0].window_ns, s(99.0));
}

#[test]
fn recycled_pid_is_a_different_process() {
    let old = key(900, s(1.0));
    let new = key(900, s(80.0));
    let r = run(vec![
        mem(1.0, old, "old", 500 * MIB, false),
        // The old process is gone; a new one gets its pid, small.
        mem(80.0, new, "new", 5 * MIB, false),
        mem(90.0, new, "new", 25 * MIB, false),
        oom(100.0, OomRecordKind::Victim, key(1, 1), "x", MIB, None),
    ]);
    let k = &r.kills[0];
    let g = grower(k, 900).unwrap();
    // Born in the window: from zero, not from the old process's 500 MiB
    // (which would make it "shrink"), and not counted as the old one.
    assert_eq!(g.start_ns, s(80.0));
    assert_eq!(g.grew_kb, 25 * MIB);
    assert!(g.born_in_window);
    assert_eq!(k.growers.iter().filter(|g| g.pid == 900).count(), 1);
}

#[test]
fn memory_stays_bounded_over_a_long_recording() {
    let p = key(10, 1);
    let mut b = Builder::new(&ModelOptions::default(), &RecordingHeader::default());
    for i in 0..100_000u64 {
        b.observe(mem(i as f64, p, "p", i, true));
        // Short-lived job processes come and go.
        let q = key(20_000 + (i % 1000) as u32, s(i as f64) + 1);
        b.observe(mem(i as f64, q, "q", 1, true));
        b.observe(at(
            i as f64 + 0.5,
            Event::Exit {
                proc: q,
                comm: "q".into(),
                exit_code: 0,
                group_exit_code: 0,
                kthread: false,
            },
        ));
    }
    let samples = b.tracks[&p].samples.len();
    assert!(samples <= 64, "{samples} samples kept for a 60 s window");
    assert!(b.tracks.len() < 200, "{} tracks kept", b.tracks.len());
}

#[test]
fn constraint_falls_back_to_printk_then_prefix() {
    let v = key(1234, 1);
    // No oom_kill_process record: the constraint comes from the log.
    let r = run(vec![
        printk(
            9.9,
            "oom-kill:constraint=CONSTRAINT_CPUSET,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=python3,pid=1234,uid=0",
        ),
        oom(10.0, OomRecordKind::Victim, v, "python3", MIB, None),
    ]);
    assert_eq!(r.kills[0].constraint, Constraint::Cpuset);
    assert_eq!(r.kills[0].task_memcg.as_deref(), Some("/user.slice"));

    let r = run(vec![
        oom(10.0, OomRecordKind::Victim, v, "python3", MIB, None),
        printk(
            10.01,
            "Out of memory: Killed process 1234 (python3) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
        ),
        // Another process's line must not decide this kill.
        printk(
            10.02,
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/x,task_memcg=/x,task=y,pid=4321,uid=0",
        ),
    ]);
    assert_eq!(r.kills[0].constraint, Constraint::None);
    assert_eq!(r.kills[0].memcg, None);

    let r = run(vec![oom(10.0, OomRecordKind::Victim, v, "p", MIB, None)]);
    assert_eq!(r.kills[0].constraint, Constraint::Unknown);
}

#[test]
fn root_recorded_without_start_time_is_matched_by_pid() {
    // The collector writes the job's start with start_ns 0; the root's
    // kernel records carry the real one, sometimes before the job-start
    // record in the file.
    let real = key(700, s(0.5));
    let child = key(710, s(2.0));
    let placeholder = key(700, 0);
    let r = run(vec![
        mem(0.6, real, "python3", 30 * MIB, true),
        job_start(0.4, placeholder),
        exec(0.7, real, "python3"),
        mem(1.0, real, "python3", 80 * MIB, true),
        fork(2.0, child, real, "python3"),
        oom(3.0, OomRecordKind::Victim, child, "worker", MIB, None),
    ]);
    assert_eq!(r.job.as_ref().unwrap().start_ns, s(0.5));
    let roots: Vec<_> = r.processes.iter().filter(|p| p.pid == 700).collect();
    assert_eq!(roots.len(), 1, "{roots:#?}");
    assert_eq!(roots[0].peak_rss_kb, 80 * MIB);
    assert_eq!(roots[0].comm, "python3");
    let tree: Vec<_> = r.kills[0].victim.tree.iter().map(|n| n.pid).collect();
    assert_eq!(tree, vec![700, 710]);

    // Root records only after the job start: the same outcome.
    let r = run(vec![
        job_start(0.4, placeholder),
        exec(0.7, real, "python3"),
        mem(1.0, real, "python3", 80 * MIB, true),
    ]);
    assert_eq!(r.processes.len(), 1, "{:#?}", r.processes);
    assert_eq!(r.processes[0].start_ns, s(0.5));
    assert_eq!(r.processes[0].peak_rss_kb, 80 * MIB);
}

#[test]
fn processes_summary_and_wait_status() {
    assert_eq!(wait_status(9), ExitStatus::Signal(9));
    assert_eq!(wait_status(1 << 8), ExitStatus::Code(1));
    assert_eq!(wait_status(0), ExitStatus::Code(0));
    let r = run(leak_run());
    let w = r.processes.iter().find(|p| p.pid == 812).unwrap();
    assert_eq!(w.parent, Some(ROOT));
    assert_eq!(w.exit, Some(ExitStatus::Signal(9)));
    assert_eq!(w.born_ns, Some(s(5.0)));
    assert_eq!(w.died_ns, Some(s(18.0)));
    assert_eq!(w.peak_rss_kb, 257 * MIB);
    assert!(w.oom_killed);
    let root = r.processes.iter().find(|p| p.pid == 700).unwrap();
    assert_eq!(root.exec.as_deref(), Some("/usr/bin/python3"));
    assert!(!root.oom_killed);
    assert_eq!(r.processes[0].pid, 700, "sorted by birth");
    assert_eq!(r.duration_ns(), s(19.0));
}

#[test]
fn added_is_capped_at_what_the_process_maps_and_page_cache_is_apart() {
    let mut header = RecordingHeader::default();
    header.attach.pages = Some("tp_btf:mm_page_alloc,mm_page_free".into());
    header.attach.page_cache = Some("tp_btf:mm_filemap_add_to_page_cache".into());
    let k = key(700, s(0.5));
    let sample = |secs, anon_kb, alloc_kb, cache_kb| {
        let mut t = mem(secs, k, "sh", anon_kb, true);
        if let Event::Mem(MemSample {
            alloc_kb: a,
            cache_kb: c,
            ..
        }) = &mut t.event
        {
            *a = alloc_kb;
            *c = cache_kb;
        }
        t
    };
    // A shell that forked thousands of commands: its copies of pages it
    // wrote while a child still shared them, freed by the children.
    let evs = vec![
        sample(1.0, 3 * MIB, 40 * MIB, 0),
        sample(2.0, 3 * MIB, 60 * MIB, 1024 * MIB as i64),
    ];
    let r = build(&header, evs.into_iter(), &ModelOptions::default());
    let p = r.processes.iter().find(|p| p.pid == 700).unwrap();
    assert_eq!(p.honest_kb, Some(3 * MIB as i64));
    assert_eq!(p.honest_peak_kb, Some(3 * MIB as i64));
    assert_eq!(p.page_cache_kb, Some(1024 * MIB as i64));
    // Without the page-cache probes (an older recording): as it was.
    header.attach.page_cache = None;
    let evs = vec![sample(1.0, 3 * MIB, 40 * MIB, 0)];
    let r = build(&header, evs.into_iter(), &ModelOptions::default());
    let p = r.processes.iter().find(|p| p.pid == 700).unwrap();
    assert_eq!(p.honest_kb, Some(40 * MIB as i64));
    assert_eq!(p.page_cache_kb, None);
}

/// Fork-then-exec peaks, attach titles, what is kept apart.
mod readable;
mod told;
mod windows;
