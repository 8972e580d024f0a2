//! Per-process memory state, for every process on the machine that
//! allocates memory, keyed so that a reused pid can never name an older
//! process, and with room held back for the recorded job's processes.
//!
//! - The key is the tgid and its group leader's start time: a pid reused
//!   after its process exited names a new entry, never the old one.
//! - The first insert is `BPF_NOEXIST`: two threads of a new process seen at
//!   once on two CPUs make one entry, and the loser adds to the winner's.
//! - An entry goes only at its own process's exit, and one exit late on the
//!   same CPU: a preallocated hash element is reused at once, so an add in
//!   flight on another CPU (looked up, not yet added) would land in whatever
//!   process the element was given to next. Every thread's exit, and every
//!   new task, bumps the epoch (`Global::epoch`), which the per-CPU page
//!   caches compare on every page: a slot filled before is checked afresh,
//!   so a pid reused since can't take its pages, and a new thread on a dead
//!   one's kernel stack can't take its slot (`task_made`).
//! - Processes outside the job may fill the map only up to `procs_max -
//!   procs_job_reserve` entries; the rest is the job's. A process that finds
//!   no room is counted: the job's in `proc_map_full` (a lost event), the
//!   others' in `other_map_full`.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{addr_of, addr_of_mut},
};

use trainbpf_common::*;

use crate::{
    PF_EXITING, in_job,
    maps::{COUNTERS, Global, PENDING_DELETE, PROCS, ProcKey, ProcState, STATE},
    rd,
    rss::read_counters,
};

/// `BPF_NOEXIST` (uapi/linux/bpf.h) and the error it gives for a key there.
const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;

/// Process exits so far, machine-wide: a per-CPU slot filled under an older
/// value is checked against `PROCS` again before it takes another page.
#[inline(always)]
pub(crate) fn epoch() -> u64 {
    match STATE.get_ptr(0) {
        // SAFETY: a plain load of an aligned u64 in a live array value.
        Some(g) => unsafe { core::ptr::read_volatile(addr_of!((*g).epoch)) },
        None => 0,
    }
}

/// Threads inside reclaim or compaction now.
#[inline(always)]
pub(crate) fn inside() -> u64 {
    match STATE.get_ptr(0) {
        // SAFETY: as in epoch().
        Some(g) => unsafe { core::ptr::read_volatile(addr_of!((*g).inside)) },
        None => 0,
    }
}

#[inline(always)]
fn entries() -> u64 {
    match STATE.get_ptr(0) {
        // SAFETY: as in epoch().
        Some(g) => unsafe { core::ptr::read_volatile(addr_of!((*g).entries)) },
        None => 0,
    }
}

/// Adds `v` (wrapping: `u64::MAX` is -1) to one of `Global`'s counts.
#[inline(always)]
pub(crate) fn state_add(f: fn(*mut Global) -> *mut u64, v: u64) {
    if let Some(g) = STATE.get_ptr_mut(0) {
        // SAFETY: aligned u64 inside a live array value.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(f(g), v) };
    }
}

pub(crate) fn epoch_of(g: *mut Global) -> *mut u64 {
    // SAFETY: a field address, no access.
    unsafe { addr_of_mut!((*g).epoch) }
}

pub(crate) fn inside_of(g: *mut Global) -> *mut u64 {
    // SAFETY: as above.
    unsafe { addr_of_mut!((*g).inside) }
}

fn entries_of(g: *mut Global) -> *mut u64 {
    // SAFETY: as above.
    unsafe { addr_of_mut!((*g).entries) }
}

/// The group leader's start time, with one read fewer for the leader itself.
#[inline(always)]
pub(crate) fn key_of(task: u64, tgid: u32, pid: u32) -> ProcKey {
    let start_ns = if pid == tgid {
        rd(task, conf!(task_start_time)).unwrap_or(0)
    } else {
        crate::leader_start_ns(task)
    };
    ProcKey {
        tgid,
        _pad: 0,
        start_ns,
    }
}

#[inline(always)]
pub(crate) fn get(key: &ProcKey) -> Option<*mut ProcState> {
    PROCS.get_ptr_mut(key)
}

/// No room for `tgid` in `PROCS`: counted, and logged with `--ebpf-log`.
#[inline(always)]
fn count_full(job: bool, tgid: u32, prog: &'static str) {
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, this CPU only.
        unsafe {
            if job {
                (*c).proc_map_full += 1;
            } else {
                (*c).other_map_full += 1;
            }
        }
    }
    if job {
        klog!(
            warn,
            crate::klog::SITE_PROCS_FULL,
            prog,
            "PROCS full ({} entries): job process {} not tracked, its memory records lost ({} on this CPU)",
            conf!(procs_max),
            tgid
        );
    } else {
        klog!(
            warn,
            crate::klog::SITE_PROCS_ROOM,
            prog,
            "PROCS has no room left outside the {} of its {} entries held for the job: process {} not tracked ({} on this CPU)",
            conf!(procs_job_reserve),
            conf!(procs_max),
            tgid
        );
    }
}

/// The entry of the current process, made on first sight. None for an
/// exiting process (its entry went at its exit; one made now would outlive
/// it) or when there is no room. `prog` names the program, for the log.
#[inline(always)]
pub(crate) fn get_or_create(
    key: &ProcKey,
    task: u64,
    mm: u64,
    now: u64,
    prog: &'static str,
) -> Option<*mut ProcState> {
    if let Some(st) = PROCS.get_ptr_mut(key) {
        return Some(st);
    }
    let flags: u32 = rd(task, conf!(task_flags)).unwrap_or(0);
    if flags & PF_EXITING != 0 {
        return None;
    }
    let job = in_job(key.tgid);
    if !job {
        let entries = entries();
        let room = conf!(procs_max) - conf!(procs_job_reserve);
        if entries as i64 >= room {
            count_full(false, key.tgid, prog);
            return None;
        }
    }
    let init = ProcState {
        cur: read_counters(mm),
        // Nothing reported yet: the first change sends the whole footprint,
        // so userspace learns every process's size once.
        reported: [0; NR_MM_COUNTERS],
        last_emit_ns: now,
        start_ns: key.start_ns,
        stall_ns: 0,
        alloc_pages: 0,
        freed_pages: 0,
        reported_net: 0,
        cache_added_pages: 0,
        cache_removed_pages: 0,
        reported_cache: 0,
        checked_pages: 0,
    };
    match PROCS.insert(key, &init, BPF_NOEXIST) {
        Ok(()) => state_add(entries_of, 1),
        // Another thread of the process made it first: add to that one.
        Err(e) if e == -EEXIST => {}
        Err(_) => {
            count_full(job, key.tgid, prog);
            return None;
        }
    }
    PROCS.get_ptr_mut(key)
}

/// The process's last thread is exiting: its pages from now on are not
/// wanted. Its entry is removed at this CPU's next exit (the epoch moved
/// at its thread's exit, so every CPU's cached slot is checked afresh).
#[inline(always)]
pub(crate) fn forget(key: &ProcKey) {
    if let Some(p) = PENDING_DELETE.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; tracepoints run with migration off.
        unsafe {
            let old = *p;
            if old.tgid != 0 && PROCS.remove(&old).is_ok() {
                state_add(entries_of, u64::MAX); // -1
            }
            *p = *key;
        }
    }
}

/// A thread is exiting (the last of its process or not): every CPU's
/// cached slot is checked afresh, so that a pid reused since can't take
/// its pages, and an entry removed at a later exit is not added to.
#[inline(always)]
pub(crate) fn thread_exited() {
    state_add(epoch_of, 1);
}

/// A task was made, and has not run yet: every CPU's cached slot is checked
/// afresh. The slots know a thread by its kernel stack, and a new task's
/// stack is often the one a task that died a moment ago ran on (the kernel
/// keeps two freed stacks per CPU for the next fork). The exit alone does
/// not cover that: a dying process frees its memory after its exit moved
/// the epoch (since Linux 6.16 `sched_process_exit` fires before
/// `exit_mm`), which leaves its stack in a slot under the newest epoch,
/// marked to count nothing. A task made on that stack would find the slot
/// its own on the fast path, and its pages would go uncounted until the
/// epoch moved again or another thread took that CPU's slot: seen dropping
/// 7,233 of the 8,192 pages a freshly forked process touched, and pages of
/// new threads and `vfork` children.
#[inline(always)]
pub(crate) fn task_made() {
    state_add(epoch_of, 1);
}
