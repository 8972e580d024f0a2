//! CUDA driver calls: what each one allocates, frees, or creates, and the
//! failed allocations that ran out of memory.

use crate::decode::gpu::{CUDA_ERROR_OUT_OF_MEMORY, CudaCall, CudaOp, mem_create_on_host};

use super::ledger::Ledger;
use super::state::{Live, ProcState, Vmm};
use super::{ContextInit, CudaOom, MAX_LIST, MemKind};

impl Ledger {
    pub(super) fn on_cuda(&mut self, ts: u64, c: CudaCall) {
        let key = c.proc;
        self.job_pids.entry(key.tgid).or_insert(key);
        let alloc_kind = alloc_kind(&c);
        if c.result != 0 {
            self.on_failed(ts, &c, alloc_kind);
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
            _ => st.on_memory(ts, &c, alloc_kind),
        }
    }

    /// A call that failed: counted, and a failed allocation that ran out
    /// of memory is kept with who held what then.
    fn on_failed(&mut self, ts: u64, c: &CudaCall, alloc_kind: Option<(MemKind, bool)>) {
        let key = c.proc;
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
    }
}

/// The kind an allocating call allocates, and whether it registers memory
/// the process already had.
fn alloc_kind(c: &CudaCall) -> Option<(MemKind, bool)> {
    match c.op {
        CudaOp::MemAlloc | CudaOp::MemAllocAsync | CudaOp::MemAllocFromPool => {
            Some((MemKind::Device, false))
        }
        CudaOp::MemAllocManaged => Some((MemKind::Managed, false)),
        CudaOp::MemAllocHost | CudaOp::MemHostAlloc => Some((MemKind::Pinned, false)),
        CudaOp::MemHostRegister => Some((MemKind::Pinned, true)),
        CudaOp::MemCreate if mem_create_on_host(c.aux) => Some((MemKind::Pinned, false)),
        CudaOp::MemCreate => Some((MemKind::Device, false)),
        _ => None,
    }
}

impl ProcState {
    /// A successful call that allocates or frees: `kind` is
    /// [`alloc_kind`]'s.
    fn on_memory(&mut self, ts: u64, c: &CudaCall, kind: Option<(MemKind, bool)>) {
        match c.op {
            CudaOp::MemAlloc
            | CudaOp::MemAllocAsync
            | CudaOp::MemAllocFromPool
            | CudaOp::MemAllocManaged
            | CudaOp::MemAllocHost
            | CudaOp::MemHostAlloc
            | CudaOp::MemHostRegister => {
                let (k, registered) = kind.expect("an allocation");
                // A pointer still live is being handed out again: its free
                // went unrecorded. Drop the old one first.
                if let Some(old) = self.live.remove(&c.ptr) {
                    self.p.unknown_frees += 1;
                    self.sub(ts, old.kind, old.size);
                    if old.registered {
                        self.registered = self.registered.saturating_sub(old.size);
                    }
                }
                self.live.insert(
                    c.ptr,
                    Live {
                        kind: k,
                        size: c.size,
                        registered,
                    },
                );
                self.add(ts, k, c.size);
                if registered {
                    self.registered += c.size;
                    self.p.registered_peak = self.p.registered_peak.max(self.registered);
                }
            }
            CudaOp::MemFree | CudaOp::MemFreeAsync | CudaOp::MemFreeHost => {
                let want_pinned = c.op == CudaOp::MemFreeHost;
                match self.live.get(&c.ptr) {
                    Some(l) if (l.kind == MemKind::Pinned) == want_pinned && !l.registered => {
                        let l = self.live.remove(&c.ptr).expect("just found");
                        self.sub(ts, l.kind, l.size);
                    }
                    _ => self.p.unknown_frees += 1,
                }
            }
            CudaOp::MemHostUnregister => match self.live.get(&c.ptr) {
                Some(l) if l.registered => {
                    let l = self.live.remove(&c.ptr).expect("just found");
                    self.registered = self.registered.saturating_sub(l.size);
                    self.sub(ts, l.kind, l.size);
                }
                _ => self.p.unknown_frees += 1,
            },
            CudaOp::MemCreate => {
                let (k, _) = kind.expect("an allocation");
                self.vmm.insert(
                    c.ptr,
                    Vmm {
                        kind: k,
                        size: c.size,
                        released: false,
                        maps: 0,
                    },
                );
                self.add(ts, k, c.size);
            }
            CudaOp::MemRelease => match self.vmm.get_mut(&c.ptr) {
                Some(v) => {
                    v.released = true;
                    if v.maps == 0 {
                        let v = self.vmm.remove(&c.ptr).expect("just found");
                        self.sub(ts, v.kind, v.size);
                    }
                }
                None => self.p.unknown_frees += 1,
            },
            CudaOp::MemMap => {
                if let Some(v) = self.vmm.get_mut(&c.handle) {
                    v.maps += 1;
                    self.maps.insert(c.ptr, c.handle);
                }
            }
            CudaOp::MemUnmap => {
                if let Some(h) = self.maps.remove(&c.ptr)
                    && let Some(v) = self.vmm.get_mut(&h)
                {
                    v.maps = v.maps.saturating_sub(1);
                    if v.maps == 0 && v.released {
                        let v = self.vmm.remove(&h).expect("just found");
                        self.sub(ts, v.kind, v.size);
                    }
                }
            }
            CudaOp::Init | CudaOp::PrimaryCtxRetain | CudaOp::CtxCreate => {}
        }
    }
}
