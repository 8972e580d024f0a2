//! Bytes → typed events, in one place.
//!
//! Kernel records arrive as the `#[repr(C)]` structs of `trainbpf-common`;
//! userspace records (job start and end, lost counts, cgroup names) as JSON.
//! Every record is length-checked here; nothing downstream sees raw bytes.
//!
//! `events` holds what records decode to, `samples` the figures the
//! collector samples from /proc (filled there, read by the model),
//! `kernel` the kernel records, `user` the collector's JSON records, `gpu`
//! the GPU's of both kinds.

use serde::Deserialize;
use trainbpf_common as common;

/// What every record decodes to.
mod events;
/// GPU records: kernel kinds 20-29, collector kinds 110-119.
pub mod gpu;
/// A process's rank, run, Slurm step and cgroups, a collector record.
pub mod identity;
/// Kernel records, kinds below 100.
mod kernel;
/// What the recorder samples from /proc and the cgroup files.
pub mod samples;
/// Growth stacks (`record --stacks`), a collector record.
pub mod stacks;
/// The collector's own records, JSON.
mod user;
pub(crate) use events::tty_path;
pub use events::{
    CgroupName, Compaction, EbpfLog, Event, ExeName, ExitStatus, JobExit, JobReads, JobStart,
    KillVerdict, LeakWarning, Lost, MemSample, OomControl, OomRecord, OomRecordKind, ProcKey, Rss,
    SignalReceived, SignalRecord, SmapsSample, Task, Terminal, Timed,
};
pub use identity::ProcIdentity;
pub use samples::{
    CgroupPressure, Pressure, ProcInfo, Psi, ShmFs, ShmKind, ShmLook, ShmObject, ShmTrigger, Smaps,
};
pub use user::{UserBody, encode_user};

/// Record kinds written by the collector itself. Kernel kinds are below 100
/// (`trainbpf_common::KIND_*`); these never collide with them.
pub(crate) const KIND_JOB_START: u16 = 100;
pub(crate) const KIND_JOB_EXIT: u16 = 101;
pub(crate) const KIND_LOST: u16 = 102;
pub(crate) const KIND_CGROUP: u16 = 103;
pub(crate) const KIND_NOTE: u16 = 104;
pub(crate) const KIND_EXE: u16 = 105;
pub(crate) const KIND_PRESSURE: u16 = 106;
pub(crate) const KIND_SMAPS: u16 = 107;
pub(crate) const KIND_PROC_INFO: u16 = 108;
pub(crate) const KIND_SHM: u16 = 109;
/// What the flight recording's compaction folded (110-119 are the GPU's).
pub const KIND_COMPACTED: u16 = 120;
/// A leak the recorder warned of while the job ran.
pub(crate) const KIND_LEAK_WARNING: u16 = 121;
/// A signal the recorder itself received, with its real sender, and
/// whether it went on to the job ([`SignalReceived`]).
pub(crate) const KIND_SIGNAL_RECEIVED: u16 = 124;
/// Growth stacks drained from the kernel (`record --stacks`).
pub(crate) const KIND_STACKS: u16 = 125;
/// A job thread's stacks at a fatal signal (`record --stacks`).
pub(crate) const KIND_STACK_AT_DEATH: u16 = 126;
/// A message a kernel program logged (`record --ebpf-log`, [`EbpfLog`]).
pub(crate) const KIND_EBPF_LOG: u16 = 130;
/// A process's distributed identity: rank, run, Slurm ids, cgroups
/// ([`identity::ProcIdentity`]).
pub(crate) const KIND_IDENTITY: u16 = 131;
/// What reading the job's memory and files cost and skipped
/// ([`JobReads`], `procfs::guard`).
pub(crate) const KIND_JOB_READS: u16 = 140;
/// A kill's one line as the recorder told it at the kill
/// ([`KillVerdict`]): what its stderr, `--events-jsonl` and torchelastic's
/// error file said, which the report's `kills[].verdict` repeats.
pub(crate) const KIND_VERDICT: u16 = 141;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The record is shorter than its kind's struct.
    #[error("record of kind {kind} is {len} bytes, expected {want}")]
    Short { kind: u16, len: usize, want: usize },
    /// A kind this version doesn't know (written by a newer trainbpf?).
    #[error("unknown record kind {0}")]
    UnknownKind(u16),
    /// A userspace record whose JSON doesn't parse.
    #[error("record of kind {kind}: {msg}")]
    Json { kind: u16, msg: String },
}

fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Copies a `T` out of `bytes` after checking the length.
fn read_pod<T: Copy>(kind: u16, bytes: &[u8]) -> Result<T, DecodeError> {
    let want = size_of::<T>();
    if bytes.len() < want {
        return Err(DecodeError::Short {
            kind,
            len: bytes.len(),
            want,
        });
    }
    // SAFETY: length checked above; T is one of the plain #[repr(C)] integer
    // structs of trainbpf-common, valid for any bit pattern.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn json<T: for<'de> Deserialize<'de>>(kind: u16, bytes: &[u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(bytes).map_err(|e| DecodeError::Json {
        kind,
        msg: e.to_string(),
    })
}

fn key(h: &common::Header) -> ProcKey {
    ProcKey {
        tgid: h.tgid,
        start_ns: h.start_ns,
    }
}

/// The largest memory figure a record can give, in kB (1 PiB); more is
/// damage, and is clamped.
pub(crate) const MAX_KB: u64 = 1 << 40;
/// The latest time a record can give (CLOCK_MONOTONIC ns: 146 years of
/// uptime); later is damage, and is clamped so that time arithmetic
/// downstream cannot overflow.
pub(crate) const MAX_TS_NS: u64 = 1 << 62;

/// Decodes one record. `page_kb` converts page counts (from the recording
/// header's page size) to kB.
pub fn decode(kind: u16, bytes: &[u8], page_kb: u64) -> Result<Timed, DecodeError> {
    // A damaged record can say anything: memory figures are clamped to
    // MAX_KB so that no sum downstream overflows.
    let page_kb = page_kb.min(MAX_KB);
    let (ts_ns, event) = match kind {
        common::KIND_FORK => kernel::fork(kind, bytes)?,
        common::KIND_EXEC => kernel::exec(kind, bytes)?,
        common::KIND_EXIT => kernel::exit(kind, bytes)?,
        common::KIND_MEM => kernel::mem(kind, bytes, page_kb)?,
        common::KIND_OOM_VICTIM | common::KIND_OOM_KILL => kernel::oom(kind, bytes, page_kb)?,
        common::KIND_PRINTK => kernel::printk(kind, bytes)?,
        common::KIND_SIGNAL => kernel::signal(kind, bytes)?,
        common::KIND_OOM_ADJ => kernel::oom_adj(kind, bytes)?,
        common::KIND_CUDA | common::KIND_XID | common::KIND_NV_PAGES => {
            gpu::decode_kernel(kind, bytes)?
        }
        gpu::KIND_GPU_ATTACH..=gpu::KIND_GPU_USER_MAX => gpu::decode_user(kind, bytes)?,
        KIND_JOB_START | KIND_JOB_EXIT | KIND_LOST | KIND_CGROUP | KIND_NOTE | KIND_EXE
        | KIND_PRESSURE | KIND_SMAPS | KIND_PROC_INFO | KIND_SHM | KIND_COMPACTED
        | KIND_LEAK_WARNING | KIND_SIGNAL_RECEIVED | KIND_STACKS | KIND_STACK_AT_DEATH
        | KIND_EBPF_LOG | KIND_IDENTITY | KIND_JOB_READS | KIND_VERDICT => {
            user::decode(kind, bytes)?
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok(Timed {
        ts_ns: ts_ns.min(MAX_TS_NS),
        event,
    })
}

/// Test and fixture helper: the bytes the kernel would write for `v`.
pub fn pod_bytes<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: T is a plain #[repr(C)] struct without padding (size-asserted
    // in trainbpf-common); reading its bytes is defined.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(kind: u16, tgid: u32, ts: u64) -> common::Header {
        common::Header {
            kind,
            flags: common::FLAG_IN_JOB,
            tgid,
            ts_ns: ts,
            start_ns: 7,
        }
    }

    fn comm(s: &str) -> [u8; common::COMM_LEN] {
        let mut c = [0; common::COMM_LEN];
        c[..s.len()].copy_from_slice(s.as_bytes());
        c
    }

    #[test]
    fn mem_event_converts_pages_to_kb() {
        let e = common::MemEvent {
            hdr: hdr(common::KIND_MEM, 42, 1000),
            counters: [10, 256, 0, 3],
            faults: 99,
            reason: common::MEM_REASON_THRESHOLD,
            oom_score_adj: 500,
            comm: comm("python3"),
            pgtables_bytes: 8192,
            memcg_id: 77,
            stall_ns: 5,
            alloc_pages: 300,
            freed_pages: 44,
            cache_added_pages: 0,
            cache_removed_pages: 0,
        };
        let t = decode(common::KIND_MEM, &pod_bytes(&e), 4).unwrap();
        assert_eq!(t.ts_ns, 1000);
        let Event::Mem(MemSample {
            proc,
            in_job,
            comm,
            rss,
            faults,
            ..
        }) = t.event
        else {
            panic!("not a mem event: {:?}", t.event)
        };
        assert_eq!(
            proc,
            ProcKey {
                tgid: 42,
                start_ns: 7
            }
        );
        assert!(in_job);
        assert_eq!(comm, "python3");
        assert_eq!(rss.anon_kb, 1024);
        assert_eq!(rss.file_kb, 40);
        assert_eq!(rss.shmem_kb, 12);
        assert_eq!(faults, 99);
    }

    #[test]
    fn first_mem_layout_still_reads() {
        let e = common::MemEvent {
            hdr: hdr(common::KIND_MEM, 3, 1),
            counters: [0, 10, 0, 0],
            faults: 1,
            reason: common::MEM_REASON_FIRST,
            oom_score_adj: 0,
            comm: comm("old"),
            pgtables_bytes: 4096,
            memcg_id: 9,
            stall_ns: 1,
            alloc_pages: 1,
            freed_pages: 1,
            cache_added_pages: 0,
            cache_removed_pages: 0,
        };
        let b = pod_bytes(&e);
        let t = decode(common::KIND_MEM, &b[..common::MEM_EVENT_V1_SIZE], 4).unwrap();
        let Event::Mem(MemSample {
            rss,
            pgtables_kb,
            memcg_id,
            comm,
            ..
        }) = t.event
        else {
            panic!()
        };
        assert_eq!((rss.anon_kb, pgtables_kb, memcg_id), (40, 0, 0));
        assert_eq!(comm, "old");
    }

    #[test]
    fn short_record_is_an_error_not_a_panic() {
        let e = common::MemEvent {
            hdr: hdr(common::KIND_MEM, 1, 1),
            counters: [0; 4],
            faults: 0,
            reason: 0,
            oom_score_adj: 0,
            comm: [0; 16],
            pgtables_bytes: 0,
            memcg_id: 0,
            stall_ns: 0,
            alloc_pages: 0,
            freed_pages: 0,
            cache_added_pages: 0,
            cache_removed_pages: 0,
        };
        let b = pod_bytes(&e);
        assert_eq!(
            decode(common::KIND_MEM, &b[..40], 4),
            Err(DecodeError::Short {
                kind: common::KIND_MEM,
                len: 40,
                want: size_of::<common::MemEvent>()
            })
        );
        assert_eq!(decode(77, &b, 4), Err(DecodeError::UnknownKind(77)));
    }

    #[test]
    fn tracepoint_oom_counters_are_already_kb() {
        let mut e = common::OomEvent {
            hdr: hdr(common::KIND_OOM_VICTIM, 5, 9),
            victim_pid: 5,
            trigger_pid: 6,
            trigger_tgid: 6,
            uid: 1000,
            oom_score_adj: 1000,
            source: common::SRC_TRACEPOINT,
            oom_flags: common::OOM_FLAG_COUNTERS_KB,
            constraint: 0,
            counters: [100, 2000, 0, 30],
            total_vm: 5000,
            pgtables: 64,
            victim_memcg_id: 0,
            oc_memcg_id: 0,
            chosen_points: 0,
            totalpages: 0,
            comm: comm("victim"),
            trigger_comm: comm("grower"),
        };
        let Event::Oom(r) = decode(common::KIND_OOM_VICTIM, &pod_bytes(&e), 4)
            .unwrap()
            .event
        else {
            panic!()
        };
        assert_eq!(r.rss.anon_kb, 2000);
        assert_eq!(r.pgtables_kb, 64);
        assert_eq!(r.source, "tracepoint");
        assert!(r.oc.is_none());
        assert_eq!(r.trigger.comm, "grower");

        e.oom_flags = common::OOM_FLAG_HAS_OC;
        e.source = common::SRC_KPROBE;
        e.constraint = 3;
        e.pgtables = 8192;
        let Event::Oom(r) = decode(common::KIND_OOM_KILL, &pod_bytes(&e), 4)
            .unwrap()
            .event
        else {
            panic!()
        };
        assert_eq!(r.kind, OomRecordKind::Kill);
        assert_eq!(r.rss.anon_kb, 8000);
        assert_eq!(r.pgtables_kb, 8);
        assert_eq!(r.oc.unwrap().constraint, 3);
    }

    #[test]
    fn signal_names_the_terminal_and_reads_the_first_layout() {
        let mut name = [0u8; common::COMM_LEN];
        name[..4].copy_from_slice(b"pts3");
        let e = common::SignalEvent {
            hdr: common::Header {
                flags: common::FLAG_IN_JOB | common::FLAG_TTY | common::FLAG_SENDER_KTHREAD,
                ..hdr(common::KIND_SIGNAL, 42, 5)
            },
            target_pid: 42,
            sig: 2,
            code: 0x80,
            result: 0,
            sender_pid: 55,
            sender_tgid: 55,
            sender_uid: 0,
            _pad: 0,
            sender_comm: comm("kworker/u8:1"),
            comm: comm("python3"),
            tty_name: name,
            tty_session: 1234,
            tty_pgrp: 1240,
        };
        let b = pod_bytes(&e);
        let Event::Signal(r) = decode(common::KIND_SIGNAL, &b, 4).unwrap().event else {
            panic!()
        };
        assert!(r.sender_kthread);
        assert_eq!(
            r.tty,
            Some(Terminal {
                tty: "/dev/pts/3".into(),
                session: 1234,
                foreground_pgrp: 1240
            })
        );
        // A recording from before the terminal fields: 88 bytes, no tty.
        let old = &b[..common::SIGNAL_EVENT_V1_SIZE];
        let mut old = old.to_vec();
        old[2..4].copy_from_slice(&common::FLAG_IN_JOB.to_le_bytes());
        let Event::Signal(r) = decode(common::KIND_SIGNAL, &old, 4).unwrap().event else {
            panic!()
        };
        assert_eq!((r.sig, r.tty, r.sender_kthread), (2, None, false));
        assert_eq!(tty_path("ttyS0"), "/dev/ttyS0");
    }

    #[test]
    fn user_records_round_trip() {
        let (kind, bytes) = encode_user(
            5,
            UserBody::JobExit(JobExit {
                pid: 9,
                status: ExitStatus::Signal(9),
            }),
        );
        assert_eq!(kind, KIND_JOB_EXIT);
        let t = decode(kind, &bytes, 4).unwrap();
        assert_eq!(
            t.event,
            Event::JobExit(JobExit {
                pid: 9,
                status: ExitStatus::Signal(9)
            })
        );
        // A body under the wrong kind is rejected, not misread.
        assert!(matches!(
            decode(KIND_LOST, &bytes, 4),
            Err(DecodeError::Json { .. })
        ));
        let log = EbpfLog {
            program: "sched_fork".into(),
            level: "warn".into(),
            site: "trainbpf-ebpf/src/lifecycle.rs:58".into(),
            message: "JOB map full".into(),
        };
        let (kind, bytes) = encode_user(7, UserBody::EbpfLog(log.clone()));
        assert_eq!(kind, KIND_EBPF_LOG);
        let t = decode(kind, &bytes, 4).unwrap();
        assert_eq!((t.ts_ns, t.event), (7, Event::EbpfLog(log)));
    }

    #[test]
    fn page_cache_is_kept_out_of_growth_and_an_older_record_has_none() {
        let mut e: common::MemEvent =
            read_pod(common::KIND_MEM, &[0u8; size_of::<common::MemEvent>()]).unwrap();
        e.hdr = hdr(common::KIND_MEM, 9, 1);
        e.alloc_pages = 1000;
        e.freed_pages = 100;
        e.cache_added_pages = 600;
        e.cache_removed_pages = 50;
        let b = pod_bytes(&e);
        let Event::Mem(MemSample {
            alloc_kb,
            freed_kb,
            cache_kb,
            ..
        }) = decode(common::KIND_MEM, &b, 4).unwrap().event
        else {
            panic!("not a memory record")
        };
        assert_eq!((alloc_kb, freed_kb, cache_kb), (1600, 200, 2200));
        // The 128-byte layout: everything counted as before.
        let Event::Mem(MemSample {
            alloc_kb, cache_kb, ..
        }) = decode(common::KIND_MEM, &b[..common::MEM_EVENT_V2_SIZE], 4)
            .unwrap()
            .event
        else {
            panic!("not a memory record")
        };
        assert_eq!((alloc_kb, cache_kb), (4000, 0));
    }
}
