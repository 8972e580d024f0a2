//! Memory growth per process (`memory.rs`, `pages.rs`), and the stall
//! kinds reclaim and compaction are counted by (`stalls.rs`).

use crate::{COMM_LEN, Header};

/// `MemEvent::reason`: memory moved by at least the threshold.
pub const MEM_REASON_THRESHOLD: u32 = 1;

/// `MemEvent::reason`: a small change, reported because the heartbeat expired.
pub const MEM_REASON_HEARTBEAT: u32 = 2;

/// `MemEvent::reason`: first sight of the process.
pub const MEM_REASON_FIRST: u32 = 3;

/// `MemEvent::reason`: its last record, as its last thread exits (Linux
/// 6.16 and later, where that is before its memory is freed).
pub const MEM_REASON_EXIT: u32 = 4;

/// Index into `counters` arrays, in the kernel's own order
/// (`enum { MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES }`,
/// include/linux/mm_types_task.h).
pub const MM_FILEPAGES: usize = 0;
pub const MM_ANONPAGES: usize = 1;
pub const MM_SWAPENTS: usize = 2;
pub const MM_SHMEMPAGES: usize = 3;
pub const NR_MM_COUNTERS: usize = 4;

/// Kinds of allocation stall, indexing `Counters::stall_*`.
pub const STALL_DIRECT_RECLAIM: usize = 0;
pub const STALL_MEMCG_RECLAIM: usize = 1;
pub const STALL_COMPACTION: usize = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemEvent {
    pub hdr: Header,
    /// `mm->rss_stat[]` in pages, kernel order (`MM_FILEPAGES`…).
    pub counters: [i64; NR_MM_COUNTERS],
    /// Always 0: once the process's user page faults, no longer counted
    /// because a probe on every fault cost the job 5 to 8%. Kept so the
    /// record's layout does not change.
    pub faults: u64,
    pub reason: u32,
    /// `signal->oom_score_adj` when the record was sent.
    pub oom_score_adj: i32,
    pub comm: [u8; COMM_LEN],
    // Fields below were added after the first layout (88 bytes); a reader
    // zero-fills them in a shorter record.
    /// `mm->pgtables_bytes`: part of the OOM killer's badness.
    pub pgtables_bytes: u64,
    /// kernfs id of the process's memory cgroup: its OOM domain.
    pub memcg_id: u64,
    /// Time the process spent stalled in direct reclaim, memcg reclaim and
    /// compaction so far, ns.
    pub stall_ns: u64,
    /// Pages allocated and freed in this process's context so far
    /// (mm_page_alloc / mm_page_free): its honest growth is the difference.
    pub alloc_pages: u64,
    pub freed_pages: u64,
    // Fields below were added after the second layout (128 bytes).
    /// Pages added to and removed from the page cache in this process's
    /// context so far (`mm_filemap_*`): part of `alloc_pages` and
    /// `freed_pages`, but not the process's growth.
    pub cache_added_pages: u64,
    pub cache_removed_pages: u64,
}

/// Size of the second `MemEvent` layout, still accepted by the reader.
pub const MEM_EVENT_V2_SIZE: usize = 128;

/// Size of the first `MemEvent` layout, still accepted by the reader.
pub const MEM_EVENT_V1_SIZE: usize = 88;
