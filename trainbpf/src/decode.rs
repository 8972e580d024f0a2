//! Bytes → typed events, in one place.
//!
//! Kernel records arrive as the `#[repr(C)]` structs of `trainbpf-common`;
//! userspace records (job start and end, lost counts, cgroup names) as JSON.
//! Every record is length-checked here; nothing downstream sees raw bytes.

use serde::{Deserialize, Serialize};
use trainbpf_common as common;

/// GPU records: kernel kinds 20-29, collector kinds 110-119.
pub mod gpu;
/// What the recorder samples from /proc and the cgroup files.
pub mod samples;
pub use samples::{CgroupPressure, Pressure, ProcInfo, Psi, ShmKind, ShmObject, Smaps};

/// Record kinds written by the collector itself. Kernel kinds are below 100
/// (`trainbpf_common::KIND_*`); these never collide with them.
pub const KIND_JOB_START: u16 = 100;
pub const KIND_JOB_EXIT: u16 = 101;
pub const KIND_LOST: u16 = 102;
pub const KIND_CGROUP: u16 = 103;
pub const KIND_NOTE: u16 = 104;
pub const KIND_EXE: u16 = 105;
pub const KIND_PRESSURE: u16 = 106;
pub const KIND_SMAPS: u16 = 107;
pub const KIND_PROC_INFO: u16 = 108;
pub const KIND_SHM: u16 = 109;
/// What the flight recording's compaction folded (110-119 are the GPU's).
pub const KIND_COMPACTED: u16 = 120;
/// A leak the recorder warned of while the job ran.
pub const KIND_LEAK_WARNING: u16 = 121;
/// A signal the recorder itself received, with its real sender, and
/// whether it went on to the job ([`SignalReceived`]).
pub const KIND_SIGNAL_RECEIVED: u16 = 124;

/// A process, named so that a recycled pid is a different process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcKey {
    pub tgid: u32,
    /// Group leader's start time, CLOCK_MONOTONIC ns; 0 when unknown.
    pub start_ns: u64,
}

/// Resident memory split the way the kernel counts it, in kB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rss {
    pub anon_kb: u64,
    pub file_kb: u64,
    pub shmem_kb: u64,
    pub swap_kb: u64,
}

impl Rss {
    /// anon + file + shmem: what `ps` calls RSS.
    pub fn resident_kb(&self) -> u64 {
        self.anon_kb + self.file_kb + self.shmem_kb
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OomRecordKind {
    /// `mark_victim`: one per killed process.
    Victim,
    /// `oom_kill_process`: the kill's context (oom_control).
    Kill,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomControl {
    /// `enum oom_constraint`: 0 NONE, 1 CPUSET, 2 MEMORY_POLICY, 3 MEMCG.
    pub constraint: u32,
    pub chosen_points: i64,
    pub totalpages: u64,
    /// kernfs id of `oc->memcg`; 0 for a global OOM.
    pub memcg_id: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomRecord {
    pub kind: OomRecordKind,
    /// Which probe wrote it: "fentry", "kprobe", "tp_btf", "tracepoint".
    pub source: String,
    pub victim: ProcKey,
    pub victim_pid: u32,
    pub comm: String,
    pub in_job: bool,
    pub uid: u32,
    pub oom_score_adj: i32,
    pub rss: Rss,
    pub total_vm_kb: u64,
    pub pgtables_kb: u64,
    /// kernfs id of the victim's memory cgroup; 0 when unknown.
    pub memcg_id: u64,
    pub oc: Option<OomControl>,
    /// `current` when the kill happened: whose allocation failed.
    pub trigger: Task,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRecord {
    pub target: ProcKey,
    pub target_pid: u32,
    pub comm: String,
    pub sig: u32,
    /// `si_code`: 0 SI_USER (kill), 0x80 SI_KERNEL, <0 tkill/queue, >0 fault.
    pub code: i32,
    pub result: i32,
    pub sender: Task,
    pub sender_uid: u32,
    /// The sender is a kernel thread: a messenger, such as the kworker that
    /// ran a terminal's line discipline.
    #[serde(default)]
    pub sender_kthread: bool,
    /// For a signal the kernel generated: the target's controlling terminal
    /// as the kernel saw it then.
    #[serde(default)]
    pub tty: Option<Terminal>,
}

/// A terminal that generated a signal (a Ctrl-C, a hangup): its device,
/// session, and the foreground process group the signal went to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminal {
    /// `/dev/pts/3`, `/dev/tty1`.
    pub tty: String,
    pub session: u32,
    pub foreground_pgrp: u32,
}

/// `tty->name` as the device's path: `pts3` is `/dev/pts/3`.
pub fn tty_path(name: &str) -> String {
    match name.strip_prefix("pts") {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            format!("/dev/pts/{n}")
        }
        _ => format!("/dev/{name}"),
    }
}

/// A signal the recorder received on its signalfd. A signal it passes on
/// reaches the job with the recorder as its sender (the kernel's record
/// says so); this record names who really sent it, from `ssi_pid` and
/// `ssi_uid`, for the report to join with that kernel record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalReceived {
    pub sig: i32,
    /// `ssi_code`: 0 SI_USER (kill), 0x80 SI_KERNEL (a terminal's Ctrl-C).
    pub code: i32,
    /// `ssi_pid`/`ssi_uid`; 0 for a signal the kernel generated.
    pub sender_pid: u32,
    pub sender_uid: u32,
    /// Read from /proc when the signal was read; empty when the sender was
    /// already gone.
    pub sender_comm: String,
    pub sender_exe: String,
    pub recorder_pid: u32,
    /// The job process it was sent on to; `None` when it was not (a
    /// terminal's signal reached the job's process group itself).
    pub forwarded_to: Option<u32>,
    /// For a signal from the terminal: which, as the recorder saw it.
    pub terminal: Option<Terminal>,
}

/// How the job's main process ended, as `wait(2)` said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStart {
    pub pid: u32,
    pub start_ns: u64,
    pub argv: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// Memory cgroup created for `--memory-limit`, as a path under the
    /// hierarchy's mount (e.g. `/trainbpf-1234`).
    pub cgroup: Option<String>,
    pub memory_limit_bytes: Option<u64>,
    /// How the recorder attached to a job it did not start: "pid",
    /// "cgroup" or "all"; None when it ran the job.
    #[serde(default)]
    pub attached: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobExit {
    pub pid: u32,
    pub status: ExitStatus,
}

/// Cumulative counts, summed over CPUs; the last record wins.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Ring-buffer records lost, indexed by kernel record kind.
    pub by_kind: Vec<u64>,
    /// Records the collector could not decode.
    pub undecodable: u64,
    /// Job processes whose memory went uncounted (the per-process map was
    /// full), and job members the job map had no room for: lost events.
    pub proc_map_full: u64,
    pub job_map_full: u64,
    /// Processes outside the job the per-process map had no room for
    /// (outside the job's reserve): not the job's loss.
    #[serde(default)]
    pub other_map_full: u64,
    /// Samples (memory, pressure) the recorder dropped because the disk was
    /// full and its in-memory backlog reached its bound.
    #[serde(default)]
    pub dropped_disk_full: u64,
}

impl Lost {
    /// Ring-buffer losses of the main ring (memory, lifecycle, GPU) and of
    /// the precious one (kills, deaths, signals: `common::is_precious`).
    pub fn by_ring(&self) -> (u64, u64) {
        self.by_kind
            .iter()
            .enumerate()
            .fold((0u64, 0u64), |(main, precious), (kind, &n)| {
                if u16::try_from(kind).is_ok_and(common::is_precious) {
                    (main, precious.saturating_add(n))
                } else {
                    (main.saturating_add(n), precious)
                }
            })
    }

    pub fn total(&self) -> u64 {
        self.by_kind
            .iter()
            .fold(self.undecodable, |a, &b| a.saturating_add(b))
            .saturating_add(self.dropped_disk_full)
            .saturating_add(self.proc_map_full)
            .saturating_add(self.job_map_full)
    }
}

/// A process's executable, read from /proc while it lived (for signal
/// senders: systemd-oomd, earlyoom, kubelet, a shell).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExeName {
    pub tgid: u32,
    pub exe: String,
    #[serde(default)]
    pub uid: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupName {
    pub id: u64,
    pub path: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Fork {
        child: ProcKey,
        parent: ProcKey,
        comm: String,
    },
    Exec {
        proc: ProcKey,
        comm: String,
        filename: String,
        truncated: bool,
    },
    Exit {
        proc: ProcKey,
        comm: String,
        /// `task->exit_code`, wait-status encoded.
        exit_code: u32,
        group_exit_code: u32,
    },
    Mem {
        proc: ProcKey,
        in_job: bool,
        comm: String,
        rss: Rss,
        faults: u64,
        reason: u32,
        /// The process's badness inputs besides RSS (0 in old recordings).
        oom_score_adj: i32,
        pgtables_kb: u64,
        memcg_id: u64,
        /// Cumulative reclaim/compaction stall time, ns.
        stall_ns: u64,
        /// Memory allocated and freed in the process's context so far, kB
        /// (0 in old recordings), page cache left out.
        alloc_kb: u64,
        freed_kb: u64,
        /// Page cache added minus removed in the process's context so far,
        /// kB (0 in older recordings, where it is part of the above).
        cache_kb: i64,
    },
    Oom(Box<OomRecord>),
    Printk {
        tgid: u32,
        msg: String,
    },
    /// A signal sent to a job process, and who sent it.
    Signal(Box<SignalRecord>),
    /// A process's `oom_score_adj` changed.
    OomAdj {
        proc: ProcKey,
        in_job: bool,
        comm: String,
        oom_score_adj: i32,
        writer_tgid: u32,
    },
    JobStart(JobStart),
    JobExit(JobExit),
    Lost(Lost),
    Cgroup(CgroupName),
    Exe(ExeName),
    Pressure(Box<Pressure>),
    /// USS/PSS of the job's live processes.
    Smaps(SmapsSample),
    ProcInfo(ProcInfo),
    /// Shared-memory objects, each once.
    Shm(Vec<ShmObject>),
    /// A CUDA call, an Xid, an NVML sample, what the GPU probes attached.
    Gpu(Box<gpu::GpuEvent>),
    Note(String),
    /// Older history was downsampled to stay within `record --max-size`.
    Compacted(Compaction),
    /// The recorder warned of a suspected leak while the job ran.
    LeakWarning(LeakWarning),
    /// The recorder received a signal (and maybe passed it on).
    SignalReceived(SignalReceived),
}

/// A leak `record` warned of while the job ran, as its leak model (the
/// report's) saw it then: the warning the user got before any kill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakWarning {
    /// The process; `None` for a role group.
    pub pid: Option<u32>,
    pub start_ns: u64,
    pub comm: String,
    pub group: Option<String>,
    pub members: u64,
    /// The climb's slope, bytes per second, and its fit in thousandths.
    pub slope_bytes_per_s: u64,
    pub fit_permille: u32,
    /// When the sustained climb began (CLOCK_MONOTONIC ns).
    pub since_ns: u64,
    /// When the leaks running then would reach `limit_kb` at their rate,
    /// seconds after the warning; `None` without a projection.
    pub projected_oom_s: Option<u64>,
    pub limit_kb: Option<u64>,
    /// `cgroup` (the job's memory cgroup) or `machine` (RAM plus swap).
    pub limit_of: Option<String>,
}

/// What the bounded flight recording did to older history, as of its last
/// compaction (one record: each compaction replaces the one before).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// Compactions so far.
    pub count: u64,
    /// Records from here on (CLOCK_MONOTONIC ns) were kept whole at the
    /// last compaction; samples before it were downsampled.
    pub full_from_ns: u64,
    /// The resolutions older samples were folded to, finest first:
    /// `[older_than_s, bucket_s]` (age measured at `full_from_ns`'s
    /// compaction).
    pub tiers: Vec<[u64; 2]>,
    /// The windows before kills: kept whole (0), or one sample per process
    /// per this many seconds, with the bucket's peaks.
    #[serde(default)]
    pub kill_window_bucket_s: u64,
    /// Samples (memory, pressure, USS/PSS, NVML) folded away, in all.
    pub samples_folded: u64,
    /// The last compaction's input, bytes, and its output up to this
    /// record.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// The size the recording is kept under (`record --max-size`).
    pub max_size: u64,
}

/// One round of /proc/PID/smaps_rollup reads, and what it cost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmapsSample {
    pub procs: Vec<Smaps>,
    /// Wall time the reads took, µs: the price of USS/PSS.
    pub cost_us: u64,
}

/// An event and when it happened (CLOCK_MONOTONIC ns).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Timed {
    pub ts_ns: u64,
    pub event: Event,
}

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

fn source_name(source: u32) -> &'static str {
    match source {
        common::SRC_FENTRY => "fentry",
        common::SRC_KPROBE => "kprobe",
        common::SRC_TP_BTF => "tp_btf",
        common::SRC_TRACEPOINT => "tracepoint",
        _ => "unknown",
    }
}

/// The largest memory figure a record can give, in kB (1 PiB); more is
/// damage, and is clamped.
pub const MAX_KB: u64 = 1 << 40;
/// The latest time a record can give (CLOCK_MONOTONIC ns: 146 years of
/// uptime); later is damage, and is clamped so that time arithmetic
/// downstream cannot overflow.
pub const MAX_TS_NS: u64 = 1 << 62;

/// Decodes one record. `page_kb` converts page counts (from the recording
/// header's page size) to kB.
pub fn decode(kind: u16, bytes: &[u8], page_kb: u64) -> Result<Timed, DecodeError> {
    // A damaged record can say anything: memory figures are clamped to
    // MAX_KB so that no sum downstream overflows.
    let page_kb = page_kb.min(MAX_KB);
    let pages = |p: i64| (p.max(0) as u64).saturating_mul(page_kb).min(MAX_KB);
    let (ts_ns, event) = match kind {
        common::KIND_FORK => {
            let e: common::ForkEvent = read_pod(kind, bytes)?;
            let ev = Event::Fork {
                child: key(&e.hdr),
                parent: ProcKey {
                    tgid: e.parent_tgid,
                    start_ns: e.parent_start_ns,
                },
                comm: cstr(&e.comm),
            };
            (e.hdr.ts_ns, ev)
        }
        common::KIND_EXEC => {
            let e: common::ExecEvent = read_pod(kind, bytes)?;
            let ev = Event::Exec {
                proc: key(&e.hdr),
                comm: cstr(&e.comm),
                filename: cstr(&e.filename),
                truncated: e.hdr.flags & common::FLAG_TRUNCATED != 0,
            };
            (e.hdr.ts_ns, ev)
        }
        common::KIND_EXIT => {
            let e: common::ExitEvent = read_pod(kind, bytes)?;
            let ev = Event::Exit {
                proc: key(&e.hdr),
                comm: cstr(&e.comm),
                exit_code: e.exit_code,
                group_exit_code: e.group_exit_code,
            };
            (e.hdr.ts_ns, ev)
        }
        common::KIND_MEM => {
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
            let ev = Event::Mem {
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
            };
            (e.hdr.ts_ns, ev)
        }
        common::KIND_OOM_VICTIM | common::KIND_OOM_KILL => {
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
            (e.hdr.ts_ns, Event::Oom(Box::new(rec)))
        }
        common::KIND_PRINTK => {
            let e: common::PrintkEvent = read_pod(kind, bytes)?;
            let n = (e.len as usize).min(e.msg.len());
            let ev = Event::Printk {
                tgid: e.hdr.tgid,
                msg: cstr(&e.msg[..n]).trim_end().to_string(),
            };
            (e.hdr.ts_ns, ev)
        }
        common::KIND_SIGNAL => {
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
            (e.hdr.ts_ns, Event::Signal(Box::new(rec)))
        }
        common::KIND_OOM_ADJ => {
            let e: common::AdjEvent = read_pod(kind, bytes)?;
            let ev = Event::OomAdj {
                proc: key(&e.hdr),
                in_job: e.hdr.flags & common::FLAG_IN_JOB != 0,
                comm: cstr(&e.comm),
                oom_score_adj: e.oom_score_adj,
                writer_tgid: e.writer_tgid,
            };
            (e.hdr.ts_ns, ev)
        }
        common::KIND_CUDA | common::KIND_XID | common::KIND_NV_PAGES => {
            gpu::decode_kernel(kind, bytes)?
        }
        gpu::KIND_GPU_ATTACH..=gpu::KIND_GPU_USER_MAX => gpu::decode_user(kind, bytes)?,
        KIND_JOB_START | KIND_JOB_EXIT | KIND_LOST | KIND_CGROUP | KIND_NOTE | KIND_EXE
        | KIND_PRESSURE | KIND_SMAPS | KIND_PROC_INFO | KIND_SHM | KIND_COMPACTED
        | KIND_LEAK_WARNING | KIND_SIGNAL_RECEIVED => {
            let w: UserRecord = json(kind, bytes)?;
            let ev = match (kind, w.body) {
                (KIND_JOB_START, UserBody::JobStart(j)) => Event::JobStart(j),
                (KIND_JOB_EXIT, UserBody::JobExit(j)) => Event::JobExit(j),
                (KIND_LOST, UserBody::Lost(l)) => Event::Lost(l),
                (KIND_CGROUP, UserBody::Cgroup(c)) => Event::Cgroup(c),
                (KIND_NOTE, UserBody::Note(n)) => Event::Note(n),
                (KIND_EXE, UserBody::Exe(x)) => Event::Exe(x),
                (KIND_PRESSURE, UserBody::Pressure(p)) => Event::Pressure(p),
                (KIND_SMAPS, UserBody::Smaps(s)) => Event::Smaps(s),
                (KIND_PROC_INFO, UserBody::ProcInfo(i)) => Event::ProcInfo(i),
                (KIND_SHM, UserBody::Shm(o)) => Event::Shm(o),
                (KIND_COMPACTED, UserBody::Compacted(c)) => Event::Compacted(c),
                (KIND_LEAK_WARNING, UserBody::LeakWarning(w)) => Event::LeakWarning(w),
                (KIND_SIGNAL_RECEIVED, UserBody::SignalReceived(r)) => Event::SignalReceived(r),
                _ => {
                    return Err(DecodeError::Json {
                        kind,
                        msg: "body does not match the record kind".into(),
                    });
                }
            };
            (w.ts_ns, ev)
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok(Timed {
        ts_ns: ts_ns.min(MAX_TS_NS),
        event,
    })
}

/// The JSON body of a userspace record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UserRecord {
    pub ts_ns: u64,
    pub body: UserBody,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserBody {
    JobStart(JobStart),
    JobExit(JobExit),
    Lost(Lost),
    Cgroup(CgroupName),
    Note(String),
    Exe(ExeName),
    Pressure(Box<Pressure>),
    Smaps(SmapsSample),
    ProcInfo(ProcInfo),
    Shm(Vec<ShmObject>),
    Compacted(Compaction),
    LeakWarning(LeakWarning),
    SignalReceived(SignalReceived),
}

impl UserBody {
    pub fn kind(&self) -> u16 {
        match self {
            UserBody::JobStart(_) => KIND_JOB_START,
            UserBody::JobExit(_) => KIND_JOB_EXIT,
            UserBody::Lost(_) => KIND_LOST,
            UserBody::Cgroup(_) => KIND_CGROUP,
            UserBody::Note(_) => KIND_NOTE,
            UserBody::Exe(_) => KIND_EXE,
            UserBody::Pressure(_) => KIND_PRESSURE,
            UserBody::Smaps(_) => KIND_SMAPS,
            UserBody::ProcInfo(_) => KIND_PROC_INFO,
            UserBody::Shm(_) => KIND_SHM,
            UserBody::Compacted(_) => KIND_COMPACTED,
            UserBody::LeakWarning(_) => KIND_LEAK_WARNING,
            UserBody::SignalReceived(_) => KIND_SIGNAL_RECEIVED,
        }
    }
}

/// Encodes a userspace record (the collector's side of `decode`).
pub fn encode_user(ts_ns: u64, body: UserBody) -> (u16, Vec<u8>) {
    let kind = body.kind();
    let bytes = serde_json::to_vec(&UserRecord { ts_ns, body })
        .expect("serializing plain data cannot fail");
    (kind, bytes)
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
        let Event::Mem {
            proc,
            in_job,
            comm,
            rss,
            faults,
            ..
        } = t.event
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
        let Event::Mem {
            rss,
            pgtables_kb,
            memcg_id,
            comm,
            ..
        } = t.event
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
    }

    #[test]
    fn a_full_map_of_the_jobs_is_a_lost_event_and_one_outside_it_is_not() {
        let lost = Lost {
            by_kind: vec![0, 1],
            proc_map_full: 2,
            job_map_full: 3,
            other_map_full: 100,
            ..Default::default()
        };
        assert_eq!(lost.total(), 6);
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
        let Event::Mem {
            alloc_kb,
            freed_kb,
            cache_kb,
            ..
        } = decode(common::KIND_MEM, &b, 4).unwrap().event
        else {
            panic!("not a memory record")
        };
        assert_eq!((alloc_kb, freed_kb, cache_kb), (1600, 200, 2200));
        // The 128-byte layout: everything counted as before.
        let Event::Mem {
            alloc_kb, cache_kb, ..
        } = decode(common::KIND_MEM, &b[..common::MEM_EVENT_V2_SIZE], 4)
            .unwrap()
            .event
        else {
            panic!("not a memory record")
        };
        assert_eq!((alloc_kb, cache_kb), (4000, 0));
    }
}
