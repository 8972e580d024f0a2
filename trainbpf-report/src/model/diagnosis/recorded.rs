//! Diagnoses of recordings built event by event through the whole model,
//! not of reports built by hand: what the growth rules make of the series
//! a recording holds, and that the leak warnings `record` wrote while the
//! job ran (whether it drew a status line or ran `--quiet`) add evidence
//! and decide nothing.

use crate::decode::MemSample;
use crate::decode::{
    CgroupName, Event, JobStart, LeakWarning, OomControl, OomRecord, OomRecordKind, ProcKey, Rss,
    Task, Timed,
};
use crate::model::diagnosis::{Diagnosis, most_likely};
use crate::model::{ModelOptions, Report, build};
use crate::recording::RecordingHeader;

const SEC: f64 = 1e9;
const MIB: u64 = 1024;
const LIMIT_KB: u64 = 400 * MIB;
const MEMCG: u64 = 55;

fn at(secs: f64, event: Event) -> Timed {
    Timed {
        ts_ns: (secs * SEC) as u64,
        event,
    }
}

fn key(tgid: u32) -> ProcKey {
    ProcKey {
        tgid,
        start_ns: tgid as u64 * 1000,
    }
}

/// A memory record: `kb` resident, all of it allocated in its own context.
fn mem(secs: f64, k: ProcKey, kb: u64) -> Timed {
    at(
        secs,
        Event::Mem(MemSample {
            proc: k,
            in_job: true,
            comm: "python3".into(),
            rss: Rss {
                anon_kb: kb,
                ..Rss::default()
            },
            faults: 0,
            reason: 1,
            oom_score_adj: 0,
            pgtables_kb: 0,
            memcg_id: MEMCG,
            stall_ns: 0,
            alloc_kb: kb,
            freed_kb: 0,
            cache_kb: 0,
        }),
    )
}

fn fork(secs: f64, child: ProcKey, parent: ProcKey) -> Timed {
    at(
        secs,
        Event::Fork {
            child,
            parent,
            comm: "python3".into(),
            kthread: false,
        },
    )
}

fn oom(secs: f64, kind: OomRecordKind, victim: ProcKey, anon_kb: u64) -> Timed {
    at(
        secs,
        Event::Oom(Box::new(OomRecord {
            kind,
            source: "tp_btf".into(),
            victim,
            victim_pid: victim.tgid,
            comm: "python3".into(),
            in_job: true,
            uid: 0,
            oom_score_adj: 0,
            rss: Rss {
                anon_kb,
                ..Rss::default()
            },
            total_vm_kb: 0,
            pgtables_kb: 0,
            memcg_id: MEMCG,
            oc: (kind == OomRecordKind::Kill).then_some(OomControl {
                constraint: 3,
                chosen_points: 0,
                totalpages: LIMIT_KB / 4,
                memcg_id: MEMCG,
            }),
            trigger: Task {
                pid: victim.tgid,
                tgid: victim.tgid,
                comm: "python3".into(),
            },
        })),
    )
}

fn usage(secs: f64, usage_kb: u64) -> Timed {
    at(
        secs,
        Event::Pressure(Box::new(crate::decode::samples::Pressure {
            mem_total_kb: 24 << 20,
            mem_available_kb: 20 << 20,
            cgroup: Some(crate::decode::samples::CgroupPressure {
                usage_kb,
                limit_kb: Some(LIMIT_KB),
                ..Default::default()
            }),
            ..Default::default()
        })),
    )
}

/// A two-rank job under a 400 MiB cgroup on a 24 GiB machine, as a
/// launcher like torchrun starts one: rank 0 holds 100 MiB, rank 1 keeps
/// 4 MiB a step, `rate_mib_s` in all, from 1 s until the limit kills it.
/// The records come as the probes send them: one per 4 MiB. Returns the
/// events and rank 1's key.
fn leak_to_the_limit(rate_mib_s: f64) -> (Vec<Timed>, ProcKey) {
    let (root, rank0, rank1) = (key(700), key(710), key(711));
    let mut evs = vec![
        at(
            0.0,
            Event::JobStart(JobStart {
                pid: root.tgid,
                start_ns: root.start_ns,
                argv: vec!["python3".into(), "launch.py".into()],
                cwd: "/".into(),
                uid: 0,
                gid: 0,
                cgroup: Some("/trainbpf-77".into()),
                memory_limit_bytes: Some(LIMIT_KB << 10),
                attached: None,
                target: None,
            }),
        ),
        at(
            0.05,
            Event::Cgroup(CgroupName {
                id: MEMCG,
                path: "/trainbpf-77".into(),
            }),
        ),
        mem(0.1, root, 10 * MIB),
        fork(0.5, rank0, root),
        mem(0.6, rank0, 100 * MIB),
        fork(1.0, rank1, root),
    ];
    let held = 10 * MIB + 100 * MIB;
    let (mut t, mut kb) = (1.0, 0);
    while held + kb + 4 * MIB < LIMIT_KB {
        kb += 4 * MIB;
        t += 4.0 / rate_mib_s;
        evs.push(mem(t, rank1, kb));
    }
    // The cgroup's usage, sampled each second: what the projection reads.
    let end = t;
    let mut s = 1.0;
    while s < end {
        let rank1_kb = ((s - 1.0) * rate_mib_s * MIB as f64) as u64;
        evs.push(usage(s, held + rank1_kb));
        s += 1.0;
    }
    evs.push(oom(end + 0.01, OomRecordKind::Kill, rank1, kb));
    evs.push(oom(end + 0.0105, OomRecordKind::Victim, rank1, kb));
    evs.push(at(
        end + 0.011,
        Event::Printk {
            tgid: 0,
            msg: format!("memory: usage {LIMIT_KB}kB, limit {LIMIT_KB}kB, failcnt 3"),
        },
    ));
    evs.push(at(
        end + 0.05,
        Event::Exit {
            proc: rank1,
            comm: "python3".into(),
            exit_code: 9,
            group_exit_code: 9,
            kthread: false,
        },
    ));
    evs.sort_by_key(|e| e.ts_ns);
    (evs, rank1)
}

fn report(evs: Vec<Timed>) -> Report {
    let mut h = RecordingHeader {
        mem_total_kb: 24 << 20,
        ..RecordingHeader::default()
    };
    h.attach.pages = Some("tp_btf:mm_page_alloc".into());
    build(&h, evs.into_iter(), &ModelOptions::default())
}

fn of_the_kill(r: &Report) -> Vec<&Diagnosis> {
    let d = &r.diagnoses;
    d.iter().filter(|d| d.kill == Some(0)).collect()
}

/// A steady leak that reached the limit in seconds,
/// too short for a leak and too slow for fast growth, was diagnosed only
/// as the container's limit ("raise the limit").
#[test]
fn a_steady_leak_to_the_limit_in_seconds_is_a_leak_not_only_the_limit() {
    // 35 MiB/s: the limit in about 8 s, under half of it in the last 5 s.
    let (evs, rank1) = leak_to_the_limit(35.0);
    let r = report(evs);
    assert_eq!(r.kills.len(), 1, "{:#?}", r.kills);
    let ds = of_the_kill(&r);
    let ids: Vec<&str> = ds.iter().map(|d| d.id).collect();
    let first = most_likely(&r.diagnoses, 0).unwrap_or_else(|| panic!("{ids:?}"));
    assert!(
        matches!(first.id, "steady_leak" | "fast_growth"),
        "the leak, not only the limit: {ids:?}\n{:#?}",
        r.leaks.trends
    );
    assert_eq!(first.pids, vec![rank1.tgid], "{first:#?}");
    assert!(ids.contains(&"container_limit"), "still said: {ids:?}");
}

/// The growth rules meet: however fast a steady climb fills the limit,
/// from a minute to a second, one of them names it.
#[test]
fn the_growth_rules_leave_no_gap_between_them() {
    for rate in [5.0, 10.0, 20.0, 30.0, 35.0, 40.0, 50.0, 70.0, 150.0, 300.0] {
        let (evs, rank1) = leak_to_the_limit(rate);
        let r = report(evs);
        let first = most_likely(&r.diagnoses, 0)
            .unwrap_or_else(|| panic!("{rate} MiB/s: no diagnosis: {:#?}", r.diagnoses));
        assert!(
            matches!(first.id, "steady_leak" | "fast_growth") && first.pids == [rank1.tgid],
            "{rate} MiB/s: {first:#?}\n{:#?}",
            r.leaks.trends
        );
    }
}

/// The same recording gives the same diagnoses
/// whether or not `record` warned while the job ran; the warnings are
/// evidence, said as such, and decide nothing.
#[test]
fn leak_warnings_in_the_recording_add_evidence_and_decide_nothing() {
    for rate in [8.0, 35.0] {
        let (evs, rank1) = leak_to_the_limit(rate);
        let quiet = report(evs.clone());
        let mut warned = evs;
        let kill_s = quiet.kills[0].ts_ns as f64 / SEC;
        warned.push(at(
            kill_s - 3.0,
            Event::LeakWarning(LeakWarning {
                pid: Some(rank1.tgid),
                start_ns: rank1.start_ns,
                comm: "python3".into(),
                members: 1,
                slope_bytes_per_s: (rate * 1048576.0) as u64,
                fit_permille: 990,
                since_ns: 1_000_000_000,
                projected_oom_s: Some(3),
                limit_kb: Some(LIMIT_KB),
                limit_of: Some("cgroup".into()),
                running_out: true,
                ..LeakWarning::default()
            }),
        ));
        warned.sort_by_key(|e| e.ts_ns);
        let warned = report(warned);
        let ids = |r: &Report| {
            r.diagnoses
                .iter()
                .map(|d| (d.id, d.kill, d.confidence, d.pids.clone(), d.title.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&quiet), ids(&warned), "{rate} MiB/s");
        assert_eq!(warned.leak_warnings.len(), 1);
        let first = most_likely(&warned.diagnoses, 0).unwrap();
        if first.id == "steady_leak" {
            assert!(
                first
                    .evidence
                    .iter()
                    .any(|e| e.starts_with("record warned at +")),
                "{first:#?}"
            );
        }
    }
}
