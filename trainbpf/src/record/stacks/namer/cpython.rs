//! The namer's CPython half: the job's interpreter file (its ELF symbols)
//! and its CPython structures in memory (thread states, code objects,
//! names, line tables) are parsed here, in the unprivileged child, never
//! in the recorder.
//!
//! The recorder opens what only root may (the process's memory, its
//! mapped files through `map_files`) and hands the descriptors over; it
//! also looks at what backs the memory (a page on FUSE is never read) and
//! sends each look with its requests. Every request carries what the
//! child needs to rebuild an interpreter it does not hold (its
//! description, from the look-up), so a child started afresh after a
//! crash or a hang goes on where the last left off, less its cache of
//! code objects. What reading costs and skips here (`STATS`) travels back
//! with each answer.

use std::{collections::HashMap, fs::File, os::fd::OwnedFd};

use serde::{Deserialize, Serialize};

use crate::record::{
    samplers::procfs::{
        backing::Backing,
        guard::{Relay, STATS},
    },
    stacks::python::{
        Desc, Interpreter, PyError, PyFrame,
        find::{Candidate, Mapping},
    },
};

/// Interpreters held (one per process, with its cache of code objects and
/// a descriptor of its memory, well under the usual 1024 descriptors):
/// past it, all are dropped and rebuilt from the next requests.
const MAX_INTERPRETERS: usize = 512;

/// An error as the namer says it, and what the recorder needs to know of
/// it (whether to look again later).
#[derive(Debug, Serialize, Deserialize)]
pub struct WireError {
    text: String,
    not_python: bool,
    settled: bool,
}

impl From<&PyError> for WireError {
    fn from(e: &PyError) -> WireError {
        WireError {
            text: e.to_string(),
            not_python: e.not_python(),
            settled: e.settled(),
        }
    }
}

impl From<WireError> for PyError {
    fn from(w: WireError) -> PyError {
        PyError::Namer {
            text: w.text,
            not_python: w.not_python,
            settled: w.settled,
        }
    }
}

/// A file that may hold the interpreter; its descriptor travels beside
/// the message where it was opened.
#[derive(Debug, Serialize, Deserialize)]
pub struct CandidateMsg {
    pub whole: Vec<Mapping>,
    pub open_error: Option<String>,
}

/// Locate `pid`'s interpreter. Descriptors: its memory, then each opened
/// candidate's file, in order.
#[derive(Debug, Serialize, Deserialize)]
pub struct LocateMsg {
    pub pid: u32,
    pub candidates: Vec<CandidateMsg>,
    pub backing: Backing,
}

impl LocateMsg {
    /// The message for `candidates` as the recorder opened them: each
    /// one's mappings, and why it was not opened where it was not.
    pub fn new(pid: u32, candidates: &[Candidate], backing: Backing) -> LocateMsg {
        LocateMsg {
            pid,
            candidates: candidates
                .iter()
                .map(|c| CandidateMsg {
                    whole: c.whole.clone(),
                    open_error: c.file.as_ref().err().cloned(),
                })
                .collect(),
            backing,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Located {
    pub desc: Result<Desc, WireError>,
    pub relay: Relay,
}

/// A located interpreter to read with: `id` is the recorder's for it
/// (one per process, never reused); `from`, the one it was forked from,
/// whose code objects it starts with.
#[derive(Debug, Serialize, Deserialize)]
pub struct Target {
    pub id: u64,
    pub pid: u32,
    pub desc: Desc,
    pub backing: Backing,
    pub from: Option<u64>,
}

/// Name `pairs` (code object, instruction field) in `own`'s process, and
/// where that fails, in `parent`'s (a forked worker's code objects were
/// made before the fork, at the same addresses). `remembered`: a code
/// object named before is named from then, where the memory is gone.
/// Descriptors: `own`'s memory, then `parent`'s, for those present.
/// `forget`: interpreters the recorder dropped.
#[derive(Debug, Serialize, Deserialize)]
pub struct ResolveMsg {
    pub own: Option<Target>,
    pub parent: Option<Target>,
    pub pairs: Vec<(u64, u64)>,
    pub remembered: bool,
    pub forget: Vec<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FrameMsg {
    pub file: String,
    pub function: String,
    pub line: Option<i32>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PairAnswer {
    pub frame: Result<FrameMsg, WireError>,
    /// Named through the parent's memory.
    pub via_parent: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Resolved {
    pub pairs: Vec<PairAnswer>,
    pub relay: Relay,
}

/// The interpreters this child holds, by the recorder's id.
#[derive(Default)]
pub struct PyState {
    interps: HashMap<u64, Interpreter>,
}

impl PyState {
    pub fn locate(&mut self, m: LocateMsg, fds: Vec<OwnedFd>) -> Located {
        let mut fds = fds.into_iter();
        let desc = (|| {
            let mem = fds.next().ok_or_else(|| PyError::Namer {
                text: "no memory descriptor came with the request".into(),
                not_python: false,
                settled: false,
            })?;
            let candidates = m
                .candidates
                .into_iter()
                .filter(|c| !c.whole.is_empty())
                .map(|c| Candidate {
                    whole: c.whole,
                    file: match c.open_error {
                        Some(e) => Err(e),
                        None => fds
                            .next()
                            .map(File::from)
                            .ok_or_else(|| "no descriptor came with it".to_string()),
                    },
                })
                .collect();
            Interpreter::locate_with(m.pid, candidates, File::from(mem), m.backing)
                .map(|i| i.desc())
        })()
        .map_err(|e| WireError::from(&e));
        Located {
            desc,
            relay: STATS.take_relay(),
        }
    }

    pub fn resolve(&mut self, m: ResolveMsg, fds: Vec<OwnedFd>) -> Resolved {
        for id in &m.forget {
            self.interps.remove(id);
        }
        if self.interps.len() + 2 > MAX_INTERPRETERS {
            self.interps.clear();
        }
        let mut fds = fds.into_iter();
        let pid = m.own.as_ref().or(m.parent.as_ref()).map_or(0, |t| t.pid);
        let own = m.own.map(|t| (t, fds.next()));
        let parent = m.parent.map(|t| (t, fds.next()));
        // The parent first: a forked child met here for the first time
        // starts with its parent's code objects.
        let parent = parent.and_then(|(t, fd)| self.enter(t, fd));
        let own = own.and_then(|(t, fd)| self.enter(t, fd));
        let pairs = m
            .pairs
            .iter()
            .map(|&(code, instr)| {
                let read = |s: &mut Self, id: Option<u64>| -> Result<PyFrame, PyError> {
                    match id.and_then(|id| s.interps.get_mut(&id)) {
                        Some(i) if m.remembered => i.resolve_remembered(code, instr),
                        Some(i) => i.resolve(code, instr),
                        None => Err(PyError::NotPython { pid }),
                    }
                };
                let mut r = read(self, own);
                let mut via_parent = false;
                if r.is_err()
                    && parent.is_some()
                    && let Ok(f) = read(self, parent)
                {
                    r = Ok(f);
                    via_parent = true;
                }
                PairAnswer {
                    frame: r
                        .map(|f| FrameMsg {
                            file: f.file,
                            function: f.function,
                            line: f.line,
                        })
                        .map_err(|e| WireError::from(&e)),
                    via_parent,
                }
            })
            .collect();
        Resolved {
            pairs,
            relay: STATS.take_relay(),
        }
    }

    /// The interpreter `t` names, held from before (given the recorder's
    /// latest look at its memory) or built now on the descriptor.
    fn enter(&mut self, t: Target, fd: Option<OwnedFd>) -> Option<u64> {
        if let Some(i) = self.interps.get_mut(&t.id) {
            i.set_backing(t.backing);
            return Some(t.id);
        }
        let mut i = Interpreter::from_desc(t.pid, &t.desc, File::from(fd?), t.backing);
        if let Some(p) = t.from.and_then(|f| self.interps.get(&f)) {
            i.share_codes(p);
        }
        self.interps.insert(t.id, i);
        Some(t.id)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        os::fd::AsFd as _,
        process::{Command, Stdio},
    };

    use super::*;
    use crate::record::stacks::python::{find, mem};

    /// A look-up as the recorder sends it, on a real interpreter: the
    /// descriptors in the message's order (the memory, then each opened
    /// candidate), with a candidate that could not be opened in between,
    /// which carries none. The reader finds the interpreter, and says why
    /// where the memory's descriptor is missing.
    #[test]
    fn locates_a_live_interpreter_from_descriptors() {
        if !crate::util::privileged("opening another process's memory") {
            return;
        }
        let mut py = Command::new("/usr/bin/python3")
            .args(["-c", "import time; time.sleep(30)"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = py.id();
        // Its libpython or executable mapped: the interpreter is running.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let backing = Backing::of(pid).unwrap();
        let mut candidates = find::candidates(pid, &backing).unwrap();
        // A libpython tried first that could not be opened: the look-up
        // goes on to the next file, whose descriptor must be the one read.
        let mut lib = candidates[0].whole.clone();
        for m in &mut lib {
            m.path = "/opt/py/lib/libpython3.12.so.1.0".into();
        }
        candidates.insert(
            0,
            Candidate {
                whole: lib,
                file: Err("could not be opened".into()),
            },
        );
        let mem = mem::open(pid).unwrap();
        let msg = |with_memory: bool| {
            let mut fds: Vec<OwnedFd> = Vec::new();
            if with_memory {
                fds.push(mem.as_fd().try_clone_to_owned().unwrap());
            }
            for c in &candidates {
                if let Ok(f) = &c.file {
                    fds.push(f.as_fd().try_clone_to_owned().unwrap());
                }
            }
            (LocateMsg::new(pid, &candidates, backing.clone()), fds)
        };
        let (m, fds) = msg(true);
        let found = PyState::default().locate(m, fds);
        let (m, fds) = msg(false);
        let missing = PyState::default().locate(m, fds);
        let _ = py.kill();
        let _ = py.wait();
        let desc = found.desc.unwrap_or_else(|e| panic!("{}", e.text));
        assert!(desc.version >= (3, 9), "{desc:?}");
        assert_ne!(desc.runtime, 0);
        // Without the memory, the first file takes its place: not an ELF
        // the reader can read a version from, and it says so.
        assert!(missing.desc.is_err());
    }
}
