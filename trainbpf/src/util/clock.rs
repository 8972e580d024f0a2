//! The clocks the recording keeps: monotonic for every record, realtime
//! once, so that the report can tell wall-clock times.

use nix::time::ClockId;

/// Nanoseconds on `clock`; 0 where it can't be read.
pub(crate) fn now(clock: ClockId) -> u64 {
    nix::time::clock_gettime(clock)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The clock the kernel's records use (`bpf_ktime_get_ns`).
pub(crate) fn mono_ns() -> u64 {
    now(ClockId::CLOCK_MONOTONIC)
}

pub(crate) fn realtime_ns() -> u64 {
    now(ClockId::CLOCK_REALTIME)
}
