//! `gpu_oom`: the GPU ran out of memory (a CUDA allocation failed with
//! `CUDA_ERROR_OUT_OF_MEMORY`), which is not a host OOM kill.
//!
//! The two are often confused: both read "out of memory", and a job that
//! dies of either shows a non-zero exit. A CUDA OOM is an error the
//! framework raises (`torch.OutOfMemoryError`) and the process exits with
//! a traceback; the host's OOM killer sends SIGKILL and leaves none. The
//! fixes are different, so this rule keeps them apart: it says which one
//! the job died of, and the device's figures, never the host's.

use super::{Confidence, Diagnosis};
use crate::model::{ExitStatus, Report, gpu::CudaOom};
use crate::units::human_bytes;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    let ooms = &report.gpu.cuda_ooms;
    let Some(last) = ooms.last() else {
        return;
    };
    let host_kill = report.kills.iter().any(|k| k.victim.in_job);
    let failed = job_failed(report) || process_failed(report, last);
    let (confidence, title) = match (failed, host_kill) {
        (true, false) => (
            Confidence::High,
            format!(
                "The job died of CUDA out-of-memory (GPU memory), not a host OOM kill: {} of {} failed{}",
                last.op.name(),
                human_bytes(last.requested_bytes),
                holding(last)
            ),
        ),
        (_, true) => (
            Confidence::Medium,
            format!(
                "Also a CUDA out-of-memory (GPU memory), apart from the host kill: {} of {} failed{}",
                last.op.name(),
                human_bytes(last.requested_bytes),
                holding(last)
            ),
        ),
        (false, false) => (
            Confidence::Low,
            format!(
                "CUDA out-of-memory errors were caught and the job went on: {} failed allocation(s), the last of {}",
                ooms.len(),
                human_bytes(last.requested_bytes)
            ),
        ),
    };
    let mut pids: Vec<u32> = Vec::new();
    for o in ooms {
        if !pids.contains(&o.pid) {
            pids.push(o.pid);
        }
    }
    out.push(Diagnosis {
        id: "gpu_oom",
        confidence,
        title,
        evidence: evidence(report, ooms, host_kill),
        fix: fixes(last),
        kill: None,
        pids,
    });
}

/// ", holding 224 MiB on the device (80 GiB GPU)".
fn holding(o: &CudaOom) -> String {
    let gpu = o
        .nvml_total_bytes
        .map(|t| format!(" on the {} GPU", human_bytes(t)))
        .unwrap_or_default();
    format!(" with {} already held{gpu}", human_bytes(o.held.device))
}

fn job_failed(report: &Report) -> bool {
    report
        .job
        .as_ref()
        .and_then(|j| j.exit)
        .is_some_and(|e| !matches!(e, ExitStatus::Code(0)))
}

/// The process that ran out ended with an error or a crash.
fn process_failed(report: &Report, o: &CudaOom) -> bool {
    report.deaths.iter().any(|d| {
        d.pid == o.pid
            && d.ts_ns >= o.ts_ns
            && (d.code.is_some_and(|c| c != 0) || d.cause == crate::model::Cause::Crash)
    })
}

fn evidence(report: &Report, ooms: &[CudaOom], host_kill: bool) -> Vec<String> {
    let mut v = Vec::new();
    for o in ooms.iter().rev().take(3).rev() {
        v.push(format!(
            "At {:.1} s {} (pid {}) asked {} for {} and got CUDA_ERROR_OUT_OF_MEMORY ({}), holding {} of device memory",
            report.since_start_s(o.ts_ns),
            o.comm,
            o.pid,
            o.op.name(),
            human_bytes(o.requested_bytes),
            o.error,
            human_bytes(o.held.device),
        ));
        if let (Some(used), Some(total)) = (o.nvml_used_bytes, o.nvml_total_bytes) {
            v.push(format!(
                "  NVML just before: {} of {} in use on the GPU(s), {} free",
                human_bytes(used),
                human_bytes(total),
                human_bytes(total.saturating_sub(used))
            ));
        }
        let others: Vec<String> = o
            .holders
            .iter()
            .filter(|h| h.pid != o.pid)
            .take(3)
            .map(|h| format!("{} (pid {}) {}", h.comm, h.pid, human_bytes(h.held.device)))
            .collect();
        if !others.is_empty() {
            v.push(format!(
                "  Other processes holding device memory then: {}",
                others.join(", ")
            ));
        }
    }
    if ooms.len() > 3 {
        v.push(format!("{} failed CUDA allocations in all", ooms.len()));
    }
    for p in report
        .gpu
        .processes
        .iter()
        .filter(|p| ooms.iter().any(|o| o.pid == p.pid))
    {
        v.push(format!(
            "{} (pid {}): device memory peak {}, {} allocation(s), {} failed",
            p.comm,
            p.pid,
            human_bytes(p.device.peak),
            p.device.allocs,
            p.device.failed
        ));
    }
    if let Some(d) = report
        .gpu
        .nvml_devices
        .iter()
        .max_by_key(|d| d.peak_used_bytes)
    {
        v.push(format!(
            "GPU {} ({}): {} total, peak {} used (NVML)",
            d.index,
            d.name,
            human_bytes(d.total_bytes),
            human_bytes(d.peak_used_bytes)
        ));
    }
    match (report.job.as_ref().and_then(|j| j.exit), host_kill) {
        (_, true) => v.push(
            "The host's OOM killer also killed a job process: that kill is host memory (RAM or the cgroup's limit), a separate cause with its own diagnosis".into(),
        ),
        (Some(ExitStatus::Code(c)), false) => v.push(format!(
            "No host OOM kill: the job exited with code {c}, as a framework does after an out-of-memory error"
        )),
        (Some(ExitStatus::Signal(s)), false) => v.push(format!(
            "No host OOM kill: the job ended by signal {s}"
        )),
        (None, false) => v.push("No host OOM kill in this recording".into()),
    }
    v
}

fn fixes(o: &CudaOom) -> Vec<String> {
    let mut v = Vec::new();
    // NVML says there was room for the request: the memory was there but
    // not in one piece (the caching allocator's fragmentation), or held by
    // the allocator's cache rather than in use.
    let fragmented = matches!(
        (o.nvml_used_bytes, o.nvml_total_bytes),
        (Some(used), Some(total)) if total.saturating_sub(used) >= o.requested_bytes
    );
    let expandable = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets PyTorch's caching allocator grow segments instead of needing a new contiguous block: it cures out-of-memory errors from fragmentation (reserved but unallocated memory in torch.cuda.memory_summary())";
    if fragmented {
        v.push(format!(
            "The GPU had {} free by NVML, more than the request: fragmentation. {expandable}",
            human_bytes(o.nvml_total_bytes.unwrap_or(0) - o.nvml_used_bytes.unwrap_or(0))
        ));
    }
    v.extend([
        "Make one step smaller: a smaller batch (with gradient accumulation to keep the effective batch size), shorter sequences, or mixed precision (torch.autocast, bf16)".to_string(),
        "Trade compute for memory: gradient (activation) checkpointing (torch.utils.checkpoint), and evaluation under torch.no_grad() / torch.inference_mode()".to_string(),
    ]);
    if !fragmented {
        v.push(expandable.to_string());
    }
    v.push("Look at what holds the memory: torch.cuda.memory_summary() at the error, or torch.cuda.memory._record_memory_history() and the snapshot viewer; other processes on the same GPU count too (nvidia-smi)".into());
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::gpu::CudaOp;
    use crate::model::diagnosis::fixture::{job, kill, process};
    use crate::model::gpu::{GpuProcess, Held, Holder};

    const MIB: u64 = 1 << 20;

    fn oom(requested: u64, used: Option<u64>) -> CudaOom {
        CudaOom {
            ts_ns: 40_000_000_000,
            pid: 100,
            start_ns: 100,
            tid: 100,
            comm: "python".into(),
            op: CudaOp::MemAlloc,
            requested_bytes: requested,
            error: 2,
            held: Held {
                device: 224 * MIB,
                ..Held::default()
            },
            holders: vec![
                Holder {
                    pid: 100,
                    comm: "python".into(),
                    held: Held {
                        device: 224 * MIB,
                        ..Held::default()
                    },
                },
                Holder {
                    pid: 300,
                    comm: "other".into(),
                    held: Held {
                        device: 64 * MIB,
                        ..Held::default()
                    },
                },
            ],
            nvml_used_bytes: used,
            nvml_total_bytes: used.map(|_| 80 << 30),
        }
    }

    /// A job that hit a CUDA OOM and exited with `code`.
    fn report(code: i32, o: CudaOom) -> Report {
        let mut r = job(100, 512);
        r.processes = vec![process(100, None, "python", 300)];
        r.job.as_mut().unwrap().exit = Some(ExitStatus::Code(code));
        let mut p = GpuProcess {
            pid: 100,
            comm: "python".into(),
            is_root: true,
            ..GpuProcess::default()
        };
        p.device.peak = 224 * MIB;
        p.device.allocs = 3;
        p.device.failed = 1;
        r.gpu.processes = vec![p];
        r.gpu.cuda_ooms = vec![o];
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut v = Vec::new();
        check(r, &mut v);
        v
    }

    #[test]
    fn a_job_that_failed_after_a_cuda_oom_died_of_it() {
        let d = run(&report(1, oom(1 << 40, None)));
        assert_eq!(d.len(), 1);
        let d = &d[0];
        assert_eq!((d.confidence, d.kill), (Confidence::High, None));
        assert_eq!(
            d.title,
            "The job died of CUDA out-of-memory (GPU memory), not a host OOM kill: cuMemAlloc of 1 TiB failed with 224 MiB already held"
        );
        assert!(
            d.evidence
                .iter()
                .any(|e| e.contains("other (pid 300) 64 MiB"))
        );
        assert!(
            d.evidence
                .iter()
                .any(|e| e.contains("device memory peak 224 MiB, 3 allocation(s), 1 failed"))
        );
        assert!(d.evidence.iter().any(|e| e.contains("exited with code 1")));
        assert!(d.fix[0].contains("smaller batch"), "{:?}", d.fix);
        assert!(d.fix.iter().any(|f| f.contains("expandable_segments:True")));
        assert_eq!(d.pids, vec![100]);
    }

    #[test]
    fn free_memory_on_the_gpu_names_fragmentation_first() {
        // 2 GiB asked, 70 of 80 GiB in use: 10 GiB free by NVML.
        let d = run(&report(1, oom(2 << 30, Some(70 << 30))));
        assert!(
            d[0].title
                .ends_with("224 MiB already held on the 80 GiB GPU"),
            "{}",
            d[0].title
        );
        assert!(
            d[0].fix[0].starts_with("The GPU had 10 GiB free"),
            "{:?}",
            d[0].fix
        );
    }

    #[test]
    fn a_host_kill_is_kept_apart_and_a_caught_oom_is_only_a_note() {
        let mut r = report(137, oom(1 << 40, None));
        r.kills = vec![kill(100, "python", 512)];
        let d = run(&r);
        assert_eq!(d[0].confidence, Confidence::Medium);
        assert!(d[0].title.starts_with("Also a CUDA out-of-memory"));
        assert!(d[0].evidence.iter().any(|e| e.contains("separate cause")));
        let d = run(&report(0, oom(1 << 40, None)));
        assert_eq!(d[0].confidence, Confidence::Low);
        assert!(
            d[0].title
                .starts_with("CUDA out-of-memory errors were caught")
        );
    }

    #[test]
    fn no_failed_cuda_allocation_no_diagnosis() {
        let mut r = report(1, oom(1 << 40, None));
        r.gpu.cuda_ooms.clear();
        assert!(run(&r).is_empty());
    }
}
