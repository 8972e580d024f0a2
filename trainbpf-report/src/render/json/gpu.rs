//! The report's `gpu` object (docs/report-json.md, "gpu"): GPU and pinned
//! host memory per process from the CUDA driver's uprobes, CUDA OOMs, Xid
//! errors and NVML. Sizes here are bytes, as CUDA counts them; host RSS
//! stays in kB.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;
use crate::model::gpu::{self as model, Held};

use super::{Time, secs, secs_since};

/// GPU and pinned host memory. Everything is empty (and `lost_events` 0)
/// for a job that never called CUDA.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Gpu {
    /// One per entry of `kills`, same order: what the GPU side held and did
    /// before that host OOM kill.
    pub(crate) at_kills: Vec<AtKill>,
    /// Each `libcuda.so*` file tried.
    pub(crate) attach: Vec<GpuAttach>,
    /// Every allocation that failed with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub(crate) cuda_ooms: Vec<CudaOom>,
    /// Driver libraries a job process mapped after recording started: each
    /// held until its probes were on, or an uncovered window.
    pub(crate) late: Vec<super::gpu_late::GpuLate>,
    pub(crate) lost: GpuLost,
    /// GPU records dropped: ring-buffer losses of the GPU kinds, calls not
    /// recorded because the entry/return map was full, and the driver calls
    /// counted in uncovered windows (`lost.window_calls`). 0 means the
    /// ledger saw every call of every probed library.
    pub(crate) lost_events: u64,
    pub(crate) nvml: Nvml,
    /// Job processes that called the CUDA driver (or that NVML listed), by
    /// first call.
    pub(crate) processes: Vec<GpuProcess>,
    /// What each GPU data source was used for, or why not.
    pub(crate) sources: Vec<GpuSource>,
    /// GPU steps on the recording's clock, with the process's host RSS
    /// beside them.
    pub(crate) timeline: Vec<TimelineRow>,
    /// Small steps left out of `timeline`.
    pub(crate) timeline_dropped: usize,
    /// NVIDIA Xid errors seen anywhere on the machine.
    pub(crate) xid: Vec<Xid>,
}

impl Gpu {
    pub(crate) fn new(r: &Report) -> Gpu {
        let g = &r.gpu;
        let t = |ns: u64| secs_since(r, ns);
        Gpu {
            at_kills: g.at_kills.iter().map(|k| AtKill::new(r, k)).collect(),
            attach: g
                .attach
                .iter()
                .map(|a| GpuAttach {
                    attached: a.attached.len(),
                    error: a.error.clone(),
                    found_by: a.found_by.clone(),
                    missing: a.missing.clone(),
                    path: a.path.clone(),
                    pid: a.pid,
                })
                .collect(),
            cuda_ooms: g.cuda_ooms.iter().map(|o| CudaOom::new(r, o)).collect(),
            late: super::gpu_late::GpuLate::list(r),
            lost: GpuLost {
                attach_failed: g.lost.attach_failed,
                cuda: ring_lost(r, trainbpf_common::KIND_CUDA),
                cuda_map: ring_lost(r, trainbpf_common::KIND_CUDA_MAP),
                held: g.lost.held,
                held_ms: super::gpu_late::ms(g.lost.held_ns),
                hold_timeouts: g.lost.hold_timeouts,
                over_cap: g.lost.over_cap,
                tables_too_big: g.lost.tables_too_big,
                unreadable: g.lost.unreadable,
                window_calls: g.lost.window_calls,
                window_ms: super::gpu_late::ms(g.lost.window_ns),
                windows: g.lost.windows,
                nv_pages: ring_lost(r, trainbpf_common::KIND_NV_PAGES),
                pending_full: g.lost.pending_full,
                read_failed: g.lost.read_failed,
                xid: ring_lost(r, trainbpf_common::KIND_XID),
            },
            lost_events: model::lost_events(r),
            nvml: Nvml {
                devices: g
                    .nvml_devices
                    .iter()
                    .map(|d| NvmlDevice {
                        index: d.index,
                        last_used_bytes: d.last_used_bytes,
                        name: d.name.clone(),
                        peak_used_bytes: d.peak_used_bytes,
                        total_bytes: d.total_bytes,
                    })
                    .collect(),
                samples: g.nvml_samples,
            },
            processes: g.processes.iter().map(|p| GpuProcess::new(r, p)).collect(),
            sources: g
                .sources
                .iter()
                .map(|s| GpuSource {
                    detail: s.detail.clone(),
                    source: s.source.clone(),
                    used: s.used,
                })
                .collect(),
            timeline: g
                .timeline
                .iter()
                .map(|row| TimelineRow {
                    comm: row.comm.clone(),
                    device_bytes: row.held.device,
                    device_delta_bytes: row.delta[0],
                    host_rss_kb: row.host_rss_kb,
                    managed_bytes: row.held.managed,
                    managed_delta_bytes: row.delta[2],
                    peak: GpuHeld::new(&row.peak),
                    pid: row.pid,
                    pinned_bytes: row.held.pinned,
                    pinned_delta_bytes: row.delta[1],
                    requested_bytes: row.requested_bytes,
                    time_s: t(row.ts_ns),
                    what: row.what.clone(),
                })
                .collect(),
            timeline_dropped: g.timeline_dropped,
            xid: g
                .xid
                .iter()
                .map(|x| Xid {
                    code: x.code,
                    msg: x.msg.clone(),
                    name: x.name.clone(),
                    pci: x.pci.clone(),
                    pid: x.pid,
                    source: x.source.clone(),
                    time: Time::at(r, x.ts_ns),
                    time_s: t(x.ts_ns),
                })
                .collect(),
        }
    }
}

fn ring_lost(r: &Report, kind: u16) -> u64 {
    r.lost.by_kind.get(kind as usize).copied().unwrap_or(0)
}

/// What a process held, by kind.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuHeld {
    pub(crate) device_bytes: u64,
    pub(crate) managed_bytes: u64,
    pub(crate) pinned_bytes: u64,
}

impl GpuHeld {
    fn new(h: &Held) -> GpuHeld {
        GpuHeld {
            device_bytes: h.device,
            managed_bytes: h.managed,
            pinned_bytes: h.pinned,
        }
    }
}

/// An allocation that failed with `CUDA_ERROR_OUT_OF_MEMORY`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CudaOom {
    /// The driver call, e.g. `cuMemAlloc`.
    pub(crate) call: String,
    pub(crate) comm: String,
    /// The CUDA error (2).
    pub(crate) error: u32,
    /// What the process held then.
    pub(crate) held: GpuHeld,
    /// Every recorded process holding GPU-side memory then, most device
    /// memory first.
    pub(crate) holders: Vec<Holder>,
    /// NVML's device total from the last sample before it (all GPUs
    /// summed); null without one.
    pub(crate) nvml_total_bytes: Option<u64>,
    /// NVML's device use from the last sample before it (all GPUs summed);
    /// null without one.
    pub(crate) nvml_used_bytes: Option<u64>,
    pub(crate) pid: u32,
    pub(crate) requested_bytes: u64,
    pub(crate) tid: u32,
    pub(crate) time: Option<Time>,
    pub(crate) time_s: f64,
}

impl CudaOom {
    fn new(r: &Report, o: &model::CudaOom) -> CudaOom {
        CudaOom {
            call: o.op.name().to_string(),
            comm: o.comm.clone(),
            error: o.error,
            held: GpuHeld::new(&o.held),
            holders: o
                .holders
                .iter()
                .map(|h| Holder {
                    comm: h.comm.clone(),
                    device_bytes: h.held.device,
                    managed_bytes: h.held.managed,
                    pid: h.pid,
                    pinned_bytes: h.held.pinned,
                })
                .collect(),
            nvml_total_bytes: o.nvml_total_bytes,
            nvml_used_bytes: o.nvml_used_bytes,
            pid: o.pid,
            requested_bytes: o.requested_bytes,
            tid: o.tid,
            time: Time::at(r, o.ts_ns),
            time_s: secs_since(r, o.ts_ns),
        }
    }
}

/// A process holding GPU-side memory at a CUDA OOM.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Holder {
    pub(crate) comm: String,
    pub(crate) device_bytes: u64,
    pub(crate) managed_bytes: u64,
    pub(crate) pid: u32,
    pub(crate) pinned_bytes: u64,
}

/// An NVIDIA Xid error.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Xid {
    pub(crate) code: u32,
    /// The rest of the driver's message.
    pub(crate) msg: String,
    /// The process the message names; null for `<unknown>`.
    pub(crate) name: Option<String>,
    pub(crate) pci: String,
    /// The process the message names; null for `<unknown>`.
    pub(crate) pid: Option<u32>,
    /// `tracepoint`, `printk` or `tracepoint+printk`.
    pub(crate) source: String,
    pub(crate) time: Option<Time>,
    pub(crate) time_s: f64,
}

/// One row per process and second of changes, or per context, CUDA OOM or
/// exit holding memory. `*_bytes` are held after the row.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct TimelineRow {
    pub(crate) comm: String,
    pub(crate) device_bytes: u64,
    pub(crate) device_delta_bytes: i64,
    /// The process's resident host memory then (kB).
    pub(crate) host_rss_kb: Option<u64>,
    pub(crate) managed_bytes: u64,
    pub(crate) managed_delta_bytes: i64,
    /// The most held within the row.
    pub(crate) peak: GpuHeld,
    pub(crate) pid: u32,
    pub(crate) pinned_bytes: u64,
    pub(crate) pinned_delta_bytes: i64,
    pub(crate) requested_bytes: Option<u64>,
    pub(crate) time_s: f64,
    pub(crate) what: String,
}

/// What the GPU side held and did before a host OOM kill.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AtKill {
    /// The contexts created in the window.
    pub(crate) contexts: Vec<AtKillContext>,
    /// What each process held at the kill and how it grew over the window.
    pub(crate) processes: Vec<AtKillProcess>,
    pub(crate) time_s: f64,
    pub(crate) window_s: f64,
}

impl AtKill {
    fn new(r: &Report, k: &model::GpuAtKill) -> AtKill {
        AtKill {
            contexts: k
                .contexts
                .iter()
                .map(|(pid, comm, c)| AtKillContext {
                    comm: comm.clone(),
                    host_kb: c.host_kb,
                    pid: *pid,
                    time_s: secs_since(r, c.ts_ns),
                })
                .collect(),
            processes: k
                .processes
                .iter()
                .map(|p| AtKillProcess {
                    comm: p.comm.clone(),
                    device_bytes: p.held.device,
                    device_grew_bytes: p.grew[0],
                    managed_bytes: p.held.managed,
                    managed_grew_bytes: p.grew[2],
                    pid: p.pid,
                    pinned_bytes: p.held.pinned,
                    pinned_grew_bytes: p.grew[1],
                })
                .collect(),
            time_s: secs_since(r, k.kill_ts_ns),
            window_s: secs(k.window_ns),
        }
    }
}

/// A context created in the window before a kill.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AtKillContext {
    pub(crate) comm: String,
    pub(crate) host_kb: Option<u64>,
    pub(crate) pid: u32,
    pub(crate) time_s: f64,
}

/// A process at a kill.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AtKillProcess {
    pub(crate) comm: String,
    pub(crate) device_bytes: u64,
    pub(crate) device_grew_bytes: i64,
    pub(crate) managed_bytes: u64,
    pub(crate) managed_grew_bytes: i64,
    pub(crate) pid: u32,
    pub(crate) pinned_bytes: u64,
    pub(crate) pinned_grew_bytes: i64,
}

/// NVML's view; `samples` 0 when NVML could not be loaded.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Nvml {
    pub(crate) devices: Vec<NvmlDevice>,
    pub(crate) samples: u64,
}

/// One GPU as NVML saw it.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct NvmlDevice {
    pub index: u32,
    pub(crate) last_used_bytes: u64,
    pub name: String,
    pub(crate) peak_used_bytes: u64,
    pub total_bytes: u64,
}

/// A `libcuda.so*` file tried.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuAttach {
    /// Symbols probed.
    pub attached: usize,
    pub error: Option<String>,
    /// `env` (`TRAINBPF_LIBCUDA`), `ldconfig`, `dir`, or `maps` (seen in
    /// job process `pid`'s maps).
    pub found_by: String,
    /// Symbols the file does not export.
    pub missing: Vec<String>,
    pub path: String,
    pub pid: Option<u32>,
}

/// A GPU data source, used or not.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuSource {
    pub detail: String,
    pub source: String,
    pub used: bool,
}

/// GPU records lost.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuLost {
    /// Library files not probed.
    pub attach_failed: u64,
    /// Ring-buffer losses of CUDA records.
    pub(crate) cuda: u64,
    /// Ring-buffer losses of late driver mappings (each leaves a window
    /// the maps scan closes).
    pub(crate) cuda_map: u64,
    /// Processes held at a late driver mapping until probed (not lost: a
    /// pause), and for how long in all.
    pub held: u64,
    pub(crate) held_ms: f64,
    /// Holds that ran past their limit and that the hold's watchdog
    /// ended before the probes were on: each left a window (`windows`).
    pub hold_timeouts: u64,
    /// Ring-buffer losses of `nv_alloc_pages` records.
    pub(crate) nv_pages: u64,
    /// Driver library mappings not probed because the run had already
    /// tried as many library files found through the job as it probes.
    pub over_cap: u64,
    /// Calls not recorded because the entry/return map was full.
    pub pending_full: u64,
    /// Successful calls whose returned pointer could not be read.
    pub read_failed: u64,
    /// Library files not read because their symbol tables claim more than
    /// the recorder reads from one, or lie outside the file.
    pub tables_too_big: u64,
    /// Driver library mappings not probed because the job could not read
    /// the file: the descriptor mapped was not open for reading (`O_PATH`,
    /// write-only), or the job's user may not open the file.
    pub unreadable: u64,
    /// NVIDIA driver calls counted in the uncovered windows: in
    /// `lost_events`.
    pub window_calls: u64,
    /// The uncovered windows' total length.
    pub(crate) window_ms: f64,
    /// Late driver mappings whose process could not be held.
    pub windows: u64,
    /// Ring-buffer losses of Xid records.
    pub(crate) xid: u64,
}

/// A job process that called the CUDA driver.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuProcess {
    /// Recorded calls.
    pub(crate) calls: u64,
    pub(crate) comm: String,
    pub(crate) context_list: Vec<GpuContext>,
    /// CUDA contexts it created.
    pub(crate) contexts: usize,
    /// When it first called `cuInit`.
    pub(crate) cuda_init_s: Option<f64>,
    pub(crate) device: KindStats,
    pub(crate) device_bytes_end: u64,
    pub(crate) device_bytes_peak: u64,
    pub(crate) exited_s: Option<f64>,
    /// Recorded calls that returned an error.
    pub(crate) failed_calls: u64,
    /// Its peak resident host memory while it used CUDA (kB).
    pub(crate) host_rss_peak_kb: u64,
    /// The job's root process.
    pub(crate) is_root: bool,
    pub(crate) managed: KindStats,
    pub(crate) managed_bytes_end: u64,
    pub(crate) managed_bytes_peak: u64,
    /// Pages the NVIDIA driver allocated for the process, where that probe
    /// ran.
    pub(crate) nv_pages: NvPages,
    /// NVML's per-process figure against the ledger's; null when NVML never
    /// listed the process.
    pub(crate) nvml: Option<NvmlCompare>,
    /// The kernel's OOM killer chose it.
    pub(crate) oom_killed: bool,
    /// Its parent's pid, when the fork was recorded.
    pub(crate) parent: Option<u32>,
    /// Its parent already had a context when it made its own.
    pub(crate) parent_had_context: bool,
    pub(crate) pid: u32,
    pub(crate) pinned: KindStats,
    pub(crate) pinned_bytes_end: u64,
    pub(crate) pinned_bytes_peak: u64,
    /// The part of pinned memory that was registered.
    pub(crate) registered_bytes_peak: u64,
    /// Where its CUDA allocations were asked for (`record --stacks`),
    /// heaviest first; empty without stacks.
    pub(crate) stacks: Vec<super::stacks::GpuStack>,
    /// Frees of pointers the ledger never saw allocated.
    pub(crate) unknown_frees: u64,
    /// A job process other than the root that initialised CUDA.
    pub(crate) worker_init: bool,
}

impl GpuProcess {
    fn new(r: &Report, p: &model::GpuProcess) -> GpuProcess {
        GpuProcess {
            calls: p.calls,
            comm: p.comm.clone(),
            context_list: p
                .contexts
                .iter()
                .map(|c| GpuContext {
                    call: c.op.name().to_string(),
                    device: c.device,
                    host_kb: c.host_kb,
                    time_s: secs_since(r, c.ts_ns),
                })
                .collect(),
            contexts: p.contexts.len(),
            cuda_init_s: p.cuda_init_ns.map(|t| secs_since(r, t)),
            device: KindStats::new(&p.device),
            device_bytes_end: p.device.end,
            device_bytes_peak: p.device.peak,
            exited_s: p.exited_ns.map(|t| secs_since(r, t)),
            failed_calls: p.failed_calls,
            host_rss_peak_kb: p.host_rss_peak_kb,
            is_root: p.is_root,
            managed: KindStats::new(&p.managed),
            managed_bytes_end: p.managed.end,
            managed_bytes_peak: p.managed.peak,
            nv_pages: NvPages {
                alloc: p.nv_pages_alloc,
                free: p.nv_pages_free,
            },
            nvml: p.nvml.map(|n| NvmlCompare {
                difference_bytes: n.difference(),
                last_bytes: n.last_nvml_bytes,
                ledger_bytes: n.last_ledger_bytes,
                peak_bytes: n.peak_nvml_bytes,
                samples: n.samples,
            }),
            oom_killed: p.oom_killed,
            parent: p.parent,
            parent_had_context: p.parent_had_context,
            pid: p.pid,
            pinned: KindStats::new(&p.pinned),
            pinned_bytes_end: p.pinned.end,
            pinned_bytes_peak: p.pinned.peak,
            registered_bytes_peak: p.registered_peak,
            stacks: super::stacks::gpu_stacks(&p.stacks),
            unknown_frees: p.unknown_frees,
            worker_init: p.worker_init,
        }
    }
}

/// A CUDA context a process created.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuContext {
    pub(crate) call: String,
    pub(crate) device: Option<i32>,
    /// The host resident memory gained from the process's `cuInit` to the
    /// context call's return (kB); null without a record before.
    pub(crate) host_kb: Option<u64>,
    pub(crate) time_s: f64,
}

/// One kind of GPU-side memory, over a process's life.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct KindStats {
    pub(crate) allocated_bytes: u64,
    pub(crate) allocs: u64,
    pub(crate) end_bytes: u64,
    pub(crate) failed: u64,
    pub(crate) freed_at_exit_bytes: u64,
    pub(crate) freed_bytes: u64,
    pub(crate) frees: u64,
    pub(crate) peak_bytes: u64,
}

impl KindStats {
    fn new(s: &model::KindStats) -> KindStats {
        KindStats {
            allocated_bytes: s.allocated,
            allocs: s.allocs,
            end_bytes: s.end,
            failed: s.failed,
            freed_at_exit_bytes: s.freed_at_exit,
            freed_bytes: s.freed,
            frees: s.frees,
            peak_bytes: s.peak,
        }
    }
}

/// NVML's per-process figure at its last sample against the ledger's
/// device bytes at the same instant.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct NvmlCompare {
    /// NVML minus the ledger: context and driver overhead, or allocations
    /// the probes missed.
    pub(crate) difference_bytes: i64,
    pub(crate) last_bytes: u64,
    pub(crate) ledger_bytes: u64,
    pub(crate) peak_bytes: u64,
    pub(crate) samples: u64,
}

/// Pages the NVIDIA driver allocated and freed for the process.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct NvPages {
    pub(crate) alloc: u64,
    pub(crate) free: u64,
}

#[cfg(test)]
pub(super) mod tests {
    use crate::decode::gpu::CudaOp;
    use crate::model::gpu::{
        AtKill, ContextInit, CudaOom, GpuAtKill, GpuProcess, Held, Holder, NvmlCompare,
        NvmlDeviceSummary, TimelineRow, Xid,
    };
    use crate::render::fixture::sample_report;
    use crate::render::json::{render, schema};

    /// A report with one of everything the GPU side can hold.
    pub(crate) fn gpu_report() -> crate::model::Report {
        let mut r = sample_report();
        let held = Held {
            device: 3 << 30,
            pinned: 1 << 20,
            managed: 0,
        };
        let ctx = ContextInit {
            ts_ns: 2_000_000_000,
            op: CudaOp::PrimaryCtxRetain,
            device: Some(0),
            handle: 1,
            host_kb: Some(300_000),
        };
        let g = &mut r.gpu;
        g.processes.push(GpuProcess {
            pid: 812,
            comm: "pt_data_worker".into(),
            parent: Some(700),
            contexts: vec![ctx.clone()],
            cuda_init_ns: Some(1_000_000_000),
            nvml: Some(NvmlCompare {
                samples: 3,
                last_nvml_bytes: 1 << 30,
                last_ledger_bytes: 2 << 30,
                peak_nvml_bytes: 1 << 30,
            }),
            ..Default::default()
        });
        g.cuda_ooms.push(CudaOom {
            ts_ns: 3_000_000_000,
            pid: 812,
            start_ns: 5,
            tid: 813,
            comm: "pt_data_worker".into(),
            op: CudaOp::MemAlloc,
            requested_bytes: 1 << 30,
            error: 2,
            held,
            holders: vec![Holder {
                pid: 812,
                comm: "pt_data_worker".into(),
                held,
            }],
            nvml_used_bytes: None,
            nvml_total_bytes: Some(80 << 30),
        });
        g.xid.push(Xid {
            ts_ns: 4_000_000_000,
            code: 79,
            pci: "0000:3b:00".into(),
            pid: None,
            name: None,
            msg: "GPU has fallen off the bus.".into(),
            source: "printk".into(),
        });
        g.timeline.push(TimelineRow {
            ts_ns: 3_000_000_000,
            pid: 812,
            comm: "pt_data_worker".into(),
            what: "CUDA OOM".into(),
            delta: [-(1 << 20), 0, 0],
            held,
            peak: held,
            requested_bytes: Some(1 << 30),
            host_rss_kb: None,
            notable: true,
        });
        g.at_kills.push(GpuAtKill {
            kill_ts_ns: 20_500_000_000,
            window_ns: 60_000_000_000,
            processes: vec![AtKill {
                pid: 812,
                comm: "pt_data_worker".into(),
                held,
                grew: [1 << 30, -5, 0],
            }],
            contexts: vec![(812, "pt_data_worker".into(), ctx)],
        });
        g.nvml_samples = 3;
        g.nvml_devices.push(NvmlDeviceSummary {
            name: "H100".into(),
            ..Default::default()
        });
        g.attach.push(Default::default());
        g.sources.push(Default::default());
        r
    }

    #[test]
    fn gpu_sections_match_the_schema() {
        let v = render(&gpu_report());
        let schema = schema().to_value();
        let validator = jsonschema::draft202012::new(&schema).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{errors:#?}");
        let g = &v["gpu"];
        assert_eq!(g["cuda_ooms"][0]["call"], "cuMemAlloc");
        assert_eq!(g["cuda_ooms"][0]["holders"][0]["device_bytes"], 3u64 << 30);
        assert_eq!(g["timeline"][0]["device_delta_bytes"], -(1 << 20));
        assert_eq!(g["timeline"][0]["peak"]["pinned_bytes"], 1 << 20);
        assert_eq!(g["at_kills"][0]["processes"][0]["pinned_grew_bytes"], -5);
        assert_eq!(g["processes"][0]["contexts"], 1);
        assert_eq!(g["processes"][0]["nvml"]["difference_bytes"], -(1i64 << 30));
        assert_eq!(g["processes"][0]["context_list"][0]["time_s"], 1.5);
        assert!(g["xid"][0]["pid"].is_null());
    }
}
