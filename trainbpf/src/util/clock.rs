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

/// The CPU time the calling thread has used, in user space and in the
/// kernel: what a paced sampler costs the machine, which a busy machine's
/// wait for a CPU does not stretch as it stretches wall time.
pub(crate) fn thread_cpu() -> std::time::Duration {
    std::time::Duration::from_nanos(now(ClockId::CLOCK_THREAD_CPUTIME_ID))
}
