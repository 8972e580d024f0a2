//! The maps that the programs share or that userspace opens by name, in
//! one place. A map that one module keeps to itself lives beside its
//! programs: `PROCS`, `STATE` and `PENDING_DELETE` in `procs.rs`,
//! `PAGE_CACHE` in `pages.rs`, `INSIDE` in `stalls.rs`, `GPU_COUNTERS` and
//! `CUDA_PENDING` in `gpu.rs`.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
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
