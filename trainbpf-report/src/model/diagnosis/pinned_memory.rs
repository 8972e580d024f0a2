//! `pinned_memory`: page-locked host memory (CUDA host allocations and
//! registrations) took a large share of the limit, or of the victim.
//!
//! Pinned memory is ordinary RAM charged to the process's cgroup, but it
//! can be neither swapped nor reclaimed, and PyTorch keeps it around: each
//! DataLoader batch in flight is copied into a pinned buffer when
//! `pin_memory=True`, and the caching host allocator keeps freed pinned
//! blocks for reuse. It shows in RSS like any other memory, so without the
//! GPU ledger it reads as "the process grew".

use super::{Confidence, Diagnosis};
use crate::model::{Kill, Report, gpu::GpuProcess};
use crate::units::{human_bytes, human_kb};

/// Pinned memory at or above these shares of the limit (or of the
/// victim's resident memory) makes the diagnosis, at medium and high
/// confidence. A run's pinned staging buffers are usually tens of MiB:
/// a quarter of the limit is well past that.
const LIMIT_MEDIUM_PCT: u64 = 25;
const LIMIT_HIGH_PCT: u64 = 50;
const VICTIM_MEDIUM_PCT: u64 = 33;
const VICTIM_HIGH_PCT: u64 = 50;
/// Below this nothing is said, whatever the shares (a tiny limit).
const MIN_BYTES: u64 = 16 << 20;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    let gpu = &report.gpu;
    if gpu.processes.iter().all(|p| p.pinned.peak == 0) {
        return;
    }
    let mut explained = false;
    for (i, k) in report.kills.iter().enumerate() {
        if !k.victim.in_job {
            continue;
        }
        if let Some(d) = at_kill(report, i, k) {
            out.push(d);
            explained = true;
        }
    }
    if !explained && let Some(d) = over_run(report) {
        out.push(d);
    }
}

/// (pid, comm, pinned bytes) held by each job process at the kill.
fn held_at(report: &Report, i: usize) -> Vec<(u32, String, u64)> {
    let Some(at) = report.gpu.at_kills.get(i) else {
        return Vec::new();
    };
    let mut v: Vec<_> = at
        .processes
        .iter()
        .filter(|p| p.held.pinned > 0)
        .map(|p| (p.pid, p.comm.clone(), p.held.pinned))
        .collect();
    v.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    v
}

fn at_kill(report: &Report, i: usize, k: &Kill) -> Option<Diagnosis> {
    let held = held_at(report, i);
    let total: u64 = held.iter().map(|h| h.2).sum();
    if total < MIN_BYTES {
        return None;
    }
    let limit = k.memcg_limit_kb.map(|kb| kb << 10).or_else(|| {
        report
            .job
            .as_ref()
            .and_then(|j| j.memory_limit_bytes)
            .filter(|_| k.constraint == crate::model::Constraint::Memcg)
    });
    let victim_pinned = held.iter().find(|h| h.0 == k.victim.pid).map_or(0, |h| h.2);
    let victim_rss = k.victim.rss.resident_kb() << 10;
    let of_limit = limit.map(|l| pct(total, l));
    let of_victim = (victim_rss > 0).then(|| pct(victim_pinned, victim_rss));
    let confidence = if of_limit.is_some_and(|p| p >= LIMIT_HIGH_PCT)
        || of_victim.is_some_and(|p| p >= VICTIM_HIGH_PCT)
    {
        Confidence::High
    } else if of_limit.is_some_and(|p| p >= LIMIT_MEDIUM_PCT)
        || of_victim.is_some_and(|p| p >= VICTIM_MEDIUM_PCT)
    {
        Confidence::Medium
    } else {
        return None;
    };
    let share = match (of_limit, limit) {
        (Some(p), Some(l)) => format!(" ({p}% of the {} limit)", human_bytes(l)),
        _ => String::new(),
    };
    let title = format!(
        "Pinned host memory took a large share: {} page-locked at the kill{share}",
        human_bytes(total)
    );
    let mut evidence = vec![format!(
        "Pinned (CUDA host-allocated or registered) memory held at the kill: {} in {} process(es)",
        human_bytes(total),
        held.len()
    )];
    for (pid, comm, b) in held.iter().take(5) {
        evidence.push(format!("  {comm} (pid {pid}): {}", human_bytes(*b)));
    }
    if let Some(p) = of_victim {
        evidence.push(format!(
            "The victim {} (pid {}) held {} pinned of its {} resident ({p}%)",
            k.victim.comm,
            k.victim.pid,
            human_bytes(victim_pinned),
            human_kb(victim_rss >> 10),
        ));
    }
    let procs: Vec<&GpuProcess> = report
        .gpu
        .processes
        .iter()
        .filter(|p| held.iter().any(|h| h.0 == p.pid))
        .collect();
    evidence.extend(ledger_lines(&procs));
    let workers = procs.iter().filter(|p| !p.is_root).count();
    Some(Diagnosis {
        id: "pinned_memory",
        confidence,
        title,
        evidence,
        fix: fixes(workers),
        kill: Some(i),
        pids: held.iter().map(|h| h.0).collect(),
    })
}

/// No kill it explains, but the run's pinned peaks add up to most of the
/// job's limit: the next larger batch or one more worker will not fit.
fn over_run(report: &Report) -> Option<Diagnosis> {
    let limit = report.job.as_ref()?.memory_limit_bytes?;
    let procs: Vec<&GpuProcess> = report
        .gpu
        .processes
        .iter()
        .filter(|p| p.pinned.peak > 0)
        .collect();
    let total: u64 = procs.iter().map(|p| p.pinned.peak).sum();
    if total < MIN_BYTES || pct(total, limit) < LIMIT_HIGH_PCT {
        return None;
    }
    let mut evidence = vec![format!(
        "Pinned memory peaks, summed over {} process(es): {} of the {} limit ({}%)",
        procs.len(),
        human_bytes(total),
        human_bytes(limit),
        pct(total, limit)
    )];
    evidence.extend(ledger_lines(&procs));
    Some(Diagnosis {
        id: "pinned_memory",
        confidence: Confidence::Low,
        title: format!(
            "Pinned host memory reached {} ({}% of the {} limit)",
            human_bytes(total),
            pct(total, limit),
            human_bytes(limit)
        ),
        evidence,
        fix: fixes(procs.iter().filter(|p| !p.is_root).count()),
        kill: None,
        pids: procs.iter().map(|p| p.pid).collect(),
    })
}

/// What each process's ledger says: peak, how much of it was registered
/// rather than allocated, and how much was still held at its end.
fn ledger_lines(procs: &[&GpuProcess]) -> Vec<String> {
    procs
        .iter()
        .take(5)
        .map(|p| {
            let reg = if p.registered_peak > 0 {
                format!(
                    ", of which {} registered (cuMemHostRegister)",
                    human_bytes(p.registered_peak)
                )
            } else {
                String::new()
            };
            format!(
                "{} (pid {}): pinned peak {}{reg}; {} allocation(s), {} freed",
                p.comm,
                p.pid,
                human_bytes(p.pinned.peak),
                p.pinned.allocs,
                human_bytes(p.pinned.freed),
            )
        })
        .collect()
}

fn fixes(workers: usize) -> Vec<String> {
    let mut v = Vec::new();
    if workers > 0 {
        v.push(format!(
            "{workers} worker process(es) pinned memory of their own: each pins its own buffers, so the total grows with num_workers; don't allocate pinned tensors in workers (pin in the main process, or not at all)"
        ));
    }
    v.extend([
        "DataLoader(pin_memory=True) copies every batch in flight (num_workers × prefetch_factor of them) into pinned memory: lower prefetch_factor or num_workers, or set pin_memory=False if host-to-GPU copies are not the bottleneck".to_string(),
        "PyTorch's caching host allocator keeps freed pinned blocks for reuse, and torch.cuda.empty_cache() does not return them (it frees device memory only): avoid pinning buffers of ever-changing sizes, and count the pinned cache in the memory limit".to_string(),
        "Pinned memory can't be swapped or reclaimed: budget it explicitly (batch bytes × batches in flight) and raise the limit by that much if it is needed".to_string(),
    ]);
    v
}

fn pct(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        0
    } else {
        ((part as u128 * 100) / whole as u128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::diagnosis::fixture::{job, kill, process};
    use crate::model::gpu::{AtKill, GpuAtKill, Held};

    const MIB: u64 = 1 << 20;

    fn gpu_proc(pid: u32, pinned_peak_mib: u64, root: bool) -> GpuProcess {
        let mut p = GpuProcess {
            pid,
            comm: if root {
                "python".into()
            } else {
                "pt_worker".into()
            },
            is_root: root,
            registered_peak: 32 * MIB,
            ..GpuProcess::default()
        };
        p.pinned.peak = pinned_peak_mib * MIB;
        p.pinned.allocs = 12;
        p
    }

    /// A 512 MiB job killed holding `pinned_mib` pinned in its root.
    fn report(pinned_mib: u64, rss_mib: u64) -> Report {
        let mut r = job(100, 512);
        r.processes = vec![process(100, None, "python", rss_mib)];
        let mut k = kill(100, "python", 512);
        k.victim.rss.anon_kb = rss_mib << 10;
        r.kills = vec![k];
        r.gpu.processes = vec![gpu_proc(100, pinned_mib, true)];
        r.gpu.at_kills = vec![GpuAtKill {
            kill_ts_ns: 50_000_000_000,
            processes: vec![AtKill {
                pid: 100,
                comm: "python".into(),
                held: Held {
                    pinned: pinned_mib * MIB,
                    ..Held::default()
                },
                grew: [0; 3],
            }],
            ..GpuAtKill::default()
        }];
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut v = Vec::new();
        check(r, &mut v);
        v
    }

    #[test]
    fn most_of_the_limit_pinned_at_the_kill_fires() {
        let d = run(&report(300, 480));
        assert_eq!(d.len(), 1, "{d:#?}");
        let d = &d[0];
        assert_eq!((d.confidence, d.kill), (Confidence::High, Some(0)));
        assert_eq!(
            d.title,
            "Pinned host memory took a large share: 300 MiB page-locked at the kill (58% of the 512 MiB limit)"
        );
        assert!(
            d.evidence.iter().any(|e| e.contains("32 MiB registered")),
            "{d:#?}"
        );
        assert!(
            d.evidence
                .iter()
                .any(|e| e.contains("held 300 MiB pinned of its 480 MiB resident (62%)")),
            "{d:#?}"
        );
        assert!(d.fix.iter().any(|f| f.contains("prefetch_factor")));
        assert!(d.fix.iter().any(|f| f.contains("empty_cache")));
        assert_eq!(d.pids, vec![100]);
    }

    #[test]
    fn a_third_of_the_limit_is_medium() {
        let d = run(&report(150, 1000));
        assert_eq!(d[0].confidence, Confidence::Medium);
    }

    #[test]
    fn a_few_staging_buffers_do_not_fire() {
        // 40 MiB pinned of a 512 MiB limit and a 480 MiB victim: 7% and 8%.
        assert!(run(&report(40, 480)).is_empty());
        // No pinned memory at all.
        let mut r = report(0, 480);
        r.gpu.processes[0].pinned.peak = 0;
        assert!(run(&r).is_empty());
    }

    #[test]
    fn workers_pinning_their_own_memory_are_named_in_the_fix() {
        let mut r = report(300, 480);
        r.gpu.processes.push(gpu_proc(101, 64, false));
        r.gpu.at_kills[0].processes.push(AtKill {
            pid: 101,
            comm: "pt_worker".into(),
            held: Held {
                pinned: 64 * MIB,
                ..Held::default()
            },
            grew: [0; 3],
        });
        let d = run(&r);
        assert!(d[0].title.contains("364 MiB"), "{}", d[0].title);
        assert!(d[0].fix[0].starts_with("1 worker process(es) pinned"));
        assert_eq!(d[0].pids, vec![100, 101]);
    }

    #[test]
    fn without_a_kill_a_pinned_peak_over_half_the_limit_is_a_low_note() {
        let mut r = report(300, 480);
        r.kills.clear();
        r.gpu.at_kills.clear();
        let d = run(&r);
        assert_eq!((d[0].confidence, d[0].kill), (Confidence::Low, None));
        r.gpu.processes[0].pinned.peak = 100 * MIB;
        assert!(run(&r).is_empty());
    }
}
