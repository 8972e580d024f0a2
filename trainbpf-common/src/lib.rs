//! Records shared by trainbpf's eBPF programs and its userspace collector.
//!
//! Every record a program writes to the ring buffer starts with [`Header`];
//! `Header::kind` says which struct follows. Kind numbers are part of the
//! recording format (docs/recording-format.md): they are explicit and never
//! reused. All structs are `#[repr(C)]` with explicit padding so that the bytes
//! the kernel writes are the bytes userspace decodes, with no implicit holes.
#![no_std]

/// Length of `task_struct::comm` (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// A process forked a new process (not a thread). [`ForkEvent`].
pub const KIND_FORK: u16 = 1;
/// A process exec'd. [`ExecEvent`].
pub const KIND_EXEC: u16 = 2;
/// The last thread of a process exited. [`ExitEvent`].
pub const KIND_EXIT: u16 = 3;
/// A process's memory moved by the threshold, or a heartbeat. [`MemEvent`].
pub const KIND_MEM: u16 = 4;
/// `oom:mark_victim` (tp_btf or classic): the kernel chose a victim. [`OomEvent`].
pub const KIND_OOM_VICTIM: u16 = 5;
/// `oom_kill_process` entry (fentry or kprobe): the kill's context. [`OomEvent`].
pub const KIND_OOM_KILL: u16 = 6;
/// An OOM-related kernel log line seen at `printk:console`. [`PrintkEvent`].
pub const KIND_PRINTK: u16 = 7;
/// A signal was sent to a job process. [`SignalEvent`].
pub const KIND_SIGNAL: u16 = 8;
/// A process's `oom_score_adj` changed. [`AdjEvent`].
pub const KIND_OOM_ADJ: u16 = 9;
/// A job thread's stacks on its way out of a fatal signal (`record
/// --stacks`): the victim's stack at death. [`DeathStack`].
pub const KIND_DEATH_STACK: u16 = 30;
/// Sizes the lost-event counters: a power of two above every kernel kind.
/// Kinds 10-19 are kept for memory attribution, 20-29 for the GPU.
pub const KIND_MAX: u16 = 32;

/// `Header::flags`: the process belongs to the recorded job's tree.
pub const FLAG_IN_JOB: u16 = 1 << 0;
/// `ExecEvent::flags`: the filename did not fit and was cut.
pub const FLAG_TRUNCATED: u16 = 1 << 1;
/// `SignalEvent` header flag: the sender (`current`) is a kernel thread, a
/// messenger (the tty's kworker) rather than the one who asked.
pub const FLAG_SENDER_KTHREAD: u16 = 1 << 2;
/// `SignalEvent` header flag: `tty_*` hold the target's controlling terminal.
pub const FLAG_TTY: u16 = 1 << 3;
/// `ForkEvent`/`ExitEvent` header flag: the process is a kernel thread
/// (`PF_KTHREAD`), which only `--all` records; the report leaves it out.
pub const FLAG_KTHREAD: u16 = 1 << 4;
/// An exec record whose process the kernel stopped (the job's root,
/// `EXEC_HOLD`): the collector looks for its interpreter, then continues
/// it.
pub const FLAG_EXEC_HELD: u16 = 1 << 5;

/// Which ring buffer a kind travels in. Kills, deaths, signals and the
/// kernel's OOM log lines are few and are the evidence: they go to their own
/// ring (`PRECIOUS`), so that a burst of memory records can never push them
/// out. Everything else shares `EVENTS`.
pub const fn is_precious(kind: u16) -> bool {
    matches!(
        kind,
        KIND_EXIT
            | KIND_OOM_VICTIM
            | KIND_OOM_KILL
            | KIND_PRINTK
            | KIND_SIGNAL
            | KIND_DEATH_STACK
            | KIND_CUDA_MAP
    )
}

/// Size of the precious ring: about 18,000 exit records.
pub const PRECIOUS_RING_BYTES: u32 = 1 << 20;

/// Common prefix of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub kind: u16,
    pub flags: u16,
    /// Process (thread-group) id the record is about.
    pub tgid: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC.
    pub ts_ns: u64,
    /// The group leader's `start_time` (CLOCK_MONOTONIC ns): with `tgid` it
    /// names a process uniquely even when pids are recycled.
    pub start_ns: u64,
}

mod config;
mod counters;
/// The GPU probes' records, kinds 20-29.
mod gpu;
mod lifecycle;
mod memory;
mod oom;
mod signals;
mod stacks;
pub use config::*;
pub use counters::*;
pub use gpu::*;
pub use lifecycle::*;
pub use memory::*;
pub use oom::*;
pub use signals::*;
pub use stacks::*;

// The layouts are part of the recording format: pin their sizes.
const _: () = assert!(core::mem::size_of::<Header>() == 24);
const _: () = assert!(core::mem::size_of::<ForkEvent>() == 56);
const _: () = assert!(core::mem::size_of::<ExecEvent>() == 168);
const _: () = assert!(core::mem::size_of::<ExitEvent>() == 48);
const _: () = assert!(core::mem::size_of::<MemEvent>() == 144);
const _: () = assert!(core::mem::size_of::<OomEvent>() == 168);
const _: () = assert!(core::mem::size_of::<PrintkEvent>() == 272);
const _: () = assert!(core::mem::size_of::<SignalEvent>() == 112);
const _: () = assert!(core::mem::size_of::<AdjEvent>() == 48);
const _: () = assert!(core::mem::size_of::<DeathStack>() == 24 + 32 + 8 * STACK_DEPTH + 520);
const _: () = assert!(core::mem::size_of::<StackCopy>() == 40 + 32 + STACK_COPY_BYTES);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain-old-data: #[repr(C)], integers only, no implicit padding.
    unsafe impl aya::Pod for Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Counters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for StackKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for StackVal {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ProcId {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PyProc {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ExeOf {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ExecHold {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PyStack {}
    // SAFETY: as above.
    unsafe impl aya::Pod for StackCopy {}
}
