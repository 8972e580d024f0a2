//! The leak model on whole runs: sawtooths, plateaus, caches, respawned
//! generations, and the projection.

use super::builder::{Builder, role};
use super::project::live_slope;
use super::*;
use crate::decode::MemSample;
use crate::decode::Rss;
use crate::decode::samples::ProcInfo;
use crate::decode::samples::{CgroupPressure, Pressure};
use crate::decode::{Event, ProcKey, Timed};
use crate::model::{ModelOptions, Report, build};
use crate::recording::RecordingHeader;

const MIB: f64 = 1024.0;

fn s(secs: f64) -> u64 {
    (secs * SEC) as u64
}

fn key(tgid: u32, start: f64) -> ProcKey {
    ProcKey {
        tgid,
        start_ns: s(start) + 1,
    }
}

fn at(secs: f64, event: Event) -> Timed {
    Timed {
        ts_ns: s(secs),
        event,
    }
}

/// A memory record: honest `net_kb`, RSS a little above it.
fn mem(secs: f64, k: ProcKey, comm: &str, net_kb: f64) -> Timed {
    let net = net_kb.max(0.0) as u64;
    at(
        secs,
        Event::Mem(MemSample {
            proc: k,
            in_job: true,
            comm: comm.into(),
            rss: Rss {
                anon_kb: net + 20 * 1024,
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
            alloc_kb: net,
            freed_kb: 0,
            cache_kb: 0,
        }),
    )
}

fn fork(secs: f64, child: ProcKey, comm: &str) -> Timed {
    at(
        secs,
        Event::Fork {
            child,
            parent: key(700, 0.0),
            comm: comm.into(),
            kthread: false,
        },
    )
}

fn exit(secs: f64, k: ProcKey, comm: &str) -> Timed {
    at(
        secs,
        Event::Exit {
            proc: k,
            comm: comm.into(),
            exit_code: 0,
            group_exit_code: 0,
            kthread: false,
        },
    )
}

fn pressure(secs: f64, usage_kb: u64, limit_kb: Option<u64>) -> Timed {
    at(
        secs,
        Event::Pressure(Box::new(Pressure {
            mem_total_kb: 64 << 20,
            mem_available_kb: 60 << 20,
            cgroup: Some(CgroupPressure {
                usage_kb,
                limit_kb,
                ..Default::default()
            }),
            ..Default::default()
        })),
    )
}

/// Records as the collector sends them: when the value moved 4 MiB,
/// or on a 5 s heartbeat, from `from` to `to` seconds.
fn sampled(
    k: ProcKey,
    comm: &str,
    from: f64,
    to: f64,
    v: impl Fn(f64) -> f64,
    out: &mut Vec<Timed>,
) {
    let mut last: Option<(f64, f64)> = None;
    let mut t = from;
    while t <= to {
        let x = v(t);
        let due = match last {
            None => true,
            Some((lt, lv)) => (x - lv).abs() >= 4.0 * MIB || t - lt >= 5.0,
        };
        if due {
            out.push(mem(t, k, comm, x));
            last = Some((t, x));
        }
        t += 0.25;
    }
}

/// A small deterministic wobble, ±`amp`.
fn wobble(t: f64, amp: f64) -> f64 {
    amp * ((t * 1.7).sin() * 0.6 + (t * 0.31).cos() * 0.4)
}

fn honest_header() -> RecordingHeader {
    let mut h = RecordingHeader::default();
    h.attach.pages = Some("tp_btf:mm_page_alloc".into());
    h
}

fn report(mut evs: Vec<Timed>, span_s: f64) -> Report {
    evs.sort_by_key(|t| t.ts_ns);
    let opts = ModelOptions {
        leaks: LeakOptions {
            min_span_ns: s(span_s),
            ..Default::default()
        },
        ..Default::default()
    };
    build(&honest_header(), evs.into_iter(), &opts)
}

const RUN: f64 = 1200.0;

/// The main process warms up to 500 MiB in 20 s, then holds it; a
/// DataLoader worker is respawned every 30 s and grows to 200 MiB in
/// its 25 s; the cgroup's usage follows. `leak` KiB/s are added to the
/// main process from 60 s on.
fn training(leak: f64) -> Vec<Timed> {
    let main = key(700, 0.0);
    let mut evs = vec![at(
        0.0,
        Event::Cgroup(crate::decode::CgroupName {
            id: 1,
            path: "/trainbpf-1".into(),
        }),
    )];
    let main_v = move |t: f64| {
        let base = if t < 20.0 {
            500.0 * MIB * t / 20.0
        } else {
            500.0 * MIB
        };
        base + wobble(t, 3.0 * MIB) + leak * (t - 60.0).max(0.0)
    };
    sampled(main, "python3", 0.0, RUN, main_v, &mut evs);
    let mut generation = 0;
    let mut t0 = 30.0;
    while t0 + 25.0 < RUN {
        let w = key(1000 + generation, t0);
        evs.push(fork(t0, w, "python3"));
        sampled(
            w,
            "pt_data_worker",
            t0 + 0.5,
            t0 + 25.0,
            move |t| 200.0 * MIB * (t - t0) / 25.0,
            &mut evs,
        );
        evs.push(exit(t0 + 25.2, w, "pt_data_worker"));
        generation += 1;
        t0 += 30.0;
    }
    let mut t = 0.0;
    while t <= RUN {
        let workers = if (t % 30.0) < 25.0 && t >= 30.0 {
            200.0 * MIB * (t % 30.0) / 25.0
        } else {
            0.0
        };
        let usage = main_v(t) + workers + 40.0 * MIB;
        evs.push(pressure(t, usage as u64, Some(4 << 20)));
        t += 1.0;
    }
    evs
}

#[test]
fn sawtooth_of_respawned_workers_and_a_plateau_are_no_leak() {
    let r = report(training(0.0), 300.0);
    let l = &r.leaks;
    assert!(!l.suspected(), "{:#?}", l.trends);
    let workers = l
        .trends
        .iter()
        .find(|t| t.pid.is_none())
        .unwrap_or_else(|| panic!("the workers form a group: {:#?}", l.trends));
    assert_eq!(workers.group.as_deref(), Some("DataLoader workers"));
    assert_eq!(workers.members, 39);
    assert!(
        workers.slope_kb_per_s.abs() < 0.02 * 200.0 * MIB / 25.0,
        "the sawtooth's teeth do not make a slope: {workers:#?}"
    );
    let main = l.trends.iter().find(|t| t.pid == Some(700)).unwrap();
    assert_ne!(main.verdict, Verdict::Leak);
    let p = l
        .projection
        .as_ref()
        .expect("a projection against the limit");
    assert_eq!(p.domain, Domain::Cgroup);
    assert_eq!(p.limit_kb, 4 << 20);
    assert_eq!(p.seconds, None, "nothing leaks: {p:?}");
}

#[test]
fn slow_leak_in_the_main_process_is_flagged_with_its_slope() {
    let leak = 100.0; // KiB/s: 112 MiB over the 19 minutes it runs
    let r = report(training(leak), 300.0);
    let l = &r.leaks;
    let leaks: Vec<_> = l.leaks().collect();
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let t = leaks[0];
    assert_eq!(t.pid, Some(700));
    assert_eq!(t.comm, "python3");
    assert!(
        (t.slope_kb_per_s - leak).abs() < 0.05 * leak,
        "slope {} for {leak}",
        t.slope_kb_per_s
    );
    assert!(t.fit > 0.8, "{t:#?}");
    assert!(t.alive);
    // The climb began at 60 s, but in the flat 40 s before it, it was
    // within the noise; the warm-up is not part of it.
    let since = r.since_start_s(t.since_ns);
    assert!((18.0..=120.0).contains(&since), "since {since}: {t:#?}");
    // The projection: the highest usage in the last 150 s (carried to
    // the end at the leak's rate) against 4 GiB.
    let p = l.projection.as_ref().unwrap();
    let usage = 500.0 * MIB + 40.0 * MIB + 200.0 * MIB + leak * (RUN - 60.0);
    assert!((p.usage_kb as f64 - usage).abs() < 8.0 * MIB, "{p:?}");
    let expect = ((4 << 20) as f64 - p.usage_kb as f64) / t.slope_kb_per_s;
    let secs = p.seconds.unwrap();
    assert!((secs - expect).abs() < 1e-6 * expect, "{secs} vs {expect}");
}

#[test]
fn epoch_long_workers_that_climb_until_respawned_are_no_leak() {
    // Four workers per 10-minute epoch, each climbing its whole life:
    // longer than the span, but each gives it all back at its exit.
    let mut evs = vec![pressure(0.0, 100 << 10, Some(8 << 20))];
    for epoch in 0..4u32 {
        let t0 = epoch as f64 * 600.0;
        for i in 0..4 {
            let w = key(3000 + 10 * epoch + i, t0);
            evs.push(fork(t0, w, "python3"));
            sampled(
                w,
                "pt_data_worker",
                t0 + 0.5,
                t0 + 599.0,
                move |t| 400.0 * (t - t0),
                &mut evs,
            );
            evs.push(exit(t0 + 599.5, w, "pt_data_worker"));
        }
    }
    let r = report(evs.clone(), 300.0);
    assert!(!r.leaks.suspected(), "{:#?}", r.leaks.trends);
    let workers: Vec<_> = r.leaks.trends.iter().filter(|t| t.pid.is_some()).collect();
    assert!(!workers.is_empty());
    assert!(
        workers.iter().all(|t| t.verdict == Verdict::Respawned),
        "{workers:#?}"
    );
    // One killed by the OOM killer mid-climb ran into the limit: that
    // climb is a leak.
    let victim = key(3031, 1800.0);
    evs.retain(|t| t.ts_ns < s(2100.0) || !matches!(&t.event, Event::Mem(MemSample { proc, .. }) | Event::Exit { proc, .. } if *proc == victim));
    // The classic tracepoint's record: a pid, no start time.
    let kill = crate::decode::OomRecord {
        kind: crate::decode::OomRecordKind::Victim,
        source: "tracepoint".into(),
        victim: ProcKey {
            tgid: victim.tgid,
            start_ns: 0,
        },
        victim_pid: victim.tgid,
        comm: String::new(),
        in_job: true,
        uid: 0,
        oom_score_adj: 0,
        rss: Rss::default(),
        total_vm_kb: 0,
        pgtables_kb: 0,
        memcg_id: 0,
        oc: None,
        trigger: crate::decode::Task {
            pid: victim.tgid,
            tgid: victim.tgid,
            comm: String::new(),
        },
    };
    evs.push(at(2100.0, Event::Oom(Box::new(kill))));
    evs.push(exit(2100.1, victim, "pt_data_worker"));
    let r = report(evs, 300.0);
    let leaks: Vec<_> = r.leaks.leaks().collect();
    assert_eq!(leaks.len(), 1, "{:#?}", r.leaks.trends);
    assert_eq!(leaks[0].pid, Some(3031));
}

#[test]
fn warm_up_then_plateau_is_no_leak() {
    let p = key(700, 0.0);
    let mut evs = Vec::new();
    // Fast growth for 10 minutes, then flat for 10.
    sampled(
        p,
        "python3",
        0.0,
        RUN,
        |t| 2000.0 * MIB * (1.0 - (-t / 200.0).exp()) + wobble(t, 2.0 * MIB),
        &mut evs,
    );
    let r = report(evs, 300.0);
    let t = &r.leaks.trends[0];
    assert!(!r.leaks.suspected(), "{t:#?}");
    assert_eq!(t.verdict, Verdict::Levelled, "{t:#?}");
}

#[test]
fn cache_that_fills_then_stays_flat_is_no_leak() {
    let p = key(700, 0.0);
    let mut evs = Vec::new();
    // A cache filling at a steady rate for 12 minutes of 20, then full.
    sampled(
        p,
        "python3",
        0.0,
        RUN,
        |t| 100.0 * MIB + 1024.0 * MIB * (t / 720.0).min(1.0),
        &mut evs,
    );
    let r = report(evs, 300.0);
    assert!(!r.leaks.suspected(), "{:#?}", r.leaks.trends);
    // The same cache still filling at the end is a climb.
    let mut evs = Vec::new();
    sampled(
        p,
        "python3",
        0.0,
        600.0,
        |t| 100.0 * MIB + 1024.0 * MIB * (t / 720.0).min(1.0),
        &mut evs,
    );
    let r = report(evs, 300.0);
    assert!(r.leaks.suspected(), "{:#?}", r.leaks.trends);
}

#[test]
fn a_climb_shorter_than_the_span_is_not_yet_a_leak() {
    let p = key(700, 0.0);
    let mut evs = Vec::new();
    sampled(p, "python3", 0.0, 200.0, |t| 50.0 * MIB * t, &mut evs);
    let r = report(evs.clone(), 300.0);
    assert_eq!(r.leaks.trends[0].verdict, Verdict::TooShort);
    let r = report(evs, 100.0);
    assert!(r.leaks.suspected());
}

/// The OOM killer's record of `k`.
fn oom(secs: f64, k: ProcKey, comm: &str) -> Timed {
    let task = crate::decode::Task {
        pid: k.tgid,
        tgid: k.tgid,
        comm: comm.into(),
    };
    at(
        secs,
        Event::Oom(Box::new(crate::decode::OomRecord {
            kind: crate::decode::OomRecordKind::Victim,
            source: "tp_btf".into(),
            victim: k,
            victim_pid: k.tgid,
            comm: comm.into(),
            in_job: true,
            uid: 0,
            oom_score_adj: 0,
            rss: Rss::default(),
            total_vm_kb: 0,
            pgtables_kb: 0,
            memcg_id: 0,
            oc: None,
            trigger: task,
        })),
    )
}

#[test]
fn a_killed_process_that_climbed_steadily_for_less_than_the_span_is_steady() {
    let p = key(700, 0.0);
    let climb = |from: f64, to: f64, killed: bool| {
        let mut evs = Vec::new();
        sampled(
            p,
            "python3",
            0.0,
            to,
            |t| 4.0 * MIB * (t - from).max(0.0) + wobble(t, 300.0),
            &mut evs,
        );
        if killed {
            evs.push(oom(to, p, "python3"));
        }
        evs.push(exit(to + 0.01, p, "python3"));
        report(evs, 300.0).leaks.trends[0].clone()
    };
    // 4 MiB/s for 50 s until the kill: as steady as a leak, too short.
    let t = climb(0.0, 50.0, true);
    assert_eq!(t.verdict, Verdict::Steady, "{t:?}");
    assert!((t.slope_kb_per_s / MIB - 4.0).abs() < 0.3, "{t:?}");
    assert!(!t.is_leak() && t.is_climbing());
    // The same climb in a process that exited: judged as before.
    assert_eq!(climb(0.0, 50.0, false).verdict, Verdict::TooShort);
    // Flat for 47 s, then 3 s of climb before the kill: under the span,
    // too short even so (fast_growth's to judge).
    assert_eq!(climb(47.0, 50.0, true).verdict, Verdict::TooShort);
    // Flat for 42 s, then 8 s of climb: the span is 5 s, fast growth's
    // window, so that a leak filling the limit in seconds is steady.
    let t = climb(42.0, 50.0, true);
    assert_eq!(t.verdict, Verdict::Steady, "{t:?}");
    assert!(t.since_ns >= s(41.0), "the climb, not the flat: {t:?}");
}

#[test]
fn respawned_workers_growing_generation_by_generation_leak_as_a_group() {
    // Each worker holds its memory flat for its 60 s life, but each
    // generation holds 20 MiB more than the last: no worker climbs, the
    // group does.
    let mut evs = vec![pressure(0.0, 100 << 10, Some(8 << 20))];
    for g in 0..20u32 {
        let t0 = g as f64 * 60.0;
        let w = key(2000 + g, t0);
        let held = (200.0 + 20.0 * g as f64) * MIB;
        evs.push(fork(t0, w, "python3"));
        sampled(
            w,
            "pt_data_worker",
            t0 + 0.2,
            t0 + 59.5,
            move |_| held,
            &mut evs,
        );
        evs.push(exit(t0 + 59.8, w, "pt_data_worker"));
    }
    evs.push(pressure(RUN - 30.0, 700 << 10, Some(8 << 20)));
    let r = report(evs, 300.0);
    let leaks: Vec<_> = r.leaks.leaks().collect();
    assert_eq!(leaks.len(), 1, "{:#?}", r.leaks.trends);
    let g = leaks[0];
    assert_eq!(g.pid, None);
    assert_eq!(g.group.as_deref(), Some("DataLoader workers"));
    assert_eq!(g.members, 20);
    let per_s = 20.0 * MIB / 60.0;
    assert!((g.slope_kb_per_s - per_s).abs() < 0.1 * per_s, "{g:#?}");
    // No worker was alive at the end to keep it going.
    assert!(!g.alive);
    assert_eq!(r.leaks.projection.as_ref().unwrap().seconds, None);
}

#[test]
fn projection_sums_live_leaks_once_each() {
    let t = |pid: Option<u32>, group: Option<&str>, slope: f64, alive: bool| Trend {
        pid,
        start_ns: 0,
        comm: "x".into(),
        group: group.map(Into::into),
        members: 1,
        alive,
        slope_kb_per_s: slope,
        fit: 0.9,
        since_ns: 0,
        until_ns: 0,
        growth_kb: 0,
        size_kb: 0,
        verdict: Verdict::Leak,
    };
    let trends = vec![
        t(Some(1), Some("ranks"), 10.0, true),
        t(Some(2), Some("ranks"), 12.0, true),
        // The group explains 3 kB/s more than its leaking members.
        t(None, Some("ranks"), 25.0, true),
        t(Some(3), None, 5.0, true),
        // Dead: adds nothing any more.
        t(Some(4), None, 100.0, false),
    ];
    assert!((live_slope(&trends, Trend::is_leak) - 30.0).abs() < 1e-9);

    // The headroom: the highest recent usage, carried forward to the
    // end (2 s) at 30 kB/s, against the limit.
    let mut b = Builder::new(LeakOptions::default(), true);
    let attr = Attribution::default();
    for (i, u) in [900_000u64, 950_000, 920_000].iter().enumerate() {
        b.observe(&pressure(i as f64, *u, Some(1_000_000)), &attr);
    }
    let p = b.project(&trends).unwrap();
    assert_eq!(
        (p.domain, p.limit_kb, p.usage_kb),
        (Domain::Cgroup, 1_000_000, 950_030)
    );
    assert!((p.seconds.unwrap() - 49_970.0 / 30.0).abs() < 1e-9);

    // Without a cgroup limit: MemTotal plus swap, less what is in use.
    let mut b = Builder::new(LeakOptions::default(), true);
    b.observe(
        &at(
            0.0,
            Event::Pressure(Box::new(Pressure {
                mem_total_kb: 1_000_000,
                mem_available_kb: 300_000,
                swap_total_kb: 500_000,
                swap_free_kb: 400_000,
                ..Default::default()
            })),
        ),
        &attr,
    );
    let p = b.project(&trends).unwrap();
    assert_eq!(
        (p.domain, p.limit_kb, p.usage_kb),
        (Domain::Machine, 1_500_000, 800_000)
    );
    assert!((p.seconds.unwrap() - 700_000.0 / 30.0).abs() < 1e-9);
}

#[test]
fn torchrun_ranks_and_command_lines_group_like_the_rest_of_the_model() {
    let mut attr = Attribution::default();
    attr.on_proc_info(ProcInfo {
        tgid: 5,
        cmdline: vec!["python3".into(), "train.py".into()],
        rank: Some(1),
        local_rank: Some(1),
        ppid: None,
    });
    attr.on_proc_info(ProcInfo {
        tgid: 6,
        cmdline: vec!["python3".into(), "eval.py".into()],
        rank: None,
        local_rank: None,
        ppid: None,
    });
    assert_eq!(role(5, "python3", &attr).as_deref(), Some("torchrun ranks"));
    assert_eq!(
        role(6, "python3", &attr).as_deref(),
        Some("`python3 eval.py`")
    );
    assert_eq!(
        role(7, "pt_data_worker", &attr).as_deref(),
        Some("DataLoader workers")
    );
    assert_eq!(role(8, "python3", &attr), None);
}

/// The recorder reads no command line at a fork: a forked process takes
/// its parent's (through forks of forks), but not its parent's rank, until
/// it execs; a pid used again drops what was read of its earlier process.
#[test]
fn a_fork_takes_its_parents_command_line_until_it_execs() {
    let mut attr = Attribution::default();
    attr.on_proc_info(ProcInfo {
        tgid: 5,
        cmdline: vec!["python3".into(), "train.py".into()],
        rank: Some(0),
        local_rank: Some(0),
        ppid: None,
    });
    attr.on_fork(6, 5);
    attr.on_fork(7, 6);
    let train = Some("`python3 train.py`");
    assert_eq!(role(5, "python3", &attr).as_deref(), Some("torchrun ranks"));
    assert_eq!(role(6, "python3", &attr).as_deref(), train);
    assert_eq!(role(7, "python3", &attr).as_deref(), train);
    let seven = attr.info_of(7).unwrap();
    assert_eq!((seven.tgid, seven.rank, seven.local_rank), (7, None, None));
    // An exec: its own line, once read; none until then.
    attr.on_exec(6);
    assert_eq!(role(6, "sh", &attr), None);
    attr.on_proc_info(ProcInfo {
        tgid: 6,
        cmdline: vec!["sh".into(), "-c".into(), "nvidia-smi".into()],
        rank: None,
        local_rank: None,
        ppid: None,
    });
    assert_eq!(role(6, "sh", &attr).as_deref(), Some("`sh -c nvidia-smi`"));
    // Its fork follows it.
    assert_eq!(role(7, "sh", &attr).as_deref(), Some("`sh -c nvidia-smi`"));
    // Pid 6 used again, by a fork of 5: 5's line, not the old 6's.
    attr.on_fork(6, 5);
    assert_eq!(role(6, "python3", &attr).as_deref(), train);
}

#[test]
fn series_stay_bounded_over_a_long_run() {
    let p = key(700, 0.0);
    let mut b = Builder::new(LeakOptions::default(), true);
    let attr = Attribution::default();
    for i in 0..200_000u64 {
        b.observe(&mem(i as f64, p, "python3", i as f64), &attr);
    }
    let line = &b.live[&p].line;
    assert!(
        line.buckets.items.len() <= BUCKETS as usize,
        "{}",
        line.buckets.items.len()
    );
    let r = b.finish(s(200_000.0), &attr);
    assert!(r.suspected(), "a day-long steady climb: {:#?}", r.trends);
    let t = &r.trends[0];
    assert!((t.slope_kb_per_s - 1.0).abs() < 0.01, "{t:#?}");
}

#[test]
fn damaged_records_never_panic() {
    // Timestamps anywhere (backwards, 0, u64::MAX) and absurd sizes, as
    // a damaged recording can hold.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let attr = Attribution::default();
    for honest in [true, false] {
        let mut b = Builder::new(LeakOptions::default(), honest);
        for i in 0..3000u64 {
            let r = next();
            let ts = match r % 7 {
                0 => 0,
                1 => u64::MAX - (r >> 40),
                2 => r,
                _ => i * 1_000_000_000 + (r >> 44),
            };
            let k = key((r >> 20) as u32 % 8, 0.0);
            let big = next();
            let ev = match (r >> 8) % 5 {
                0 => Event::Fork {
                    child: k,
                    parent: k,
                    comm: "w".into(),
                    kthread: false,
                },
                1 => Event::Exit {
                    proc: k,
                    comm: "pt_data_worker".into(),
                    exit_code: 0,
                    group_exit_code: 0,
                    kthread: false,
                },
                2 => Event::Pressure(Box::new(Pressure {
                    mem_total_kb: big,
                    mem_available_kb: next(),
                    swap_total_kb: u64::MAX,
                    swap_free_kb: next(),
                    cgroup: Some(CgroupPressure {
                        usage_kb: next(),
                        limit_kb: Some(next()),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                _ => {
                    let Event::Mem(MemSample {
                        proc,
                        in_job,
                        comm,
                        faults,
                        reason,
                        oom_score_adj,
                        pgtables_kb,
                        memcg_id,
                        stall_ns,
                        ..
                    }) = mem(0.0, k, "p", 0.0).event
                    else {
                        unreachable!()
                    };
                    Event::Mem(MemSample {
                        proc,
                        in_job,
                        comm,
                        rss: Rss {
                            anon_kb: big >> 3,
                            file_kb: big >> 3,
                            shmem_kb: 0,
                            swap_kb: 0,
                        },
                        faults,
                        reason,
                        oom_score_adj,
                        pgtables_kb,
                        memcg_id,
                        stall_ns,
                        alloc_kb: next(),
                        freed_kb: next(),
                        cache_kb: 0,
                    })
                }
            };
            b.observe(
                &Timed {
                    ts_ns: ts,
                    event: ev,
                },
                &attr,
            );
            if i % 1000 == 0 {
                let _ = b.snapshot(3);
            }
        }
        let r = b.finish(u64::MAX, &attr);
        assert!(r.trends.len() <= MAX_TRENDS + MAX_DONE + 16);
    }
}
