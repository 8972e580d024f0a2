//! The GPU ledger (pure): CUDA calls, NVML samples and Xid errors in, per
//! process GPU and pinned-host memory out, on the same clock as the host
//! memory records.
//!
//! Per process and kind (device, pinned host, managed) it keeps what is
//! allocated now, the peak, and the totals allocated and freed:
//! - device: `cuMemAlloc`, `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`
//!   (freed by `cuMemFree`/`cuMemFreeAsync`: counted at the call, in stream
//!   order the memory returns a little later), and `cuMemCreate` on a device;
//! - pinned: `cuMemAllocHost`, `cuMemHostAlloc`, `cuMemHostRegister` (memory
//!   the process already had, now page-locked; shown apart as `registered`),
//!   and `cuMemCreate` on a host location;
//! - managed: `cuMemAllocManaged`, which migrates between host and device.
//!
//! `cuMemCreate` allocates physical memory and `cuMemRelease` drops the
//! handle, but the memory stays until every `cuMemMap` of it is unmapped:
//! the ledger frees it at the later of the two, as the driver does.
//! A process that exits holding memory has it freed with it, and the report
//! says how much.
//!
//! Records from different CPUs can reach the file slightly out of order, and
//! a pointer freed on one thread can be handed out again on another at once:
//! events are replayed in time order through a short reorder buffer.
//!
//! The ledger streams (`ledger`); per process it keeps what it holds and its
//! change points (`state`); CUDA calls (`cuda`) and Xid errors (`xid`) are
//! applied in their own modules; the text timeline and the view at each
//! host OOM kill are drawn from the change points at the end (`timeline`).

mod cuda;
mod ledger;
mod state;
mod timeline;
mod xid;

pub use ledger::Ledger;

use crate::decode::gpu::{CudaOp, GpuAttach, GpuLate, GpuLost, GpuSource};

const SEC: u64 = 1_000_000_000;
/// How long events wait to be replayed in time order.
const REORDER_NS: u64 = SEC;
/// Change points kept per process for the timeline; beyond this every other
/// point is dropped (peaks and totals stay exact: they are counted, not
/// derived from the points).
const MAX_HISTORY: usize = 16_384;
/// Host RSS samples kept per job process, thinned the same way.
const MAX_RSS: usize = 4096;
/// Rows of the text timeline.
pub(crate) const MAX_TIMELINE: usize = 60;
const MAX_LIST: usize = 1000;
/// A driver of 575+ reports an Xid both on its tracepoint and in the log.
const XID_MERGE_NS: u64 = 2 * SEC;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MemKind {
    Device,
    Pinned,
    Managed,
}

/// One kind of memory of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KindStats {
    /// Held when the recording (or the process) ended, before the exit
    /// freed it.
    pub(crate) end: u64,
    pub(crate) peak: u64,
    pub(crate) allocated: u64,
    pub(crate) freed: u64,
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    /// Still held when the process exited, and freed with it.
    pub(crate) freed_at_exit: u64,
    /// Allocations that failed.
    pub(crate) failed: u64,
}

/// A CUDA context the process created, and the host memory that came with
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ContextInit {
    pub(crate) ts_ns: u64,
    pub(crate) op: CudaOp,
    pub(crate) device: Option<i32>,
    pub(crate) handle: u64,
    /// Host resident memory gained from the process's `cuInit` (for its
    /// first context) or the call's entry, to its return; `None` without a
    /// memory record before. As exact as the memory records' threshold
    /// (`--rss-threshold`): a record is sent when memory moved by it.
    pub(crate) host_kb: Option<u64>,
}

/// NVML's per-process figure against the ledger's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NvmlCompare {
    pub(crate) samples: u64,
    pub(crate) last_nvml_bytes: u64,
    /// The ledger's device bytes at the same instant.
    pub(crate) last_ledger_bytes: u64,
    pub(crate) peak_nvml_bytes: u64,
}

impl NvmlCompare {
    /// What NVML saw beyond the probes: context and driver overhead, or
    /// allocations the probes missed.
    pub(crate) fn difference(&self) -> i64 {
        self.last_nvml_bytes as i64 - self.last_ledger_bytes as i64
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct GpuProcess {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    pub(crate) parent: Option<u32>,
    pub(crate) is_root: bool,
    pub(crate) device: KindStats,
    pub(crate) pinned: KindStats,
    pub(crate) managed: KindStats,
    /// The part of pinned memory that was registered (`cuMemHostRegister`):
    /// already the process's own memory, now page-locked.
    pub(crate) registered_peak: u64,
    pub(crate) cuda_init_ns: Option<u64>,
    pub(crate) contexts: Vec<ContextInit>,
    /// A job process other than the root that initialised CUDA (a DataLoader
    /// worker that touched CUDA pays for a context of its own).
    pub(crate) worker_init: bool,
    /// Its parent had a CUDA context before it made one.
    pub(crate) parent_had_context: bool,
    pub(crate) exited_ns: Option<u64>,
    /// The kernel's OOM killer chose it.
    pub(crate) oom_killed: bool,
    pub(crate) calls: u64,
    pub(crate) failed_calls: u64,
    /// Frees of pointers the ledger never saw allocated (allocated before the
    /// probes attached, or a lost record).
    pub(crate) unknown_frees: u64,
    pub(crate) host_rss_peak_kb: u64,
    pub(crate) nvml: Option<NvmlCompare>,
    /// `nv_alloc_pages`/`nv_free_pages` page counts, where those probes ran.
    pub(crate) nv_pages_alloc: u64,
    pub(crate) nv_pages_free: u64,
    /// Where its CUDA allocations were asked for (`record --stacks`),
    /// heaviest first: per stack at the call, the bytes successful
    /// allocations through it were given and how many (frees not
    /// subtracted).
    pub(crate) stacks: Vec<crate::model::GrowthStack>,
}

/// What one process held at an instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub device: u64,
    pub pinned: u64,
    pub(crate) managed: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) held: Held,
}

/// A failed CUDA allocation with `CUDA_ERROR_OUT_OF_MEMORY`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CudaOom {
    pub(crate) ts_ns: u64,
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) tid: u32,
    pub(crate) comm: String,
    pub(crate) op: CudaOp,
    pub(crate) requested_bytes: u64,
    pub(crate) error: u32,
    /// What the asking process held then.
    pub(crate) held: Held,
    /// Every recorded process holding device memory then, most first.
    pub(crate) holders: Vec<Holder>,
    /// The device memory NVML reported last before it (all GPUs summed).
    pub(crate) nvml_used_bytes: Option<u64>,
    pub(crate) nvml_total_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Xid {
    pub(crate) ts_ns: u64,
    pub(crate) code: u32,
    pub(crate) pci: String,
    /// The process the message names; `None` for `<unknown>`.
    pub(crate) pid: Option<u32>,
    pub(crate) name: Option<String>,
    pub(crate) msg: String,
    /// "tracepoint", "printk", or "tracepoint+printk".
    pub(crate) source: String,
}

/// One line of the GPU timeline: a process's memory moved within a second,
/// or something happened (context, OOM, exit holding memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TimelineRow {
    pub(crate) ts_ns: u64,
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) what: String,
    pub(crate) delta: [i64; 3],
    /// After the row: device, pinned, managed.
    pub(crate) held: Held,
    /// The most of each kind held within the row's span.
    pub(crate) peak: Held,
    /// A failed allocation's request.
    pub(crate) requested_bytes: Option<u64>,
    pub(crate) host_rss_kb: Option<u64>,
    /// Contexts, OOMs and exits are always kept; steps may be dropped.
    pub(crate) notable: bool,
}

/// GPU memory around one host OOM kill.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GpuAtKill {
    pub(crate) kill_ts_ns: u64,
    pub(crate) window_ns: u64,
    pub(crate) processes: Vec<AtKill>,
    /// Contexts created in the window before the kill.
    pub(crate) contexts: Vec<(u32, String, ContextInit)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AtKill {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) held: Held,
    /// Change over the window before the kill.
    pub(crate) grew: [i64; 3],
}

/// For the HTML and Perfetto renderers: per process, every change point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GpuSeries {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    /// (time, device, pinned, managed) after each change.
    pub(crate) points: Vec<(u64, Held)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NvmlDeviceSummary {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) total_bytes: u64,
    pub(crate) last_used_bytes: u64,
    pub(crate) peak_used_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct GpuReport {
    /// Job processes that called CUDA (or that NVML saw), by first call.
    pub(crate) processes: Vec<GpuProcess>,
    pub(crate) cuda_ooms: Vec<CudaOom>,
    pub(crate) xid: Vec<Xid>,
    pub(crate) timeline: Vec<TimelineRow>,
    /// Steps left out of `timeline` to keep it short.
    pub(crate) timeline_dropped: usize,
    /// One per host OOM kill, in the kills' order.
    pub(crate) at_kills: Vec<GpuAtKill>,
    pub(crate) series: Vec<GpuSeries>,
    pub(crate) attach: Vec<GpuAttach>,
    /// Driver libraries mapped after recording started: each held until
    /// probed, or an uncovered window.
    pub(crate) late: Vec<GpuLate>,
    pub(crate) sources: Vec<GpuSource>,
    pub(crate) nvml_samples: u64,
    pub(crate) nvml_devices: Vec<NvmlDeviceSummary>,
    pub(crate) lost: GpuLost,
}

impl GpuReport {
    /// Whether there is anything GPU-related to show.
    pub(crate) fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.xid.is_empty()
            && self.attach.is_empty()
            && self.late.is_empty()
            && self.nvml_samples == 0
    }
}

/// GPU records lost in the ring buffer (kernel kinds 20-29), calls the
/// entry/return map had no room for, and the driver calls counted in
/// windows where a late library's process could not be held.
pub(crate) fn lost_events(r: &super::Report) -> u64 {
    let ring: u64 = r.lost.by_kind.iter().skip(20).take(10).sum();
    ring + r.gpu.lost.pending_full + r.gpu.lost.window_calls
}

impl Ledger {
    /// What the processes hold now, summed: `record --metrics` reads it
    /// while the job runs.
    pub fn held_now(&self) -> Held {
        self.procs.values().fold(Held::default(), |a, st| {
            let h = st.held();
            Held {
                device: a.device + h.device,
                pinned: a.pinned + h.pinned,
                managed: a.managed + h.managed,
            }
        })
    }

    /// Drops the processes that exited, and what is kept for them: a
    /// recorder that runs for weeks (`--all --metrics`) keeps only the
    /// live ones. Not for a ledger whose report is wanted.
    pub fn forget_exited(&mut self) {
        self.procs.retain(|_, st| st.p.exited_ns.is_none());
    }
}

#[cfg(test)]
mod tests;
