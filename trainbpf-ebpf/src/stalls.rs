//! Allocation stalls: direct reclaim, memcg reclaim and compaction, timed
//! per task.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::addr_of_mut,
};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::HashMap,
    programs::BtfTracePointContext,
};
use trainbpf_common::*;

use crate::{COUNTERS, procs, rd};

/// When each task (by pid) entered a reclaim or compaction stall.
#[map]
static STALL_START: HashMap<u32, u64> = HashMap::with_max_entries(8192, 0);


/// Entering direct reclaim, memcg reclaim or compaction: remember when, per
/// task. Kernel threads (kswapd, kcompactd) reclaim in the background and
/// stall nobody, so they are left out.
#[inline(always)]
fn stall_begin() -> u32 {
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    if rd::<u64>(task, conf!(task_mm)).unwrap_or(0) == 0 {
        return 0;
    }
    let pid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = STALL_START.insert(&pid, &now, 0);
    0
}

/// Leaving it: add the time to the process and to the per-CPU totals.
#[inline(always)]
fn stall_end(kind: usize) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = pid_tgid as u32;
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { STALL_START.get(&pid) }).copied() else {
        return 0;
    };
    let _ = STALL_START.remove(&pid);
    // SAFETY: helper without preconditions.
    let d = unsafe { bpf_ktime_get_ns() }.wrapping_sub(start);
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        let k = kind & 3;
        // SAFETY: per-CPU slot, this CPU only.
        unsafe {
            (*c).stall_ns[k] += d;
            (*c).stall_count[k] += 1;
        }
    }
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    if let Some(st) = procs::get(&procs::key_of(task, tgid, pid)) {
        // SAFETY: aligned u64 inside a live map value.
        unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*st).stall_ns), d)
        };
    }
    0
}

#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_begin")]
pub fn direct_reclaim_begin(_ctx: BtfTracePointContext) -> u32 {
    stall_begin()
}

#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_end")]
pub fn direct_reclaim_end(_ctx: BtfTracePointContext) -> u32 {
    stall_end(STALL_DIRECT_RECLAIM)
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_begin")]
pub fn memcg_reclaim_begin(_ctx: BtfTracePointContext) -> u32 {
    stall_begin()
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_end")]
pub fn memcg_reclaim_end(_ctx: BtfTracePointContext) -> u32 {
    stall_end(STALL_MEMCG_RECLAIM)
}

#[btf_tracepoint(function = "mm_compaction_begin")]
pub fn compaction_begin(_ctx: BtfTracePointContext) -> u32 {
    stall_begin()
}

#[btf_tracepoint(function = "mm_compaction_end")]
pub fn compaction_end(_ctx: BtfTracePointContext) -> u32 {
    stall_end(STALL_COMPACTION)
}

