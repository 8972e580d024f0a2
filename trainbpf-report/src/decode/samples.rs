//! What the recorder samples from /proc and the cgroup files, as the
//! recording stores it: memory and pressure, USS/PSS, who a process is,
//! shared-memory objects.
//!
//! The collector (`procfs.rs`, `pressure.rs`) fills these; the recording
//! carries them in its events; the model only reads them. They live here,
//! with the events, so that the model needs nothing from the collector.

use serde::{Deserialize, Serialize};

/// One sample of the machine (and the job's cgroup, if any), once a
/// second: see `pressure.rs` for the sources.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pressure {
    pub mem_total_kb: u64,
    pub mem_available_kb: u64,
    pub swap_total_kb: u64,
    pub swap_free_kb: u64,
    pub shmem_kb: u64,
    pub committed_as_kb: u64,
    pub commit_limit_kb: u64,
    /// vm.overcommit_memory: 0 heuristic, 1 always, 2 never.
    pub overcommit_memory: Option<u32>,
    pub cgroup: Option<CgroupPressure>,
    pub psi: Option<Psi>,
    /// Cumulative stall time and count, all tasks: direct reclaim, memcg
    /// reclaim, compaction.
    #[serde(default)]
    pub stall_ns: [u64; 3],
    #[serde(default)]
    pub stall_count: [u64; 3],
    /// Cumulative: what the job's threads freed inside reclaim or
    /// compaction (other processes' memory and cache), kB. Not charged to
    /// them.
    #[serde(default)]
    pub reclaim_freed_kb: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupPressure {
    pub usage_kb: u64,
    /// None: no limit.
    pub limit_kb: Option<u64>,
    /// v2 memory.events `max` (hits of the limit), v1 memory.failcnt.
    pub max_events: u64,
    /// v2 memory.events `oom` / `oom_kill`; v1 memory.oom_control `oom_kill`.
    pub oom_events: u64,
    pub oom_kill_events: u64,
    /// From memory.stat: page cache, and kernel memory (v2 `kernel`, v1
    /// memory.kmem.usage_in_bytes).
    #[serde(default)]
    pub file_kb: u64,
    #[serde(default)]
    pub kernel_kb: u64,
    /// From memory.stat: shmem (`shmem`, v1 and v2), which `file_kb`
    /// includes and which is not page cache: it is the job's own memory,
    /// counted in its processes' growth. 0 in recordings from before it
    /// was read.
    #[serde(default)]
    pub shmem_kb: u64,
}

impl CgroupPressure {
    /// Page cache proper: `file_kb` less shmem.
    pub(crate) fn page_cache_kb(&self) -> u64 {
        self.file_kb.saturating_sub(self.shmem_kb)
    }
}

/// PSI memory: share of time some / all tasks stalled on memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Psi {
    pub some_avg10: f64,
    pub full_avg10: f64,
    /// Cumulative stall, µs.
    pub some_total_us: u64,
    pub full_total_us: u64,
}

impl Eq for Psi {}

/// Who a process is, for grouping: its command line and, for torchrun, its
/// rank.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub tgid: u32,
    pub cmdline: Vec<String>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    /// The parent pid when read: for processes the recorder found already
    /// running (an attach), whose fork it never saw.
    #[serde(default)]
    pub ppid: Option<u32>,
}

/// /proc/PID/smaps_rollup: the kernel walks the page tables for this, so it
/// costs time in proportion to the mapped memory; the recorder samples it
/// every few seconds and records what it cost.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Smaps {
    pub tgid: u32,
    pub rss_kb: u64,
    pub pss_kb: u64,
    /// Private_Clean + Private_Dirty: what freeing this process would give back.
    pub uss_kb: u64,
    pub shared_kb: u64,
    pub swap_kb: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmKind {
    /// A file in /dev/shm (shm_open, torch's file_system sharing strategy).
    Posix,
    /// shmget.
    Sysv,
    /// memfd_create (torch's file_descriptor sharing strategy uses
    /// shared fds too).
    Memfd,
}

/// One shared-memory object, however many processes map it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmObject {
    pub kind: ShmKind,
    pub name: String,
    /// Inode (POSIX, memfd) or shmid (SysV): the object's identity.
    pub id: u64,
    pub size_kb: u64,
    /// Pages actually allocated (tmpfs blocks, SysV rss).
    pub resident_kb: u64,
    /// The creator (SysV cpid) or the first job process seen mapping or
    /// holding it.
    pub owner_tgid: Option<u32>,
    /// Job processes mapping or holding it when sampled.
    pub mappers: u32,
    /// A POSIX object's filesystem (`st_dev`): a job in a mount namespace
    /// of its own has a /dev/shm of its own, and inode numbers are only
    /// unique within one. 0 for SysV and memfd.
    #[serde(default)]
    pub dev: u64,
}

/// A /dev/shm filesystem as one look found it: what `df /dev/shm` says
/// inside the job's mount namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmFs {
    /// `st_dev` of the directory: the filesystem's identity.
    pub dev: u64,
    /// statvfs: total and free, kB.
    pub size_kb: u64,
    pub free_kb: u64,
    /// A job process sees it as its /dev/shm (else it is only the
    /// recorder's own).
    pub job: bool,
}

/// Why a look was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmTrigger {
    /// The timer.
    #[default]
    Timer,
    /// An OOM kill was seen.
    Kill,
    /// A job process was sent a fatal signal (a bus error among them).
    Signal,
}

/// One look at shared memory: the objects, each once, and the /dev/shm
/// filesystems they live in, with what the look cost.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmLook {
    pub objects: Vec<ShmObject>,
    pub fs: Vec<ShmFs>,
    pub trigger: ShmTrigger,
    /// CPU time the look took, its reads' included, µs (wall time in
    /// recordings before 2026-12-08).
    pub cost_us: u64,
    /// The interval the timer keeps after this look, ms: at least 400
    /// times the look's cost.
    pub interval_ms: u64,
}
