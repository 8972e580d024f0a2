//! The OOM-kill path: `oom_kill_process` by fentry or kprobe where the
//! kernel allows, `mark_victim` by tp_btf or classic tracepoint everywhere,
//! and the lines of the kernel's OOM report from the console tracepoint.
//! Every record goes to the precious ring.

use core::ptr::addr_of_mut;

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel_buf,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_tracepoint, fentry, kprobe, tracepoint},
    programs::{BtfTracePointContext, FEntryContext, ProbeContext, TracePointContext},
};
use trainbpf_common::*;

use crate::{
    count_lost, css_cgroup_id, header, job_flag, lazy_precious, leader_start_ns, maps::PRECIOUS,
    rd, rd_comm, rss::read_counters, task_memcg_id,
};

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
    crate::agent_hold::victim_marked(tgid);
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
fn emit_oom_kill(oc: u64, source: u32, prog: &'static str) -> Result<u32, u32> {
    let chosen: u64 = rd(oc, conf!(oc_chosen))?;
    // NULL: nothing chosen; -1: the kernel aborted the selection.
    if chosen == 0 || chosen == u64::MAX {
        return Ok(0);
    }
    let Some(mut entry) = PRECIOUS.reserve::<OomEvent>(0) else {
        count_lost(KIND_OOM_KILL, prog);
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
    // A kill wakes the collector at once: torchelastic's error file must
    // be written before the victim's parent reaps it.
    entry.submit(crate::BPF_RB_FORCE_WAKEUP);
    Ok(0)
}

#[fentry(function = "oom_kill_process")]
pub fn oom_kill_fentry(ctx: FEntryContext) -> u32 {
    let oc: u64 = ctx.arg(0);
    match emit_oom_kill(oc, SRC_FENTRY, "oom_kill_fentry") {
        Ok(r) | Err(r) => r,
    }
}

#[kprobe]
pub fn oom_kill_kprobe(ctx: ProbeContext) -> u32 {
    let oc: u64 = ctx.arg(0).unwrap_or(0);
    match emit_oom_kill(oc, SRC_KPROBE, "oom_kill_kprobe") {
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
        count_lost(KIND_OOM_VICTIM, "mark_victim_btf");
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    fill_victim(ev, KIND_OOM_VICTIM, SRC_TP_BTF, task);
    // SAFETY: reserved slot.
    unsafe { (*ev).uid = uid };
    // A kill wakes the collector at once: torchelastic's error file must
    // be written before the victim's parent reaps it.
    entry.submit(crate::BPF_RB_FORCE_WAKEUP);
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
        count_lost(KIND_OOM_VICTIM, "mark_victim_tp");
        return Ok(0);
    };
    let ev = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = pid as u32;
    crate::agent_hold::victim_marked(tgid);
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
    // A kill wakes the collector at once: torchelastic's error file must
    // be written before the victim's parent reaps it.
    entry.submit(crate::BPF_RB_FORCE_WAKEUP);
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
        count_lost(KIND_PRINTK, "printk_console");
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
