//! Growth stacks' Python frames, the collector's side: locates each job
//! process's CPython (`python::Interpreter::find`) when its first stacks
//! arrive, describes it to the kernel's walker (`PY_PROCS`), names the
//! (code, instr) pairs the walker kept while the process lives, and puts
//! them above the native frames, the interpreter's own C frames folded.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use trainbpf_common::{
    PY_DEEP, PY_EMPTY, PY_FAULT_FRAMES, PY_FAULT_THREADS, PY_MANY_THREADS, PY_MAX_FRAMES,
    PY_MAX_THREADS, PY_NO_THREAD, PY_NONE, PY_NOT_INIT, PY_OK, PY_STORE_FULL, ProcId, PyProc,
    PyStack,
};

use super::symbolize::bounded;
use crate::{
    decode::{ProcKey, stacks::Frame},
    python::{Interpreter, Layout, PyError, PyFrame, PyOffsets, offsets::NONE},
};

/// Tries to locate a process's interpreter: right after an exec the
/// dynamic loader may not have mapped `libpython` yet, so a miss is tried
/// again from the process's stacks, this far apart, this many times.
const MAX_TRIES: u32 = 10;
const RETRY_AFTER: Duration = Duration::from_millis(100);

enum State {
    Found(Box<Interpreter>),
    Failed {
        error: String,
        /// No CPython at all (as opposed to one that cannot be read).
        not_python: bool,
        tries: u32,
        last: Instant,
    },
}

/// The located interpreters, by process; bounded by the kernel map's size.
pub struct Pythons {
    procs: HashMap<ProcKey, State>,
    /// Forked children's located parents (`inherit`), while both are known.
    parents: HashMap<ProcKey, ProcKey>,
    max: usize,
}

fn proc_id(p: ProcKey) -> ProcId {
    ProcId {
        tgid: p.tgid,
        _pad: 0,
        start_ns: p.start_ns,
    }
}

/// What the kernel's walker needs, from the offsets the userspace walker
/// reads with.
pub fn describe(i: &Interpreter) -> PyProc {
    describe_offsets(i.offsets(), i.runtime())
}

fn describe_offsets(o: &PyOffsets, runtime: u64) -> PyProc {
    PyProc {
        runtime,
        version: o.version,
        runtime_interpreters_head: o.runtime_interpreters_head,
        runtime_tstate_current: o.runtime_tstate_current,
        interp_threads_head: o.interp_threads_head,
        tstate_next: o.tstate_next,
        tstate_frame: o.tstate_frame,
        cframe_current_frame: if o.layout() == Layout::Py311 {
            o.cframe_current_frame
        } else {
            NONE
        },
        tstate_native_thread_id: o.tstate_native_thread_id,
        frame_previous: o.frame_previous,
        frame_code: o.frame_code,
        frame_instr: o.frame_instr,
        // Shim frames (owner 3) exist from 3.12; before, the walker reads
        // a byte of the code pointer instead (it never branches on a
        // missing field), which `pair` ignores.
        frame_owner: if o.version >= 0x030c {
            o.frame_owner
        } else {
            o.frame_code
        },
        instr_is_int: u64::from(matches!(o.layout(), Layout::Py39 | Layout::Py310)),
    }
}

/// `CODE_MASK` keeps a kept pair's code pointer, the bits above it hold
/// the frame's owner byte (`python.rs` in the eBPF crate).
const CODE_MASK: u64 = (1 << 56) - 1;
/// 3.12's `FRAME_OWNED_BY_CSTACK`.
const OWNED_BY_CSTACK: u64 = 3;

/// A pair as the kernel kept it, as `Interpreter::resolve` takes it:
/// `None` for a shim frame (3.12 on) that stands for no Python code.
fn pair(p: &PyProc, tagged: u64, instr: u64) -> Option<(u64, u64)> {
    let owner = tagged >> 56;
    if p.version >= 0x030c && owner == OWNED_BY_CSTACK {
        return None;
    }
    let instr = if p.instr_is_int != 0 {
        // `f_lasti` is an int: the low half, sign-extended.
        instr as u32 as i32 as i64 as u64
    } else {
        instr
    };
    Some((tagged & CODE_MASK, instr))
}

/// Why a walk kept no frames (or not all), in the report's words.
pub fn state_text(state: u32, kept: usize) -> Option<String> {
    let s = match state {
        PY_OK | PY_NONE => return None,
        PY_DEEP => format!("Python stack deeper than {PY_MAX_FRAMES} frames: the innermost kept"),
        PY_FAULT_FRAMES => {
            format!("Python frame chain unreadable after {kept} frames (a read fault)")
        }
        PY_NO_THREAD => "Python frames not read: this thread has no Python thread state".into(),
        PY_EMPTY => "no Python frame running on this thread".into(),
        PY_FAULT_THREADS => {
            "Python frames not read: the interpreter's thread states could not be read (a read fault)".into()
        }
        PY_NOT_INIT => "Python frames not read: the interpreter was not initialised yet".into(),
        PY_MANY_THREADS => {
            format!("Python frames not read: more than {PY_MAX_THREADS} thread states")
        }
        PY_STORE_FULL => "Python frames not kept: the kernel's Python stack table was full".into(),
        s => format!("Python frames not read (state {s})"),
    };
    Some(s)
}

/// The native frames, the interpreter's own folded, with the Python
/// frames in their place: the native frames inside the allocation (libc,
/// an extension) down to the first frame of the interpreter's file (or
/// one not symbolized: without frame pointers, what follows is guesswork),
/// then the Python frames, innermost first.
pub fn fold(native: &[Frame], python: Vec<Frame>, interpreter: &str) -> Vec<Frame> {
    if python.is_empty() {
        return native.to_vec();
    }
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let interp = base(interpreter);
    let mut out: Vec<Frame> = native
        .iter()
        .take_while(|f| {
            f.function.is_some() && f.module.as_deref().is_some_and(|m| base(m) != interp)
        })
        .cloned()
        .collect();
    out.extend(python);
    out.truncate(crate::decode::stacks::MAX_FRAMES);
    out
}

impl Pythons {
    pub fn new(max: usize) -> Pythons {
        Pythons {
            procs: HashMap::new(),
            parents: HashMap::new(),
            max,
        }
    }

    /// Locates `p`'s interpreter if not done yet (or tried again, after a
    /// miss), and hands it to the kernel's walker.
    pub fn ensure(&mut self, p: ProcKey, map: &mut BpfHashMap<MapData, ProcId, PyProc>) {
        match self.procs.get(&p) {
            Some(State::Found(_)) => return,
            Some(State::Failed { tries, last, .. })
                if *tries >= MAX_TRIES || last.elapsed() < RETRY_AFTER =>
            {
                return;
            }
            Some(State::Failed { .. }) => {}
            None if self.procs.len() >= self.max => return,
            None => {}
        }
        let tries = match self.procs.get(&p) {
            Some(State::Failed { tries, .. }) => tries + 1,
            _ => 1,
        };
        let state = match Interpreter::find(p.tgid) {
            Ok(i) => match map.insert(proc_id(p), describe(&i), 0) {
                Ok(()) => State::Found(Box::new(i)),
                Err(e) => State::Failed {
                    error: format!("the kernel's Python process map: {e}"),
                    not_python: false,
                    tries: MAX_TRIES,
                    last: Instant::now(),
                },
            },
            Err(e) => State::Failed {
                not_python: matches!(e, PyError::NotPython { .. }),
                error: bounded(&e.to_string()),
                tries,
                last: Instant::now(),
            },
        };
        self.procs.insert(p, state);
    }

    /// A job process forked: the kernel handed a located parent's
    /// description to the child already (`python::inherit` in the eBPF
    /// crate); the child's frames are named through the parent's
    /// interpreter, opened on the child's memory now, while it lives (a
    /// worker may be gone before the next drain). Whatever happens, the
    /// child is tracked, so that its exit removes the kernel's entry.
    pub fn inherit(
        &mut self,
        child: ProcKey,
        parent: ProcKey,
        map: &mut BpfHashMap<MapData, ProcId, PyProc>,
    ) {
        let Some(State::Found(i)) = self.procs.get(&parent) else {
            return;
        };
        if self.procs.contains_key(&child) {
            // Its stacks came before its fork was read, and it was looked
            // up from them: only the way back to the parent is new.
            self.parents.insert(child, parent);
            return;
        }
        if self.procs.len() >= self.max {
            // Not tracked: no entry of the kernel's may outlive it.
            let _ = map.remove(&proc_id(child));
            return;
        }
        let state = match i.forked(child.tgid) {
            Ok(c) => State::Found(Box::new(c)),
            // Gone already (its exit follows), or its memory unreadable:
            // its stacks say why, and no look-up is tried again.
            Err(e) => State::Failed {
                not_python: false,
                error: bounded(&e.to_string()),
                tries: MAX_TRIES,
                last: Instant::now(),
            },
        };
        self.procs.insert(child, state);
        self.parents.insert(child, parent);
    }

    /// Tries again the processes not located yet that have tries left:
    /// each drain, so that one caught before its `libpython` was mapped
    /// is located before its first stacks, not after.
    pub fn retry(&mut self, map: &mut BpfHashMap<MapData, ProcId, PyProc>) {
        let due: Vec<ProcKey> = self
            .procs
            .iter()
            .filter(|(_, s)| {
                matches!(s, State::Failed { tries, last, .. }
                    if *tries < MAX_TRIES && last.elapsed() >= RETRY_AFTER)
            })
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            self.ensure(p, map);
        }
    }

    /// The located parent `p` was forked from, if it is one.
    pub fn parent_of(&self, p: ProcKey) -> Option<ProcKey> {
        self.parents.get(&p).copied()
    }

    /// The interpreter's file, where `p`'s was located.
    pub fn interpreter_path(&self, p: ProcKey) -> Option<&str> {
        match self.procs.get(&p) {
            Some(State::Found(i)) => Some(i.path()),
            _ => None,
        }
    }

    /// The Python frames of one stack (`py_id`, `state` as the kernel
    /// kept them), named now, innermost first, and what the report should
    /// say about them (why none, or not all).
    pub fn frames(
        &mut self,
        p: ProcKey,
        py_id: u64,
        state: u32,
        stacks: &BpfHashMap<MapData, u64, PyStack>,
    ) -> (Vec<Frame>, Option<String>) {
        let parent = self.parents.get(&p).copied();
        let parent_found =
            parent.is_some_and(|pp| matches!(self.procs.get(&pp), Some(State::Found(_))));
        let interp = match self.procs.get(&p) {
            Some(State::Found(i)) => i,
            // A forked child gone before its fork was read: its parent's
            // interpreter, which it ran, names its frames below.
            Some(State::Failed { .. }) if parent_found => {
                match parent.and_then(|pp| self.procs.get(&pp)) {
                    Some(State::Found(i)) => i,
                    _ => return (Vec::new(), None),
                }
            }
            Some(State::Failed {
                error, not_python, ..
            }) => {
                return (
                    Vec::new(),
                    (!*not_python).then(|| format!("Python frames not read: {error}")),
                );
            }
            None => return (Vec::new(), None),
        };
        if state == PY_NONE {
            return (
                Vec::new(),
                Some("Python frames not read: taken before the interpreter was located".into()),
            );
        }
        if py_id == 0 {
            return (Vec::new(), state_text(state, 0));
        }
        let st = match stacks.get(&py_id, 0) {
            Ok(st) => st,
            Err(e) => {
                return (
                    Vec::new(),
                    Some(bounded(&format!(
                        "Python frames not in the kernel's table: {e}"
                    ))),
                );
            }
        };
        let desc = describe(interp);
        let procs = &mut self.procs;
        name_pairs(&desc, state, &st, |code, instr| {
            let r = match procs.get_mut(&p) {
                Some(State::Found(i)) => i.resolve(code, instr),
                _ => Err(PyError::NotPython { pid: p.tgid }),
            };
            // A forked worker gone before its stacks were named (its
            // memory unreadable): its code objects were made before the
            // fork, at the same addresses in the parent, which still
            // lives. Each is checked as a code object there too.
            // (Its memory may be gone before its state says it exited.)
            if r.is_err()
                && let Some(Some(State::Found(pi))) = parent.map(|pp| procs.get_mut(&pp))
                && let Ok(f) = pi.resolve(code, instr)
            {
                return (
                    Ok(f),
                    Some("Python frames named through the parent's memory (the process was gone)"),
                );
            }
            (r, None)
        })
    }

    /// The Python frames of a thread's stack at death, as the kernel read
    /// them into its record: named from the process if it can still be
    /// read, else from the code objects named before.
    pub fn frames_at_death(
        &mut self,
        p: ProcKey,
        state: u32,
        st: &PyStack,
    ) -> (Vec<Frame>, Option<String>) {
        match self.procs.get_mut(&p) {
            Some(State::Found(i)) if state != PY_NONE => {
                let desc = describe(i);
                name_pairs(&desc, state, st, |code, instr| {
                    (i.resolve_remembered(code, instr), None)
                })
            }
            Some(State::Found(_)) => (Vec::new(), None),
            Some(State::Failed {
                error, not_python, ..
            }) => (
                Vec::new(),
                (!*not_python).then(|| format!("Python frames not read: {error}")),
            ),
            None => (Vec::new(), None),
        }
    }

    /// Forgets an exited process, in the kernel's map too.
    pub fn forget(&mut self, p: ProcKey, map: &mut BpfHashMap<MapData, ProcId, PyProc>) {
        self.parents.remove(&p);
        if self.procs.remove(&p).is_some() {
            let _ = map.remove(&proc_id(p));
        }
    }

    /// Forgets every process of `tgid` (its exit, or an exec that replaced
    /// its program), in the kernel's map too.
    pub fn forget_tgid(&mut self, tgid: u32, map: &mut BpfHashMap<MapData, ProcId, PyProc>) {
        let gone: Vec<ProcKey> = self
            .procs
            .keys()
            .filter(|k| k.tgid == tgid)
            .copied()
            .collect();
        for p in gone {
            self.parents.remove(&p);
            self.procs.remove(&p);
            let _ = map.remove(&proc_id(p));
        }
    }
}

/// Names the kept pairs of `st`, innermost first, each by `name` (which
/// may add a note on how it named it: through a parent, from an earlier
/// read); a frame it cannot name keeps its code object's address, and the
/// first reason becomes the stack's note.
fn name_pairs(
    desc: &PyProc,
    state: u32,
    st: &PyStack,
    mut name: impl FnMut(u64, u64) -> (Result<PyFrame, PyError>, Option<&'static str>),
) -> (Vec<Frame>, Option<String>) {
    let n = (st.len as usize).min(PY_MAX_FRAMES);
    let mut note = state_text(state, n);
    let mut out = Vec::with_capacity(n);
    for &[tagged, instr] in &st.frames[..n] {
        let Some((code, instr)) = pair(desc, tagged, instr) else {
            continue;
        };
        let (named, how) = name(code, instr);
        if let Some(how) = how {
            note.get_or_insert_with(|| how.into());
        }
        match named {
            Ok(f) => out.push(Frame {
                kind: "python".into(),
                addr: code,
                function: Some(bounded(&f.function)),
                file: Some(bounded(&f.file)),
                line: f.line.and_then(|l| u32::try_from(l).ok()),
                module: None,
            }),
            Err(e) => {
                note.get_or_insert_with(|| bounded(&format!("a Python frame: {e}")));
                out.push(Frame {
                    kind: "python".into(),
                    addr: code,
                    ..Default::default()
                });
            }
        }
    }
    (out, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(f: &str, module: &str) -> Frame {
        Frame {
            kind: "native".into(),
            function: Some(f.into()),
            module: Some(module.into()),
            ..Default::default()
        }
    }

    fn py(f: &str) -> Frame {
        Frame {
            kind: "python".into(),
            function: Some(f.into()),
            file: Some("leak.py".into()),
            line: Some(3),
            ..Default::default()
        }
    }

    /// The allocation's own native frames stay, the interpreter's are
    /// folded, and the Python frames follow them, innermost first.
    #[test]
    fn interpreter_frames_are_folded() {
        let n = vec![
            native("__memset_avx2", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            native("bytearray_init", "/usr/bin/python3.11"),
            native("_PyEval_EvalFrameDefault", "/usr/bin/python3.11"),
            native("main", "/usr/bin/python3.11"),
        ];
        let out = fold(&n, vec![py("leak_step"), py("main")], "/usr/bin/python3.11");
        let names: Vec<_> = out.iter().map(|f| f.function.clone().unwrap()).collect();
        assert_eq!(names, ["__memset_avx2", "leak_step", "main"]);
        assert_eq!(out[1].kind, "python");
        // An unsymbolized frame ends the native part too.
        let mut odd = n.clone();
        odd[1].function = None;
        assert_eq!(fold(&odd, vec![py("f")], "python3.11").len(), 2);
        // No Python frames: the native stack as it was.
        assert_eq!(fold(&n, Vec::new(), "python3.11"), n);
    }

    #[test]
    fn every_state_has_words() {
        assert_eq!(state_text(PY_OK, 3), None);
        for s in [
            PY_DEEP,
            PY_FAULT_FRAMES,
            PY_NO_THREAD,
            PY_EMPTY,
            PY_FAULT_THREADS,
            PY_NOT_INIT,
            PY_MANY_THREADS,
            PY_STORE_FULL,
        ] {
            let t = state_text(s, 2).unwrap();
            assert!(!t.contains("(state"), "{s}: {t}");
        }
    }

    /// The kernel's walker gets the fields of the table the userspace
    /// walker is tested with, and each layout's quirks.
    #[test]
    fn describes_each_layout() {
        use crate::python::offsets::table;
        let p = describe_offsets(&table(3, 11).unwrap(), 0x1000);
        assert_eq!((p.runtime, p.version), (0x1000, 0x030b));
        assert_eq!(p.cframe_current_frame, 8);
        assert_eq!(p.frame_owner, p.frame_code, "3.11 has no shim frames");
        assert_eq!(p.instr_is_int, 0);
        let p = describe_offsets(&table(3, 12).unwrap(), 0);
        assert_eq!((p.cframe_current_frame, p.frame_owner), (0, 70));
        let p = describe_offsets(&table(3, 10).unwrap(), 0);
        assert_eq!(p.instr_is_int, 1);
        assert_eq!(
            p.tstate_native_thread_id, NONE,
            "the GIL's holder is walked"
        );
        assert_eq!(p.cframe_current_frame, NONE);
    }

    /// The kernel's pairs: the owner byte above the code pointer, an
    /// `int` instruction field's other half ignored.
    #[test]
    fn pairs_as_kept() {
        use crate::python::offsets::table;
        let p312 = describe_offsets(&table(3, 12).unwrap(), 0);
        let code = 0x7f12_3456_7890;
        assert_eq!(pair(&p312, code | 3 << 56, 5), None, "a shim frame");
        assert_eq!(pair(&p312, code, 0x55), Some((code, 0x55)));
        let p311 = describe_offsets(&table(3, 11).unwrap(), 0);
        // Before 3.12 the byte read is the code pointer's own.
        assert_eq!(pair(&p311, code | 0x90 << 56, 7), Some((code, 7)));
        assert_eq!(pair(&p311, code | 3 << 56, 7), Some((code, 7)));
        let p310 = describe_offsets(&table(3, 10).unwrap(), 0);
        assert_eq!(
            pair(&p310, code, 0x1234_5678_ffff_fffe),
            Some((code, -2i64 as u64)),
            "f_lasti is the low half"
        );
    }
}
