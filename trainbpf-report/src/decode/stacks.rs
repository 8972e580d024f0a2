//! Growth stacks (`record --stacks`): the collector's record of what each
//! (process, stack) added since its last record, with the stack's frames,
//! resolved while the process lived.

use serde::{Deserialize, Serialize};

use super::ProcKey;

/// Longest function name or file path kept: the collector cuts longer ones
/// (a C++ template's name runs to kilobytes).
pub const MAX_FRAME_TEXT: usize = 512;
/// Most frames kept per stack, innermost first (the kernel takes 127).
pub const MAX_FRAMES: usize = 64;

/// One drain of the kernel's growth-stack map: the deltas since the last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackSample {
    pub stacks: Vec<StackDelta>,
}

/// What one stack of one process added since the last record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackDelta {
    pub proc: ProcKey,
    /// The kernel's stack id; negative: the errno of a stack that could not
    /// be read (`-14` EFAULT, `-17` EEXIST: its bucket holds another stack).
    pub stack_id: i32,
    /// The kernel's id of the Python frames walked with it (0: none), and
    /// how that walk went (`trainbpf_common::PY_*`): with the stack id,
    /// what names the stack. Absent in recordings before Python frames.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub py_id: u64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub py_state: u32,
    /// The return address a frameless leaf left at the stack pointer
    /// (`trainbpf_common::StackKey::leaf_ret`; 0: none): with the ids,
    /// what names the stack. Absent in recordings before it.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub leaf_ret: u64,
    /// Bytes of new high and captures since the last record.
    pub bytes: u64,
    pub count: u64,
    /// The frames, innermost first: in the first record of this (process,
    /// stack) only; later ones name the stack by its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<Vec<Frame>>,
    /// Why there are no frames (an unreadable stack, a process gone before
    /// its stack was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A GPU allocation stack: `bytes` are what the CUDA driver's
    /// allocation calls through this stack asked for and were given,
    /// `count` the calls (frees not subtracted). Absent (false): a growth
    /// stack.
    #[serde(default, skip_serializing_if = "is_false")]
    pub gpu: bool,
}

/// One job thread's stacks as it dequeued a fatal signal (`record
/// --stacks`), named by the collector at once: from the live process
/// where it still could, or from what it had resolved of the process's
/// growth stacks. Python frames in place of the interpreter's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackAtDeath {
    pub proc: ProcKey,
    pub tid: u32,
    pub sig: u32,
    /// Innermost first; a frame that could not be named keeps its address.
    pub frames: Vec<Frame>,
    /// Why there are no frames, or why some are unnamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A frame as the recording keeps it: resolved while the process lived.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// `native` (a machine-code frame) or `python` (a CPython frame: its
    /// `addr` is the code object's address, `module` none).
    pub kind: String,
    /// The address in the process (a return address for every frame but
    /// the innermost).
    pub addr: u64,
    /// `None`: unsymbolized (no symbols, or the process was gone).
    #[serde(default)]
    pub function: Option<String>,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub line: Option<u32>,
    /// The executable or library the address lies in.
    #[serde(default)]
    pub module: Option<String>,
    /// How the frame was found: `ip` (where the thread was), `stack
    /// pointer` (the return address a leaf without a frame of its own
    /// left on top of the stack), `frame pointer` (the frame-pointer
    /// walk), `unwind table` (the caller's file's `.eh_frame` or
    /// `.debug_frame`, on a copy of the stack), `python` (the
    /// interpreter's frame chain). Absent in
    /// recordings before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
}

/// [`Frame::found`]'s values.
pub const FOUND_IP: &str = "ip";
pub const FOUND_SP: &str = "stack pointer";
pub const FOUND_FP: &str = "frame pointer";
pub const FOUND_CFI: &str = "unwind table";
pub const FOUND_PYTHON: &str = "python";

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
