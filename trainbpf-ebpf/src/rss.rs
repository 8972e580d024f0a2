//! A process's RSS counters, read from its `mm_struct` as the kernel's own
//! OOM report reads them.

use trainbpf_common::{MM_ANONPAGES, MM_FILEPAGES, MM_SHMEMPAGES, MM_SWAPENTS, NR_MM_COUNTERS};

use crate::rd;

/// `mm->rss_stat[member]`: `percpu_counter.count` on 6.2+ (the value
/// `get_mm_counter()` reports), `atomic_long_t` before. The per-CPU deltas of
/// a percpu_counter are not summed: like the kernel's own OOM report, we read
/// the approximate central count.
#[inline(always)]
pub(crate) fn read_counter(mm: u64, member: usize) -> i64 {
    let off = conf!(mm_rss_stat) + member as i64 * conf!(rss_elem_size) + conf!(rss_count_off);
    rd(mm, off).unwrap_or(0)
}

#[inline(always)]
pub(crate) fn read_counters(mm: u64) -> [i64; NR_MM_COUNTERS] {
    [
        read_counter(mm, MM_FILEPAGES),
        read_counter(mm, MM_ANONPAGES),
        read_counter(mm, MM_SWAPENTS),
        read_counter(mm, MM_SHMEMPAGES),
    ]
}
