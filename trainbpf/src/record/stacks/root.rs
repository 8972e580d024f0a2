//! The job's root, held by the kernel until its interpreter is looked for
//! (`python::at_exec`, `python::hold_unlocated` in the eBPF crate): the
//! first exec of a file no interpreter was filed under stops it before
//! its first instruction, and where the interpreter is a `libpython` the
//! loader has not mapped yet, its first walk that finds no description
//! stops it again. Each time, the stacks' thread looks for the
//! interpreter, files it for later execs, and continues the root through
//! a pidfd opened while it was the recorder's unreaped child. A stop
//! lasts as long as one look-up, whose reads have their deadline; the
//! trampoline's parent-death signal continues a root held when the
//! recorder dies.

use aya::maps::{HashMap as BpfHashMap, MapData};
use trainbpf_common::ExecHold;
use trainbpf_report::decode::ProcKey;

use super::StackCollector;
use crate::record::{gpu::held::Pidfd, samplers::procfs::guard::STATS};

pub struct Root {
    pid: u32,
    fd: Pidfd,
    /// `EXEC_HOLD`: its holds left, and whether the kernel holds it now.
    hold: BpfHashMap<MapData, u32, ExecHold>,
    /// Its key, from its last exec.
    key: Option<ProcKey>,
}

impl Root {
    pub fn new(pid: u32, fd: Pidfd, hold: BpfHashMap<MapData, u32, ExecHold>) -> Root {
        Root {
            pid,
            fd,
            hold,
            key: None,
        }
    }
}

impl StackCollector {
    pub fn set_root(&mut self, r: Root) {
        self.root = Some(r);
    }

    /// The root, stopped by the kernel at its exec: the kernel held only a
    /// process that ran no located interpreter before, so no stack of the
    /// old program waits to be named with one.
    pub(super) fn release_root(&mut self, proc: ProcKey, ts: u64) {
        if self.root.as_ref().is_none_or(|r| r.pid != proc.tgid) {
            return;
        }
        self.pythons
            .forget_tgid(proc.tgid, ts, &mut self.maps.py_procs);
        if let Some(r) = &mut self.root {
            r.key = Some(proc);
        }
        self.locate_root(proc, true);
    }

    /// Where the kernel held the root at a walk, since the last look.
    pub fn poll_hold(&mut self) {
        let Some(r) = &self.root else {
            return;
        };
        let (Some(key), Ok(h)) = (r.key, r.hold.get(&r.pid, 0)) else {
            return;
        };
        if h.held_ns != 0 {
            self.locate_root(key, false);
        }
    }

    /// Looks for the root's interpreter and continues it. Where none is
    /// mapped yet at an exec of an executable named as CPython's are, the
    /// kernel may hold it at up to `WALK_HOLDS` of its next walks that
    /// find no description.
    fn locate_root(&mut self, proc: ProcKey, at_exec: bool) {
        const WALK_HOLDS: u32 = 2;
        let found = self.pythons.locate_now(proc, &mut self.maps.py_procs);
        // Stopped since the exec it was held at: the interpreter located
        // is that program's, whichever look-up found it.
        self.pythons.file_held(proc);
        let Some(r) = &mut self.root else {
            return;
        };
        if let Ok(mut h) = r.hold.get(&r.pid, 0) {
            h.held_ns = 0;
            h.armed = match found {
                Some(false) if at_exec && named_python(r.pid) => WALK_HOLDS,
                Some(false) => h.armed.min(WALK_HOLDS),
                _ => 0,
            };
            let _ = r.hold.insert(r.pid, h, 0);
        }
        if let Err(e) = r.fd.signal(libc::SIGCONT) {
            let pid = r.pid;
            STATS.note(|| {
                format!("the job (pid {pid}), held for its interpreter, not continued: {e}")
            });
        }
    }
}

/// Whether `pid`'s executable is named as CPython's are (`python3.11`,
/// `python3`, `python`): the one kind whose `libpython` is worth stopping
/// it again for, at its first stacks. Any other program (a C job, a shell)
/// runs on at once: a stop there costs up to a tick of the stacks' thread
/// and finds nothing.
fn named_python(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| Some(p.file_name()?.to_string_lossy().starts_with("python")))
        .unwrap_or(false)
}
