//! The OOM kill, its victim and the kernel's OOM log lines (`oom.rs`,
//! `klog.rs`'s console probe).

use crate::{COMM_LEN, Header, NR_MM_COUNTERS};

/// Bytes of a kernel log line kept.
pub const MSG_LEN: usize = 240;

/// `OomEvent::source`: which probe produced the record.
pub const SRC_FENTRY: u32 = 1;
pub const SRC_KPROBE: u32 = 2;
pub const SRC_TP_BTF: u32 = 3;
pub const SRC_TRACEPOINT: u32 = 4;

/// Counters in `OomEvent::counters` are in pages (kernel probes read
/// `mm->rss_stat`) unless this flag is set: the classic tracepoint already
/// converts to kB.
pub const OOM_FLAG_COUNTERS_KB: u32 = 1 << 0;

/// `OomEvent` carries `oom_control` fields (constraint, points, totalpages).
pub const OOM_FLAG_HAS_OC: u32 = 1 << 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomEvent {
    /// `tgid` is the victim's process id.
    pub hdr: Header,
    /// The victim thread the kernel named (usually the group leader).
    pub victim_pid: u32,
    /// `current`: the task whose allocation triggered the kill.
    pub trigger_pid: u32,
    pub trigger_tgid: u32,
    pub uid: u32,
    pub oom_score_adj: i32,
    /// `SRC_*`.
    pub source: u32,
    /// `OOM_FLAG_*`.
    pub oom_flags: u32,
    /// `enum oom_constraint` when `OOM_FLAG_HAS_OC`.
    pub constraint: u32,
    /// Victim's `mm->rss_stat[]`, pages (or kB with `OOM_FLAG_COUNTERS_KB`).
    pub counters: [i64; NR_MM_COUNTERS],
    /// Pages (kB with `OOM_FLAG_COUNTERS_KB`).
    pub total_vm: u64,
    /// Bytes (kB with `OOM_FLAG_COUNTERS_KB`).
    pub pgtables: u64,
    /// `kernfs_node::id` of the victim's memory cgroup (0 when unknown).
    pub victim_memcg_id: u64,
    /// `kernfs_node::id` of `oc->memcg` (0: global OOM or unknown).
    pub oc_memcg_id: u64,
    pub chosen_points: i64,
    pub totalpages: u64,
    pub comm: [u8; COMM_LEN],
    pub trigger_comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrintkEvent {
    pub hdr: Header,
    /// Bytes of `msg` that hold text.
    pub len: u32,
    pub _pad: u32,
    pub msg: [u8; MSG_LEN],
}
