use trainbpf_report::decode::{CgroupName, OomControl, OomRecord, OomRecordKind, Rss, Task, Timed};

use super::*;

const S: u64 = 1_000_000_000;

fn oom(ts: u64, kind: OomRecordKind, pid: u32, comm: &str, oc: Option<u32>) -> Timed {
    Timed {
        ts_ns: ts,
        event: Event::Oom(Box::new(OomRecord {
            kind,
            source: "tp_btf".into(),
            victim: ProcKey {
                tgid: pid,
                start_ns: 7,
            },
            victim_pid: pid,
            comm: comm.into(),
            in_job: true,
            uid: 1000,
            oom_score_adj: 0,
            rss: Rss {
                anon_kb: 200 << 10,
                ..Default::default()
            },
            total_vm_kb: 0,
            pgtables_kb: 0,
            memcg_id: 42,
            oc: oc.map(|c| OomControl {
                constraint: c,
                chosen_points: 0,
                totalpages: 0,
                memcg_id: 42,
            }),
            trigger: Task {
                pid: pid + 1,
                tgid: pid + 1,
                comm: "grower".into(),
            },
        })),
    }
}

fn printk(ts: u64, msg: &str) -> Timed {
    Timed {
        ts_ns: ts,
        event: Event::Printk {
            tgid: 0,
            msg: msg.into(),
        },
    }
}

fn exit(ts: u64, pid: u32, comm: &str, status: u32) -> Timed {
    Timed {
        ts_ns: ts,
        event: Event::Exit {
            proc: ProcKey {
                tgid: pid,
                start_ns: 7,
            },
            comm: comm.into(),
            exit_code: status,
            group_exit_code: status,
            kthread: false,
        },
    }
}

fn kills(f: &[Finished]) -> Vec<&KillEvent> {
    f.iter()
        .filter_map(|f| match f {
            Finished::Kill(k) => Some(k),
            _ => None,
        })
        .collect()
}

fn deaths(f: &[Finished]) -> Vec<&DeathEvent> {
    f.iter()
        .filter_map(|f| match f {
            Finished::Death(d) => Some(d),
            _ => None,
        })
        .collect()
}

/// mark_victim alone (no oom_kill_process probe here): the constraint
/// waits for the kernel's "Killed process" line, and the SIGKILL death
/// waits for the kill, so that it is counted as the memcg OOM it was.
#[test]
fn a_kill_settles_on_its_log_line_and_its_death_follows() {
    let mut l = Live::new();
    l.on_user(&UserBody::Cgroup(CgroupName {
        id: 42,
        path: "/kubepods/burstable/pod0b1c2d3e-1111-2222-3333-444455556666/3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708".into(),
    }));
    l.on_user(&UserBody::ProcInfo(ProcInfo {
        tgid: 700,
        rank: Some(3),
        ..Default::default()
    }));
    l.observe(&oom(10 * S, OomRecordKind::Victim, 700, "python3", None));
    // The collector's line, told at the kill, goes with it.
    l.on_user(&UserBody::Verdict(trainbpf_report::decode::KillVerdict {
        proc: trainbpf_report::decode::ProcKey {
            tgid: 700,
            start_ns: 1,
        },
        line: "rank 3 (pid 700) was OOM-killed".into(),
    }));
    l.observe(&exit(10 * S + 5_000_000, 700, "python3", 9));
    assert_eq!(l.settle(10 * S + 10_000_000), vec![], "waits for the log");
    l.observe(&printk(
        10 * S + 20_000_000,
        "Memory cgroup out of memory: Killed process 700 (python3) total-vm:300000kB, anon-rss:204800kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:500kB oom_score_adj:0",
    ));
    let out = l.settle(10 * S + 30_000_000);
    let k = kills(&out);
    assert_eq!(k.len(), 1, "{out:?}");
    assert_eq!(k[0].constraint, Constraint::Memcg);
    assert_eq!(k[0].comm, "python3");
    assert_eq!(k[0].rank, Some(3));
    assert_eq!(k[0].container.as_deref(), Some("3f2a1b4c5d6e"));
    assert_eq!(k[0].rss_bytes, 200 << 20);
    assert_eq!(
        k[0].verdict.as_deref(),
        Some("rank 3 (pid 700) was OOM-killed")
    );
    let d = deaths(&out);
    assert_eq!(d.len(), 1, "{out:?}");
    assert_eq!(d[0].cause, Cause::OomMemcg);
    assert_eq!(d[0].sender_comm.as_deref(), Some("grower"));
    assert_eq!(l.settle(20 * S), vec![], "each once");
}

/// Two records of one kill count once; oom_kill_process's constraint
/// needs no log line; a kill nobody explains is counted as unknown once
/// its wait is over.
#[test]
fn records_of_one_kill_merge_and_an_unexplained_kill_still_counts() {
    let mut l = Live::new();
    l.observe(&oom(S, OomRecordKind::Kill, 800, "", Some(0)));
    l.observe(&oom(S + 1000, OomRecordKind::Victim, 800, "worker", None));
    let out = l.settle(S + 2000);
    let k = kills(&out);
    assert_eq!(k.len(), 1, "{out:?}");
    assert_eq!(
        (k[0].constraint, k[0].comm.as_str()),
        (Constraint::None, "worker")
    );
    l.observe(&oom(S + 3000, OomRecordKind::Victim, 800, "worker", None));
    assert_eq!(
        l.settle(S + 4000),
        vec![],
        "a late partner is the same kill"
    );

    l.observe(&oom(5 * S, OomRecordKind::Victim, 900, "lone", None));
    assert_eq!(l.settle(6 * S), vec![]);
    let k = l.settle(8 * S);
    assert_eq!(kills(&k)[0].constraint, Constraint::Unknown);
}

#[test]
fn deaths_by_signal_crash_and_exit() {
    let mut l = Live::new();
    l.observe(&Timed {
        ts_ns: S,
        event: Event::Signal(Box::new(trainbpf_report::decode::SignalRecord {
            target: ProcKey {
                tgid: 10,
                start_ns: 7,
            },
            target_pid: 10,
            comm: "job".into(),
            sig: 15,
            code: 0,
            result: 0,
            sender: Task {
                pid: 55,
                tgid: 55,
                comm: "kill".into(),
            },
            sender_uid: 0,
            sender_kthread: false,
            tty: None,
        })),
    });
    l.observe(&exit(2 * S, 10, "job", 15));
    l.observe(&exit(2 * S, 11, "job", 11 | 0x80));
    l.observe(&exit(2 * S, 12, "job", 3 << 8));
    let out = l.settle(2 * S);
    let d = deaths(&out);
    let causes: Vec<_> = d.iter().map(|d| d.cause).collect();
    assert_eq!(causes, [Cause::Signal, Cause::Crash, Cause::Exit]);
    assert_eq!(d[0].sender_comm.as_deref(), Some("kill"));
    assert_eq!(d[2].code, Some(3));
}

#[test]
fn the_jobs_memory_is_the_sum_of_its_live_processes() {
    let mut l = Live::new();
    let mem = |pid: u32, alloc: u64, rss: u64| Timed {
        ts_ns: S,
        event: Event::Mem(MemSample {
            proc: ProcKey {
                tgid: pid,
                start_ns: 7,
            },
            in_job: true,
            comm: "p".into(),
            rss: Rss {
                anon_kb: rss,
                ..Default::default()
            },
            faults: 0,
            reason: 0,
            oom_score_adj: 0,
            pgtables_kb: 0,
            memcg_id: 0,
            stall_ns: 0,
            alloc_kb: alloc,
            freed_kb: 0,
            cache_kb: 4,
        }),
    };
    l.observe(&mem(1, 100, 50));
    l.observe(&mem(2, 10, 5));
    l.observe(&mem(1, 200, 60));
    let j = l.job_memory();
    assert_eq!(
        (j.added, j.resident, j.page_cache),
        (210 << 10, 65 << 10, 8 << 10)
    );
    l.observe(&exit(2 * S, 1, "p", 0));
    assert_eq!(l.job_memory().added, 10 << 10);
}

/// Device and pinned memory held through CUDA, until the process ends
/// (the ledger's reorder window: a second on, the exit is applied).
#[test]
fn gpu_memory_held_until_the_process_ends() {
    use trainbpf_report::decode::gpu::{CudaCall, CudaOp, GpuEvent};
    let mut l = Live::new();
    let call = |ts: u64, op: CudaOp, size: u64, ptr: u64| Timed {
        ts_ns: ts,
        event: Event::Gpu(Box::new(GpuEvent::Cuda(CudaCall {
            proc: ProcKey {
                tgid: 5,
                start_ns: 7,
            },
            tid: 5,
            comm: "python3".into(),
            op,
            result: 0,
            device: None,
            size,
            ptr,
            handle: 0,
            aux: 0,
            entry_ns: ts,
        }))),
    };
    l.observe(&call(S, CudaOp::MemAlloc, 1 << 30, 0x1000));
    l.observe(&call(S + 1, CudaOp::MemHostAlloc, 1 << 20, 0x2000));
    l.observe(&exit(5 * S, 99, "other", 0));
    assert_eq!(l.gpu_held(), (1 << 30, 1 << 20));
    l.observe(&exit(6 * S, 5, "python3", 9));
    l.observe(&exit(8 * S, 98, "other", 0));
    l.settle(8 * S);
    assert_eq!(l.gpu_held(), (0, 0));
    assert!(l.gpu.as_ref().unwrap().held_now() == Default::default());
}

/// The identity read at exec names the victim's rank and its pod's
/// container, ahead of the kill's memory cgroup path (here trainbpf's own
/// `--memory-limit` cgroup, which names no container).
#[test]
fn a_victims_identity_record_gives_its_rank_and_container() {
    let mut l = Live::new();
    l.on_user(&UserBody::Cgroup(CgroupName {
        id: 42,
        path: "/trainbpf-1-abc".into(),
    }));
    let mut rec = trainbpf_report::decode::ProcIdentity {
        tgid: 900,
        ..Default::default()
    };
    rec.vars.insert("RANK".into(), "1".into());
    rec.cgroups.push(
        "/kubepods/burstable/pod0b1c2d3e-1111-2222-3333-444455556666/3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708".into(),
    );
    l.on_user(&UserBody::Identity(rec));
    l.observe(&oom(S, OomRecordKind::Kill, 900, "python3", Some(3)));
    l.observe(&oom(S + 1000, OomRecordKind::Victim, 900, "python3", None));
    let out = l.settle(S + 2000);
    let k = kills(&out);
    assert_eq!(k.len(), 1, "{out:?}");
    assert_eq!(k[0].rank, Some(1));
    assert_eq!(k[0].container.as_deref(), Some("3f2a1b4c5d6e"));
}

/// Rank 1 is OOM-killed; the agent then stops rank 0 (SIGTERM) and exits
/// 1: both deaths name the kill they followed. A clean exit and the
/// victim's own death do not.
#[test]
fn deaths_after_the_first_kill_are_its_consequences() {
    let mut l = Live::new();
    l.on_user(&UserBody::ProcInfo(ProcInfo {
        tgid: 701,
        rank: Some(1),
        ..Default::default()
    }));
    l.observe(&oom(10 * S, OomRecordKind::Kill, 701, "python3", Some(2)));
    l.observe(&exit(10 * S + 5_000_000, 701, "python3", 9));
    l.observe(&exit(11 * S, 700, "python3", 15));
    l.observe(&exit(11 * S + 1, 702, "sh", 0));
    l.observe(&exit(12 * S, 699, "torchrun", 1 << 8));
    let out = l.settle(13 * S);
    let d = deaths(&out);
    let after = |pid: u32| d.iter().find(|x| x.pid == pid).unwrap().after_kill;
    assert_eq!(after(701), None, "the victim's own death: {out:?}");
    assert_eq!(after(700), Some((701, Some(1))), "rank 0, stopped");
    assert_eq!(after(699), Some((701, Some(1))), "the agent, failed");
    assert_eq!(after(702), None, "a clean exit");
}
