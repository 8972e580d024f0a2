//! trainbpf's kernel programs.
//!
//! Three jobs, each cheap where it runs often:
//! - the OOM-kill path (`oom_kill_process` by fentry or kprobe where the
//!   kernel allows, `mark_victim` by tp_btf or classic tracepoint everywhere);
//! - process lifecycle of the recorded job (fork, exec, exit), with job
//!   membership kept in the kernel so that no short-lived child is missed;
//! - memory growth of every process, aggregated per process in the kernel: a
//!   record leaves only when a process's memory moved by a threshold, never
//!   one per fault. Two programs run per fault (page allocated, page freed),
//!   and their common path is a per-CPU compare and add.
//!
//! Struct offsets come from userspace ([`Config`], resolved from the running
//! kernel's BTF) because Rust emits no CO-RE relocations.
#![no_std]
#![no_main]
// The BPF target has no `AtomicU64::fetch_add`; the intrinsic lowers to the
// BPF_ATOMIC add that the kernel's own programs use for counters.
#![allow(internal_features)]
#![feature(core_intrinsics)]

use core::ptr::addr_of_mut;

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_kernel_buf, bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_tracepoint, fentry, kprobe, map, tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, FEntryContext, ProbeContext, TracePointContext},
};
use trainbpf_common::*;

/// The GPU probes: CUDA driver uprobes, Xid, the driver's page allocator.
mod gpu;

#[unsafe(no_mangle)]
pub(crate) static CONFIG: Config = Config::UNSET;

/// Records for userspace. Its size is set by the loader.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// Kills, deaths, signals and the kernel's OOM log lines
/// (`trainbpf_common::is_precious`): few, and the evidence, so a burst of
/// memory records in `EVENTS` can never take their room.
#[map]
static PRECIOUS: RingBuf = RingBuf::with_byte_size(PRECIOUS_RING_BYTES, 0);

/// Lost records and full maps, per CPU (one slot).
#[map]
pub(crate) static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// Processes of the recorded job: tgid → 1. Userspace seeds the root; fork
/// adds children here, in the kernel, before the child can run.
#[map]
static JOB: HashMap<u32, u32> = HashMap::with_max_entries(65536, 0);

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

/// Per-process state: keys that survive pid reuse, room kept for the job.
mod procs;
use procs::{ProcKey, ProcState};
/// Pages allocated and freed in each process's context.
mod pages;
/// Reclaim and compaction stalls, and which tasks are in one.
mod stalls;

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

/// `mm->rss_stat[member]`: `percpu_counter.count` on 6.2+ (the value
/// `get_mm_counter()` reports), `atomic_long_t` before. The per-CPU deltas of
/// a percpu_counter are not summed: like the kernel's own OOM report, we read
/// the approximate central count.
#[inline(always)]
fn read_counter(mm: u64, member: usize) -> i64 {
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

#[inline(always)]
pub(crate) fn count_lost(kind: u16) {
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        let i = (kind as usize) & (KIND_MAX as usize - 1);
        // SAFETY: per-CPU slot, this CPU only; programs don't nest here.
        unsafe { (*c).lost[i] += 1 };
    }
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

// ---------------------------------------------------------------- OOM path

/// Fills the victim's half of an OomEvent from its task_struct, and the
/// trigger from `current`.
#[inline(always)]
fn fill_victim(ev: *mut OomEvent, kind: u16, source: u32, task: u64) {
    let tgid: u32 = rd(task, conf!(task_tgid)).unwrap_or(0);
    let mm: u64 = rd(task, conf!(task_mm)).unwrap_or(0);
    let signal: u64 = rd(task, conf!(task_signal)).unwrap_or(0);
    let cred: u64 = rd(task, conf!(task_real_cred)).unwrap_or(0);
    let adj: i16 = rd(signal, conf!(signal_oom_score_adj)).unwrap_or(0);
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: `ev` points at a reserved ring-buffer slot of the right size.
    unsafe {
        (*ev).hdr = header(kind, job_flag(tgid), tgid, leader_start_ns(task));
        (*ev).victim_pid = rd(task, conf!(task_pid)).unwrap_or(0);
        (*ev).trigger_pid = pid_tgid as u32;
        (*ev).trigger_tgid = (pid_tgid >> 32) as u32;
        (*ev).uid = rd(cred, conf!(cred_uid)).unwrap_or(u32::MAX);
        (*ev).oom_score_adj = adj as i32;
        (*ev).source = source;
        (*ev).oom_flags = 0;
        (*ev).constraint = 0;
        (*ev).counters = read_counters(mm);
        (*ev).total_vm = rd(mm, conf!(mm_total_vm)).unwrap_or(0);
        (*ev).pgtables = rd(mm, conf!(mm_pgtables_bytes)).unwrap_or(0);
        (*ev).victim_memcg_id = task_memcg_id(task);
        (*ev).oc_memcg_id = 0;
        (*ev).chosen_points = 0;
        (*ev).totalpages = 0;
        (*ev).comm = rd_comm(task);
        (*ev).trigger_comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    }
}

/// `oom_kill_process(struct oom_control *oc, const char *message)`
/// (mm/oom_kill.c): `oc->chosen` is the victim, `current` the allocating
/// task that ran out.
#[inline(always)]
fn emit_oom_kill(oc: u64, source: u32) -> Result<u32, u32> {
    let chosen: u64 = rd(oc, conf!(oc_chosen))?;
    // NULL: nothing chosen; -1: the kernel aborted the selection.
    if chosen == 0 || chosen == u64::MAX {
        return Ok(0);
    }
    let Some(mut entry) = PRECIOUS.reserve::<OomEvent>(0) else {
        count_lost(KIND_OOM_KILL);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    fill_victim(ev, KIND_OOM_KILL, source, chosen);
    let memcg: u64 = rd(oc, conf!(oc_memcg)).unwrap_or(0);
    // SAFETY: reserved slot, as above.
    unsafe {
        (*ev).oom_flags = OOM_FLAG_HAS_OC;
        (*ev).constraint = rd(oc, conf!(oc_constraint)).unwrap_or(0);
        (*ev).chosen_points = rd(oc, conf!(oc_chosen_points)).unwrap_or(0);
        (*ev).totalpages = rd(oc, conf!(oc_totalpages)).unwrap_or(0);
        (*ev).oc_memcg_id = if memcg == 0 {
            0
        } else {
            css_cgroup_id(memcg + conf!(memcg_css) as u64)
        };
    }
    entry.submit(0);
    Ok(0)
}

#[fentry(function = "oom_kill_process")]
pub fn oom_kill_fentry(ctx: FEntryContext) -> u32 {
    let oc: u64 = ctx.arg(0);
    match emit_oom_kill(oc, SRC_FENTRY) {
        Ok(r) | Err(r) => r,
    }
}

#[kprobe]
pub fn oom_kill_kprobe(ctx: ProbeContext) -> u32 {
    let oc: u64 = ctx.arg(0).unwrap_or(0);
    match emit_oom_kill(oc, SRC_KPROBE) {
        Ok(r) | Err(r) => r,
    }
}

/// `mark_victim(struct task_struct *task, uid_t uid)`, the prototype since
/// Linux 6.8 (include/trace/events/oom.h); the loader checks it in BTF first.
#[btf_tracepoint(function = "mark_victim")]
pub fn mark_victim_btf(ctx: BtfTracePointContext) -> u32 {
    match try_mark_victim_btf(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_mark_victim_btf(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let task: u64 = ctx.arg(0);
    let uid: u32 = ctx.arg(1);
    let Some(mut entry) = PRECIOUS.reserve::<OomEvent>(0) else {
        count_lost(KIND_OOM_VICTIM);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    fill_victim(ev, KIND_OOM_VICTIM, SRC_TP_BTF, task);
    // SAFETY: reserved slot.
    unsafe { (*ev).uid = uid };
    entry.submit(0);
    Ok(0)
}

/// Classic `oom:mark_victim`: the last fallback. Field offsets come from the
/// tracefs format file; before 6.8 only `pid` exists, and the rest stays 0.
#[tracepoint]
pub fn mark_victim_tp(ctx: TracePointContext) -> u32 {
    match try_mark_victim_tp(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

#[inline(always)]
fn tp_field<T: Default>(ctx: &TracePointContext, off: i64) -> T {
    if off < 0 {
        return T::default();
    }
    // SAFETY: the offset comes from this kernel's format file.
    unsafe { ctx.read_at::<T>(off as usize) }.unwrap_or_default()
}

fn try_mark_victim_tp(ctx: &TracePointContext) -> Result<u32, u32> {
    let pid: i32 = tp_field(ctx, conf!(tp_mv_pid));
    let Some(mut entry) = PRECIOUS.reserve::<OomEvent>(0) else {
        count_lost(KIND_OOM_VICTIM);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = pid as u32;
    let adj: i16 = tp_field(ctx, conf!(tp_mv_oom_score_adj));
    let mut comm = [0u8; COMM_LEN];
    let comm_loc: u32 = tp_field(ctx, conf!(tp_mv_comm));
    if comm_loc != 0 {
        let off = (comm_loc & 0xffff) as u64;
        // SAFETY: __data_loc points inside this record.
        let _ = unsafe {
            bpf_probe_read_kernel_buf((ctx.as_ptr() as u64 + off) as *const u8, &mut comm)
        };
    }
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(KIND_OOM_VICTIM, job_flag(tgid), tgid, 0);
        (*ev).victim_pid = tgid;
        (*ev).trigger_pid = pid_tgid as u32;
        (*ev).trigger_tgid = (pid_tgid >> 32) as u32;
        (*ev).uid = tp_field(ctx, conf!(tp_mv_uid));
        (*ev).oom_score_adj = adj as i32;
        (*ev).source = SRC_TRACEPOINT;
        (*ev).oom_flags = OOM_FLAG_COUNTERS_KB;
        (*ev).constraint = 0;
        (*ev).counters = [
            tp_field(ctx, conf!(tp_mv_file_rss)),
            tp_field(ctx, conf!(tp_mv_anon_rss)),
            0,
            tp_field(ctx, conf!(tp_mv_shmem_rss)),
        ];
        (*ev).total_vm = tp_field(ctx, conf!(tp_mv_total_vm));
        (*ev).pgtables = tp_field(ctx, conf!(tp_mv_pgtables));
        (*ev).victim_memcg_id = 0;
        (*ev).oc_memcg_id = 0;
        (*ev).chosen_points = 0;
        (*ev).totalpages = 0;
        (*ev).comm = comm;
        (*ev).trigger_comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    }
    entry.submit(0);
    Ok(0)
}

/// Kernel log lines worth keeping: the OOM report's constraint line, its
/// memcg usage line and its verdict, and the NVIDIA driver's Xid errors on
/// drivers without the `nvidia_dev_xid` tracepoint. Everything else is
/// dropped here, before a reserve, so a chatty kernel costs a prefix compare.
const PRINTK_PREFIXES: [&[u8]; 5] = [
    b"oom-kill:",
    b"Memory cgroup out",
    b"Out of memory",
    b"memory: usage ",
    b"NVRM: Xid",
];

#[tracepoint]
pub fn printk_console(ctx: TracePointContext) -> u32 {
    match try_printk_console(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

const HEAD: usize = 40;

#[inline(always)]
fn has_prefix(head: &[u8; HEAD], skip: usize, prefix: &[u8]) -> bool {
    let mut i = 0;
    while i < prefix.len() {
        let j = skip + i;
        if j >= HEAD || head[j] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Before 5.15 or so the console tracepoint got the line as printed,
/// after a `[   12.345678] ` timestamp; skip it.
#[inline(always)]
fn timestamp_len(head: &[u8; HEAD]) -> usize {
    if head[0] != b'[' {
        return 0;
    }
    let mut i = 1;
    while i < 20 {
        if head[i] == b']' {
            return if head[i + 1] == b' ' { i + 2 } else { i + 1 };
        }
        i += 1;
    }
    0
}

fn try_printk_console(ctx: &TracePointContext) -> Result<u32, u32> {
    let loc: u32 = tp_field(ctx, conf!(tp_console_msg));
    let msg = ctx.as_ptr() as u64 + (loc & 0xffff) as u64;
    let mut head = [0u8; HEAD];
    // SAFETY: __data_loc points inside this record. A line shorter than the
    // buffer may fail the read near the end of the record: try shorter.
    if unsafe { bpf_probe_read_kernel_buf(msg as *const u8, &mut head) }.is_err() {
        let mut short = [0u8; 16];
        // SAFETY: as above.
        unsafe { bpf_probe_read_kernel_buf(msg as *const u8, &mut short) }.map_err(|_| 0u32)?;
        head[..16].copy_from_slice(&short);
    }
    let skip = timestamp_len(&head);
    if !PRINTK_PREFIXES.iter().any(|p| has_prefix(&head, skip, p)) {
        return Ok(0);
    }
    let Some(mut entry) = PRECIOUS.reserve::<PrintkEvent>(0) else {
        count_lost(KIND_PRINTK);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: reserved slot; the string read is bounded by `msg`'s size.
    unsafe {
        (*ev).hdr = header(KIND_PRINTK, 0, tgid, 0);
        (*ev)._pad = 0;
        let buf = &mut *addr_of_mut!((*ev).msg);
        (*ev).len = match bpf_probe_read_kernel_str_bytes(msg as *const u8, buf) {
            Ok(s) => s.len() as u32,
            Err(_) => 0,
        };
    }
    entry.submit(lazy_precious());
    Ok(0)
}

// ------------------------------------------------------- process lifecycle

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
            pages::account(pages::FORK_TABLES, bytes / page as u64, false, ctx.as_ptr());
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
    }
    let Some(mut entry) = EVENTS.reserve::<ForkEvent>(0) else {
        count_lost(KIND_FORK);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(KIND_FORK, FLAG_IN_JOB, child_tgid, leader_start_ns(child));
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
    let tgid: u32 = rd(task, conf!(task_tgid))?;
    if !in_job(tgid) {
        return Ok(0);
    }
    let Some(mut entry) = EVENTS.reserve::<ExecEvent>(0) else {
        count_lost(KIND_EXEC);
        return Ok(0);
    };
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
    }
    entry.submit(lazy());
    Ok(0)
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
    pages::drop_pages_of(&key);
    procs::forget(&key);
    if !in_job(tgid) {
        return Ok(0);
    }
    let _ = JOB.remove(&tgid);
    let Some(mut entry) = PRECIOUS.reserve::<ExitEvent>(0) else {
        count_lost(KIND_EXIT);
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: reserved slot.
    unsafe {
        (*ev).hdr = header(KIND_EXIT, FLAG_IN_JOB, tgid, leader_start_ns(task));
        (*ev).exit_code = rd(task, conf!(task_exit_code)).unwrap_or(0);
        (*ev).group_exit_code = rd(signal, conf!(signal_group_exit_code)).unwrap_or(0);
        (*ev).comm = rd_comm(task);
    }
    entry.submit(lazy_precious());
    Ok(0)
}

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

/// `PF_EXITING` in `task_struct::flags` (include/linux/sched.h), stable
/// since 2.6.
pub(crate) const PF_EXITING: u32 = 0x0000_0004;

/// `task_struct.flags`: a kernel thread (include/linux/sched.h).
const PF_KTHREAD: u32 = 0x0020_0000;

/// SIGCHLD, SIGCONT, SIGURG, SIGWINCH: default action is not to terminate.
const HARMLESS_SIGNALS: u64 = (1 << 17) | (1 << 18) | (1 << 23) | (1 << 28);

fn try_signal_generate(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let sig: i32 = ctx.arg(0);
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
        count_lost(KIND_SIGNAL);
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
    entry.submit(0);
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
        count_lost(KIND_OOM_ADJ);
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

// ------------------------------------------------------------ memory growth

/// The state of the current process, created on first sight.
#[inline(always)]
fn proc_state(tgid: u32, task: u64, mm: u64, now: u64) -> Option<*mut ProcState> {
    let pid = bpf_get_current_pid_tgid() as u32;
    procs::get_or_create(&procs::key_of(task, tgid, pid), task, mm, now)
}

#[inline(always)]
fn abs(v: i64) -> i64 {
    if v < 0 { -v } else { v }
}

/// `rss_stat(struct mm_struct *mm, int member)` (6.2+; older kernels pass a
/// third `long count`, which is not read). Fires on every RSS counter change:
/// the program only updates the per-process state and compares. Attached
/// only where the page probes are missing: they read the counters instead.
#[btf_tracepoint(function = "rss_stat")]
pub fn rss_stat(ctx: BtfTracePointContext) -> u32 {
    match try_rss_stat(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

/// What this CPU last saw of one process's RSS counters. `mm->rss_stat` is a
/// percpu_counter whose central count, the one read here, moves only once a
/// CPU's batch of changes (32 or more pages) is folded in, while rss_stat
/// fires on every change: most calls find the count as it was, and those
/// end at this slot, before the clock is read or `PROCS` looked up. (A
/// heartbeat record that falls due waits for the next move.)
#[map]
static RSS_CACHE: PerCpuArray<RssCache> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct RssCache {
    /// The process's mm and tgid, checked against `current` when stored.
    mm: u64,
    tgid: u32,
    _pad: u32,
    /// The counters as written to the process's entry at the last full look.
    seen: [i64; NR_MM_COUNTERS],
}

fn try_rss_stat(ctx: &BtfTracePointContext) -> Result<u32, u32> {
    let mm: u64 = ctx.arg(0);
    let member: i32 = ctx.arg(1);
    if !(0..NR_MM_COUNTERS as i32).contains(&member) {
        return Ok(0);
    }
    let member = member as usize & (NR_MM_COUNTERS - 1);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let value = read_counter(mm, member);
    let slot = RSS_CACHE.get_ptr_mut(0);
    if let Some(c) = slot {
        // SAFETY: this CPU's slot; the tracepoint runs with preemption off.
        // The mm was the current process's when the slot was filled, and a
        // tgid keeps its mm until exec, which makes a new one.
        unsafe {
            // The counter did not move since this CPU last looked: nothing
            // to tell, and no clock read. (A heartbeat that fell due waits
            // for the next move, a few of the process's changes away: the
            // kernel's per-CPU counter moves once per 32 or so.)
            if (*c).mm == mm && (*c).tgid == tgid && (*c).seen[member] == value {
                return Ok(0);
            }
        }
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    // Another process's mm (exit teardown, khugepaged, remote GUP): its owner
    // reports it on its own next change.
    let cur_mm: u64 = rd(task, conf!(task_mm))?;
    if cur_mm != mm {
        return Ok(0);
    }
    let st = proc_state(tgid, task, mm, now).ok_or(0u32)?;
    // SAFETY: `st` points into a map value; races between threads of one
    // process can only duplicate or delay a record, never corrupt one.
    unsafe { (*st).cur[member] = value };
    maybe_emit(st, task, mm, tgid, now);
    if let Some(c) = slot {
        // SAFETY: this CPU's slot, as above; `st` is a live map value.
        unsafe {
            (*c).mm = mm;
            (*c).tgid = tgid;
            (*c).seen = (*st).cur;
        }
    }
    Ok(0)
}

/// The larger of the fixed threshold and the relative one, in pages.
#[inline(always)]
fn threshold_for(total: i64) -> i64 {
    let mut threshold = conf!(rss_threshold_pages);
    let shift = conf!(rss_relative_shift);
    if shift > 0 && shift < 63 && total > 0 {
        let rel = total >> shift;
        if rel > threshold {
            threshold = rel;
        }
    }
    threshold
}

/// Sends a MemEvent when the process's RSS counters or its net page
/// allocations moved by the threshold since the last record, or moved at
/// all once the heartbeat passed.
#[inline(always)]
pub(crate) fn maybe_emit(st: *mut ProcState, task: u64, mm: u64, tgid: u32, now: u64) {
    // SAFETY: `st` points into a live map value (see try_rss_stat).
    unsafe {
        let cur = (*st).cur;
        let rep = (*st).reported;
        let cache = (*st).cache_added_pages as i64 - (*st).cache_removed_pages as i64;
        let net = (*st).alloc_pages as i64 - (*st).freed_pages as i64 - cache;
        // RSS and net allocations usually move together (a fault allocates
        // the page it maps): take the larger move, not the sum, or steady
        // growth would send twice the records.
        let rss_moved = abs(cur[0] - rep[0])
            + abs(cur[1] - rep[1])
            + abs(cur[2] - rep[2])
            + abs(cur[3] - rep[3]);
        let net_moved = abs(net - (*st).reported_net);
        // A reader's page cache moves neither: it is shown too.
        let cache_moved = abs(cache - (*st).reported_cache);
        let mut moved = if rss_moved > net_moved {
            rss_moved
        } else {
            net_moved
        };
        if cache_moved > moved {
            moved = cache_moved;
        }
        if moved == 0 {
            return;
        }
        let threshold = threshold_for(cur[MM_FILEPAGES] + cur[MM_ANONPAGES] + cur[MM_SHMEMPAGES]);
        let since = now.wrapping_sub((*st).last_emit_ns);
        let heartbeat = since >= conf!(heartbeat_ns) as u64;
        let first = rep[0] == 0 && rep[1] == 0 && rep[2] == 0 && rep[3] == 0;
        if moved < threshold && !heartbeat {
            return;
        }
        // A process that churns (allocates and frees a big buffer every
        // step) crosses the threshold both ways many times a second: space
        // its records out, unless the move is large. Not the job's own: its
        // figures at a kill must be as fresh as the threshold allows.
        if !first && since < conf!(min_interval_ns) as u64 && moved < threshold * 8 && !in_job(tgid)
        {
            return;
        }
        let reason = if first {
            MEM_REASON_FIRST
        } else if moved >= threshold {
            MEM_REASON_THRESHOLD
        } else {
            MEM_REASON_HEARTBEAT
        };
        // This CPU's pages not yet in the entry belong in the record.
        pages::fold_pages_of(tgid, (*st).start_ns);
        let cache = (*st).cache_added_pages as i64 - (*st).cache_removed_pages as i64;
        let net = (*st).alloc_pages as i64 - (*st).freed_pages as i64 - cache;
        let Some(mut entry) = EVENTS.reserve::<MemEvent>(0) else {
            count_lost(KIND_MEM);
            return;
        };
        let fresh = read_counters(mm);
        let ev = entry.as_mut_ptr();
        let signal: u64 = rd(task, conf!(task_signal)).unwrap_or(0);
        let adj: i16 = rd(signal, conf!(signal_oom_score_adj)).unwrap_or(0);
        (*ev).hdr = header(KIND_MEM, job_flag(tgid), tgid, (*st).start_ns);
        (*ev).counters = fresh;
        // No longer counted: a probe on every user fault cost the job more
        // than any report used the count for.
        (*ev).faults = 0;
        (*ev).reason = reason;
        (*ev).oom_score_adj = adj as i32;
        // The process's name is its group leader's: the thread that happens
        // to allocate may be a runtime's helper (`cuda-EvtHandlr`, seen
        // naming a trainer on an H200).
        let leader: u64 = rd(task, conf!(task_group_leader)).unwrap_or(task);
        (*ev).comm = rd_comm(leader);
        (*ev).pgtables_bytes = rd(mm, conf!(mm_pgtables_bytes)).unwrap_or(0);
        (*ev).memcg_id = task_memcg_id(task);
        (*ev).stall_ns = (*st).stall_ns;
        (*ev).alloc_pages = (*st).alloc_pages;
        (*ev).freed_pages = (*st).freed_pages;
        (*ev).cache_added_pages = (*st).cache_added_pages;
        (*ev).cache_removed_pages = (*st).cache_removed_pages;
        entry.submit(lazy());
        (*st).cur = fresh;
        (*st).reported = fresh;
        (*st).reported_net = net;
        (*st).reported_cache = cache;
        (*st).last_emit_ns = now;
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
