//! Pages allocated and freed in each process's own context
//! (`mm_page_alloc`, `mm_page_free`), batched per CPU, and the reads of its
//! RSS counters at the end of each batch.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::addr_of_mut,
};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::PerCpuArray,
    programs::BtfTracePointContext,
};

use crate::{
    PF_EXITING, maybe_emit,
    procs::{self, ProcKey, ProcState},
    rd, read_counters,
};

/// Pages allocated and freed by one process on this CPU since they were last
/// added to its `PROCS` entry. mm_page_alloc and mm_page_free fire for every
/// page, several times per user fault; a hash lookup and two atomic adds on
/// each cost the job about 7% in a fault storm, while this per-CPU slot's
/// lookup the verifier inlines. A process's own pages land in `PROCS` every
/// [`PAGE_BATCH`] pages, or when another process allocates on this CPU.
#[map]
static PAGE_CACHE: PerCpuArray<PageCache> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct PageCache {
    tgid: u32,
    /// 1 while the pages belong to a process with a `PROCS` entry: the
    /// process and its group leader's start time below. 0 for a slot that
    /// counts nothing: a kernel thread's (no mm, no process), or an exiting
    /// thread's (freeing its memory on the way out, page by page).
    valid: u32,
    /// The thread a slot that counts nothing was made for: another thread
    /// of the same process may still be alive and allocating.
    owner_pid: u32,
    _pad: u32,
    /// The owner's `ProcState::start_ns`: with the tgid, its `PROCS` key.
    start_ns: u64,
    /// `procs::epoch()` when the slot was filled: a process has exited
    /// since when it moved, and the tgid may name another process now.
    epoch: u64,
    alloc: u64,
    freed: u64,
}

/// Pages (allocated plus freed) a CPU holds for a process before adding them
/// to its `PROCS` entry, reading its RSS and testing the threshold: a
/// quarter of the record threshold (4 MiB is 1024 pages), so a record
/// leaves at most this late. Each batch's end (a hash lookup, six kernel
/// reads, the clock) cost a fork storm 10 ns a page at 64.
const PAGE_BATCH: u64 = 256;
/// With a page table among them, the batch ends at this many pages: a
/// process that maps what it did not allocate (a cached file, shared
/// memory) allocates little else, and its RSS is read every 16 MiB it maps.
/// Not at each page table: a fork allocates the child's page tables in the
/// parent's context, 512 a GiB it holds, and the parent's RSS does not move.
const PAGE_TABLE_BATCH: u64 = 8;

/// A tgid no process has (pids stop at 2^22): an empty slot.
const NO_TGID: u32 = u32::MAX;

/// Adds a CPU's held pages to their process's entry, if that entry is still
/// the same process. Returns the entry when it was.
#[inline(always)]
fn fold_pages(c: *mut PageCache) -> Option<*mut ProcState> {
    // SAFETY: `c` is this CPU's slot: other CPUs have their own, and the
    // tracepoint runs with preemption off. A page program that an interrupt
    // nests inside this one may lose its pages to the outer one's store:
    // rare, and a page or two.
    unsafe {
        if (*c).valid == 0 {
            return None;
        }
        let (alloc, freed) = ((*c).alloc, (*c).freed);
        (*c).alloc = 0;
        (*c).freed = 0;
        let key = ProcKey {
            tgid: (*c).tgid,
            _pad: 0,
            start_ns: (*c).start_ns,
        };
        let st = match procs::get(&key) {
            Some(st) => st,
            // It exited (its pages after its exit record are not wanted).
            // The slot empties, so the next page asks afresh whose it is.
            None => {
                (*c).tgid = NO_TGID;
                (*c).valid = 0;
                return None;
            }
        };
        if alloc != 0 {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                addr_of_mut!((*st).alloc_pages),
                alloc,
            );
        }
        if freed != 0 {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                addr_of_mut!((*st).freed_pages),
                freed,
            );
        }
        Some(st)
    }
}

/// Before a record, an exit or a fork reads or drops a process's page counts:
/// adds this CPU's held pages when they are `tgid`'s, so that the record
/// carries them. Other CPUs' pages follow at their next batch.
#[inline(always)]
pub(crate) fn fold_pages_of(tgid: u32, start_ns: u64) {
    if let Some(c) = PAGE_CACHE.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, as in fold_pages.
        if unsafe { (*c).tgid == tgid && (*c).start_ns == start_ns } {
            fold_pages(c);
        }
    }
}

/// Empties this CPU's slot when it holds the process's pages: at its exit.
#[inline(always)]
pub(crate) fn drop_pages_of(key: &ProcKey) {
    if let Some(c) = PAGE_CACHE.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, as in fold_pages.
        unsafe {
            if (*c).tgid == key.tgid && (*c).start_ns == key.start_ns {
                (*c).tgid = NO_TGID;
                (*c).valid = 0;
                (*c).alloc = 0;
                (*c).freed = 0;
            }
        }
    }
}

/// Pages allocated or freed in the current process's context. A
/// copy-on-write break allocates a page without moving any RSS counter (a
/// shared page is swapped for a private one), so only this sees what a
/// forked worker really adds; a fork allocates nothing for the child's
/// inherited pages, so it does not count as the child's growth.
///
/// It is also where the process's RSS counters are read: at the end of each
/// batch of its pages, which ends sooner with a page table in it (one per
/// 2 MiB the process maps, whether or not it allocated what it maps: a
/// cached file, another process's shared memory). A probe on every
/// RSS counter change (`rss_stat`) would see each move, but it runs on every
/// fault beside this one, and three programs per fault cost a fork storm
/// over 5%; it is kept for kernels where these two tracepoints are missing.
#[inline(always)]
fn account_pages(order: u32, freed: bool, page_table: bool) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let pid = pid_tgid as u32;
    let Some(c) = PAGE_CACHE.get_ptr_mut(0) else {
        return 0;
    };
    let pages = 1u64 << (order & 15);
    let epoch = procs::epoch();
    // SAFETY: this CPU's slot, as in fold_pages.
    unsafe {
        if (*c).tgid == tgid
            && (*c).epoch == epoch
            && ((*c).valid != 0 || (*c).owner_pid == pid)
        {
            // The common case: the same process allocates again (or the
            // same thread that counts nothing: a kernel thread, or one
            // exiting, whose thousands of frees cost a compare each). No
            // process exited since the slot was filled, so the tgid still
            // names the same process.
            if (*c).valid == 0 {
                return 0;
            }
            if freed {
                (*c).freed += pages;
            } else {
                (*c).alloc += pages;
            }
            let held = (*c).alloc + (*c).freed;
            if held < PAGE_BATCH && !(page_table && held >= PAGE_TABLE_BATCH) {
                return 0;
            }
            let Some(st) = fold_pages(c) else {
                return 0;
            };
            check_growth(st, tgid);
            return 0;
        }
        // Another process (or another thread of one whose slot counts
        // nothing, or a process exited somewhere since): the previous
        // owner's pages go to its entry (its threshold is tested at its own
        // next batch, where its task is at hand), and the slot starts over
        // for this one.
        fold_pages(c);
        (*c).tgid = NO_TGID;
        (*c).valid = 0;
        (*c).epoch = epoch;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = rd(task, conf!(task_mm)).unwrap_or(0);
    // A kernel thread (no process to track), or an exiting one (its entry
    // is on its way out, and a new one would outlive it): the slot
    // remembers the thread (not the process: another thread of it may
    // still live), so its next pages cost a compare.
    let flags: u32 = rd(task, conf!(task_flags)).unwrap_or(0);
    if mm == 0 || flags & PF_EXITING != 0 {
        // SAFETY: this CPU's slot.
        unsafe {
            (*c).tgid = tgid;
            (*c).owner_pid = pid;
        };
        return 0;
    }
    let key = procs::key_of(task, tgid, pid);
    // Whether to read its RSS now: a new entry, or a batch's worth of
    // pages piled up since the last read.
    let look;
    let st = match procs::get(&key) {
        Some(st) => {
            // Back on this CPU after another process had it: its pages
            // were folded in at the switch, without a look at its RSS (its
            // task was not at hand). Processes that take turns on a CPU
            // (workers, a main process) may never fill a batch in one
            // stretch, so the look happens here once a batch's worth piled
            // up across stretches and CPUs.
            // SAFETY: `st` points into a live map value.
            let pending = unsafe {
                ((*st).alloc_pages + (*st).freed_pages).wrapping_sub((*st).checked_pages)
            };
            look = pending >= PAGE_BATCH;
            st
        }
        // A forked worker's first copy-on-write breaks move no RSS counter,
        // so its state may not exist yet: make it here, or those pages go
        // uncounted.
        None => {
            // SAFETY: helper without preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            let Some(st) = procs::get_or_create(&key, task, mm, now) else {
                // No room (counted): the thread's next pages on this CPU
                // cost a compare, not another failed insert each.
                // SAFETY: this CPU's slot.
                unsafe {
                    (*c).tgid = tgid;
                    (*c).owner_pid = pid;
                };
                return 0;
            };
            look = true;
            st
        }
    };
    // SAFETY: this CPU's slot; `st` points into a live map value.
    unsafe {
        (*c).tgid = tgid;
        (*c).valid = 1;
        (*c).start_ns = key.start_ns;
        if freed {
            (*c).freed = pages;
        } else {
            (*c).alloc = pages;
        }
    }
    // A new process is looked at on its first page, so that it sends its
    // whole footprint once: a forked worker that only reads what it
    // inherited may never fill a batch, yet its RSS (the parent's, shared)
    // is what the OOM killer would score.
    if look {
        check_growth(st, tgid);
    }
    0
}

/// After a batch was added to the current process's entry: reads its RSS
/// counters, and sends a record when they or its net allocations moved by
/// the threshold (or at all, once the heartbeat passed).
#[inline(always)]
fn check_growth(st: *mut ProcState, tgid: u32) {
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = rd(task, conf!(task_mm)).unwrap_or(0);
    if mm == 0 {
        return;
    }
    // An exiting process frees everything on its way out: what it held is
    // its last record from before, not a trail down to zero.
    let flags: u32 = rd(task, conf!(task_flags)).unwrap_or(0);
    if flags & PF_EXITING != 0 {
        return;
    }
    // SAFETY: `st` points into a live map value; threads of one process
    // racing here can only duplicate or delay a record.
    unsafe {
        (*st).cur = read_counters(mm);
        (*st).checked_pages = (*st).alloc_pages + (*st).freed_pages;
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    maybe_emit(st, task, mm, tgid, now);
}


/// `__GFP_MOVABLE` and `__GFP_ZERO` (include/linux/gfp_types.h): 0x08 and
/// 0x100 on every kernel with tp_btf (5.5+); 6.8's enum of flag bits kept
/// both where they were.
const GFP_MOVABLE: u32 = 0x08;
const GFP_ZERO: u32 = 0x100;

/// `mm_page_alloc(struct page *page, unsigned int order, gfp_t, int migratetype)`.
#[btf_tracepoint(function = "mm_page_alloc")]
pub fn page_alloc(ctx: BtfTracePointContext) -> u32 {
    let page: u64 = ctx.arg(0);
    if page == 0 {
        return 0; // a failed allocation
    }
    let order: u32 = ctx.arg(1);
    let gfp: u32 = ctx.arg(2);
    // A zeroed page that can't move, one at a time: a page table
    // (GFP_PGTABLE_USER), the one allocation that mapping memory the
    // process did not allocate still makes.
    let page_table = order == 0 && gfp & (GFP_MOVABLE | GFP_ZERO) == GFP_ZERO;
    account_pages(order, false, page_table)
}

/// `mm_page_free(struct page *page, unsigned int order)`.
#[btf_tracepoint(function = "mm_page_free")]
pub fn page_free(ctx: BtfTracePointContext) -> u32 {
    account_pages(ctx.arg::<u32>(1), true, false)
}

