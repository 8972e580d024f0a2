//! Pages allocated and freed in each process's own context
//! (`mm_page_alloc`, `mm_page_free`), batched per CPU, and the reads of its
//! RSS counters at the end of each batch.

use core::ffi::c_void;
use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{addr_of, addr_of_mut},
};

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};

use trainbpf_common::Counters;

use crate::{
    PF_EXITING,
    maps::{COUNTERS, PAGE_CACHE, PageCache, ProcKey, ProcState},
    memory::maybe_emit,
    procs, rd,
    rss::read_counters,
    stacks, stalls,
};

/// What a slot does with its thread's pages.
/// Nothing: a kernel thread's (no mm, no process), an exiting thread's
/// (freeing its memory on the way out, page by page), or a thread inside
/// reclaim or compaction outside the job.
const MODE_NONE: u32 = 0;
/// Counted as the process's (`PROCS`).
const MODE_COUNT: u32 = 1;
/// A job thread inside reclaim or compaction: what it frees there is other
/// processes' memory (or cache), counted in `Counters::reclaim_freed_pages`.
const MODE_RECLAIM: u32 = 2;

/// Pages (allocated plus freed) a CPU holds for a process before adding them
/// to its `PROCS` entry, reading its RSS and testing the threshold: a
/// quarter of the record threshold (4 MiB is 1024 pages), so a record
/// leaves at most this late. Each batch's end (a hash lookup, six kernel
/// reads, the clock) cost a fork storm 10 ns a page at 64.
const PAGE_BATCH: u64 = 256;
/// With a page table among them, the batch ends at this many pages: a
/// process that maps what it did not allocate (a cached file, shared
/// memory) allocates little else, and its RSS is read every 16 MiB it maps.
const PAGE_TABLE_BATCH: u64 = 8;

/// A tgid no process has (pids stop at 2^22): an empty slot.
const NO_TGID: u32 = u32::MAX;

/// What happened to the pages: `account`'s `what`.
pub(crate) const ALLOC: u32 = 0;
pub(crate) const FREE: u32 = 1;
pub(crate) const CACHE_ADD: u32 = 2;
pub(crate) const CACHE_DEL: u32 = 3;
/// Pages the thread allocated for a child it just forked (its page
/// tables): taken back out of its allocations.
pub(crate) const FORK_TABLES: u32 = 4;

/// The program that passes `what`, for the log (a constant where inlined).
#[inline(always)]
fn prog_of(what: u32) -> &'static str {
    match what {
        ALLOC => "page_alloc",
        FREE => "page_free",
        CACHE_ADD => "cache_add",
        CACHE_DEL => "cache_del",
        _ => "sched_fork",
    }
}

/// `check_growth` runs at the end of a batch in any of these, and takes
/// nothing that says which: the per-page path stays as it is.
const PAGE_PROGS: &str = "page_alloc/page_free/cache_add/cache_del";

#[inline(always)]
fn counters_add(f: impl FnOnce(*mut Counters)) {
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        f(c);
    }
}

/// Adds a CPU's held pages to their process's entry, if that entry is still
/// there. Returns the entry when it was.
#[inline(always)]
fn fold_pages(c: *mut PageCache) -> Option<*mut ProcState> {
    // SAFETY: `c` is this CPU's slot: other CPUs have their own, and the
    // tracepoint runs with preemption off. A page program that an interrupt
    // nests inside this one may lose its pages to the outer one's store:
    // rare, and a page or two.
    unsafe {
        if (*c).mode != MODE_COUNT {
            return None;
        }
        let (alloc, freed) = ((*c).alloc, (*c).freed);
        let (added, removed) = ((*c).cache_added, (*c).cache_removed);
        (*c).alloc = 0;
        (*c).freed = 0;
        (*c).cache_added = 0;
        (*c).cache_removed = 0;
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
                (*c).mode = MODE_NONE;
                return None;
            }
        };
        for (field, v) in [
            (addr_of_mut!((*st).alloc_pages), alloc),
            (addr_of_mut!((*st).freed_pages), freed),
            (addr_of_mut!((*st).cache_added_pages), added),
            (addr_of_mut!((*st).cache_removed_pages), removed),
        ] {
            if v != 0 {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(field, v);
            }
        }
        Some(st)
    }
}

/// Before a record reads a process's page counts: adds this CPU's held
/// pages when they are the process's, so that the record carries them.
/// Other CPUs' pages follow at their next batch.
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
                (*c).mode = MODE_NONE;
                (*c).alloc = 0;
                (*c).freed = 0;
                (*c).cache_added = 0;
                (*c).cache_removed = 0;
            }
        }
    }
}

/// Adds pages to a slot that counts them.
#[inline(always)]
fn add(c: *mut PageCache, what: u32, pages: u64) {
    // SAFETY: this CPU's slot.
    unsafe {
        match what {
            ALLOC => (*c).alloc += pages,
            FREE => (*c).freed += pages,
            CACHE_ADD => (*c).cache_added += pages,
            CACHE_DEL => (*c).cache_removed += pages,
            // Counted among its allocations a moment ago (by this thread,
            // in this slot or folded from it), so the entry's count stays
            // above it; the slot's may wrap below zero until it is folded
            // (the batch ends at once), which the atomic add undoes.
            _ => {
                (*c).alloc = (*c).alloc.wrapping_sub(pages);
                counters_add(|k| (*k).fork_pages += pages);
            }
        }
    }
}

/// Pages of a thread that are not its process's: counted apart.
#[inline(always)]
fn add_elsewhere(mode: u32, what: u32, pages: u64) {
    if mode == MODE_RECLAIM && what == FREE {
        // SAFETY: per-CPU slot, this CPU only.
        counters_add(|k| unsafe { (*k).reclaim_freed_pages += pages });
    }
}

/// Pages allocated, freed, or added to or removed from the page cache in
/// the current process's context (`sp`: where the program's context lies,
/// on the stack it runs on). A copy-on-write break allocates a page without
/// moving any RSS counter (a shared page is swapped for a private one), so
/// only this sees what a forked worker really adds; a fork allocates
/// nothing for the child's inherited pages, so it does not count as the
/// child's growth.
///
/// Not the task's, so not counted as its: pages in an interrupt (the frame
/// is not on the task's stack), in reclaim or compaction (other processes'
/// memory freed, pages migrated), and a forked child's page tables
/// (`FORK_TABLES`, taken back at `sched_process_fork`).
///
/// It is also where the process's RSS counters are read: at the end of each
/// batch of its pages, which ends sooner with a page table in it (one per
/// 2 MiB the process maps, whether or not it allocated what it maps: a
/// cached file, another process's shared memory). A probe on every
/// RSS counter change (`rss_stat`) would see each move, but it runs on every
/// fault beside this one, and three programs per fault cost a fork storm
/// over 5%; it is kept for kernels where these two tracepoints are missing.
#[inline(always)]
pub(crate) fn account<const STACKS: bool>(
    what: u32,
    pages: u64,
    page_table: bool,
    ctx: *mut c_void,
) -> u32 {
    let Some(c) = PAGE_CACHE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot. Arithmetic on the context pointer itself
    // is refused; a number read back from a map is not.
    let sp = unsafe {
        core::ptr::write_volatile(addr_of_mut!((*c).sp), ctx as u64);
        core::ptr::read_volatile(addr_of!((*c).sp))
    };
    let epoch = procs::epoch();
    // SAFETY: this CPU's slot, as in fold_pages.
    unsafe {
        if (*c).epoch == epoch && sp.wrapping_sub((*c).stack_lo) < (*c).stack_size {
            // The common case: the same thread, on its own stack, again;
            // no thread exited or was made, and none entered or left
            // reclaim or compaction since the slot was filled, so the tgid
            // still names the same process and the mode still holds. A
            // kernel stack is one thread's from the task's making to its
            // death, and a new task may get a dead one's stack only after
            // its making moved the epoch (`procs::task_made`): so the stack
            // alone names the thread, with no helper call to ask for its
            // pid.
            let tgid = (*c).tgid;
            let mode = (*c).mode;
            if mode != MODE_COUNT {
                add_elsewhere(mode, what, pages);
                return 0;
            }
            add(c, what, pages);
            let held = (*c).alloc + (*c).freed;
            if held < PAGE_BATCH && !(page_table && held >= PAGE_TABLE_BATCH) {
                return 0;
            }
            let Some(st) = fold_pages(c) else {
                return 0;
            };
            check_growth::<STACKS>(st, tgid, ctx);
            return 0;
        }
    }
    refill::<STACKS>(c, sp, epoch, what, pages, ctx)
}

/// `account`'s slow path: a page of another thread than the slot's, or of
/// the same one after the epoch moved. Works out whose pages these are
/// (an interrupt's, a kernel or exiting thread's, reclaim's, or a process's
/// entry, made on first sight), refills the slot, and counts the page.
#[inline(always)]
fn refill<const STACKS: bool>(
    c: *mut PageCache,
    sp: u64,
    epoch: u64,
    what: u32,
    pages: u64,
    ctx: *mut c_void,
) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let pid = pid_tgid as u32;
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let stack: u64 = rd(task, conf!(task_stack)).unwrap_or(0);
    if stack == 0 && conf!(task_stack) >= 0 {
        klog!(
            warn,
            crate::klog::SITE_STACK,
            prog_of(what),
            "task_struct.stack unreadable at BTF's offset {} (thread {}): its pages can't be told from an interrupt's ({} on this CPU)",
            conf!(task_stack),
            pid
        );
    }
    let size = conf!(thread_size);
    let (stack_lo, stack_size) = if stack != 0 && size > 0 {
        (stack, size as u64)
    } else {
        (0, u64::MAX)
    };
    if sp.wrapping_sub(stack_lo) >= stack_size {
        // An interrupt or softirq (RCU callbacks freeing slabs, network
        // buffers): whoever it interrupted did not ask for it. The slot
        // stays the interrupted thread's.
        // SAFETY: per-CPU slot, this CPU only.
        counters_add(|k| unsafe { (*k).irq_pages += pages });
        return 0;
    }
    // Another thread, or something changed since: the previous owner's
    // pages go to its entry (its threshold is tested at its own next
    // batch, where its task is at hand), and the slot starts over.
    fold_pages(c);
    // SAFETY: this CPU's slot.
    unsafe {
        (*c).tgid = tgid;
        (*c).mode = MODE_NONE;
        (*c).pid = pid;
        (*c).epoch = epoch;
        (*c).stack_lo = stack_lo;
        (*c).stack_size = stack_size;
        (*c).alloc = 0;
        (*c).freed = 0;
        (*c).cache_added = 0;
        (*c).cache_removed = 0;
    }
    let mm: u64 = rd(task, conf!(task_mm)).unwrap_or(0);
    // A kernel thread (no process to track), or an exiting one (its entry
    // is on its way out, and a new one would outlive it): the slot counts
    // nothing for this thread, so its next pages cost a compare.
    let flags: u32 = rd(task, conf!(task_flags)).unwrap_or(0);
    if mm == 0 || flags & PF_EXITING != 0 {
        return 0;
    }
    // Inside reclaim or compaction: not its own pages.
    if stalls::inside(pid) & stalls::IN_STALL != 0 {
        if crate::in_job(tgid) {
            // SAFETY: this CPU's slot.
            unsafe { (*c).mode = MODE_RECLAIM };
            add_elsewhere(MODE_RECLAIM, what, pages);
        }
        return 0;
    }
    let key = procs::key_of(task, tgid, pid);
    // Whether to read its RSS now: a new entry, or a batch's worth of
    // pages piled up since the last read.
    let look;
    let st = match procs::get(&key) {
        Some(st) => {
            // Back on this CPU after another thread had it: its pages
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
            // No room (counted): the slot counts nothing for the thread,
            // so its next pages cost a compare, not a failed insert each.
            let Some(st) = procs::get_or_create(&key, task, mm, now, prog_of(what)) else {
                return 0;
            };
            look = true;
            // A new entry never counted the child's page tables: nothing
            // to take back from it.
            if what == FORK_TABLES {
                // SAFETY: this CPU's slot.
                unsafe {
                    (*c).mode = MODE_COUNT;
                    (*c).start_ns = key.start_ns;
                }
                return 0;
            }
            st
        }
    };
    // SAFETY: this CPU's slot.
    unsafe {
        (*c).mode = MODE_COUNT;
        (*c).start_ns = key.start_ns;
    }
    add(c, what, pages);
    // A new process is looked at on its first page, so that it sends its
    // whole footprint once: a forked worker that only reads what it
    // inherited may never fill a batch, yet its RSS (the parent's, shared)
    // is what the OOM killer would score.
    if look {
        check_growth::<STACKS>(st, tgid, ctx);
    }
    0
}

/// After a batch was added to the current process's entry: reads its RSS
/// counters, and sends a record when they or its net allocations moved by
/// the threshold (or at all, once the heartbeat passed); with `STACKS`
/// (`page_alloc_stacks`), takes the stack at a new high.
#[inline(always)]
fn check_growth<const STACKS: bool>(st: *mut ProcState, tgid: u32, ctx: *mut c_void) {
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
        // This CPU's pages not yet in the entry belong in what is read.
        fold_pages_of(tgid, (*st).start_ns);
        (*st).cur = read_counters(mm);
        (*st).checked_pages = (*st).alloc_pages + (*st).freed_pages;
    }
    if STACKS {
        stacks::sample(ctx, st, tgid);
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    maybe_emit(st, task, mm, tgid, now, PAGE_PROGS);
}

/// `task_newtask(struct task_struct *task, u64 clone_flags)`: in
/// `copy_process`, before the new task can first run, for every kind of
/// task (a fork, a `vfork`, a thread, a kernel or io_uring worker). The
/// page probes are attached only with it: see [`procs::task_made`].
#[btf_tracepoint(function = "task_newtask")]
pub fn task_new(_ctx: BtfTracePointContext) -> u32 {
    procs::task_made();
    0
}

/// A block larger than a PMD (`order` above `PAGE_SHIFT - 3`: 9 with 4 KiB
/// pages) is not a process's memory: no folio a process maps is larger,
/// anonymous, shmem or file. Such blocks pass through the page probes in a
/// process's context when the allocator moves its own free memory (on a VM
/// that reports free pages to its host, 32 blocks of 4 MiB at a time, seen
/// taking 128 MiB off a copy-on-write writer's figure, again and again):
/// counted apart, in `Counters::block_pages`, and nowhere else.
#[inline(always)]
fn outsized(order: u32, pages: u64) -> bool {
    if order <= conf!(max_folio_order) as u32 {
        return false;
    }
    // SAFETY: per-CPU slot, this CPU only.
    counters_add(|k| unsafe { (*k).block_pages += pages });
    true
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
    let pages = 1u64 << (order & 15);
    if outsized(order, pages) {
        return 0;
    }
    // A zeroed page that can't move, one at a time: a page table
    // (GFP_PGTABLE_USER), the one allocation that mapping memory the
    // process did not allocate still makes.
    let page_table = order == 0 && gfp & (GFP_MOVABLE | GFP_ZERO) == GFP_ZERO;
    account::<false>(ALLOC, pages, page_table, ctx.as_ptr())
}

/// `page_alloc` with growth stacks (`record --stacks`): attached in its
/// place, so that with stacks off the page path is the same code as ever.
#[btf_tracepoint(function = "mm_page_alloc")]
pub fn page_alloc_stacks(ctx: BtfTracePointContext) -> u32 {
    let page: u64 = ctx.arg(0);
    if page == 0 {
        return 0;
    }
    let order: u32 = ctx.arg(1);
    let gfp: u32 = ctx.arg(2);
    let pages = 1u64 << (order & 15);
    if outsized(order, pages) {
        return 0;
    }
    let page_table = order == 0 && gfp & (GFP_MOVABLE | GFP_ZERO) == GFP_ZERO;
    account::<true>(ALLOC, pages, page_table, ctx.as_ptr())
}

/// `mm_page_free(struct page *page, unsigned int order)`.
#[btf_tracepoint(function = "mm_page_free")]
pub fn page_free(ctx: BtfTracePointContext) -> u32 {
    let order: u32 = ctx.arg(1);
    let pages = 1u64 << (order & 15);
    if outsized(order, pages) {
        return 0;
    }
    account::<false>(FREE, pages, false, ctx.as_ptr())
}

/// Pages in a folio: `1 << folio_order()`, the order in the second page's
/// flags when the first is a head page (include/linux/mm.h).
#[inline(always)]
fn folio_pages(folio: u64) -> u64 {
    let flags: u64 = rd(folio, conf!(folio_flags)).unwrap_or(0);
    let head = conf!(pg_head);
    if !(0..64).contains(&head) || flags & (1u64 << head) == 0 {
        return 1;
    }
    let f1: u64 = rd(folio, conf!(folio_flags_1)).unwrap_or(0);
    1u64 << (f1 & 15)
}

/// `mm_filemap_add_to_page_cache(struct folio *folio)`: in the context of
/// whoever brought the file's pages in (a read, a fault on a mapped file,
/// readahead, a write). Page cache is not the process's growth: the
/// kernel gives it back under pressure without a kill. Shmem pages do not
/// pass here: they are the process's, like anonymous memory.
#[btf_tracepoint(function = "mm_filemap_add_to_page_cache")]
pub fn cache_add(ctx: BtfTracePointContext) -> u32 {
    let folio: u64 = ctx.arg(0);
    account::<false>(CACHE_ADD, folio_pages(folio), false, ctx.as_ptr())
}

/// `mm_filemap_delete_from_page_cache(struct folio *folio)`: a truncate, an
/// unlink, an invalidation in this process's context (reclaim's own are
/// left out with the rest of what reclaim frees).
#[btf_tracepoint(function = "mm_filemap_delete_from_page_cache")]
pub fn cache_del(ctx: BtfTracePointContext) -> u32 {
    let folio: u64 = ctx.arg(0);
    account::<false>(CACHE_DEL, folio_pages(folio), false, ctx.as_ptr())
}
