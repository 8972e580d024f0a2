//! torchelastic's agent held at its wait on a worker the OOM killer chose,
//! until the collector has written the worker's error file.
//!
//! The agent reads the error file as soon as its `waitpid` reports the
//! worker's death. The collector writes the file a fraction of a
//! millisecond after the kill, and the victim takes a few milliseconds to
//! exit, so the file is nearly always in first; nearly. This makes it
//! always: at the kill (`victim_marked`) the victim's parent is marked in
//! `AGENT_WAIT`, and the parent's next wait (`sched:sched_process_wait`,
//! in its own context at the start of `do_wait`) stops it with SIGSTOP,
//! which takes effect on the way back from the syscall, before it runs
//! another instruction, whatever the wait returned. The collector, once
//! the file is written, clears the mark and continues it.
//!
//! The hold is `HELD`'s (`HOLD_AGENT`), with the late-library hold's
//! bound: its watchdog (trainbpf/src/record/gpu/watchdog.rs) continues an
//! agent held past the limit, and every one if the recorder dies. The
//! collector marks only processes it can hold that way (it runs the job).
//!
//! Cost: the tracepoint fires once per wait system call on the machine,
//! so it is a BTF tracepoint where the kernel has one (no trace record is
//! built), and its program ends at one array read (`AGENT_ANY`) unless a
//! kill has marked someone. BENCHMARKS.md has the figures.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_send_signal_thread,
    },
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use trainbpf_common::*;

use crate::{
    in_job, leader_start_ns,
    maps::{AGENT_ANY, AGENT_WAIT, ERRFILE_WAITED, HELD},
    rd,
};

const SIGSTOP: u32 = 19;

/// The OOM killer chose `tgid`: if its parent waits on it for an error
/// file, that parent is held at its next wait.
#[inline(always)]
pub(crate) fn victim_marked(tgid: u32) {
    // An entry outlives its process only until the exit is read: a pid
    // reused outside the job marks no one.
    if !in_job(tgid) {
        return;
    }
    // SAFETY: the value is copied out at once.
    if let Some(parent) = unsafe { ERRFILE_WAITED.get(&tgid) }.copied()
        && AGENT_WAIT.insert(&parent, &tgid, 0).is_ok()
        && let Some(any) = AGENT_ANY.get_ptr_mut(0)
    {
        // SAFETY: the map's one value; after the mark (the collector
        // clears the flag, then looks at the map).
        unsafe { core::ptr::write_volatile(any, 1) };
    }
}

/// `sched_process_wait(struct pid *pid)`, as a BTF tracepoint: see the
/// module docs.
#[btf_tracepoint(function = "sched_process_wait")]
pub fn agent_wait_btf(_ctx: BtfTracePointContext) -> u32 {
    agent_wait_here()
}

/// `sched:sched_process_wait`, the classic tracepoint: the fallback
/// where the kernel has no BTF.
#[tracepoint]
pub fn agent_wait(_ctx: TracePointContext) -> u32 {
    agent_wait_here()
}

#[inline(always)]
fn agent_wait_here() -> u32 {
    // SAFETY: the map's one value, read once.
    if AGENT_ANY
        .get_ptr(0)
        .is_none_or(|a| unsafe { core::ptr::read_volatile(a) } == 0)
    {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: only whether the entry is there.
    if unsafe { AGENT_WAIT.get(&tgid) }.is_none() {
        return 0;
    }
    // Never a process outside the job: a job's root is the recorder's
    // child, and the recorder waits on it.
    if !in_job(tgid) {
        return 0;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let leader: u64 = rd(task, conf!(task_group_leader)).unwrap_or(task);
    let hold = Held {
        sending: 1,
        reason: HOLD_AGENT,
        // SAFETY: helper without preconditions.
        since_ns: unsafe { bpf_ktime_get_ns() },
        start_ns: leader_start_ns(task),
        start_boottime_ns: rd(leader, conf!(task_start_boottime)).unwrap_or(0),
        ..Held::default()
    };
    // Held already (at a library's mapping): that hold stands.
    if crate::gpu_late::claim(tgid, &hold).is_err() {
        return 0;
    }
    // The collector clears the mark, then looks for a hold: looked at
    // again after the hold is in, so that one of the two always sees the
    // other.
    // SAFETY: only whether the entry is there.
    if unsafe { AGENT_WAIT.get(&tgid) }.is_none() {
        let _ = HELD.remove(&tgid);
        return 0;
    }
    // SAFETY: the signal goes to the current thread, a job thread.
    if unsafe { bpf_send_signal_thread(SIGSTOP) } == 0 {
        if let Some(h) = HELD.get_ptr_mut(&tgid) {
            // SAFETY: this process's entry; signal_generate may have
            // cleared it already.
            unsafe { (*h).sending = 0 };
        }
    } else {
        let _ = HELD.remove(&tgid);
    }
    0
}
