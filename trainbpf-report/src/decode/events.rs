//! The recording's events: what every record decodes to, kernel's and
//! collector's alike. The sampled figures they carry are in `samples`.

use serde::{Deserialize, Serialize};
use trainbpf_common as common;

use super::{Pressure, ProcInfo, ShmLook, Smaps, gpu};

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
pub(crate) fn tty_path(name: &str) -> String {
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
    /// What was attached to, as the user named it: the `--cgroup`
    /// directory; None otherwise.
    #[serde(default)]
    pub target: Option<String>,
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
    /// Growth stacks the kernel could not aggregate (its map was full):
    /// lost events.
    #[serde(default)]
    pub stack_map_full: u64,
    /// Growth stacks the kernel could not read: recorded as unreadable
    /// stacks, with their error, so not lost.
    #[serde(default)]
    pub stack_errors: u64,
    /// New growth stacks whose user-stack copy found the ring full: named
    /// by frame pointers alone, so not lost either, but less well.
    #[serde(default)]
    pub stack_copies_lost: u64,
}

impl Lost {
    /// Ring-buffer losses of the main ring (memory, lifecycle, GPU) and of
    /// the precious one (kills, deaths, signals: `common::is_precious`).
    pub(crate) fn by_ring(&self) -> (u64, u64) {
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
            .saturating_add(self.stack_map_full)
    }
}

/// A kill's line as the recorder told it, once, at the kill (its stderr,
/// `--events-jsonl`, torchelastic's error file): the record's time is the
/// kill's first kernel record, `proc` its victim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillVerdict {
    pub proc: ProcKey,
    pub line: String,
}

/// What reading the job's memory, `/proc` entries and mapped files cost
/// and skipped (`procfs::guard`): cumulative, the last record wins. The
/// job can make such a read wait as long as it likes; each is made off the
/// thread that drains the rings, with a deadline, and every bound hit is
/// counted here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobReads {
    /// Reads abandoned past their deadline (their worker may stay blocked
    /// in the kernel).
    pub stalled: u64,
    /// Workers still blocked in such a read when this was written.
    pub stuck: u64,
    /// Reads not made because too many earlier ones were still blocked.
    pub refused: u64,
    /// Reads skipped because the memory or file lies on a FUSE
    /// filesystem, whose server (perhaps the job) may never answer.
    pub fuse_skipped: u64,
    /// Processes whose identity and command line went unread: the queue of
    /// such reads was full.
    pub queue_full: u64,
    /// Times a process's cache of CPython code objects was cleared, full.
    pub py_cache_cleared: u64,
    /// Processes whose budget of bytes read for CPython names and line
    /// tables ran out: their later frames are not named.
    pub py_budget_spent: u64,
    /// Python frames left unnamed because a naming pass's bound was
    /// reached.
    pub py_frames_cut: u64,
    /// Executables and cgroups not named: their cache was full.
    pub names_cut: u64,
    /// Files whose unwind tables were not read (over their bound, outside
    /// the file, not ELF): their frames by frame pointers only.
    #[serde(default)]
    pub unwind_refused: u64,
    /// Requests the frames' namer (the unprivileged child that parses
    /// the job's files) failed: it crashed, hung or refused; those stacks
    /// went unnamed.
    #[serde(default)]
    pub namer_failed: u64,
    /// The first few reads that stalled or were skipped: process, what,
    /// why.
    pub notes: Vec<String>,
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

/// A process's memory, as the kernel sent it when it moved by the
/// threshold, at a heartbeat, on first sight or at exit (`reason`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemSample {
    pub proc: ProcKey,
    pub in_job: bool,
    pub comm: String,
    pub rss: Rss,
    pub faults: u64,
    pub reason: u32,
    /// The process's badness inputs besides RSS (0 in old recordings).
    pub oom_score_adj: i32,
    pub pgtables_kb: u64,
    pub memcg_id: u64,
    /// Cumulative reclaim/compaction stall time, ns.
    pub stall_ns: u64,
    /// Memory allocated and freed in the process's context so far, kB
    /// (0 in old recordings), page cache left out.
    pub alloc_kb: u64,
    pub freed_kb: u64,
    /// Page cache added minus removed in the process's context so far,
    /// kB (0 in older recordings, where it is part of the above).
    pub cache_kb: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Fork {
        child: ProcKey,
        parent: ProcKey,
        comm: String,
        /// The child is a kernel thread (`PF_KTHREAD`): seen with `--all`.
        #[serde(default)]
        kthread: bool,
    },
    Exec {
        proc: ProcKey,
        comm: String,
        filename: String,
        truncated: bool,
        /// The kernel stopped the process at this exec (the job's root,
        /// before its first instruction) for the recorder to look for its
        /// interpreter; the recorder continued it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        held: bool,
    },
    Exit {
        proc: ProcKey,
        comm: String,
        /// `task->exit_code`, wait-status encoded.
        exit_code: u32,
        group_exit_code: u32,
        /// A kernel thread ended (`PF_KTHREAD`): seen with `--all`.
        #[serde(default)]
        kthread: bool,
    },
    Mem(MemSample),
    Oom(Box<OomRecord>),
    Printk {
        tgid: u32,
        msg: String,
    },
    /// A signal sent to a job process, and who sent it.
    Signal(Box<SignalRecord>),
    /// What reading the job cost and skipped ([`JobReads`]).
    JobReads(JobReads),
    /// A kill's line as the recorder told it at the kill.
    Verdict(KillVerdict),
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
    /// A process's rank, run, Slurm ids and cgroups, read at its exec.
    Identity(super::ProcIdentity),
    /// A look at shared memory: the objects, each once, and /dev/shm.
    Shm(ShmLook),
    /// A CUDA call, an Xid, an NVML sample, what the GPU probes attached.
    Gpu(Box<gpu::GpuEvent>),
    Note(String),
    /// Older history was downsampled to stay within `record --max-size`.
    Compacted(Compaction),
    /// The recorder warned of a suspected leak while the job ran.
    LeakWarning(LeakWarning),
    /// The recorder received a signal (and maybe passed it on).
    SignalReceived(SignalReceived),
    /// Growth stacks' deltas (`record --stacks`).
    Stacks(super::stacks::StackSample),
    /// A job thread's stacks at a fatal signal.
    StackAtDeath(super::stacks::StackAtDeath),
    /// A kernel program logged something only it could see
    /// (`record --ebpf-log`).
    EbpfLog(EbpfLog),
}

/// One message a kernel program logged through aya-log (`record
/// --ebpf-log`): a map that filled, a ring that refused a record, a read
/// at BTF's offset that failed. Written by the program; escape it before
/// it reaches a terminal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbpfLog {
    /// The program that logged it (`page_alloc`, `sched_fork`...).
    pub program: String,
    /// aya-log's level: `error`, `warn`, `info`, `debug`, `trace`.
    pub level: String,
    /// Where in the eBPF source: `file:line`.
    pub site: String,
    pub message: String,
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
    /// Not a leak but memory about to run out: the climbs projected to
    /// reach the limit within minutes, shorter than `--leak-span` or not
    /// (the steepest named, the slope theirs together). Absent in
    /// recordings made before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub running_out: bool,
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
    /// CPU time the round took, its reads' included, µs: the price of
    /// USS/PSS (wall time in recordings before 2026-12-08).
    pub cost_us: u64,
}

/// An event and when it happened (CLOCK_MONOTONIC ns).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Timed {
    pub ts_ns: u64,
    pub event: Event,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
