//! The walk an eBPF program will do, done from userspace over
//! `/proc/PID/mem` with the same [`PyOffsets`]: `_PyRuntime` → the main
//! interpreter → its thread states → each one's frame chain → code object
//! and instruction; then the code object resolved to file, function and
//! line.

use std::sync::Arc;

use super::{
    Interpreter, PyError, PyFrame, ThreadStack,
    cache::Code,
    linetable,
    objects::{bytes, string, type_name, type_of},
    offsets::{Layout, NONE, PyOffsets},
};

/// Bounds on a walk: a chain longer than this is a loop or a misread.
const MAX_THREADS: usize = 4096;
pub const MAX_DEPTH: usize = 1024;
/// `offsetof(struct pthread, tid)` in glibc on x86-64 (2.36).
const GLIBC_PTHREAD_TID: u64 = 0x2d0;
/// 3.12's `FRAME_OWNED_BY_CSTACK`: the shim frame an entry from C pushes.
const OWNED_BY_CSTACK: u8 = 3;

impl Interpreter {
    /// Every thread's current Python stack, innermost frame first, in the
    /// interpreter's thread order (newest thread first).
    pub fn stacks(&mut self) -> Result<Vec<ThreadStack>, PyError> {
        let o = self.offsets;
        let interp = self.mem.u64(
            self.runtime.wrapping_add(o.runtime_interpreters_head),
            "_PyRuntime.interpreters.head",
        )?;
        if interp == 0 {
            return Err(PyError::NotInitialized);
        }
        let gil = if o.runtime_tstate_current == NONE {
            None
        } else {
            Some(self.mem.u64(
                self.runtime.wrapping_add(o.runtime_tstate_current),
                "_PyRuntime's current thread state",
            )?)
        };
        let mut tstate = self.mem.u64(
            interp.wrapping_add(o.interp_threads_head),
            "the interpreter's thread list",
        )?;
        let mut out = Vec::new();
        while tstate != 0 {
            if out.len() == MAX_THREADS {
                return Err(PyError::TooMany {
                    what: "thread states",
                    limit: MAX_THREADS,
                });
            }
            let thread_id = self.mem.u64(
                tstate.wrapping_add(o.tstate_thread_id),
                "a thread state's thread_id",
            )?;
            let native_tid = if o.tstate_native_thread_id == NONE {
                self.glibc_tid(thread_id)
            } else {
                Some(self.mem.u64(
                    tstate.wrapping_add(o.tstate_native_thread_id),
                    "a thread state's native_thread_id",
                )? as u32)
            };
            out.push(ThreadStack {
                thread_id,
                native_tid,
                holds_gil: gil.map(|g| g == tstate),
                frames: self.frames(tstate),
            });
            tstate = self
                .mem
                .u64(tstate.wrapping_add(o.tstate_next), "a thread state's next")?;
        }
        Ok(out)
    }

    /// Before 3.11 a thread state holds only its `pthread_t`, which on
    /// glibc points at the thread's `struct pthread`, whose `tid` sits at
    /// [`GLIBC_PTHREAD_TID`]. Another libc puts something else there: the
    /// value is taken only if the process has a thread of that id.
    fn glibc_tid(&self, pthread: u64) -> Option<u32> {
        let tid = self
            .mem
            .u32(
                pthread.wrapping_add(GLIBC_PTHREAD_TID),
                "struct pthread's tid",
            )
            .ok()?;
        let pid = self.pid;
        (tid != 0 && std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists())
            .then_some(tid)
    }

    /// The frame a thread state runs now, or 0.
    fn top_frame(&self, tstate: u64) -> Result<u64, PyError> {
        let o = &self.offsets;
        let field = self.mem.u64(
            tstate.wrapping_add(o.tstate_frame),
            "a thread state's frame",
        )?;
        if o.layout() != Layout::Py311 || field == 0 {
            return Ok(field);
        }
        self.mem.u64(
            field.wrapping_add(o.cframe_current_frame),
            "_PyCFrame.current_frame",
        )
    }

    fn frames(&mut self, tstate: u64) -> Result<Vec<PyFrame>, PyError> {
        let o = self.offsets;
        let mut frame = self.top_frame(tstate)?;
        let mut out = Vec::new();
        for _ in 0..MAX_DEPTH {
            if frame == 0 {
                return Ok(out);
            }
            let code = self
                .mem
                .u64(frame.wrapping_add(o.frame_code), "a frame's code")?;
            let instr = match o.layout() {
                Layout::Py39 | Layout::Py310 => self
                    .mem
                    .i32(frame.wrapping_add(o.frame_instr), "a frame's f_lasti")?
                    as i64 as u64,
                Layout::Py311 | Layout::Py313 => self
                    .mem
                    .u64(frame.wrapping_add(o.frame_instr), "a frame's instruction")?,
            };
            let shim = o.frame_owner != NONE
                && o.version >= 0x030c
                && self
                    .mem
                    .u8(frame.wrapping_add(o.frame_owner), "a frame's owner")?
                    == OWNED_BY_CSTACK;
            if !shim {
                out.push(self.resolve(code, instr)?);
            }
            frame = self
                .mem
                .u64(frame.wrapping_add(o.frame_previous), "a frame's previous")?;
        }
        Err(PyError::TooMany {
            what: "frames",
            limit: MAX_DEPTH,
        })
    }

    /// File, function and line of the code object at `code` running the
    /// instruction `instr`, where `instr` is the frame's field as a walker
    /// copies it: `f_lasti` up to 3.10 (sign-extended), the
    /// `prev_instr`/`instr_ptr` pointer from 3.11.
    pub fn resolve(&mut self, code: u64, instr: u64) -> Result<PyFrame, PyError> {
        let o = self.offsets;
        let info = self.code(code)?;
        Ok(frame_of(&o, &info, code, instr))
    }

    /// As `resolve`, for a process that may be gone (a stack at death):
    /// where its memory can no longer be read, a code object named before
    /// (its growth stacks ran the same code) is named from what was read
    /// then. A running frame's code object cannot have been freed.
    pub fn resolve_remembered(&mut self, code: u64, instr: u64) -> Result<PyFrame, PyError> {
        match self.resolve(code, instr) {
            Ok(f) => Ok(f),
            Err(e) => match self.codes.get(&code) {
                Some(info) => Ok(frame_of(&self.offsets, info, code, instr)),
                None => Err(e),
            },
        }
    }

    /// A code object's names and line table, read once. A code object a
    /// probe saw may have been freed since and its address reused: the
    /// three pointers from `co_filename` on (names and table, fixed for a
    /// code object's life) are read again each time and must match. What
    /// is read and kept is bounded per process (`cache.rs`).
    fn code(&mut self, addr: u64) -> Result<Arc<Code>, PyError> {
        let mut raw = [0u8; 24];
        self.mem.read(
            addr.wrapping_add(self.offsets.code_filename),
            &mut raw,
            "a code object's names",
        )?;
        if let Some(c) = self.codes.get(&addr).filter(|c| c.fingerprint == raw) {
            return Ok(c.clone());
        }
        self.codes.may_read(self.pid)?;
        let mut code = self.read_code(addr)?;
        code.fingerprint = raw;
        Ok(self.codes.insert(addr, code))
    }

    fn read_code(&mut self, addr: u64) -> Result<Code, PyError> {
        let (mem, o) = (&self.mem, &self.offsets);
        // A frame's code field that is no code object means the offsets do
        // not fit this build: say so instead of reading garbage as names.
        let ty = type_of(mem, o, addr, "a frame's code object")?;
        if self.code_type != Some(ty) {
            let name = type_name(mem, o, ty)?;
            if name != "code" {
                return Err(PyError::BadObject {
                    what: "a frame's code object",
                    addr,
                    reason: format!("its type is {name:?}, not \"code\""),
                });
            }
            self.code_type = Some(ty);
        }
        let ptr = |off: u64, what| mem.u64(addr.wrapping_add(off), what);
        let file = string(mem, o, ptr(o.code_filename, "co_filename")?, "co_filename")?;
        let name_field = if o.code_qualname == NONE {
            o.code_name
        } else {
            o.code_qualname
        };
        let function = string(mem, o, ptr(name_field, "co_qualname")?, "co_qualname")?;
        let first_line = mem.i32(addr.wrapping_add(o.code_firstlineno), "co_firstlineno")?;
        let table = bytes(
            mem,
            o,
            ptr(o.code_linetable, "co_linetable")?,
            "co_linetable",
        )?;
        Ok(Code::new(file, function, first_line, table))
    }
}

/// The frame that the code object `info` (at `code`) runs at `instr`.
fn frame_of(o: &PyOffsets, info: &Code, code: u64, instr: u64) -> PyFrame {
    let start = code.wrapping_add(o.code_adaptive);
    let addr = match o.layout() {
        Layout::Py39 => Some(instr),
        Layout::Py310 => instr.checked_mul(2),
        // Before the first instruction (a frame just pushed) there is
        // no instruction yet.
        Layout::Py311 | Layout::Py313 => instr.checked_sub(start),
    };
    let line = match addr {
        Some(a) if (a as i64) >= 0 => {
            linetable::line_at(o.layout(), &info.table, info.first_line, a)
        }
        _ => Some(info.first_line),
    };
    PyFrame {
        code,
        instr,
        file: info.file.clone(),
        function: info.function.clone(),
        line,
    }
}
