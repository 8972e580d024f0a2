//! Growth stacks, the collector's side (`record --stacks`): drains the
//! kernel's per-(process, stack) totals as deltas (growth, and the CUDA
//! allocation probes' `GPU_STACK_AGG`, marked `gpu`), reads each new stack's
//! frames and resolves them while the process lives, and clears a
//! process's keys after its exit so that the bounded maps never fill with
//! the dead.

use std::collections::{HashMap, HashSet};

use trainbpf_common::{PY_AT_EXEC, StackKey, StackVal};

use trainbpf_report::decode::{
    ProcKey,
    stacks::{StackDelta, StackSample},
};

mod code_files;
mod death;
mod delta;
mod family;
mod namer;
mod prune;
mod py;
pub mod python;
mod root;
mod symbolize;
mod thread;
mod unwind;
use crate::loader::batch;
pub use crate::loader::stack_maps::StackMaps;
use crate::util::clock::thread_cpu;
pub use delta::Deltas;
pub use namer::{SUBCOMMAND as NAMER_SUBCOMMAND, serve_main as namer_main, start as start_namer};
pub use py::Pythons;
pub use root::Root;
pub use symbolize::bounded;
pub use thread::{Msg, Stacks};

use crate::record::samplers::procfs::{
    backing::Backing,
    guard::{FILES_DEADLINE, Readers},
};

/// How many (process, stack) pairs the collector remembers as named: a
/// pair named once is never resolved again.
const MAX_NAMED: usize = 1 << 20;
/// New stacks' copies waiting to be unwound (16 KiB each at most): they
/// wait one drain, less than a second.
const MAX_COPIES: usize = 256;

/// What names a stack of a process: the native stack's id, the Python
/// frames' id and walk state, and the return address a frameless leaf
/// left.
type StackName = (i32, u64, u32, u64);

fn name_of(k: &StackKey) -> StackName {
    (k.stack_id, k.py_id, k.py_state & !PY_AT_EXEC, k.leaf_ret)
}

fn delta_name(d: &StackDelta) -> StackName {
    (d.stack_id, d.py_id, d.py_state & !PY_AT_EXEC, d.leaf_ret)
}

pub struct StackCollector {
    maps: StackMaps,
    deltas: Deltas,
    gpu_deltas: Deltas,
    /// Every read of a job process (its maps, files and memory) runs on
    /// these, with a deadline (`procfs::guard`).
    readers: Readers,
    pythons: Pythons,
    /// (process, stack, GPU map or not) whose frames were recorded: each
    /// map's first record of a stack carries its frames.
    named: HashSet<(ProcKey, StackName, bool)>,
    /// Processes that exited since the last drain: their keys go after it.
    exited: Vec<ProcKey>,
    /// Processes that exec'd since the last drain.
    execed: Vec<(u32, u64)>,
    /// Processes to locate an interpreter in after the next drain.
    locate: Vec<ProcKey>,
    /// Each process's named native frames, by address: what names its
    /// stack at death once it is gone.
    known: HashMap<ProcKey, HashMap<u64, trainbpf_report::decode::stacks::Frame>>,
    /// Each process's executable files, held open: what names the frames
    /// of its stack at death that its growth stacks never ran.
    mapped: code_files::ByProc,
    /// New growth stacks' registers and stack copies, until named.
    copies: HashMap<(ProcKey, StackName), namer::CopyMsg>,
    /// Stacks (native id, Python id) of processes forgotten, deleted from
    /// the kernel's tables at the next drain unless a key read then uses
    /// them: another process running the same code (a forked worker) may
    /// have taken the same stack since the last read.
    doomed: Vec<(i32, u64)>,
    /// The job's root, where the recorder started it and may hold it.
    root: Option<Root>,
    /// Stacks at death waiting to be named, and where they go named.
    deaths: Option<(std::sync::mpsc::Receiver<death::Dying>, death::DeathOut)>,
}

/// What an errno from `bpf_get_stackid` means, for the report.
pub fn stack_error(id: i32) -> String {
    match -id {
        libc::EFAULT => {
            "user stack could not be read (EFAULT: no frame pointers, or a page not present)".into()
        }
        libc::EEXIST => "stack table slot held by another stack (EEXIST)".into(),
        libc::ENOMEM => "stack table full (ENOMEM)".into(),
        e => format!("stack could not be read (errno {e})"),
    }
}

impl StackCollector {
    pub fn new(mut maps: StackMaps, readers: Readers) -> StackCollector {
        let exes = maps.py_exes.take().map(|(e, of)| py::Exes::new(e, of));
        StackCollector {
            maps,
            deltas: Deltas::default(),
            gpu_deltas: Deltas::default(),
            pythons: Pythons::new(
                crate::loader::stack_maps::PY_PROC_ENTRIES as usize,
                readers.clone(),
                exes,
            ),
            readers,
            named: HashSet::new(),
            exited: Vec::new(),
            execed: Vec::new(),
            locate: Vec::new(),
            known: HashMap::new(),
            mapped: code_files::ByProc::new(),
            copies: HashMap::new(),
            doomed: Vec::new(),
            root: None,
            deaths: None,
        }
    }

    /// A job process exited: its keys are deleted after the next drain
    /// (every stack it took is in the map by now: none is taken once a
    /// process is exiting).
    pub fn on_exit(&mut self, proc: ProcKey) {
        self.exited.push(proc);
    }

    /// Exits whose keys wait for the next drain.
    pub fn exits_waiting(&self) -> usize {
        self.exited.len()
    }

    /// A job process exec'd: its interpreter, if any, is no longer the
    /// one located. Forgotten after the next drain (which names what it
    /// took before), and located anew at once, so that its first stacks
    /// already carry Python frames (a miss is tried again from its stacks).
    pub fn on_exec(&mut self, proc: ProcKey, ts: u64, held: bool) {
        // The old program's files and names would misname the new one's
        // stack at death.
        self.known.remove(&proc);
        self.mapped.remove(&proc);
        self.execed.push((proc.tgid, ts));
        self.locate.push(proc);
        // Its files are held now, not after the next drain: a job killed
        // within a drain's interval of its exec still has its stacks
        // named from them.
        self.hold_files(proc);
        if held {
            self.release_root(proc, ts);
        }
    }

    /// An attached job's processes, alive before the recording: each one's
    /// interpreter located under its pid alone (its kernel start time is
    /// not known until its first record), which the kernel's walk falls
    /// back to, and which its first stacks then take over.
    pub fn locate_attached(&mut self, tgids: &[u32]) {
        for &tgid in tgids {
            let p = ProcKey { tgid, start_ns: 0 };
            self.pythons.ensure(p, &mut self.maps.py_procs);
        }
    }

    /// A job process forked: a located Python's child runs the same
    /// interpreter, which the kernel handed on at the fork (a forked
    /// worker's copy-on-write growth starts at once); its frames are named
    /// through the parent's, on the child's memory, opened now.
    pub fn on_fork(&mut self, child: ProcKey, parent: ProcKey) {
        self.pythons.inherit(child, parent, &mut self.maps.py_procs);
    }

    /// Drains the totals; returns the deltas, with frames for stacks not
    /// named before (`None` when nothing moved), and the CPU time reading
    /// the map took (the part of a drain that grows with the job; resolving
    /// is once per stack). CPU time, not wall time: on a busy machine the
    /// wall time of the read includes waiting for a core, and pacing on it
    /// put drains seconds apart, so a victim died before its stacks were
    /// named.
    pub fn drain(&mut self) -> (Option<StackSample>, std::time::Duration) {
        let t = thread_cpu();
        self.pythons.begin_pass();
        let now = batch::read_or_walk(&self.maps.agg);
        let gpu_now = batch::read_or_walk(&self.maps.gpu_agg);
        let read = thread_cpu().saturating_sub(t);
        // Each copy was sent after its key was made: those of the keys
        // just read are in the ring.
        self.take_copies();
        let moved: Vec<(StackKey, StackVal, bool)> = (self.deltas.next(now).into_iter())
            .map(|(k, v)| (k, v, false))
            .chain(
                self.gpu_deltas
                    .next(gpu_now)
                    .into_iter()
                    .map(|(k, v)| (k, v, true)),
            )
            .collect();
        self.delete_doomed();
        let mut out = Vec::with_capacity(moved.len());
        // New stacks, per process, resolved in one pass over its maps.
        let mut todo: HashMap<u32, Vec<usize>> = HashMap::new();
        // Those walked with the kernel's description made at an exec: named
        // once the exec is read and the new program located, below.
        let mut after_exec: HashMap<u32, Vec<usize>> = HashMap::new();
        // A process's interpreter is located when its first stacks come
        // (tried again after a miss): before its stacks are named.
        let mut procs: Vec<ProcKey> = moved
            .iter()
            .map(|(k, ..)| ProcKey {
                tgid: k.tgid,
                start_ns: k.start_ns,
            })
            .collect();
        procs.sort_by_key(|p| (p.tgid, p.start_ns));
        procs.dedup();
        for p in procs {
            if !self.exited.contains(&p) {
                self.name_deaths();
                self.pythons.ensure_soon(p, &mut self.maps.py_procs);
            }
        }
        // And the others not located yet, before the naming, which can
        // take long.
        self.pythons.retry(&mut self.maps.py_procs);
        for (k, v, gpu) in moved {
            let proc = ProcKey {
                tgid: k.tgid,
                start_ns: k.start_ns,
            };
            let at_exec = k.py_state & PY_AT_EXEC != 0 && !self.exited.contains(&proc);
            let mut d = StackDelta {
                proc,
                stack_id: k.stack_id,
                py_id: k.py_id,
                // The kernel's mark stays until the stack is named
                // (`Pythons::frames` reads it), and goes before the record.
                py_state: k.py_state,
                leaf_ret: k.leaf_ret,
                bytes: v.bytes,
                count: v.count,
                frames: None,
                error: None,
                gpu,
            };
            if k.stack_id < 0 {
                d.error = Some(stack_error(k.stack_id));
            }
            if self.named.len() < MAX_NAMED && !self.named.contains(&(proc, name_of(&k), gpu)) {
                let to = if at_exec { &mut after_exec } else { &mut todo };
                to.entry(k.tgid).or_default().push(out.len());
            }
            out.push(d);
        }
        for (tgid, idx) in todo {
            // A dying process first: it may soon be unreadable.
            self.name_deaths();
            self.name(tgid, &idx, &mut out);
        }
        let exited = std::mem::take(&mut self.exited);
        // One that exec'd and exited since the last drain is not looked
        // for: it would stay as a failed look-up, never forgotten.
        self.locate.retain(|p| !exited.contains(p));
        self.forget_exited(exited);
        for (tgid, ts) in std::mem::take(&mut self.execed) {
            self.pythons.forget_tgid(tgid, ts, &mut self.maps.py_procs);
        }
        self.pythons.retry(&mut self.maps.py_procs);
        for p in std::mem::take(&mut self.locate) {
            self.pythons.ensure(p, &mut self.maps.py_procs);
        }
        for (tgid, idx) in after_exec {
            self.name_deaths();
            self.name(tgid, &idx, &mut out);
        }
        for d in &mut out {
            d.py_state &= !PY_AT_EXEC;
        }
        (
            (!out.is_empty()).then_some(StackSample { stacks: out }),
            read,
        )
    }

    /// The new stacks' copies the kernel sent, kept until their stacks
    /// are named (a bounded number: past it, a stack is named by frame
    /// pointers only).
    fn take_copies(&mut self) {
        while let Some(rec) = self.maps.copies.next() {
            let Some((k, c)) = unwind::from_record(&rec) else {
                continue;
            };
            if self.copies.len() < MAX_COPIES {
                let p = ProcKey {
                    tgid: k.tgid,
                    start_ns: k.start_ns,
                };
                self.copies.insert((p, name_of(&k)), c);
            }
        }
    }

    /// Holds the files a process just exec'd runs (its executable, the
    /// loader): a process that dies before its first stacks are named
    /// still has its stack at death named from them.
    fn hold_files(&mut self, p: ProcKey) {
        let mut held = self.mapped.remove(&p).unwrap_or_default();
        let tgid = p.tgid;
        if let Ok(held) = self.readers.run(FILES_DEADLINE, move || {
            let b = Backing::of(tgid).ok();
            held.refresh(tgid, b.as_ref());
            held
        }) {
            self.mapped.insert(p, held);
        }
    }

    /// Reads and resolves the frames of the deltas at `idx`, all of `tgid`.
    /// The Python frames first: they read only the process's memory, and
    /// the code objects they read name its stack at death once it is gone;
    /// the native frames' symbols can take long the first time (a
    /// library's line tables), and the process may be gone by then.
    fn name(&mut self, tgid: u32, idx: &[usize], out: &mut [StackDelta]) {
        let python: Vec<(Vec<trainbpf_report::decode::stacks::Frame>, Option<String>)> = idx
            .iter()
            .map(|&i| {
                let d = &out[i];
                self.pythons
                    .frames(d.proc, d.py_id, d.py_state, &self.maps.py_stacks)
            })
            .collect();
        let mut ips: Vec<Vec<u64>> = Vec::with_capacity(idx.len());
        let mut ok: Vec<usize> = Vec::with_capacity(idx.len());
        let mut hows: Vec<Vec<&'static str>> = Vec::with_capacity(idx.len());
        let mut copies: Vec<Option<namer::CopyMsg>> = Vec::with_capacity(idx.len());
        for &i in idx {
            if out[i].stack_id < 0 {
                continue;
            }
            match self.maps.stacks.get(&(out[i].stack_id as u32), 0) {
                Ok(st) => {
                    let mut v: Vec<u64> = st.frames().iter().map(|f| f.ip).collect();
                    // A GPU stack is taken at the driver call's return:
                    // its innermost address is a return address as well,
                    // looked up at the call (and shown as taken, below).
                    if out[i].gpu
                        && let Some(ip) = v.first_mut()
                    {
                        *ip = ip.saturating_sub(1);
                    }
                    let via_sp = with_leaf(&mut v, out[i].leaf_ret);
                    hows.push(walked(v.len(), via_sp));
                    ips.push(v);
                    let d = &out[i];
                    copies.push(if d.gpu {
                        None
                    } else {
                        self.copies.remove(&(d.proc, delta_name(d)))
                    });
                    ok.push(i);
                }
                Err(e) => {
                    out[i].error = Some(bounded(&format!("stack not in the kernel's table: {e}")))
                }
            }
        }
        let stacks: Vec<namer::StackMsg> = ips
            .iter()
            .zip(&hows)
            .zip(copies)
            .map(|((ips, hows), copy)| namer::StackMsg {
                ips: ips.clone(),
                hows: hows.iter().map(|h| (*h).to_string()).collect(),
                copy,
            })
            .collect();
        // Still the same process? One whose exit was seen may have its pid
        // reused already, and would resolve against another program.
        let alive = idx.first().is_some_and(|&i| {
            !self.exited.contains(&out[i].proc) && crate::record::samplers::procfs::alive(tgid)
        });
        let proc = idx.first().map(|&i| out[i].proc);
        // A forked Python worker gone already: what it ran before the
        // fork is mapped at the same addresses in its parent.
        let parent = proc.and_then(|p| self.pythons.parent_of(p)).filter(|pp| {
            !self.exited.contains(pp) && crate::record::samplers::procfs::alive(pp.tgid)
        });
        let resolved = if alive && crate::record::samplers::procfs::runs_the_recorder(tgid) {
            Err("taken in the recorder's own code, before the job's exec: not named".into())
        } else if let (true, Some(proc)) = (alive, proc) {
            // Its files are read anew (a library loaded since), and held
            // for its stack at death.
            self.name_with(proc, true, stacks, None)
        } else if let Some(pp) = parent {
            self.name_with(
                pp,
                true,
                stacks,
                Some("native frames named through the parent's maps (the process was gone)"),
            )
        } else if let Some(proc) = proc.filter(|p| self.mapped.contains_key(p)) {
            // Gone, but the files it ran are held (since its exec): a
            // process killed before the first drain that saw its stacks
            // is the one whose stacks matter most.
            self.name_with(
                proc,
                false,
                stacks,
                Some("the process was gone before its stack was resolved; named from the files it ran"),
            )
        } else {
            Err("the process was gone before its stack was resolved".into())
        };
        for (n, &i) in ok.iter().enumerate() {
            let mut f = match &resolved {
                Ok(frames) => {
                    death::remember(self.known.entry(out[i].proc).or_default(), &frames[n].0);
                    out[i].error = frames[n].1.clone();
                    frames[n].0.clone()
                }
                // The addresses still say something: kept, unsymbolized.
                Err(e) => {
                    out[i].error = Some(e.clone());
                    ips[n]
                        .iter()
                        .zip(&hows[n])
                        .take(trainbpf_report::decode::stacks::MAX_FRAMES)
                        .map(|(&addr, how)| trainbpf_report::decode::stacks::Frame {
                            kind: "native".into(),
                            addr,
                            found: Some((*how).into()),
                            ..Default::default()
                        })
                        .collect()
                }
            };
            if out[i].gpu
                && let Some(first) = f.first_mut()
            {
                first.addr = first.addr.saturating_add(1);
            }
            out[i].frames = Some(f);
        }
        for (&i, (py, note)) in idx.iter().zip(python) {
            // Even for a process gone: what it said of its interpreter.
            self.python(&mut out[i], py, note);
            let d = &out[i];
            self.named.insert((d.proc, delta_name(d), d.gpu));
        }
    }

    /// Names stacks from `p`'s held files, in the namer, on a worker: its
    /// files read anew from its maps first where `refresh`; `note` added
    /// to each stack's.
    fn name_with(
        &mut self,
        p: ProcKey,
        refresh: bool,
        stacks: Vec<namer::StackMsg>,
        note: Option<&'static str>,
    ) -> Result<Vec<symbolize::Resolved>, String> {
        let mut held = self.mapped.remove(&p).unwrap_or_default();
        let tgid = p.tgid;
        let r = self.readers.run(FILES_DEADLINE, move || {
            if refresh {
                let b = Backing::of(tgid).ok();
                held.refresh(tgid, b.as_ref());
            }
            let r = held.name(stacks);
            (held, r)
        });
        let (held, r) = r.map_err(|e| bounded(&format!("native frames not read: {e}")))?;
        self.mapped.insert(p, held);
        Ok(r?
            .into_iter()
            .map(|n| {
                let why = match (n.note, note) {
                    (Some(a), Some(b)) => Some(bounded(&format!("{a}; {b}"))),
                    (a, b) => a.or(b.map(Into::into)),
                };
                (n.frames, why)
            })
            .collect())
    }

    /// Puts a stack's Python frames (named before its native ones) in
    /// place of the interpreter's own native frames, or says why there are
    /// none.
    fn python(
        &mut self,
        d: &mut StackDelta,
        py: Vec<trainbpf_report::decode::stacks::Frame>,
        note: Option<String>,
    ) {
        if !py.is_empty() {
            let native = d.frames.take().unwrap_or_default();
            let interp = self.pythons.interpreter_path(d.proc).unwrap_or_default();
            d.frames = Some(py::fold(&native, py, interp));
        }
        if let Some(note) = note {
            d.error = Some(match d.error.take() {
                Some(e) => bounded(&format!("{e}; {note}")),
                None => note,
            });
        }
    }
}

/// A leaf that set up no frame: its caller, which the frame-pointer walk
/// skipped, from the stack's top (`leaf_ret`), put after the innermost
/// frame unless the walk found it. Whether it was put.
fn with_leaf(ips: &mut Vec<u64>, leaf_ret: u64) -> bool {
    let put = leaf_ret != 0 && !ips.is_empty() && ips.get(1) != Some(&leaf_ret);
    if put {
        ips.insert(1, leaf_ret);
    }
    put
}

/// How each frame of a frame-pointer walk was found: the innermost where
/// the thread was, the second from the stack's top where `via_sp`, the
/// rest by the walk.
fn walked(n: usize, via_sp: bool) -> Vec<&'static str> {
    use trainbpf_report::decode::stacks::{FOUND_FP, FOUND_IP, FOUND_SP};
    (0..n)
        .map(|i| match i {
            0 => FOUND_IP,
            1 if via_sp => FOUND_SP,
            _ => FOUND_FP,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{stack_error, with_leaf};

    /// The leaf's caller goes second, once, and only where there is one.
    #[test]
    fn a_frameless_leafs_caller_is_put_after_it() {
        let mut v = vec![10, 30, 40];
        assert!(with_leaf(&mut v, 20));
        assert_eq!(v, [10, 20, 30, 40]);
        let mut walked = vec![10, 20, 30];
        assert!(!with_leaf(&mut walked, 20), "the walk found it already");
        assert_eq!(walked, [10, 20, 30]);
        let mut none = vec![10, 30];
        assert!(!with_leaf(&mut none, 0));
        assert!(!with_leaf(&mut Vec::new(), 20));
    }

    /// The kernel's errnos, as the report shows them.
    #[test]
    fn unreadable_stacks_say_why() {
        assert!(stack_error(-libc::EFAULT).contains("EFAULT"));
        assert!(stack_error(-libc::EEXIST).contains("EEXIST"));
        assert!(stack_error(-5).contains("errno 5"));
    }
}
