//! CPython stacks of a live process, read from outside it.
//!
//! This is the userspace half of the Python stack capture, and it runs in
//! the namer's CPython reader, an unprivileged child (`namer/cpython.rs`):
//! the recorder only opens, as root, what it reads (`find::candidates`,
//! `mem::open`) and hands the descriptors over (`py/remote.rs`).
//! [`Interpreter::locate_with`] locates the interpreter a process runs (a static
//! `python3.x` or a `libpython3.x.so`), its version, its load bias and
//! `_PyRuntime`, and the struct offsets of that version ([`PyOffsets`],
//! plain data for a BPF map). [`Interpreter::stacks`] walks every
//! thread's frames through `/proc/PID/mem` with exactly those offsets, and
//! [`Interpreter::resolve`] turns a code object and its instruction field
//! into file, function and line, cached per code object. An interpreter
//! that cannot be read is an error with its reason, never an empty stack.
//!
//! How the eBPF walker (`trainbpf-ebpf/src/python.rs`, for `record
//! --stacks`) uses it: the recorder puts the offsets it needs and
//! `runtime` in a per-process map (`stacks/py.rs`) when it locates a
//! Python process. In the probe, the thread's state is the one whose
//! `native_thread_id` is the current tid (3.11 on); for 3.9, 3.10, whose
//! thread states hold only a `pthread_t`, the GIL's holder
//! (`runtime_tstate_current`); from it,
//! `tstate_frame` (and `cframe_current_frame` for 3.11/3.12) gives the top
//! frame, and each step copies `frame_code` and `frame_instr` and follows
//! `frame_previous`, skipping frames whose `frame_owner` byte is 3 (3.12
//! on; the kernel keeps the byte, userspace skips). The (code, instr)
//! pairs come back to userspace, where
//! [`Interpreter::resolve`] names them while the process lives.

mod cache;
mod debug_offsets;
pub mod find;
mod linetable;
pub mod mem;
mod objects;
pub mod offsets;
#[cfg(test)]
mod testdata;
mod walk;

use std::io;

pub use offsets::{Layout, PyOffsets};

use crate::record::samplers::procfs::backing::Backing;

#[derive(Debug, thiserror::Error)]
pub enum PyError {
    #[error("process {pid}: cannot {what}: {source}")]
    Process {
        pid: u32,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "process {pid} runs no CPython: no libpython3.x.so mapped and no _PyRuntime in its executable"
    )]
    NotPython { pid: u32 },
    #[error("{path}: {reason}")]
    Elf { path: String, reason: String },
    #[error("{path}: {reason}")]
    NoRuntime { path: String, reason: String },
    #[error("{path}: the CPython version is unknown (no Py_Version symbol, none in the file name)")]
    UnknownVersion { path: String },
    #[error("CPython {version} is not supported: {reason}")]
    UnsupportedVersion { version: String, reason: String },
    #[error("unusable _Py_DebugOffsets: {reason}")]
    DebugOffsets { reason: String },
    #[error("the interpreter is not initialised (no interpreter state yet, or finalised)")]
    NotInitialized,
    #[error("cannot read {what} at {addr:#x}: {source}")]
    Read {
        what: &'static str,
        addr: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "{what} at {addr:#x} lies on a {fs} filesystem, whose server may never answer: not read"
    )]
    Stalls {
        what: &'static str,
        addr: u64,
        fs: String,
    },
    #[error("{path} lies on a {fs} filesystem, whose server may never answer: not read")]
    FileStalls { path: String, fs: String },
    #[error(
        "more than {limit} bytes of this process's code objects read: no more are (a bound on what one process makes the recorder read)"
    )]
    Budget { limit: u64 },
    #[error("{what} is a null pointer")]
    Null { what: &'static str },
    #[error("{what} at {addr:#x} is not what it should be: {reason}")]
    BadObject {
        what: &'static str,
        addr: u64,
        reason: String,
    },
    #[error("more than {limit} {what}: a loop, or offsets that do not fit this build")]
    TooMany { what: &'static str, limit: usize },
    /// An error the namer met, as it said it (`py/remote.rs`).
    #[error("{text}")]
    Namer {
        text: String,
        not_python: bool,
        settled: bool,
    },
}

impl PyError {
    /// No CPython at all, as opposed to one that cannot be read.
    pub fn not_python(&self) -> bool {
        match self {
            PyError::NotPython { .. } => true,
            PyError::Namer { not_python, .. } => *not_python,
            _ => false,
        }
    }

    /// What the interpreter's file says (a version that cannot be read, a
    /// file that will not be read): the same on a retry.
    pub fn settled(&self) -> bool {
        match self {
            PyError::UnsupportedVersion { .. }
            | PyError::UnknownVersion { .. }
            | PyError::Stalls { .. }
            | PyError::FileStalls { .. } => true,
            PyError::Namer { settled, .. } => *settled,
            _ => false,
        }
    }
}

/// What names a located interpreter's frames, without its file: what the
/// namer says back to the recorder, and is handed again with each request
/// (a namer started afresh rebuilds the interpreter from it).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Desc {
    pub path: String,
    pub version: (u8, u8),
    pub bias: u64,
    pub runtime: u64,
    pub offsets: PyOffsets,
    /// A libpython's way back from its executable (`find::LibLink`).
    #[serde(default)]
    pub link: Option<find::LibLink>,
}

/// One Python frame, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyFrame {
    /// The code object's address in the process.
    pub code: u64,
    /// The frame's instruction field as read (see [`Interpreter::resolve`]).
    pub instr: u64,
    pub file: String,
    /// `co_qualname` where the version has it (3.11 on), else `co_name`.
    pub function: String,
    /// `None` where CPython gives the instruction no line.
    pub line: Option<i32>,
}

/// One thread's Python stack, innermost frame first.
#[derive(Debug)]
pub struct ThreadStack {
    /// The thread state's `thread_id`: its `pthread_t`.
    pub thread_id: u64,
    /// Its kernel tid: `native_thread_id` from 3.11, before that from
    /// glibc's `struct pthread`, where the process has such a thread.
    pub native_tid: Option<u32>,
    /// Whether it holds the GIL (up to 3.11, where `_PyRuntime` says).
    pub holds_gil: Option<bool>,
    /// A thread running no Python code has no frames, which is not an
    /// error; a chain that cannot be read is.
    pub frames: Result<Vec<PyFrame>, PyError>,
}

/// A process's interpreter, found and ready to read.
pub struct Interpreter {
    pid: u32,
    path: String,
    version: (u8, u8),
    bias: u64,
    runtime: u64,
    offsets: PyOffsets,
    link: Option<find::LibLink>,
    mem: mem::Mem,
    /// Code objects by address, checked on each use (`walk::code`), and
    /// the bounds on what is read of them (`cache.rs`).
    codes: cache::Codes,
    code_type: Option<u64>,
}

impl Interpreter {
    /// Finds the CPython `pid` runs and the offsets to read it with, all
    /// in this process: for the tests, which read real interpreters (the
    /// recorder asks the namer instead: `py/remote.rs`).
    pub fn find(pid: u32) -> Result<Interpreter, PyError> {
        let backing =
            crate::record::samplers::procfs::backing::Backing::of(pid).map_err(|source| {
                PyError::Process {
                    pid,
                    what: "read its maps",
                    source,
                }
            })?;
        let candidates = find::candidates(pid, &backing)?;
        Interpreter::locate_with(pid, candidates, mem::open(pid)?, backing)
    }

    /// The namer's look-up: which candidate file holds the interpreter
    /// (its ELF symbols), its version and offsets (read from the memory).
    pub fn locate_with(
        pid: u32,
        candidates: Vec<find::Candidate>,
        mem: std::fs::File,
        backing: Backing,
    ) -> Result<Interpreter, PyError> {
        let found = find::locate_in(pid, candidates)?;
        let mem = mem::Mem::from_file(pid, mem, backing);
        let version = match found.py_version {
            Some(at) => {
                let hex = mem.u32(at, "Py_Version")?;
                (((hex >> 24) & 0xff) as u8, ((hex >> 16) & 0xff) as u8)
            }
            None => {
                find::version_from_name(&found.path).ok_or_else(|| PyError::UnknownVersion {
                    path: found.path.clone(),
                })?
            }
        };
        let offsets = if version >= (3, 13) {
            let raw = mem.bytes(found.runtime, debug_offsets::SIZE, "_Py_DebugOffsets")?;
            debug_offsets::parse(&raw)?
        } else {
            offsets::table(version.0, version.1).ok_or_else(|| PyError::UnsupportedVersion {
                version: format!("{}.{}", version.0, version.1),
                reason: "no offsets table for it (3.9 to 3.12 have one; 3.13 on describe \
                         themselves)"
                    .into(),
            })?
        };
        Ok(Interpreter {
            pid,
            path: found.path,
            version,
            bias: found.bias,
            runtime: found.runtime,
            offsets,
            link: found.link,
            mem,
            codes: Default::default(),
            code_type: None,
        })
    }

    /// An interpreter located before (`desc`), on `pid`'s memory.
    pub fn from_desc(pid: u32, desc: &Desc, mem: std::fs::File, backing: Backing) -> Interpreter {
        Interpreter {
            pid,
            path: desc.path.clone(),
            version: desc.version,
            bias: desc.bias,
            runtime: desc.runtime,
            offsets: desc.offsets,
            link: desc.link,
            mem: mem::Mem::from_file(pid, mem, backing),
            codes: Default::default(),
            code_type: None,
        }
    }

    pub fn desc(&self) -> Desc {
        Desc {
            path: self.path.clone(),
            version: self.version,
            bias: self.bias,
            runtime: self.runtime,
            offsets: self.offsets,
            link: self.link,
        }
    }

    /// Starts with the code objects of `parent`, which `self`'s process
    /// was forked from: the same until the child makes its own (each is
    /// checked on use).
    pub fn share_codes(&mut self, parent: &Interpreter) {
        self.codes = parent.codes.clone();
        self.code_type = parent.code_type;
    }

    /// What backs the memory, as the recorder looked at it last.
    pub fn set_backing(&mut self, backing: Backing) {
        self.mem.set_backing(backing);
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The file holding the interpreter, as the process's maps name it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// (major, minor).
    pub fn version(&self) -> (u8, u8) {
        self.version
    }

    /// Load address minus link-time address of the interpreter's file.
    pub fn bias(&self) -> u64 {
        self.bias
    }

    /// `_PyRuntime`'s address in the process.
    pub fn runtime(&self) -> u64 {
        self.runtime
    }

    pub fn offsets(&self) -> &PyOffsets {
        &self.offsets
    }
}
