//! `cuda_in_workers`: job processes other than the root (DataLoader
//! workers, most often) created CUDA contexts of their own.
//!
//! A context costs host memory in every process that makes one (the
//! driver's and the CUDA libraries' state: hundreds of MiB with the
//! kernels loaded), so N workers that touch CUDA pay it N more times. With
//! the default 'fork' start method a forked worker cannot even use its
//! parent's context; it happens when a Dataset's `__getitem__`,
//! `collate_fn` or `worker_init_fn` calls `.cuda()` or queries the device.

use super::{Confidence, Diagnosis};
use crate::model::{Kill, Report, gpu::GpuProcess};
use crate::units::{human_bytes, human_kb};

/// The workers' contexts' host memory, as a share of the limit, at which
/// the diagnosis explains a kill (medium), or leads it (high).
const KILL_MEDIUM_PCT: u64 = 15;
const KILL_HIGH_PCT: u64 = 40;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    let workers: Vec<&GpuProcess> = report
        .gpu
        .processes
        .iter()
        .filter(|p| p.worker_init && !p.contexts.is_empty())
        .collect();
    if workers.is_empty() {
        return;
    }
    let mut explained = false;
    for (i, k) in report.kills.iter().enumerate() {
        if !k.victim.in_job {
            continue;
        }
        if let Some(d) = at_kill(report, &workers, i, k) {
            out.push(d);
            explained = true;
        }
    }
    if !explained {
        out.push(over_run(report, &workers));
    }
}

/// Host memory that came with a process's contexts, where measured.
fn host_kb(p: &GpuProcess) -> Option<u64> {
    let v: Vec<u64> = p.contexts.iter().filter_map(|c| c.host_kb).collect();
    (!v.is_empty()).then(|| v.iter().sum())
}

/// Workers whose contexts existed at `ts` and that still lived then.
fn alive_at<'a>(workers: &[&'a GpuProcess], ts: u64) -> Vec<&'a GpuProcess> {
    workers
        .iter()
        .filter(|p| p.contexts.iter().any(|c| c.ts_ns <= ts))
        .filter(|p| p.exited_ns.is_none_or(|e| e >= ts))
        .copied()
        .collect()
}

fn at_kill(report: &Report, workers: &[&GpuProcess], i: usize, k: &Kill) -> Option<Diagnosis> {
    let alive = alive_at(workers, k.ts_ns);
    let measured: Vec<u64> = alive.iter().filter_map(|p| host_kb(p)).collect();
    let total_kb: u64 = measured.iter().sum();
    // A global OOM's domain is the machine's RAM.
    let ram = (k.constraint == crate::model::Constraint::None && report.header.mem_total_kb > 0)
        .then_some(report.header.mem_total_kb);
    let limit_kb = k
        .memcg_limit_kb
        .or_else(|| {
            report
                .job
                .as_ref()
                .and_then(|j| j.memory_limit_bytes)
                .map(|b| b >> 10)
        })
        .or(ram)?;
    let share = pct(total_kb, limit_kb);
    let of = if k.memcg_limit_kb.is_none() && ram == Some(limit_kb) {
        format!("{} of RAM", human_kb(limit_kb))
    } else {
        format!("the {} limit", human_kb(limit_kb))
    };
    let confidence = if share >= KILL_HIGH_PCT {
        Confidence::High
    } else if share >= KILL_MEDIUM_PCT {
        Confidence::Medium
    } else {
        return None;
    };
    let title = format!(
        "Worker processes created their own CUDA contexts: {} worker(s) paid {} of host memory for them ({share}% of {of})",
        alive.len(),
        human_kb(total_kb),
    );
    let mut evidence = vec![format!(
        "At the kill ({:.1} s, {} pid {} chosen) {} worker(s) held contexts whose host memory came to {} of {of}",
        report.since_start_s(k.ts_ns),
        k.victim.comm,
        k.victim.pid,
        alive.len(),
        human_kb(total_kb),
    )];
    evidence.extend(self::evidence(report, &alive));
    Some(Diagnosis {
        id: "cuda_in_workers",
        confidence,
        title,
        evidence,
        fix: fixes(),
        kill: Some(i),
        pids: alive.iter().map(|p| p.pid).collect(),
    })
}

/// No kill it explains: still a waste worth fixing, said once for the run.
fn over_run(report: &Report, workers: &[&GpuProcess]) -> Diagnosis {
    let total_kb: u64 = workers.iter().filter_map(|p| host_kb(p)).sum();
    let cost = if workers.iter().any(|p| host_kb(p).is_some()) {
        format!(", {} of host memory", human_kb(total_kb))
    } else {
        String::new()
    };
    let limit = report
        .job
        .as_ref()
        .and_then(|j| j.memory_limit_bytes)
        .map(|b| b >> 10);
    let confidence = match limit {
        Some(l) if pct(total_kb, l) >= KILL_MEDIUM_PCT => Confidence::Medium,
        _ => Confidence::Low,
    };
    Diagnosis {
        id: "cuda_in_workers",
        confidence,
        title: format!(
            "Worker processes created their own CUDA contexts: {} worker(s){cost}",
            workers.len()
        ),
        evidence: evidence(report, workers),
        fix: fixes(),
        kill: None,
        pids: workers.iter().map(|p| p.pid).collect(),
    }
}

fn evidence(report: &Report, workers: &[&GpuProcess]) -> Vec<String> {
    let mut v = Vec::new();
    for p in workers.iter().take(8) {
        let parent = p
            .parent
            .map(|pp| {
                let comm = report
                    .gpu
                    .processes
                    .iter()
                    .find(|g| g.pid == pp)
                    .map(|g| g.comm.as_str())
                    .or_else(|| {
                        report
                            .processes
                            .iter()
                            .find(|q| q.pid == pp)
                            .map(|q| q.comm.as_str())
                    });
                let root = report.job.as_ref().is_some_and(|j| j.pid == pp);
                format!(
                    "{}pid {pp}{}",
                    comm.map(|c| format!("{c} (")).unwrap_or_default(),
                    match (comm.is_some(), root) {
                        (true, true) => ", the job's root)",
                        (true, false) => ")",
                        (false, true) => " (the job's root)",
                        (false, false) => "",
                    }
                )
            })
            .unwrap_or_else(|| "the job".into());
        let ctx = &p.contexts[0];
        let cost = match host_kb(p) {
            Some(kb) => format!("host memory +{}", human_kb(kb)),
            None => "host memory not measured (no memory record before it)".into(),
        };
        let inherited = if p.parent_had_context {
            "; its parent already had a context (a forked child can't use it)"
        } else {
            ""
        };
        v.push(format!(
            "{} (pid {}), a child of {parent}: {} context(s), the first by {} at {:.1} s; {cost}{inherited}",
            p.comm,
            p.pid,
            p.contexts.len(),
            ctx.op.name(),
            report.since_start_s(ctx.ts_ns),
        ));
    }
    if workers.len() > 8 {
        v.push(format!("… and {} more worker(s)", workers.len() - 8));
    }
    let root: Vec<&GpuProcess> = report
        .gpu
        .processes
        .iter()
        .filter(|p| p.is_root && !p.contexts.is_empty())
        .collect();
    if root.is_empty() {
        v.push(
            "The job's root made no CUDA context: the workers touched CUDA on their own (in the Dataset, collate_fn or worker_init_fn)".into(),
        );
    }
    for r in root {
        if let Some(kb) = host_kb(r) {
            v.push(format!(
                "For comparison, the job's root {} (pid {}) paid {} for its own context",
                r.comm,
                r.pid,
                human_kb(kb)
            ));
        }
    }
    let device: u64 = workers.iter().map(|p| p.device.peak).sum();
    if device > 0 {
        v.push(format!(
            "The workers also allocated {} of device memory (peaks summed)",
            human_bytes(device)
        ));
    }
    v
}

fn fixes() -> Vec<String> {
    vec![
        "Keep CUDA out of the workers: no .cuda()/.to('cuda'), torch.cuda.* calls or CUDA tensors in Dataset.__getitem__, collate_fn or worker_init_fn; return CPU tensors and move the batch to the GPU in the main process (batch.to(device, non_blocking=True) with pin_memory=True)".into(),
        "If the workers really need CUDA, start them with the 'spawn' start method (DataLoader(multiprocessing_context='spawn')), and count one context's host memory per worker in the limit".into(),
        "A CUDA tensor captured by the Dataset (a lookup table moved to the GPU in __init__) also makes each worker initialise CUDA: keep such tables on the CPU".into(),
    ]
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
    use crate::decode::gpu::CudaOp;
    use crate::model::diagnosis::fixture::{job, kill, process};
    use crate::model::gpu::ContextInit;

    fn ctx(ts_s: u64, host_mib: Option<u64>) -> ContextInit {
        ContextInit {
            ts_ns: ts_s * 1_000_000_000,
            op: CudaOp::CtxCreate,
            device: Some(0),
            handle: 0xc000_1000,
            host_kb: host_mib.map(|m| m << 10),
        }
    }

    fn worker(pid: u32, host_mib: Option<u64>) -> GpuProcess {
        GpuProcess {
            pid,
            comm: "pt_data_worker".into(),
            parent: Some(100),
            worker_init: true,
            parent_had_context: true,
            contexts: vec![ctx(10, host_mib)],
            ..GpuProcess::default()
        }
    }

    /// A 512 MiB job whose root has a context, with `n` workers that made
    /// their own at 10 s, each costing `host_mib`; killed at 50 s.
    fn report(n: u32, host_mib: Option<u64>) -> Report {
        let mut r = job(100, 512);
        r.processes = vec![process(100, None, "python", 300)];
        r.kills = vec![kill(101, "pt_data_worker", 512)];
        r.gpu.processes = vec![GpuProcess {
            pid: 100,
            comm: "python".into(),
            is_root: true,
            contexts: vec![ctx(5, Some(90))],
            ..GpuProcess::default()
        }];
        for i in 0..n {
            r.processes
                .push(process(101 + i, Some(100), "pt_data_worker", 100));
            r.gpu.processes.push(worker(101 + i, host_mib));
        }
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut v = Vec::new();
        check(r, &mut v);
        v
    }

    #[test]
    fn workers_contexts_filling_the_limit_explain_the_kill() {
        let d = run(&report(3, Some(80)));
        assert_eq!(d.len(), 1, "{d:#?}");
        let d = &d[0];
        assert_eq!((d.confidence, d.kill), (Confidence::High, Some(0)));
        assert_eq!(
            d.title,
            "Worker processes created their own CUDA contexts: 3 worker(s) paid 240 MiB of host memory for them (46% of the 512 MiB limit)"
        );
        assert!(
            d.evidence[0].contains(
                "3 worker(s) held contexts whose host memory came to 240 MiB of the 512 MiB limit"
            ),
            "{d:#?}"
        );
        assert!(
            d.evidence[1].contains("a child of python (pid 100, the job's root)"),
            "{d:#?}"
        );
        assert!(d.evidence[1].contains("cuCtxCreate at 10.0 s; host memory +80 MiB"));
        assert!(d.evidence[1].contains("its parent already had a context"));
        assert!(
            d.evidence
                .iter()
                .any(|e| e.contains("root python (pid 100) paid 90 MiB"))
        );
        assert!(d.fix.iter().any(|f| f.contains("'spawn'")));
        assert!(d.fix[0].contains("__getitem__"));
        assert_eq!(d.pids, vec![101, 102, 103]);
    }

    #[test]
    fn one_small_context_is_a_note_on_the_run_not_the_kills_cause() {
        // 1 × 40 MiB of 512: 7%, below the kill's threshold.
        let d = run(&report(1, Some(40)));
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].confidence, d[0].kill), (Confidence::Low, None));
        // Unmeasured: said, not guessed.
        let d = run(&report(2, None));
        assert_eq!(d[0].kill, None);
        assert!(d[0].evidence[0].contains("not measured"), "{d:#?}");
    }

    #[test]
    fn a_root_with_a_context_and_workers_without_do_not_fire() {
        assert!(run(&report(0, None)).is_empty());
        // A worker that exited before the kill with its context does not
        // explain the kill.
        let mut r = report(3, Some(80));
        for p in r.gpu.processes.iter_mut().skip(1) {
            p.exited_ns = Some(20_000_000_000);
        }
        let d = run(&r);
        assert_eq!(d[0].kill, None, "{d:#?}");
    }

    /// A global OOM has no limit: the share is of the machine's RAM.
    #[test]
    fn at_a_global_oom_the_share_is_of_ram() {
        let mut r = report(3, Some(80));
        r.job.as_mut().unwrap().memory_limit_bytes = None;
        r.header.mem_total_kb = 512 << 10;
        r.kills[0].memcg_limit_kb = None;
        r.kills[0].constraint = crate::model::Constraint::None;
        let d = run(&r);
        assert_eq!(d[0].kill, Some(0));
        assert!(
            d[0].title.ends_with("(46% of 512 MiB of RAM)"),
            "{}",
            d[0].title
        );
    }
}
