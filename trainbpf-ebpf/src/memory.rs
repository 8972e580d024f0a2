//! Memory growth of every process, aggregated per process in the kernel: a
//! record leaves only when a process's memory moved by a threshold, never
//! one per fault. Where the page probes (`pages.rs`) can't attach,
//! `rss_stat` feeds it; both end in [`maybe_emit`].

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use trainbpf_common::*;

use crate::{
    count_lost, header, in_job, job_flag, lazy,
    maps::{EVENTS, ProcState, RSS_CACHE},
    procs, rd, rd_comm,
    rss::{read_counter, read_counters},
    task_memcg_id,
};

/// The state of the current process, created on first sight.
#[inline(always)]
fn proc_state(tgid: u32, task: u64, mm: u64, now: u64) -> Option<*mut ProcState> {
    let pid = bpf_get_current_pid_tgid() as u32;
    procs::get_or_create(&procs::key_of(task, tgid, pid), task, mm, now, "rss_stat")
}

#[inline(always)]
fn abs(v: i64) -> i64 {
    if v < 0 { -v } else { v }
}

/// `rss_stat(struct mm_struct *mm, int member)` (6.2+; older kernels pass a
/// third `long count`, which is not read). Fires on every RSS counter change:
/// the program only updates the per-process state and compares. Attached
/// only where the page probes are missing: they read the counters instead.
#[btf_tracepoint(function = "rss_stat")]
pub fn rss_stat(ctx: BtfTracePointContext) -> u32 {
    match try_rss_stat(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_rss_stat(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let mm: u64 = ctx.arg(0);
    let member: i32 = ctx.arg(1);
    if !(0..NR_MM_COUNTERS as i32).contains(&member) {
        return Ok(0);
    }
    let member = member as usize & (NR_MM_COUNTERS - 1);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let value = read_counter(mm, member);
    let slot = RSS_CACHE.get_ptr_mut(0);
    if let Some(c) = slot {
        // SAFETY: this CPU's slot; the tracepoint runs with preemption off.
        // The mm was the current process's when the slot was filled, and a
        // tgid keeps its mm until exec, which makes a new one.
        unsafe {
            // The counter did not move since this CPU last looked: nothing
            // to tell, and no clock read. (A heartbeat that fell due waits
            // for the next move, a few of the process's changes away: the
            // kernel's per-CPU counter moves once per 32 or so.)
            if (*c).mm == mm && (*c).tgid == tgid && (*c).seen[member] == value {
                return Ok(0);
            }
        }
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    // Another process's mm (exit teardown, khugepaged, remote GUP): its owner
    // reports it on its own next change.
    let cur_mm: u64 = rd(task, conf!(task_mm))?;
    if cur_mm != mm {
        return Ok(0);
    }
    let st = proc_state(tgid, task, mm, now).ok_or(0u32)?;
    // SAFETY: `st` points into a map value; races between threads of one
    // process can only duplicate or delay a record, never corrupt one.
    unsafe { (*st).cur[member] = value };
    maybe_emit(st, task, mm, tgid, now, "rss_stat");
    if let Some(c) = slot {
        // SAFETY: this CPU's slot, as above; `st` is a live map value.
        unsafe {
            (*c).mm = mm;
            (*c).tgid = tgid;
            (*c).seen = (*st).cur;
        }
    }
    Ok(0)
}

/// The larger of the fixed threshold and the relative one, in pages.
#[inline(always)]
fn threshold_for(total: i64) -> i64 {
    let mut threshold = conf!(rss_threshold_pages);
    let shift = conf!(rss_relative_shift);
    if shift > 0 && shift < 63 && total > 0 {
        let rel = total >> shift;
        if rel > threshold {
            threshold = rel;
        }
    }
    threshold
}

/// How far the process's figures moved since its last record, in pages:
/// the largest of its RSS counters' move, its net allocations' and its
/// page cache's. RSS and net allocations usually move together (a fault
/// allocates the page it maps): the larger move, not the sum, or steady
/// growth would send twice the records. A reader's page cache moves
/// neither: it is shown too.
///
/// # Safety
/// `st` points into a live map value.
#[inline(always)]
unsafe fn moved(st: *mut ProcState) -> i64 {
    // SAFETY: the caller's.
    unsafe {
        let cur = (*st).cur;
        let rep = (*st).reported;
        let cache = (*st).cache_added_pages as i64 - (*st).cache_removed_pages as i64;
        let net = (*st).alloc_pages as i64 - (*st).freed_pages as i64 - cache;
        let rss_moved = abs(cur[0] - rep[0])
            + abs(cur[1] - rep[1])
            + abs(cur[2] - rep[2])
            + abs(cur[3] - rep[3]);
        let net_moved = abs(net - (*st).reported_net);
        let cache_moved = abs(cache - (*st).reported_cache);
        let mut moved = if rss_moved > net_moved {
            rss_moved
        } else {
            net_moved
        };
        if cache_moved > moved {
            moved = cache_moved;
        }
        moved
    }
}

/// Sends a MemEvent when the process's RSS counters or its net page
/// allocations moved by the threshold since the last record, or moved at
/// all once the heartbeat passed. `prog` names the program, for the log.
#[inline(always)]
pub(crate) fn maybe_emit(
    st: *mut ProcState,
    task: u64,
    mm: u64,
    tgid: u32,
    now: u64,
    prog: &'static str,
) {
    // SAFETY: `st` points into a live map value (see try_rss_stat).
    unsafe {
        let moved = moved(st);
        if moved == 0 {
            return;
        }
        let cur = (*st).cur;
        let rep = (*st).reported;
        let threshold = threshold_for(cur[MM_FILEPAGES] + cur[MM_ANONPAGES] + cur[MM_SHMEMPAGES]);
        let since = now.wrapping_sub((*st).last_emit_ns);
        let heartbeat = since >= conf!(heartbeat_ns) as u64;
        let first = rep[0] == 0 && rep[1] == 0 && rep[2] == 0 && rep[3] == 0;
        if moved < threshold && !heartbeat {
            return;
        }
        // A process that churns (allocates and frees a big buffer every
        // step) crosses the threshold both ways many times a second: space
        // its records out, unless the move is large. Not the job's own: its
        // figures at a kill must be as fresh as the threshold allows.
        if !first && since < conf!(min_interval_ns) as u64 && moved < threshold * 8 && !in_job(tgid)
        {
            return;
        }
        let reason = if first {
            MEM_REASON_FIRST
        } else if moved >= threshold {
            MEM_REASON_THRESHOLD
        } else {
            MEM_REASON_HEARTBEAT
        };
        emit(st, task, mm, tgid, now, reason, prog);
    }
}

/// A job process's last thread is exiting, its memory not yet freed (since
/// Linux 6.16 `sched_process_exit` fires before `exit_mm`; before, the mm
/// is gone and nothing is sent): one last record when its figures moved
/// since the one before. Its figures are then its final ones, not those of
/// its last threshold crossing, which a worker that stops growing and exits
/// later left up to a threshold behind (16 MiB at 1 GiB). The caller has
/// added this CPU's held pages to `st` (`pages::fold_pages_of`).
#[inline(always)]
pub(crate) fn emit_at_exit(st: *mut ProcState, task: u64, mm: u64, tgid: u32) {
    // SAFETY: `st` points into a live map value; the helper has no
    // preconditions.
    unsafe {
        (*st).cur = read_counters(mm);
        if moved(st) == 0 {
            return;
        }
        emit(
            st,
            task,
            mm,
            tgid,
            bpf_ktime_get_ns(),
            MEM_REASON_EXIT,
            "sched_exit",
        );
    }
}

/// Sends the process's record, `reason` its `MemEvent::reason`. The pages
/// this CPU held for the process are in `st` already: the page path adds
/// them before it reads the counters, the exit before it calls; where
/// `rss_stat` feeds this, no CPU holds any.
///
/// # Safety
/// `st` points into a live map value.
#[inline(always)]
unsafe fn emit(
    st: *mut ProcState,
    task: u64,
    mm: u64,
    tgid: u32,
    now: u64,
    reason: u32,
    prog: &'static str,
) {
    // SAFETY: the caller's.
    unsafe {
        let cache = (*st).cache_added_pages as i64 - (*st).cache_removed_pages as i64;
        let net = (*st).alloc_pages as i64 - (*st).freed_pages as i64 - cache;
        let Some(mut entry) = EVENTS.reserve::<MemEvent>(0) else {
            count_lost(KIND_MEM, prog);
            return;
        };
        let fresh = read_counters(mm);
        let ev = entry.as_mut_ptr();
        let signal: u64 = rd(task, conf!(task_signal)).unwrap_or(0);
        let adj: i16 = rd(signal, conf!(signal_oom_score_adj)).unwrap_or(0);
        (*ev).hdr = header(KIND_MEM, job_flag(tgid), tgid, (*st).start_ns);
        (*ev).counters = fresh;
        // No longer counted: a probe on every user fault cost the job more
        // than any report used the count for.
        (*ev).faults = 0;
        (*ev).reason = reason;
        (*ev).oom_score_adj = adj as i32;
        // The process's name is its group leader's: the thread that happens
        // to allocate may be a runtime's helper (`cuda-EvtHandlr`, seen
        // naming a trainer on an H200).
        let leader: u64 = rd(task, conf!(task_group_leader)).unwrap_or(task);
        (*ev).comm = rd_comm(leader);
        (*ev).pgtables_bytes = rd(mm, conf!(mm_pgtables_bytes)).unwrap_or(0);
        (*ev).memcg_id = task_memcg_id(task);
        (*ev).stall_ns = (*st).stall_ns;
        (*ev).alloc_pages = (*st).alloc_pages;
        (*ev).freed_pages = (*st).freed_pages;
        (*ev).cache_added_pages = (*st).cache_added_pages;
        (*ev).cache_removed_pages = (*st).cache_removed_pages;
        entry.submit(lazy());
        (*st).cur = fresh;
        (*st).reported = fresh;
        (*st).reported_net = net;
        (*st).reported_cache = cache;
        (*st).last_emit_ns = now;
    }
}
