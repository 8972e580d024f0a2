//! How a Python process comes to be located other than by its own first
//! stacks: a forked child inherits its parent's interpreter, and an
//! attached job's process, located under its pid alone before the kernel
//! counts it as the job's, is moved to its full key when its start time
//! is met.

use std::time::Instant;

use aya::maps::{HashMap as BpfHashMap, MapData};
use trainbpf_common::{ProcId, PyProc};
use trainbpf_report::decode::ProcKey;

use super::{MAX_TRIES, Pythons, Remote, State, proc_id, stalled};
use crate::record::samplers::procfs::guard::{DEADLINE, STATS};
use crate::record::stacks::symbolize::bounded;

impl Pythons {
    /// An attached process located under its pid alone (`start_ns` 0,
    /// `StackCollector::locate_attached`), met now with its start time:
    /// its interpreter moves to its full key, in the kernel's map too.
    pub(super) fn adopt_attached(
        &mut self,
        p: ProcKey,
        map: &mut BpfHashMap<MapData, ProcId, PyProc>,
    ) {
        let wild = ProcKey {
            tgid: p.tgid,
            start_ns: 0,
        };
        if p.start_ns == 0
            || self.procs.contains_key(&p)
            || !matches!(self.procs.get(&wild), Some(State::Found(_)))
        {
            return;
        }
        let Some(State::Found(i)) = self.procs.remove(&wild) else {
            return;
        };
        let _ = map.remove(&proc_id(wild));
        self.since.remove(&wild);
        let state = match map.insert(proc_id(p), i.describe(), 0) {
            Ok(()) => State::Found(i),
            Err(e) => State::Failed {
                error: format!("the kernel's Python process map: {e}"),
                not_python: false,
                tries: MAX_TRIES,
                last: Instant::now(),
            },
        };
        self.procs.insert(p, state);
        self.since.insert(p, crate::util::clock::mono_ns());
    }

    /// A job process forked: the kernel handed a located parent's
    /// description to the child already (`python::inherit` in the eBPF
    /// crate); the child's frames are named through the parent's
    /// interpreter, opened on the child's memory now, while it lives (a
    /// worker may be gone before the next drain). Whatever happens, the
    /// child is tracked, so that its exit removes the kernel's entry.
    ///
    /// A parent whose program was found to hold no interpreter, and is
    /// not tried again, passes that on too: the child runs the same
    /// program, and is not looked up afresh at its first stacks (a node
    /// forking a thousand C processes a second paid a look-up each).
    pub fn inherit(
        &mut self,
        child: ProcKey,
        parent: ProcKey,
        map: &mut BpfHashMap<MapData, ProcId, PyProc>,
    ) {
        match self.procs.get(&parent) {
            Some(State::Found(_)) => {}
            Some(State::Failed {
                error,
                not_python: true,
                tries,
                last,
            }) if *tries >= MAX_TRIES => {
                if !self.procs.contains_key(&child) && self.procs.len() < self.max {
                    let state = State::Failed {
                        error: error.clone(),
                        not_python: true,
                        tries: *tries,
                        last: *last,
                    };
                    self.procs.insert(child, state);
                    self.since.insert(child, crate::util::clock::mono_ns());
                }
                return;
            }
            _ => return,
        }
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
        let tgid = child.tgid;
        let opened = self
            .readers
            .run(DEADLINE, move || Remote::open_memory(tgid));
        let state = match (opened, self.procs.get(&parent)) {
            (Ok(Ok(mem)), Some(State::Found(i))) => State::Found(Box::new(i.forked_on(tgid, mem))),
            // Gone already (its exit follows), or its memory unreadable:
            // its stacks say why, and no look-up is tried again.
            (Ok(Err(e)), _) => State::Failed {
                not_python: false,
                error: bounded(&e.to_string()),
                tries: MAX_TRIES,
                last: Instant::now(),
            },
            (Err(e), _) => {
                STATS.note(|| format!("pid {tgid}: its memory not opened: {e}"));
                stalled(&e)
            }
            (Ok(Ok(_)), _) => return,
        };
        self.procs.insert(child, state);
        self.since.insert(child, crate::util::clock::mono_ns());
        self.parents.insert(child, parent);
    }
}
