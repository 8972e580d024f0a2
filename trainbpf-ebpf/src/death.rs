//! The victim's stack at death (`record --stacks`): each job thread's
//! stacks, native and Python, as it dequeues a fatal signal.
//!
//! `signal_deliver` fires in the dequeuing thread's own context, inside
//! `get_signal`, before `do_group_exit`: its user registers are those it
//! was stopped at, and its memory is intact (the OOM reaper waits before
//! it reaps a victim's memory, and `exit_mm` has not run). For a group's
//! SIGKILL (an OOM kill, `kill -9`) every thread passes here in turn: the
//! "already marked for death" branch fires it with SIGKILL for each. A
//! record goes to the precious ring (kill evidence); a full ring is
//! counted under its kind, and so is one that would take the ring past half
//! full (the rest is the kill's and the exits').

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, generated},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use trainbpf_common::{DeathStack, KIND_DEATH_STACK, STACK_DEPTH};

use crate::{
    count_lost, header, in_job, leader_start_ns,
    maps::{PRECIOUS, ProcKey},
    rd,
};

/// `BPF_F_USER_STACK` (uapi/linux/bpf.h).
const BPF_F_USER_STACK: u64 = 1 << 8;
const SIGKILL: i32 = 9;
/// Signals whose default action is not to end the process: SIGCHLD,
/// SIGCONT, SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU, SIGURG, SIGWINCH.
const NOT_FATAL: u64 =
    (1 << 17) | (1 << 18) | (1 << 19) | (1 << 20) | (1 << 21) | (1 << 22) | (1 << 23) | (1 << 28);

/// `signal_deliver(int sig, struct kernel_siginfo *info, struct
/// k_sigaction *ka)`.
#[btf_tracepoint(function = "signal_deliver")]
pub fn signal_deliver_stack(ctx: BtfTracePointContext) -> u32 {
    let sig: i32 = ctx.arg(0);
    if sig != SIGKILL {
        if !(1..64).contains(&sig) || NOT_FATAL & (1u64 << sig) != 0 {
            return 0;
        }
        // A caught or ignored signal ends nothing: `ka->sa.sa_handler`
        // (the first field of `struct k_sigaction`) is SIG_DFL, 0.
        let ka: u64 = ctx.arg(2);
        if rd::<u64>(ka, 0).unwrap_or(1) != 0 {
            return 0;
        }
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !in_job(tgid) {
        return 0;
    }
    // Each record is 1.6 KiB: a process of a thousand threads would fill
    // the ring and push out the kill's and the exits' own records. Half
    // of the ring stays theirs; what does not fit is counted as lost.
    if PRECIOUS.query(crate::BPF_RB_AVAIL_DATA) > PRECIOUS.query(crate::BPF_RB_RING_SIZE) / 2 {
        count_lost(KIND_DEATH_STACK, "signal_deliver_stack");
        return 0;
    }
    let Some(mut entry) = PRECIOUS.reserve::<DeathStack>(0) else {
        count_lost(KIND_DEATH_STACK, "signal_deliver_stack");
        return 0;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let start_ns = leader_start_ns(task);
    // SAFETY: the reserved record, written field by field before submit;
    // `bpf_get_stack` writes at most the size it is given.
    unsafe {
        (*ev).hdr = header(
            KIND_DEATH_STACK,
            trainbpf_common::FLAG_IN_JOB,
            tgid,
            start_ns,
        );
        (*ev).tid = pid_tgid as u32;
        (*ev).sig = sig as u32;
        (*ev)._pad = 0;
        (*ev).leaf_ret = crate::stacks::leaf_ret();
        (*ev).native_len = generated::bpf_get_stack(
            ctx.as_ptr(),
            core::ptr::addr_of_mut!((*ev).native).cast::<c_void>(),
            (STACK_DEPTH * 8) as u32,
            BPF_F_USER_STACK,
        );
        let key = ProcKey {
            tgid,
            _pad: 0,
            start_ns,
        };
        let (_, state) = crate::python::read(&key, core::ptr::addr_of_mut!((*ev).py));
        (*ev).py_state = state;
    }
    entry.submit(crate::death_wake(0));
    0
}
