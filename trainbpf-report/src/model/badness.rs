//! Why this victim: the OOM killer's ranking, reconstructed.
//!
//! The kernel picks the process with the highest `oom_badness()`
//! (mm/oom_kill.c):
//!
//! ```text
//! points = rss + swap entries + pgtables_bytes / PAGE_SIZE      (pages)
//! adj    = oom_score_adj * (totalpages / 1000)                  (integer division first)
//! badness = points + adj;  oom_score_adj -1000 is never chosen
//! ```
//!
//! `totalpages` is the size of the OOM domain: the memcg's limit for a memcg
//! OOM, RAM plus swap for a global one. Where a kprobe or fentry on
//! `oom_kill_process` ran, the kernel's own `chosen_points` and `totalpages`
//! are known and the reconstruction is checked against them; elsewhere it is
//! all there is, and is labelled as such.

/// One process's inputs to the ranking, at the kill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inputs {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    pub(crate) in_job: bool,
    pub(crate) rss_kb: u64,
    pub(crate) swap_kb: u64,
    pub(crate) pgtables_kb: u64,
    pub(crate) oom_score_adj: i32,
}

/// A ranked candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    pub(crate) in_job: bool,
    pub(crate) points: i64,
    pub(crate) rss_kb: u64,
    pub(crate) swap_kb: u64,
    pub(crate) pgtables_kb: u64,
    pub(crate) oom_score_adj: i32,
    pub(crate) is_victim: bool,
}

/// Where `totalpages` came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TotalSource {
    /// `oc->totalpages`, read by the kprobe/fentry program.
    Kernel,
    /// The memory cgroup's limit.
    MemcgLimit,
    /// MemTotal plus SwapTotal at the start of the recording.
    Machine,
    Unknown,
}

impl TotalSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TotalSource::Kernel => "kernel",
            TotalSource::MemcgLimit => "memcg_limit",
            TotalSource::Machine => "mem_total_plus_swap",
            TotalSource::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ranking {
    /// Highest badness first; the victim is always included.
    pub(crate) candidates: Vec<Candidate>,
    pub(crate) totalpages: u64,
    pub(crate) totalpages_source: TotalSource,
    /// The victim's reconstructed points.
    pub(crate) victim_points: Option<i64>,
    /// Reconstruction and the kernel's `chosen_points` within 1% (or 256
    /// pages); None when the kernel's figure is unknown.
    pub(crate) agrees_with_kernel: Option<bool>,
}

/// Candidates shown: the top of the list is what explains the choice.
pub(crate) const MAX_CANDIDATES: usize = 10;
/// `OOM_SCORE_ADJ_MIN`: never chosen.
const ADJ_MIN: i32 = -1000;

/// `oom_badness()` for one process, in pages.
pub(crate) fn badness(i: &Inputs, page_kb: u64, totalpages: u64) -> i64 {
    let page_kb = page_kb.max(1);
    let pages = i.rss_kb.saturating_add(i.swap_kb) / page_kb + i.pgtables_kb / page_kb;
    // Wide, then clamped: a damaged record's figures must not overflow.
    let points = pages as i128 + i.oom_score_adj as i128 * (totalpages / 1000) as i128;
    points.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Ranks `others` and the victim. `kernel_points` is `oc->chosen_points`
/// when a probe on oom_kill_process saw it.
pub(crate) fn rank(
    victim: &Inputs,
    others: impl IntoIterator<Item = Inputs>,
    page_kb: u64,
    totalpages: u64,
    totalpages_source: TotalSource,
    kernel_points: Option<i64>,
) -> Ranking {
    let make = |i: Inputs, is_victim: bool| Candidate {
        points: badness(&i, page_kb, totalpages),
        pid: i.pid,
        start_ns: i.start_ns,
        comm: i.comm,
        in_job: i.in_job,
        rss_kb: i.rss_kb,
        swap_kb: i.swap_kb,
        pgtables_kb: i.pgtables_kb,
        oom_score_adj: i.oom_score_adj,
        is_victim,
    };
    let mut all: Vec<Candidate> = others
        .into_iter()
        .filter(|i| {
            i.oom_score_adj > ADJ_MIN && !(i.pid == victim.pid && i.start_ns == victim.start_ns)
        })
        .map(|i| make(i, false))
        .collect();
    let v = make(victim.clone(), true);
    let victim_points = Some(v.points);
    all.push(v);
    all.sort_by(|a, b| {
        b.points
            .cmp(&a.points)
            .then(b.is_victim.cmp(&a.is_victim))
            .then(a.pid.cmp(&b.pid))
    });
    let victim_at = all.iter().position(|c| c.is_victim).unwrap_or(0);
    if victim_at >= MAX_CANDIDATES {
        let v = all.remove(victim_at);
        all.truncate(MAX_CANDIDATES - 1);
        all.push(v);
    } else {
        all.truncate(MAX_CANDIDATES);
    }
    let agrees_with_kernel = kernel_points.zip(victim_points).map(|(k, r)| {
        let (k, r) = (k as i128, r as i128);
        let tol = (k.abs() / 100).max(256);
        (k - r).abs() <= tol
    });
    Ranking {
        candidates: all,
        totalpages,
        totalpages_source,
        victim_points,
        agrees_with_kernel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inp(pid: u32, rss_mb: u64, adj: i32) -> Inputs {
        Inputs {
            pid,
            start_ns: 1,
            comm: format!("p{pid}"),
            in_job: true,
            rss_kb: rss_mb * 1024,
            swap_kb: 0,
            pgtables_kb: 0,
            oom_score_adj: adj,
        }
    }

    #[test]
    fn badness_is_the_kernels_formula() {
        // 100 MiB RSS + 4 MiB swap + 64 kB page tables, 4 kB pages: 26640
        // pages; adj 500 over 25600 pages (100 MiB) adds 500 * 25 pages.
        let i = Inputs {
            swap_kb: 4096,
            pgtables_kb: 64,
            ..inp(1, 100, 500)
        };
        assert_eq!(badness(&i, 4, 25_600), 25_600 + 1024 + 16 + 500 * 25);
    }

    #[test]
    fn biggest_process_ranks_first_unless_adj_says_otherwise() {
        let total = 256 * 256; // 256 MiB in 4 kB pages
        let r = rank(
            &inp(1, 200, 0),
            [inp(2, 20, 0)],
            4,
            total,
            TotalSource::MemcgLimit,
            None,
        );
        assert!(r.candidates[0].is_victim);
        // A small sibling with oom_score_adj 1000 outranks the grower.
        let r = rank(
            &inp(2, 20, 1000),
            [inp(1, 200, 0)],
            4,
            total,
            TotalSource::MemcgLimit,
            None,
        );
        assert_eq!(r.candidates[0].pid, 2);
        assert!(r.candidates[0].is_victim);
        assert_eq!(r.candidates[1].pid, 1);
    }

    #[test]
    fn unkillable_processes_are_not_candidates() {
        let r = rank(
            &inp(1, 10, 0),
            [inp(2, 500, -1000)],
            4,
            1 << 20,
            TotalSource::Machine,
            None,
        );
        assert_eq!(r.candidates.len(), 1);
    }

    #[test]
    fn agreement_with_the_kernels_points() {
        let v = inp(1, 100, 0);
        let r = rank(&v, [], 4, 1 << 20, TotalSource::Kernel, Some(25_600 + 10));
        assert_eq!(r.agrees_with_kernel, Some(true));
        let r = rank(&v, [], 4, 1 << 20, TotalSource::Kernel, Some(50_000));
        assert_eq!(r.agrees_with_kernel, Some(false));
        assert_eq!(
            rank(&v, [], 4, 1, TotalSource::Unknown, None).agrees_with_kernel,
            None
        );
    }

    #[test]
    fn victim_is_kept_even_far_down_the_list() {
        let others: Vec<_> = (10..30).map(|p| inp(p, 100 + p as u64, 0)).collect();
        let r = rank(
            &inp(1, 1, 0),
            others,
            4,
            1 << 20,
            TotalSource::Machine,
            None,
        );
        assert_eq!(r.candidates.len(), MAX_CANDIDATES);
        assert!(r.candidates.last().unwrap().is_victim);
    }
}
