//! The programs' own log (`record --ebpf-log`, through aya-log): what only
//! the kernel side can see, named by the program that saw it. A map that
//! filled, a ring that refused a reserve, a kernel read that failed where
//! BTF promised a field.
//!
//! Off by default, and then free: each call is behind `conf!(ebpf_log)`,
//! which the verifier reads as a constant (`CONFIG` is read-only), so it
//! drops the call as dead code before the program runs. The calls sit only
//! where something already went wrong, never on the per-page fast path.
//!
//! A condition that holds once tends to hold for every event after it (a
//! full map refuses every new process): each site logs its 1st, 2nd, 4th,
//! 8th... time on each CPU, with the count, so that the log ring is not
//! flooded and the counters (`Counters`) stay the full account.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::PerCpuArray};

use crate::rd;

/// Message sites, each throttled on its own. `SITE_LOST + kind`: a ring
/// refused a record of that kind.
pub(crate) const SITE_LOST: u32 = 0;
pub(crate) const SITE_PROCS_FULL: u32 = 32;
pub(crate) const SITE_PROCS_ROOM: u32 = 33;
pub(crate) const SITE_JOB_FULL: u32 = 34;
pub(crate) const SITE_INSIDE_FULL: u32 = 35;
pub(crate) const SITE_CUDA_PENDING_FULL: u32 = 36;
pub(crate) const SITE_STACK: u32 = 37;
pub(crate) const SITE_TASK_LAYOUT: u32 = 38;
const SITES: u32 = 40;

/// Messages per site on this CPU so far.
#[map]
static LOG_SEEN: PerCpuArray<u64> = PerCpuArray::with_max_entries(SITES, 0);

/// Counts one more message from `site` on this CPU; the count when it is
/// one to log (a power of two).
#[inline(always)]
pub(crate) fn due(site: u32) -> Option<u64> {
    let n = LOG_SEEN.get_ptr_mut(site)?;
    // SAFETY: this CPU's slot; a nested program at worst logs twice.
    unsafe {
        *n += 1;
        let v = *n;
        (v & (v - 1) == 0).then_some(v)
    }
}

/// `klog!(warn, SITE, "program", "format {} ...", args...)`: logs at that
/// aya-log level when `record --ebpf-log` asked for it. The format's last
/// `{}` is the site's count on this CPU, passed after `args`.
macro_rules! klog {
    ($level:ident, $site:expr, $prog:expr, $fmt:literal $(, $arg:expr)* $(,)?) => {
        if conf!(ebpf_log) != 0
            && let Some(n) = $crate::klog::due($site)
        {
            aya_log_ebpf::$level!(&(), target: $prog, $fmt, $($arg,)* n);
        }
    };
}

/// With `--ebpf-log`: whether `task`, which is `current`, reads back as the
/// kernel's own pid and tgid at BTF's offsets. Every record names its
/// process by these reads; a kernel whose layout is not what its BTF says
/// would name the wrong one, or none.
#[inline(always)]
pub(crate) fn check_current_task(prog: &'static str, task: u64) {
    if conf!(ebpf_log) == 0 {
        return;
    }
    let ids = bpf_get_current_pid_tgid();
    let tgid: u32 = rd(task, conf!(task_tgid)).unwrap_or(u32::MAX);
    let pid: u32 = rd(task, conf!(task_pid)).unwrap_or(u32::MAX);
    if tgid != (ids >> 32) as u32 || pid != ids as u32 {
        klog!(
            error,
            SITE_TASK_LAYOUT,
            prog,
            "task_struct.tgid and .pid at BTF's offsets {} and {} read {} and {} (4294967295: the read failed), but the kernel says {} and {}: this kernel's layout is not its BTF's ({} on this CPU)",
            conf!(task_tgid),
            conf!(task_pid),
            tgid,
            pid,
            (ids >> 32) as u32,
            ids as u32
        );
    }
}
