//! `dataloader_cow`: DataLoader workers copied the parent's dataset
//! (pytorch#13246).
//!
//! A forked worker shares its parent's pages until one side writes them.
//! CPython writes an object's reference count whenever it reads the
//! object, so a worker that reads a dataset held as Python objects copies
//! every page it touches: its resident memory does not move (the pages
//! were already mapped), but the memory charged to the cgroup grows by a
//! copy per worker. The page probes count each copy for the worker that
//! made it; that added memory beyond what its resident memory grew by is
//! the copies.

use super::workers::{self, Workers, pct, pid_list, who};
use super::{Confidence, Diagnosis};
use crate::model::{Report, lead};
use crate::units::human_kb;

/// The workers' copies are "a large share" of the limit from here.
const MIN_SHARE_PCT: u64 = 25;
/// ...and most of what they added.
const MIN_COPIED_PCT: u64 = 60;
/// A worker counts as copying from here (kB).
const MIN_WORKER_COPY_KB: u64 = 1024;

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
    if !w.honest || !w.is_python() {
        return None;
    }
    // The parent's resident memory at each fork; where no sample of it
    // came before the fork, its memory at the kill stands in.
    let inherited = |p: &crate::model::Process| p.parent_rss_at_fork_kb;
    let mut proxy = false;
    let copies: Vec<(u32, u64)> = w
        .workers
        .iter()
        .map(|x| {
            let c = x.copied_kb(inherited(x.proc)).or_else(|| {
                proxy = true;
                x.copied_kb(Some(w.parent_kb))
            });
            (x.proc.pid, c.unwrap_or(0))
        })
        .collect();
    let copied: u64 = copies.iter().map(|c| c.1).sum();
    let added = w.added_kb();
    let copiers = copies.iter().filter(|c| c.1 >= MIN_WORKER_COPY_KB).count();
    if copiers < 2 || pct(copied, w.limit_kb) < MIN_SHARE_PCT || pct(copied, added) < MIN_COPIED_PCT
    {
        return None;
    }
    let n = w.workers.len();
    let limit = human_kb(w.limit_kb);
    let mut title = format!(
        "DataLoader workers copied the parent's dataset: {n} workers added {} ({}% of the {limit} {})",
        human_kb(added),
        pct(added, w.limit_kb),
        w.limit_word()
    );
    let at_fork = w
        .workers
        .iter()
        .filter_map(|x| inherited(x.proc))
        .max()
        .unwrap_or(w.parent_kb);
    let mut evidence = vec![
        format!(
            "{n} workers forked from {} without exec: {}",
            who(report, w.parent),
            pid_list(&w.pids(), 8)
        ),
        format!(
            "the parent held {} when it forked them{}; each worker's resident memory stayed near it while it added memory: {}",
            human_kb(at_fork),
            if proxy {
                " (its memory at the kill: no sample before a fork)"
            } else {
                ""
            },
            w.workers
                .iter()
                .take(4)
                .map(|x| format!(
                    "{} added {}, resident {}",
                    x.proc.pid,
                    human_kb(x.added_kb),
                    x.rss_kb.map_or("?".into(), human_kb)
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        format!(
            "{} of the {} the workers had added by the kill is copies of the parent's pages (copy-on-write): {}% of the {limit} {}",
            human_kb(copied),
            human_kb(added),
            pct(copied, w.limit_kb),
            w.limit_word()
        ),
    ];
    let line = stack_line(report, w);
    if let Some((text, at)) = &line {
        evidence.push(text.clone());
        title.push_str(&format!(", in {at}"));
    }
    let per_worker = copies.iter().map(|c| c.1).max().unwrap_or(0);
    let fix = vec![
        "Keep the dataset in numpy arrays or torch tensors (or shared memory), not Python lists, dicts or objects: reading a Python object writes its reference count, which copies its page into every worker".into(),
        format!(
            "Use fewer workers (num_workers): each copied up to {} of the parent's pages",
            human_kb(per_worker)
        ),
        "Set persistent_workers=True, so the workers and their copies are made once rather than every epoch".into(),
    ];
    let confidence = if proxy {
        Confidence::Medium
    } else {
        Confidence::High
    };
    Some(Diagnosis {
        id: "dataloader_cow",
        confidence,
        title,
        evidence,
        fix,
        kill: Some(w.kill),
        pids: w.pids(),
    })
}

/// Where the workers were reading when they copied, from their growth
/// stacks (`record --stacks`): the heaviest stack led by a named frame
/// (the user's own line where there is one, `lead`), of the worker that
/// added most and has one. The evidence line, and the frame as cited.
fn stack_line(report: &Report, w: &Workers<'_>) -> Option<(String, String)> {
    let kill = &report.kills[w.kill];
    w.workers.iter().find_map(|x| {
        let g = kill
            .growers
            .iter()
            .find(|g| g.pid == x.proc.pid && g.start_ns == x.proc.start_ns)?;
        lead::by_lead(&report.grower_stacks(kill, g))
            .iter()
            .find_map(|st| {
                let at = lead::cite(&st.frames[st.lead?]);
                Some((
                    format!(
                        "worker {} copied while in {at}: {} of its growth stacks",
                        x.proc.pid,
                        human_kb(st.bytes / 1024)
                    ),
                    at,
                ))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Report;
    use crate::model::diagnosis::fixture::{grower, job, kill, process};

    /// A Python parent holding 100 MiB forks three workers; each worker's
    /// growth is `worker_rss` resident at the kill and `worker_added`
    /// added, under a 256 MiB limit.
    fn family(worker_added: i64, worker_rss: u64) -> Report {
        let mut r = job(100, 256);
        r.header.attach.pages = Some("tp_btf:mm_page_alloc".into());
        let mut parent = process(100, None, "python3", 100);
        parent.exec = Some("/usr/bin/python3".into());
        r.processes = vec![parent];
        for pid in [101, 102, 103] {
            let mut p = process(pid, Some(100), "python3", worker_rss);
            p.parent_rss_at_fork_kb = Some(100 << 10);
            r.processes.push(p);
        }
        let mut k = kill(100, "python3", 256);
        k.growers = vec![grower(100, 90, 100)];
        for pid in [101, 102, 103] {
            k.growers.push(grower(pid, worker_added, worker_rss));
        }
        r.kills = vec![k];
        r
    }

    #[test]
    fn workers_copying_the_parents_pages_fire() {
        let r = family(50, 100);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        let d = &out[0];
        assert_eq!(d.confidence, Confidence::High);
        assert_eq!(
            d.title,
            "DataLoader workers copied the parent's dataset: 3 workers added 150 MiB (58% of the 256 MiB limit)"
        );
        assert_eq!(d.pids, vec![101, 102, 103]);
        assert_eq!(d.kill, Some(0));
        assert!(d.evidence[0].contains("python3 (pid 100)"), "{d:#?}");
        assert!(d.evidence[1].contains("held 100 MiB"), "{d:#?}");
        assert!(d.fix[0].contains("numpy"), "{d:#?}");
        assert!(d.fix[2].contains("persistent_workers"), "{d:#?}");
    }

    #[test]
    fn workers_growing_their_own_memory_do_not() {
        // Each added 50 MiB and its resident memory grew by as much: new
        // allocations, not copies.
        let r = family(50, 150);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn a_small_share_of_the_limit_does_not() {
        let r = family(15, 100);
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }

    #[test]
    fn without_the_page_probes_it_cannot_tell() {
        let mut r = family(50, 100);
        r.header.attach.pages = None;
        let mut out = Vec::new();
        check(&r, &mut out);
        assert!(out.is_empty(), "{out:#?}");
    }
}
