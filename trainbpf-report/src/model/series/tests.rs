//! The series as the model builds them: bounded over a day, workers folded,
//! a window for each kill.

use super::*;
use crate::decode::MemSample;
use crate::decode::{Event, ProcKey, Rss, Timed};

const SEC: u64 = 1_000_000_000;

fn mem(ts: u64, tgid: u32, start_ns: u64, kb: u64, in_job: bool) -> Timed {
    Timed {
        ts_ns: ts,
        event: Event::Mem(MemSample {
            proc: ProcKey { tgid, start_ns },
            in_job,
            comm: format!("p{tgid}"),
            rss: Rss {
                anon_kb: kb,
                ..Rss::default()
            },
            faults: 0,
            reason: 0,
            oom_score_adj: 0,
            pgtables_kb: 0,
            memcg_id: 0,
            stall_ns: 0,
            alloc_kb: 0,
            freed_kb: 0,
            cache_kb: 0,
        }),
    }
}

fn exit(ts: u64, tgid: u32, start_ns: u64) -> Timed {
    Timed {
        ts_ns: ts,
        event: Event::Exit {
            proc: ProcKey { tgid, start_ns },
            comm: "pt_data_worker".into(),
            exit_code: 0,
            group_exit_code: 0,
            kthread: false,
        },
    }
}

#[test]
fn a_day_of_samples_stays_within_the_grid() {
    let mut b = Builder::new(60 * SEC);
    // One sample a second for a day, rising: the grid must widen and
    // the line keep at most BUCKETS buckets, with the peak intact.
    for s in 0..86_400u64 {
        b.observe(&mem(s * SEC, 1, 1, s, true));
    }
    let series = b.finish(&[], &Default::default());
    let p = &series.procs[0];
    assert!(p.rss.len() <= BUCKETS as usize, "{}", p.rss.len());
    assert!(p.rss.len() > BUCKETS as usize / 4, "{}", p.rss.len());
    assert_eq!(p.rss.max_kb(), 86_399);
    assert_eq!(p.peak_kb, 86_399);
    assert!(series.grid.width_ns * BUCKETS as u64 > 86_399 * SEC);
}

#[test]
fn hundreds_of_workers_fold_into_one_line() {
    let mut b = Builder::new(60 * SEC);
    // 8 workers per "epoch" of 100 s for 100 epochs, each growing to a
    // different peak, on recycled pids.
    for epoch in 0..100u64 {
        for w in 0..8u64 {
            let pid = 1000 + w as u32;
            let start = epoch * 100 * SEC + w;
            for s in 0..90 {
                let ts = start + s * SEC;
                b.observe(&mem(ts, pid, start, 1000 * (w + 1) + epoch + s, true));
            }
            b.observe(&exit(start + 95 * SEC, pid, start));
        }
    }
    let series = b.finish(&[], &Default::default());
    assert_eq!(series.procs.len(), MAX_DONE);
    assert_eq!(series.folded.count, 800 - MAX_DONE as u64);
    // The largest peaks kept their lines.
    let smallest_kept = series.procs.iter().map(|p| p.peak_kb).min().unwrap();
    assert!(smallest_kept >= 8000, "{smallest_kept}");
    assert!(!series.folded.rss.is_empty());
    assert!(series.folded.rss.len() <= BUCKETS as usize);
}

#[test]
fn outside_processes_keep_only_the_largest() {
    let mut b = Builder::new(60 * SEC);
    for pid in 0..100u32 {
        b.observe(&mem(
            SEC + pid as u64,
            5000 + pid,
            1,
            pid as u64 * 10,
            false,
        ));
    }
    let s = b.finish(&[], &Default::default());
    assert_eq!(s.procs.len(), MAX_OUTSIDE);
    assert_eq!(s.procs[0].pid, 5099);
    assert!(s.procs.iter().all(|p| p.pid >= 5092));
}

#[test]
fn a_process_that_joins_the_job_keeps_one_line() {
    let mut b = Builder::new(60 * SEC);
    b.observe(&mem(SEC, 700, 5, 100, false));
    b.observe(&mem(2 * SEC, 700, 5, 300, true));
    let s = b.finish(&[], &Default::default());
    assert_eq!(s.procs.len(), 1, "{:?}", s.procs);
    assert!(s.procs[0].in_job);
    assert_eq!(s.procs[0].rss.len(), 2);
}

#[test]
fn recycled_pid_ends_the_older_process() {
    let mut b = Builder::new(60 * SEC);
    b.observe(&mem(SEC, 77, 100, 500, true));
    b.observe(&mem(2 * SEC, 77, 200, 800, true));
    let s = b.finish(&[], &Default::default());
    assert_eq!(s.procs.len(), 2);
    let old = s.procs.iter().find(|p| p.start_ns == 100).unwrap();
    assert_eq!(old.died_ns, Some(200));
    let new = s.procs.iter().find(|p| p.start_ns == 200).unwrap();
    assert_eq!(new.died_ns, None);
    assert_eq!(new.peak_kb, 800);
}

/// Events of a job whose workers are re-spawned on recycled pids, two
/// of which leak until the memcg kills them.
pub(crate) fn two_kills() -> Vec<Timed> {
    use crate::decode::{JobStart, OomRecord, OomRecordKind, Task};
    let root = ProcKey {
        tgid: 700,
        start_ns: 1,
    };
    let mut ev = vec![Timed {
        ts_ns: 0,
        event: Event::JobStart(JobStart {
            pid: 700,
            start_ns: 1,
            argv: vec!["python3".into(), "train.py".into()],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            cgroup: Some("/trainbpf-1".into()),
            memory_limit_bytes: Some(1 << 30),
            attached: None,
            target: None,
        }),
    }];
    ev.push(mem(SEC / 10, 700, 1, 50_000, true));
    for (epoch, leak) in [(0u64, true), (1, false), (2, true)] {
        let start = (1 + epoch * 100) * SEC;
        // The same pid every epoch: the kernel recycled it.
        let w = ProcKey {
            tgid: 812,
            start_ns: start,
        };
        ev.push(Timed {
            ts_ns: start,
            event: Event::Fork {
                child: w,
                parent: root,
                comm: "python3".into(),
                kthread: false,
            },
        });
        for s in 0..60 {
            let kb = if leak { 10_000 + s * 10_000 } else { 10_000 };
            ev.push(mem(start + s * SEC, 812, start, kb, true));
        }
        let end = start + 60 * SEC;
        if leak {
            ev.push(Timed {
                ts_ns: end,
                event: Event::Oom(Box::new(OomRecord {
                    kind: OomRecordKind::Victim,
                    source: "tp_btf".into(),
                    victim: w,
                    victim_pid: 812,
                    comm: "p812".into(),
                    in_job: true,
                    uid: 0,
                    oom_score_adj: 0,
                    rss: Rss {
                        anon_kb: 700_000,
                        ..Rss::default()
                    },
                    total_vm_kb: 0,
                    pgtables_kb: 0,
                    memcg_id: 0,
                    oc: None,
                    trigger: Task {
                        pid: 812,
                        tgid: 812,
                        comm: "p812".into(),
                    },
                })),
            });
        }
        ev.push(exit(end + SEC / 100, 812, start));
    }
    ev.push(mem(400 * SEC, 700, 1, 50_000, true));
    ev
}

#[test]
fn each_kill_gets_its_window_with_victim_and_top_grower() {
    let r = crate::model::build(
        &crate::recording::RecordingHeader::default(),
        two_kills().into_iter(),
        &crate::model::ModelOptions::default(),
    );
    assert_eq!(r.kills.len(), 2);
    for k in &r.kills {
        let w = r.series.window(k).expect("a window per kill");
        let v = w.lines.iter().find(|l| l.is_victim).expect("victim line");
        assert_eq!(
            v.start_ns, k.victim.start_ns,
            "the right process, not its pid"
        );
        // The kill record's figure ends the victim's line.
        assert_eq!(*v.points.last().unwrap(), Some(700_000));
        assert!(v.is_top_grower);
        assert_eq!(v.points.len(), WINDOW_POINTS);
    }
    // Three processes shared pid 812, each its own line; the killed
    // ones are marked.
    let lines: Vec<_> = r.series.procs.iter().filter(|p| p.pid == 812).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines.iter().filter(|p| p.oom_killed).count(), 2);
    assert_eq!(r.series.came_and_went.len(), 1);
    assert_eq!(r.series.came_and_went[0].count, 3);
}
