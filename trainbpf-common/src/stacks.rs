//! Growth stacks, their Python frames and the stack at death (`stacks.rs`,
//! `python.rs`, `death.rs`).

use crate::Header;

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
    /// The word at the user stack pointer where it looks like a return
    /// address (the bytes before it are a call), else 0: a leaf that set
    /// up no frame (glibc's `memset`, `memcpy`, a syscall wrapper) has
    /// its caller's return address there, which a frame-pointer walk,
    /// starting at the caller's caller, skips.
    pub leaf_ret: u64,
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

/// Or-ed into `StackKey::py_state` (and a stack at death's state) when
/// the walk used a description the kernel made at the process's exec
/// (`PyProc::at_exec`): the frames are the new program's, which the
/// collector may not have met yet, so it names them after it has.
pub const PY_AT_EXEC: u32 = 0x100;

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
    /// 1: made by the kernel at the process's exec from `PY_EXES` (walks
    /// with it say `PY_AT_EXEC`); 0: put by the collector.
    pub at_exec: u64,
    /// Non-zero: the interpreter is a `libpython` the dynamic loader maps
    /// after the exec, not found yet. This is its `.dynamic`'s link-time
    /// address: the loader's list entry whose `l_ld - l_addr` it is, is
    /// the library; `runtime` is then `l_addr + lib_runtime`, and this is
    /// set to 0.
    pub lib_dynamic: u64,
    /// `_PyRuntime`'s link-time address in the library.
    pub lib_runtime: u64,
    /// Where the executable's `DT_DEBUG` value (the loader's `r_debug`)
    /// lies: in the process once the kernel made the entry at the exec;
    /// relative to `start_code` in `PY_EXES`.
    pub debug_slot: u64,
}

/// The job's root in `EXEC_HOLD`: how the kernel may stop it for the
/// collector to locate its interpreter before its Python runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecHold {
    /// Holds left at execs of files no interpreter was filed under.
    pub left: u32,
    /// Holds left at walks that find no description, since the last exec:
    /// set by the collector where it found no interpreter yet at the exec
    /// (a `libpython` the loader had not mapped), cleared at each exec.
    pub armed: u32,
    /// When the kernel held it at a walk (0: not held there); the
    /// collector, which polls for it, clears it and continues the root.
    pub held_ns: u64,
    /// Set while the hold's own SIGSTOP is sent: `signal_generate` does
    /// not record it as a signal to the job.
    pub sending: u32,
    pub _pad: u32,
}

/// What the kernel saw of a job process's exec (`EXE_OF`): the file
/// exec'd, as the kernel names it, and where its code was loaded. The
/// collector, having located an interpreter in that very file, keeps it
/// in `PY_EXES` under `exe` with `_PyRuntime` relative to `start_code`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExeOf {
    pub exe: crate::FileKey,
    pub start_code: u64,
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

/// Bytes of user stack copied with a growth stack's first sample, from the
/// stack pointer up: what the collector unwinds with the binaries' own
/// unwind tables (`.eh_frame`), where frame pointers are missing. As
/// `perf record --call-graph dwarf`, whose default is half of it.
pub const STACK_COPY_BYTES: usize = 16384;

/// A growth stack's first sample, for unwinding in userspace
/// (`STACK_COPIES`): the key it was aggregated under, the user registers
/// the thread entered the kernel with, and the stack above its pointer.
/// Near the top of a stack fewer bytes can be read: `len` says how many
/// (`STACK_COPY_BYTES`, a quarter, or a sixteenth of it; 0: none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackCopy {
    pub key: StackKey,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub len: u64,
    pub data: [u8; STACK_COPY_BYTES],
}

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
    /// As `StackKey::leaf_ret`: the caller of a frameless leaf the
    /// thread died in (`memcpy` touching a page when the OOM killer
    /// chose it), or 0.
    pub leaf_ret: u64,
    pub native: [u64; STACK_DEPTH],
    pub py: PyStack,
}
