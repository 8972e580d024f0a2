//! Renderers: interchangeable views of one [`crate::model::Report`]. They
//! read the model only, never the recording.

pub(crate) mod chart;
pub mod html;
/// Lines about several recordings of one job that text and HTML share.
pub(crate) mod job_lines;
pub mod json;
pub mod perfetto;
pub mod pprof;
/// Folded lines the text and HTML share.
pub(crate) mod readable;
pub mod text;

/// Why a recording has no growth stacks, as every view says it.
pub const NO_STACKS: &str =
    "it was made with --no-stacks, or by a trainbpf before stacks were on by default";

use crate::{
    model::{Cause, Death, ExitStatus},
    units::human_kb,
};

pub(crate) use crate::units::signal_name;

/// A grower's figure as the kill's table and ranking count it: "added 225.7
/// MiB" (allocated minus freed in its own context) where recorded, else
/// "RSS +299.3 MiB", labelled.
pub(crate) fn grower_figure(g: &crate::model::Grower) -> String {
    match g.honest_kb {
        Some(h) if h < 0 => format!("added {}", crate::units::signed_kb(h)),
        Some(h) => format!("added {}", human_kb(h as u64)),
        None => format!("RSS +{}", human_kb(g.grew_kb)),
    }
}

/// "exited with code 1" / "killed by signal 9 (SIGKILL)".
/// How a process died, in words: "killed by SIGKILL from pid 812
/// (bash, /usr/bin/bash, uid 1000)".
pub(crate) fn death_phrase(d: &Death) -> String {
    let sig = |n: i32| match signal_name(n) {
        Some(name) => format!("{name} ({n})"),
        None => format!("signal {n}"),
    };
    // A phrase for people: the sender's name and path, and the cgroup's,
    // come from processes and are escaped as the text report's are.
    use crate::term::escape as esc;
    let from = || match &d.sender {
        Some(s) if s.terminal.is_some() => terminal_phrase(s),
        Some(s) => {
            let mut who = esc(&s.comm).into_owned();
            if let Some(exe) = &s.exe {
                who.push_str(&format!(", {}", esc(exe)));
            }
            if let Some(uid) = s.uid {
                who.push_str(&format!(", uid {uid}"));
            }
            if s.pid == d.pid {
                " from itself".to_string()
            } else {
                format!(" from pid {} ({who}){}", s.pid, forwarded_phrase(s))
            }
        }
        None => " (sender not seen)".to_string(),
    };
    let mut s = match d.cause {
        Cause::Exit => format!("exited with code {}", d.code.unwrap_or(0)),
        Cause::OomMemcg => {
            let mut s = "killed by the kernel's OOM killer: its memory cgroup".to_string();
            if let Some(m) = &d.memcg {
                s.push_str(&format!(" {}", esc(m)));
            }
            if let Some(l) = d.memcg_limit_kb {
                s.push_str(&format!(" hit its limit of {}", human_kb(l)));
            } else {
                s.push_str(" hit its limit");
            }
            s
        }
        Cause::OomGlobal => {
            "killed by the kernel's OOM killer: the machine ran out of memory".into()
        }
        Cause::Signal => format!("killed by {}{}", sig(d.signal.unwrap_or(0)), from()),
        Cause::Crash => format!("crashed with {}{}", sig(d.signal.unwrap_or(0)), from()),
    };
    if let Some(a) = &d.after {
        s.push_str(&format!(
            ", {} after OOM kill {} of {}: its consequence, not a cause",
            crate::units::human_secs(a.after_ns),
            a.kill,
            esc(&a.victim)
        ));
    }
    s
}

/// " from terminal /dev/pts/3 (session 1234, foreground group 1240)".
fn terminal_phrase(s: &crate::model::Sender) -> String {
    match &s.terminal {
        Some(t) => format!(
            " from terminal {} (session {}, foreground group {})",
            t.tty, t.session, t.foreground_pgrp
        ),
        None => String::new(),
    }
}

/// ", forwarded by trainbpf (pid 800)" for a signal the recorder passed on.
fn forwarded_phrase(s: &crate::model::Sender) -> String {
    match s.forwarded_by {
        Some(by) => format!(", forwarded by trainbpf (pid {by})"),
        None => String::new(),
    }
}

pub(crate) fn exit_phrase(status: ExitStatus) -> String {
    match status {
        ExitStatus::Code(c) => format!("exited with code {c}"),
        ExitStatus::Signal(s) => match signal_name(s) {
            Some(name) => format!("killed by signal {s} ({name})"),
            None => format!("killed by signal {s}"),
        },
    }
}

/// RFC 3339 in UTC with milliseconds: `2025-03-01T12:34:56.789Z`.
pub fn rfc3339_ms(realtime_ns: u64) -> String {
    let ms = realtime_ns / 1_000_000;
    let secs = ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let sod = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
/// Howard Hinnant's algorithm (<https://howardhinnant.github.io/date_algorithms.html#civil_from_days>);
/// a date crate for one function isn't worth the dependency.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A report as the demo produces it, for the renderers' tests.
#[cfg(test)]
pub(crate) mod fixture {
    use crate::decode::{ExitStatus, Lost, OomRecordKind, Rss};
    use crate::model::{
        Constraint, Grower, Job, Kill, KillSource, Process, Report, TreeNode, Trigger, Victim,
    };
    use crate::recording::{ClockPair, RecordingHeader};

    pub(crate) fn sample_report() -> Report {
        let g = Grower {
            pid: 812,
            start_ns: 5,
            comm: "pt_data_worker".into(),
            honest_kb: None,
            grew_kb: 256_102,
            window_ns: 12_000_000_000,
            rate_kb_per_s: Some(21_341.8),
            rss_kb: 257_024,
            in_job: true,
            born_in_window: true,
            is_victim: true,
        };
        let kill = Kill {
            ts_ns: 20_500_000_000,
            realtime_ns: Some(1_709_251_199_999_000_000),
            victim: Victim {
                pid: 812,
                start_ns: 5,
                thread_pid: 812,
                comm: "pt_data_worker".into(),
                rss: Rss {
                    anon_kb: 257_024,
                    file_kb: 2048,
                    shmem_kb: 0,
                    swap_kb: 0,
                },
                oom_score_adj: 0,
                uid: 0,
                in_job: true,
                total_vm_kb: 900_000,
                pgtables_kb: 700,
                tree: vec![
                    TreeNode {
                        pid: 700,
                        start_ns: 0,
                        comm: "python3".into(),
                    },
                    TreeNode {
                        pid: 812,
                        start_ns: 0,
                        comm: "pt_data_worker".into(),
                    },
                ],
            },
            constraint: Constraint::Memcg,
            memcg: Some("/trainbpf-77".into()),
            task_memcg: Some("/trainbpf-77".into()),
            memcg_usage_kb: Some(307_200),
            memcg_limit_kb: Some(307_200),
            memcg_failcnt: Some(3),
            trigger: Trigger {
                pid: 812,
                tgid: 812,
                start_ns: 0,
                comm: "pt_data_worker".into(),
            },
            sources: vec![
                KillSource {
                    record: OomRecordKind::Kill,
                    probe: "fentry".into(),
                },
                KillSource {
                    record: OomRecordKind::Victim,
                    probe: "tp_btf".into(),
                },
            ],
            kernel_points: Some(65_000),
            totalpages: Some(76_800),
            oom_memcg_id: 55,
            victim_memcg_id: 55,
            groups: vec![],
            sum_check: None,
            ranking: None,
            pressure: None,
            growers: vec![
                g.clone(),
                Grower {
                    pid: 700,
                    comm: "python3".into(),
                    grew_kb: 2048,
                    rss_kb: 40_960,
                    is_victim: false,
                    born_in_window: false,
                    rate_kb_per_s: Some(34.1),
                    window_ns: 60_000_000_000,
                    ..g
                },
            ],
            window_ns: 60_000_000_000,
            kernel_log: vec![],
            verdict: String::new(),
        };
        let mut r = Report {
            header: RecordingHeader {
                kernel: "6.8.0".into(),
                clock: ClockPair {
                    monotonic_ns: 20_500_000_000,
                    realtime_ns: 1_709_251_199_999_000_000,
                    uncertainty_ns: None,
                },
                ..Default::default()
            },
            window_ns: 60_000_000_000,
            first_ns: Some(500_000_000),
            last_ns: Some(22_000_000_000),
            events: 100,
            job: Some(Job {
                pid: 700,
                start_ns: 1,
                started_ns: 500_000_000,
                argv: vec!["python3".into(), "train.py".into()],
                cwd: "/".into(),
                uid: 0,
                cgroup: Some("/trainbpf-77".into()),
                memory_limit_bytes: Some(300 << 20),
                exit: Some(ExitStatus::Signal(9)),
                exited_ns: Some(21_000_000_000),
                attached: None,
                target: None,
            }),
            kills: vec![kill],
            kills_elsewhere: 0,
            processes: vec![Process {
                pid: 700,
                start_ns: 1,
                comm: "python3".into(),
                parent: None,
                exec: Some("/usr/bin/python3".into()),
                born_ns: Some(500_000_000),
                died_ns: None,
                exit: None,
                peak_rss_kb: 40_960,
                oom_killed: false,
                oom_score_adj: None,
                oom_score_adj_by: None,
                parent_rss_at_fork_kb: None,
                honest_kb: None,
                honest_peak_kb: None,
                page_cache_kb: None,
                uss_kb: None,
                pss_kb: None,
            }],
            deaths: vec![],
            groups: vec![],
            shared_memory: vec![],
            shm: Default::default(),
            attribution_at_peak: None,
            smaps_rounds: 0,
            smaps_cost_us: 0,
            top_memory: vec![],
            lost: Lost {
                by_kind: vec![0, 0, 0, 0, 3, 0, 0, 0],
                undecodable: 1,
                proc_map_full: 0,
                job_map_full: 0,
                other_map_full: 0,
                dropped_disk_full: 0,
                ..Default::default()
            },
            job_reads: Default::default(),
            series: Default::default(),
            undecodable: 2,
            stopped_early: None,
            skipped: Default::default(),
            gpu: Default::default(),
            leaks: Default::default(),
            compaction: None,
            leak_warnings: Vec::new(),
            stacks: Default::default(),
            death_stacks: Default::default(),
            ebpf_log: Default::default(),
            diagnoses: Vec::new(),
            short_lived: Default::default(),
            left_out: Default::default(),
            source: Default::default(),
            identities: Default::default(),
        };
        // As the model's finish gives each kill its line.
        for i in 0..r.kills.len() {
            r.kills[i].verdict =
                crate::model::verdict::line(&crate::model::verdict::facts(&r, &r.kills[i]));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        // 2024-02-29 (leap day) 23:59:59.999 UTC.
        assert_eq!(
            rfc3339_ms(1_709_251_199_999_000_000),
            "2024-02-29T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339_ms(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn exits() {
        assert_eq!(exit_phrase(ExitStatus::Code(1)), "exited with code 1");
        assert_eq!(
            exit_phrase(ExitStatus::Signal(9)),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(exit_phrase(ExitStatus::Signal(64)), "killed by signal 64");
        assert_eq!(signal_name(0), None);
    }
}
