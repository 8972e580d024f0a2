//! `victim_not_grower`: the kernel killed one process while another grew.
//!
//! The OOM killer does not look for the process that grew: it kills the
//! one with the most points, its resident memory, swap and page tables
//! plus `oom_score_adj` thousandths of the memory it had (see
//! `model::badness`). A big process that sat still, or one a launcher
//! marked with a high `oom_score_adj`, dies for another's growth, and the
//! grower lives on to be killed next.

use super::workers::{limit_of, pct};
use super::{Confidence, Diagnosis};
use crate::model::{Grower, Kill, Process, Report};
use crate::units::human_kb;

/// The grower added at least this many times what the victim added...
const MIN_RATIO: u64 = 2;
/// ...and this share of the limit (or of [`MIN_GROWTH_KB`] without one).
const MIN_SHARE_PCT: u64 = 10;
const MIN_GROWTH_KB: u64 = 64 << 10;

/// What a grower added: honest where recorded, else RSS growth.
fn growth(g: &Grower) -> u64 {
    g.honest_kb.map_or(g.grew_kb, |h| h.max(0) as u64)
}

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    for (idx, kill) in report.kills.iter().enumerate() {
        if !kill.victim.in_job {
            continue;
        }
        let victim_growth = kill.growers.iter().find(|g| g.is_victim).map_or(0, growth);
        let Some(top) = kill
            .growers
            .iter()
            .filter(|g| !g.is_victim)
            .max_by_key(|g| (growth(g), std::cmp::Reverse(g.pid)))
        else {
            continue;
        };
        let grew = growth(top);
        let enough = match limit_of(report, kill) {
            Some((limit, _)) => pct(grew, limit) >= MIN_SHARE_PCT,
            None => grew >= MIN_GROWTH_KB,
        };
        if !enough || grew < victim_growth.saturating_mul(MIN_RATIO) {
            continue;
        }
        out.push(diagnose(report, idx, kill, top, victim_growth));
    }
}

fn process(report: &Report, pid: u32) -> Option<&Process> {
    report.processes.iter().rev().find(|p| p.pid == pid)
}

fn name(report: &Report, pid: u32) -> String {
    match process(report, pid) {
        Some(p) => report.who(pid, p.start_ns, &p.comm),
        None => format!("pid {pid}"),
    }
}

/// Who gave the victim its `oom_score_adj`: the writer of the last write
/// seen, else the nearest ancestor's (a child inherits it at fork).
fn adj_setter(report: &Report, kill: &Kill) -> Option<String> {
    let v = &kill.victim;
    let mut p = report
        .processes
        .iter()
        .find(|p| p.pid == v.pid && p.start_ns == v.start_ns)?;
    let mut inherited = false;
    for _ in 0..64 {
        if let Some(w) = p.oom_score_adj_by {
            let writer = if w == p.pid {
                format!("{} itself", name(report, w))
            } else {
                name(report, w)
            };
            return Some(if !inherited {
                format!("set by {writer}")
            } else {
                format!(
                    "inherited from its ancestor {}, where it was set by {writer}",
                    name(report, p.pid)
                )
            });
        }
        let parent = p.parent?;
        p = report
            .processes
            .iter()
            .find(|q| q.pid == parent.tgid && q.start_ns == parent.start_ns)?;
        inherited = true;
    }
    None
}

fn diagnose(
    report: &Report,
    idx: usize,
    kill: &Kill,
    top: &Grower,
    victim_growth: u64,
) -> Diagnosis {
    let v = &kill.victim;
    let victim = report.who(v.pid, v.start_ns, &v.comm);
    let grower = report.who(top.pid, top.start_ns, &top.comm);
    let grew = growth(top);
    let points = |pid: u32, start_ns: u64| {
        kill.ranking.as_ref().and_then(|r| {
            r.candidates
                .iter()
                .find(|c| c.pid == pid && c.start_ns == start_ns)
        })
    };
    let vc = points(v.pid, v.start_ns);
    let gc = points(top.pid, top.start_ns);
    let setter = (v.oom_score_adj > 0)
        .then(|| adj_setter(report, kill))
        .flatten();
    let why = if v.oom_score_adj > 0 {
        format!("chosen for its oom_score_adj {}", v.oom_score_adj)
    } else {
        format!(
            "the largest, with {} resident",
            human_kb(v.rss.resident_kb())
        )
    };
    let title = format!(
        "The kernel killed {victim}, {why}, but {grower} grew: it added {} to the victim's {}",
        human_kb(grew),
        human_kb(victim_growth)
    );
    let span = crate::units::human_span(top.window_ns);
    let mut evidence = vec![format!(
        "{grower} added {} in the {span} before the kill{}; the victim added {}",
        human_kb(grew),
        if top.honest_kb.is_some() {
            ""
        } else {
            " (resident memory: no page probes)"
        },
        human_kb(victim_growth)
    )];
    if let (Some(vc), Some(r)) = (vc, &kill.ranking) {
        let mut line = format!(
            "the kernel kills the process with the most points: the victim had {} ({} resident{})",
            vc.points,
            human_kb(vc.rss_kb),
            if vc.oom_score_adj != 0 {
                // As badness.rs counts it: in i128, since a recording's
                // totalpages is whatever its bytes say.
                let adj_pages = vc.oom_score_adj as i128 * (r.totalpages / 1000) as i128;
                format!(
                    ", {adj_pages:+} pages from oom_score_adj {}",
                    vc.oom_score_adj
                )
            } else {
                String::new()
            }
        );
        if let Some(gc) = gc {
            line.push_str(&format!(
                ", the grower {} ({} resident, oom_score_adj {})",
                gc.points,
                human_kb(gc.rss_kb),
                gc.oom_score_adj
            ));
        }
        evidence.push(line);
    }
    if v.oom_score_adj > 0 {
        evidence.push(format!(
            "the victim's oom_score_adj {}: {}",
            v.oom_score_adj,
            setter
                .clone()
                .unwrap_or_else(|| "set before the recording began, or inherited".into())
        ));
    }
    let mut fix = vec![format!(
        "Look at what {grower} allocates: it grew {} in the {span} before the kill and lives on to be killed next",
        human_kb(grew)
    )];
    if v.oom_score_adj > 0 {
        fix.push(format!(
            "Drop the oom_score_adj {} on {victim} ({}) if that process matters: the kernel kills it first whoever grows; or give the grower a higher one, so that it is the one ended",
            v.oom_score_adj,
            setter
                .as_deref()
                .unwrap_or("set before the recording began, or inherited")
        ));
    } else {
        fix.push(format!(
            "To have the kernel end the grower rather than {victim}, raise the grower's oom_score_adj (e.g. 500, written to /proc/PID/oom_score_adj by its launcher) or lower the victim's"
        ));
    }
    Diagnosis {
        id: "victim_not_grower",
        confidence: if top.honest_kb.is_some() {
            Confidence::High
        } else {
            Confidence::Medium
        },
        title,
        evidence,
        fix,
        kill: Some(idx),
        pids: vec![v.pid, top.pid],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::diagnosis::fixture::{grower, job, kill, process};
    use crate::model::{RankedCandidate, Ranking, TotalSource};

    fn candidate(
        pid: u32,
        rss_mib: u64,
        adj: i32,
        points: i64,
        is_victim: bool,
    ) -> RankedCandidate {
        RankedCandidate {
            pid,
            start_ns: pid as u64,
            comm: "python3".into(),
            in_job: true,
            points,
            rss_kb: rss_mib << 10,
            swap_kb: 0,
            pgtables_kb: 0,
            oom_score_adj: adj,
            is_victim,
        }
    }

    /// Launcher 100 forks 101 (40 MiB, oom_score_adj 1000 written by the
    /// launcher) and 102, which grew `grower_mib`; the kernel killed 101.
    fn launched(grower_mib: i64) -> Report {
        let mut r = job(100, 256);
        let mut big = process(101, Some(100), "sleeper", 40);
        big.oom_score_adj = Some(1000);
        big.oom_score_adj_by = Some(100);
        r.processes = vec![
            process(100, None, "launcher", 10),
            big,
            process(102, Some(100), "python3", grower_mib as u64),
        ];
        let mut k = kill(101, "sleeper", 256);
        k.victim.oom_score_adj = 1000;
        k.victim.rss.anon_kb = 40 << 10;
        let mut v = grower(101, 40, 40);
        v.is_victim = true;
        k.growers = vec![grower(102, grower_mib, grower_mib as u64), v];
        k.ranking = Some(Ranking {
            candidates: vec![
                candidate(101, 40, 1000, 10_240 + 65_000, true),
                candidate(102, grower_mib as u64, 0, grower_mib << 8, false),
            ],
            totalpages: 65_536,
            totalpages_source: TotalSource::MemcgLimit,
            victim_points: Some(75_240),
            agrees_with_kernel: None,
        });
        r.kills = vec![k];
        r
    }

    #[test]
    fn a_launchers_oom_score_adj_fires_and_names_the_launcher() {
        let r = launched(200);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let d = &out[0];
        assert_eq!(
            d.title,
            "The kernel killed sleeper (pid 101), chosen for its oom_score_adj 1000, but python3 (pid 102) grew: it added 200 MiB to the victim's 40 MiB"
        );
        assert!(
            d.evidence[1].contains("+65000 pages from oom_score_adj 1000"),
            "{d:#?}"
        );
        assert_eq!(
            d.evidence[2],
            "the victim's oom_score_adj 1000: set by launcher (pid 100)"
        );
        assert_eq!(
            d.fix[1],
            "Drop the oom_score_adj 1000 on sleeper (pid 101) (set by launcher (pid 100)) if that process matters: the kernel kills it first whoever grows; or give the grower a higher one, so that it is the one ended"
        );
        assert_eq!(d.pids, vec![101, 102]);
    }

    #[test]
    fn an_inherited_oom_score_adj_names_the_ancestor() {
        let mut r = launched(200);
        // The launcher set its own, and the victim inherited it at fork.
        r.processes[1].oom_score_adj_by = None;
        r.processes[0].oom_score_adj_by = Some(100);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert_eq!(
            out[0].evidence[2],
            "the victim's oom_score_adj 1000: inherited from its ancestor launcher (pid 100), where it was set by launcher (pid 100) itself"
        );
    }

    #[test]
    fn a_victim_that_grew_as_much_does_not() {
        // 60 MiB is under twice the victim's 40.
        let mut out = Vec::new();
        check(&launched(60), &mut out);
        assert!(out.is_empty(), "{out:#?}");
        // The victim was the top grower.
        let mut r = launched(200);
        r.kills[0].growers.retain(|g| g.is_victim);
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }
}
