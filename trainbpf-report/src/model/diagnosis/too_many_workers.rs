//! `too_many_workers`: each worker's memory times the number of workers
//! is more than the limit leaves after the parent.
//!
//! A worker's memory is what it added in its own context (honest
//! attribution: a fork adds nothing, a copy-on-write break does), the
//! most any of them added by the kill: the kill cut the others' growth
//! short, so the biggest is the best measure of what one needs. What the
//! limit leaves is the limit less the parent's resident memory at the
//! kill. The count that would have fit follows from the two.

use super::workers::{self, Workers, pct, pid_list, who};
use super::{Confidence, Diagnosis};
use crate::model::Report;
use crate::units::human_kb;

/// The workers' added memory is a real share of the limit from here: a
/// kill brought on by the parent is not the workers'.
const MIN_SHARE_PCT: u64 = 33;
/// Workers are alike: at least two added this share of the most any
/// added, or it is one process's growth, not the number of workers.
const ALIKE_PCT: u64 = 50;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    for idx in 0..report.kills.len() {
        if let Some(w) = workers::at_kill(report, idx)
            && let Some(d) = diagnose(report, &w)
        {
            out.push(d);
        }
    }
}

fn diagnose(report: &Report, w: &Workers<'_>) -> Option<Diagnosis> {
    let n = w.workers.len() as u64;
    let per_worker = w.workers.first()?.added_kb;
    let alike = w
        .workers
        .iter()
        .filter(|x| pct(x.added_kb, per_worker) >= ALIKE_PCT)
        .count();
    // A parent that holds more than its workers added brought the kill
    // on itself, whatever they added.
    if per_worker == 0
        || alike < 2
        || pct(w.added_kb(), w.limit_kb) < MIN_SHARE_PCT
        || w.added_kb() <= w.parent_kb
    {
        return None;
    }
    let left = w.limit_kb.saturating_sub(w.parent_kb);
    let needed = per_worker.saturating_mul(n);
    let fits = left / per_worker;
    if needed <= left || fits >= n {
        return None;
    }
    let limit = format!("{} {}", human_kb(w.limit_kb), w.limit_word());
    let title = format!(
        "Too many workers for the memory: {n} workers of about {} each need {}, and the {limit} leaves {} after the parent",
        human_kb(per_worker),
        human_kb(needed),
        human_kb(left)
    );
    let evidence = vec![
        format!(
            "{n} workers forked from {} without exec: {}",
            who(report, w.parent),
            pid_list(&w.pids(), 8)
        ),
        format!(
            "by the kill they had added {} ({}% of the {limit}); the most one added: {} (pid {}){}",
            human_kb(w.added_kb()),
            pct(w.added_kb(), w.limit_kb),
            human_kb(per_worker),
            w.workers[0].proc.pid,
            if w.honest {
                ""
            } else {
                ", its resident memory beyond what it inherited (no page probes)"
            }
        ),
        format!(
            "the parent held {} at the kill, leaving {} of the {limit}: room for {fits} worker{} of {}",
            human_kb(w.parent_kb),
            human_kb(left),
            if fits == 1 { "" } else { "s" },
            human_kb(per_worker)
        ),
    ];
    let raise_to = w.parent_kb.saturating_add(needed);
    let mut fix = Vec::new();
    if fits > 0 {
        fix.push(format!(
            "Use {fits} worker{} (num_workers={fits}): {fits} × {} fits in the {} the {limit} leaves after the parent",
            if fits == 1 { "" } else { "s" },
            human_kb(per_worker),
            human_kb(left)
        ));
    } else {
        fix.push(format!(
            "No worker fits: one needs about {}, and the parent leaves {} of the {limit}; load in the main process (num_workers=0) or raise the limit",
            human_kb(per_worker),
            human_kb(left)
        ));
    }
    fix.push(format!(
        "Or give the job at least {} for {n} workers (the parent's {} plus {n} × {}), with room to spare",
        human_kb(raise_to),
        human_kb(w.parent_kb),
        human_kb(per_worker)
    ));
    fix.push(
        "Or make each worker smaller: share read-only data with the parent (numpy arrays, tensors, shared memory) rather than building it per worker, and lower prefetch_factor".into(),
    );
    Some(Diagnosis {
        id: "too_many_workers",
        confidence: if w.honest {
            Confidence::High
        } else {
            Confidence::Medium
        },
        title,
        evidence,
        fix,
        kill: Some(w.kill),
        pids: w.pids(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::diagnosis::fixture::{grower, job, kill, process};

    /// A parent holding 10 MiB with `added.len()` workers, each having
    /// added its figure (MiB), under a 256 MiB limit.
    fn family(added: &[i64]) -> Report {
        let mut r = job(100, 256);
        r.header.attach.pages = Some("tp_btf:mm_page_alloc".into());
        r.processes = vec![process(100, None, "python3", 10)];
        let mut k = kill(101, "python3", 256);
        k.growers = vec![grower(100, 8, 10)];
        for (i, &a) in added.iter().enumerate() {
            let pid = 101 + i as u32;
            let mut p = process(pid, Some(100), "python3", 10 + a as u64);
            p.parent_rss_at_fork_kb = Some(10 << 10);
            r.processes.push(p);
            k.growers.push(grower(pid, a, 10 + a as u64));
        }
        r.kills = vec![k];
        r
    }

    #[test]
    fn six_workers_of_70_mib_under_256_fire_and_three_fit() {
        let r = family(&[70, 70, 70, 26, 0, 0]);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let d = &out[0];
        assert_eq!(d.confidence, Confidence::High);
        assert_eq!(
            d.title,
            "Too many workers for the memory: 6 workers of about 70 MiB each need 420 MiB, and the 256 MiB limit leaves 246 MiB after the parent"
        );
        assert!(
            d.fix[0].starts_with("Use 3 workers (num_workers=3)"),
            "{d:#?}"
        );
        assert!(d.fix[1].contains("at least 430 MiB"), "{d:#?}");
        assert!(d.evidence[2].contains("room for 3 workers"), "{d:#?}");
        assert_eq!(d.pids.len(), 6);
    }

    #[test]
    fn workers_that_fit_do_not() {
        // 4 × 40 MiB fit in what the parent leaves: the kill was
        // something else's.
        let r = family(&[40, 40, 40, 40]);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn one_big_child_among_small_ones_is_not_too_many_workers() {
        // One grew 200 MiB, its siblings little: that is one grower.
        let r = family(&[200, 20, 10]);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn children_named_apart_are_not_workers() {
        let mut r = family(&[70, 70, 70, 26]);
        for (i, p) in r.processes.iter_mut().skip(1).enumerate() {
            p.comm = format!("role{i}");
        }
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn a_parent_holding_more_than_its_workers_added_is_not_their_fault() {
        // As in the real-oom fixture: the parent grew to 200 MiB, its two
        // workers added 50 MiB each, under 300 MiB.
        let mut r = family(&[50, 50]);
        r.processes[0].peak_rss_kb = 204 << 10;
        r.kills[0].growers[0].rss_kb = 204 << 10;
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn small_workers_beside_a_big_parent_do_not() {
        // Three 20 MiB workers: too little of the limit to be the cause.
        let mut r = family(&[20, 20, 20]);
        r.processes[0].peak_rss_kb = 230 << 10;
        r.kills[0].growers[0].rss_kb = 230 << 10;
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }
}
