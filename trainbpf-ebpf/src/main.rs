//! trainbpf's kernel programs.
//!
//! Three jobs, each cheap where it runs often:
//! - the OOM-kill path (`oom_kill_process` by fentry or kprobe where the
//!   kernel allows, `mark_victim` by tp_btf or classic tracepoint
//!   everywhere): [`oom`], with the signals that end a process in
//!   [`signals`];
//! - process lifecycle of the recorded job (fork, exec, exit), with job
//!   membership kept in the kernel so that no short-lived child is missed:
//!   [`lifecycle`];
//! - memory growth of every process, aggregated per process in the kernel: a
//!   record leaves only when a process's memory moved by a threshold, never
//!   one per fault. Two programs run per fault (page allocated, page freed),
//!   and their common path is a per-CPU compare and add: [`pages`] and
//!   [`stalls`] watch, [`procs`] keeps the state, [`memory`] decides when a
//!   record leaves.
//!
//! The GPU probes are in [`gpu`]; the maps shared by these, and the ones
//! userspace opens, in [`maps`]. This file keeps the helpers they all use.
//!
//! Struct offsets come from userspace ([`Config`], resolved from the running
//! kernel's BTF) because Rust emits no CO-RE relocations.
#![no_std]
#![no_main]
// The BPF target has no `AtomicU64::fetch_add`; the intrinsic lowers to the
// BPF_ATOMIC add that the kernel's own programs use for counters.
#![allow(internal_features)]
#![feature(core_intrinsics)]
// aya-ebpf's map methods take `impl Borrow<K>`. A key passed by value is
// moved into the call and spilled to a fresh stack slot; `&key` hands over
// the one it already has. Clippy's fix changed the code of every program
// (page_alloc: 6537 verified instructions to 6575).
#![allow(
    clippy::needless_borrows_for_generic_args,
    reason = "a borrowed map key keeps the programs' code as it is"
)]

use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel};
use trainbpf_common::*;

#[unsafe(no_mangle)]
pub(crate) static CONFIG: Config = Config::UNSET;

/// Reads one CONFIG field. Volatile, so that the compiler doesn't fold the
/// build-time placeholder in: the loader rewrites the value before load.
macro_rules! conf {
    ($f:ident) => {
        $crate::read_conf(core::ptr::addr_of!($crate::CONFIG.$f))
    };
}

#[inline(always)]
pub(crate) fn read_conf(p: *const i64) -> i64 {
    // SAFETY: `p` points into CONFIG, which lives for the program's life.
    unsafe { core::ptr::read_volatile(p) }
}

// Declared after `conf!`, which a module sees only if it comes later.
/// `klog!`: the programs' own log, off unless `record --ebpf-log`.
#[macro_use]
mod klog;
/// torchelastic's agent held at its wait on a killed worker.
mod agent_hold;
/// The victim's stack at death: each job thread's, at a fatal signal.
mod death;
/// The GPU probes: CUDA driver uprobes, Xid, the driver's page allocator.
mod gpu;
/// A driver library mapped late: the mapping thread held until probed.
mod gpu_late;
/// Fork, exec and exit of the recorded job.
mod lifecycle;
/// The maps shared by the modules, and those userspace opens.
mod maps;
/// Memory growth per process, and the records it sends.
mod memory;
/// The OOM-kill path: the kill, its victim, the kernel's OOM report.
mod oom;
/// Pages allocated and freed in each process's context.
mod pages;
/// Per-process state: keys that survive pid reuse, room kept for the job.
mod procs;
/// Growth stacks' Python frames, walked in the kernel.
mod python;
/// A process's RSS counters, read from its mm.
mod rss;
/// Signals sent to the job, and `oom_score_adj` changes.
mod signals;
/// Growth stacks: the user stack at each new high of a process's memory.
mod stacks;
/// Reclaim and compaction stalls, and which tasks are in one.
mod stalls;

use maps::{COUNTERS, EVENTS, JOB, PRECIOUS};

/// Reads a `T` at `base + off` from kernel memory. An unknown offset (-1) or
/// a NULL base is an error rather than a read of address -1.
#[inline(always)]
pub(crate) fn rd<T>(base: u64, off: i64) -> Result<T, u32> {
    if off < 0 || base == 0 {
        return Err(0);
    }
    // SAFETY: bpf_probe_read_kernel checks the address and fails cleanly.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.map_err(|_| 0u32)
}

#[inline(always)]
fn rd_comm(task: u64) -> [u8; COMM_LEN] {
    rd(task, conf!(task_comm)).unwrap_or([0; COMM_LEN])
}

/// Start time of the task's group leader: with the tgid, a process's name
/// that survives pid reuse.
#[inline(always)]
pub(crate) fn leader_start_ns(task: u64) -> u64 {
    let leader: u64 = rd(task, conf!(task_group_leader)).unwrap_or(task);
    rd(leader, conf!(task_start_time)).unwrap_or(0)
}

#[inline(always)]
pub(crate) fn in_job(tgid: u32) -> bool {
    if conf!(all_processes) != 0 {
        return true;
    }
    // SAFETY: the value is only tested for presence.
    unsafe { JOB.get(&tgid) }.is_some()
}

#[inline(always)]
fn job_flag(tgid: u32) -> u16 {
    if in_job(tgid) { FLAG_IN_JOB } else { 0 }
}

/// `bpf_ringbuf_submit` flags (uapi/linux/bpf.h).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
/// `bpf_ringbuf_query` flags.
const BPF_RB_AVAIL_DATA: u64 = 0;
const BPF_RB_RING_SIZE: u64 = 1;

/// Submit flags for a routine record (memory, lifecycle, printk, GPU):
/// no wake-up, since the collector drains the ring every 50 ms anyway and
/// waking it for each record cost the job a context switch per record in
/// a fork storm; but a wake-up once the ring is a quarter full, so that a
/// burst never fills it while the collector sleeps.
#[inline(always)]
pub(crate) fn lazy() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) > EVENTS.query(BPF_RB_RING_SIZE) / 4 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// `lazy()` for the precious ring.
#[inline(always)]
fn lazy_precious() -> u64 {
    if PRECIOUS.query(BPF_RB_AVAIL_DATA) > PRECIOUS.query(BPF_RB_RING_SIZE) / 4 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Submit flags for a record a job's error file waits on (a SIGKILL, a
/// death by a signal, its stack), `flags` for the recorder of a job:
/// torchelastic's agent reads the file as soon as it reaps the worker, so
/// the collector is woken at once. `record --all` writes no error files
/// (no job of a user's to speak for): there such records wait for the
/// collector's next look, as routine records do, since on a node where
/// processes die a hundred times a second a wake-up each cost the
/// recorder a context switch per death.
#[inline(always)]
fn death_wake(flags: u64) -> u64 {
    if conf!(all_processes) != 0 {
        lazy_precious()
    } else {
        flags
    }
}

/// A ring refused a record of `kind` in program `prog`: counted, and
/// logged with `--ebpf-log`.
#[inline(always)]
pub(crate) fn count_lost(kind: u16, prog: &'static str) {
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        let i = (kind as usize) & (KIND_MAX as usize - 1);
        // SAFETY: per-CPU slot, this CPU only; programs don't nest here.
        unsafe { (*c).lost[i] += 1 };
    }
    klog!(
        warn,
        klog::SITE_LOST + (kind as u32 & (KIND_MAX as u32 - 1)),
        prog,
        "ring buffer full: a record of kind {} lost ({} on this CPU)",
        kind
    );
}

#[inline(always)]
pub(crate) fn header(kind: u16, flags: u16, tgid: u32, start_ns: u64) -> Header {
    Header {
        kind,
        flags,
        tgid,
        // SAFETY: helper without preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        start_ns,
    }
}

/// `kernfs_node::id` of a cgroup: the inode number of its directory, which
/// userspace maps back to a path.
#[inline(always)]
fn css_cgroup_id(css: u64) -> u64 {
    let cgroup: u64 = rd(css, conf!(css_cgroup)).unwrap_or(0);
    let kn: u64 = rd(cgroup, conf!(cgroup_kn)).unwrap_or(0);
    rd(kn, conf!(kn_id)).unwrap_or(0)
}

/// The memory cgroup of a task: `task->cgroups->subsys[memory_cgrp_id]`.
#[inline(always)]
fn task_memcg_id(task: u64) -> u64 {
    let cset: u64 = rd(task, conf!(task_cgroups)).unwrap_or(0);
    let id = conf!(memory_cgrp_id);
    if !(0..64).contains(&id) {
        return 0;
    }
    let css: u64 = rd(cset, conf!(css_set_subsys) + id * 8).unwrap_or(0);
    css_cgroup_id(css)
}

/// `PF_EXITING` in `task_struct::flags` (include/linux/sched.h), stable
/// since 2.6.
pub(crate) const PF_EXITING: u32 = 0x0000_0004;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
