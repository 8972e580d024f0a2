//! The recording file: one writer, one reader. Format: docs/recording-format.md.
//!
//! ```text
//! file   = magic "TRAINBPF" | version u32 | header_len u32 | header JSON | header crc32 u32 | frame*
//! frame  = "TBFR" | payload_len u32 | payload crc32 u32 | payload
//! payload = record*
//! record = kind u16 | reserved u16 | len u32 | bytes[len]
//! ```
//! All integers little-endian. The writer appends whole frames and never
//! rewrites, so a recorder killed mid-write leaves every earlier frame intact.
//! The reader steps over a damaged frame in the middle (scanning forward to
//! the next frame whose magic, length and CRC check out, and noting what it
//! skipped), and stops at a damaged tail, saying where.

use std::io;

use serde::{Deserialize, Serialize};

mod reader;
#[cfg(test)]
mod testdata;
mod window;
mod writer;
pub use reader::{MAX_SKIPS, Reader, Skip, Skipped, Stop};
pub use writer::{Notice, Rewind, Writer, is_sample};

pub(crate) const MAGIC: &[u8; 8] = b"TRAINBPF";
pub(crate) const FRAME_MAGIC: &[u8; 4] = b"TBFR";
pub(crate) const VERSION: u32 = 1;
/// No header or frame is larger; a bigger length means corruption, and the
/// reader must not try to allocate it.
pub(crate) const MAX_FRAME: u32 = 16 << 20;
const MAX_HEADER: u32 = 1 << 20;

/// Written once at the start: what was recorded, on what, and how.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordingHeader {
    pub trainbpf_version: String,
    pub kernel: String,
    pub hostname: String,
    pub page_size: u64,
    /// MemTotal and SwapTotal at the start, kB: a global OOM's domain.
    #[serde(default)]
    pub mem_total_kb: u64,
    #[serde(default)]
    pub swap_total_kb: u64,
    /// The overcommit settings at the start, read as `doctor` reads them:
    /// whether running out of memory ends in a failed allocation or an OOM
    /// kill. Absent (all `None`/0) in recordings made before they were kept.
    #[serde(default)]
    pub overcommit: Overcommit,
    /// The same instant on both clocks, to turn event times (monotonic) into
    /// wall-clock times.
    pub clock: ClockPair,
    pub attach: Attach,
    /// Probes that were tried and not used, and why.
    pub fallbacks: Vec<Fallback>,
    pub config: RecordConfig,
    /// The recorder's own pid: with `--all` or `--cgroup` it and the
    /// helpers it runs are seen like any process, and the report keeps
    /// them apart from the job. Absent in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorder_pid: Option<u32>,
}

/// `vm.overcommit_memory`, `vm.overcommit_ratio`, `vm.overcommit_kbytes`
/// and /proc/meminfo's `CommitLimit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overcommit {
    /// 0 heuristic, 1 always, 2 never (strict accounting).
    #[serde(default)]
    pub memory: Option<u32>,
    #[serde(default)]
    pub ratio: Option<u64>,
    #[serde(default)]
    pub kbytes: Option<u64>,
    /// What strict accounting lets be committed, kB (0: unknown).
    #[serde(default)]
    pub commit_limit_kb: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPair {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
    /// How far apart the two reads could be: the monotonic time between
    /// two monotonic reads around the realtime read (`monotonic_ns` is
    /// their middle). Absent in recordings made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncertainty_ns: Option<u64>,
}

impl ClockPair {
    /// Both clocks now, with the time the reads took.
    pub fn read() -> ClockPair {
        let mono = || now_ns(nix::time::ClockId::CLOCK_MONOTONIC);
        let before = mono();
        let realtime_ns = now_ns(nix::time::ClockId::CLOCK_REALTIME);
        let after = mono();
        ClockPair {
            monotonic_ns: before + (after.saturating_sub(before)) / 2,
            realtime_ns,
            uncertainty_ns: Some(after.saturating_sub(before)),
        }
    }

    /// Wall-clock ns since the epoch for a CLOCK_MONOTONIC timestamp.
    pub(crate) fn to_realtime_ns(self, mono_ns: u64) -> u64 {
        (self.realtime_ns as i128 + mono_ns as i128 - self.monotonic_ns as i128).max(0) as u64
    }
}

fn now_ns(clock: nix::time::ClockId) -> u64 {
    nix::time::clock_gettime(clock)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The attach point used for each job, e.g. "tp_btf:mark_victim".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attach {
    /// `oom_kill_process` probe, when the kernel allows one.
    pub oom_context: Option<String>,
    pub oom_victim: Option<String>,
    pub memory: Option<String>,
    pub faults: Option<String>,
    pub lifecycle: Option<String>,
    pub printk: Option<String>,
    /// Who sent a job process a signal.
    #[serde(default)]
    pub signals: Option<String>,
    #[serde(default)]
    pub oom_score_adj: Option<String>,
    /// Reclaim and compaction stall probes.
    #[serde(default)]
    pub stalls: Option<String>,
    /// Page allocation and free probes (honest growth).
    #[serde(default)]
    pub pages: Option<String>,
    /// Page-cache insertions and removals, kept out of honest growth.
    #[serde(default)]
    pub page_cache: Option<String>,
    /// A forked child's page tables taken out of its parent's growth.
    #[serde(default)]
    pub forks: Option<String>,
    /// Growth stacks (`record --stacks`): the program that takes them,
    /// and how often.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<String>,
    /// `record --ebpf-log`: the kernel programs' own log, read from
    /// aya-log's ring.
    #[serde(default)]
    pub ebpf_log: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fallback {
    pub probe: String,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordConfig {
    pub rss_threshold_bytes: u64,
    pub rss_relative_shift: u32,
    pub heartbeat_ms: u64,
    pub ring_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// Reading or writing the file failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The file does not start with the recording magic.
    #[error("not a trainbpf recording (bad magic)")]
    BadMagic,
    /// Written by a format version this build can't read.
    #[error("recording format version {0} is not supported (this build reads {VERSION})")]
    Version(u32),
    /// The header is cut short or fails its checksum.
    #[error("recording header is damaged: {0}")]
    Header(String),
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}
