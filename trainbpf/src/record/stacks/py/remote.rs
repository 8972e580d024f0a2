//! The recorder's handle on a process's interpreter. The recorder does
//! only what needs root: it finds which mapped files may hold CPython and
//! opens them through `map_files`, opens the process's memory, and looks
//! at what backs that memory (FUSE pages are never read). The files and
//! the memory are parsed in the namer's CPython reader
//! (`namer/cpython.rs`), an unprivileged child, which gets the
//! descriptors. Each request carries what the child needs to rebuild the
//! interpreter, so a child started again after a failure goes on.

use std::{
    fs::File,
    os::fd::{AsRawFd as _, RawFd},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use trainbpf_common::PyProc;

use super::frames::describe_offsets;
use crate::record::{
    samplers::procfs::{backing::Backing, guard::STATS},
    stacks::{
        namer::{
            self,
            cpython::{LocateMsg, ResolveMsg, Target},
        },
        python::{Desc, PyError, PyFrame, find, mem},
    },
};

/// How long a look at what backs the memory is used before another,
/// within one pass of reads (each pass looks afresh: `stale`).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Ids of dropped handles kept for the namer to forget: past it, they
/// are left to the namer's own bound.
const MAX_DROPPED: usize = 1 << 16;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Handles dropped since the last request: the namer forgets them.
static DROPPED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// A process's interpreter, located: its description, and the process's
/// memory as the recorder opened it.
pub struct Remote {
    id: u64,
    pid: u32,
    desc: Desc,
    mem: File,
    backing: Backing,
    /// None: look again before the next read.
    looked: Option<Instant>,
    /// The handle of the process this one was forked from.
    from: Option<u64>,
}

/// Pairs named, in order, each with how, where that is worth a note.
pub type Named = Vec<(Result<PyFrame, PyError>, Option<&'static str>)>;

/// A process's memory, opened, with what backs it as looked at then.
pub struct Memory {
    file: File,
    backing: Backing,
}

fn backing_of(pid: u32) -> Result<Backing, PyError> {
    Backing::of(pid).map_err(|source| PyError::Process {
        pid,
        what: "read its maps",
        source,
    })
}

/// The reader failed on a request about this process (it crashed, hung
/// or said nonsense, and was counted and said): the process is not asked
/// about again, so that one job's process cannot use up the reader's
/// starts for all the others.
fn namer_error(e: String) -> PyError {
    PyError::Namer {
        text: format!("the Python reader failed: {e}"),
        not_python: false,
        settled: true,
    }
}

impl Remote {
    /// Locates the CPython `pid` runs: the candidate files opened here,
    /// their ELF read in the namer, which says where `_PyRuntime` is, the
    /// version and the offsets to read it with.
    pub fn find(pid: u32) -> Result<Remote, PyError> {
        let candidates = find::candidates(pid, &backing_of(pid)?)?;
        let mem = mem::open(pid)?;
        // Looked at again last, right before the reader reads: a page the
        // process mapped from FUSE since the files were opened is seen.
        let backing = backing_of(pid)?;
        let mut fds: Vec<RawFd> = vec![mem.as_raw_fd()];
        fds.extend(
            candidates
                .iter()
                .filter_map(|c| c.file.as_ref().ok().map(|f| f.as_raw_fd())),
        );
        let msg = LocateMsg::new(pid, &candidates, backing.clone());
        let located = namer::locate(msg, &fds).map_err(namer_error)?;
        STATS.absorb(located.relay);
        let desc = located.desc.map_err(PyError::from)?;
        // What comes back from the child is checked as anything from it:
        // the file it names must be one it was asked about.
        if !candidates.iter().any(|c| c.whole[0].path == desc.path) {
            return Err(namer_error("it named a file it was not asked about".into()));
        }
        Ok(Remote {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            pid,
            desc,
            mem,
            backing,
            looked: Some(Instant::now()),
            from: None,
        })
    }

    /// The memory of `pid`, opened (what [`Remote::forked_on`] needs: the
    /// part of a fork's look-up that reads the process).
    pub fn open_memory(pid: u32) -> Result<Memory, PyError> {
        let backing = backing_of(pid)?;
        Ok(Memory {
            file: mem::open(pid)?,
            backing,
        })
    }

    /// The same interpreter in `child`, a fork of this process: the same
    /// file at the same addresses, and the same code objects until the
    /// child makes its own, so nothing is looked up again.
    pub fn forked_on(&self, child: u32, mem: Memory) -> Remote {
        Remote {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            pid: child,
            desc: self.desc.clone(),
            mem: mem.file,
            backing: mem.backing,
            looked: Some(Instant::now()),
            from: Some(self.id),
        }
    }

    /// The next `look` looks again, however recent the last (a pass of
    /// reads begins).
    pub fn stale(&mut self) {
        self.looked = None;
    }

    /// Looks again at what backs the process's memory, where the last look
    /// is old: a page mapped from FUSE since is not read either.
    pub fn look(&mut self) {
        if self.looked.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return;
        }
        if let Ok(b) = Backing::of(self.pid) {
            self.backing = b;
        }
        self.looked = Some(Instant::now());
    }

    /// The file holding the interpreter, as the process's maps name it.
    pub fn path(&self) -> &str {
        &self.desc.path
    }

    /// What the reader located.
    pub fn desc(&self) -> &Desc {
        &self.desc
    }

    /// What the kernel's walker needs.
    pub fn describe(&self) -> PyProc {
        describe_offsets(&self.desc.offsets, self.desc.runtime)
    }

    fn target(&self) -> Target {
        Target {
            id: self.id,
            pid: self.pid,
            desc: self.desc.clone(),
            backing: self.backing.clone(),
            from: self.from,
        }
    }

    /// Names `pairs` (code object, instruction field), in order, in
    /// `own`'s process and where that fails in `parent`'s; `remembered`,
    /// from code objects named before where the memory is gone. Each
    /// result comes with how it was named, where that is worth a note; an
    /// error where the reader failed on the request.
    pub fn resolve_all(
        own: Option<&Remote>,
        parent: Option<&Remote>,
        pairs: Vec<(u64, u64)>,
        remembered: bool,
    ) -> Result<Named, PyError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let fds: Vec<RawFd> = [own, parent]
            .into_iter()
            .flatten()
            .map(|r| r.mem.as_raw_fd())
            .collect();
        let forget = std::mem::take(&mut *DROPPED.lock().unwrap_or_else(|e| e.into_inner()));
        let msg = ResolveMsg {
            own: own.map(Remote::target),
            parent: parent.map(Remote::target),
            pairs: pairs.clone(),
            remembered,
            forget,
        };
        let r = namer::resolve(msg, &fds).map_err(namer_error)?;
        STATS.absorb(r.relay);
        Ok(r.pairs
            .into_iter()
            .zip(pairs)
            .map(|(a, (code, instr))| {
                let how = a.via_parent.then_some(
                    "Python frames named through the parent's memory (the process was gone)",
                );
                let f = a.frame.map_err(PyError::from).map(|f| PyFrame {
                    code,
                    instr,
                    file: f.file,
                    function: f.function,
                    line: f.line,
                });
                (f, how)
            })
            .collect())
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let mut d = DROPPED.lock().unwrap_or_else(|e| e.into_inner());
        if d.len() < MAX_DROPPED {
            d.push(self.id);
        }
    }
}
