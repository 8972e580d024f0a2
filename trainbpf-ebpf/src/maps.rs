//! Every map the programs use, and the layout of its values, in one place:
//! what the kernel side holds (and what it costs in memory) reads here. The
//! logic that reads and writes each lives with its programs: `procs.rs`
//! (`PROCS`, `STATE`, `PENDING_DELETE`), `pages.rs` (`PAGE_CACHE`),
//! `stalls.rs` (`INSIDE`), `gpu.rs` (`GPU_COUNTERS`, `CUDA_PENDING`),
//! `stacks.rs` (`STACKS`, `STACK_AGG`, `STACK_HIGH`; `GPU_STACK_AGG` for
//! `gpu.rs`), `python.rs`
//! (`PY_PROCS`, `PY_STACKS`, `PY_SCRATCH`).

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, StackTrace},
};
use trainbpf_common::*;

/// Records for userspace. Its size is set by the loader.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// Kills, deaths, signals and the kernel's OOM log lines
/// (`trainbpf_common::is_precious`): few, and the evidence, so a burst of
/// memory records in `EVENTS` can never take their room.
#[map]
pub(crate) static PRECIOUS: RingBuf = RingBuf::with_byte_size(PRECIOUS_RING_BYTES, 0);

/// Lost records and full maps, per CPU (one slot).
#[map]
pub(crate) static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// Processes of the recorded job: tgid → 1. Userspace seeds the root; fork
/// adds children here, in the kernel, before the child can run.
#[map]
pub(crate) static JOB: HashMap<u32, u32> = HashMap::with_max_entries(65536, 0);

/// What this CPU last saw of one process's RSS counters. `mm->rss_stat` is a
/// percpu_counter whose central count, the one read here, moves only once a
/// CPU's batch of changes (32 or more pages) is folded in, while rss_stat
/// fires on every change: most calls find the count as it was, and those
/// end at this slot, before the clock is read or `PROCS` looked up. (A
/// heartbeat record that falls due waits for the next move.)
#[map]
pub(crate) static RSS_CACHE: PerCpuArray<RssCache> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RssCache {
    /// The process's mm and tgid, checked against `current` when stored.
    pub(crate) mm: u64,
    pub(crate) tgid: u32,
    _pad: u32,
    /// The counters as written to the process's entry at the last full look.
    pub(crate) seen: [i64; NR_MM_COUNTERS],
}

// ------------------------------------------------ per-process state (procs.rs)

/// A process: its tgid and its group leader's `start_time`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProcKey {
    pub tgid: u32,
    pub _pad: u32,
    pub start_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProcState {
    /// Last values seen, pages, kernel order.
    pub cur: [i64; NR_MM_COUNTERS],
    /// Values in the last record sent.
    pub reported: [i64; NR_MM_COUNTERS],
    pub last_emit_ns: u64,
    pub start_ns: u64,
    pub stall_ns: u64,
    /// Pages allocated and freed in this process's context (mm_page_alloc,
    /// mm_page_free), and the net at the last record.
    pub alloc_pages: u64,
    pub freed_pages: u64,
    pub reported_net: i64,
    /// Pages added to and removed from the page cache in its context: not
    /// its growth (`alloc - freed - (added - removed)` is).
    pub cache_added_pages: u64,
    pub cache_removed_pages: u64,
    /// The page cache's net at the last record.
    pub reported_cache: i64,
    /// `alloc_pages + freed_pages` when its RSS was last read: the pages
    /// since, from every CPU, decide when to read it again.
    pub checked_pages: u64,
}

/// Not an LRU map: an LRU map may evict a busy entry before it is full (its
/// free lists are per CPU), and a re-created entry restarts the process's
/// page counts, which would read as memory freed. Its size is set by the
/// loader (`procs_max`).
#[map]
pub(crate) static PROCS: HashMap<ProcKey, ProcState> = HashMap::with_max_entries(32768, 0);

/// Machine-wide counts. An array's lookup the verifier inlines: one load
/// on the per-page path.
#[map]
pub(crate) static STATE: Array<Global> = Array::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Global {
    /// Thread exits, tasks made, and entries to and exits from reclaim
    /// and compaction, so far.
    pub epoch: u64,
    /// Entries in `PROCS`.
    pub entries: u64,
    /// Threads inside reclaim or compaction now (`stalls::INSIDE`).
    pub inside: u64,
}

/// The key each CPU's last exit left in `PROCS`, removed at its next exit.
#[map]
pub(crate) static PENDING_DELETE: PerCpuArray<ProcKey> = PerCpuArray::with_max_entries(1, 0);

// ------------------------------------------------ per-CPU page batches (pages.rs)

/// Pages allocated and freed by one process on this CPU since they were last
/// added to its `PROCS` entry. mm_page_alloc and mm_page_free fire for every
/// page, several times per user fault; a hash lookup and two atomic adds on
/// each cost the job about 7% in a fault storm, while this per-CPU slot's
/// lookup the verifier inlines. A process's own pages land in `PROCS` every
/// `pages::PAGE_BATCH` pages, or when another process allocates on this CPU.
#[map]
pub(crate) static PAGE_CACHE: PerCpuArray<PageCache> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PageCache {
    pub(crate) tgid: u32,
    /// `MODE_*`.
    pub(crate) mode: u32,
    /// The thread the slot was filled for (with the epoch, its stack
    /// below names it on the fast path).
    pub(crate) pid: u32,
    pub(crate) _pad: u32,
    /// The process's `ProcState::start_ns`: with the tgid, its `PROCS` key.
    pub(crate) start_ns: u64,
    /// `procs::epoch()` when the slot was filled: a thread has exited or
    /// was made, or one entered or left reclaim or compaction since, when
    /// it moved.
    pub(crate) epoch: u64,
    /// The thread's kernel stack: a page event whose frame is not on it
    /// runs in an interrupt (or softirq), on behalf of nobody in
    /// particular. `stack_size` is `u64::MAX` where the stack is unknown.
    pub(crate) stack_lo: u64,
    pub(crate) stack_size: u64,
    pub(crate) alloc: u64,
    pub(crate) freed: u64,
    /// Pages added to and removed from the page cache (`mm_filemap_*`).
    pub(crate) cache_added: u64,
    pub(crate) cache_removed: u64,
    /// Where the current program's context lies: stored and read back,
    /// the verifier's way to make a pointer a number.
    pub(crate) sp: u64,
}

// ------------------------------------------------ reclaim and compaction (stalls.rs)

/// The threads (by pid) inside reclaim or compaction.
#[map]
pub(crate) static INSIDE: HashMap<u32, Inside> = HashMap::with_max_entries(8192, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Inside {
    /// When the outermost stall began.
    pub(crate) stall_start_ns: u64,
    /// Nesting depth.
    pub(crate) stall_depth: u32,
    pub(crate) _pad: u32,
}

// ------------------------------------------------ GPU (gpu.rs)

/// The GPU probes' own counters (one slot, per CPU).
#[map]
pub(crate) static GPU_COUNTERS: PerCpuArray<GpuCounters> = PerCpuArray::with_max_entries(1, 0);

/// Arguments of a CUDA call in flight, by `tid << 8 | op`: keyed by op too,
/// so a driver call that itself calls another exported entry point pairs
/// each return with its own entry. Bounded: one entry per thread inside a
/// call; when full, the call is counted in `pending_full` and not recorded.
#[map]
pub(crate) static CUDA_PENDING: HashMap<u64, Pending> = HashMap::with_max_entries(16384, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) args: [u64; 5],
    pub(crate) entry_ns: u64,
}

// ------------------------------------------------ growth stacks (stacks.rs)

/// User stacks taken at a process's new highs (`record --stacks`), by id.
/// Its size is set by the loader: one entry when stacks are off.
#[map]
pub(crate) static STACKS: StackTrace = StackTrace::with_max_entries(4096, 0);

/// Bytes of new high and captures per (process, stack id): aggregated here,
/// read as deltas by userspace, which deletes a process's keys after its
/// exit. Not an LRU map: an eviction would lose bytes silently; a full map
/// is counted (`Counters::stack_map_full`).
#[map]
pub(crate) static STACK_AGG: HashMap<StackKey, StackVal> = HashMap::with_max_entries(16384, 0);

/// A growth stack's first sample with its registers and a copy of the
/// stack above its pointer (`StackCopy`), for the collector to unwind with
/// the binaries' unwind tables. A ring of its own: a burst of new stacks
/// can never take the records' room. Its size is set by the loader (one
/// page when stacks are off); a full ring is counted
/// (`Counters::stack_copies_lost`).
#[map]
pub(crate) static STACK_COPIES: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Bytes the CUDA driver's allocation calls asked for and were given, per
/// (process, stack at the call) (`record --stacks`): the GPU variant of
/// `STACK_AGG`, drained the same way. Frees are not subtracted. Its size
/// is set by the loader: one entry when stacks are off.
#[map]
pub(crate) static GPU_STACK_AGG: HashMap<StackKey, StackVal> = HashMap::with_max_entries(4096, 0);

/// Each process's added memory (pages) at its last stack: its high so far.
/// Removed by userspace after the process's exit.
#[map]
pub(crate) static STACK_HIGH: HashMap<ProcKey, i64> = HashMap::with_max_entries(8192, 0);

/// The Python interpreters of job processes (`record --stacks`), filled by
/// the collector once it located one: what the walker in `python.rs`
/// reads. Its size is set by the loader: one entry when stacks are off.
#[map]
pub(crate) static PY_PROCS: HashMap<ProcKey, PyProc> = HashMap::with_max_entries(1024, 0);

/// Growth stacks' Python frames by id (a hash of the pairs): shared by
/// every process that took the same pairs, deleted by userspace once no
/// known stack has that id. Full: counted under `PY_STORE_FULL`.
#[map]
pub(crate) static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(4096, 0);

/// Interpreters the collector located in a process's own executable, by
/// that file (the kernel's dev_t and inode), `runtime` relative to the
/// process's `start_code`: a later exec of the same file is described at
/// the exec itself (`python::at_exec`), before its first stack.
#[map]
pub(crate) static PY_EXES: HashMap<FileKey, PyProc> = HashMap::with_max_entries(64, 0);

/// Each job process's exec as the kernel saw it (its file, its code's
/// load address): what the collector files a located interpreter under in
/// `PY_EXES`. An LRU: a process whose entry was pushed out is only not
/// filed.
#[map]
pub(crate) static EXE_OF: LruHashMap<ProcKey, ExeOf> = LruHashMap::with_max_entries(1024, 0);

/// The job's root process (the recorder started it), with how many times
/// it may still be held: an exec of a file no interpreter is filed under
/// in `PY_EXES` stops the process with SIGSTOP before its first
/// instruction, and the collector continues it once it has looked for an
/// interpreter (`python::at_exec`); where that found none yet (a
/// `libpython` not mapped), the next walk that finds no description holds
/// it again (`python::hold_unlocated`). So the job's first Python process
/// has every stack walked. Removed at the root's exit, before its pid can
/// name another process.
#[map]
pub(crate) static EXEC_HOLD: HashMap<u32, ExecHold> = HashMap::with_max_entries(4, 0);

/// Where a walk gathers its frames (too big for the program's stack).
#[map]
pub(crate) static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

// ------------------------------------------- late driver libraries (gpu_late.rs)

/// Driver library files already probed or tried (userspace fills it,
/// `SEEN_TRIED`): an mmap of one of these holds no one. `SEEN_UNREADABLE`:
/// a mapping through a descriptor not open for reading was said (the
/// kernel fills it).
#[map]
pub(crate) static LIBCUDA_SEEN: HashMap<FileKey, u32> = HashMap::with_max_entries(1024, 0);

/// Job processes held at the mapping of an unprobed driver library, until
/// the collector has attached and continued them, the hold's watchdog has
/// ended the hold, or the process exited: tgid → [`Held`].
#[map]
pub(crate) static HELD: HashMap<u32, Held> = HashMap::with_max_entries(1024, 0);

/// Job processes whose parent waits on them for torchelastic's error
/// file (a rank, its agent): tgid → the parent's tgid. The collector
/// fills it where it can write the file and hold the agent; an entry goes
/// at its process's exit.
#[map]
pub(crate) static ERRFILE_WAITED: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// Agents to hold at their next wait: the parent's tgid → the tgid of its
/// worker the OOM killer chose, set at the kill, until the collector has
/// written the worker's error file (or the agent exits).
#[map]
pub(crate) static AGENT_WAIT: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// 1 while `AGENT_WAIT` may hold a mark: set at a mark, cleared by the
/// collector when it finds the map empty. Every wait on the machine looks
/// here first, an array read the verifier inlines, instead of hashing.
#[map]
pub(crate) static AGENT_ANY: Array<u32> = Array::with_max_entries(1, 0);

/// Job processes in an uncovered window (mapped a driver library and could
/// not be held): tgid → [`LateWindow`], until the collector has attached.
#[map]
pub(crate) static WINDOWS: HashMap<u32, LateWindow> = HashMap::with_max_entries(1024, 0);
