//! Growth stacks' Python frames, the collector's side: locates each job
//! process's CPython (`remote::Remote::find`, parsed in the namer's
//! CPython reader) when its first stacks arrive, describes it to the
//! kernel's walker (`PY_PROCS`), has the (code, instr) pairs the walker
//! kept named while the process lives, and puts them above the native
//! frames, the interpreter's own C frames folded.
//!
//! Every read of a process (its maps, its interpreter's file, its memory,
//! and the requests to the reader that parses them) runs on a
//! `procfs::guard` worker with a deadline, the handle passed over and
//! back: the process can make a read of its memory wait for good. One
//! whose read stalled is not read again, and its frames say why.

use std::{
    collections::{HashMap, HashSet},
    sync::mpsc::{self, Receiver, Sender},
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use trainbpf_common::{PY_AT_EXEC, PY_NONE, ProcId, PyProc, PyStack};
use trainbpf_report::decode::{ProcKey, stacks::Frame};

use super::symbolize::bounded;
use crate::{
    record::samplers::procfs::guard::{Count, DEADLINE, FILES_DEADLINE, Readers, STATS, Stall},
    record::stacks::python::PyError,
};

mod exes;
mod frames;
mod inherit;
mod remote;
pub use exes::Exes;
pub use frames::{fold, state_text};
use frames::{name_pairs, pairs_to_name};
use remote::Remote;

/// Python frames named per process in one drain: past this, a stack's
/// frames keep only their code objects' addresses (each name is a few
/// reads of the process's memory).
pub const MAX_FRAMES_PER_PASS: usize = 4096;

/// Tries to locate a process's interpreter: right after an exec the
/// dynamic loader may not have mapped `libpython` yet, so a miss is tried
/// again from the process's stacks, this far apart, this many times.
const MAX_TRIES: u32 = 10;
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// For a process whose stacks are coming in without Python frames: a
/// drain's naming can take long, and each stack taken meanwhile has none.
const RETRY_SOON: Duration = Duration::from_millis(20);

enum State {
    Found(Box<Remote>),
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
    readers: Readers,
    /// Frames named per process in this drain (`begin_pass`).
    named: HashMap<ProcKey, usize>,
    /// Interpreters whose read was given up on (`guarded`), and where
    /// those that were slow rather than stuck come back.
    lost: HashSet<ProcKey>,
    late: (Sender<Late>, Receiver<Late>),
    /// When each process's state was set (CLOCK_MONOTONIC, as the
    /// kernel's records): an exec read after it discards only what came
    /// before it.
    since: HashMap<ProcKey, u64>,
    /// Interpreters filed by their executable, for the kernel to describe
    /// at the next exec of it.
    exes: Option<Exes>,
}

/// Interpreters handed back after their read's deadline: each with its
/// process.
type Late = Vec<(ProcKey, Box<Remote>)>;

/// An interpreter whose read stalled: lost with its worker, and not
/// looked for again.
fn stalled(e: &Stall) -> State {
    State::Failed {
        error: bounded(&e.to_string()),
        not_python: false,
        tries: MAX_TRIES,
        last: Instant::now(),
    }
}

/// A failed look-up's state. What the interpreter's file says (a version
/// the recorder cannot read, a file it will not read) does not change on
/// a retry, so it is final; and a retry that finds the process gone keeps
/// the reason an earlier try gave, which says more than its absence.
fn failed(prev: Option<&State>, e: &PyError, tries: u32) -> State {
    let last = Instant::now();
    if let (
        PyError::Process { .. },
        Some(State::Failed {
            error, not_python, ..
        }),
    ) = (e, prev)
    {
        return State::Failed {
            error: error.clone(),
            not_python: *not_python,
            tries: MAX_TRIES,
            last,
        };
    }
    let settled = e.settled();
    State::Failed {
        not_python: e.not_python(),
        error: bounded(&e.to_string()),
        tries: if settled { MAX_TRIES } else { tries },
        last,
    }
}

fn proc_id(p: ProcKey) -> ProcId {
    ProcId {
        tgid: p.tgid,
        _pad: 0,
        start_ns: p.start_ns,
    }
}

impl Pythons {
    pub fn new(max: usize, readers: Readers, exes: Option<Exes>) -> Pythons {
        Pythons {
            procs: HashMap::new(),
            parents: HashMap::new(),
            max,
            readers,
            named: HashMap::new(),
            lost: HashSet::new(),
            late: mpsc::channel(),
            since: HashMap::new(),
            exes,
        }
    }

    /// Takes back the interpreters of reads that were slow, not stuck:
    /// those processes are read again.
    fn adopt_late(&mut self) {
        while let Ok(back) = self.late.1.try_recv() {
            for (p, i) in back {
                if self.lost.remove(&p)
                    && let Some(slot) = self.procs.get_mut(&p)
                {
                    *slot = State::Found(i);
                }
            }
        }
    }

    /// A drain begins: each process may have `MAX_FRAMES_PER_PASS` frames
    /// named in it.
    pub fn begin_pass(&mut self) {
        self.named.clear();
        self.adopt_late();
        for s in self.procs.values_mut() {
            if let State::Found(i) = s {
                i.stale();
            }
        }
    }

    /// Locates `p`'s interpreter if not done yet (or tried again, after a
    /// miss), and hands it to the kernel's walker.
    pub fn ensure(&mut self, p: ProcKey, map: &mut BpfHashMap<MapData, ProcId, PyProc>) {
        self.ensure_after(p, map, RETRY_AFTER);
    }

    /// [`Pythons::ensure`] for a process whose new stacks came without
    /// Python frames: tried again sooner after a miss.
    pub fn ensure_soon(&mut self, p: ProcKey, map: &mut BpfHashMap<MapData, ProcId, PyProc>) {
        self.ensure_after(p, map, RETRY_SOON);
    }

    fn ensure_after(
        &mut self,
        p: ProcKey,
        map: &mut BpfHashMap<MapData, ProcId, PyProc>,
        retry_after: Duration,
    ) {
        self.adopt_attached(p, map);
        match self.procs.get(&p) {
            Some(State::Found(_)) => return,
            Some(State::Failed { tries, last, .. })
                if *tries >= MAX_TRIES || last.elapsed() < retry_after =>
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
        let tgid = p.tgid;
        let exec = self.exes.as_ref().and_then(|e| e.exe_of(proc_id(p)));
        let state = match self.readers.run(FILES_DEADLINE, move || Remote::find(tgid)) {
            Ok(Ok(i)) => match map.insert(proc_id(p), i.describe(), 0) {
                Ok(()) => {
                    if let Some(e) = &mut self.exes {
                        e.file(proc_id(p), exec, i.desc());
                    }
                    State::Found(Box::new(i))
                }
                Err(e) => State::Failed {
                    error: format!("the kernel's Python process map: {e}"),
                    not_python: false,
                    tries: MAX_TRIES,
                    last: Instant::now(),
                },
            },
            Ok(Err(e)) => failed(self.procs.get(&p), &e, tries),
            Err(e) => {
                STATS.note(|| format!("pid {tgid}: its interpreter not located: {e}"));
                stalled(&e)
            }
        };
        self.procs.insert(p, state);
        self.since.insert(p, crate::util::clock::mono_ns());
    }

    /// Locates `p` now, whenever it was last tried: for a process the
    /// kernel holds for it. Whether it was found, or may be on a later
    /// try (`None`: neither).
    pub fn locate_now(
        &mut self,
        p: ProcKey,
        map: &mut BpfHashMap<MapData, ProcId, PyProc>,
    ) -> Option<bool> {
        self.ensure_after(p, map, Duration::ZERO);
        match self.procs.get(&p) {
            Some(State::Found(_)) => Some(true),
            Some(State::Failed { tries, .. }) if *tries < MAX_TRIES => Some(false),
            _ => None,
        }
    }

    /// Files `p`'s interpreter for the next exec of its file, where it is
    /// located and its process stopped since its last exec (the kernel's
    /// hold): a look-up that raced that exec may have found the new
    /// program without seeing the exec, and filed nothing.
    pub fn file_held(&mut self, p: ProcKey) {
        if let (Some(State::Found(i)), Some(e)) = (self.procs.get(&p), &mut self.exes) {
            let seen = e.exe_of(proc_id(p));
            e.file(proc_id(p), seen, i.desc());
        }
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

    /// Takes `p`'s interpreter out, to hand to a worker.
    fn take(&mut self, p: ProcKey) -> Option<Box<Remote>> {
        let s = self.procs.get_mut(&p)?;
        if !matches!(s, State::Found(_)) {
            return None;
        }
        // A placeholder while it is out: put back, or replaced by the
        // stall's state.
        match std::mem::replace(s, stalled(&Stall::Failed)) {
            State::Found(i) => Some(i),
            other => {
                *s = other;
                None
            }
        }
    }

    /// Runs `f` on a worker with `p`'s interpreter and its parent's (where
    /// located), and puts them back. A stall loses them: neither is read
    /// again, and their frames say why.
    fn guarded<T: Send + 'static>(
        &mut self,
        p: ProcKey,
        parent: Option<ProcKey>,
        f: impl FnOnce(&mut Option<Box<Remote>>, &mut Option<Box<Remote>>) -> T + Send + 'static,
    ) -> Result<T, Stall> {
        let mut own = self.take(p);
        let mut par = parent.and_then(|pp| self.take(pp));
        let (had_own, had_par) = (own.is_some(), par.is_some());
        let late = self.late.0.clone();
        let r = self.readers.run_or_late(
            DEADLINE,
            move || {
                for i in [own.as_mut(), par.as_mut()].into_iter().flatten() {
                    i.look();
                }
                let t = f(&mut own, &mut par);
                (own, par, t)
            },
            // Slow, not stuck: the interpreters come back.
            move |(own, par, _)| {
                let back = [(Some(p), own), (parent, par)]
                    .into_iter()
                    .filter_map(|(k, i)| Some((k?, i?)))
                    .collect();
                let _ = late.send(back);
            },
        );
        let back = |s: &mut Self, k: Option<ProcKey>, i: Option<Box<Remote>>| {
            if let (Some(k), Some(i)) = (k, i)
                && let Some(slot) = s.procs.get_mut(&k)
            {
                *slot = State::Found(i);
            }
        };
        match r {
            Ok((own, par, t)) => {
                back(self, Some(p), own);
                back(self, parent, par);
                Ok(t)
            }
            Err(e) => {
                STATS.note(|| format!("pid {}: its Python frames: {e}", p.tgid));
                for (k, had) in [(Some(p), had_own), (parent, had_par)] {
                    if let (Some(k), true) = (k, had) {
                        self.procs.insert(k, stalled(&e));
                        self.lost.insert(k);
                    }
                }
                Err(e)
            }
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
        // Walked with the kernel's description made at an exec: the new
        // program's code objects, which its parent's memory does not hold.
        let execd = state & PY_AT_EXEC != 0;
        let state = state & !PY_AT_EXEC;
        self.adopt_late();
        let parent = self.parents.get(&p).copied().filter(|_| !execd);
        let parent_found =
            parent.is_some_and(|pp| matches!(self.procs.get(&pp), Some(State::Found(_))));
        let desc = match self.procs.get(&p) {
            Some(State::Found(i)) => i.describe(),
            // A forked child gone before its fork was read: its parent's
            // interpreter, which it ran, names its frames below.
            Some(State::Failed { .. }) if parent_found => {
                match parent.and_then(|pp| self.procs.get(&pp)) {
                    Some(State::Found(i)) => i.describe(),
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
        let named = self.named.entry(p).or_default();
        let mut left = MAX_FRAMES_PER_PASS.saturating_sub(*named);
        let pairs = pairs_to_name(&desc, &st, left);
        let r = self.guarded(p, parent, move |own, par| {
            // One request to the namer for the stack's pairs, each tried
            // in the process and, where that fails, in its parent: a
            // forked worker gone before its stacks were named (its memory
            // unreadable) ran code objects made before the fork, at the
            // same addresses in the parent, which still lives. (Its memory
            // may be gone before its state says it exited.)
            let mut named =
                Remote::resolve_all(own.as_deref(), par.as_deref(), pairs, false)?.into_iter();
            let r = name_pairs(&desc, state, &st, &mut left, |_, _| {
                named
                    .next()
                    .unwrap_or((Err(PyError::NotPython { pid: p.tgid }), None))
            });
            Ok((r, left))
        });
        match r {
            Ok(Ok(((frames, note), left))) => {
                *self.named.entry(p).or_default() = MAX_FRAMES_PER_PASS - left;
                (frames, note)
            }
            Ok(Err(e)) => self.reader_failed(p, &e),
            Err(e) => (Vec::new(), Some(format!("Python frames not read: {e}"))),
        }
    }

    /// The reader failed on a request about `p` (counted and said where
    /// it failed): `p` is not read again, and its frames say why.
    fn reader_failed(&mut self, p: ProcKey, e: &PyError) -> (Vec<Frame>, Option<String>) {
        self.procs.insert(p, failed(None, e, MAX_TRIES));
        (Vec::new(), Some(format!("Python frames not read: {e}")))
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
        let state = state & !PY_AT_EXEC;
        self.adopt_late();
        let desc = match self.procs.get(&p) {
            Some(State::Found(i)) if state != PY_NONE => i.describe(),
            Some(State::Found(_)) => return (Vec::new(), None),
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
        let st = *st;
        let pairs = pairs_to_name(&desc, &st, usize::MAX);
        let r = self.guarded(p, None, move |own, _| {
            let mut left = usize::MAX;
            let mut named = Remote::resolve_all(own.as_deref(), None, pairs, true)?.into_iter();
            Ok(name_pairs(&desc, state, &st, &mut left, |_, _| {
                named
                    .next()
                    .unwrap_or((Err(PyError::NotPython { pid: p.tgid }), None))
            }))
        });
        match r {
            Ok(Ok(named)) => named,
            Ok(Err(e)) => self.reader_failed(p, &e),
            Err(e) => (Vec::new(), Some(format!("Python frames not read: {e}"))),
        }
    }

    /// Forgets an exited process; its keys in the kernel's map go into
    /// `gone`, for the caller to delete with the others' (in one call).
    pub fn forget(&mut self, p: ProcKey, gone: &mut Vec<ProcId>) {
        let wild = ProcKey {
            tgid: p.tgid,
            start_ns: 0,
        };
        // An attached process never met with its start time: its pid's
        // entry goes with it, before the pid is another process's.
        if p.start_ns != 0 && self.procs.remove(&wild).is_some() {
            self.since.remove(&wild);
            gone.push(proc_id(wild));
        }
        self.parents.remove(&p);
        self.named.remove(&p);
        self.lost.remove(&p);
        self.since.remove(&p);
        if self.procs.remove(&p).is_some() {
            gone.push(proc_id(p));
        }
    }

    /// Forgets every process of `tgid` whose state was set before `before`
    /// (an exec at that time replaced its program), in the kernel's map
    /// too. One located or tried since ran the new program already: the
    /// exec is read after the stacks it took, and it stays.
    pub fn forget_tgid(
        &mut self,
        tgid: u32,
        before: u64,
        map: &mut BpfHashMap<MapData, ProcId, PyProc>,
    ) {
        let gone: Vec<ProcKey> = self
            .procs
            .keys()
            .filter(|k| k.tgid == tgid && self.since.get(k).is_none_or(|&at| at < before))
            .copied()
            .collect();
        for p in gone {
            self.parents.remove(&p);
            self.lost.remove(&p);
            self.since.remove(&p);
            self.procs.remove(&p);
            // The kernel forgot the old program's entry at the exec; one
            // there now is the old program's only if put by a look-up that
            // raced the exec. The kernel's own, made at the exec for the
            // new program, stays.
            if map
                .get(&proc_id(p), 0)
                .is_ok_and(|d: PyProc| d.at_exec == 0)
            {
                let _ = map.remove(&proc_id(p));
            }
        }
    }
}

/// Counted where a pass's bound leaves frames unnamed (`frames.rs`).
pub(super) fn frames_cut(n: usize) {
    STATS.add(Count::PyFramesCut, n as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_and_tries(s: &State) -> (&str, u32) {
        match s {
            State::Failed { error, tries, .. } => (error, *tries),
            State::Found(_) => panic!("found"),
        }
    }

    #[test]
    fn an_unsupported_version_is_not_tried_again() {
        let e = PyError::UnsupportedVersion {
            version: "3.8".into(),
            reason: "no offsets".into(),
        };
        let s = failed(None, &e, 1);
        assert_eq!(
            error_and_tries(&s),
            ("CPython 3.8 is not supported: no offsets", MAX_TRIES)
        );
        // A miss before the library is mapped is tried again.
        let s = failed(None, &PyError::NotPython { pid: 7 }, 1);
        assert_eq!(error_and_tries(&s).1, 1);
    }

    #[test]
    fn a_process_gone_on_a_retry_keeps_the_earlier_reason() {
        let first = failed(None, &PyError::NotPython { pid: 7 }, 1);
        let gone = PyError::Process {
            pid: 7,
            what: "stat its exe",
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let s = failed(Some(&first), &gone, 2);
        let (error, tries) = error_and_tries(&s);
        assert!(error.contains("runs no CPython"), "{error}");
        assert_eq!(tries, MAX_TRIES);
        // Gone at the first try: that is the reason.
        let s = failed(None, &gone, 1);
        assert!(error_and_tries(&s).0.contains("cannot stat its exe"));
    }
}
