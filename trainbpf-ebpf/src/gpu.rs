//! GPU probes: CUDA driver API uprobes, the NVIDIA driver's Xid tracepoint,
//! and kprobes on the driver's host-page allocator.
//!
//! CUDA calls are paired entry → return per thread: the entry program saves
//! the arguments (sizes, out-pointers) in [`CUDA_PENDING`], the return
//! program reads the `CUresult` and, on success, what the call wrote through
//! its out-pointer, and sends one [`CudaEvent`]. Only job processes are
//! recorded: the entry programs test the kernel's job map before saving
//! anything, so other processes that map the same `libcuda.so.1` (the probes
//! are per inode, machine-wide) cost a hash lookup.
//!
//! Uprobes and uretprobes need Linux 3.5 / 3.10; the ring buffer 5.8.
//! Signatures are the CUDA driver API's (`cuda.h`); the ones used here have
//! been stable since CUDA 11.2 (stream-ordered allocation) and 10.2 (VMM).

use core::ptr::addr_of;

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
        bpf_probe_read_kernel_str_bytes, bpf_probe_read_user,
    },
    macros::{kprobe, tracepoint, uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use trainbpf_common::*;

use crate::{
    count_lost, header, in_job, leader_start_ns,
    maps::{CUDA_PENDING, EVENTS, GPU_COUNTERS, GPU_STACK_AGG, Pending, ProcKey},
};

/// Offsets of `nvidia:nvidia_dev_xid`, set by the loader from tracefs.
#[unsafe(no_mangle)]
pub(crate) static GPU_CONFIG: GpuConfig = GpuConfig::UNSET;

/// Volatile so the build-time placeholder isn't folded in (see `conf!`).
#[inline(always)]
fn gpu_conf(p: *const i64) -> i64 {
    // SAFETY: `p` points into GPU_CONFIG, which lives for the program's life.
    unsafe { core::ptr::read_volatile(p) }
}

#[inline(always)]
fn bump(f: fn(&mut GpuCounters)) {
    if let Some(c) = GPU_COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, this CPU only; programs don't nest here.
        f(unsafe { &mut *c });
    }
}

#[inline(always)]
fn pending_key(pid_tgid: u64, op: u32) -> u64 {
    ((pid_tgid & 0xffff_ffff) << 8) | (op as u64 & 0xff)
}

#[inline(always)]
fn try_cuda_entry(ctx: &ProbeContext, op: u32, prog: &'static str) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !in_job((pid_tgid >> 32) as u32) {
        return Ok(0);
    }
    let a = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    let p = Pending {
        args: [a(0), a(1), a(2), a(3), a(4)],
        // SAFETY: helper without preconditions.
        entry_ns: unsafe { bpf_ktime_get_ns() },
    };
    if CUDA_PENDING
        .insert(&pending_key(pid_tgid, op), &p, 0)
        .is_err()
    {
        bump(|c| c.pending_full += 1);
        klog!(
            warn,
            crate::klog::SITE_CUDA_PENDING_FULL,
            prog,
            "CUDA_PENDING full: thread {}'s call not recorded ({} on this CPU)",
            pid_tgid as u32
        );
    }
    Ok(0)
}

/// The calls that allocate memory, device or host: their bytes are
/// attributed to the stack that asked (`record --stacks`).
#[inline(always)]
fn is_alloc(op: u32) -> bool {
    matches!(
        op,
        CU_MEM_ALLOC
            | CU_MEM_ALLOC_ASYNC
            | CU_MEM_ALLOC_FROM_POOL
            | CU_MEM_ALLOC_MANAGED
            | CU_MEM_ALLOC_HOST
            | CU_MEM_HOST_ALLOC
            | CU_MEM_HOST_REGISTER
            | CU_MEM_CREATE
    )
}

/// A successful allocation's bytes, under the stack that asked
/// (`record --stacks`). Taken at the return, where the registers are the
/// caller's again (the instruction pointer is the return address, the
/// frame pointer the caller's): the whole caller chain, however the driver
/// itself was built. At the entry, a driver function that does not begin
/// by pushing the frame pointer would hide its immediate caller from the
/// unwinder. `op` is a constant in each program, so only the allocating
/// calls' programs carry this.
#[inline(always)]
fn add_stack(ctx: &RetProbeContext, op: u32, tgid: u32, size: u64) {
    if !is_alloc(op) || size == 0 || conf!(stack_every_pages) <= 0 {
        return;
    }
    // SAFETY: helper without preconditions.
    let start_ns = leader_start_ns(unsafe { bpf_get_current_task() });
    let key = ProcKey {
        tgid,
        _pad: 0,
        start_ns,
    };
    // At the return the instruction pointer is the caller's: no leaf to
    // complete.
    let key = crate::stacks::take(ctx, &key, 0);
    crate::stacks::add(&GPU_STACK_AGG, &key, size);
}

/// Reads what the call wrote through an out-pointer (`CUdeviceptr *`,
/// `void **`, `CUcontext *`, `CUmemGenericAllocationHandle *`: all 64-bit).
#[inline(always)]
fn out_value(ptr: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly.
    match unsafe { bpf_probe_read_user(ptr as *const u64) } {
        Ok(v) => v,
        Err(_) => {
            bump(|c| c.read_failed += 1);
            0
        }
    }
}

/// `CUmemAllocationProp` (cuda.h): `type`, `requestedHandleTypes`, then
/// `CUmemLocation { type, id }` at offset 8.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemProp {
    kind: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
}

#[inline(always)]
fn try_cuda_return(ctx: &RetProbeContext, op: u32, prog: &'static str) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = pending_key(pid_tgid, op);
    // SAFETY: the value is copied out before the entry is removed.
    let Some(p) = (unsafe { CUDA_PENDING.get(&key) }).copied() else {
        // Not a job process, or the entry fired before the probe attached.
        return Ok(0);
    };
    let _ = CUDA_PENDING.remove(&key);
    // CUresult is a C enum: the low 32 bits of the return register.
    let result: u64 = ctx.ret();
    let result = result as u32;
    let ok = result == 0;
    let a = p.args;
    // (size, ptr, handle, aux, device) per call, from its signature.
    let (size, ptr, handle, aux, device) = match op {
        // cuInit(unsigned int Flags)
        CU_INIT => (a[0], 0, 0, 0, -1),
        // cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
        CU_PRIMARY_CTX_RETAIN => (0, if ok { out_value(a[0]) } else { 0 }, 0, 0, a[1] as i32),
        // cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
        CU_CTX_CREATE_V2 => (
            0,
            if ok { out_value(a[0]) } else { 0 },
            0,
            a[1],
            a[2] as i32,
        ),
        // cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params,
        //                int numParams, unsigned int flags, CUdevice dev)
        CU_CTX_CREATE_V3 => (
            0,
            if ok { out_value(a[0]) } else { 0 },
            0,
            a[3],
            a[4] as i32,
        ),
        // cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params,
        //                unsigned int flags, CUdevice dev)
        CU_CTX_CREATE_V4 => (
            0,
            if ok { out_value(a[0]) } else { 0 },
            0,
            a[2],
            a[3] as i32,
        ),
        // cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
        // cuMemAllocHost_v2(void **pp, size_t bytesize)
        CU_MEM_ALLOC | CU_MEM_ALLOC_HOST => (a[1], if ok { out_value(a[0]) } else { 0 }, 0, 0, -1),
        // cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
        // cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
        // cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
        CU_MEM_ALLOC_ASYNC | CU_MEM_ALLOC_MANAGED | CU_MEM_HOST_ALLOC => {
            (a[1], if ok { out_value(a[0]) } else { 0 }, 0, a[2], -1)
        }
        // cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
        //                         CUmemoryPool pool, CUstream hStream)
        CU_MEM_ALLOC_FROM_POOL => (a[1], if ok { out_value(a[0]) } else { 0 }, a[2], a[3], -1),
        // cuMemFree_v2(CUdeviceptr dptr), cuMemFreeHost(void *p),
        // cuMemHostUnregister(void *p), cuMemRelease(handle)
        CU_MEM_FREE | CU_MEM_FREE_HOST | CU_MEM_HOST_UNREGISTER | CU_MEM_RELEASE => {
            (0, a[0], 0, 0, -1)
        }
        // cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
        CU_MEM_FREE_ASYNC => (0, a[0], 0, a[1], -1),
        // cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
        CU_MEM_HOST_REGISTER => (a[1], a[0], 0, a[2], -1),
        // cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
        //             const CUmemAllocationProp *prop, unsigned long long flags)
        CU_MEM_CREATE => {
            // SAFETY: bpf_probe_read_user checks the address.
            let prop: Option<MemProp> = unsafe { bpf_probe_read_user(a[2] as *const MemProp) }.ok();
            let (loc_type, loc_id) = match prop {
                Some(p) => (p.location_type as u64, p.location_id),
                None => (0, -1),
            };
            (
                a[1],
                if ok { out_value(a[0]) } else { 0 },
                0,
                loc_type,
                loc_id,
            )
        }
        // cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
        //          CUmemGenericAllocationHandle handle, unsigned long long flags)
        CU_MEM_MAP => (a[1], a[0], a[3], a[2], -1),
        // cuMemUnmap(CUdeviceptr ptr, size_t size)
        CU_MEM_UNMAP => (a[1], a[0], 0, 0, -1),
        _ => (0, 0, 0, 0, -1),
    };
    let tgid = (pid_tgid >> 32) as u32;
    if ok {
        add_stack(ctx, op, tgid, size);
    }
    let Some(mut entry) = EVENTS.reserve::<CudaEvent>(0) else {
        count_lost(KIND_CUDA, prog);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: `ev` points at a reserved ring-buffer slot of the right size.
    unsafe {
        (*ev).hdr = header(KIND_CUDA, FLAG_IN_JOB, tgid, leader_start_ns(task));
        (*ev).op = op;
        (*ev).result = result;
        (*ev).tid = pid_tgid as u32;
        (*ev).device = device;
        (*ev).size = size;
        (*ev).ptr = ptr;
        (*ev).handle = handle;
        (*ev).aux = aux;
        (*ev).entry_ns = p.entry_ns;
        (*ev).comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    }
    entry.submit(crate::lazy());
    Ok(0)
}

/// One entry and one return program per call. The op is a constant in
/// each, so the compiler keeps only that call's branch of the decoding.
/// The loader attaches `_ptsz` variants to their base call's programs.
macro_rules! cuda_probe {
    ($entry:ident, $ret:ident, $op:expr) => {
        #[uprobe]
        pub fn $entry(ctx: ProbeContext) -> u32 {
            match try_cuda_entry(&ctx, $op, stringify!($entry)) {
                Ok(r) | Err(r) => r,
            }
        }

        #[uretprobe]
        pub fn $ret(ctx: RetProbeContext) -> u32 {
            match try_cuda_return(&ctx, $op, stringify!($ret)) {
                Ok(r) | Err(r) => r,
            }
        }
    };
}

cuda_probe!(cu_init, cu_init_ret, CU_INIT);
cuda_probe!(
    cu_primary_ctx_retain,
    cu_primary_ctx_retain_ret,
    CU_PRIMARY_CTX_RETAIN
);
cuda_probe!(cu_ctx_create_v2, cu_ctx_create_v2_ret, CU_CTX_CREATE_V2);
cuda_probe!(cu_ctx_create_v3, cu_ctx_create_v3_ret, CU_CTX_CREATE_V3);
cuda_probe!(cu_ctx_create_v4, cu_ctx_create_v4_ret, CU_CTX_CREATE_V4);
cuda_probe!(cu_mem_alloc, cu_mem_alloc_ret, CU_MEM_ALLOC);
cuda_probe!(cu_mem_free, cu_mem_free_ret, CU_MEM_FREE);
cuda_probe!(
    cu_mem_alloc_async,
    cu_mem_alloc_async_ret,
    CU_MEM_ALLOC_ASYNC
);
cuda_probe!(cu_mem_free_async, cu_mem_free_async_ret, CU_MEM_FREE_ASYNC);
cuda_probe!(
    cu_mem_alloc_from_pool,
    cu_mem_alloc_from_pool_ret,
    CU_MEM_ALLOC_FROM_POOL
);
cuda_probe!(
    cu_mem_alloc_managed,
    cu_mem_alloc_managed_ret,
    CU_MEM_ALLOC_MANAGED
);
cuda_probe!(cu_mem_alloc_host, cu_mem_alloc_host_ret, CU_MEM_ALLOC_HOST);
cuda_probe!(cu_mem_host_alloc, cu_mem_host_alloc_ret, CU_MEM_HOST_ALLOC);
cuda_probe!(cu_mem_free_host, cu_mem_free_host_ret, CU_MEM_FREE_HOST);
cuda_probe!(
    cu_mem_host_register,
    cu_mem_host_register_ret,
    CU_MEM_HOST_REGISTER
);
cuda_probe!(
    cu_mem_host_unregister,
    cu_mem_host_unregister_ret,
    CU_MEM_HOST_UNREGISTER
);
cuda_probe!(cu_mem_create, cu_mem_create_ret, CU_MEM_CREATE);
cuda_probe!(cu_mem_release, cu_mem_release_ret, CU_MEM_RELEASE);
cuda_probe!(cu_mem_map, cu_mem_map_ret, CU_MEM_MAP);
cuda_probe!(cu_mem_unmap, cu_mem_unmap_ret, CU_MEM_UNMAP);

// ------------------------------------------------------------------ Xid

/// `nvidia:nvidia_dev_xid(const struct pci_dev *pdev, uint32_t error_code,
/// const char *msg)` (kernel-open/nvidia/nv-tracepoint.h, driver 575+).
/// Machine-wide: an Xid is about the GPU, whichever process it names.
#[tracepoint]
pub fn nvidia_dev_xid(ctx: TracePointContext) -> u32 {
    match try_nvidia_dev_xid(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

/// Reads a `__data_loc char[]` field (offset in the low 16 bits).
#[inline(always)]
fn data_loc_str(ctx: &TracePointContext, field: i64, buf: &mut [u8]) -> u32 {
    if field < 0 {
        return 0;
    }
    // SAFETY: the offset comes from this kernel's format file.
    let Ok(loc) = (unsafe { ctx.read_at::<u32>(field as usize) }) else {
        return 0;
    };
    let src = ctx.as_ptr() as u64 + (loc & 0xffff) as u64;
    // SAFETY: __data_loc points inside this record; the read is bounded by
    // the buffer.
    match unsafe { bpf_probe_read_kernel_str_bytes(src as *const u8, buf) } {
        Ok(s) => s.len() as u32,
        Err(_) => 0,
    }
}

fn try_nvidia_dev_xid(ctx: &TracePointContext) -> Result<u32, u32> {
    let code_off = gpu_conf(addr_of!(GPU_CONFIG.xid_code));
    let code: u32 = if code_off >= 0 {
        // SAFETY: offset from the format file.
        unsafe { ctx.read_at::<u32>(code_off as usize) }.unwrap_or(0)
    } else {
        0
    };
    let Some(mut entry) = EVENTS.reserve::<XidEvent>(0) else {
        count_lost(KIND_XID, "nvidia_dev_xid");
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: reserved slot; each string read is bounded by its buffer.
    unsafe {
        (*ev).hdr = header(KIND_XID, 0, tgid, 0);
        (*ev).code = code;
        let dev = &mut *core::ptr::addr_of_mut!((*ev).dev);
        *dev = [0; XID_DEV_LEN];
        data_loc_str(ctx, gpu_conf(addr_of!(GPU_CONFIG.xid_dev)), dev);
        let msg = &mut *core::ptr::addr_of_mut!((*ev).msg);
        *msg = [0; XID_MSG_LEN];
        (*ev).msg_len = data_loc_str(ctx, gpu_conf(addr_of!(GPU_CONFIG.xid_msg)), msg);
    }
    entry.submit(crate::lazy());
    Ok(0)
}

// --------------------------------------------------- driver host pages

/// `nv_alloc_pages(nv_state_t *nv, NvU32 page_count, ...)` and
/// `nv_free_pages(nv_state_t *nv, NvU32 page_count, ...)`
/// (kernel-open/nvidia/nv.c): the driver's own host pages, which the memory
/// cgroup may never see. Attached only where the kernel has kprobes and the
/// module exports the symbol; elsewhere these at least pass the verifier.
#[kprobe]
pub fn nv_alloc_pages(ctx: ProbeContext) -> u32 {
    match try_nv_pages(&ctx, NV_PAGES_ALLOC) {
        Ok(r) | Err(r) => r,
    }
}

#[kprobe]
pub fn nv_free_pages(ctx: ProbeContext) -> u32 {
    match try_nv_pages(&ctx, NV_PAGES_FREE) {
        Ok(r) | Err(r) => r,
    }
}

fn try_nv_pages(ctx: &ProbeContext, op: u32) -> Result<u32, u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !in_job(tgid) {
        return Ok(0);
    }
    let page_count: u32 = ctx.arg(1).unwrap_or(0);
    let Some(mut entry) = EVENTS.reserve::<NvPagesEvent>(0) else {
        let prog = if op == NV_PAGES_ALLOC {
            "nv_alloc_pages"
        } else {
            "nv_free_pages"
        };
        count_lost(KIND_NV_PAGES, prog);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(KIND_NV_PAGES, FLAG_IN_JOB, tgid, leader_start_ns(task));
        (*ev).op = op;
        (*ev).page_count = page_count;
        (*ev).tid = pid_tgid as u32;
        (*ev)._pad = 0;
    }
    entry.submit(crate::lazy());
    Ok(0)
}
