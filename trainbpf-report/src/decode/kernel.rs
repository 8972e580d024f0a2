//! Kernel records (kinds below 100): the `#[repr(C)]` structs of
//! `trainbpf-common`, length-checked, turned into events. Page counts
//! become kB with the recording's page size, and every figure is clamped
//! to `MAX_KB`: a damaged record can say anything.

use crate::decode::MemSample;
use trainbpf_common as common;

use super::{
    DecodeError, Event, MAX_KB, OomControl, OomRecord, OomRecordKind, ProcKey, Rss, SignalRecord,
    Task, Terminal, cstr, key, read_pod, tty_path,
};

/// A fork: the child, its parent, its name.
pub(super) fn fork(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let e: common::ForkEvent = read_pod(kind, bytes)?;
    let ev = Event::Fork {
        child: key(&e.hdr),
        parent: ProcKey {
            tgid: e.parent_tgid,
            start_ns: e.parent_start_ns,
        },
        comm: cstr(&e.comm),
        kthread: e.hdr.flags & common::FLAG_KTHREAD != 0,
    };
    Ok((e.hdr.ts_ns, ev))
}

/// An exec: the new program and its name.
pub(super) fn exec(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let e: common::ExecEvent = read_pod(kind, bytes)?;
    let ev = Event::Exec {
        proc: key(&e.hdr),
        comm: cstr(&e.comm),
        filename: cstr(&e.filename),
        truncated: e.hdr.flags & common::FLAG_TRUNCATED != 0,
        held: e.hdr.flags & common::FLAG_EXEC_HELD != 0,
    };
    Ok((e.hdr.ts_ns, ev))
}

/// A process exit, with its wait status.
pub(super) fn exit(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let e: common::ExitEvent = read_pod(kind, bytes)?;
    let ev = Event::Exit {
        proc: key(&e.hdr),
        comm: cstr(&e.comm),
        exit_code: e.exit_code,
        group_exit_code: e.group_exit_code,
        kthread: e.hdr.flags & common::FLAG_KTHREAD != 0,
    };
    Ok((e.hdr.ts_ns, ev))
}

/// A memory sample: RSS by kind, the badness inputs, and what the process allocated and freed in its own context.
pub(super) fn mem(kind: u16, bytes: &[u8], page_kb: u64) -> Result<(u64, Event), DecodeError> {
    let pages = |p: i64| (p.max(0) as u64).saturating_mul(page_kb).min(MAX_KB);
    // Records of the first, shorter layout read with the newer
    // fields zero.
    let e: common::MemEvent = if bytes.len() >= common::MEM_EVENT_V1_SIZE
        && bytes.len() < size_of::<common::MemEvent>()
    {
        let mut full = vec![0u8; size_of::<common::MemEvent>()];
        full[..bytes.len()].copy_from_slice(bytes);
        read_pod(kind, &full)?
    } else {
        read_pod(kind, bytes)?
    };
    let c = e.counters;
    let ev = Event::Mem(MemSample {
        proc: key(&e.hdr),
        in_job: e.hdr.flags & common::FLAG_IN_JOB != 0,
        comm: cstr(&e.comm),
        rss: Rss {
            anon_kb: pages(c[common::MM_ANONPAGES]),
            file_kb: pages(c[common::MM_FILEPAGES]),
            shmem_kb: pages(c[common::MM_SHMEMPAGES]),
            swap_kb: pages(c[common::MM_SWAPENTS]),
        },
        faults: e.faults,
        reason: e.reason,
        oom_score_adj: e.oom_score_adj,
        pgtables_kb: (e.pgtables_bytes / 1024).min(MAX_KB),
        memcg_id: e.memcg_id,
        stall_ns: e.stall_ns,
        // Page cache brought in (or dropped) in the process's
        // context is not its growth: it is taken out of both sides
        // and kept apart.
        alloc_kb: e
            .alloc_pages
            .saturating_sub(e.cache_added_pages)
            .saturating_mul(page_kb)
            .min(MAX_KB),
        freed_kb: e
            .freed_pages
            .saturating_sub(e.cache_removed_pages)
            .saturating_mul(page_kb)
            .min(MAX_KB),
        cache_kb: (e.cache_added_pages as i64)
            .wrapping_sub(e.cache_removed_pages as i64)
            .saturating_mul(page_kb as i64)
            .clamp(-(MAX_KB as i64), MAX_KB as i64),
    });
    Ok((e.hdr.ts_ns, ev))
}

/// An OOM record: `mark_victim` or `oom_kill_process`.
pub(super) fn oom(kind: u16, bytes: &[u8], page_kb: u64) -> Result<(u64, Event), DecodeError> {
    let pages = |p: i64| (p.max(0) as u64).saturating_mul(page_kb).min(MAX_KB);
    let e: common::OomEvent = read_pod(kind, bytes)?;
    let kb = e.oom_flags & common::OOM_FLAG_COUNTERS_KB != 0;
    let conv = |v: i64| {
        if kb {
            (v.max(0) as u64).min(MAX_KB)
        } else {
            pages(v)
        }
    };
    let c = e.counters;
    let rec = OomRecord {
        kind: if kind == common::KIND_OOM_KILL {
            OomRecordKind::Kill
        } else {
            OomRecordKind::Victim
        },
        source: source_name(e.source).to_string(),
        victim: key(&e.hdr),
        victim_pid: e.victim_pid,
        comm: cstr(&e.comm),
        in_job: e.hdr.flags & common::FLAG_IN_JOB != 0,
        uid: e.uid,
        oom_score_adj: e.oom_score_adj,
        rss: Rss {
            anon_kb: conv(c[common::MM_ANONPAGES]),
            file_kb: conv(c[common::MM_FILEPAGES]),
            shmem_kb: conv(c[common::MM_SHMEMPAGES]),
            swap_kb: conv(c[common::MM_SWAPENTS]),
        },
        total_vm_kb: if kb {
            e.total_vm
        } else {
            e.total_vm.saturating_mul(page_kb)
        }
        .min(MAX_KB),
        pgtables_kb: if kb { e.pgtables } else { e.pgtables / 1024 }.min(MAX_KB),
        memcg_id: e.victim_memcg_id,
        oc: (e.oom_flags & common::OOM_FLAG_HAS_OC != 0).then_some(OomControl {
            constraint: e.constraint,
            chosen_points: e.chosen_points,
            totalpages: e.totalpages,
            memcg_id: e.oc_memcg_id,
        }),
        trigger: Task {
            pid: e.trigger_pid,
            tgid: e.trigger_tgid,
            comm: cstr(&e.trigger_comm),
        },
    };
    Ok((e.hdr.ts_ns, Event::Oom(Box::new(rec))))
}

/// A kernel log line about an OOM.
pub(super) fn printk(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let e: common::PrintkEvent = read_pod(kind, bytes)?;
    let n = (e.len as usize).min(e.msg.len());
    let ev = Event::Printk {
        tgid: e.hdr.tgid,
        msg: cstr(&e.msg[..n]).trim_end().to_string(),
    };
    Ok((e.hdr.ts_ns, ev))
}

/// A signal sent to a job process.
pub(super) fn signal(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    // Records of the first, shorter layout read with the terminal
    // fields zero.
    let e: common::SignalEvent = if bytes.len() >= common::SIGNAL_EVENT_V1_SIZE
        && bytes.len() < size_of::<common::SignalEvent>()
    {
        let mut full = vec![0u8; size_of::<common::SignalEvent>()];
        full[..bytes.len()].copy_from_slice(bytes);
        read_pod(kind, &full)?
    } else {
        read_pod(kind, bytes)?
    };
    let rec = SignalRecord {
        target: key(&e.hdr),
        target_pid: e.target_pid,
        comm: cstr(&e.comm),
        sig: e.sig,
        code: e.code,
        result: e.result,
        sender: Task {
            pid: e.sender_pid,
            tgid: e.sender_tgid,
            comm: cstr(&e.sender_comm),
        },
        sender_uid: e.sender_uid,
        sender_kthread: e.hdr.flags & common::FLAG_SENDER_KTHREAD != 0,
        tty: (e.hdr.flags & common::FLAG_TTY != 0).then(|| Terminal {
            tty: tty_path(&cstr(&e.tty_name)),
            session: e.tty_session,
            foreground_pgrp: e.tty_pgrp,
        }),
    };
    Ok((e.hdr.ts_ns, Event::Signal(Box::new(rec))))
}

/// A write to `oom_score_adj`.
pub(super) fn oom_adj(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let e: common::AdjEvent = read_pod(kind, bytes)?;
    let ev = Event::OomAdj {
        proc: key(&e.hdr),
        in_job: e.hdr.flags & common::FLAG_IN_JOB != 0,
        comm: cstr(&e.comm),
        oom_score_adj: e.oom_score_adj,
        writer_tgid: e.writer_tgid,
    };
    Ok((e.hdr.ts_ns, ev))
}

fn source_name(source: u32) -> &'static str {
    match source {
        common::SRC_FENTRY => "fentry",
        common::SRC_KPROBE => "kprobe",
        common::SRC_TP_BTF => "tp_btf",
        common::SRC_TRACEPOINT => "tracepoint",
        _ => "unknown",
    }
}
