//! The victim's stack at death (`record --stacks`): each of a process's
//! threads' stacks as it dequeued the fatal signal, as the collector
//! named them; a kill's victim gets the thread that was allocating (the
//! kill's trigger) or, failing that, the thread the kernel named, with
//! the others beside it.

use std::collections::BTreeMap;

use super::stacks::Frame;
use crate::decode::{ProcKey, stacks::StackAtDeath as Record};

/// Threads kept per process: a job's thread pool can be hundreds; the
/// first to die are kept (the signal reaches them in turn).
pub(crate) const MAX_THREADS: usize = 64;

/// One thread's stacks at death, innermost frame first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ThreadAtDeath {
    pub(crate) tid: u32,
    pub(crate) sig: u32,
    pub(crate) frames: Vec<Frame>,
    pub(crate) error: Option<String>,
}

/// A victim's stacks at death: `main` the allocating (or kernel-named)
/// thread, `threads` the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StackAtDeath {
    pub(crate) main: ThreadAtDeath,
    /// `main` is the thread whose allocation set off the kill.
    pub(crate) trigger: bool,
    pub(crate) threads: Vec<ThreadAtDeath>,
    /// Threads past `MAX_THREADS`, not kept.
    pub(crate) more_threads: u32,
}

/// Every job process's threads' stacks at death, as recorded.
#[derive(Clone, Debug, Default)]
pub(crate) struct Deaths {
    /// `Some(attached)` when the recording took growth stacks: whether the
    /// probe at signal delivery was attached.
    pub(crate) probe: Option<bool>,
    procs: BTreeMap<ProcKey, Vec<ThreadAtDeath>>,
    /// Threads past `MAX_THREADS`, per process.
    dropped: BTreeMap<ProcKey, u32>,
}

impl Deaths {
    pub(crate) fn new(probe: Option<bool>) -> Deaths {
        Deaths {
            probe,
            ..Default::default()
        }
    }

    pub(crate) fn observe(&mut self, r: Record) {
        let threads = self.procs.entry(r.proc).or_default();
        // One record per thread: a second fatal signal is dequeued only
        // by a thread that survived the first (a handled one is not sent).
        if threads.iter().any(|t| t.tid == r.tid) {
            return;
        }
        if threads.len() >= MAX_THREADS {
            *self.dropped.entry(r.proc).or_default() += 1;
            return;
        }
        threads.push(ThreadAtDeath {
            tid: r.tid,
            sig: r.sig,
            frames: r.frames,
            error: r.error,
        });
    }

    /// The victim `key`'s stacks at death: the thread `trigger` (the
    /// kill's allocating thread) or else `named` (the kernel's) or else
    /// the first to die, with the others. `Err`: why there is none
    /// (`Ok(None)`: stacks were not recorded at all).
    pub(crate) fn of(
        &self,
        key: ProcKey,
        trigger: u32,
        named: u32,
    ) -> Result<Option<StackAtDeath>, String> {
        let Some(attached) = self.probe else {
            return Ok(None);
        };
        let Some(threads) = self.procs.get(&key).filter(|t| !t.is_empty()) else {
            return Err(if attached {
                "no stack at death recorded for this process (it died outside a signal's delivery, or its record was lost: see lost events)".into()
            } else {
                "the probe at signal delivery could not be attached (see the recording's attach notes)".into()
            });
        };
        let pick = threads
            .iter()
            .position(|t| t.tid == trigger)
            .or_else(|| threads.iter().position(|t| t.tid == named))
            .unwrap_or(0);
        let mut threads = threads.clone();
        let main = threads.remove(pick);
        Ok(Some(StackAtDeath {
            trigger: main.tid == trigger,
            main,
            threads,
            more_threads: self.dropped.get(&key).copied().unwrap_or(0),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tid: u32, f: &str) -> Record {
        Record {
            proc: ProcKey {
                tgid: 10,
                start_ns: 5,
            },
            tid,
            sig: 9,
            frames: vec![Frame {
                kind: "python".into(),
                function: Some(f.into()),
                ..Default::default()
            }],
            error: None,
        }
    }

    #[test]
    fn the_allocating_thread_comes_first() {
        let key = ProcKey {
            tgid: 10,
            start_ns: 5,
        };
        let mut d = Deaths::new(Some(true));
        d.observe(rec(10, "main_loop"));
        d.observe(rec(11, "leak_step"));
        d.observe(rec(11, "again"));
        let s = d.of(key, 11, 10).unwrap().unwrap();
        assert_eq!((s.main.tid, s.trigger), (11, true));
        assert_eq!(s.main.frames[0].function.as_deref(), Some("leak_step"));
        assert_eq!(s.threads.len(), 1);
        // A trigger outside the victim: the kernel's named thread.
        let s = d.of(key, 99, 10).unwrap().unwrap();
        assert_eq!((s.main.tid, s.trigger), (10, false));
        // No record: why.
        let other = ProcKey {
            tgid: 11,
            start_ns: 5,
        };
        assert!(d.of(other, 0, 0).unwrap_err().contains("no stack at death"));
        // Stacks not recorded: nothing to say.
        assert_eq!(Deaths::default().of(key, 11, 10), Ok(None));
    }
}
