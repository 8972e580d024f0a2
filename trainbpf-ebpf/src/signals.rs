//! Signals sent to the job (who sent a SIGKILL, and from which terminal),
//! and `oom_score_adj` changes of every process.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use trainbpf_common::*;

use crate::{
    count_lost, header, in_job, job_flag, lazy, leader_start_ns,
    maps::{EVENTS, PRECIOUS},
    rd, rd_comm,
};

/// `signal_generate(int sig, struct kernel_siginfo *info, struct task_struct
/// *task, int group, int result)`: fires in the sender's context, so it is
/// the one place that knows who sent a SIGKILL. Only signals to the job are
/// kept, and never the chatty ones that end nothing.
#[btf_tracepoint(function = "signal_generate")]
pub fn signal_generate(ctx: BtfTracePointContext) -> u32 {
    match try_signal_generate(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

/// `task_struct.flags`: a kernel thread (include/linux/sched.h).
const PF_KTHREAD: u32 = 0x0020_0000;

/// SIGCHLD, SIGCONT, SIGURG, SIGWINCH: default action is not to terminate.
const HARMLESS_SIGNALS: u64 = (1 << 17) | (1 << 18) | (1 << 23) | (1 << 28);

fn try_signal_generate(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let sig: i32 = ctx.arg(0);
    // SIGCONT, SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU: a held process's hold
    // must know of them (gpu_late.rs).
    if (18..=22).contains(&sig) {
        let task: u64 = ctx.arg(2);
        // The hold's own stop is not the job's story: not recorded.
        if let Ok(tgid) = rd::<u32>(task, conf!(task_tgid))
            && ((sig == 19 && crate::python::own_stop(tgid))
                || crate::gpu_late::on_signal(sig, tgid))
        {
            return Ok(0);
        }
    }
    if !(1..64).contains(&sig) || HARMLESS_SIGNALS & (1u64 << sig) != 0 {
        return Ok(0);
    }
    let info: u64 = ctx.arg(1);
    let task: u64 = ctx.arg(2);
    let result: i32 = ctx.arg(4);
    let tgid: u32 = rd(task, conf!(task_tgid))?;
    let in_job = in_job(tgid);
    if !in_job && i64::from(tgid) != conf!(recorder_tgid) {
        return Ok(0);
    }
    // SEND_SIG_NOINFO (0) is a plain kill(2); SEND_SIG_PRIV (1) the kernel.
    let code: i32 = match info {
        0 => 0,
        1 => 0x80,
        _ => rd(info, conf!(siginfo_code)).unwrap_or(0),
    };
    let Some(mut entry) = PRECIOUS.reserve::<SignalEvent>(0) else {
        count_lost(KIND_SIGNAL, "signal_generate");
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    let mut flags = if in_job { FLAG_IN_JOB } else { 0 };
    // SAFETY: helper without preconditions.
    let current = unsafe { bpf_get_current_task() };
    let cur_flags: u32 = rd(current, conf!(task_flags)).unwrap_or(0);
    if cur_flags & PF_KTHREAD != 0 {
        flags |= FLAG_SENDER_KTHREAD;
    }
    // A signal the kernel made up (SEND_SIG_PRIV): a Ctrl-C, a hangup.
    // The line discipline runs in whichever kworker flushed the input, so
    // the target's terminal, its session and foreground group at this
    // moment are what names the sender.
    let mut tty_name = [0u8; COMM_LEN];
    let mut tty_session = 0u32;
    let mut tty_pgrp = 0u32;
    if info == 1 {
        let signal: u64 = rd(task, conf!(task_signal)).unwrap_or(0);
        let tty: u64 = rd(signal, conf!(signal_tty)).unwrap_or(0);
        if let Ok(name) = rd::<[u8; COMM_LEN]>(tty, conf!(tty_name)) {
            flags |= FLAG_TTY;
            tty_name = name;
            let pgrp: u64 = rd(tty, conf!(tty_pgrp)).unwrap_or(0);
            let session: u64 = rd(tty, conf!(tty_session)).unwrap_or(0);
            tty_pgrp = rd(pgrp, conf!(pid_nr)).unwrap_or(0);
            tty_session = rd(session, conf!(pid_nr)).unwrap_or(0);
        }
    }
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(KIND_SIGNAL, flags, tgid, leader_start_ns(task));
        (*ev).tty_name = tty_name;
        (*ev).tty_session = tty_session;
        (*ev).tty_pgrp = tty_pgrp;
        (*ev).target_pid = rd(task, conf!(task_pid)).unwrap_or(0);
        (*ev).sig = sig as u32;
        (*ev).code = code;
        (*ev).result = result;
        (*ev).sender_pid = pid_tgid as u32;
        (*ev).sender_tgid = (pid_tgid >> 32) as u32;
        (*ev).sender_uid = aya_ebpf::helpers::bpf_get_current_uid_gid() as u32;
        (*ev)._pad = 0;
        (*ev).sender_comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
        (*ev).comm = rd_comm(task);
    }
    // A SIGKILL wakes the collector at once (torchelastic's error file
    // races the victim's reaping); other signals when it is idle.
    entry.submit(crate::death_wake(if sig == 9 {
        crate::BPF_RB_FORCE_WAKEUP
    } else {
        0
    }));
    Ok(0)
}

/// `oom_score_adj_update(struct task_struct *task)`: rare, so every process
/// on the machine is kept; the OOM killer's ranking depends on it.
#[btf_tracepoint(function = "oom_score_adj_update")]
pub fn oom_adj_update(ctx: BtfTracePointContext) -> u32 {
    match try_oom_adj_update(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_oom_adj_update(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let task: u64 = ctx.arg(0);
    let tgid: u32 = rd(task, conf!(task_tgid))?;
    let signal: u64 = rd(task, conf!(task_signal))?;
    let adj: i16 = rd(signal, conf!(signal_oom_score_adj))?;
    let Some(mut entry) = EVENTS.reserve::<AdjEvent>(0) else {
        count_lost(KIND_OOM_ADJ, "oom_adj_update");
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(KIND_OOM_ADJ, job_flag(tgid), tgid, leader_start_ns(task));
        (*ev).oom_score_adj = adj as i32;
        (*ev).writer_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        (*ev).comm = rd_comm(task);
    }
    entry.submit(lazy());
    Ok(0)
}
