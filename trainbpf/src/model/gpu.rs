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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::decode::{
    Event, ProcKey, Rss, Timed,
    gpu::{
        CUDA_ERROR_OUT_OF_MEMORY, CudaCall, CudaOp, GpuAttach, GpuEvent, GpuLost, GpuSource,
        NvmlSample, XidRecord, mem_create_on_host,
    },
};

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
pub const MAX_TIMELINE: usize = 60;
const MAX_LIST: usize = 1000;
/// A driver of 575+ reports an Xid both on its tracepoint and in the log.
const XID_MERGE_NS: u64 = 2 * SEC;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    Device,
    Pinned,
    Managed,
}

const KINDS: [MemKind; 3] = [MemKind::Device, MemKind::Pinned, MemKind::Managed];

fn idx(k: MemKind) -> usize {
    match k {
        MemKind::Device => 0,
        MemKind::Pinned => 1,
        MemKind::Managed => 2,
    }
}

/// One kind of memory of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Held when the recording (or the process) ended, before the exit
    /// freed it.
    pub end: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
    pub allocs: u64,
    pub frees: u64,
    /// Still held when the process exited, and freed with it.
    pub freed_at_exit: u64,
    /// Allocations that failed.
    pub failed: u64,
}

/// A CUDA context the process created, and the host memory that came with
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextInit {
    pub ts_ns: u64,
    pub op: CudaOp,
    pub device: Option<i32>,
    pub handle: u64,
    /// Host resident memory gained from the process's `cuInit` (for its
    /// first context) or the call's entry, to its return; `None` without a
    /// memory record before. As exact as the memory records' threshold
    /// (`--rss-threshold`): a record is sent when memory moved by it.
    pub host_kb: Option<u64>,
}

/// NVML's per-process figure against the ledger's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmlCompare {
    pub samples: u64,
    pub last_nvml_bytes: u64,
    /// The ledger's device bytes at the same instant.
    pub last_ledger_bytes: u64,
    pub peak_nvml_bytes: u64,
}

impl NvmlCompare {
    /// What NVML saw beyond the probes: context and driver overhead, or
    /// allocations the probes missed.
    pub fn difference(&self) -> i64 {
        self.last_nvml_bytes as i64 - self.last_ledger_bytes as i64
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    pub start_ns: u64,
    pub comm: String,
    pub parent: Option<u32>,
    pub is_root: bool,
    pub device: KindStats,
    pub pinned: KindStats,
    pub managed: KindStats,
    /// The part of pinned memory that was registered (`cuMemHostRegister`):
    /// already the process's own memory, now page-locked.
    pub registered_peak: u64,
    pub cuda_init_ns: Option<u64>,
    pub contexts: Vec<ContextInit>,
    /// A job process other than the root that initialised CUDA (a DataLoader
    /// worker that touched CUDA pays for a context of its own).
    pub worker_init: bool,
    /// Its parent had a CUDA context before it made one.
    pub parent_had_context: bool,
    pub exited_ns: Option<u64>,
    /// The kernel's OOM killer chose it.
    pub oom_killed: bool,
    pub calls: u64,
    pub failed_calls: u64,
    /// Frees of pointers the ledger never saw allocated (allocated before the
    /// probes attached, or a lost record).
    pub unknown_frees: u64,
    pub host_rss_peak_kb: u64,
    pub nvml: Option<NvmlCompare>,
    /// `nv_alloc_pages`/`nv_free_pages` page counts, where those probes ran.
    pub nv_pages_alloc: u64,
    pub nv_pages_free: u64,
}

impl GpuProcess {
    pub fn kind(&self, k: MemKind) -> &KindStats {
        match k {
            MemKind::Device => &self.device,
            MemKind::Pinned => &self.pinned,
            MemKind::Managed => &self.managed,
        }
    }
}

/// What one process held at an instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub device: u64,
    pub pinned: u64,
    pub managed: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub held: Held,
}

/// A failed CUDA allocation with `CUDA_ERROR_OUT_OF_MEMORY`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOom {
    pub ts_ns: u64,
    pub pid: u32,
    pub start_ns: u64,
    pub tid: u32,
    pub comm: String,
    pub op: CudaOp,
    pub requested_bytes: u64,
    pub error: u32,
    /// What the asking process held then.
    pub held: Held,
    /// Every recorded process holding device memory then, most first.
    pub holders: Vec<Holder>,
    /// The device memory NVML reported last before it (all GPUs summed).
    pub nvml_used_bytes: Option<u64>,
    pub nvml_total_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xid {
    pub ts_ns: u64,
    pub code: u32,
    pub pci: String,
    /// The process the message names; `None` for `<unknown>`.
    pub pid: Option<u32>,
    pub name: Option<String>,
    pub msg: String,
    /// "tracepoint", "printk", or "tracepoint+printk".
    pub source: String,
}

/// One line of the GPU timeline: a process's memory moved within a second,
/// or something happened (context, OOM, exit holding memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineRow {
    pub ts_ns: u64,
    pub pid: u32,
    pub comm: String,
    pub what: String,
    pub delta: [i64; 3],
    /// After the row: device, pinned, managed.
    pub held: Held,
    /// The most of each kind held within the row's span.
    pub peak: Held,
    /// A failed allocation's request.
    pub requested_bytes: Option<u64>,
    pub host_rss_kb: Option<u64>,
    /// Contexts, OOMs and exits are always kept; steps may be dropped.
    pub notable: bool,
}

/// GPU memory around one host OOM kill.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuAtKill {
    pub kill_ts_ns: u64,
    pub window_ns: u64,
    pub processes: Vec<AtKill>,
    /// Contexts created in the window before the kill.
    pub contexts: Vec<(u32, String, ContextInit)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AtKill {
    pub pid: u32,
    pub comm: String,
    pub held: Held,
    /// Change over the window before the kill.
    pub grew: [i64; 3],
}

/// For the HTML and Perfetto renderers: per process, every change point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSeries {
    pub pid: u32,
    pub start_ns: u64,
    pub comm: String,
    /// (time, device, pinned, managed) after each change.
    pub points: Vec<(u64, Held)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvmlDeviceSummary {
    pub index: u32,
    pub name: String,
    pub total_bytes: u64,
    pub last_used_bytes: u64,
    pub peak_used_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReport {
    /// Job processes that called CUDA (or that NVML saw), by first call.
    pub processes: Vec<GpuProcess>,
    pub cuda_ooms: Vec<CudaOom>,
    pub xid: Vec<Xid>,
    pub timeline: Vec<TimelineRow>,
    /// Steps left out of `timeline` to keep it short.
    pub timeline_dropped: usize,
    /// One per host OOM kill, in the kills' order.
    pub at_kills: Vec<GpuAtKill>,
    pub series: Vec<GpuSeries>,
    pub attach: Vec<GpuAttach>,
    pub sources: Vec<GpuSource>,
    pub nvml_samples: u64,
    pub nvml_devices: Vec<NvmlDeviceSummary>,
    pub lost: GpuLost,
}

impl GpuReport {
    /// Whether there is anything GPU-related to show.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.xid.is_empty()
            && self.attach.is_empty()
            && self.nvml_samples == 0
    }
}

// ---------------------------------------------------------------------------
// Streaming state.

/// An event waiting in the reorder buffer.
#[derive(Debug)]
enum Item {
    Cuda(CudaCall),
    Exit(ProcKey),
    Rss(ProcKey, u64),
    Nvml(NvmlSample),
    Xid(Xid),
    NvPages(ProcKey, bool, u32),
}

#[derive(Debug)]
struct Live {
    kind: MemKind,
    size: u64,
    registered: bool,
}

#[derive(Debug)]
struct Vmm {
    kind: MemKind,
    size: u64,
    released: bool,
    maps: u32,
}

#[derive(Debug, Default)]
struct ProcState {
    p: GpuProcess,
    cur: [u64; 3],
    registered: u64,
    live: HashMap<u64, Live>,
    vmm: HashMap<u64, Vmm>,
    /// VA → handle of each `cuMemMap`.
    maps: HashMap<u64, u64>,
    history: Vec<(u64, Held)>,
    /// The last `cuInit` entry not yet followed by a context.
    init_entry: Option<u64>,
    seen_ns: u64,
}

impl ProcState {
    fn held(&self) -> Held {
        Held {
            device: self.cur[0],
            pinned: self.cur[1],
            managed: self.cur[2],
        }
    }

    fn stats(&mut self, k: MemKind) -> &mut KindStats {
        match k {
            MemKind::Device => &mut self.p.device,
            MemKind::Pinned => &mut self.p.pinned,
            MemKind::Managed => &mut self.p.managed,
        }
    }

    fn add(&mut self, ts: u64, k: MemKind, size: u64) {
        self.cur[idx(k)] += size;
        let cur = self.cur[idx(k)];
        let s = self.stats(k);
        s.allocated += size;
        s.allocs += 1;
        s.peak = s.peak.max(cur);
        self.point(ts);
    }

    fn sub(&mut self, ts: u64, k: MemKind, size: u64) {
        self.cur[idx(k)] = self.cur[idx(k)].saturating_sub(size);
        let s = self.stats(k);
        s.freed += size;
        s.frees += 1;
        self.point(ts);
    }

    fn point(&mut self, ts: u64) {
        let h = self.held();
        self.history.push((ts, h));
        if self.history.len() > MAX_HISTORY {
            thin(&mut self.history);
        }
    }

    /// Held at or before `ts` (zero before the first change).
    fn held_at(&self, ts: u64) -> Held {
        let i = self.history.partition_point(|(t, _)| *t <= ts);
        if i == 0 {
            Held::default()
        } else {
            self.history[i - 1].1
        }
    }
}

/// Keeps every other point, and always the last.
fn thin<T: Copy>(v: &mut Vec<(u64, T)>) {
    let last = *v.last().expect("thinning a non-empty history");
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        i % 2 == 1
    });
    if v.last().map(|l| l.0) != Some(last.0) {
        v.push(last);
    }
}

#[derive(Debug, Default)]
pub struct Ledger {
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    items: HashMap<u64, Item>,
    procs: HashMap<ProcKey, ProcState>,
    /// Job processes by pid, newest start: NVML and Xid name pids only.
    job_pids: HashMap<u32, ProcKey>,
    /// Pids the OOM killer chose.
    oom_victims: std::collections::HashSet<u32>,
    parents: HashMap<ProcKey, ProcKey>,
    root_pid: Option<u32>,
    rss: HashMap<ProcKey, Vec<(u64, u64)>>,
    ooms: Vec<CudaOom>,
    xid: Vec<Xid>,
    attach: Vec<GpuAttach>,
    sources: Vec<GpuSource>,
    lost: GpuLost,
    nvml_samples: u64,
    nvml_devices: Vec<NvmlDeviceSummary>,
    /// Last NVML sample: (used, total) summed over GPUs.
    nvml_last: Option<(u64, u64)>,
}

impl Ledger {
    /// Sees every event of the recording; keeps what the GPU side needs.
    pub fn observe(&mut self, t: &Timed) {
        let ts = t.ts_ns;
        self.now = self.now.max(ts);
        let item = match &t.event {
            Event::Gpu(g) => match &**g {
                GpuEvent::Cuda(c) => Some(Item::Cuda(c.clone())),
                GpuEvent::Xid(x) => Some(Item::Xid(xid_from_tracepoint(ts, x))),
                GpuEvent::NvPages { proc, alloc, pages } => {
                    Some(Item::NvPages(*proc, *alloc, *pages))
                }
                GpuEvent::Nvml(n) => Some(Item::Nvml(n.clone())),
                GpuEvent::Attach(a) => {
                    if self.attach.len() < MAX_LIST {
                        self.attach.push(a.clone());
                    }
                    None
                }
                GpuEvent::Source(s) => {
                    if !self.sources.contains(s) {
                        self.sources.push(s.clone());
                    }
                    None
                }
                GpuEvent::Lost(l) => {
                    self.lost = l.clone();
                    None
                }
            },
            Event::Printk { msg, .. } => parse_xid_line(msg).map(|mut x| {
                x.ts_ns = ts;
                Item::Xid(x)
            }),
            Event::JobStart(j) => {
                self.root_pid = Some(j.pid);
                None
            }
            Event::Fork { child, parent, .. } => {
                self.parents.insert(*child, *parent);
                self.job_pids.insert(child.tgid, *child);
                None
            }
            Event::Exec { proc, .. } => {
                self.job_pids.entry(proc.tgid).or_insert(*proc);
                None
            }
            Event::Exit { proc, .. } => Some(Item::Exit(*proc)),
            Event::Oom(o) => {
                self.oom_victims.insert(o.victim.tgid);
                None
            }
            Event::Mem {
                proc,
                in_job: true,
                rss,
                ..
            } => {
                self.job_pids.entry(proc.tgid).or_insert(*proc);
                Some(Item::Rss(*proc, resident(rss)))
            }
            _ => None,
        };
        if let Some(item) = item {
            self.seq += 1;
            self.heap.push(Reverse((ts, self.seq)));
            self.items.insert(self.seq, item);
        }
        self.replay(self.now.saturating_sub(REORDER_NS));
    }

    /// Applies every buffered event up to `until`, in time order.
    fn replay(&mut self, until: u64) {
        while let Some(Reverse((ts, seq))) = self.heap.peek().copied() {
            if ts > until {
                break;
            }
            self.heap.pop();
            if let Some(item) = self.items.remove(&seq) {
                self.apply(ts, item);
            }
        }
    }

    fn proc(&mut self, key: ProcKey, comm: &str, ts: u64) -> &mut ProcState {
        let root = self.root_pid;
        let parent = self.parents.get(&key).copied();
        let st = self.procs.entry(key).or_insert_with(|| ProcState {
            p: GpuProcess {
                pid: key.tgid,
                start_ns: key.start_ns,
                parent: parent.map(|p| p.tgid),
                is_root: root == Some(key.tgid),
                ..GpuProcess::default()
            },
            seen_ns: ts,
            ..ProcState::default()
        });
        if !comm.is_empty() {
            st.p.comm = comm.to_string();
        }
        st
    }

    fn apply(&mut self, ts: u64, item: Item) {
        match item {
            Item::Cuda(c) => self.on_cuda(ts, c),
            Item::Exit(key) => self.on_exit(ts, key),
            Item::Rss(key, kb) => self.on_rss(ts, key, kb),
            Item::Nvml(n) => self.on_nvml(n),
            Item::Xid(x) => self.on_xid(x),
            Item::NvPages(key, alloc, pages) => {
                let st = self.proc(key, "", ts);
                if alloc {
                    st.p.nv_pages_alloc += u64::from(pages);
                } else {
                    st.p.nv_pages_free += u64::from(pages);
                }
            }
        }
    }

    fn on_rss(&mut self, ts: u64, key: ProcKey, kb: u64) {
        let v = self.rss.entry(key).or_default();
        v.push((ts, kb));
        if v.len() > MAX_RSS {
            thin(v);
        }
        if let Some(st) = self.procs.get_mut(&key) {
            st.p.host_rss_peak_kb = st.p.host_rss_peak_kb.max(kb);
        }
    }

    /// Host RSS of a job process at or before `ts`.
    fn rss_at(&self, key: ProcKey, ts: u64) -> Option<u64> {
        let v = self.rss.get(&key)?;
        let i = v.partition_point(|(t, _)| *t <= ts);
        (i > 0).then(|| v[i - 1].1)
    }

    fn on_cuda(&mut self, ts: u64, c: CudaCall) {
        let key = c.proc;
        self.job_pids.entry(key.tgid).or_insert(key);
        let ok = c.result == 0;
        let alloc_kind = match c.op {
            CudaOp::MemAlloc | CudaOp::MemAllocAsync | CudaOp::MemAllocFromPool => {
                Some((MemKind::Device, false))
            }
            CudaOp::MemAllocManaged => Some((MemKind::Managed, false)),
            CudaOp::MemAllocHost | CudaOp::MemHostAlloc => Some((MemKind::Pinned, false)),
            CudaOp::MemHostRegister => Some((MemKind::Pinned, true)),
            CudaOp::MemCreate if mem_create_on_host(c.aux) => Some((MemKind::Pinned, false)),
            CudaOp::MemCreate => Some((MemKind::Device, false)),
            _ => None,
        };
        if !ok {
            let nvml = self.nvml_last;
            let holders = self.holders();
            let room = self.ooms.len() < MAX_LIST;
            let st = self.proc(key, &c.comm, ts);
            st.p.calls += 1;
            st.p.failed_calls += 1;
            if let Some((k, _)) = alloc_kind {
                st.stats(k).failed += 1;
                if c.result == CUDA_ERROR_OUT_OF_MEMORY && room {
                    let held = st.held();
                    let comm = st.p.comm.clone();
                    self.ooms.push(CudaOom {
                        ts_ns: ts,
                        pid: key.tgid,
                        start_ns: key.start_ns,
                        tid: c.tid,
                        comm,
                        op: c.op,
                        requested_bytes: c.size,
                        error: c.result,
                        held,
                        holders,
                        nvml_used_bytes: nvml.map(|n| n.0),
                        nvml_total_bytes: nvml.map(|n| n.1),
                    });
                }
            }
            return;
        }
        let rss_now = self.rss_at(key, ts);
        let entry_rss = self.rss_at(key, c.entry_ns);
        let init_rss = self
            .procs
            .get(&key)
            .and_then(|s| s.init_entry)
            .and_then(|e| self.rss_at(key, e));
        let parent_had_context = self
            .parents
            .get(&key)
            .and_then(|p| self.procs.get(p))
            .is_some_and(|p| !p.p.contexts.is_empty());
        let root = self.root_pid;
        let st = self.proc(key, &c.comm, ts);
        st.p.calls += 1;
        if let Some(rss) = rss_now {
            st.p.host_rss_peak_kb = st.p.host_rss_peak_kb.max(rss);
        }
        match c.op {
            CudaOp::Init => {
                st.p.cuda_init_ns.get_or_insert(ts);
                st.init_entry.get_or_insert(c.entry_ns);
                st.p.worker_init |= root.is_some_and(|r| r != key.tgid);
            }
            CudaOp::PrimaryCtxRetain | CudaOp::CtxCreate => {
                // Retaining a primary context that is already held creates
                // nothing.
                let known = c.op == CudaOp::PrimaryCtxRetain
                    && st
                        .p
                        .contexts
                        .iter()
                        .any(|x| x.handle == c.ptr && c.ptr != 0);
                if !known {
                    if st.p.contexts.is_empty() {
                        st.p.parent_had_context = parent_had_context;
                    }
                    st.p.worker_init |= root.is_some_and(|r| r != key.tgid);
                    // The first context pays for cuInit too.
                    let first = st.p.contexts.is_empty();
                    let init = st.init_entry.take();
                    let from = if first && init.is_some() {
                        init_rss
                    } else {
                        entry_rss
                    };
                    let host_kb = from.zip(rss_now).map(|(f, n)| n.saturating_sub(f));
                    st.p.contexts.push(ContextInit {
                        ts_ns: ts,
                        op: c.op,
                        device: c.device,
                        handle: c.ptr,
                        host_kb,
                    });
                }
            }
            CudaOp::MemAlloc
            | CudaOp::MemAllocAsync
            | CudaOp::MemAllocFromPool
            | CudaOp::MemAllocManaged
            | CudaOp::MemAllocHost
            | CudaOp::MemHostAlloc
            | CudaOp::MemHostRegister => {
                let (k, registered) = alloc_kind.expect("an allocation");
                // A pointer still live is being handed out again: its free
                // went unrecorded. Drop the old one first.
                if let Some(old) = st.live.remove(&c.ptr) {
                    st.p.unknown_frees += 1;
                    st.sub(ts, old.kind, old.size);
                    if old.registered {
                        st.registered = st.registered.saturating_sub(old.size);
                    }
                }
                st.live.insert(
                    c.ptr,
                    Live {
                        kind: k,
                        size: c.size,
                        registered,
                    },
                );
                st.add(ts, k, c.size);
                if registered {
                    st.registered += c.size;
                    st.p.registered_peak = st.p.registered_peak.max(st.registered);
                }
            }
            CudaOp::MemFree | CudaOp::MemFreeAsync | CudaOp::MemFreeHost => {
                let want_pinned = c.op == CudaOp::MemFreeHost;
                match st.live.get(&c.ptr) {
                    Some(l) if (l.kind == MemKind::Pinned) == want_pinned && !l.registered => {
                        let l = st.live.remove(&c.ptr).expect("just found");
                        st.sub(ts, l.kind, l.size);
                    }
                    _ => st.p.unknown_frees += 1,
                }
            }
            CudaOp::MemHostUnregister => match st.live.get(&c.ptr) {
                Some(l) if l.registered => {
                    let l = st.live.remove(&c.ptr).expect("just found");
                    st.registered = st.registered.saturating_sub(l.size);
                    st.sub(ts, l.kind, l.size);
                }
                _ => st.p.unknown_frees += 1,
            },
            CudaOp::MemCreate => {
                let (k, _) = alloc_kind.expect("an allocation");
                st.vmm.insert(
                    c.ptr,
                    Vmm {
                        kind: k,
                        size: c.size,
                        released: false,
                        maps: 0,
                    },
                );
                st.add(ts, k, c.size);
            }
            CudaOp::MemRelease => match st.vmm.get_mut(&c.ptr) {
                Some(v) => {
                    v.released = true;
                    if v.maps == 0 {
                        let v = st.vmm.remove(&c.ptr).expect("just found");
                        st.sub(ts, v.kind, v.size);
                    }
                }
                None => st.p.unknown_frees += 1,
            },
            CudaOp::MemMap => {
                if let Some(v) = st.vmm.get_mut(&c.handle) {
                    v.maps += 1;
                    st.maps.insert(c.ptr, c.handle);
                }
            }
            CudaOp::MemUnmap => {
                if let Some(h) = st.maps.remove(&c.ptr)
                    && let Some(v) = st.vmm.get_mut(&h)
                {
                    v.maps = v.maps.saturating_sub(1);
                    if v.maps == 0 && v.released {
                        let v = st.vmm.remove(&h).expect("just found");
                        st.sub(ts, v.kind, v.size);
                    }
                }
            }
        }
    }

    /// Everyone holding GPU-side memory now, most device memory first.
    fn holders(&self) -> Vec<Holder> {
        let mut v: Vec<Holder> = self
            .procs
            .values()
            .filter(|s| s.p.exited_ns.is_none() && s.cur.iter().any(|&b| b > 0))
            .map(|s| Holder {
                pid: s.p.pid,
                comm: s.p.comm.clone(),
                held: s.held(),
            })
            .collect();
        v.sort_by(|a, b| b.held.device.cmp(&a.held.device).then(a.pid.cmp(&b.pid)));
        v
    }

    fn on_exit(&mut self, ts: u64, key: ProcKey) {
        let Some(st) = self.procs.get_mut(&key) else {
            return;
        };
        st.p.exited_ns = Some(ts);
        st.p.oom_killed = self.oom_victims.contains(&key.tgid);
        for k in KINDS {
            let held = st.cur[idx(k)];
            let s = st.stats(k);
            s.end = held;
            s.freed_at_exit = held;
        }
        st.cur = [0; 3];
        st.registered = 0;
        st.live.clear();
        st.vmm.clear();
        st.maps.clear();
        st.point(ts);
    }

    fn on_nvml(&mut self, n: NvmlSample) {
        self.nvml_samples += 1;
        let (mut used, mut total) = (0, 0);
        let mut per_pid: HashMap<u32, u64> = HashMap::new();
        for d in &n.devices {
            used += d.used_bytes;
            total += d.total_bytes;
            match self.nvml_devices.iter_mut().find(|s| s.index == d.index) {
                Some(s) => {
                    s.last_used_bytes = d.used_bytes;
                    s.peak_used_bytes = s.peak_used_bytes.max(d.used_bytes);
                    s.total_bytes = d.total_bytes;
                }
                None => self.nvml_devices.push(NvmlDeviceSummary {
                    index: d.index,
                    name: d.name.clone(),
                    total_bytes: d.total_bytes,
                    last_used_bytes: d.used_bytes,
                    peak_used_bytes: d.used_bytes,
                }),
            }
            for p in &d.processes {
                *per_pid.entry(p.pid).or_default() += p.used_bytes.unwrap_or(0);
            }
        }
        self.nvml_last = Some((used, total));
        for (pid, bytes) in per_pid {
            // Only the job's processes: NVML lists the whole machine's.
            let Some(&key) = self.job_pids.get(&pid) else {
                continue;
            };
            let ts = self.now;
            let st = self.proc(key, "", ts);
            // NVML lists a process until the driver has torn its contexts
            // down, after its exit: the ledger freed its memory at the exit,
            // so such a sample would compare the driver's figure with 0 (seen
            // on an H200: every run's last sample came after the exit).
            if st.p.exited_ns.is_some() {
                continue;
            }
            let c = st.p.nvml.get_or_insert_with(NvmlCompare::default);
            c.samples += 1;
            c.last_nvml_bytes = bytes;
            c.last_ledger_bytes = st.cur[idx(MemKind::Device)];
            c.peak_nvml_bytes = c.peak_nvml_bytes.max(bytes);
        }
    }

    fn on_xid(&mut self, x: Xid) {
        // The same Xid from the tracepoint and the log: one entry.
        if let Some(prev) = self.xid.iter_mut().rev().find(|p| {
            p.code == x.code && p.pid == x.pid && p.ts_ns.abs_diff(x.ts_ns) <= XID_MERGE_NS
        }) && prev.source != x.source
            && !prev.source.contains('+')
        {
            prev.source = format!("{}+{}", prev.source, x.source);
            if prev.name.is_none() {
                prev.name = x.name;
            }
            return;
        }
        if self.xid.len() < MAX_LIST {
            self.xid.push(x);
        }
    }

    /// `kills`: (time, window) of each host OOM kill, in the report's order.
    pub fn finish(mut self, kills: &[(u64, u64)]) -> GpuReport {
        self.replay(u64::MAX);
        let mut procs: Vec<&ProcState> = self.procs.values().collect();
        procs.sort_by_key(|s| (s.seen_ns, s.p.pid, s.p.start_ns));

        let at_kills = kills
            .iter()
            .map(|&(kill, window)| {
                let start = kill.saturating_sub(window);
                let mut processes: Vec<AtKill> = procs
                    .iter()
                    .filter_map(|s| {
                        let at = s.held_at(kill);
                        let before = s.held_at(start);
                        let grew = [
                            at.device as i64 - before.device as i64,
                            at.pinned as i64 - before.pinned as i64,
                            at.managed as i64 - before.managed as i64,
                        ];
                        (at != Held::default() || grew != [0; 3]).then(|| AtKill {
                            pid: s.p.pid,
                            comm: s.p.comm.clone(),
                            held: at,
                            grew,
                        })
                    })
                    .collect();
                processes.sort_by(|a, b| {
                    (b.held.pinned + b.held.device)
                        .cmp(&(a.held.pinned + a.held.device))
                        .then(a.pid.cmp(&b.pid))
                });
                let contexts = procs
                    .iter()
                    .flat_map(|s| {
                        s.p.contexts
                            .iter()
                            .filter(|c| c.ts_ns >= start && c.ts_ns <= kill)
                            .map(|c| (s.p.pid, s.p.comm.clone(), c.clone()))
                    })
                    .collect();
                GpuAtKill {
                    kill_ts_ns: kill,
                    window_ns: window,
                    processes,
                    contexts,
                }
            })
            .collect();

        let (timeline, timeline_dropped) = timeline(&procs, &self.ooms, &self.rss);
        let series = procs
            .iter()
            .filter(|s| !s.history.is_empty())
            .map(|s| GpuSeries {
                pid: s.p.pid,
                start_ns: s.p.start_ns,
                comm: s.p.comm.clone(),
                points: s.history.clone(),
            })
            .collect();
        let processes = procs
            .iter()
            .map(|s| {
                let mut p = s.p.clone();
                if p.exited_ns.is_none() {
                    for k in KINDS {
                        let held = s.cur[idx(k)];
                        match k {
                            MemKind::Device => p.device.end = held,
                            MemKind::Pinned => p.pinned.end = held,
                            MemKind::Managed => p.managed.end = held,
                        }
                    }
                }
                if p.comm.is_empty() {
                    p.comm = "?".into();
                }
                p
            })
            .collect();
        GpuReport {
            processes,
            cuda_ooms: self.ooms,
            xid: self.xid,
            timeline,
            timeline_dropped,
            at_kills,
            series,
            attach: self.attach,
            sources: self.sources,
            nvml_samples: self.nvml_samples,
            nvml_devices: self.nvml_devices,
            lost: self.lost,
        }
    }
}

/// GPU records lost in the ring buffer (kernel kinds 20-29) plus calls the
/// entry/return map had no room for.
pub fn lost_events(r: &super::Report) -> u64 {
    let ring: u64 = r.lost.by_kind.iter().skip(20).take(10).sum();
    ring + r.gpu.lost.pending_full
}

fn resident(rss: &Rss) -> u64 {
    rss.resident_kb()
}

/// Rows per process and second, plus contexts, OOMs and exits holding
/// memory; the largest steps when there are too many.
fn timeline(
    procs: &[&ProcState],
    ooms: &[CudaOom],
    rss: &HashMap<ProcKey, Vec<(u64, u64)>>,
) -> (Vec<TimelineRow>, usize) {
    let rss_at = |key: ProcKey, ts: u64| -> Option<u64> {
        let v = rss.get(&key)?;
        let i = v.partition_point(|(t, _)| *t <= ts);
        (i > 0).then(|| v[i - 1].1)
    };
    let mut rows = Vec::new();
    for s in procs {
        let key = ProcKey {
            tgid: s.p.pid,
            start_ns: s.p.start_ns,
        };
        let comm = &s.p.comm;
        // A step row never spans a context or an OOM of the process, so the
        // rows read in order.
        let mut marks: Vec<u64> = s.p.contexts.iter().map(|c| c.ts_ns).collect();
        marks.extend(ooms.iter().filter(|o| o.pid == s.p.pid).map(|o| o.ts_ns));
        // The exit has a row of its own.
        marks.extend(s.p.exited_ns);
        let mut prev = Held::default();
        let mut i = 0;
        let h = &s.history;
        while i < h.len() {
            // One row for the changes within a second of the first.
            let from = h[i].0;
            let mut peak = h[i].1;
            let mut j = i;
            while j + 1 < h.len()
                && h[j + 1].0 < from + SEC
                && !marks.iter().any(|&m| m > h[j].0 && m <= h[j + 1].0)
            {
                j += 1;
                peak = max_held(peak, h[j].1);
            }
            let (ts, after) = h[j];
            let delta = [
                after.device as i64 - prev.device as i64,
                after.pinned as i64 - prev.pinned as i64,
                after.managed as i64 - prev.managed as i64,
            ];
            let exit = s.p.exited_ns == Some(ts) && prev != Held::default();
            if delta != [0; 3] {
                rows.push(TimelineRow {
                    ts_ns: from,
                    pid: s.p.pid,
                    comm: comm.clone(),
                    what: if exit && s.p.oom_killed {
                        "OOM-killed holding memory: freed with it".into()
                    } else if exit {
                        "exited holding memory: freed with it".into()
                    } else if j > i {
                        format!(
                            "{} changes in {} ms",
                            j - i + 1,
                            ts.saturating_sub(from).div_ceil(1_000_000)
                        )
                    } else {
                        "1 change".into()
                    },
                    delta,
                    held: after,
                    peak,
                    requested_bytes: None,
                    host_rss_kb: rss_at(key, ts),
                    notable: exit,
                });
            }
            prev = after;
            i = j + 1;
        }
        for c in &s.p.contexts {
            let mut what = format!("{} created a context", c.op.name());
            if let Some(d) = c.device {
                what.push_str(&format!(" on GPU {d}"));
            }
            rows.push(TimelineRow {
                ts_ns: c.ts_ns,
                pid: s.p.pid,
                comm: comm.clone(),
                what,
                delta: [0; 3],
                held: s.held_at(c.ts_ns),
                peak: s.held_at(c.ts_ns),
                requested_bytes: None,
                host_rss_kb: rss_at(key, c.ts_ns),
                notable: true,
            });
        }
    }
    for o in ooms {
        rows.push(TimelineRow {
            ts_ns: o.ts_ns,
            pid: o.pid,
            comm: o.comm.clone(),
            what: format!("{} failed: CUDA out of memory", o.op.name()),
            delta: [0; 3],
            held: o.held,
            peak: o.held,
            requested_bytes: Some(o.requested_bytes),
            host_rss_kb: rss_at(
                ProcKey {
                    tgid: o.pid,
                    start_ns: o.start_ns,
                },
                o.ts_ns,
            ),
            notable: true,
        });
    }
    let mut dropped = 0;
    let steps = rows.iter().filter(|r| !r.notable).count();
    let notable = rows.len() - steps;
    if rows.len() > MAX_TIMELINE {
        let room = MAX_TIMELINE.saturating_sub(notable);
        let mut sizes: Vec<u64> = rows
            .iter()
            .filter(|r| !r.notable)
            .map(|r| r.delta.iter().map(|d| d.unsigned_abs()).sum())
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let cut = sizes
            .get(room.saturating_sub(1))
            .copied()
            .unwrap_or(u64::MAX);
        let mut kept = 0;
        rows.retain(|r| {
            if r.notable {
                return true;
            }
            let size: u64 = r.delta.iter().map(|d| d.unsigned_abs()).sum();
            let keep = room > 0 && size >= cut && kept < room;
            kept += usize::from(keep);
            dropped += usize::from(!keep);
            keep
        });
    }
    rows.sort_by_key(|r| (r.ts_ns, r.pid, r.notable));
    (rows, dropped)
}

fn max_held(a: Held, b: Held) -> Held {
    Held {
        device: a.device.max(b.device),
        pinned: a.pinned.max(b.pinned),
        managed: a.managed.max(b.managed),
    }
}

fn xid_from_tracepoint(ts: u64, x: &XidRecord) -> Xid {
    let (pid, name, msg) = parse_xid_tail(&x.msg);
    Xid {
        ts_ns: ts,
        code: x.code,
        pci: x.pci.clone(),
        pid,
        name,
        msg,
        source: "tracepoint".into(),
    }
}

/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen
/// off the bus.` (the driver's `nvErrorLog`), with or without a console
/// timestamp before it.
pub fn parse_xid_line(msg: &str) -> Option<Xid> {
    let rest = &msg[msg.find("NVRM: Xid")? + "NVRM: Xid".len()..];
    let rest = rest.trim_start();
    let (pci, rest) = match rest.strip_prefix("(PCI:") {
        Some(r) => {
            let end = r.find(')')?;
            (r[..end].to_string(), r[end + 1..].trim_start_matches(':'))
        }
        None => (String::new(), rest.trim_start_matches(':')),
    };
    let rest = rest.trim_start();
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let code: u32 = rest[..digits].parse().ok()?;
    let tail = rest[digits..].trim_start_matches(',').trim_start();
    let (pid, name, text) = parse_xid_tail(tail);
    Some(Xid {
        ts_ns: 0,
        code,
        pci,
        pid,
        name,
        msg: text,
        source: "printk".into(),
    })
}

/// `pid=1234, name=python3, text` → (1234, python3, text). Either field
/// may be `'<unknown>'` or missing.
fn parse_xid_tail(s: &str) -> (Option<u32>, Option<String>, String) {
    let mut rest = s.trim();
    let mut pid = None;
    let mut name = None;
    if let Some(r) = rest.strip_prefix("pid=") {
        let end = r.find(',').unwrap_or(r.len());
        pid = r[..end].trim().trim_matches('\'').parse().ok();
        rest = r[end..].trim_start_matches(',').trim_start();
    }
    if let Some(r) = rest.strip_prefix("name=") {
        let end = r.find(", ").unwrap_or(r.len());
        let n = r[..end].trim().trim_matches('\'');
        if !n.is_empty() && n != "<unknown>" {
            name = Some(n.to_string());
        }
        rest = r[end..].trim_start_matches(',').trim_start();
    }
    (pid, name, rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::JobStart;

    const MIB: u64 = 1 << 20;

    fn key(tgid: u32) -> ProcKey {
        ProcKey {
            tgid,
            start_ns: u64::from(tgid) * 10,
        }
    }

    fn at(ms: u64, event: Event) -> Timed {
        Timed {
            ts_ns: ms * 1_000_000,
            event,
        }
    }

    fn call(ms: u64, pid: u32, op: CudaOp, result: u32, size: u64, ptr: u64) -> Timed {
        at(
            ms,
            Event::Gpu(Box::new(GpuEvent::Cuda(CudaCall {
                proc: key(pid),
                tid: pid,
                comm: format!("p{pid}"),
                op,
                result,
                device: None,
                size,
                ptr,
                handle: 0,
                aux: 0,
                entry_ns: (ms * 1_000_000).saturating_sub(1000),
            }))),
        )
    }

    fn run(events: Vec<Timed>, kills: &[(u64, u64)]) -> GpuReport {
        let mut l = Ledger::default();
        for e in &events {
            l.observe(e);
        }
        l.finish(kills)
    }

    fn job_start(pid: u32) -> Timed {
        at(
            0,
            Event::JobStart(JobStart {
                pid,
                start_ns: 0,
                argv: vec!["job".into()],
                cwd: "/".into(),
                uid: 0,
                gid: 0,
                cgroup: None,
                memory_limit_bytes: None,
                attached: None,
            }),
        )
    }

    #[test]
    fn allocations_frees_peaks_and_exit() {
        use CudaOp::*;
        let r = run(
            vec![
                job_start(1),
                call(10, 1, MemAlloc, 0, 10 * MIB, 0x1000),
                call(11, 1, MemAllocAsync, 0, 5 * MIB, 0x2000),
                call(12, 1, MemFree, 0, 0, 0x1000),
                call(13, 1, MemAllocHost, 0, 2 * MIB, 0x9000),
                call(14, 1, MemAllocManaged, 0, 3 * MIB, 0x3000),
                // Freeing a pinned pointer with cuMemFree is the caller's
                // bug: not a device free.
                call(15, 1, MemFree, 1, 0, 0x9000),
                call(16, 1, MemFree, 0, 0, 0xdead),
                call(17, 1, MemAlloc, 2, 1 << 40, 0),
                at(
                    20,
                    Event::Exit {
                        proc: key(1),
                        comm: "p1".into(),
                        exit_code: 0,
                        group_exit_code: 0,
                    },
                ),
            ],
            &[],
        );
        let p = &r.processes[0];
        assert!(p.is_root && !p.worker_init);
        assert_eq!(
            (
                p.device.allocated,
                p.device.freed,
                p.device.peak,
                p.device.end
            ),
            (15 * MIB, 10 * MIB, 15 * MIB, 5 * MIB)
        );
        assert_eq!(p.device.freed_at_exit, 5 * MIB);
        assert_eq!((p.pinned.peak, p.pinned.end), (2 * MIB, 2 * MIB));
        assert_eq!(p.managed.peak, 3 * MIB);
        assert_eq!(
            (p.device.failed, p.unknown_frees, p.failed_calls),
            (1, 1, 2)
        );
        assert_eq!(r.cuda_ooms.len(), 1);
        let o = &r.cuda_ooms[0];
        assert_eq!((o.requested_bytes, o.error), (1 << 40, 2));
        assert_eq!(o.held.device, 5 * MIB);
        assert!(r.timeline.iter().any(|t| t.what.contains("exited holding")));
    }

    #[test]
    fn vmm_memory_lives_until_released_and_unmapped() {
        let mut ev = vec![job_start(1)];
        ev.push(call(10, 1, CudaOp::MemCreate, 0, 64 * MIB, 0xabc));
        let mut map = call(11, 1, CudaOp::MemMap, 0, 64 * MIB, 0x7000_0000);
        if let Event::Gpu(g) = &mut map.event
            && let GpuEvent::Cuda(c) = &mut **g
        {
            c.handle = 0xabc;
        }
        ev.push(map);
        ev.push(call(12, 1, CudaOp::MemRelease, 0, 0, 0xabc));
        let before_unmap = run(ev.clone(), &[(12_500_000, SEC)]);
        assert_eq!(before_unmap.processes[0].device.end, 64 * MIB);
        ev.push(call(13, 1, CudaOp::MemUnmap, 0, 64 * MIB, 0x7000_0000));
        let r = run(ev, &[]);
        let d = &r.processes[0].device;
        assert_eq!((d.peak, d.end, d.freed), (64 * MIB, 0, 64 * MIB));
    }

    #[test]
    fn out_of_order_records_replay_in_time_order() {
        // A free on one CPU and the reuse of the same pointer on another:
        // the reuse's record reached the file first.
        let r = run(
            vec![
                job_start(1),
                call(10, 1, CudaOp::MemAlloc, 0, MIB, 0x1000),
                call(12, 1, CudaOp::MemAlloc, 0, 2 * MIB, 0x1000),
                call(11, 1, CudaOp::MemFree, 0, 0, 0x1000),
            ],
            &[],
        );
        let p = &r.processes[0];
        assert_eq!(
            (p.device.end, p.device.peak, p.unknown_frees),
            (2 * MIB, 2 * MIB, 0)
        );
    }

    #[test]
    fn worker_context_and_its_host_cost() {
        let mem = |ms: u64, pid: u32, kb: u64| {
            at(
                ms,
                Event::Mem {
                    proc: key(pid),
                    in_job: true,
                    comm: format!("p{pid}"),
                    rss: Rss {
                        anon_kb: kb,
                        ..Rss::default()
                    },
                    faults: 0,
                    reason: 1,
                    oom_score_adj: 0,
                    pgtables_kb: 0,
                    memcg_id: 0,
                    stall_ns: 0,
                    alloc_kb: 0,
                    freed_kb: 0,
                    cache_kb: 0,
                },
            )
        };
        let r = run(
            vec![
                job_start(1),
                call(5, 1, CudaOp::Init, 0, 0, 0),
                call(6, 1, CudaOp::PrimaryCtxRetain, 0, 0, 0xc1),
                at(
                    100,
                    Event::Fork {
                        child: key(2),
                        parent: key(1),
                        comm: "p2".into(),
                    },
                ),
                mem(150, 2, 10_000),
                call(200, 2, CudaOp::Init, 0, 0, 0),
                mem(250, 2, 30_000),
                mem(299, 2, 70_000),
                call(300, 2, CudaOp::CtxCreate, 0, 0, 0xc2),
                // After the call: not the context's.
                mem(500, 2, 90_000),
            ],
            &[(3 * SEC, 10 * SEC)],
        );
        let w = r.processes.iter().find(|p| p.pid == 2).unwrap();
        assert!(w.worker_init && w.parent_had_context);
        assert_eq!(w.contexts.len(), 1);
        assert_eq!(w.contexts[0].host_kb, Some(60_000));
        let root = r.processes.iter().find(|p| p.pid == 1).unwrap();
        assert!(!root.worker_init);
        assert_eq!(r.at_kills[0].contexts.len(), 2);
    }

    #[test]
    fn xid_lines_parse_and_merge_with_the_tracepoint() {
        let x = parse_xid_line(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        )
        .unwrap();
        assert_eq!((x.code, x.pci.as_str()), (79, "0000:3b:00"));
        assert_eq!((x.pid, x.name.as_deref()), (Some(1234), Some("python3")));
        assert_eq!(x.msg, "GPU has fallen off the bus.");
        let u = parse_xid_line(
            "[ 12.3] NVRM: Xid (PCI:0000:01:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception",
        )
        .unwrap();
        assert_eq!((u.code, u.pid, u.name), (13, None, None));
        assert!(parse_xid_line("NVRM: loading NVIDIA UNIX driver").is_none());

        let tp = at(
            1000,
            Event::Gpu(Box::new(GpuEvent::Xid(XidRecord {
                code: 79,
                pci: "0000:3b:00.0".into(),
                msg: "pid=1234, name=python3, GPU has fallen off the bus.".into(),
            }))),
        );
        let log = at(
            1001,
            Event::Printk {
                tgid: 0,
                msg: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.".into(),
            },
        );
        let r = run(vec![tp, log], &[]);
        assert_eq!(r.xid.len(), 1, "{:?}", r.xid);
        assert_eq!(r.xid[0].source, "tracepoint+printk");
    }

    #[test]
    fn nvml_compares_with_the_ledger_for_job_processes_only() {
        use crate::decode::gpu::{NvmlDevice, NvmlProcess};
        let sample = |ms: u64, used: u64| {
            at(
                ms,
                Event::Gpu(Box::new(GpuEvent::Nvml(NvmlSample {
                    devices: vec![NvmlDevice {
                        index: 0,
                        name: "stand-in".into(),
                        used_bytes: used,
                        total_bytes: 80 << 30,
                        processes: vec![
                            NvmlProcess {
                                pid: 1,
                                used_bytes: Some(used),
                            },
                            NvmlProcess {
                                pid: 999,
                                used_bytes: Some(MIB),
                            },
                        ],
                    }],
                }))),
            )
        };
        let r = run(
            vec![
                job_start(1),
                call(10, 1, CudaOp::MemAlloc, 0, 100 * MIB, 0x1000),
                sample(2000, 400 * MIB),
                at(
                    2500,
                    Event::Exit {
                        proc: key(1),
                        comm: "p1".into(),
                        exit_code: 0,
                        group_exit_code: 0,
                    },
                ),
                // The driver still lists it while tearing it down: not a
                // comparison with the ledger it left at 0.
                sample(3000, 400 * MIB),
            ],
            &[],
        );
        assert_eq!(r.processes.len(), 1, "pid 999 is not the job's");
        let n = r.processes[0].nvml.unwrap();
        assert_eq!(
            (n.last_nvml_bytes, n.last_ledger_bytes),
            (400 * MIB, 100 * MIB)
        );
        assert_eq!(n.difference(), 300 * MIB as i64);
        assert_eq!(r.nvml_devices[0].peak_used_bytes, 400 * MIB);
    }

    #[test]
    fn timeline_stays_short() {
        let mut ev = vec![job_start(1)];
        for i in 0..500u64 {
            ev.push(call(
                (i + 1) * 2000,
                1,
                CudaOp::MemAlloc,
                0,
                (i + 1) * MIB,
                0x1000 + i,
            ));
        }
        let r = run(ev, &[]);
        assert!(r.timeline.len() <= MAX_TIMELINE);
        assert_eq!(r.timeline.len() + r.timeline_dropped, 500);
        // The largest steps are the ones kept.
        assert!(r.timeline.iter().all(|t| t.delta[0] as u64 > 400 * MIB));
    }
}
