//! `no_swap_overcommit`: the machine's memory settings decided how the job
//! died. A global OOM (no cgroup limit involved: the whole machine ran
//! out) with no swap gives the kernel nothing to page out, so the OOM
//! killer acts at once and may pick any process on the machine; strict
//! overcommit (`vm.overcommit_memory=2`) refuses allocations past
//! CommitLimit, so the job dies of a failed malloc, fork or CUDA host
//! allocation with no OOM kill to show.
//!
//! The settings are those `doctor` checks (`doctor/memory.rs`), from the
//! recording's header (taken at the start, as `doctor` reads them) and the
//! pressure samples at the kill.

use super::{Confidence, Diagnosis};
use crate::model::{Constraint, ExitStatus, Kill, Report};
use crate::units::human_kb;

/// CommitLimit below this share of RAM is a small commit budget (as
/// `doctor` warns).
const SMALL_COMMIT_PCT: u64 = 90;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    let mut global = false;
    for (i, k) in report.kills.iter().enumerate() {
        if k.victim.in_job && k.constraint == Constraint::None {
            out.push(global_oom(report, i, k));
            global = true;
        }
    }
    if !global && let Some(d) = strict_refusal(report) {
        out.push(d);
    }
}

fn mode_name(m: u32) -> &'static str {
    match m {
        0 => "heuristic",
        1 => "always overcommit",
        2 => "strict accounting",
        _ => "unknown",
    }
}

fn global_oom(report: &Report, i: usize, k: &Kill) -> Diagnosis {
    let h = &report.header;
    let p = k.pressure.as_ref();
    let swap_kb = p.map_or(h.swap_total_kb, |p| p.swap_total_kb);
    let ram_kb = p
        .map(|p| p.mem_total_kb)
        .filter(|t| *t > 0)
        .unwrap_or(h.mem_total_kb);
    let mode = p.and_then(|p| p.overcommit_memory).or(h.overcommit.memory);
    let ram = if ram_kb > 0 {
        format!(" ({} of RAM)", human_kb(ram_kb))
    } else {
        String::new()
    };
    let mut evidence = vec![format!(
        "A global OOM (constraint none): the whole machine{ram} ran out, no cgroup limit was involved, and the kernel chose {} (pid {}) among every process on it",
        k.victim.comm, k.victim.pid
    )];
    if let Some(p) = p {
        evidence.push(format!(
            "Available memory fell from {} to {} at the kill",
            human_kb(p.available_start_kb),
            human_kb(p.available_at_kill_kb)
        ));
    }
    let no_swap = swap_kb == 0;
    if no_swap {
        evidence.push(
            "No swap (SwapTotal 0): nothing could be paged out, so the kill came with little slowdown before it".into(),
        );
    } else if let Some(p) = p {
        evidence.push(format!(
            "Swap: {} of {} in use at the kill",
            human_kb(p.swap_used_kb),
            human_kb(p.swap_total_kb)
        ));
    }
    if let Some(m) = mode {
        let commit = p
            .filter(|p| p.commit_limit_kb > 0)
            .map(|p| {
                format!(
                    "; Committed_AS {} of CommitLimit {}",
                    human_kb(p.committed_as_kb),
                    human_kb(p.commit_limit_kb)
                )
            })
            .unwrap_or_default();
        evidence.push(format!(
            "vm.overcommit_memory={m} ({}){commit}",
            mode_name(m)
        ));
    }
    let mut fix = vec![
        "Give the job a memory limit of its own (systemd-run --scope -p MemoryMax=…, docker run --memory, a Kubernetes memory limit): the kernel then kills inside the job's cgroup when it outgrows it, instead of picking from the whole machine".to_string(),
    ];
    if no_swap {
        fix.push(
            "For a buffer against short peaks, add swap (a swap file, or zram: compressed swap in RAM); with cgroup v2, cap each job's share with memory.swap.max".into(),
        );
    }
    if mode == Some(1) {
        fix.push(
            "vm.overcommit_memory=1 lets every allocation succeed, however large, so running out always ends in a kill: sysctl vm.overcommit_memory=0 restores the default heuristic".into(),
        );
    }
    fix.push(
        "Run `trainbpf doctor` for the machine's swap and overcommit settings and what they mean"
            .into(),
    );
    let title = if no_swap {
        format!(
            "The whole machine ran out of memory{ram}, with no swap: a global OOM kill, no cgroup limit involved"
        )
    } else {
        format!("The whole machine ran out of memory{ram}: a global OOM kill, swap included")
    };
    Diagnosis {
        id: "no_swap_overcommit",
        confidence: if no_swap {
            Confidence::Medium
        } else {
            Confidence::Low
        },
        title,
        evidence,
        fix,
        kill: Some(i),
        pids: vec![k.victim.pid],
    }
}

/// Strict overcommit and a job that failed with no OOM kill: an allocation
/// refused at CommitLimit is the likely end.
fn strict_refusal(report: &Report) -> Option<Diagnosis> {
    let h = &report.header;
    if h.overcommit.memory != Some(2) {
        return None;
    }
    let job = report.job.as_ref()?;
    let failed = match job.exit? {
        ExitStatus::Code(c) => c != 0,
        // SIGABRT (std::bad_alloc uncaught) and SIGSEGV (an unchecked NULL
        // from malloc).
        ExitStatus::Signal(s) => s == 6 || s == 11,
    };
    if !failed || report.kills.iter().any(|k| k.victim.in_job) {
        return None;
    }
    let limit = h.overcommit.commit_limit_kb;
    let small = limit > 0 && h.mem_total_kb > 0 && limit * 100 < h.mem_total_kb * SMALL_COMMIT_PCT;
    let sizing = match (h.overcommit.kbytes, h.overcommit.ratio) {
        (Some(k), _) if k > 0 => format!("overcommit_kbytes {k}"),
        (_, Some(r)) => format!("overcommit_ratio {r}%"),
        _ => "ratio unknown".into(),
    };
    let mut evidence = vec![format!(
        "vm.overcommit_memory=2 (strict accounting, {sizing}) when recording started: allocations past CommitLimit fail with ENOMEM before the OOM killer ever runs"
    )];
    if limit > 0 {
        evidence.push(format!(
            "CommitLimit {} against {} of RAM and {} of swap",
            human_kb(limit),
            human_kb(h.mem_total_kb),
            human_kb(h.swap_total_kb)
        ));
    }
    evidence.push(format!(
        "The job ended with {} and no OOM kill of a job process was recorded",
        match job.exit? {
            ExitStatus::Code(c) => format!("exit code {c}"),
            ExitStatus::Signal(s) => format!("signal {s}"),
        }
    ));
    let limit_text = if limit > 0 {
        format!(" (CommitLimit {})", human_kb(limit))
    } else {
        String::new()
    };
    Some(Diagnosis {
        id: "no_swap_overcommit",
        confidence: if small {
            Confidence::Medium
        } else {
            Confidence::Low
        },
        title: format!(
            "Strict overcommit may have refused an allocation: vm.overcommit_memory=2{limit_text} and the job failed with no OOM kill"
        ),
        evidence,
        fix: vec![
            "Look in the job's output for \"Cannot allocate memory\", std::bad_alloc, MemoryError or a DataLoader worker that failed to start: those are refused allocations, not kills".into(),
            if small {
                "CommitLimit is well below RAM: raise vm.overcommit_ratio (or vm.overcommit_kbytes), add swap, or use vm.overcommit_memory=0".into()
            } else {
                "Keep Committed_AS well below CommitLimit (fewer workers: each fork commits its parent's writable memory again), or use vm.overcommit_memory=0".into()
            },
        ],
        kill: None,
        pids: vec![job.pid],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PressureBefore;
    use crate::model::diagnosis::fixture::{job, kill, process};
    use crate::recording::Overcommit;

    fn pressure(swap_total_kb: u64, mode: u32) -> PressureBefore {
        PressureBefore {
            span_ns: 60_000_000_000,
            available_start_kb: 20 << 20,
            available_at_kill_kb: 100 << 10,
            available_min_kb: 100 << 10,
            mem_total_kb: 24 << 20,
            swap_used_kb: swap_total_kb,
            swap_total_kb,
            shmem_kb: 0,
            committed_as_kb: 30 << 20,
            commit_limit_kb: 12 << 20,
            overcommit_memory: Some(mode),
            cgroup_usage_kb: None,
            cgroup_limit_kb: None,
            cgroup_max_events: None,
            psi_some_avg10: None,
            psi_full_avg10: None,
            psi_some_stall_ms: None,
            stall_ms: [0; 3],
            stalls: [0; 3],
            reclaim_freed_kb: 0,
        }
    }

    fn global(swap_total_kb: u64, mode: u32) -> Report {
        let mut r = job(100, 512);
        r.job.as_mut().unwrap().memory_limit_bytes = None;
        r.processes = vec![process(100, None, "python", 20_000)];
        let mut k = kill(100, "python", 512);
        k.constraint = Constraint::None;
        k.memcg_limit_kb = None;
        k.pressure = Some(pressure(swap_total_kb, mode));
        r.kills = vec![k];
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut v = Vec::new();
        check(r, &mut v);
        v
    }

    #[test]
    fn a_global_oom_with_no_swap_fires_with_the_settings() {
        let d = run(&global(0, 1));
        assert_eq!(d.len(), 1);
        let d = &d[0];
        assert_eq!((d.confidence, d.kill), (Confidence::Medium, Some(0)));
        assert_eq!(
            d.title,
            "The whole machine ran out of memory (24 GiB of RAM), with no swap: a global OOM kill, no cgroup limit involved"
        );
        assert!(
            d.evidence
                .iter()
                .any(|e| e.contains("No swap (SwapTotal 0)"))
        );
        assert!(
            d.evidence
                .iter()
                .any(|e| e.contains("vm.overcommit_memory=1 (always overcommit); Committed_AS 30 GiB of CommitLimit 12 GiB")),
            "{d:#?}"
        );
        assert!(d.fix[0].contains("MemoryMax"));
        assert!(d.fix.iter().any(|f| f.contains("zram")));
        assert!(d.fix.iter().any(|f| f.contains("overcommit_memory=0")));
    }

    #[test]
    fn a_memcg_kill_or_a_global_one_with_swap_is_not_a_no_swap_oom() {
        let mut r = global(0, 0);
        r.kills[0].constraint = Constraint::Memcg;
        assert!(run(&r).is_empty());
        let d = run(&global(8 << 20, 0));
        assert_eq!(d[0].confidence, Confidence::Low);
        assert!(d[0].title.ends_with("swap included"), "{}", d[0].title);
        assert!(!d[0].fix.iter().any(|f| f.contains("zram")));
    }

    fn strict(mode: u32, commit_limit_kb: u64, exit: ExitStatus) -> Report {
        let mut r = job(100, 512);
        r.header.mem_total_kb = 24 << 20;
        r.header.overcommit = Overcommit {
            memory: Some(mode),
            ratio: Some(50),
            kbytes: Some(0),
            commit_limit_kb,
        };
        r.job.as_mut().unwrap().exit = Some(exit);
        r
    }

    #[test]
    fn strict_overcommit_and_a_failed_job_without_a_kill_fires() {
        let d = run(&strict(2, 12 << 20, ExitStatus::Code(1)));
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].confidence, d[0].kill), (Confidence::Medium, None));
        assert_eq!(
            d[0].title,
            "Strict overcommit may have refused an allocation: vm.overcommit_memory=2 (CommitLimit 12 GiB) and the job failed with no OOM kill"
        );
        assert!(d[0].evidence[0].contains("overcommit_ratio 50%"));
        assert!(d[0].fix[1].contains("raise vm.overcommit_ratio"));
        // A generous CommitLimit: still said, with less confidence.
        let d = run(&strict(2, 30 << 20, ExitStatus::Signal(6)));
        assert_eq!(d[0].confidence, Confidence::Low);
    }

    #[test]
    fn heuristic_overcommit_or_a_clean_exit_does_not_fire() {
        assert!(run(&strict(0, 12 << 20, ExitStatus::Code(1))).is_empty());
        assert!(run(&strict(2, 12 << 20, ExitStatus::Code(0))).is_empty());
        // Killed by signal 9 from someone: not a refused allocation.
        assert!(run(&strict(2, 12 << 20, ExitStatus::Signal(9))).is_empty());
        // Old recordings have no overcommit settings.
        let mut r = strict(2, 12 << 20, ExitStatus::Code(1));
        r.header.overcommit = Overcommit::default();
        assert!(run(&r).is_empty());
    }

    /// A header written before the settings were kept still decodes, with
    /// them unknown.
    #[test]
    fn an_old_header_decodes_without_the_settings() {
        let mut v = serde_json::to_value(crate::recording::RecordingHeader::default()).unwrap();
        v.as_object_mut().unwrap().remove("overcommit");
        let h: crate::recording::RecordingHeader = serde_json::from_value(v).unwrap();
        assert_eq!(h.overcommit, Overcommit::default());
    }
}
