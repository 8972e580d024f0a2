//! The line at a kill, on fixtures of the records as they pass.

use std::collections::BTreeMap;

use trainbpf_report::decode::{
    OomRecordKind, ProcIdentity, Rss, Task,
    stacks::{Frame, StackDelta, StackSample},
};

use super::*;

const S: u64 = 1_000_000_000;
const MIB: u64 = 1024;

fn key(tgid: u32) -> ProcKey {
    ProcKey {
        tgid,
        // Born just after boot: inside any window, so growth counts from
        // zero, as the report counts it.
        start_ns: tgid as u64,
    }
}

fn t(ts_s: f64, event: Event) -> Timed {
    Timed {
        ts_ns: (ts_s * S as f64) as u64,
        event,
    }
}

fn fork(ts: f64, child: u32, parent: u32, comm: &str) -> Timed {
    t(
        ts,
        Event::Fork {
            child: key(child),
            parent: key(parent),
            comm: comm.into(),
            kthread: false,
        },
    )
}

fn mem(ts: f64, tgid: u32, added_mib: u64, rss_mib: u64) -> Timed {
    t(
        ts,
        Event::Mem(MemSample {
            proc: key(tgid),
            in_job: true,
            comm: "python".into(),
            rss: Rss {
                anon_kb: rss_mib * MIB,
                ..Default::default()
            },
            faults: 0,
            reason: 0,
            oom_score_adj: 0,
            pgtables_kb: 0,
            memcg_id: 7,
            stall_ns: 0,
            alloc_kb: added_mib * MIB,
            freed_kb: 0,
            cache_kb: 0,
        }),
    )
}

fn printk(ts: f64, msg: &str) -> Timed {
    t(
        ts,
        Event::Printk {
            tgid: 0,
            msg: msg.into(),
        },
    )
}

fn oom(ts: f64, victim: u32, kind: OomRecordKind) -> Timed {
    t(
        ts,
        Event::Oom(Box::new(OomRecord {
            kind,
            source: "tp_btf".into(),
            victim: key(victim),
            victim_pid: victim,
            comm: "pt_gloo_runloop".into(),
            in_job: true,
            uid: 1000,
            oom_score_adj: 0,
            rss: Rss::default(),
            total_vm_kb: 0,
            pgtables_kb: 0,
            memcg_id: 7,
            oc: None,
            trigger: Task {
                pid: victim,
                tgid: victim,
                comm: "python".into(),
            },
        })),
    )
}

fn identity(tgid: u32, rank: &str) -> UserBody {
    UserBody::Identity(ProcIdentity {
        tgid,
        start_ns: key(tgid).start_ns,
        vars: BTreeMap::from([("RANK".to_string(), rank.to_string())]),
        cgroups: Vec::new(),
    })
}

fn delta(tgid: u32, stack_id: i32, bytes: u64, frames: Option<Vec<Frame>>) -> StackDelta {
    StackDelta {
        proc: key(tgid),
        stack_id,
        py_id: 9,
        py_state: 0,
        leaf_ret: 0,
        bytes,
        count: 1,
        frames,
        error: None,
        gpu: false,
    }
}

fn frame(function: &str, file: &str, line: u32) -> Frame {
    Frame {
        kind: "python".into(),
        addr: 0x1000,
        function: Some(function.into()),
        file: Some(file.into()),
        line: Some(line),
        module: None,
        found: None,
    }
}

/// torchrun (pid 10) and its ranks 0 (11) and 1 (12); rank 1 leaks.
fn job() -> KillLines {
    let mut k = KillLines::default();
    for e in [fork(0.5, 11, 10, "python"), fork(0.6, 12, 10, "python")] {
        assert_eq!(k.observe(&e), None);
    }
    k.on_user(&identity(11, "0"));
    k.on_user(&identity(12, "1"));
    k
}

#[test]
fn a_memcg_kill_names_the_rank_the_limit_and_where_it_grew() {
    let mut k = job();
    for i in 0..=40 {
        let s = 1.0 + i as f64;
        k.observe(&mem(s, 11, 300, 350));
        k.observe(&mem(s, 12, 300 + 20 * i as u64, 350 + 20 * i as u64));
    }
    // `import torch` first: hundreds of small stacks, all citing the
    // import line; then the leak's one stack, heavier than all of them.
    let import: Vec<StackDelta> = (0..MAX_STACKS as i32 + 50)
        .map(|i| {
            delta(
                12,
                1000 + i,
                1 << 20,
                Some(vec![
                    frame("_load", "/usr/lib/python3.11/importlib/_bootstrap.py", 1),
                    frame("<module>", "/home/u/train.py", 2),
                ]),
            )
        })
        .collect();
    k.on_user(&UserBody::Stacks(StackSample { stacks: import }));
    let leak = |bytes, frames| {
        UserBody::Stacks(StackSample {
            stacks: vec![delta(12, 3, bytes, frames)],
        })
    };
    // Not named yet, and heavier than the import: no place is cited.
    k.on_user(&leak(400 << 20, None));
    assert_eq!(k.top(1, 12).and_then(|t| t.at), None);
    k.on_user(&leak(
        300 << 20,
        Some(vec![
            frame("load_batch", "/home/u/train.py", 42),
            frame("main", "/home/u/train.py", 80),
        ]),
    ));
    k.observe(&printk(
        41.1,
        "memory: usage 1572864kB, limit 1572864kB, failcnt 12",
    ));
    // As Linux 6.18 passes it on: the rest of the line (its pid) comes
    // as a continuation the console tracepoint does not repeat.
    k.observe(&printk(
        41.1,
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null)",
    ));
    let (victim, line) = k.observe(&oom(41.2, 12, OomRecordKind::Victim)).unwrap();
    assert_eq!(victim, key(12));
    assert_eq!(
        line,
        "rank 1 (pid 12) was OOM-killed: its memory cgroup reached its 1.5 GiB limit; it added \
         1.07 GiB in 41.0 s, in load_batch (train.py:42)"
    );
    // The kill's other record is the same kill: told once.
    assert_eq!(k.observe(&oom(41.3, 12, OomRecordKind::Kill)), None);
}

#[test]
fn another_grower_and_a_helper_are_named_as_the_report_names_them() {
    let mut k = job();
    // Rank 0 starts a helper (a fork, then an exec that keeps RANK=0).
    k.observe(&fork(2.0, 13, 11, "python"));
    k.on_user(&identity(13, "0"));
    assert_eq!(k.who(13, "sleep"), "python of rank 0 (pid 13)");
    // A DataLoader worker forked by rank 1 grows; rank 1 is killed.
    k.observe(&fork(3.0, 14, 12, "pt_data_worker"));
    k.observe(&mem(3.0, 14, 0, 0));
    k.observe(&mem(10.0, 14, 500, 520));
    k.observe(&mem(10.0, 12, 50, 300));
    let (_, line) = k.observe(&oom(10.5, 12, OomRecordKind::Victim)).unwrap();
    assert_eq!(
        line,
        "rank 1 (pid 12) was OOM-killed; pt_data_worker of rank 1 (pid 14) added 500 MiB in 10.0 s"
    );
}

#[test]
fn without_samples_or_rank_the_line_still_stands() {
    let mut k = KillLines::default();
    let (_, line) = k.observe(&oom(5.0, 99, OomRecordKind::Victim)).unwrap();
    assert_eq!(line, "pt_gloo_runloop (pid 99) was OOM-killed");
    // Bounded: a flood of processes is followed only so far.
    for p in 0..(MAX_PROCS as u32 + 100) {
        k.observe(&mem(6.0, 1000 + p, 1, 1));
    }
    assert_eq!(k.procs.len(), MAX_PROCS);
}

/// The kernel picks a second victim while the first one's memory is being
/// freed: its line names the first, within the report's second; a kill
/// later on is a kill of its own.
#[test]
fn a_second_victim_names_the_first() {
    let mut k = job();
    k.observe(&mem(1.0, 12, 900, 900));
    k.observe(&mem(1.0, 11, 300, 300));
    k.observe(&oom(2.0, 12, OomRecordKind::Victim)).unwrap();
    let (_, line) = k.observe(&oom(2.006, 11, OomRecordKind::Victim)).unwrap();
    assert!(
        line.starts_with("rank 0 (pid 11) was OOM-killed 6.0 ms after rank 1 (pid 12); "),
        "{line}"
    );
    let (_, line) = k.observe(&oom(9.0, 11, OomRecordKind::Victim)).unwrap();
    assert!(
        line.starts_with("rank 0 (pid 11) was OOM-killed; "),
        "{line}"
    );
    // A later death of a process alive at the first kill follows from it;
    // one of a process born after it does not.
    assert_eq!(
        k.after_first_kill(2_500_000_000, key(10).start_ns),
        Some(("rank 1 (pid 12)", 500_000_000))
    );
    assert_eq!(k.after_first_kill(2_500_000_000, 2_100_000_000), None);
    assert_eq!(
        k.after_first_kill(1_000_000_000, 0),
        None,
        "before the kill"
    );
}
