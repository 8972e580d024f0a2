//! What the programs count instead of losing silently (`COUNTERS`).

use crate::KIND_MAX;

/// Per-CPU counters that userspace reads and records: nothing is dropped
/// silently.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Ring-buffer reserves that failed, by record kind.
    pub lost: [u64; KIND_MAX as usize],
    /// Job processes not tracked because the per-process map was full: lost
    /// events.
    pub proc_map_full: u64,
    /// Time tasks spent stalled, and how often, by `STALL_*`.
    pub stall_ns: [u64; 4],
    pub stall_count: [u64; 4],
    /// Job members not added because the job map was full.
    pub job_map_full: u64,
    /// Processes outside the job not tracked because the per-process map
    /// had no room left outside the job's reserve.
    pub other_map_full: u64,
    /// Pages job threads freed inside reclaim or compaction: other
    /// processes' memory and cache, not charged to the thread.
    pub reclaim_freed_pages: u64,
    /// Page tables allocated for forked children in their parents'
    /// context, taken back out of the parents' allocations.
    pub fork_pages: u64,
    /// Pages allocated or freed in interrupt context: nobody's.
    pub irq_pages: u64,
    /// Pages allocated or freed in blocks larger than a PMD, in some
    /// process's context: no process maps such a block, so they are the
    /// allocator's own (seen: 128 MiB at a time, 32 blocks of 4 MiB, freed
    /// in a copy-on-write writer's context on a VM that reports free memory
    /// to its host), never the process's growth or shrinkage.
    pub block_pages: u64,
    /// Growth stacks (`record --stacks`) not aggregated because the
    /// per-stack map or the high-water map was full: lost events.
    pub stack_map_full: u64,
    /// Growth stacks that could not be read (`bpf_get_stackid` failed):
    /// aggregated under their error, and counted here.
    pub stack_errors: u64,
    /// Growth stacks' user-stack copies (`STACK_COPIES`) the ring had no
    /// room for: those stacks are named by frame pointers alone.
    pub stack_copies_lost: u64,
}
