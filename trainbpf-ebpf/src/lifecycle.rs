//! Process lifecycle of the recorded job: fork, exec and exit. Membership
//! is kept in the kernel (`JOB`), so that no short-lived child is missed.

use core::ptr::addr_of_mut;

use aya_ebpf::{
    EbpfContext, helpers::bpf_probe_read_kernel_str_bytes, macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use trainbpf_common::*;

use crate::{
    count_lost, header, in_job, lazy, lazy_precious, leader_start_ns,
    maps::{AGENT_WAIT, COUNTERS, ERRFILE_WAITED, EVENTS, EXEC_HOLD, HELD, JOB, PRECIOUS, ProcKey},
    memory, pages, procs, rd, rd_comm,
};

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`.
/// Membership spreads here, in the kernel, so a child that forks and exits
/// before userspace reads a byte is still part of the job.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_fork(ctx: BtfTracePointContext) -> u32 {
    match try_sched_fork(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_sched_fork(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let parent: u64 = ctx.arg(0);
    let child: u64 = ctx.arg(1);
    let child_pid: u32 = rd(child, conf!(task_pid))?;
    let child_tgid: u32 = rd(child, conf!(task_tgid))?;
    if child_pid != child_tgid {
        return Ok(0); // a new thread, not a new process
    }
    // The child's page tables (copies of the parent's) were allocated in
    // the parent's context, and are freed in the child's: not the parent's
    // growth. The parent is `current`, still on its own stack. (Its kernel
    // stack and task come from caches and slabs: small, left to the cap at
    // what a process maps.)
    let child_mm: u64 = rd(child, conf!(task_mm)).unwrap_or(0);
    let parent_mm: u64 = rd(parent, conf!(task_mm)).unwrap_or(0);
    if child_mm != 0 && child_mm != parent_mm {
        let bytes: u64 = rd(child_mm, conf!(mm_pgtables_bytes)).unwrap_or(0);
        let page = conf!(page_size);
        if bytes != 0 && page > 0 {
            pages::account::<false>(pages::FORK_TABLES, bytes / page as u64, false, ctx.as_ptr());
        }
    }
    // A new process's pid may have been a dead one's a moment ago: its
    // state is keyed by its start time too (`procs`), so it starts from
    // nothing.
    let parent_tgid: u32 = rd(parent, conf!(task_tgid))?;
    if !in_job(parent_tgid) {
        return Ok(0);
    }
    if JOB.insert(&child_tgid, &1, 0).is_err() {
        if let Some(c) = COUNTERS.get_ptr_mut(0) {
            // SAFETY: per-CPU slot.
            unsafe { (*c).job_map_full += 1 };
        }
        klog!(
            warn,
            crate::klog::SITE_JOB_FULL,
            "sched_fork",
            "JOB map full: job process {}'s child {} not added to the job ({} on this CPU)",
            parent_tgid,
            child_tgid
        );
    }
    if conf!(stack_every_pages) > 0 {
        crate::python::inherit(
            &ProcKey {
                tgid: parent_tgid,
                _pad: 0,
                start_ns: leader_start_ns(parent),
            },
            &ProcKey {
                tgid: child_tgid,
                _pad: 0,
                start_ns: leader_start_ns(child),
            },
        );
    }
    let Some(mut entry) = EVENTS.reserve::<ForkEvent>(0) else {
        count_lost(KIND_FORK, "sched_fork");
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(
            KIND_FORK,
            FLAG_IN_JOB | kthread_flag(child),
            child_tgid,
            leader_start_ns(child),
        );
        (*ev).parent_tgid = parent_tgid;
        (*ev)._pad = 0;
        (*ev).parent_start_ns = leader_start_ns(parent);
        (*ev).comm = rd_comm(child);
    }
    entry.submit(lazy());
    Ok(0)
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_exec(ctx: BtfTracePointContext) -> u32 {
    match try_sched_exec(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_sched_exec(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let task: u64 = ctx.arg(0);
    let bprm: u64 = ctx.arg(2);
    crate::klog::check_current_task("sched_exec", task);
    let tgid: u32 = rd(task, conf!(task_tgid))?;
    if !in_job(tgid) {
        return Ok(0);
    }
    let key = ProcKey {
        tgid,
        _pad: 0,
        start_ns: leader_start_ns(task),
    };
    // The reservation is tested at once: the verifier of kernels before
    // 6.x loses a reservation carried in an `Option` across calls.
    let Some(mut entry) = EVENTS.reserve::<ExecEvent>(0) else {
        described_at_exec(task, &key, false);
        count_lost(KIND_EXEC, "sched_exec");
        return Ok(0);
    };
    // A hold needs the record that tells the collector to end it.
    let held = described_at_exec(task, &key, true);
    let ev = entry.as_mut_ptr();
    let filename: u64 = rd(bprm, conf!(bprm_filename)).unwrap_or(0);
    // SAFETY: reserved slot; the string read is bounded by the buffer.
    unsafe {
        (*ev).hdr = header(KIND_EXEC, FLAG_IN_JOB, tgid, leader_start_ns(task));
        (*ev).comm = rd_comm(task);
        let buf = &mut *addr_of_mut!((*ev).filename);
        let n = match bpf_probe_read_kernel_str_bytes(filename as *const u8, buf) {
            Ok(s) => s.len(),
            Err(_) => 0,
        };
        if n + 1 >= FILENAME_LEN {
            (*ev).hdr.flags |= FLAG_TRUNCATED;
        }
        if held {
            (*ev).hdr.flags |= FLAG_EXEC_HELD;
        }
    }
    // A held process waits on this record: it wakes the collector now.
    entry.submit(if held {
        crate::BPF_RB_FORCE_WAKEUP
    } else {
        lazy()
    });
    Ok(0)
}

/// The new program is no longer the interpreter described (one inherited
/// at a fork, or located before): until the collector looks again, its
/// stacks are walked as no Python's, unless the file is one it located an
/// interpreter in before (`python::at_exec`). Whether the process is held
/// for the collector (only where `may_hold`).
#[inline(always)]
fn described_at_exec(task: u64, key: &ProcKey, may_hold: bool) -> bool {
    if conf!(stack_every_pages) <= 0 {
        return false;
    }
    let had = crate::python::forget(key);
    matches!(
        crate::python::at_exec(task, key, may_hold && !had),
        crate::python::AtExec::Held
    )
}

/// `sched_process_exit(struct task_struct *p, ...)`: fires once per thread;
/// only the last one (`signal->live` reached 0) ends the process.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_exit(ctx: BtfTracePointContext) -> u32 {
    match try_sched_exit(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_sched_exit(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let task: u64 = ctx.arg(0);
    // Every thread's exit, not only a process's: its kernel stack may go
    // to the next thread made, and the page caches know a thread by its
    // stack.
    procs::thread_exited();
    let signal: u64 = rd(task, conf!(task_signal))?;
    let live: i32 = rd(signal, conf!(signal_live))?;
    if live != 0 {
        return Ok(0);
    }
    let tgid: u32 = rd(task, conf!(task_tgid))?;
    let key = ProcKey {
        tgid,
        _pad: 0,
        start_ns: leader_start_ns(task),
    };
    let job = in_job(tgid);
    // Its memory is still there where this fires before `exit_mm` (6.16+):
    // a job process's final figures, before the entry goes.
    let mm: u64 = rd(task, conf!(task_mm)).unwrap_or(0);
    if job
        && mm != 0
        && let Some(st) = procs::get(&key)
    {
        pages::fold_pages_of(tgid, key.start_ns);
        memory::emit_at_exit(st, task, mm, tgid);
    }
    pages::drop_pages_of(&key);
    procs::forget(&key);
    if !job {
        return Ok(0);
    }
    let _ = JOB.remove(&tgid);
    // Its pid may name another process next: no mark outlives it.
    let _ = ERRFILE_WAITED.remove(&tgid);
    let _ = AGENT_WAIT.remove(&tgid);
    if conf!(stack_every_pages) > 0 {
        // The root's holds end with it (`python::hold_unlocated`).
        let _ = EXEC_HOLD.remove(&tgid);
    }
    // A process held at a late driver mapping and killed before its
    // release: its hold ends with it, before its pid can name another
    // process that a SIGCONT would then reach. A hold the watchdog already
    // ended stays, for the collector to count: nothing continues a
    // process by such an entry, and a new hold of the pid replaces it.
    // SAFETY: the value is read at once.
    if unsafe { HELD.get(&tgid) }.is_some_and(|h| h.timed_out_ns == 0) {
        let _ = HELD.remove(&tgid);
    }
    let Some(mut entry) = PRECIOUS.reserve::<ExitEvent>(0) else {
        count_lost(KIND_EXIT, "sched_exit");
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(
            KIND_EXIT,
            FLAG_IN_JOB | kthread_flag(task),
            tgid,
            leader_start_ns(task),
        );
        (*ev).exit_code = rd(task, conf!(task_exit_code)).unwrap_or(0);
        (*ev).group_exit_code = rd(signal, conf!(signal_group_exit_code)).unwrap_or(0);
        // The process's name, not the last thread's: a trainer whose
        // gloo thread (`pt_gloo_runloop`) outlives its main thread by a
        // moment would otherwise be named after that thread. The leader's
        // task lives until the whole group is reaped.
        let leader: u64 = rd(task, conf!(task_group_leader)).unwrap_or(task);
        (*ev).comm = rd_comm(leader);
    }
    // A death by a signal wakes the collector at once (torchelastic's
    // error file); the rest wait for its next look.
    // SAFETY: reserved slot, written above.
    let signalled = unsafe { (*ev).exit_code } & 0x7f != 0;
    entry.submit(if signalled {
        crate::death_wake(crate::BPF_RB_FORCE_WAKEUP)
    } else {
        lazy_precious()
    });
    Ok(0)
}

/// `task_struct.flags`: a kernel thread (include/linux/sched.h).
const PF_KTHREAD: u32 = 0x0020_0000;

/// [`FLAG_KTHREAD`] for a kernel thread: `--all` sees them fork and exit,
/// and the report leaves them out of the job.
#[inline(always)]
fn kthread_flag(task: u64) -> u16 {
    let flags: u32 = rd(task, conf!(task_flags)).unwrap_or(0);
    if flags & PF_KTHREAD != 0 {
        FLAG_KTHREAD
    } else {
        0
    }
}
