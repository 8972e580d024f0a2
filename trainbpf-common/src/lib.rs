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
/// Bytes of an exec'd filename kept; longer paths are cut (and flagged).
pub const FILENAME_LEN: usize = 128;
/// Bytes of a kernel log line kept.
pub const MSG_LEN: usize = 240;

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

/// `MemEvent::reason`: memory moved by at least the threshold.
pub const MEM_REASON_THRESHOLD: u32 = 1;
/// `MemEvent::reason`: a small change, reported because the heartbeat expired.
pub const MEM_REASON_HEARTBEAT: u32 = 2;
/// `MemEvent::reason`: first sight of the process.
pub const MEM_REASON_FIRST: u32 = 3;
/// `MemEvent::reason`: its last record, as its last thread exits (Linux
/// 6.16 and later, where that is before its memory is freed).
pub const MEM_REASON_EXIT: u32 = 4;

/// Index into `counters` arrays, in the kernel's own order
/// (`enum { MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES }`,
/// include/linux/mm_types_task.h).
pub const MM_FILEPAGES: usize = 0;
pub const MM_ANONPAGES: usize = 1;
pub const MM_SWAPENTS: usize = 2;
pub const MM_SHMEMPAGES: usize = 3;
pub const NR_MM_COUNTERS: usize = 4;

/// Kinds of allocation stall, indexing `Counters::stall_*`.
pub const STALL_DIRECT_RECLAIM: usize = 0;
pub const STALL_MEMCG_RECLAIM: usize = 1;
pub const STALL_COMPACTION: usize = 2;

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

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkEvent {
    pub hdr: Header,
    pub parent_tgid: u32,
    pub _pad: u32,
    pub parent_start_ns: u64,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecEvent {
    pub hdr: Header,
    pub comm: [u8; COMM_LEN],
    pub filename: [u8; FILENAME_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitEvent {
    pub hdr: Header,
    /// `task->exit_code` of the last thread (wait-status encoding).
    pub exit_code: u32,
    /// `signal->group_exit_code`, non-zero when the whole group was told to
    /// exit (a fatal signal, `exit_group`).
    pub group_exit_code: u32,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemEvent {
    pub hdr: Header,
    /// `mm->rss_stat[]` in pages, kernel order (`MM_FILEPAGES`…).
    pub counters: [i64; NR_MM_COUNTERS],
    /// Always 0: once the process's user page faults, no longer counted
    /// because a probe on every fault cost the job 5 to 8%. Kept so the
    /// record's layout does not change.
    pub faults: u64,
    pub reason: u32,
    /// `signal->oom_score_adj` when the record was sent.
    pub oom_score_adj: i32,
    pub comm: [u8; COMM_LEN],
    // Fields below were added after the first layout (88 bytes); a reader
    // zero-fills them in a shorter record.
    /// `mm->pgtables_bytes`: part of the OOM killer's badness.
    pub pgtables_bytes: u64,
    /// kernfs id of the process's memory cgroup: its OOM domain.
    pub memcg_id: u64,
    /// Time the process spent stalled in direct reclaim, memcg reclaim and
    /// compaction so far, ns.
    pub stall_ns: u64,
    /// Pages allocated and freed in this process's context so far
    /// (mm_page_alloc / mm_page_free): its honest growth is the difference.
    pub alloc_pages: u64,
    pub freed_pages: u64,
    // Fields below were added after the second layout (128 bytes).
    /// Pages added to and removed from the page cache in this process's
    /// context so far (`mm_filemap_*`): part of `alloc_pages` and
    /// `freed_pages`, but not the process's growth.
    pub cache_added_pages: u64,
    pub cache_removed_pages: u64,
}

/// Size of the second `MemEvent` layout, still accepted by the reader.
pub const MEM_EVENT_V2_SIZE: usize = 128;

/// Size of the first `MemEvent` layout, still accepted by the reader.
pub const MEM_EVENT_V1_SIZE: usize = 88;

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

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalEvent {
    /// `tgid` is the target process.
    pub hdr: Header,
    /// The target thread.
    pub target_pid: u32,
    pub sig: u32,
    /// `si_code`: 0 SI_USER (kill), 0x80 SI_KERNEL, negative for
    /// tkill/queue, positive for faults (SEGV_MAPERR...).
    pub code: i32,
    /// `TRACE_SIGNAL_*`: 0 delivered, 1 ignored, 2 already pending...
    pub result: i32,
    /// `current`: who sent it.
    pub sender_pid: u32,
    pub sender_tgid: u32,
    pub sender_uid: u32,
    pub _pad: u32,
    pub sender_comm: [u8; COMM_LEN],
    pub comm: [u8; COMM_LEN],
    // Fields below were added after the first layout (88 bytes); a reader
    // zero-fills them in a shorter record.
    /// With `FLAG_TTY`, for a signal the kernel generated (`SI_KERNEL`):
    /// the target's controlling terminal (`tty->name`, e.g. `pts3`), its
    /// session and its foreground process group when the signal was sent.
    /// A Ctrl-C is sent by whichever kworker ran the line discipline, so
    /// the terminal is the sender worth naming.
    pub tty_name: [u8; COMM_LEN],
    pub tty_session: u32,
    pub tty_pgrp: u32,
}

/// Size of the first `SignalEvent` layout, still accepted by the reader.
pub const SIGNAL_EVENT_V1_SIZE: usize = 88;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdjEvent {
    pub hdr: Header,
    pub oom_score_adj: i32,
    /// Who wrote it (`current`).
    pub writer_tgid: u32,
    pub comm: [u8; COMM_LEN],
}

/// Kernel-structure offsets and tunables, resolved by userspace from the
/// running kernel's BTF and tracefs before load, and frozen into the
/// program's read-only data. Rust emits no CO-RE relocations, so this is how
/// one object runs on 5.10 and on 6.18. `-1` marks a field this kernel lacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub task_pid: i64,
    pub task_tgid: i64,
    pub task_comm: i64,
    pub task_mm: i64,
    pub task_signal: i64,
    pub task_cgroups: i64,
    pub task_exit_code: i64,
    pub task_group_leader: i64,
    pub task_start_time: i64,
    pub task_real_cred: i64,
    pub cred_uid: i64,
    pub task_flags: i64,
    pub mm_rss_stat: i64,
    /// Stride of `mm->rss_stat[]` (percpu_counter on 6.2+, atomic_long_t before).
    pub rss_elem_size: i64,
    /// Offset of the 64-bit count inside one element.
    pub rss_count_off: i64,
    pub mm_total_vm: i64,
    pub mm_pgtables_bytes: i64,
    pub signal_oom_score_adj: i64,
    pub signal_live: i64,
    pub signal_group_exit_code: i64,
    pub css_set_subsys: i64,
    pub memory_cgrp_id: i64,
    pub css_cgroup: i64,
    pub cgroup_kn: i64,
    pub kn_id: i64,
    pub memcg_css: i64,
    pub oc_chosen: i64,
    pub oc_chosen_points: i64,
    pub oc_totalpages: i64,
    pub oc_constraint: i64,
    pub oc_memcg: i64,
    pub bprm_filename: i64,
    /// `kernel_siginfo.si_code` (UAPI layout: 8 on every kernel).
    pub siginfo_code: i64,
    /// `signal_struct.tty`, `tty_struct.name`, `tty_struct.ctrl.pgrp` and
    /// `.session` (plain `pgrp`/`session` before 5.13), and the offset of
    /// `numbers[0].nr` in `struct pid`: a terminal's session and
    /// foreground group.
    pub signal_tty: i64,
    pub tty_name: i64,
    pub tty_pgrp: i64,
    pub tty_session: i64,
    pub pid_nr: i64,
    /// Classic `oom:mark_victim` field offsets (tracefs format file).
    pub tp_mv_pid: i64,
    pub tp_mv_comm: i64,
    pub tp_mv_total_vm: i64,
    pub tp_mv_anon_rss: i64,
    pub tp_mv_file_rss: i64,
    pub tp_mv_shmem_rss: i64,
    pub tp_mv_uid: i64,
    pub tp_mv_pgtables: i64,
    pub tp_mv_oom_score_adj: i64,
    /// `printk:console` `__data_loc char[] msg`.
    pub tp_console_msg: i64,
    /// Report a process when anon+file+shmem moved by this many pages...
    pub rss_threshold_pages: i64,
    /// ...or by `total >> rss_relative_shift` pages, whichever is larger
    /// (0 disables the relative part).
    pub rss_relative_shift: i64,
    /// A smaller change is still reported once this much time has passed.
    pub heartbeat_ns: i64,
    /// Records of one process are at least this far apart unless it moved
    /// by eight thresholds: bounds what a churning process costs.
    pub min_interval_ns: i64,
    /// `record --all`: every process counts as the job's.
    pub all_processes: i64,
    /// The recorder's own pid: signals sent to it are recorded like the
    /// job's (it forwards them to the job; -1: none).
    pub recorder_tgid: i64,
    /// Entries of the per-process map, and how many of them only the job's
    /// processes may take.
    pub procs_max: i64,
    pub procs_job_reserve: i64,
    /// `task_struct.stack` and the kernel stack's size (THREAD_SIZE): a
    /// page event whose frame is not on the current task's stack runs in
    /// an interrupt.
    pub task_stack: i64,
    pub thread_size: i64,
    /// `folio.flags`, `folio._flags_1` (the order of a large folio in its
    /// low byte) and the bit number of `PG_head`.
    pub folio_flags: i64,
    pub folio_flags_1: i64,
    pub pg_head: i64,
    /// The page size, bytes.
    pub page_size: i64,
    /// `record --stacks`: a process's user stack is taken each time its
    /// added memory climbs this many pages above its last high (0: off).
    pub stack_every_pages: i64,
    /// `record --ebpf-log`: the programs log what only they can see (a
    /// full map, a refused reserve, a read that failed) through aya-log.
    /// 0, the default, leaves every log call dead code that the verifier
    /// drops, since this struct is read-only.
    pub ebpf_log: i64,
    /// From a descriptor to its file's name and inode (the late driver
    /// library probe): `task_struct.files`, `files_struct.fdt`,
    /// `fdtable.max_fds`, `fdtable.fd`, `file.f_path.dentry`,
    /// `dentry.d_name.name`, `file.f_inode`, `inode.i_ino`, `inode.i_sb`,
    /// `super_block.s_dev`.
    pub task_files: i64,
    pub files_fdt: i64,
    pub fdt_max_fds: i64,
    pub fdt_fd: i64,
    pub file_dentry: i64,
    pub dentry_name: i64,
    pub file_inode: i64,
    pub inode_ino: i64,
    pub inode_sb: i64,
    pub sb_dev: i64,
    /// `file.f_mode`: a descriptor not open for reading (`O_PATH`,
    /// write-only) is never a reason to probe its file.
    pub file_f_mode: i64,
    /// `task_struct.start_boottime` (`real_start_time` before 5.5): what
    /// `/proc/PID/stat` shows as a process's start, so that a held
    /// process is continued only if its pid still names it.
    pub task_start_boottime: i64,
}

impl Config {
    /// Every offset unknown, thresholds zero: the loader fills it in.
    pub const UNSET: Config = Config {
        task_pid: -1,
        task_tgid: -1,
        task_comm: -1,
        task_mm: -1,
        task_signal: -1,
        task_cgroups: -1,
        task_exit_code: -1,
        task_group_leader: -1,
        task_start_time: -1,
        task_real_cred: -1,
        cred_uid: -1,
        task_flags: -1,
        mm_rss_stat: -1,
        rss_elem_size: -1,
        rss_count_off: -1,
        mm_total_vm: -1,
        mm_pgtables_bytes: -1,
        signal_oom_score_adj: -1,
        signal_live: -1,
        signal_group_exit_code: -1,
        css_set_subsys: -1,
        memory_cgrp_id: -1,
        css_cgroup: -1,
        cgroup_kn: -1,
        kn_id: -1,
        memcg_css: -1,
        oc_chosen: -1,
        oc_chosen_points: -1,
        oc_totalpages: -1,
        oc_constraint: -1,
        oc_memcg: -1,
        bprm_filename: -1,
        siginfo_code: -1,
        signal_tty: -1,
        tty_name: -1,
        tty_pgrp: -1,
        tty_session: -1,
        pid_nr: -1,
        tp_mv_pid: -1,
        tp_mv_comm: -1,
        tp_mv_total_vm: -1,
        tp_mv_anon_rss: -1,
        tp_mv_file_rss: -1,
        tp_mv_shmem_rss: -1,
        tp_mv_uid: -1,
        tp_mv_pgtables: -1,
        tp_mv_oom_score_adj: -1,
        tp_console_msg: -1,
        rss_threshold_pages: 1024,
        rss_relative_shift: 6,
        heartbeat_ns: 5_000_000_000,
        min_interval_ns: 200_000_000,
        all_processes: 0,
        recorder_tgid: -1,
        procs_max: 32768,
        procs_job_reserve: 8192,
        task_stack: -1,
        thread_size: -1,
        folio_flags: -1,
        folio_flags_1: -1,
        pg_head: -1,
        page_size: 4096,
        stack_every_pages: 0,
        ebpf_log: 0,
        task_files: -1,
        files_fdt: -1,
        fdt_max_fds: -1,
        fdt_fd: -1,
        file_dentry: -1,
        dentry_name: -1,
        file_inode: -1,
        inode_ino: -1,
        inode_sb: -1,
        sb_dev: -1,
        file_f_mode: -1,
        task_start_boottime: -1,
    };
}

/// Per-CPU counters that userspace reads and records: nothing is dropped
/// silently.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Ring-buffer reserves that failed, by record kind.
    pub lost: [u64; KIND_MAX as usize],
    /// Job processes not tracked because the per-process map was full: lost
    /// events.
    pub proc_map_full: u64,
    /// Time tasks spent stalled, and how often, by `STALL_*`.
    pub stall_ns: [u64; 4],
    pub stall_count: [u64; 4],
    /// Job members not added because the job map was full.
    pub job_map_full: u64,
    /// Processes outside the job not tracked because the per-process map
    /// had no room left outside the job's reserve.
    pub other_map_full: u64,
    /// Pages job threads freed inside reclaim or compaction: other
    /// processes' memory and cache, not charged to the thread.
    pub reclaim_freed_pages: u64,
    /// Page tables allocated for forked children in their parents'
    /// context, taken back out of the parents' allocations.
    pub fork_pages: u64,
    /// Pages allocated or freed in interrupt context: nobody's.
    pub irq_pages: u64,
    /// Growth stacks (`record --stacks`) not aggregated because the
    /// per-stack map or the high-water map was full: lost events.
    pub stack_map_full: u64,
    /// Growth stacks that could not be read (`bpf_get_stackid` failed):
    /// aggregated under their error, and counted here.
    pub stack_errors: u64,
}

/// A process's growth stack in the kernel's aggregation map: the process
/// (tgid and start time, as everywhere) and the `StackTrace` map's id, or
/// the negative errno when the stack could not be read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub tgid: u32,
    pub stack_id: i32,
    pub start_ns: u64,
    /// The Python frames' id in `PY_STACKS` (a hash of their code and
    /// instruction pairs), or 0 where none were stored.
    pub py_id: u64,
    /// How the Python walk went: a `PY_*` state.
    pub py_state: u32,
    pub _pad: u32,
}

/// `StackKey::py_state`: not a Python process the collector located (no
/// walk was tried).
pub const PY_NONE: u32 = 0;
/// The thread's Python frames, all of them, under `py_id`.
pub const PY_OK: u32 = 1;
/// The innermost `PY_MAX_FRAMES` of a deeper chain, under `py_id`.
pub const PY_DEEP: u32 = 2;
/// The frame chain could not be read past some frame: those before it
/// are under `py_id` (0 if none).
pub const PY_FAULT_FRAMES: u32 = 3;
/// No thread state of the interpreter is this thread's (a thread Python
/// did not start, or one not yet registered).
pub const PY_NO_THREAD: u32 = 4;
/// The thread state's frame chain is empty: no Python code running.
pub const PY_EMPTY: u32 = 5;
/// The interpreter's state (runtime, interpreter, thread list) could not
/// be read.
pub const PY_FAULT_THREADS: u32 = 6;
/// The interpreter is not initialised (no interpreter state yet).
pub const PY_NOT_INIT: u32 = 7;
/// More thread states than `PY_MAX_THREADS` before this thread's.
pub const PY_MANY_THREADS: u32 = 8;
/// `PY_STACKS` was full: the frames were read but not kept.
pub const PY_STORE_FULL: u32 = 9;

/// Python frames kept per growth stack, innermost first.
pub const PY_MAX_FRAMES: usize = 32;
/// Thread states searched for the current thread's.
pub const PY_MAX_THREADS: usize = 64;

/// What the kernel's Python walker needs of one process's interpreter
/// (the collector fills it from `python::PyOffsets` and `_PyRuntime`);
/// every offset in bytes, `u64::MAX` for a field the version lacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    /// `_PyRuntime`'s address in the process.
    pub runtime: u64,
    /// `(major << 8) | minor`.
    pub version: u64,
    pub runtime_interpreters_head: u64,
    /// `_PyRuntime.gilstate.tstate_current`: before 3.11, where a thread
    /// state has no kernel tid, the walked thread is the GIL's holder.
    pub runtime_tstate_current: u64,
    pub interp_threads_head: u64,
    pub tstate_next: u64,
    pub tstate_frame: u64,
    /// `u64::MAX` unless the top frame hangs off a `_PyCFrame` (3.11, 3.12).
    pub cframe_current_frame: u64,
    pub tstate_native_thread_id: u64,
    pub frame_previous: u64,
    pub frame_code: u64,
    pub frame_instr: u64,
    /// `u64::MAX` where shim frames are not skipped (before 3.12).
    pub frame_owner: u64,
    /// 1: `frame_instr` is an `int` (`f_lasti`, up to 3.10); 0: a pointer.
    pub instr_is_int: u64,
}

/// A growth stack's Python frames as the kernel read them: `(code object,
/// instruction field)` pairs, innermost first; the instruction field is
/// `f_lasti` sign-extended up to 3.10, a pointer from 3.11.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyStack {
    pub len: u64,
    pub frames: [[u64; 2]; PY_MAX_FRAMES],
}

/// What a growth stack accounts for so far: bytes of new high, and how
/// many times it was taken. Cumulative; userspace sends the deltas.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackVal {
    pub bytes: u64,
    pub count: u64,
}

/// A process as the kernel's per-process maps key it (`STACK_HIGH`):
/// its tgid and its group leader's start time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProcId {
    pub tgid: u32,
    pub _pad: u32,
    pub start_ns: u64,
}

/// Frames kept per stack (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const STACK_DEPTH: usize = 127;

/// One job thread's stacks as it dequeues a fatal signal (`signal_deliver`
/// of a signal whose action is to end the process, a SIGKILL among them):
/// in its own context, its user memory intact. Its native frames are the
/// user stack by frame pointers (`bpf_get_stack`), its Python frames the
/// walker's pairs (as in [`PyStack`]); the collector names them at once,
/// from what it resolved of the process's growth stacks where the process
/// is gone already.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeathStack {
    pub hdr: Header,
    /// The thread's id, and the signal.
    pub tid: u32,
    pub sig: u32,
    /// Bytes `bpf_get_stack` wrote (8 per frame), or its negative errno.
    pub native_len: i64,
    /// The Python walk's `PY_*` state (`PY_NONE`: not a located Python).
    pub py_state: u32,
    pub _pad: u32,
    pub native: [u64; STACK_DEPTH],
    pub py: PyStack,
}

/// The GPU probes' records, kinds 20-29.
mod gpu;
pub use gpu::*;

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
const _: () = assert!(core::mem::size_of::<DeathStack>() == 24 + 24 + 8 * STACK_DEPTH + 520);

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
    unsafe impl aya::Pod for PyStack {}
}
