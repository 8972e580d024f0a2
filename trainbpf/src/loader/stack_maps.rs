//! The maps `record --stacks` reads, sized here before the object loads.

use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf, StackTraceMap};
use trainbpf_common::{ExeOf, ExecHold, FileKey, ProcId, PyProc, PyStack, StackKey, StackVal};

/// Entries of the kernel's maps: stacks (each 127 frames, about 1 KiB),
/// (process, stack) totals, and processes' highs.
pub const STACK_MAP_ENTRIES: u32 = 4096;
pub const AGG_MAP_ENTRIES: u32 = 16384;
/// (process, stack) totals of CUDA allocations: one entry per allocating
/// line of a process, far fewer than its growth stacks.
pub const GPU_AGG_MAP_ENTRIES: u32 = 4096;
pub const HIGH_MAP_ENTRIES: u32 = 8192;
/// Python processes the kernel walks, and their kept frames (each about
/// 0.5 KiB).
pub const PY_PROC_ENTRIES: u32 = 1024;
pub const PY_STACK_ENTRIES: u32 = 4096;
/// The ring of new stacks' user-stack copies (16 KiB each): about 60 new
/// stacks between two drains of the stacks' thread.
pub const COPY_RING_BYTES: u32 = 1 << 20;
/// `PY_EXES` and `EXE_OF`.
pub type ExeMaps = (
    BpfHashMap<MapData, FileKey, PyProc>,
    BpfHashMap<MapData, ProcId, ExeOf>,
);

/// The maps `record --stacks` reads.
pub struct StackMaps {
    pub stacks: StackTraceMap<MapData>,
    pub agg: BpfHashMap<MapData, StackKey, StackVal>,
    /// CUDA allocations' bytes per (process, stack at the call).
    pub gpu_agg: BpfHashMap<MapData, StackKey, StackVal>,
    pub high: BpfHashMap<MapData, ProcId, i64>,
    pub py_procs: BpfHashMap<MapData, ProcId, PyProc>,
    pub py_stacks: BpfHashMap<MapData, u64, PyStack>,
    /// New stacks' registers and user-stack copies (`StackCopy`).
    pub copies: RingBuf<MapData>,
    /// Interpreters filed by executable, and each process's exec
    /// (`py::Exes`): taken by the stacks' collector.
    pub py_exes: Option<ExeMaps>,
    /// The job's root, whose first execs the kernel holds until its
    /// interpreter is looked for (`Stacks::hold_root`).
    pub exec_hold: Option<BpfHashMap<MapData, u32, ExecHold>>,
}
