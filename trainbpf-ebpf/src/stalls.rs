//! Sections of a thread's life whose pages are not its process's: direct
//! reclaim, memcg reclaim and compaction (they free other processes' memory
//! and cache, and migrate pages without allocating them). Each thread
//! inside one has an entry in [`INSIDE`]; the page probes look it up only
//! while some thread is inside one (`procs::inside()`), and every entry and
//! exit bumps the epoch so that the per-CPU page caches ask again.
//!
//! Reclaim and compaction are also timed: the allocation stalls.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::addr_of_mut,
};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use trainbpf_common::*;

use crate::{
    maps::{COUNTERS, INSIDE, Inside},
    procs, rd,
};

/// `inside` bits: in reclaim or compaction. (Forks are not bracketed: no
/// tracepoint fires before `copy_process` allocates, and the fork syscalls'
/// tracepoints would put every syscall on the machine on the traced path,
/// 50-60 ns each; `sched_process_fork` takes the child's page tables out
/// instead.)
pub(crate) const IN_STALL: u32 = 1;

/// `IN_*` bits of the current thread; 0 at the cost of one load while no
/// thread on the machine is inside anything.
#[inline(always)]
pub(crate) fn inside(pid: u32) -> u32 {
    if procs::inside() == 0 {
        return 0;
    }
    // SAFETY: copied out at once.
    match unsafe { INSIDE.get(&pid) } {
        Some(i) if i.stall_depth > 0 => IN_STALL,
        Some(_) => 0,
        None => 0,
    }
}

/// A thread enters a section. Kernel threads (kswapd, kcompactd) are left
/// out: they stall nobody and their pages count for nobody anyway.
#[inline(always)]
fn enter(prog: &'static str) -> u32 {
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    if rd::<u64>(task, conf!(task_mm)).unwrap_or(0) == 0 {
        return 0;
    }
    let pid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    match INSIDE.get_ptr_mut(&pid) {
        // Only this thread touches its entry: no race.
        // SAFETY: a live map value.
        Some(i) => unsafe { (*i).stall_depth += 1 },
        None => {
            let i = Inside {
                stall_start_ns: now,
                stall_depth: 1,
                _pad: 0,
            };
            // Full: the thread's pages are counted as its own, as before.
            if INSIDE.insert(&pid, &i, 0).is_err() {
                klog!(
                    warn,
                    crate::klog::SITE_INSIDE_FULL,
                    prog,
                    "INSIDE full: thread {}'s reclaim or compaction not bracketed, its pages there count as its own ({} on this CPU)",
                    pid
                );
                return 0;
            }
            procs::state_add(procs::inside_of, 1);
        }
    }
    procs::state_add(procs::epoch_of, 1);
    0
}

/// A thread leaves a section; returns how long the stall lasted (0 while
/// still nested).
#[inline(always)]
fn leave() -> u64 {
    let pid = bpf_get_current_pid_tgid() as u32;
    let Some(i) = INSIDE.get_ptr_mut(&pid) else {
        return 0;
    };
    // SAFETY: a live map value, this thread's only; the clock helper has
    // no preconditions.
    let took = unsafe {
        if (*i).stall_depth > 1 {
            (*i).stall_depth -= 1;
            return 0;
        }
        bpf_ktime_get_ns().wrapping_sub((*i).stall_start_ns)
    };
    if INSIDE.remove(&pid).is_ok() {
        procs::state_add(procs::inside_of, u64::MAX); // -1
    }
    procs::state_add(procs::epoch_of, 1);
    took
}

/// Leaving a stall: add the time to the process and to the per-CPU totals.
#[inline(always)]
fn stall_end(kind: usize) -> u32 {
    let d = leave();
    if d == 0 {
        return 0;
    }
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        let k = kind & 3;
        // SAFETY: per-CPU slot, this CPU only.
        unsafe {
            (*c).stall_ns[k] += d;
            (*c).stall_count[k] += 1;
        }
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
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
    enter("direct_reclaim_begin")
}

#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_end")]
pub fn direct_reclaim_end(_ctx: BtfTracePointContext) -> u32 {
    stall_end(STALL_DIRECT_RECLAIM)
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_begin")]
pub fn memcg_reclaim_begin(_ctx: BtfTracePointContext) -> u32 {
    enter("memcg_reclaim_begin")
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_end")]
pub fn memcg_reclaim_end(_ctx: BtfTracePointContext) -> u32 {
    stall_end(STALL_MEMCG_RECLAIM)
}

#[btf_tracepoint(function = "mm_compaction_begin")]
pub fn compaction_begin(_ctx: BtfTracePointContext) -> u32 {
    enter("compaction_begin")
}

#[btf_tracepoint(function = "mm_compaction_end")]
pub fn compaction_end(_ctx: BtfTracePointContext) -> u32 {
    stall_end(STALL_COMPACTION)
}
