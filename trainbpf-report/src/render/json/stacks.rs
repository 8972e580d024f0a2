//! Growth stacks (`record --stacks`): `kills[].growers[].stacks` and
//! `processes[].stacks`; CUDA allocation stacks: `gpu.processes[].stacks`.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::{self, GrowthStack};

/// Where a process's new highs of added memory were taken: one stack,
/// with the memory it accounts for.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Stack {
    /// Times the stack was taken.
    pub(crate) count: u64,
    /// Why it has no frames: a stack the kernel could not read (no frame
    /// pointers, `EFAULT`; its table slot held by another stack,
    /// `EEXIST`), or one the process exited before it was resolved; for
    /// a Python process, why its Python frames are missing or partial
    /// (an interpreter that cannot be read, a read fault, a stack taken
    /// before the interpreter was located); or that a forked worker gone
    /// before its stack was resolved was named through its parent, which
    /// maps the same code. Null when all is there.
    pub(crate) error: Option<String>,
    /// Innermost first.
    pub(crate) frames: Vec<Frame>,
    /// New high of added memory taken at this stack (kB).
    pub(crate) kb: u64,
}

/// One frame, resolved while the process lived.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Frame {
    /// The address in the process, hex: for every frame but the innermost
    /// a return address.
    pub addr: String,
    /// Source file; null without debug information.
    pub file: Option<String>,
    /// Null when unsymbolized (no symbols, or the process was gone).
    pub function: Option<String>,
    /// `native`: a machine-code frame (frame-pointer unwinding);
    /// `python`: a CPython frame, walked in the kernel and named while
    /// the process lived (its `addr` is the code object's, its `module`
    /// null). The interpreter's own native frames are folded away where
    /// its Python frames stand.
    pub kind: String,
    /// How the frame was found: `ip` (where the thread was), `stack
    /// pointer` (the return address a leaf that set up no frame, such as
    /// `memcpy`, left on top of the stack: its caller), `frame pointer`
    /// (the frame-pointer walk), `python` (the interpreter's frame
    /// chain); null in recordings before it.
    pub found: Option<String>,
    /// Source line; null without debug information.
    pub line: Option<u32>,
    /// The executable or library the address lies in.
    pub module: Option<String>,
}

/// Where a process's CUDA allocations were asked for: the calling
/// thread's stack (native and Python), taken as the driver call returned
/// to its caller, with what the successful calls through it were given.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuStack {
    /// Bytes the successful allocation calls through this stack were
    /// given (device, pinned, registered or managed memory), frees not
    /// subtracted: what this line asked for over the run, not what it
    /// held at the end.
    pub(crate) bytes: u64,
    /// Successful allocation calls through this stack.
    pub(crate) count: u64,
    /// As in a growth stack's `error`.
    pub(crate) error: Option<String>,
    /// Innermost first: the innermost is the line that called the driver
    /// (its `addr` the call's return address, like the others).
    pub(crate) frames: Vec<Frame>,
    /// `bytes` in kB (rounded down).
    pub(crate) kb: u64,
}

/// A victim's stacks at death (`kills[].victim.stack_at_death`).
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct StackAtDeath {
    /// Why frames are missing or unnamed (the process gone before they
    /// were named and not named by its growth stacks, an unreadable
    /// stack, Python frames not read); null when all is there.
    pub error: Option<String>,
    /// Innermost first, Python frames in place of the interpreter's own.
    pub frames: Vec<Frame>,
    /// Threads past those kept, not shown.
    pub(crate) more_threads: u32,
    /// The signal it died of (9: SIGKILL).
    pub(crate) signal: u32,
    /// The other threads, each as it dequeued the signal.
    pub(crate) threads: Vec<ThreadAtDeath>,
    /// The thread shown (the kernel's tid).
    pub tid: u32,
    /// It is the thread whose allocation set off the kill.
    pub(crate) trigger: bool,
}

/// Another thread of the victim at its death.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ThreadAtDeath {
    pub(crate) error: Option<String>,
    /// Innermost first.
    pub(crate) frames: Vec<Frame>,
    pub(crate) tid: u32,
}

fn frames(f: &[model::stacks::Frame]) -> Vec<Frame> {
    f.iter()
        .map(|f| Frame {
            addr: format!("{:#x}", f.addr),
            file: f.file.clone(),
            function: f.function.clone(),
            kind: f.kind.clone(),
            found: f.found.clone(),
            line: f.line,
            module: f.module.clone(),
        })
        .collect()
}

pub(crate) fn at_death(s: &model::death_stacks::StackAtDeath) -> StackAtDeath {
    StackAtDeath {
        error: s.main.error.clone(),
        frames: frames(&s.main.frames),
        more_threads: s.more_threads,
        signal: s.main.sig,
        threads: s
            .threads
            .iter()
            .map(|t| ThreadAtDeath {
                error: t.error.clone(),
                frames: frames(&t.frames),
                tid: t.tid,
            })
            .collect(),
        tid: s.main.tid,
        trigger: s.trigger,
    }
}

pub(crate) fn stacks(s: &[GrowthStack]) -> Vec<Stack> {
    s.iter()
        .map(|s| Stack {
            count: s.count,
            error: s.error.clone(),
            frames: frames(&s.frames),
            kb: s.bytes / 1024,
        })
        .collect()
}

pub(crate) fn gpu_stacks(s: &[GrowthStack]) -> Vec<GpuStack> {
    s.iter()
        .map(|s| GpuStack {
            bytes: s.bytes,
            count: s.count,
            error: s.error.clone(),
            frames: frames(&s.frames),
            kb: s.bytes / 1024,
        })
        .collect()
}
